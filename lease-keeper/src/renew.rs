//! One renewal step, the renewal loop of a single lease, and the one path by
//! which a kept lease is given back.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use lease_core::{Error, Grant, LeaseBackend, Renewal, Timing};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};

use crate::clock::{later, scaled, Sent};
use crate::loss::LossReason;
use crate::state::Shared;

/// What one renewal attempt ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Renewed; the shared state carries the new send instant and deadline.
    Renewed,
    /// The lease is lost (the shared state says why).
    Lost,
    /// The truth is unknown (error or no answer in time): try again before the deadline.
    Retry,
}

/// One renewal attempt, bounded by `limit` (never later than the deadline).
///
/// # Cancel safety
///
/// Cancel safe: a renewal dropped in flight may or may not have landed,
/// as one that got no answer; once the backend refused the renewal, the
/// lease is stopped and the read that records why runs on a task of its
/// own, so dropping the attempt cannot leave it stopped with no reason.
pub(crate) async fn renew_attempt(
    backend: &Arc<dyn LeaseBackend>,
    shared: &Arc<Shared>,
    limit: Instant,
) -> Step {
    if shared.is_lost() {
        return Step::Lost;
    }
    let grant = shared.grant();
    let payload = shared.pending_payload();
    let sent = Sent::now();
    match timeout_at(limit, backend.renew(&grant, payload.clone())).await {
        Ok(Ok(Renewal::Renewed(g))) => {
            if !shared.renewed(g, sent, payload) {
                // Answered at the write deadline (the timeout polls the
                // answer before its timer): too late. Writes stopped there
                // and work was dropped for it, so the lease ends there as
                // it would a moment later, rather than become writable
                // again.
                shared.lose(LossReason::DeadlinePassed);
                return Step::Lost;
            }
            tracing::trace!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                rtt_ms = sent.at.elapsed().as_millis() as u64, "lease renewed");
            let failures = shared.renewal_answered();
            if failures > 0 {
                tracing::info!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                    failures, "lease renewal succeeded again after {failures} failures");
            }
            Step::Renewed
        }
        Ok(Ok(Renewal::Lost)) => {
            // No write may start from here on; one read then tells a
            // takeover from an expiry, for the report only.
            shared.stop();
            let (b, s) = (backend.clone(), shared.clone());
            // In a runtime already: the attempt's timeout needs one. The
            // read catches a backend's panic itself; a task failing all
            // the same (its runtime shutting down) leaves the lease lost
            // for a reason it cannot tell.
            if tokio::spawn(async move { lose_as_read(&*b, &s).await })
                .await
                .is_err()
            {
                shared.lose(LossReason::Expired);
            }
            Step::Lost
        }
        Ok(Err(e)) => {
            let failures = shared.renewal_failed();
            let error = lease_core::ErrorChain::new(&e);
            if failures == 1 {
                tracing::warn!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                    %error, "lease renewal failed; retrying until the write deadline");
            } else {
                tracing::debug!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                    %error, failures, "lease renewal failed again; retrying until the write deadline");
            }
            Step::Retry
        }
        Err(_) => {
            let failures = shared.renewal_failed();
            if failures == 1 {
                tracing::warn!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                    "lease renewal unanswered; retrying until the write deadline");
            } else {
                tracing::debug!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                    failures, "lease renewal unanswered again; retrying until the write deadline");
            }
            Step::Retry
        }
    }
}

/// The pause between failed renewal attempts: a twentieth of the TTL,
/// between 10 ms and 1 s, jittered by ±50%.
pub(crate) fn retry_pause(ttl: Duration) -> Duration {
    let base = (ttl / 20).clamp(Duration::from_millis(10), Duration::from_secs(1));
    scaled(base, 0.5 + Timing::random_unit())
}

/// Records why `shared`, whose renewal the backend refused, is lost: one
/// read (and the key's last break) tells a takeover or a break from an
/// expiry, for the report only.
async fn lose_as_read(backend: &dyn LeaseBackend, shared: &Shared) {
    // A backend panicking in this read must not leave the lease stopped
    // with no reason: it is lost all the same, read or not.
    let looked = AssertUnwindSafe(async {
        tokio::join!(
            timeout(shared.ttl, backend.read(&shared.key)),
            timeout(shared.ttl, backend.last_break(&shared.key)),
        )
    })
    .catch_unwind()
    .await;
    let (read, last_break) = match looked {
        Ok((read, last_break)) => (
            read.ok().and_then(Result::ok),
            last_break.ok().and_then(Result::ok).flatten(),
        ),
        Err(_) => {
            tracing::error!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                "the backend panicked reading a lease whose renewal it refused");
            (None, None)
        }
    };
    shared.lose(LossReason::from_read(
        read,
        last_break,
        &shared.holder,
        shared.fence,
    ));
}

/// The background loop of a single [`Lease`](crate::Lease): renew at the
/// jittered interval after the last successful renewal's send instant, retry
/// until the write deadline, stop on loss.
pub(crate) async fn keep(backend: Arc<dyn LeaseBackend>, shared: Arc<Shared>) {
    let timing = shared.timing;
    let ttl = shared.ttl;
    loop {
        let next = later(
            shared.sent(),
            timing.jittered_renew_interval(ttl, Timing::random_unit()),
        );
        sleep_until(next).await;
        loop {
            // Stopped: whoever stopped it records why (a refused renewal
            // after its read, on a task of its own; a shared lease's link
            // after its registration's), and a deadline passing meanwhile
            // is not the reason. Nothing renews a stopped lease.
            if shared.is_stopped() {
                return;
            }
            let now = Instant::now();
            let deadline = shared.deadline();
            if now >= deadline {
                shared.lose(LossReason::DeadlinePassed);
                return;
            }
            let limit = deadline.min(later(now, timing.renew_interval(ttl)));
            match renew_attempt(&backend, &shared, limit).await {
                Step::Renewed => break,
                Step::Lost => return,
                Step::Retry => {
                    let deadline = shared.deadline();
                    sleep_until(later(Instant::now(), retry_pause(ttl)).min(deadline)).await;
                }
            }
        }
    }
}

/// A release under way. It runs on a task of its own, so dropping this
/// neither stops nor cancels it; [`Releasing::outcome`] waits for its answer.
pub(crate) enum Releasing {
    /// Nothing to send: the grant is known gone on the backend.
    Nothing,
    /// Sent from a task of its own, bounded by the TTL.
    Task(JoinHandle<Result<(), Error>>),
    /// No tokio runtime at hand: the release runs in whoever awaits it.
    Here(Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>),
}

/// Ends `shared` with `reason` and gives its grant back: `may_write()` is
/// false before anything is sent, and nothing is sent for a grant known gone
/// on the backend (taken over, expired or broken), which would change nothing.
/// The one way every lease and group lease is given up.
pub(crate) fn release(
    backend: &Arc<dyn LeaseBackend>,
    shared: &Shared,
    reason: LossReason,
) -> Releasing {
    let already = shared.loss();
    shared.lose(reason);
    if already.as_ref().is_some_and(LossReason::gone_on_backend) || !shared.releases() {
        return Releasing::Nothing;
    }
    let send = send_release(backend.clone(), shared.grant());
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => Releasing::Task(rt.spawn(send)),
        Err(_) => Releasing::Here(Box::pin(send)),
    }
}

impl Releasing {
    /// The release's answer.
    pub(crate) async fn outcome(self) -> Result<(), Error> {
        match self {
            Releasing::Nothing => Ok(()),
            Releasing::Task(task) => task.await.unwrap_or_else(|e| {
                Err(Error::Unavailable {
                    detail: format!("the release task ended without an answer: {e}"),
                    source: None,
                })
            }),
            Releasing::Here(send) => send.await,
        }
    }

    /// Lets the release finish in the background; without a runtime there is
    /// none, and the grant expires by itself.
    pub(crate) fn detach(self) {
        if let Releasing::Here(_) = self {
            tracing::debug!("lease dropped outside a tokio runtime; it will expire");
        }
    }
}

/// Sends the release of `grant`, waiting at most its TTL, and reports how it went.
async fn send_release(backend: Arc<dyn LeaseBackend>, grant: Grant) -> Result<(), Error> {
    let ttl = grant.ttl();
    let bounded = if tokio::runtime::Handle::try_current().is_ok() {
        timeout(ttl, backend.release(&grant)).await
    } else {
        // Outside a runtime there is no tokio timer (creating one panics):
        // the backend's own request timeout bounds the release.
        Ok(backend.release(&grant).await)
    };
    let result = match bounded {
        Ok(r) => r,
        Err(_) => Err(Error::Unavailable {
            detail: format!(
                "the release of {} got no answer within the TTL ({ttl:?}); the grant expires by itself",
                grant.key()
            ),
            source: None,
        }),
    };
    match &result {
        Ok(()) => {
            tracing::info!(key = %grant.key(), holder = %grant.holder(), fence = %grant.fence(), "lease released")
        }
        Err(e) => {
            tracing::warn!(key = %grant.key(), holder = %grant.holder(), fence = %grant.fence(), error = %lease_core::ErrorChain::new(e), "lease release failed; it will expire")
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use lease_core::{Acquire, AcquireRequest, HolderId, LeaseKey};

    use super::*;

    /// A renewal answered at the very instant of the write deadline (the
    /// attempt's timeout polls the answer before its timer) comes too late:
    /// writes stopped there and work was dropped for it, and a lease that
    /// may no longer be written under never may again, so the answer must
    /// not bring it back.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_answered_at_the_deadline_does_not_bring_the_lease_back() {
        let fake: Arc<dyn LeaseBackend> = Arc::new(lease_fake::Fake::new());
        let key = LeaseKey::new("renew/at-deadline").expect("a valid key");
        let req = AcquireRequest::new(key, HolderId::random()).ttl(Duration::from_secs(3));
        let Ok(Acquire::Granted(grant)) = fake.try_acquire(req).await else {
            panic!("the fake did not grant a free key");
        };
        let shared = Shared::kept_now(grant);
        let deadline = shared.deadline();
        sleep_until(deadline).await;
        assert!(!shared.may_write(), "writable at the deadline");
        let step = renew_attempt(&fake, &shared, deadline).await;
        assert!(
            !shared.may_write(),
            "a renewal answered at the deadline ({step:?}) made the lease writable again, {:?} more",
            shared.deadline().saturating_duration_since(Instant::now())
        );
        assert_eq!(step, Step::Lost);
        assert_eq!(shared.loss(), Some(LossReason::DeadlinePassed));
    }
}
