//! A held lease that renews itself: [`Lease`].

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, Grant, LeaseBackend, Payload, Timing};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};
use tracing::Instrument;

use crate::clock::{later, Sent};
use crate::loss::LossReason;
use crate::renew::{keep, release};
use crate::state::Shared;
use crate::view::LeaseView;

/// A lease held by this process and renewed in the background.
///
/// * Stamp every write with [`fence()`](LeaseView::fence) and check
///   [`may_write()`](LeaseView::may_write) before starting one: it turns false at
///   the [`deadline()`](LeaseView::deadline) — the safe fraction of the TTL after
///   the send instant of the last successful renewal — even if the backend
///   never answers, and at once on loss.
/// * [`lost()`](LeaseView::lost) resolves when the lease is lost, with the
///   [`LossReason`].
/// * [`release()`](Lease::release) gives it up. Dropping it instead never
///   blocks: it stops the renewals and sends a best-effort release from a
///   background task (expiry is the backstop).
#[must_use = "dropping a Lease gives it up at once: renewals stop and a best-effort release is sent in the background"]
pub struct Lease {
    view: LeaseView,
    backend: Arc<dyn LeaseBackend>,
    task: Option<JoinHandle<()>>,
    released: bool,
    /// When the acquire's answer came (tokio's clock): the start of
    /// [`release_after`](Lease::release_after)'s hold.
    held_since: Instant,
}

impl Lease {
    /// Starts keeping `grant`, acquired by a request handed over at `sent`.
    pub(crate) fn start(
        backend: Arc<dyn LeaseBackend>,
        grant: Grant,
        sent: Sent,
        timing: Timing,
        payload: Payload,
        backend_label: Arc<str>,
        runtime: &tokio::runtime::Handle,
    ) -> Lease {
        let shared = Shared::new(grant, sent, timing, payload, backend_label);
        let span = tracing::debug_span!("lease.keep", backend = %shared.backend_label, key = %shared.key, holder = %shared.holder, fence = %shared.fence);
        let task = runtime.spawn(keep(backend.clone(), shared.clone()).instrument(span));
        Lease {
            view: LeaseView::new(shared),
            backend,
            task: Some(task),
            released: false,
            held_since: Instant::now(),
        }
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
        release(&self.backend, &self.view.shared, LossReason::Released)
            .outcome()
            .await
    }
}

impl Lease {
    /// The same lease, but ending it — by [`release`](Lease::release) or a
    /// drop — only stops its renewals and never sends a release: for a
    /// grant held together with other processes (the phase of shared
    /// holders), which one of them leaving must not end for the others.
    pub(crate) fn never_released(self) -> Self {
        self.view.shared.never_release();
        self
    }

    /// Keeps the lease (renewing it) until it has been held for at least
    /// `min_hold`, then releases it as [`release`](Lease::release) does: the
    /// minimum hold of a scheduled job, ShedLock's `lockAtLeastFor`.
    ///
    /// A job run by the first of several machines whose timers fire at
    /// nearly the same moment can finish before the others try: released at
    /// once, the key is free again and a machine whose clock runs a little
    /// late runs the job a second time. Held for at least the spread of the
    /// timers, the key keeps them out, and they skip the run.
    ///
    /// The hold counts from the moment the acquire answered, on this
    /// process's clock: no other holder can take the key before `min_hold`
    /// after that, as long as the lease is kept. A lease already held for
    /// `min_hold` is released at once. A lease lost during the hold ends it
    /// early ([`lost()`](LeaseView::lost) says why); releasing it is then a
    /// no-op, as it is for [`release`](Lease::release).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use lease_keeper::Keeper;
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
    /// let Ok(lease) = keeper.try_acquire("cron/nightly-report").await else {
    ///     return Ok(()); // another machine runs it tonight
    /// };
    /// // ... the job, which may take a second or an hour ...
    /// lease.release_after(Duration::from_secs(60)).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`release`](Lease::release).
    ///
    /// # Cancel safety
    ///
    /// Dropped while it waits, the future drops the lease, which is
    /// released at once in the background as any dropped lease is: the
    /// minimum hold is not kept. Once the wait is over, as
    /// [`release`](Lease::release). Outside a tokio runtime (where
    /// `release` too may be awaited) it blocks the thread for the rest of
    /// the hold, then releases.
    pub async fn release_after(self, min_hold: Duration) -> Result<(), Error> {
        let until = later(self.held_since, min_hold);
        if tokio::runtime::Handle::try_current().is_err() {
            // No tokio timer here (`release` too works outside a runtime):
            // the rest of the hold blocks this thread; the renewals go on
            // in the runtime the lease was taken in.
            std::thread::sleep(
                until
                    .into_std()
                    .saturating_duration_since(std::time::Instant::now()),
            );
            return self.release().await;
        }
        tokio::select! {
            () = sleep_until(until) => {}
            _ = self.view.lost() => {}
        }
        self.release().await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if !self.released {
            release(&self.backend, &self.view.shared, LossReason::Released).detach();
        }
    }
}

impl Deref for Lease {
    type Target = LeaseView;

    /// What the lease knows about itself: fence, deadline, payload, loss.
    fn deref(&self) -> &LeaseView {
        &self.view
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", self.key())
            .field("holder", self.holder())
            .field("fence", &self.fence())
            .field("ttl", &self.ttl())
            .field("may_write", &self.may_write())
            .field("loss", &self.loss())
            .finish()
    }
}
