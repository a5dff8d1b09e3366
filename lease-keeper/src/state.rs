//! What a kept lease knows about itself, shared between the handle the user
//! holds and the task (or group scheduler) that renews it.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lease_core::{Fence, Grant, HolderId, LeaseKey, Payload, Timing};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::{counted_from, Sent};
use crate::loss::LossReason;

pub(crate) struct Live {
    /// The grant as last established or renewed, counted from the keeper's
    /// own send instant: its [`Grant::deadline`] is the lease's deadline.
    pub grant: Grant,
    /// Payload to send with the next renewal (kept until one succeeds).
    pub next_payload: Option<Payload>,
    /// The payload the backend last accepted.
    pub payload: Payload,
    /// Successful renewals so far.
    pub renewals: u64,
}

/// Shared between a lease's handles and whatever renews it.
pub(crate) struct Shared {
    pub key: LeaseKey,
    pub holder: HolderId,
    pub fence: Fence,
    pub ttl: Duration,
    pub timing: Timing,
    live: Mutex<Live>,
    /// Set the moment the lease is known to be over, before its reason is
    /// known (a refused renewal is followed by a read that says why; a
    /// lease taken out of its group is released next).
    stopped: AtomicBool,
    lost: watch::Sender<Option<LossReason>>,
    /// What [`LeaseView::writable`](crate::LeaseView::writable) hands out:
    /// true until a write may no longer start.
    writable: watch::Sender<bool>,
    /// Whether a task turns `writable` false at the deadline.
    deadline_watched: AtomicBool,
    /// When the grant's request was sent: the start of the hold time.
    acquired: Instant,
    /// How many work futures run under this lease
    /// ([`Leadership::run`](crate::Leadership::run)): a resign releases the
    /// key only once none is left, so the next holder never starts while
    /// this one's work still runs.
    running: watch::Sender<usize>,
    /// Failed renewal attempts since the last success: the first of a streak
    /// is worth a warning, the rest only add to it.
    failures: AtomicU64,
    /// The `backend` label of the keeper's metrics.
    pub backend_label: Arc<str>,
    /// Another lease this one is only as good as: its deadline bounds this
    /// one's, and this one may write only while it may (a shared lease's
    /// phase, bound by its holder's registration).
    bound: std::sync::OnceLock<Arc<Shared>>,
    /// Whether ending this lease sends no release: a grant held together
    /// with other processes (a shared phase), which one of them leaving
    /// must not end for the others.
    never_release: AtomicBool,
}

/// Counts one work future as running under a lease until dropped; from
/// [`Shared::running`].
pub(crate) struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// `grant` as the keeper keeps it: with its timing, and counted from
/// [`counted_from`] on the keeper's clock, so that the grant and the lease
/// never disagree about the deadline.
fn kept(grant: Grant, sent: Sent, timing: Timing) -> Grant {
    let from = counted_from(&grant, sent);
    grant.with_timing(timing).with_sent_at(from.into_std())
}

impl Shared {
    /// `sent` is when the keeper handed the acquire over.
    /// `backend_label` names the backend in the lease's metrics.
    pub fn new(
        grant: Grant,
        sent: Sent,
        timing: Timing,
        payload: Payload,
        backend_label: Arc<str>,
    ) -> Arc<Self> {
        let grant = kept(grant, sent, timing);
        let (lost, _) = watch::channel(None);
        Arc::new(Shared {
            key: grant.key().clone(),
            holder: grant.holder().clone(),
            fence: grant.fence(),
            ttl: grant.ttl(),
            timing,
            live: Mutex::new(Live {
                grant,
                next_payload: None,
                payload,
                renewals: 0,
            }),
            stopped: AtomicBool::new(false),
            lost,
            writable: watch::channel(true).0,
            deadline_watched: AtomicBool::new(false),
            acquired: sent.at,
            running: watch::channel(0).0,
            failures: AtomicU64::new(0),
            backend_label,
            bound: std::sync::OnceLock::new(),
            never_release: AtomicBool::new(false),
        })
    }

    /// `grant` kept from now, with the default timing and no payload: a
    /// lease for unit tests of the keeper's parts.
    #[cfg(test)]
    pub(crate) fn kept_now(grant: Grant) -> Arc<Self> {
        Shared::new(
            grant,
            Sent::now(),
            Timing::default(),
            Payload::default(),
            "test".into(),
        )
    }

    /// Counts a work future as running under this lease until the returned
    /// guard is dropped (drop it after the work).
    pub fn running(self: &Arc<Self>) -> Running {
        self.running.send_modify(|n| *n = n.saturating_add(1));
        Running(self.clone())
    }

    /// Resolves once no work future runs under this lease.
    pub async fn work_dropped(&self) {
        let mut rx = self.running.subscribe();
        // The sender lives in `self`, so the wait cannot end in an error.
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Counts a failed renewal attempt; how many the streak now has.
    pub fn renewal_failed(&self) -> u64 {
        self.failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1)
    }

    /// Ends a streak of failed renewals; how many it had.
    pub fn renewal_answered(&self) -> u64 {
        self.failures.swap(0, Ordering::Relaxed)
    }

    pub fn live(&self) -> MutexGuard<'_, Live> {
        // Every update is a handful of assignments that cannot panic halfway.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn grant(&self) -> Grant {
        self.live().grant.clone()
    }

    /// The write deadline: the grant's own ([`Timing::deadline`]), or the
    /// lease it is bound by's if that comes first.
    pub fn deadline(&self) -> Instant {
        self.deadline_of(&self.live())
    }

    fn deadline_of(&self, live: &Live) -> Instant {
        let own = Instant::from_std(live.grant.deadline());
        match self.bound.get() {
            Some(b) => own.min(b.deadline()),
            None => own,
        }
    }

    /// Binds this lease to `other`: from now on its deadline is never
    /// later than `other`'s, and it may write only while `other` may. The
    /// first binding stays.
    pub fn bind_to(&self, other: Arc<Shared>) {
        let _ = self.bound.set(other);
    }

    /// The lease this one is bound by, if any ([`bind_to`](Self::bind_to)).
    pub fn bound(&self) -> Option<&Arc<Shared>> {
        self.bound.get()
    }

    /// From now on, ending this lease only stops it: no release is sent.
    pub fn never_release(&self) {
        self.never_release.store(true, Ordering::SeqCst);
    }

    /// Whether ending this lease sends a release.
    pub fn releases(&self) -> bool {
        !self.never_release.load(Ordering::SeqCst)
    }

    /// The send instant of the request behind the current grant.
    pub fn sent(&self) -> Instant {
        Instant::from_std(self.live().grant.sent_at())
    }

    pub fn loss(&self) -> Option<LossReason> {
        self.lost.borrow().clone()
    }

    /// Whether the lease is known lost: `loss().is_some()`, without the
    /// watch's lock while the lease is not even stopped ([`lose`](Self::lose)
    /// stops it before it records the reason), as in every renewal of a
    /// healthy group.
    pub fn is_lost(&self) -> bool {
        self.stopped.load(Ordering::SeqCst) && self.lost.borrow().is_some()
    }

    pub fn may_write(&self) -> bool {
        !self.stopped.load(Ordering::SeqCst)
            && self.loss().is_none()
            && Instant::now() < self.deadline()
            && self.bound.get().is_none_or(|b| b.may_write())
    }

    /// Whether the lease has stopped: lost, ended, or (in a group) taken
    /// out of it. Nothing renews a stopped lease.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Stops writes at once; the reason follows with [`Shared::lose`],
    /// which the caller owes even if it is cancelled: nothing renews a
    /// stopped lease, so nothing else would find out why.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.not_writable();
    }

    fn not_writable(&self) {
        self.writable
            .send_if_modified(|w| std::mem::replace(w, false));
    }

    /// A receiver of whether a write may start, which turns false on loss
    /// and, from the first call on (in a tokio runtime), at the deadline.
    pub fn writable(self: &Arc<Self>) -> watch::Receiver<bool> {
        let rx = self.writable.subscribe();
        if !self.may_write() {
            self.not_writable();
        } else if !self.deadline_watched.swap(true, Ordering::SeqCst) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(watch_deadline(Arc::downgrade(self)));
            } else {
                self.deadline_watched.store(false, Ordering::SeqCst);
            }
        }
        rx
    }

    /// Records a successful renewal sent at `sent`, unless its answer came
    /// at or after the write deadline (`false`): writes stopped there, and
    /// `writable()` turned false for good. Judged under the lock that
    /// `may_write()` reads the deadline through, so no reader can see the
    /// deadline pass and then the lease writable again.
    #[must_use]
    pub fn renewed(&self, grant: Grant, sent: Sent, sent_payload: Option<Payload>) -> bool {
        let mut live = self.live();
        if Instant::now() >= self.deadline_of(&live) {
            return false;
        }
        live.grant = kept(grant, sent, self.timing);
        live.renewals = live.renewals.saturating_add(1);
        if let Some(p) = sent_payload {
            // A newer payload set while this renewal was in flight stays pending.
            if live.next_payload.as_ref() == Some(&p) {
                live.next_payload = None;
            }
            live.payload = p;
        }
        true
    }

    pub fn set_payload(&self, p: Payload) {
        self.live().next_payload = Some(p);
    }

    pub fn pending_payload(&self) -> Option<Payload> {
        self.live().next_payload.clone()
    }

    /// Marks the lease lost (first reason wins); returns whether this call did.
    pub fn lose(&self, reason: LossReason) -> bool {
        self.stop();
        let mut first = false;
        self.lost.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(reason.clone());
                first = true;
                true
            } else {
                false
            }
        });
        if first {
            crate::metrics::record_loss(&self.backend_label, &reason);
            crate::metrics::record_hold(&self.backend_label, self.acquired.elapsed(), &reason);
            if reason.is_unexpected() {
                tracing::warn!(key = %self.key, holder = %self.holder, fence = %self.fence, %reason, "lease lost");
            } else {
                tracing::debug!(key = %self.key, holder = %self.holder, fence = %self.fence, %reason, "lease ended");
            }
        }
        first
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<LossReason>> {
        self.lost.subscribe()
    }

    /// Resolves with the loss reason once the lease is lost.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.lost.subscribe();
        loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return r;
            }
            if rx.changed().await.is_err() {
                // The sender lives in `self`; it cannot be gone while we borrow it.
                return self.loss().unwrap_or(LossReason::Released);
            }
        }
    }
}

/// Turns `writable` false once the deadline passes without a renewal that
/// moved it; ends with the lease (it holds no strong reference while asleep).
async fn watch_deadline(shared: std::sync::Weak<Shared>) {
    loop {
        let Some(s) = shared.upgrade() else { return };
        if !s.may_write() {
            s.not_writable();
            return;
        }
        let deadline = s.deadline();
        drop(s);
        tokio::time::sleep_until(deadline).await;
    }
}

/// Resolves when a lease is lost, with the reason. Obtained from
/// [`LeaseView::loss_watch`](crate::LeaseView::loss_watch) (on a
/// [`Lease`](crate::Lease) or a [`GroupLease`](crate::GroupLease)); it does not
/// borrow the lease, so it can be moved into another task.
#[derive(Clone)]
pub struct LossWatch {
    rx: watch::Receiver<Option<LossReason>>,
}

impl LossWatch {
    pub(crate) fn new(rx: watch::Receiver<Option<LossReason>>) -> Self {
        LossWatch { rx }
    }

    /// The reason, if the lease is already lost.
    pub fn get(&self) -> Option<LossReason> {
        self.rx.borrow().clone()
    }

    /// Waits for the loss. If every handle of the lease is gone without a
    /// recorded loss, the lease was dropped: [`LossReason::Released`].
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: it only watches. A loss is never consumed:
    /// a later call returns one that happened meanwhile at once.
    pub async fn wait(&mut self) -> LossReason {
        loop {
            if let Some(r) = self.rx.borrow_and_update().clone() {
                return r;
            }
            if self.rx.changed().await.is_err() {
                return self.rx.borrow().clone().unwrap_or(LossReason::Released);
            }
        }
    }
}

impl fmt::Debug for LossWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossWatch")
            .field("lost", &self.get())
            .finish()
    }
}
