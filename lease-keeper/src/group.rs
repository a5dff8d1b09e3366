//! [`LeaseGroup`]: many leases renewed together by one scheduler that share
//! one fate — when one is lost, the group releases the others.

use std::collections::HashMap;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::ops::Deref;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use lease_core::{Error, Grant, LeaseBackend, LeaseKey, Payload, Timing};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};
use tracing::Instrument;

use crate::acquire::{AcquireFuture, Acquiring, TryAcquiring};
use crate::clock::{later, runtime, scaled, Sent};
use crate::error::{AcquireError, LeaseAbandoned};
use crate::keeper::Keeper;
use crate::key::IntoLeaseKey;
use crate::loss::LossReason;
use crate::renew::{release, renew_attempt, retry_pause, Releasing, Step};
use crate::state::Shared;
use crate::timetable::{Entry, Timetable};
use crate::view::LeaseView;

/// A group lease is refreshed this share of its TTL after the send instant of
/// its last refresh, at the earliest…
pub const GROUP_REFRESH_MIN: f64 = 0.3;
/// …and at the latest (uniformly in between).
pub const GROUP_REFRESH_MAX: f64 = 0.55;

/// Cap on refreshes in flight at once in one group.
const MAX_IN_FLIGHT: usize = 1024;

/// Refreshes due this soon after the one the scheduler woke for start with
/// it, when that is still within their refresh window: one wake-up for many
/// leases instead of one each (the wake-up, not the refresh, is most of the
/// CPU a large group costs).
const COALESCE: Duration = Duration::from_millis(10);

/// Gives a lease's new payload at refresh time (`None` keeps the current one).
pub type RefreshFn = dyn Fn(&GroupLease) -> Option<Payload> + Send + Sync;

/// One lease of a [`LeaseGroup`]: dereferences to its [`LeaseView`] (fence,
/// deadline, payload, loss). Cheap to clone; dropping it changes nothing (the
/// group owns the lease).
#[derive(Clone)]
#[must_use = "dropping a GroupLease does not release the lease (its group keeps renewing it); keep it for fence() and may_write()"]
pub struct GroupLease {
    view: LeaseView,
}

impl GroupLease {
    fn new(shared: Arc<Shared>) -> Self {
        GroupLease {
            view: LeaseView::new(shared),
        }
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.view.shared
    }
}

impl Deref for GroupLease {
    type Target = LeaseView;

    /// What the lease knows about itself: fence, deadline, payload, loss.
    fn deref(&self) -> &LeaseView {
        &self.view
    }
}

impl fmt::Debug for GroupLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupLease")
            .field("key", self.key())
            .field("fence", &self.fence())
            .field("may_write", &self.may_write())
            .field("loss", &self.loss())
            .finish()
    }
}

/// The group's leases, and whether the group has ended. One lock, so that
/// joining the group and abandoning it cannot interleave: a lease added
/// after the group started giving up would never be renewed.
#[derive(Default)]
struct Members {
    map: HashMap<LeaseKey, Arc<Shared>>,
    /// Set the moment a loss is known, before the others are released.
    ended: Option<LeaseAbandoned>,
}

/// What the scheduler and the handles share.
struct Core {
    keeper: Keeper,
    members: Mutex<Members>,
    /// Published the moment the group gives up (every lease has stopped
    /// writing); [`LeaseGroup::scope`] stops its work on it.
    ended: watch::Sender<Option<LeaseAbandoned>>,
    /// Published once the other leases were released as well.
    abandoned: watch::Sender<Option<LeaseAbandoned>>,
    /// Pinged when a lease joins, so deadline watchers see its deadline.
    joined: Notify,
    refresh: Option<Arc<RefreshFn>>,
}

impl Members {
    /// Takes `key`'s lease out of the group if it is `s`. It stops at once,
    /// under the lock, so that the scheduler (which reads that flag rather
    /// than take this lock per refresh) starts no renewal of a lease that
    /// left the group.
    fn take(&mut self, key: &LeaseKey, s: &Arc<Shared>) -> Option<Arc<Shared>> {
        match self.map.get(key) {
            Some(m) if Arc::ptr_eq(m, s) => {}
            _ => return None,
        }
        let taken = self.map.remove(key)?;
        taken.stop();
        Some(taken)
    }

    /// Takes out the lease `gone` was paired with, if still a member: a
    /// shared hold is a phase bound to a registration, and neither stays
    /// in the group without the other.
    fn take_partner(&mut self, gone: &Arc<Shared>) -> Option<Arc<Shared>> {
        if let Some(r) = gone.bound() {
            return self.take(&r.key, r);
        }
        let phase = self
            .map
            .values()
            .find(|m| m.bound().is_some_and(|b| Arc::ptr_eq(b, gone)))
            .cloned()?;
        self.take(&phase.key, &phase)
    }

    /// Takes every lease out of the group, each stopped as [`take`] does.
    fn take_all(&mut self) -> Vec<Arc<Shared>> {
        self.map
            .drain()
            .map(|(_, s)| {
                s.stop();
                s
            })
            .collect()
    }
}

impl Core {
    fn members(&self) -> MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ended(&self) -> Option<LeaseAbandoned> {
        self.members().ended.clone()
    }

    /// The refresh delay after a lease's last send instant, in
    /// [`GROUP_REFRESH_MIN`, `GROUP_REFRESH_MAX`] × TTL — kept below the
    /// deadline fraction when a custom [`Timing`] has a short one — and the
    /// start of that window.
    fn refresh_delay(&self, ttl: Duration) -> (Duration, Duration) {
        let df = self.keeper.timing().deadline_fraction();
        let lo = GROUP_REFRESH_MIN.min(0.45 * df);
        let hi = GROUP_REFRESH_MAX.min(0.85 * df);
        (
            scaled(ttl, lo + (hi - lo) * Timing::random_unit()),
            scaled(ttl, lo),
        )
    }

    /// When `s` is next refreshed, and the earliest it may be: the start
    /// of its refresh window.
    fn refresh_at(&self, s: &Shared) -> (Instant, Instant) {
        let (delay, earliest) = self.refresh_delay(s.ttl);
        (later(s.sent(), delay), later(s.sent(), earliest))
    }
}

struct Inner {
    core: Arc<Core>,
    add: mpsc::UnboundedSender<Arc<Shared>>,
    pending: Mutex<Option<mpsc::UnboundedReceiver<Arc<Shared>>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = self
            .task
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            t.abort();
        }
        let members = self.core.members().take_all();
        for s in members {
            release(self.core.keeper.backend(), &s, LossReason::Released).detach();
        }
    }
}

/// Many leases renewed by one scheduler task, with shared expiry.
///
/// * Each lease is refreshed 0.3–0.55 of its TTL (uniformly random) after the
///   send instant of its last refresh; refreshes of different leases run
///   concurrently (up to a cap), never one behind another.
/// * An optional callback ([`LeaseGroup::with_refresh`]) gives each lease's new
///   payload at refresh time.
/// * Losing one lease — taken over, expired, or its deadline passed without a
///   successful refresh — releases all the others; [`abandoned()`](LeaseGroup::abandoned)
///   and [`check()`](LeaseGroup::check) then give a [`LeaseAbandoned`] naming the lost keys.
/// * [`scope()`](LeaseGroup::scope) runs a future while the group holds, and
///   releases everything on exit; dropping the last handle releases everything
///   in the background.
///
/// Cheap to clone; clones are the same group.
#[derive(Clone)]
pub struct LeaseGroup {
    inner: Arc<Inner>,
}

impl fmt::Debug for LeaseGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGroup")
            .field("holder", self.inner.core.keeper.holder())
            .field("len", &self.len())
            .field("abandoned", &self.inner.core.ended())
            .finish()
    }
}

impl LeaseGroup {
    /// An empty group on `keeper`'s backend, holder and timing.
    pub fn new(keeper: Keeper) -> Self {
        Self::build(keeper, None)
    }

    /// An empty group whose leases take their new payload from `refresh` at
    /// every refresh (`None` keeps the current payload).
    pub fn with_refresh(
        keeper: Keeper,
        refresh: impl Fn(&GroupLease) -> Option<Payload> + Send + Sync + 'static,
    ) -> Self {
        Self::build(keeper, Some(Arc::new(refresh)))
    }

    fn build(keeper: Keeper, refresh: Option<Arc<RefreshFn>>) -> Self {
        let (add, pending) = mpsc::unbounded_channel();
        let (abandoned, _) = watch::channel(None);
        let (ended, _) = watch::channel(None);
        LeaseGroup {
            inner: Arc::new(Inner {
                core: Arc::new(Core {
                    keeper,
                    members: Mutex::new(Members::default()),
                    ended,
                    abandoned,
                    joined: Notify::new(),
                    refresh,
                }),
                add,
                pending: Mutex::new(Some(pending)),
                task: Mutex::new(None),
            }),
        }
    }

    /// How many leases the group holds.
    pub fn len(&self) -> usize {
        self.inner.core.members().map.len()
    }

    /// Whether the group holds no lease.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The leases the group holds.
    #[must_use = "this only lists the leases; the group holds them either way"]
    pub fn leases(&self) -> Vec<GroupLease> {
        self.inner
            .core
            .members()
            .map
            .values()
            .map(|s| GroupLease::new(s.clone()))
            .collect()
    }

    /// The lease on `key`, if the group holds it.
    #[must_use = "this only looks the lease up; the group holds it either way"]
    pub fn get(&self, key: &LeaseKey) -> Option<GroupLease> {
        self.inner
            .core
            .members()
            .map
            .get(key)
            .map(|s| GroupLease::new(s.clone()))
    }

    /// `Err` once the group gave up: from the moment a loss is known (every
    /// lease of the group has stopped writing by then), even while the
    /// releases of the others are still under way.
    pub fn check(&self) -> Result<(), LeaseAbandoned> {
        match self.inner.core.ended() {
            Some(a) => Err(a),
            None => Ok(()),
        }
    }

    /// Resolves once a lease was lost and the others were released (each
    /// release bounded by its TTL).
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: it only watches. A later call still
    /// resolves at once for an abandonment that happened while no call was
    /// waiting.
    pub async fn abandoned(&self) -> LeaseAbandoned {
        published(&self.inner.core.abandoned).await
    }

    /// Resolves the moment the group gives up (a lease was lost, or its
    /// deadline passed): every lease has stopped writing by then; the others'
    /// releases may still be under way.
    async fn ended(&self) -> LeaseAbandoned {
        published(&self.inner.core.ended).await
    }

    /// Resolves when a lease's write deadline passes, or a lease is known
    /// lost, before the scheduler has given up — a scheduler starved of CPU,
    /// or one still waiting on a renewal — and gives the group up then.
    async fn lapsed(&self) -> LeaseAbandoned {
        let core = &self.inner.core;
        loop {
            let joined = core.joined.notified();
            let now = Instant::now();
            let mut earliest: Option<(Instant, Arc<Shared>)> = None;
            let mut due = None;
            for s in core.members().map.values() {
                if s.loss().is_some_and(|r| r.is_unexpected()) {
                    due = Some(s.clone());
                    break;
                }
                let d = s.deadline();
                if d <= now {
                    due = Some(s.clone());
                    break;
                }
                if earliest.as_ref().is_none_or(|(e, _)| d < *e) {
                    earliest = Some((d, s.clone()));
                }
            }
            if let Some(s) = due {
                s.lose(LossReason::DeadlinePassed);
                return abandon(core, s).await;
            }
            match earliest {
                // Renewals only move deadlines later: waking at an old one
                // and looking again is enough.
                Some((d, _)) => {
                    tokio::select! {
                        _ = sleep_until(d) => {}
                        _ = joined => {}
                    }
                }
                None => joined.await,
            }
        }
    }

    /// Takes `key` into the group if it is free. Set the TTL and payload on
    /// the returned [`TryAcquiring`], then `.await` it. The key is a
    /// [`LeaseKey`] or a string ([`IntoLeaseKey`]; a string that is no key
    /// fails the acquire with [`Error::InvalidKey`] when awaited).
    ///
    /// # Errors
    /// [`AcquireError::Held`] when another holder has the key, naming it;
    /// [`AcquireError::GroupAbandoned`] after the group was abandoned; the
    /// backend's errors, and an invalid key, as [`AcquireError::Backend`].
    ///
    /// Every acquire is a term of its own, as with [`Keeper::try_acquire`]:
    /// a key the group already holds is refused like any held key, naming
    /// the group's own term ([`get`](LeaseGroup::get) finds that lease),
    /// so two tasks sharing a group never both believe they took it.
    ///
    /// # Cancel safety
    ///
    /// As [`Keeper::try_acquire`]: a future dropped while the acquire
    /// request is in flight is settled by the keeper in the background (a
    /// grant it left is taken back and released). Once the backend has
    /// answered, the lease joins the group without another await.
    pub fn try_acquire(&self, key: impl IntoLeaseKey) -> TryAcquiring<LeaseGroup> {
        TryAcquiring::new(self.clone(), key)
    }

    /// Takes `key` into the group, waiting while someone else holds it (see
    /// [`Keeper::acquire`]) — the group itself included: a key the group
    /// holds is taken again only after that lease left the group. Set the
    /// TTL, wait and payload on the returned [`Acquiring`], then `.await` it.
    /// The key is a [`LeaseKey`] or a string ([`IntoLeaseKey`]).
    ///
    /// # Errors
    /// As [`Keeper::acquire`], and [`AcquireError::GroupAbandoned`].
    ///
    /// # Cancel safety
    ///
    /// As [`Keeper::acquire`]: a future dropped while an acquire attempt is
    /// in flight, or after one whose outcome was unknown, is settled by the
    /// keeper in the background (a grant it left is taken back and
    /// released). Dropped while it only waits, it leaves nothing behind.
    pub fn acquire(&self, key: impl IntoLeaseKey) -> Acquiring<LeaseGroup> {
        Acquiring::new(self.clone(), key)
    }

    fn precheck(&self) -> Result<(), AcquireError> {
        self.check().map_err(AcquireError::GroupAbandoned)
    }

    fn add(&self, grant: Grant, sent: Sent, payload: Payload) -> Result<GroupLease, AcquireError> {
        self.add_member(grant, sent, payload, None)
    }

    /// Adds a member; one `bound` to another member (a shared lease's phase,
    /// bound to its registration) writes only while that one may, and
    /// sends no release when it ends (the phase is the other holders' too).
    fn add_member(
        &self,
        grant: Grant,
        sent: Sent,
        payload: Payload,
        bound: Option<Arc<Shared>>,
    ) -> Result<GroupLease, AcquireError> {
        let rt = runtime()?;
        let core = &self.inner.core;
        let (shared, partner) = {
            let mut members = core.members();
            if let Some(a) = members.ended.clone() {
                drop(members);
                // The group gave up while we acquired: give this one back too
                // (a shared phase only stops: it is the other holders' too).
                let shared = Shared::new(
                    grant,
                    sent,
                    core.keeper.timing(),
                    payload,
                    core.keeper.label(),
                );
                if bound.is_some() {
                    shared.never_release();
                }
                release(core.keeper.backend(), &shared, LossReason::Abandoned).detach();
                return Err(AcquireError::GroupAbandoned(a));
            }
            if bound.is_some() && members.map.contains_key(grant.key()) {
                // The group holds the key already (another task's shared
                // hold of it, or a plain one): refused, under the lock, so
                // that two shared holds of one key never race in.
                let (key, holder, fence) =
                    (grant.key().clone(), grant.holder().clone(), grant.fence());
                return Err(AcquireError::Held { key, holder, fence });
            }
            // Every acquire is a term of its own, so this grant is never one
            // a member already holds: two acquires of one key that raced were
            // answered one grant and one refusal.
            let shared = Shared::new(
                grant,
                sent,
                core.keeper.timing(),
                payload,
                core.keeper.label(),
            );
            if let Some(b) = bound {
                shared.never_release();
                shared.bind_to(b);
            }
            let mut partner = None;
            if let Some(old) = members.map.insert(shared.key.clone(), shared.clone()) {
                // The backend granted the key to this new term, so the
                // group's older term of it is gone there: it stops here
                // too, never renewed again, and cannot end the group. A
                // shared hold's other half (its registration, or its
                // phase) leaves with it.
                old.lose(LossReason::Expired);
                partner = members.take_partner(&old);
            }
            (shared, partner)
        };
        if let Some(p) = partner {
            release(core.keeper.backend(), &p, LossReason::Released).detach();
        }
        core.joined.notify_waiters();
        {
            let mut task = self.inner.task.lock().unwrap_or_else(|p| p.into_inner());
            if task.is_none() {
                let pending = self
                    .inner
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                if let Some(rx) = pending {
                    let span = tracing::debug_span!("lease.group", backend = %core.keeper.backend_label(), holder = %core.keeper.holder());
                    *task = Some(rt.spawn(schedule(core.clone(), rx).instrument(span)));
                }
            }
        }
        // The scheduler only ends with the group (abandoned or dropped).
        let _ = self.inner.add.send(shared.clone());
        Ok(GroupLease::new(shared))
    }

    /// Releases one lease of the group (it stops being refreshed first).
    ///
    /// # Errors
    /// The backend's; the lease then expires by itself. A release that gets
    /// no answer within the lease's TTL is
    /// [`Error::Unavailable`] (its outcome is unknown, and the grant has
    /// expired by then anyway).
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: its first poll takes the lease out of the
    /// group (it is no longer refreshed, and `may_write()` turns false) and
    /// hands the release to a task of its own, which goes on if this future
    /// is dropped (bounded by the TTL). A future dropped before its first
    /// poll has changed nothing. Outside a tokio runtime the release runs in
    /// this future, and dropping it abandons the request.
    pub async fn release(&self, lease: &GroupLease) -> Result<(), Error> {
        // A shared lease is its phase and its registration: both leave.
        let (removed, registration) = {
            let mut members = self.inner.core.members();
            let removed = members.take(lease.key(), lease.shared());
            // A phase takes its registration with it; a registration
            // released on its own takes its phase (which only stops: it is
            // the other holders' too).
            let registration = removed.as_ref().and_then(|g| members.take_partner(g));
            (removed, registration)
        };
        let Some(s) = removed else {
            return Ok(());
        };
        let backend = self.inner.core.keeper.backend();
        let phase = release(backend, &s, LossReason::Released);
        match registration {
            Some(r) => {
                let _ = phase.outcome().await;
                release(backend, &r, LossReason::Released).outcome().await
            }
            None => phase.outcome().await,
        }
    }

    /// Stops refreshing and releases every lease, concurrently. The group
    /// stays usable (unless it was abandoned).
    ///
    /// # Errors
    /// The [`LeaseAbandoned`] if the group was abandoned before (its leases
    /// were released then).
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: its first poll takes every lease out of
    /// the group (none is refreshed any more, and `may_write()` turns false
    /// for all) and hands their releases to tasks of their own, each waiting
    /// at most its lease's TTL, which go on if this future is dropped. A
    /// future dropped before its first poll has changed nothing.
    pub async fn release_all(&self) -> Result<(), LeaseAbandoned> {
        // The scheduler stays: it skips leases that left the group, and
        // serves leases acquired later.
        let members = self.inner.core.members().take_all();
        release_many(
            self.inner.core.keeper.backend(),
            members,
            LossReason::Released,
        )
        .await;
        self.check()
    }

    /// Runs `work` while the group holds, then releases every lease.
    ///
    /// `work` is dropped (cancelled) no later than the write deadline of a
    /// lease that stops renewing, and at once when a lease is known lost —
    /// before the group's other leases are released, so a release that
    /// hangs cannot extend it. Work that finishes after a lease was lost is
    /// still an error: its result may rest on writes that were not exclusive.
    ///
    /// # Errors
    /// [`LeaseAbandoned`] when a lease was lost (or its deadline passed)
    /// while `work` ran, naming the lost keys.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe while `work` runs: a future dropped then
    /// drops `work` and leaves the leases held and renewed, as if `scope` had
    /// not been called — unless the group already gave up, whose releases
    /// then finish in the background. Once `work` has returned, a future
    /// dropped while the leases are being released does what a dropped
    /// [`release_all`](LeaseGroup::release_all) does: the leases have left
    /// the group, and their releases finish on tasks of their own.
    pub async fn scope<T>(&self, work: impl Future<Output = T>) -> Result<T, LeaseAbandoned> {
        let result = tokio::select! {
            biased;
            a = self.ended() => Err(a),
            a = self.lapsed() => Err(a),
            t = work => Ok(t),
        };
        // A loss the select did not see first (work finished in the same
        // poll, or a deadline passed while it did).
        let result = match result {
            Ok(t) => match self.check() {
                Err(a) => Err(a),
                Ok(()) => match self.lost_member() {
                    Some(s) => {
                        s.lose(LossReason::DeadlinePassed);
                        Err(abandon(&self.inner.core, s).await)
                    }
                    None => Ok(t),
                },
            },
            e => e,
        };
        if result.is_err() {
            // The work is gone; wait for the group to give the others back
            // (each release is bounded by its TTL).
            self.abandoned().await;
        }
        let released = self.release_all().await;
        match (result, released) {
            (Ok(t), Ok(())) => Ok(t),
            (Err(a), _) | (Ok(_), Err(a)) => Err(a),
        }
    }

    /// A lease known lost, or past its deadline, that the group has not
    /// given up for yet.
    fn lost_member(&self) -> Option<Arc<Shared>> {
        let now = Instant::now();
        self.inner
            .core
            .members()
            .map
            .values()
            .find(|s| s.loss().is_some_and(|r| r.is_unexpected()) || s.deadline() <= now)
            .cloned()
    }
}

/// Releases `members`, concurrently, each on a task of its own (see
/// [`release`]), and waits for all of them.
async fn release_many(
    backend: &Arc<dyn LeaseBackend>,
    members: Vec<Arc<Shared>>,
    reason: LossReason,
) {
    // Mark all first: no lease of the group may start a write once any is being given up.
    for s in &members {
        if s.loss().is_none() {
            s.lose(reason.clone());
        }
    }
    let releasing: Vec<Releasing> = members
        .iter()
        .map(|s| release(backend, s, reason.clone()))
        .collect();
    for r in releasing {
        let _ = r.outcome().await;
    }
}

/// The scheduler: the refresh times in order, and the refreshes in flight
/// (concurrent), which this task polls itself: a task spawned per refresh
/// cost a wake-up of another worker thread and another back for its result,
/// most of what a renewal cost the group.
async fn schedule(core: Arc<Core>, mut add: mpsc::UnboundedReceiver<Arc<Shared>>) {
    let backend = core.keeper.backend().clone();
    let timing = core.keeper.timing();
    let mut running = in_flight(refresh);
    // Refresh times, each with its lease and the earliest instant it may
    // start (an entry holds its lease: a key released and taken again is
    // another lease, never refreshed on the old one's schedule).
    let mut due: Timetable<Arc<Shared>> = Timetable::new(Instant::now(), COALESCE);
    let mut in_flight = 0usize;
    let push = |due: &mut Timetable<_>, at: Instant, earliest: Instant, s: Arc<Shared>| {
        let earliest = earliest.max(at.checked_sub(COALESCE).unwrap_or(at));
        due.insert(Entry {
            at,
            earliest,
            item: s,
        });
    };
    let first_loss: Arc<Shared> = loop {
        let next = due.next_wake();
        let can_start = in_flight < MAX_IN_FLIGHT;
        tokio::select! {
            biased;
            Some((s, step)) = running.next(), if !running.is_empty() => {
                in_flight = in_flight.saturating_sub(1);
                match step {
                    Step::Renewed => {
                        let (at, earliest) = core.refresh_at(&s);
                        push(&mut due, at, earliest, s);
                    }
                    Step::Lost => {
                        if is_member(&core, &s) && s.loss().is_some_and(|r| r.is_unexpected()) {
                            break s;
                        }
                    }
                    Step::Retry => {
                        // Stopped: it left the group (stopped as it left,
                        // under the group's lock) or is lost, its reason
                        // recorded or about to be (a renewal attempt never
                        // ends with a lease stopped and no reason).
                        if s.is_stopped() {
                            continue;
                        }
                        let now = Instant::now();
                        let deadline = s.deadline();
                        if now >= deadline {
                            s.lose(LossReason::DeadlinePassed);
                            break s;
                        }
                        let at = later(now, retry_pause(s.ttl)).min(deadline);
                        push(&mut due, at, now, s);
                    }
                }
            }
            Some(s) = add.recv() => {
                let (at, earliest) = core.refresh_at(&s);
                push(&mut due, at, earliest, s);
            }
            _ = sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() && can_start => {
                let now = Instant::now();
                let mut lost = None;
                while in_flight < MAX_IN_FLIGHT {
                    let Some(Entry { item: s, .. }) = due.pop_startable(now) else { break };
                    // As for a retry: a stopped lease left or is lost.
                    if s.is_stopped() {
                        continue;
                    }
                    let deadline = s.deadline();
                    if now >= deadline {
                        s.lose(LossReason::DeadlinePassed);
                        lost = Some(s);
                        break;
                    }
                    if let Some(f) = &core.refresh {
                        if let Some(p) = f(&GroupLease::new(s.clone())) {
                            s.set_payload(p);
                        }
                    }
                    let limit = deadline.min(later(now, timing.renew_interval(s.ttl)));
                    in_flight = in_flight.saturating_add(1);
                    running.push(refresh(backend.clone(), s, limit));
                }
                if let Some(s) = lost {
                    break s;
                }
            }
        }
    };
    // The other refreshes in flight end here (each renewal is cancel
    // safe): the group releases every lease next.
    drop(running);
    abandon(&core, first_loss).await;
}

/// One refresh of `s`: the lease and how its renewal attempt ended.
async fn refresh(
    backend: Arc<dyn LeaseBackend>,
    s: Arc<Shared>,
    limit: Instant,
) -> (Arc<Shared>, Step) {
    // A backend that panics in one renewal must not take the scheduler,
    // and with it every lease of the group, down: its outcome is unknown,
    // retried until the lease's deadline like any other.
    let attempt = AssertUnwindSafe(renew_attempt(&backend, &s, limit));
    let step = match attempt.catch_unwind().await {
        Ok(step) => step,
        Err(_) => {
            tracing::error!(key = %s.key, holder = %s.holder, fence = %s.fence,
                "the backend panicked in a renewal; retrying until the write deadline");
            Step::Retry
        }
    };
    (s, step)
}

/// An empty set of refreshes in flight, holding `refresh`'s futures as
/// they are (their type has no name): one allocation per refresh, not two.
fn in_flight<F: Future>(
    _: fn(Arc<dyn LeaseBackend>, Arc<Shared>, Instant) -> F,
) -> FuturesUnordered<F> {
    FuturesUnordered::new()
}

fn is_member(core: &Core, s: &Arc<Shared>) -> bool {
    core.members()
        .map
        .get(&s.key)
        .is_some_and(|m| Arc::ptr_eq(m, s))
}

/// Shared expiry: the group ends the moment `first` is known lost — every
/// other lease stops writing and [`LeaseGroup::check`] and `scope` see it —
/// then the others are released and [`LeaseGroup::abandoned`] resolves.
/// Whoever calls it first (the scheduler or a scope that saw a deadline
/// pass) does the work; a later caller gets the same answer at once.
async fn abandon(core: &Arc<Core>, first: Arc<Shared>) -> LeaseAbandoned {
    let (ended, others) = {
        let mut members = core.members();
        if let Some(ended) = members.ended.clone() {
            return ended;
        }
        let mut lost = vec![];
        let mut others = vec![];
        for (_, s) in members.map.drain() {
            match s.loss() {
                Some(r) if r.is_unexpected() => {
                    if r == LossReason::DeadlinePassed {
                        // Possibly still ours on the backend: give it back, but
                        // do not wait on a backend that stopped answering.
                        release(core.keeper.backend(), &s, r.clone()).detach();
                    }
                    lost.push((s.key.clone(), r));
                }
                _ => {
                    // No write may start once any lease of the group is lost.
                    s.lose(LossReason::Abandoned);
                    others.push(s);
                }
            }
        }
        if !lost.iter().any(|(k, _)| *k == first.key) {
            // Released concurrently by its holder while its loss was reported.
            release(core.keeper.backend(), &first, LossReason::DeadlinePassed).detach();
            lost.push((
                first.key.clone(),
                first.loss().unwrap_or(LossReason::DeadlinePassed),
            ));
        }
        lost.sort_by(|a, b| a.0.cmp(&b.0));
        let ended = LeaseAbandoned { lost };
        members.ended = Some(ended.clone());
        (ended, others)
    };
    core.ended.send_replace(Some(ended.clone()));
    tracing::warn!(holder = %core.keeper.holder(), lost = ended.lost.len(), releasing = others.len(), "lease group abandoned");
    // In a task of its own, so that a caller dropped meanwhile (a cancelled
    // scope) cannot leave the releases half-sent and `abandoned` unresolved.
    let (task_core, task_ended) = (core.clone(), ended.clone());
    tokio::spawn(async move {
        release_many(task_core.keeper.backend(), others, LossReason::Abandoned).await;
        task_core.abandoned.send_replace(Some(task_ended));
    });
    ended
}

/// The first value published on `tx`.
async fn published(tx: &watch::Sender<Option<LeaseAbandoned>>) -> LeaseAbandoned {
    let mut rx = tx.subscribe();
    loop {
        if let Some(a) = rx.borrow_and_update().clone() {
            return a;
        }
        if rx.changed().await.is_err() {
            // The sender lives in the group's core, which outlives this borrow.
            std::future::pending::<()>().await;
        }
    }
}

impl Keeper {
    /// A new, empty [`LeaseGroup`] on this keeper's backend and holder.
    pub fn group(&self) -> LeaseGroup {
        LeaseGroup::new(self.clone())
    }
}

impl IntoFuture for Acquiring<LeaseGroup> {
    type Output = Result<GroupLease, AcquireError>;
    type IntoFuture = AcquireFuture<'static, GroupLease>;

    fn into_future(self) -> Self::IntoFuture {
        let label = self.on.inner.core.keeper.label();
        crate::acquire::timed(label, async move {
            let key = self.key?;
            self.on.precheck()?;
            // Only a weak hold on the group while waiting: dropping its
            // last handle must release its members even with an acquire
            // of it pending (a wait may never end).
            let group = Arc::downgrade(&self.on.inner);
            let core = self.on.inner.core.clone();
            drop(self.on);
            let keeper = &core.keeper;
            let ttl = self.ttl.unwrap_or(keeper.ttl());
            let wait = self.wait;
            let attempts = keeper.attempts();
            let span = tracing::info_span!("lease.acquire", backend = %keeper.backend_label(), key = %key, holder = %attempts.holder, group = true);
            let (grant, sent) = attempts
                .wait_grant(&key, ttl, self.payload.clone(), wait)
                .instrument(span)
                .await?;
            adopt(&group, keeper, grant, sent, self.payload)
        })
    }
}

/// Adds `grant`, taken by an acquire that held `group` only weakly while it
/// waited, to the group; gives it back at once if the group is gone.
fn adopt(
    group: &std::sync::Weak<Inner>,
    keeper: &Keeper,
    grant: Grant,
    sent: Sent,
    payload: Payload,
) -> Result<GroupLease, AcquireError> {
    match group.upgrade() {
        Some(inner) => LeaseGroup { inner }.add(grant, sent, payload),
        None => {
            let shared = Shared::new(grant, sent, keeper.timing(), payload, keeper.label());
            release(keeper.backend(), &shared, LossReason::Released).detach();
            Err(AcquireError::GroupAbandoned(LeaseAbandoned {
                lost: Vec::new(),
            }))
        }
    }
}

/// A waiting shared acquire of a group, set up by
/// [`LeaseGroup::acquire_shared`]; the `on` of an [`Acquiring`].
#[derive(Clone, Debug)]
pub struct GroupSharedSide(LeaseGroup);

impl LeaseGroup {
    /// Takes `key` shared into the group (see [`Keeper::acquire_shared`]).
    /// It joins as two members refreshed with the rest: the returned
    /// [`GroupLease`] for the shared phase (its fence, bound by the other:
    /// it may write only while both may), and this holder's registration
    /// on a slot key under `key`. Losing either gives the group up like any
    /// member's loss; [`release`](LeaseGroup::release) of the returned lease
    /// releases the registration too and leaves the phase to the other
    /// shared holders. A group holds a key shared at most once.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use lease_keeper::Keeper;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
    /// let group = keeper.group();
    /// let layout = group.acquire_shared("store/layout").await?;
    /// let other = keeper.acquire_shared("store/layout").await?;
    /// assert_eq!(layout.fence(), other.fence());
    /// group.release(&layout).await?;
    /// # other.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Keeper::acquire_shared`]; [`AcquireError::Held`] when the group
    /// holds `key` already; [`AcquireError::GroupAbandoned`].
    ///
    /// # Cancel safety
    ///
    /// As [`Keeper::acquire_shared`].
    pub fn acquire_shared(&self, key: impl IntoLeaseKey) -> Acquiring<GroupSharedSide> {
        Acquiring::new(GroupSharedSide(self.clone()), key)
    }
}

impl IntoFuture for Acquiring<GroupSharedSide> {
    type Output = Result<GroupLease, AcquireError>;
    type IntoFuture = AcquireFuture<'static, GroupLease>;

    fn into_future(self) -> Self::IntoFuture {
        let label = self.on.0.inner.core.keeper.label();
        crate::acquire::timed(label, async move {
            let key = self.key?;
            let group = self.on.0;
            group.precheck()?;
            // Held weakly while waiting, as a plain acquire of the group.
            let weak = Arc::downgrade(&group.inner);
            let core = group.inner.core.clone();
            drop(group);
            let keeper = &core.keeper;
            let ttl = self.ttl.unwrap_or(keeper.ttl());
            let span = tracing::info_span!("lease.acquire_shared", backend = %keeper.backend_label(), key = %key, group = true);
            let joined = crate::shared::shared(
                keeper,
                &key,
                ttl,
                &self.payload,
                crate::slots::WaitEnd::new(self.wait),
            )
            .instrument(span)
            .await?;
            let (registration, phase) = (joined.registration, joined.phase);
            let registration = adopt(&weak, keeper, registration.0, registration.1, self.payload)?;
            let Some(inner) = weak.upgrade() else {
                return Err(AcquireError::GroupAbandoned(LeaseAbandoned {
                    lost: Vec::new(),
                }));
            };
            let group = LeaseGroup { inner };
            match group.add_member(
                phase.0,
                phase.1,
                Payload::empty(),
                Some(registration.shared().clone()),
            ) {
                Ok(lease) => Ok(lease),
                Err(e) => {
                    // The registration goes with the refused phase.
                    let _ = group.release(&registration).await;
                    Err(e)
                }
            }
        })
    }
}

/// A waiting permit acquire of a group, set up by
/// [`LeaseGroup::acquire_permit`]; the `on` of an [`Acquiring`].
#[derive(Clone, Debug)]
pub struct GroupPermitSide {
    group: LeaseGroup,
    permits: u32,
}

impl LeaseGroup {
    /// Takes one of `permits` permits on `key` into the group (see
    /// [`Keeper::acquire_permit`]): a member like any other, refreshed with
    /// the rest and sharing their fate. Set the TTL, wait and payload on
    /// the returned [`Acquiring`], then `.await` it.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use lease_keeper::Keeper;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let group = Keeper::new(Arc::new(lease_fake::Fake::new())).group();
    /// let leader = group.acquire("jobs/leader").await?;
    /// let slot = group.acquire_permit("jobs/workers", 8).await?;
    /// assert_eq!(group.len(), 2);
    /// group.release_all().await?;
    /// # let _ = (leader, slot);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Keeper::acquire_permit`], and [`AcquireError::GroupAbandoned`].
    ///
    /// # Cancel safety
    ///
    /// As [`Keeper::acquire_permit`].
    pub fn acquire_permit(
        &self,
        key: impl IntoLeaseKey,
        permits: u32,
    ) -> Acquiring<GroupPermitSide> {
        Acquiring::new(
            GroupPermitSide {
                group: self.clone(),
                permits,
            },
            key,
        )
    }
}

impl IntoFuture for Acquiring<GroupPermitSide> {
    type Output = Result<GroupLease, AcquireError>;
    type IntoFuture = AcquireFuture<'static, GroupLease>;

    fn into_future(self) -> Self::IntoFuture {
        let label = self.on.group.inner.core.keeper.label();
        crate::acquire::timed(label, async move {
            let key = self.key?;
            let GroupPermitSide { group, permits } = self.on;
            group.precheck()?;
            // Held weakly while waiting, as a plain acquire of the group.
            let weak = Arc::downgrade(&group.inner);
            let core = group.inner.core.clone();
            drop(group);
            let keeper = &core.keeper;
            let ttl = self.ttl.unwrap_or(keeper.ttl());
            let span = tracing::info_span!("lease.acquire_permit", backend = %keeper.backend_label(), key = %key, permits, group = true);
            let (grant, sent) = crate::semaphore::permit(
                keeper,
                &key,
                permits,
                ttl,
                &self.payload,
                crate::slots::WaitEnd::new(self.wait),
            )
            .instrument(span)
            .await?;
            adopt(&weak, keeper, grant, sent, self.payload)
        })
    }
}

impl IntoFuture for TryAcquiring<LeaseGroup> {
    type Output = Result<GroupLease, AcquireError>;
    type IntoFuture = AcquireFuture<'static, GroupLease>;

    fn into_future(self) -> Self::IntoFuture {
        let label = self.on.inner.core.keeper.label();
        crate::acquire::timed(label, async move {
            let key = self.key?;
            let group = self.on;
            group.precheck()?;
            let keeper = &group.inner.core.keeper;
            let ttl = self.ttl.unwrap_or(keeper.ttl());
            let attempts = keeper.attempts();
            let span = tracing::info_span!("lease.acquire", backend = %keeper.backend_label(), key = %key, holder = %attempts.holder, group = true);
            let (grant, sent) = attempts
                .grant_once(&key, ttl, self.payload.clone())
                .instrument(span)
                .await?;
            group.add(grant, sent, self.payload)
        })
    }
}
