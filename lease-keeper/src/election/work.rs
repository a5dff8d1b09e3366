//! Work bound to leadership: [`Leadership::run`].

use std::future::Future;

use super::Leadership;
use crate::work::{outcome, while_writable, WorkEnded};

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
        let shared = self.shared();
        let output = while_writable(shared, work).await;
        outcome(shared, output).await
    }
}
