//! Abandoned keys of a session: a key bound to a session lease that nobody
//! renews is deleted one TTL after its last renewal, as it would expire on
//! an etcd lease of its own.
//!
//! A session lease is kept alive by whichever of its keys renews, so a key
//! whose holder stopped renewing it (a dropped grant, a cancelled acquire or
//! renewal, a process that lost track of it) would otherwise live as long as
//! the client renews any other key of that TTL. This module remembers, for
//! every key this client may have bound to a session lease, until when one
//! of its grants may still be renewed or written under (its *due*: the
//! instant its last renewal counted from plus one TTL, always later than
//! any of its grants' write deadlines), and deletes it at its due:
//!
//! * **Guarded.** The delete is a transaction that deletes the key only if
//!   it is still bound to this client's session lease. Only this client
//!   binds keys to its session leases (a re-acquire from another client
//!   moves the key to a lease of its own), so a key on it is one this
//!   client's grants are the only holders of, and their deadlines have all
//!   passed by the due.
//! * **Ordered with this client's own requests.** A key whose acquire or
//!   renewal is in flight is never swept; once a sweep of a key has begun,
//!   a renewal of it answers `Lost` without asking etcd, and an acquire of
//!   it waits until the sweep has settled. So no grant handed out by this
//!   client can be renewed past a sweep that may still land. The one
//!   exception is a grant whose version names a lease outside this
//!   client's sessions (a key this client keeps on a lease of its own, as
//!   the holders of a shared phase do, or a version that names no lease):
//!   the sweep cannot delete a key there, so it renews as without
//!   sessions, uncounted, and is lost the moment it finds the key on one of
//!   this client's session leases. It never writes to or keeps alive a
//!   session lease.
//! * **Before the next keep-alive.** A keep-alive of a session lease waits
//!   for the sweep of every key of it that is due, and fails while one
//!   could not be deleted: it would otherwise keep that key alive again.
//!
//! A background task sweeps on time; a keep-alive sweeps what is due
//! before it goes out. When every handle of the client is gone, the task
//! sweeps what is left at its due and ends.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use hashbrown::hash_map::Entry as HashEntry;
use hashbrown::HashMap;
use lease_core::{Error, LeaseKey, CONTENTION_ATTEMPTS};
use smallvec::SmallVec;
use std::time::Instant;
use tokio::sync::Notify;

use crate::errors::timed;
use crate::record::first_kv;

/// The session leases a key may be bound to; two without an allocation.
type Leases = SmallVec<[i64; 2]>;

/// A failed sweep is tried again after this long.
const RETRY: Duration = Duration::from_millis(200);
/// At most this many sweeps are in flight at once.
const CONCURRENT: usize = 64;

/// What this client knows of one key it may have bound to a session lease.
#[derive(Debug)]
struct Entry {
    /// The key in etcd (with the client's prefix), which the sweep deletes.
    ekey: Arc<str>,
    /// The session leases the key may be bound to by this client's
    /// requests (one, but for acquires of different TTLs, or a session
    /// replaced while an acquire was on its way). Held inline: every
    /// renewal looks for its lease here, and a separate allocation would
    /// cost a cache miss per renewal in a large group.
    leases: Leases,
    /// The key's create revision and last write's mod revision as this
    /// client last granted or renewed it, if it did: the sweep deletes
    /// exactly that record (a delete that lands late cannot hit a later
    /// one).
    known: Option<(i64, i64)>,
    /// No grant of the key this client handed out may be renewed or
    /// written under after this instant.
    due: Instant,
    /// The longest TTL it was bound for.
    ttl: Duration,
    /// Acquires and renewals of the key in flight: it is not swept meanwhile.
    in_flight: u32,
    /// Where its sweep is.
    sweep: Sweep,
    /// A request of it went unanswered (failed, or was dropped half-way):
    /// until this instant it may still land, and whatever it bound is
    /// only known by reading the key. The key is not forgotten before a
    /// sweep after it.
    unanswered: Option<Instant>,
    /// A due of the key queued at this instant is still in the queue. A
    /// later due is then not queued (most renewals): when that one comes
    /// up and the key has moved on, the sweeper queues the key's due of
    /// the moment.
    pending: Option<Instant>,
}

impl Entry {
    /// Whether the entry's due must be queued: unless one no later than it
    /// is queued already. Marks it queued.
    fn queue_due(&mut self) -> Option<Instant> {
        if self.pending.is_some_and(|p| p <= self.due) {
            return None;
        }
        self.pending = Some(self.due);
        Some(self.due)
    }
}

/// Where the sweep of a key is. Once begun, it ends only when etcd
/// answered it: a delete whose answer was lost may still land, so the key
/// stays closed to this client's acquires and renewals, and its leases are
/// not kept alive, until a later try is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sweep {
    /// Not begun.
    No,
    /// A delete is in flight.
    Begun,
    /// A delete failed, or was dropped half-way; another goes out at the
    /// queued retry.
    Failed,
}

#[derive(Debug, Default)]
struct State {
    /// By the caller's key: grants carry it, so a renewal finds its entry
    /// by the key's own allocation, without comparing its text.
    keys: HashMap<LeaseKey, Entry>,
    /// Dues to look at, earliest first; an entry's due may have moved on
    /// since (then the later one is queued too).
    queue: BinaryHeap<Reverse<(Instant, LeaseKey)>>,
    /// The instant the sweeper sleeps until, if it sleeps on a due.
    wakes_at: Option<Instant>,
    /// Per session lease, how many keys that may be bound to it are being
    /// swept (begun or failed): it is not kept alive meanwhile.
    sweeping: HashMap<i64, usize>,
    /// When every handle of the client was gone. No keep-alive goes out
    /// after that, so every session lease expires within its TTL, and its
    /// keys with it.
    closed: Option<Instant>,
}

/// The keys a client may have bound to its session leases, and their dues.
#[derive(Debug, Default)]
pub(crate) struct Bindings {
    state: Mutex<State>,
    /// Wakes the sweeper: an earlier due, or the client closed.
    wake: Notify,
    /// A sweep settled (a key deleted, found not ours, or given up).
    settled: Notify,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // Every critical section leaves the state whole (map and heap
    // operations), so a poisoned lock is safe to keep using.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `at` plus `d`, or `at` itself past the clock's range: a due that cannot
/// be represented is swept at once rather than never.
fn plus(at: Instant, d: Duration) -> Instant {
    at.checked_add(d).unwrap_or(at)
}

/// Dues are on the standard library's clock, as grants' deadlines are;
/// timers are tokio's.
fn timer(at: Instant) -> tokio::time::Instant {
    tokio::time::Instant::from_std(at)
}

/// The longest any wait here lasts, whatever the request timeout.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// Until when a wait of `timeout` from now lasts.
fn give_up_after(timeout: Duration) -> Instant {
    plus(Instant::now(), timeout.min(MAX_WAIT))
}

impl State {
    /// Queues `key`'s due; tells whether the sweeper must wake for it.
    fn queue(&mut self, key: &LeaseKey, due: Instant) -> bool {
        self.queue.push(Reverse((due, key.clone())));
        match self.wakes_at {
            Some(at) if at <= due => false,
            _ => {
                self.wakes_at = Some(due);
                true
            }
        }
    }

    /// The sweep of the key `entry` closes (or reopens) its leases.
    fn count(&mut self, leases: &[i64], up: bool) {
        for l in leases {
            let n = self.sweeping.entry(*l).or_insert(0);
            *n = if up {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            };
        }
        self.sweeping.retain(|_, n| *n > 0);
    }
}

impl Bindings {
    /// Begins an acquire of `key` (sent at `start`, for `ttl`), before any
    /// request goes out: waits (up to `timeout`) while a sweep of the key
    /// is unsettled, then counts the acquire in flight. The returned claim
    /// records what the acquire bound, and, dropped, leaves the key to be
    /// swept at its due.
    pub(crate) async fn begin_acquire(
        self: &Arc<Self>,
        key: &LeaseKey,
        ekey: &str,
        start: Instant,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Claim, Error> {
        let give_up = give_up_after(timeout);
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if let Some(claim) = self.claim(key, || Arc::from(ekey), start, ttl, timeout) {
                return Ok(claim);
            }
            if tokio::time::timeout_at(timer(give_up), settled)
                .await
                .is_err()
            {
                return Err(Error::Unavailable {
                    detail: format!(
                        "etcd key {ekey:?}: an earlier grant of it nobody renewed is being deleted"
                    ),
                    source: None,
                });
            }
        }
    }

    /// Begins a renewal of `key`: `None` when the key's sweep has begun,
    /// and the renewal of a grant on this client's session leases must
    /// answer `Lost` (it would have expired on a lease of its own). A key
    /// not known yet (a grant made before its record here, or through a
    /// version that names no lease) is known from now on, for one TTL.
    pub(crate) fn begin_renew(
        self: &Arc<Self>,
        key: &LeaseKey,
        ekey: impl FnOnce() -> Arc<str>,
        start: Instant,
        ttl: Duration,
        timeout: Duration,
    ) -> Option<Claim> {
        self.claim(key, ekey, start, ttl, timeout)
    }

    /// `ekey` makes the etcd key, for a key not yet known (a renewal
    /// builds none otherwise).
    fn claim(
        self: &Arc<Self>,
        key: &LeaseKey,
        ekey: impl FnOnce() -> Arc<str>,
        start: Instant,
        ttl: Duration,
        timeout: Duration,
    ) -> Option<Claim> {
        let mut st = lock(&self.state);
        let (created, entry) = match st.keys.entry(key.clone()) {
            HashEntry::Occupied(o) => (false, o.into_mut()),
            HashEntry::Vacant(v) => {
                let entry = Entry {
                    ekey: ekey(),
                    leases: Leases::new(),
                    known: None,
                    due: plus(start, ttl),
                    ttl,
                    in_flight: 0,
                    sweep: Sweep::No,
                    unanswered: None,
                    pending: None,
                };
                (true, v.insert(entry))
            }
        };
        if entry.sweep != Sweep::No {
            return None;
        }
        entry.in_flight = entry.in_flight.saturating_add(1);
        Some(Claim {
            bindings: Arc::downgrade(self),
            key: key.clone(),
            created,
            known: entry.known,
            timeout,
            done: false,
        })
    }

    /// A release deleted `key` at create revision `fence`: forget it,
    /// unless it was granted again since or a request of it is in flight.
    pub(crate) fn released(&self, key: &LeaseKey, fence: i64) {
        let mut st = lock(&self.state);
        let forget = st.keys.get(key).is_some_and(|e| {
            e.in_flight == 0
                && e.sweep == Sweep::No
                && e.unanswered.is_none()
                && e.known.is_some_and(|(c, _)| c == fence)
        });
        if forget {
            st.keys.remove(key);
        }
    }

    /// Whether a keep-alive of session lease `lease` must wait: some key is
    /// due (its sweep goes first), or a key of `lease` is being swept.
    fn must_wait(&self, lease: i64) -> bool {
        let st = lock(&self.state);
        let now = Instant::now();
        st.sweeping.contains_key(&lease)
            || st.queue.peek().is_some_and(|Reverse((due, _))| *due <= now)
    }

    /// Before a keep-alive of session lease `lease`: starts the sweeps of
    /// what is due (on tasks of their own, so that neither a slow sweep of
    /// another lease's keys nor a caller that stops polling holds them up),
    /// and waits (up to `timeout`) until no key of `lease` is being swept.
    /// Fails when one could not be deleted in that time: keeping the lease
    /// alive would keep that key alive past its due.
    ///
    /// # Cancel safety
    /// Cancel safe: the sweeps run on their own tasks (or, without a tokio
    /// runtime, count as failed and are tried again when dropped).
    pub(crate) async fn before_keep_alive(
        self: &Arc<Self>,
        client: &Client,
        lease: i64,
        timeout: Duration,
    ) -> Result<(), Error> {
        if !self.must_wait(lease) {
            return Ok(());
        }
        let give_up = give_up_after(timeout);
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            self.start_due(client, timeout).await;
            if !lock(&self.state).sweeping.contains_key(&lease) {
                return Ok(());
            }
            let retry = plus(Instant::now(), RETRY).min(give_up);
            tokio::select! {
                () = &mut settled => {}
                () = tokio::time::sleep_until(timer(retry)) => {}
            }
            if Instant::now() >= give_up {
                return Err(Error::Unavailable {
                    detail: format!(
                        "etcd session lease {lease:x}: a key of it nobody renews could not be deleted yet, so it is not kept alive"
                    ),
                    source: None,
                });
            }
        }
    }

    /// Takes what is due and sweeps it on a task of its own; inline where
    /// no tokio runtime runs.
    async fn start_due(self: &Arc<Self>, client: &Client, timeout: Duration) {
        let due = self.take_due();
        if due.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let client = client.clone();
                runtime.spawn(async move {
                    let _ = sweep_taken(&client, due, timeout).await;
                });
            }
            Err(_) => {
                let _ = sweep_taken(client, due, timeout).await;
            }
        }
    }

    /// Which of `leases` some known key may be bound to.
    pub(crate) fn referenced(&self, leases: &[i64]) -> Vec<i64> {
        let st = lock(&self.state);
        leases
            .iter()
            .filter(|l| st.keys.values().any(|e| e.leases.contains(l)))
            .copied()
            .collect()
    }

    /// Every handle of the client is gone: the sweeper sweeps what is left
    /// at its due, then ends.
    pub(crate) fn close(&self) {
        lock(&self.state).closed = Some(Instant::now());
        self.wake.notify_one();
    }

    /// How many keys are remembered (for tests and diagnostics).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.state).keys.len()
    }

    /// Takes the keys that are due now and marks their sweeps begun.
    fn take_due(self: &Arc<Self>) -> Vec<Taken> {
        let mut st = lock(&self.state);
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(Reverse((at, key))) = st.queue.peek().cloned() {
            if at > now {
                break;
            }
            st.queue.pop();
            let closed = st.closed;
            let Some(entry) = st.keys.get_mut(&key) else {
                continue;
            };
            if entry.pending == Some(at) {
                entry.pending = None;
            }
            let swept_before = entry.sweep != Sweep::No;
            if closed.is_some_and(|at| now >= plus(at, entry.ttl)) && entry.in_flight == 0 {
                // Its session leases have expired since the client closed
                // (nothing kept them alive), and the key with them.
                let leases = std::mem::take(&mut entry.leases);
                st.keys.remove(&key);
                if swept_before {
                    st.count(&leases, false);
                }
                continue;
            }
            match entry.sweep {
                // Being swept already.
                Sweep::Begun => continue,
                // A failed sweep's retry.
                Sweep::Failed => {}
                // In flight: queued again when it ends.
                Sweep::No if entry.in_flight > 0 => continue,
                // Moved on: queued at its due now, unless that is queued.
                Sweep::No if entry.due > now => {
                    if let Some(due) = entry.queue_due() {
                        st.queue(&key, due);
                    }
                    continue;
                }
                Sweep::No if entry.leases.is_empty() => {
                    // Nothing was ever bound: nothing to delete.
                    st.keys.remove(&key);
                    continue;
                }
                Sweep::No => {}
            }
            entry.sweep = Sweep::Begun;
            let (ekey, leases, known) = (entry.ekey.clone(), entry.leases.clone(), entry.known);
            if !swept_before {
                st.count(&leases, true);
            }
            due.push(Taken {
                bindings: self.clone(),
                key: key.clone(),
                ekey,
                leases,
                known,
                settled: false,
            });
        }
        st.wakes_at = st.queue.peek().map(|Reverse((at, _))| *at);
        due
    }

    /// The sweep of `key` was answered (`answered`: deleted, or not bound
    /// to any of its leases), or failed (tried again after [`RETRY`]).
    fn settle(&self, key: &LeaseKey, answered: bool) {
        let mut st = lock(&self.state);
        let Some(entry) = st.keys.get_mut(key) else {
            return;
        };
        if answered {
            let now = Instant::now();
            match entry.unanswered {
                // A request that went unanswered may still land: sweep
                // again once it can no longer.
                Some(until) if now < until => {
                    entry.sweep = Sweep::No;
                    entry.due = entry.due.max(until);
                    let leases = entry.leases.clone();
                    st.count(&leases, false);
                    if st.queue(key, until) {
                        self.wake.notify_one();
                    }
                }
                _ => {
                    let leases = std::mem::take(&mut entry.leases);
                    st.keys.remove(key);
                    st.count(&leases, false);
                }
            }
        } else {
            entry.sweep = Sweep::Failed;
            let retry = plus(Instant::now(), RETRY);
            if st.queue(key, retry) {
                self.wake.notify_one();
            }
        }
        drop(st);
        self.settled.notify_waiters();
    }

    /// Sweeps every key that is due now (see [`sweep_taken`]).
    pub(crate) async fn sweep_due(
        self: &Arc<Self>,
        client: &Client,
        timeout: Duration,
    ) -> Result<(), Error> {
        sweep_taken(client, self.take_due(), timeout).await
    }
}

/// Sweeps the keys taken, at most [`CONCURRENT`] at a time. Fails if one
/// could not be confirmed (it is tried again after [`RETRY`]).
///
/// # Cancel safety
/// Cancel safe: the sweeps it drops count as failed.
async fn sweep_taken(client: &Client, mut due: Vec<Taken>, timeout: Duration) -> Result<(), Error> {
    let mut failed = None;
    while !due.is_empty() {
        let rest = due.split_off(due.len().min(CONCURRENT));
        let sweeps = due.into_iter().map(|taken| async move {
            let outcome = sweep_key(client, &taken, timeout).await;
            taken.settle(outcome.is_ok());
            outcome
        });
        for outcome in join_all(sweeps).await {
            if let Err(e) = outcome {
                failed = Some(e);
            }
        }
        due = rest;
    }
    match failed {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// A key whose sweep has begun. Dropped unsettled (a sweep cancelled
/// half-way), it counts as failed and is tried again.
struct Taken {
    bindings: Arc<Bindings>,
    key: LeaseKey,
    ekey: Arc<str>,
    leases: Leases,
    known: Option<(i64, i64)>,
    settled: bool,
}

impl Taken {
    fn settle(mut self, answered: bool) {
        self.settled = true;
        self.bindings.settle(&self.key, answered);
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if !self.settled {
            self.bindings.settle(&self.key, false);
        }
    }
}

/// Runs the futures concurrently and collects their outputs in order.
async fn join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set: Vec<_> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..set.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in set.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// Deletes the key of `taken` from each of its session leases it is still
/// bound to: exactly the record last seen there (create and mod revision),
/// read first when this client never learned them. A record written since
/// (which only a request of this client that gave nobody a grant can have
/// written: every other one that may write to a session lease is counted
/// in flight, and no other client binds to this client's leases) is read
/// and deleted in its turn.
async fn sweep_key(client: &Client, taken: &Taken, timeout: Duration) -> Result<(), Error> {
    let key = &*taken.ekey;
    let mut kv = client.kv_client();
    'leases: for &lease in &taken.leases {
        let mut guard = taken.known;
        for _ in 0..CONTENTION_ATTEMPTS {
            let Some((create, modified)) = guard else {
                let what = "read of an abandoned key";
                let mut resp = timed(what, timeout, kv.get(key, None)).await?;
                match resp.take_kvs().into_iter().next() {
                    Some(found) if found.lease() == lease => {
                        guard = Some((found.create_revision(), found.mod_revision()));
                        continue;
                    }
                    _ => continue 'leases,
                }
            };
            let txn = Txn::new()
                .when([
                    Compare::lease(key, CompareOp::Equal, lease),
                    Compare::create_revision(key, CompareOp::Equal, create),
                    Compare::mod_revision(key, CompareOp::Equal, modified),
                ])
                .and_then([TxnOp::delete(key, None)])
                .or_else([TxnOp::get(key, None)]);
            let resp = timed("sweep of an abandoned key", timeout, kv.txn(txn)).await?;
            if resp.succeeded() {
                continue 'leases;
            }
            match first_kv(&resp) {
                Some(found) if found.lease() == lease => {
                    guard = Some((found.create_revision(), found.mod_revision()));
                }
                _ => continue 'leases,
            }
        }
        return Err(Error::Unavailable {
            detail: format!(
                "etcd key {key:?} kept changing during {CONTENTION_ATTEMPTS} sweeps of it"
            ),
            source: None,
        });
    }
    Ok(())
}

/// One acquire or renewal of a key in flight (see [`Bindings`]).
#[derive(Debug)]
pub(crate) struct Claim {
    bindings: Weak<Bindings>,
    key: LeaseKey,
    /// The request found the key unknown: it is forgotten again if the
    /// request bound nothing.
    created: bool,
    /// The key's record as known when the request began: a request that
    /// finds the key elsewhere forgets it only if nothing was granted since.
    known: Option<(i64, i64)>,
    /// How long the request may take: after it is dropped, what it sent
    /// may land until then.
    timeout: Duration,
    done: bool,
}

impl Claim {
    /// The request about to go out may bind the key to session lease
    /// `lease`.
    pub(crate) fn may_bind(&self, lease: i64) {
        self.with(|e| {
            if !e.leases.contains(&lease) {
                e.leases.push(lease);
            }
        });
    }

    /// A grant of the key (create revision `create`, last written at
    /// `modified`), bound to session lease `lease`, was handed out or
    /// renewed counting from `from` for `ttl`: its due moves to no earlier
    /// than one TTL from there. An answer that arrives late (older
    /// revisions) moves nothing back.
    pub(crate) fn granted(
        mut self,
        lease: i64,
        (create, modified): (i64, i64),
        from: Instant,
        ttl: Duration,
    ) {
        self.done = true;
        self.finish(|e| {
            if !e.leases.contains(&lease) {
                e.leases.push(lease);
            }
            e.known = e.known.max(Some((create, modified)));
            e.due = e.due.max(plus(from, ttl));
            e.ttl = e.ttl.max(ttl);
        });
    }

    /// The request bound nothing to a session lease of this client (the
    /// key is another holder's, or on another client's lease): a key it
    /// made known and nothing granted since is forgotten again.
    pub(crate) fn unbound(self) {
        let created = self.created;
        self.end_forgetting(|e| created && e.known.is_none());
    }

    /// The request found our own grant of the key on a lease of another
    /// client's (it was moved there): nothing of it is on this client's
    /// sessions any more, unless another request of it is in flight, went
    /// unanswered, or was granted since this one began.
    pub(crate) fn moved_away(self) {
        let known = self.known;
        self.end_forgetting(|e| e.known == known);
    }

    /// Ends the claim, and forgets the key if `may_forget` says so of it
    /// and nothing else holds it: no other request in flight or
    /// unanswered, no sweep begun.
    fn end_forgetting(mut self, may_forget: impl FnOnce(&Entry) -> bool) {
        self.done = true;
        let Some(b) = self.bindings.upgrade() else {
            return;
        };
        let mut st = lock(&b.state);
        let forget = match st.keys.get_mut(&self.key) {
            Some(e) => {
                e.in_flight = e.in_flight.saturating_sub(1);
                e.in_flight == 0 && e.sweep == Sweep::No && e.unanswered.is_none() && may_forget(e)
            }
            None => false,
        };
        if forget {
            st.keys.remove(&self.key);
        } else if let Some(due) = st.keys.get_mut(&self.key).and_then(Entry::queue_due) {
            if st.queue(&self.key, due) {
                b.wake.notify_one();
            }
        }
    }

    fn with(&self, f: impl FnOnce(&mut Entry)) {
        if let Some(b) = self.bindings.upgrade() {
            if let Some(e) = lock(&b.state).keys.get_mut(&self.key) {
                f(e);
            }
        }
    }

    /// Ends the claim: `f` changes the entry, the request is no longer in
    /// flight, and the key's due is queued (or one no later than it is).
    fn finish(&self, f: impl FnOnce(&mut Entry)) {
        let Some(b) = self.bindings.upgrade() else {
            return;
        };
        let mut st = lock(&b.state);
        let Some(e) = st.keys.get_mut(&self.key) else {
            return;
        };
        f(e);
        e.in_flight = e.in_flight.saturating_sub(1);
        if let Some(due) = e.queue_due() {
            if st.queue(&self.key, due) {
                b.wake.notify_one();
            }
        }
    }
}

impl Drop for Claim {
    /// A request that gave no answer (failed, or dropped half-way):
    /// whatever it may have bound is swept at the key's due, and the key is
    /// kept until a sweep after the request can no longer land.
    fn drop(&mut self) {
        if !self.done {
            let until = give_up_after(self.timeout);
            self.finish(|e| e.unanswered = e.unanswered.max(Some(until)));
        }
    }
}

/// The sweeper of a client: sweeps keys at their dues until the client is
/// closed and nothing is left.
pub(crate) async fn run(bindings: Arc<Bindings>, client: Client, timeout: Duration) {
    loop {
        let woken = bindings.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        // A failure is retried: `settle` queued it again.
        let _ = bindings.sweep_due(&client, timeout).await;
        let next = {
            let st = lock(&bindings.state);
            if st.closed.is_some() && st.keys.is_empty() {
                return;
            }
            st.queue.peek().map(|Reverse((at, _))| *at)
        };
        match next {
            Some(at) => {
                let slept = tokio::select! {
                    () = tokio::time::sleep_until(timer(at)) => true,
                    () = &mut woken => false,
                };
                // A paused test clock runs ahead of the standard one the
                // dues are on: wait the rest on the standard clock.
                let left = at.saturating_duration_since(Instant::now());
                if slept && !left.is_zero() {
                    let nap = left.min(Duration::from_millis(50));
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(nap)).await;
                }
            }
            None => woken.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    fn k() -> LeaseKey {
        LeaseKey::new("k").unwrap()
    }

    /// An acquire of the key "k" begun at `start` for `ttl`.
    async fn acquire(b: &Arc<Bindings>, start: Instant, ttl: Duration) -> Claim {
        b.begin_acquire(&k(), "k", start, ttl, ttl).await.unwrap()
    }

    fn bindings() -> Arc<Bindings> {
        Arc::new(Bindings::default())
    }

    fn ago(d: Duration) -> Instant {
        Instant::now() - d
    }

    fn due_keys(b: &Arc<Bindings>) -> Vec<(String, Vec<i64>)> {
        b.take_due()
            .into_iter()
            .map(|t| {
                let out = (t.ekey.to_string(), t.leases.to_vec());
                t.settle(true);
                out
            })
            .collect()
    }

    fn sweeping(b: &Bindings, lease: i64) -> bool {
        lock(&b.state).sweeping.contains_key(&lease)
    }

    #[tokio::test]
    async fn a_granted_key_is_due_a_ttl_after_its_grant_counts_from() {
        let b = bindings();
        let from = ago(TTL);
        let c = acquire(&b, from, TTL).await;
        c.may_bind(7);
        c.granted(7, (5, 5), from, TTL);
        let taken = b.take_due();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].known, Some((5, 5)));
        assert!(sweeping(&b, 7), "its lease is held back during the sweep");
        assert!(
            b.begin_renew(&k(), || "k".into(), Instant::now(), TTL, TTL)
                .is_none(),
            "a renewal during its sweep"
        );
        taken.into_iter().for_each(|t| t.settle(true));
        assert!(!sweeping(&b, 7));
        assert_eq!(b.len(), 0);
    }

    #[tokio::test]
    async fn a_key_in_flight_or_renewed_is_not_due() {
        let b = bindings();
        let long_ago = ago(2 * TTL);
        let c = acquire(&b, long_ago, TTL).await;
        c.may_bind(7);
        assert!(due_keys(&b).is_empty(), "in flight");
        c.granted(7, (5, 5), long_ago, TTL);
        let r = b
            .begin_renew(&k(), || "k".into(), long_ago, TTL, TTL)
            .expect("known");
        assert!(due_keys(&b).is_empty(), "a renewal in flight");
        r.granted(7, (5, 5), Instant::now(), TTL);
        assert!(due_keys(&b).is_empty(), "renewed just now");
        assert_eq!(b.len(), 1);
    }

    #[tokio::test]
    async fn renewals_queue_one_due_and_the_key_is_swept_at_its_last() {
        let b = bindings();
        let short = Duration::from_millis(300);
        let start = Instant::now();
        let c = acquire(&b, start, short).await;
        c.granted(7, (5, 5), start, short);
        let mut last = start;
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            last = Instant::now();
            let r = b
                .begin_renew(&k(), || "k".into(), last, short, short)
                .expect("known");
            r.granted(7, (5, 5), last, short);
        }
        assert_eq!(lock(&b.state).queue.len(), 1, "one due queued for 6 grants");
        assert_every_due_queued(&b);
        // The first due comes up while the key has moved on: its last due
        // is queued in its place, and it is swept then, not before.
        tokio::time::sleep_until(timer(plus(start, short))).await;
        assert!(due_keys(&b).is_empty(), "moved on");
        assert_eq!(lock(&b.state).queue.len(), 1);
        tokio::time::sleep_until(timer(plus(last, short))).await;
        assert_eq!(due_keys(&b), vec![("k".to_string(), vec![7])]);
        assert!(Instant::now() >= plus(last, short));
    }

    /// Every key not swept nor in flight has a due queued no later than
    /// its own: the sweeper comes to it in time.
    fn assert_every_due_queued(b: &Bindings) {
        let st = lock(&b.state);
        for (key, e) in &st.keys {
            let queued = |at: Instant| st.queue.iter().any(|Reverse((q, k))| k == key && *q == at);
            if let Some(p) = e.pending {
                assert!(queued(p), "{key}: the pending due is not in the queue");
            }
            if e.sweep == Sweep::No && e.in_flight == 0 {
                assert!(
                    st.queue
                        .iter()
                        .any(|Reverse((q, k))| k == key && *q <= e.due),
                    "{key}: no due queued in time"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_key_released_and_granted_again_is_swept_at_its_new_due() {
        let b = bindings();
        let short = Duration::from_millis(200);
        let first = Instant::now();
        let c = acquire(&b, first, short).await;
        c.granted(7, (5, 5), first, short);
        assert_every_due_queued(&b);
        b.released(&k(), 5);
        assert_eq!(b.len(), 0);
        // Granted again while the first grant's due is still queued.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = Instant::now();
        let c = acquire(&b, second, short).await;
        c.granted(7, (9, 9), second, short);
        assert_every_due_queued(&b);
        tokio::time::sleep_until(timer(plus(first, short))).await;
        assert!(due_keys(&b).is_empty(), "the first grant's due");
        assert_every_due_queued(&b);
        tokio::time::sleep_until(timer(plus(second, short))).await;
        let taken = b.take_due();
        assert_eq!(taken.len(), 1, "swept at the second grant's due");
        assert_eq!(taken[0].known, Some((9, 9)));
        // A failed sweep is queued again, and a grant cannot move it.
        taken.into_iter().for_each(|t| t.settle(false));
        assert!(b
            .begin_renew(&k(), || "k".into(), Instant::now(), short, short)
            .is_none());
        assert_every_due_queued(&b);
        tokio::time::sleep(RETRY * 2).await;
        assert_eq!(due_keys(&b), vec![("k".to_string(), vec![7])]);
        assert_eq!(b.len(), 0);
    }

    #[tokio::test]
    async fn a_dropped_acquire_leaves_its_binding_to_be_swept() {
        let b = bindings();
        let c = acquire(&b, ago(2 * TTL), TTL).await;
        c.may_bind(7);
        drop(c);
        assert_eq!(due_keys(&b), vec![("k".to_string(), vec![7])]);
    }

    #[tokio::test]
    async fn a_refused_acquire_forgets_only_what_nobody_was_granted() {
        let b = bindings();
        let now = Instant::now();
        let c = acquire(&b, now, TTL).await;
        c.may_bind(7);
        c.unbound();
        assert_eq!(b.len(), 0, "nothing of ours is bound to the key");
        // A refusal of an acquire that began first, answered after another
        // acquire of the key was granted, keeps the grant's record.
        let first = acquire(&b, now, TTL).await;
        let second = acquire(&b, now, TTL).await;
        second.granted(7, (5, 5), now, TTL);
        first.unbound();
        assert_eq!(b.len(), 1, "our own grant of the key is kept");
    }

    #[tokio::test]
    async fn a_release_forgets_only_the_grant_it_deleted() {
        let b = bindings();
        let now = Instant::now();
        acquire(&b, now, TTL).await.granted(7, (9, 9), now, TTL);
        b.released(&k(), 5);
        assert_eq!(b.len(), 1, "a release of an earlier grant");
        b.released(&k(), 9);
        assert_eq!(b.len(), 0);
    }

    #[tokio::test]
    async fn a_late_answer_moves_nothing_back() {
        let b = bindings();
        let now = Instant::now();
        let early = acquire(&b, now, TTL).await;
        let late = acquire(&b, now, TTL).await;
        late.granted(8, (5, 12), now, 2 * TTL);
        early.granted(7, (5, 10), ago(TTL), TTL);
        let st = lock(&b.state);
        let e = st.keys.get(&k()).unwrap();
        assert_eq!(e.known, Some((5, 12)));
        assert_eq!(e.leases.as_slice(), [8, 7], "both leases are swept");
        assert!(e.due >= now + 2 * TTL);
    }

    #[tokio::test]
    async fn a_cancelled_sweep_is_tried_again_and_holds_back_its_lease() {
        let b = bindings();
        let long_ago = ago(2 * TTL);
        acquire(&b, long_ago, TTL)
            .await
            .granted(7, (5, 5), long_ago, TTL);
        drop(b.take_due());
        assert!(
            sweeping(&b, 7),
            "a dropped sweep still holds its lease back"
        );
        assert!(b
            .begin_renew(&k(), || "k".into(), Instant::now(), TTL, TTL)
            .is_none());
        tokio::time::sleep(RETRY * 2).await;
        let again = b.take_due();
        assert_eq!(again.len(), 1, "tried again");
        // An acquire waits for the sweep while it is being retried.
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move {
                b.begin_acquire(&k(), "k", Instant::now(), TTL, TTL)
                    .await
                    .map(|c| c.created)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "an acquire went ahead of the sweep");
        again.into_iter().for_each(|t| t.settle(true));
        assert!(!sweeping(&b, 7));
        assert!(waiting.await.unwrap().unwrap(), "the key starts anew");
    }

    #[tokio::test]
    async fn a_renewal_that_finds_the_key_moved_away_forgets_it() {
        let b = bindings();
        let now = Instant::now();
        acquire(&b, now, TTL).await.granted(7, (5, 5), now, TTL);
        b.begin_renew(&k(), || "k".into(), now, TTL, TTL)
            .unwrap()
            .moved_away();
        assert_eq!(b.len(), 0);
    }

    #[tokio::test]
    async fn a_closed_client_forgets_keys_whose_session_has_run_out() {
        let b = bindings();
        let long_ago = ago(2 * TTL);
        acquire(&b, long_ago, TTL)
            .await
            .granted(7, (5, 5), long_ago, TTL);
        drop(b.take_due());
        lock(&b.state).closed = Some(ago(TTL));
        tokio::time::sleep(RETRY * 2).await;
        assert!(
            b.take_due().is_empty(),
            "swept again after its session ran out"
        );
        assert_eq!(b.len(), 0);
        assert!(!sweeping(&b, 7));
    }

    #[tokio::test]
    async fn nothing_forgets_a_key_an_unanswered_request_may_have_bound() {
        let now = Instant::now();
        let long_ago = ago(2 * TTL);
        // A refusal, after another acquire of the key went unanswered.
        let b = bindings();
        let refused = acquire(&b, long_ago, TTL).await;
        let lost = acquire(&b, long_ago, TTL).await;
        refused.may_bind(7);
        lost.may_bind(7);
        drop(lost);
        refused.unbound();
        assert_eq!(due_keys(&b), vec![("k".to_string(), vec![7])]);
        // A release of the grant before an unanswered acquire.
        let b = bindings();
        acquire(&b, long_ago, TTL)
            .await
            .granted(7, (5, 5), long_ago, TTL);
        let c = acquire(&b, now, TTL).await;
        c.may_bind(7);
        drop(c);
        b.released(&k(), 5);
        assert_eq!(b.len(), 1);
        // A renewal that found the key elsewhere, answered after the key
        // was granted again here.
        let b = bindings();
        let r = b.begin_renew(&k(), || "k".into(), now, TTL, TTL).unwrap();
        acquire(&b, now, TTL).await.granted(7, (9, 9), now, TTL);
        r.moved_away();
        assert_eq!(b.len(), 1);
    }

    #[tokio::test]
    async fn a_key_an_unanswered_request_may_still_bind_is_swept_again_after_it() {
        let b = bindings();
        let long_ago = ago(2 * TTL);
        let c = b
            .begin_acquire(&k(), "k", long_ago, TTL, Duration::from_millis(300))
            .await
            .unwrap();
        c.may_bind(7);
        drop(c);
        let taken = b.take_due();
        assert_eq!(taken.len(), 1);
        taken.into_iter().for_each(|t| t.settle(true));
        assert_eq!(b.len(), 1, "the request may still land: swept again later");
        assert!(!sweeping(&b, 7), "its lease is kept alive meanwhile");
        assert!(due_keys(&b).is_empty(), "not before the request's timeout");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(due_keys(&b), vec![("k".to_string(), vec![7])]);
        assert_eq!(b.len(), 0);
    }

    #[tokio::test]
    async fn an_acquire_waiting_on_a_sweep_gives_up_at_its_timeout() {
        let b = bindings();
        let long_ago = ago(2 * TTL);
        acquire(&b, long_ago, TTL)
            .await
            .granted(7, (5, 5), long_ago, TTL);
        let _taken = b.take_due();
        let e = b
            .begin_acquire(&k(), "k", Instant::now(), TTL, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    }
}
