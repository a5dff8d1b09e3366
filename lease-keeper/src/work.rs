//! Work bound to a held lease: [`Lease::run`],
//! [`Keeper::run_exclusive`](crate::Keeper::run_exclusive),
//! [`Leadership::run`](crate::Leadership::run), and why the work ended,
//! [`WorkEnded`].
//!
//! A holder that checks [`may_write()`](crate::LeaseView::may_write) only
//! between steps keeps writing through a step that outlives its deadline.
//! Running the work *inside* the lease instead drops it the moment the lease
//! may no longer be written under: at the write deadline, even when the
//! backend hangs, and at once on loss.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use tokio::time::{sleep_until, timeout, Instant};

use crate::lease::Lease;
use crate::loss::LossReason;
use crate::state::Shared;

/// Why [`Lease::run`], [`Keeper::run_exclusive`](crate::Keeper::run_exclusive) or
/// [`Leadership::run`](crate::Leadership::run) ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkEnded<T> {
    /// The work returned this, while this process led.
    Finished(T),
    /// The lease (or leadership) was lost (taken over, expired, broken): the
    /// work was dropped at once.
    Lost(LossReason),
    /// The write deadline passed without a successful renewal (the backend
    /// was unreachable, or slow): the work was dropped no later than the
    /// deadline.
    DeadlinePassed,
    /// The leadership was resigned (by a [`Resigner`](crate::Resigner)), or
    /// was already over by resignation when `run` was called: the work was
    /// dropped at once. (A [`Lease`] is released only by consuming it, so
    /// its `run` never ends this way.)
    Resigned,
}

impl<T> WorkEnded<T> {
    /// The work's output, if it finished.
    pub fn finished(self) -> Option<T> {
        match self {
            WorkEnded::Finished(t) => Some(t),
            _ => None,
        }
    }

    /// Whether the work returned by itself.
    pub fn is_finished(&self) -> bool {
        matches!(self, WorkEnded::Finished(_))
    }
}

/// Why [`while_writable`] dropped the work, or never polled it: taken at
/// that moment, because a renewal answered just after may move the
/// deadline on and make it look as if the deadline had never passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// The write deadline had passed.
    Deadline,
    /// The lease was stopped (lost, released, or bound by a lease that may
    /// no longer be written under) before its deadline.
    Stopped,
}

impl Dropped {
    /// Why `shared`, which may no longer be written under, may not be now.
    pub(crate) fn now(shared: &Shared) -> Dropped {
        if Instant::now() >= shared.deadline() {
            Dropped::Deadline
        } else {
            Dropped::Stopped
        }
    }
}

/// Polls `work` only while `shared` may be written under, and drops it, before
/// returning, no later than the write deadline and at once on loss. `Err`
/// when it was dropped (or never polled) rather than finished, saying why.
pub(crate) async fn while_writable<F: Future>(
    shared: &Arc<Shared>,
    work: F,
) -> Result<F::Output, Dropped> {
    if !shared.may_write() {
        return Err(Dropped::now(shared));
    }
    let running = shared.running();
    let output = {
        let mut work = pin!(work);
        let mut writable = shared.writable();
        let mut not_writable = pin!(writable.wait_for(|w| !*w));
        let mut deadline = shared.deadline();
        let mut timer = pin!(sleep_until(deadline));
        poll_fn(|cx| {
            // The deadline moves with successful renewals: re-arm the
            // timer on the current one before deciding anything.
            if !shared.may_write() {
                return Poll::Ready(Err(Dropped::now(shared)));
            }
            let now_deadline = shared.deadline();
            if now_deadline != deadline {
                deadline = now_deadline;
                timer.as_mut().reset(deadline);
            }
            if timer.as_mut().poll(cx).is_ready() {
                // The deadline is here, and no renewal moved it.
                return Poll::Ready(Err(Dropped::Deadline));
            }
            if not_writable.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(Dropped::now(shared)));
            }
            work.as_mut().poll(cx).map(Ok)
        })
        .await
        // `work` is dropped here, at the end of this block, before
        // anything below runs.
    };
    // Only now may a resign waiting for the work send its release.
    drop(running);
    output
}

/// Why a lease that may no longer be written under (for the reason
/// `dropped`) ended: its loss, or its deadline. A renewal that answered the
/// grant is gone stops writes at once and records why after a read, which
/// is bounded by the TTL from about when this wait starts: the wait is
/// bounded by twice that, so the read's own verdict (an expiry, when it
/// got no answer) is the one reported, not a guess from a timer firing at
/// the same moment.
pub(crate) async fn ended(shared: &Shared, dropped: Dropped) -> LossReason {
    if let Some(r) = shared.loss() {
        return r;
    }
    if dropped == Dropped::Deadline || Instant::now() >= shared.deadline() {
        return LossReason::DeadlinePassed;
    }
    timeout(shared.ttl.saturating_mul(2), shared.lost())
        .await
        .unwrap_or(LossReason::Expired)
}

/// What `while_writable` gave, as a [`WorkEnded`].
pub(crate) async fn outcome<T>(shared: &Shared, output: Result<T, Dropped>) -> WorkEnded<T> {
    match output {
        Ok(out) => WorkEnded::Finished(out),
        Err(dropped) => match ended(shared, dropped).await {
            LossReason::DeadlinePassed => WorkEnded::DeadlinePassed,
            LossReason::Released => WorkEnded::Resigned,
            r => WorkEnded::Lost(r),
        },
    }
}

impl Lease {
    /// Runs `work` only while this lease may be written under, and says why
    /// it ended.
    ///
    /// `work` is polled only while [`may_write()`](crate::LeaseView::may_write)
    /// is true — never at all if it is false when `run` is called — and is
    /// dropped, before `run` returns:
    ///
    /// * no later than the write [`deadline()`](crate::LeaseView::deadline),
    ///   even if the backend hangs (a timer on the deadline, re-armed as
    ///   renewals move it): [`WorkEnded::DeadlinePassed`];
    /// * at once when the lease is lost: [`WorkEnded::Lost`].
    ///
    /// If `work` returns first: [`WorkEnded::Finished`]. `run` does not
    /// release the lease: release it (or run again) afterwards. Work that
    /// writes must still stamp its writes with the
    /// [`fence()`](crate::LeaseView::fence): a process paused past its
    /// deadline is stopped by the resource's fence check, not by this timer.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use lease_keeper::{Keeper, WorkEnded};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
    /// # let key = lease_core::LeaseKey::new("jobs/compactor")?;
    /// let lease = keeper.acquire(&key).ttl(Duration::from_secs(10)).await?;
    /// let fence = lease.fence();
    /// let ended = lease
    ///     .run(async move {
    ///         // write, each write stamped with `fence`
    ///         fence
    ///     })
    ///     .await;
    /// assert!(matches!(ended, WorkEnded::Finished(f) if f == fence));
    /// lease.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe in itself (it only watches the lease), but
    /// dropping it drops `work` wherever it is, as dropping any future does.
    pub async fn run<F: Future>(&self, work: F) -> WorkEnded<F::Output> {
        let view: &crate::LeaseView = self;
        let shared = &view.shared;
        let output = while_writable(shared, work).await;
        outcome(shared, output).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lease_core::{Grant, HolderId, LeaseKey, Version};

    use super::*;
    use crate::clock::Sent;

    /// Work dropped at its deadline ends as `DeadlinePassed` at once, and
    /// a renewal answered after the drop cannot make the lease writable
    /// again (a moved deadline once made the answer wait a TTL for a loss
    /// and report `Lost(Expired)` for a lease still held).
    #[tokio::test(start_paused = true)]
    async fn work_dropped_at_the_deadline_says_so_when_a_renewal_lands_next() {
        let ttl = Duration::from_secs(3);
        let key = LeaseKey::new("work/deadline").expect("a valid key");
        let fence = lease_core::Fence(7);
        let grant = Grant::new(
            key,
            HolderId::random(),
            fence,
            ttl,
            std::time::Instant::now(),
            Version::new("1"),
        );
        let shared = Shared::kept_now(grant.clone());
        let output = while_writable(&shared, std::future::pending::<()>()).await;
        assert_eq!(
            output,
            Err(Dropped::Deadline),
            "the work outlived its deadline"
        );
        let dropped_at = Instant::now();
        let recorded = shared.renewed(
            grant.renewed(std::time::Instant::now(), Version::new("2")),
            Sent::now(),
            None,
        );
        assert!(
            !recorded && !shared.may_write(),
            "a renewal answered after the deadline made the lease writable again"
        );
        let ended = outcome(&shared, output).await;
        assert!(
            matches!(ended, WorkEnded::DeadlinePassed) && dropped_at.elapsed().is_zero(),
            "work dropped at its deadline ended as {ended:?}, {:?} after the drop",
            dropped_at.elapsed()
        );
    }
}
