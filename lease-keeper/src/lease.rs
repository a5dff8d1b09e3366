//! A held lease that renews itself: [`Lease`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, Fence, Grant, HolderId, LeaseBackend, LeaseKey, Payload, Renewal, Timing};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};
use tracing::Instrument;

use crate::keeper::later;
use crate::state::{LossReason, LossWatch, Shared};

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
pub(crate) async fn renew_attempt(
    backend: &dyn LeaseBackend,
    shared: &Shared,
    limit: Instant,
) -> Step {
    if shared.loss().is_some() {
        return Step::Lost;
    }
    let grant = shared.grant();
    let payload = shared.pending_payload();
    let sent = Instant::now();
    match timeout_at(limit, backend.renew(&grant, payload.clone())).await {
        Ok(Ok(Renewal::Renewed(g))) => {
            shared.renewed(g, sent, payload);
            tracing::trace!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                rtt_ms = sent.elapsed().as_millis() as u64, "lease renewed");
            Step::Renewed
        }
        Ok(Ok(Renewal::Lost)) => {
            // No write may start from here on; one read then tells a
            // takeover from an expiry, for the report only.
            shared.stop();
            let (read, last_break) = tokio::join!(
                timeout(shared.ttl, backend.read(&shared.key)),
                timeout(shared.ttl, backend.last_break(&shared.key)),
            );
            let read = read.ok().and_then(Result::ok);
            let last_break = last_break.ok().and_then(Result::ok).flatten();
            shared.lose(LossReason::from_read(
                read,
                last_break,
                &shared.holder,
                shared.fence,
            ));
            Step::Lost
        }
        Ok(Err(e)) => {
            tracing::debug!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                error = %e, "lease renewal failed; retrying until the write deadline");
            Step::Retry
        }
        Err(_) => {
            tracing::debug!(key = %shared.key, holder = %shared.holder, fence = %shared.fence,
                "lease renewal unanswered; retrying until the write deadline");
            Step::Retry
        }
    }
}

/// The pause between failed renewal attempts: a twentieth of the TTL,
/// between 10 ms and 1 s, jittered by ±50%.
pub(crate) fn retry_pause(ttl: Duration) -> Duration {
    let base = (ttl / 20).clamp(Duration::from_millis(10), Duration::from_secs(1));
    crate::keeper::scaled(base, 0.5 + Timing::random_unit())
}

/// The background loop of a single [`Lease`]: renew at the jittered interval
/// after the last successful renewal's send instant, retry until the write
/// deadline, stop on loss.
async fn keep(backend: Arc<dyn LeaseBackend>, shared: Arc<Shared>) {
    let timing = shared.timing;
    let ttl = shared.ttl;
    loop {
        let next = later(
            shared.sent(),
            timing.jittered_renew_interval(ttl, Timing::random_unit()),
        );
        sleep_until(next).await;
        loop {
            if shared.loss().is_some() {
                return;
            }
            let now = Instant::now();
            let deadline = shared.deadline();
            if now >= deadline {
                shared.lose(LossReason::DeadlinePassed);
                return;
            }
            let limit = deadline.min(later(now, timing.renew_interval(ttl)));
            match renew_attempt(&*backend, &shared, limit).await {
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

/// A lease held by this process and renewed in the background.
///
/// * Stamp every write with [`fence()`](Lease::fence) and check
///   [`may_write()`](Lease::may_write) before starting one: it turns false at
///   the [`deadline()`](Lease::deadline) — the safe fraction of the TTL after
///   the send instant of the last successful renewal — even if the backend
///   never answers, and at once on loss.
/// * [`lost()`](Lease::lost) resolves when the lease is lost, with the
///   [`LossReason`].
/// * [`release()`](Lease::release) gives it up. Dropping it instead never
///   blocks: it stops the renewals and sends a best-effort release from a
///   background task (expiry is the backstop).
#[must_use = "dropping a Lease gives it up at once: renewals stop and a best-effort release is sent in the background"]
pub struct Lease {
    shared: Arc<Shared>,
    backend: Arc<dyn LeaseBackend>,
    task: Option<JoinHandle<()>>,
    released: bool,
}

impl Lease {
    /// Starts keeping `grant`, acquired by a request sent at `sent` (tokio's clock).
    pub(crate) fn start(
        backend: Arc<dyn LeaseBackend>,
        grant: Grant,
        sent: Instant,
        timing: Timing,
        payload: Payload,
        runtime: &tokio::runtime::Handle,
    ) -> Lease {
        let shared = Shared::new(grant, sent, timing, payload);
        let span = tracing::debug_span!("lease.keep", key = %shared.key, holder = %shared.holder, fence = %shared.fence);
        let task = runtime.spawn(keep(backend.clone(), shared.clone()).instrument(span));
        Lease {
            shared,
            backend,
            task: Some(task),
            released: false,
        }
    }

    /// The key.
    pub fn key(&self) -> &LeaseKey {
        &self.shared.key
    }

    /// Who holds it (the keeper's holder id).
    pub fn holder(&self) -> &HolderId {
        &self.shared.holder
    }

    /// The fencing token: stamp every write with it.
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// The effective TTL the backend granted.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// Whether a write may start now: false after [`deadline()`](Lease::deadline)
    /// and after loss.
    pub fn may_write(&self) -> bool {
        self.shared.may_write()
    }

    /// The write deadline on tokio's clock: the send instant of the last
    /// successful renewal (or of the acquire) plus the safe fraction of the TTL.
    /// Moves forward with every successful renewal and never otherwise.
    pub fn deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// The grant as last established or renewed.
    pub fn grant(&self) -> Grant {
        self.shared.grant()
    }

    /// How many renewals have succeeded.
    pub fn renewals(&self) -> u64 {
        self.shared.live().renewals
    }

    /// The payload the backend last accepted.
    pub fn payload(&self) -> Payload {
        self.shared.live().payload.clone()
    }

    /// Replaces the payload on the next renewal (retried until one succeeds).
    pub fn set_payload(&self, payload: Payload) {
        self.shared.set_payload(payload);
    }

    /// The loss reason, if the lease is lost.
    pub fn loss(&self) -> Option<LossReason> {
        self.shared.loss()
    }

    /// Resolves when the lease is lost, with the reason.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: it only watches. A loss is never consumed:
    /// a later call, or [`loss()`](Lease::loss), still sees one that happened
    /// while no call was waiting.
    pub async fn lost(&self) -> LossReason {
        self.shared.lost().await
    }

    /// A detached loss notification, to move into another task.
    pub fn loss_watch(&self) -> LossWatch {
        LossWatch::new(self.shared.subscribe())
    }

    /// Stops renewing and releases the lease. `may_write()` is false before the
    /// release is sent. Releasing a lease already lost to another holder is a
    /// no-op that leaves the new holder alone.
    ///
    /// # Errors
    /// The backend's error; the lease then expires by itself after its TTL.
    /// A release that gets no answer within the TTL is
    /// [`Error::Unavailable`] (its outcome is unknown, and the grant has
    /// expired by then anyway).
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: its first poll stops the renewals, turns
    /// `may_write()` false and hands the release to a task of its own, which
    /// goes on if this future is dropped (bounded by the TTL). A future
    /// dropped before its first poll drops the lease, which releases it in
    /// the background as any drop does. Outside a tokio runtime the release
    /// runs in this future, and dropping it abandons the request.
    pub async fn release(mut self) -> Result<(), Error> {
        self.released = true;
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let already = self.shared.loss();
        self.shared.lose(LossReason::Released);
        if already.as_ref().is_some_and(LossReason::gone_on_backend) {
            return Ok(());
        }
        let grant = self.shared.grant();
        let (backend, ttl) = (self.backend.clone(), self.shared.ttl);
        let send = async move {
            match timeout(ttl, backend.release(&grant)).await {
                Ok(r) => r,
                Err(_) => Err(Error::Unavailable {
                    detail: format!(
                        "the release got no answer within the TTL ({ttl:?}); the grant expires by itself"
                    ),
                    source: None,
                }),
            }
        };
        // In a task of its own, so that a dropped `release()` future (a
        // `select!`, a timeout around it) still releases.
        let result = match tokio::runtime::Handle::try_current() {
            Ok(rt) => rt.spawn(send).await.unwrap_or_else(|e| {
                Err(Error::Unavailable {
                    detail: format!("the release task ended without an answer: {e}"),
                    source: None,
                })
            }),
            Err(_) => send.await,
        };
        match &result {
            Ok(()) => {
                tracing::info!(key = %self.shared.key, holder = %self.shared.holder, fence = %self.shared.fence, "lease released")
            }
            Err(e) => {
                tracing::warn!(key = %self.shared.key, holder = %self.shared.holder, fence = %self.shared.fence, error = %e, "lease release failed; it will expire")
            }
        }
        result
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if self.released {
            return;
        }
        let already = self.shared.loss();
        self.shared.lose(LossReason::Released);
        if already.as_ref().is_some_and(LossReason::gone_on_backend) {
            return;
        }
        spawn_release(&self.backend, &self.shared);
    }
}

/// Sends a best-effort release from a background task, if a tokio runtime is
/// at hand; otherwise the grant simply expires.
pub(crate) fn spawn_release(backend: &Arc<dyn LeaseBackend>, shared: &Shared) {
    let grant = shared.grant();
    let ttl = shared.ttl;
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            let backend = backend.clone();
            rt.spawn(async move {
                match timeout(ttl, backend.release(&grant)).await {
                    Ok(Ok(())) => tracing::debug!(key = %grant.key(), holder = %grant.holder(), fence = %grant.fence(), "dropped lease released"),
                    Ok(Err(e)) => tracing::debug!(key = %grant.key(), holder = %grant.holder(), fence = %grant.fence(), error = %e, "release of a dropped lease failed; it will expire"),
                    Err(_) => tracing::debug!(key = %grant.key(), holder = %grant.holder(), fence = %grant.fence(), "release of a dropped lease unanswered; it will expire"),
                }
            });
        }
        Err(_) => {
            tracing::debug!(key = %grant.key(), holder = %grant.holder(), fence = %grant.fence(),
            "lease dropped outside a tokio runtime; it will expire")
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.shared.key)
            .field("holder", &self.shared.holder)
            .field("fence", &self.shared.fence)
            .field("ttl", &self.shared.ttl)
            .field("may_write", &self.may_write())
            .field("loss", &self.loss())
            .finish()
    }
}
