//! Work bound to leadership: [`Leadership::run`] and [`WorkEnded`].

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;

use tokio::time::sleep_until;

use super::Leadership;
use crate::state::LossReason;

/// Why [`Leadership::run`] ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkEnded<T> {
    /// The work returned this, while this process led.
    Finished(T),
    /// The leadership was lost (taken over, expired, broken): the work was
    /// dropped at once.
    Lost(LossReason),
    /// The write deadline passed without a successful renewal (the backend
    /// was unreachable, or slow): the work was dropped no later than the
    /// deadline.
    DeadlinePassed,
    /// The leadership was resigned (by a [`Resigner`](crate::Resigner)), or
    /// was already over by resignation when `run` was called: the work was
    /// dropped at once.
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

impl Leadership {
    /// Runs `work` only while this process leads, and says why it ended.
    ///
    /// `work` is polled only while [`may_write()`](crate::LeaseView::may_write)
    /// is true — never at all if it is false when `run` is called — and is
    /// dropped, before anything else happens:
    ///
    /// * no later than the write [`deadline()`](crate::LeaseView::deadline),
    ///   even if the backend hangs: a timer on the deadline, re-armed as
    ///   renewals move it, on the same clock as `may_write()` (tokio's);
    ///   [`WorkEnded::DeadlinePassed`];
    /// * at once when the leadership is lost: [`WorkEnded::Lost`];
    /// * at once when it is resigned through a [`Resigner`](crate::Resigner):
    ///   [`WorkEnded::Resigned`]. The resign sends its release only after
    ///   the work was dropped, so the next leader never starts while this
    ///   work still runs (work stuck in one long poll delays the release,
    ///   by at most the TTL, after which the key expires anyway).
    ///
    /// If `work` returns first: [`WorkEnded::Finished`]. `run` does not
    /// resign: for a graceful handover, let the work return, then call
    /// [`resign`](Leadership::resign); the next candidate is woken by the release.
    /// Work that writes must still stamp its writes with the
    /// [`fence()`](crate::LeaseView::fence): a process paused past its
    /// deadline is stopped by the resource's fence check, not by this timer.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe in itself (it only watches the leadership),
    /// but dropping it drops `work` wherever it is, as dropping any future does.
    pub async fn run<F: Future>(&self, work: F) -> WorkEnded<F::Output> {
        let shared = self.shared().clone();
        if !shared.may_write() {
            return self.why_ended().await;
        }
        let running = shared.running();
        let output = {
            let mut work = pin!(work);
            let mut writable = self.writable();
            let mut not_writable = pin!(writable.wait_for(|w| !*w));
            let mut deadline = shared.deadline();
            let mut timer = pin!(sleep_until(deadline));
            poll_fn(|cx| {
                // The deadline moves with successful renewals: re-arm the
                // timer on the current one before deciding anything.
                if !shared.may_write() {
                    return Poll::Ready(None);
                }
                let now_deadline = shared.deadline();
                if now_deadline != deadline {
                    deadline = now_deadline;
                    timer.as_mut().reset(deadline);
                }
                if timer.as_mut().poll(cx).is_ready() {
                    // The deadline is here, and no renewal moved it.
                    return Poll::Ready(None);
                }
                if not_writable.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                work.as_mut().poll(cx).map(Some)
            })
            .await
            // `work` is dropped here, at the end of this block, before
            // anything below runs.
        };
        // Only now may a resign waiting for the work send its release.
        drop(running);
        match output {
            Some(out) => WorkEnded::Finished(out),
            None => self.why_ended().await,
        }
    }

    /// Why the work was dropped (or never polled).
    async fn why_ended<T>(&self) -> WorkEnded<T> {
        match self.ended().await {
            LossReason::DeadlinePassed => WorkEnded::DeadlinePassed,
            LossReason::Released => WorkEnded::Resigned,
            r => WorkEnded::Lost(r),
        }
    }
}
