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
//!   client can be renewed past a sweep that may still land.
//! * **Before the next keep-alive.** A keep-alive of a session lease waits
//!   for the sweep of every key of it that is due, and fails while one
//!   could not be deleted: it would otherwise keep that key alive again.
//!
//! A background task sweeps on time; a keep-alive sweeps what is due
//! before it goes out. When every handle of the client is gone, the task
//! sweeps what is left at its due and ends.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use lease_core::Error;
use tokio::sync::Notify;

use crate::errors::timed;

/// A failed sweep is tried again after this long.
const RETRY: Duration = Duration::from_millis(200);
/// At most this many sweeps are in flight at once.
const CONCURRENT: usize = 64;

/// What this client knows of one key it may have bound to a session lease.
#[derive(Debug)]
struct Entry {
    /// The session leases the key may be bound to by this client's
    /// requests (one, but for an acquire of one TTL whose outcome is
    /// unknown followed by one of another TTL).
    leases: Vec<i64>,
    /// No grant of the key this client handed out may be renewed or
    /// written under after this instant.
    due: Instant,
    /// Acquires and renewals of the key in flight: it is not swept meanwhile.
    in_flight: u32,
    /// The longest TTL it was bound for.
    ttl: Duration,
    /// Where its sweep is.
    sweep: Sweep,
    /// A sweep of it failed: its leases count it in `State::unswept`.
    failed: bool,
}

/// Where the sweep of a key is. Once begun, it ends only when etcd
/// answered it: a delete whose answer was lost may still land, so the key
/// stays closed to this client's acquires and renewals until a later try
/// is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sweep {
    /// Not begun.
    No,
    /// A delete is in flight.
    Begun,
    /// A delete failed; another goes out at the queued retry.
    Failed,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<Arc<str>, Entry>,
    /// Dues to look at, earliest first; an entry's due may have moved on
    /// since (then the later one is queued too).
    queue: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
    /// The instant the sweeper sleeps until, if it sleeps on a due.
    wakes_at: Option<Instant>,
    /// Per session lease, how many of its keys' sweeps failed and wait for
    /// a retry: it is not kept alive meanwhile.
    unswept: HashMap<i64, usize>,
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

impl State {
    /// Queues `key`'s due; tells whether the sweeper must wake for it.
    fn queue(&mut self, key: &Arc<str>, due: Instant) -> bool {
        self.queue.push(Reverse((due, key.clone())));
        match self.wakes_at {
            Some(at) if at <= due => false,
            _ => {
                self.wakes_at = Some(due);
                true
            }
        }
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
        key: &str,
        start: Instant,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Claim, Error> {
        let key: Arc<str> = Arc::from(key);
        let give_up = plus(Instant::now(), timeout);
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            {
                let mut st = lock(&self.state);
                let created = !st.keys.contains_key(&key);
                let entry = st.keys.entry(key.clone()).or_insert(Entry {
                    leases: Vec::new(),
                    due: plus(start, ttl),
                    ttl,
                    in_flight: 0,
                    sweep: Sweep::No,
                    failed: false,
                });
                if entry.sweep == Sweep::No {
                    entry.in_flight += 1;
                    return Ok(Claim {
                        bindings: Arc::downgrade(self),
                        key,
                        created,
                        done: false,
                    });
                }
            }
            if tokio::time::timeout_at(give_up.into(), settled)
                .await
                .is_err()
            {
                return Err(Error::Unavailable {
                    detail: format!(
                        "etcd key {key:?}: an earlier grant of it nobody renewed is being deleted"
                    ),
                    source: None,
                });
            }
        }
    }

    /// Begins a renewal of `key`, a key this client bound to a session
    /// lease: `None` when the key's sweep has begun or it is no longer
    /// known (swept, or released), and the renewal must answer `Lost`.
    pub(crate) fn begin_renew(self: &Arc<Self>, key: &str) -> Option<Claim> {
        let mut st = lock(&self.state);
        let key = st.keys.get_key_value(key)?.0.clone();
        let entry = st.keys.get_mut(&key)?;
        if entry.sweep != Sweep::No {
            return None;
        }
        entry.in_flight += 1;
        Some(Claim {
            bindings: Arc::downgrade(self),
            key,
            created: false,
            done: false,
        })
    }

    /// A release deleted `key`: forget it, unless another acquire or
    /// renewal of it is in flight.
    pub(crate) fn released(&self, key: &str) {
        let mut st = lock(&self.state);
        if st
            .keys
            .get(key)
            .is_some_and(|e| e.in_flight == 0 && e.sweep == Sweep::No)
        {
            st.keys.remove(key);
        }
    }

    /// Whether a keep-alive of session lease `lease` must wait: some key is
    /// due (its sweep goes first), or a key of `lease` could not be deleted.
    pub(crate) fn must_sweep_before(&self, lease: i64) -> bool {
        let st = lock(&self.state);
        let now = Instant::now();
        st.unswept.get(&lease).is_some_and(|n| *n > 0)
            || st.queue.peek().is_some_and(|Reverse((due, _))| *due <= now)
    }

    /// Whether a key of `lease` is due and could not be deleted yet.
    pub(crate) fn unswept(&self, lease: i64) -> bool {
        lock(&self.state)
            .unswept
            .get(&lease)
            .is_some_and(|n| *n > 0)
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

    /// Takes the keys that are due now, with the leases each may be bound
    /// to, and marks their sweeps begun.
    fn take_due(&self) -> Vec<(Arc<str>, Vec<i64>)> {
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
            if closed.is_some_and(|at| now >= plus(at, entry.ttl)) && entry.in_flight == 0 {
                // Its session lease has expired since the client closed
                // (nothing kept it alive), and the key with it.
                st.keys.remove(&key);
                continue;
            }
            match entry.sweep {
                // Being swept already.
                Sweep::Begun => continue,
                // A failed sweep's retry.
                Sweep::Failed => {}
                // Moved on (a later due is queued), or in flight (queued
                // again when it ends).
                Sweep::No if entry.due > now || entry.in_flight > 0 => continue,
                Sweep::No if entry.leases.is_empty() => {
                    // Nothing of ours was ever bound: nothing to delete.
                    st.keys.remove(&key);
                    continue;
                }
                Sweep::No => {}
            }
            entry.sweep = Sweep::Begun;
            due.push((key.clone(), entry.leases.clone()));
        }
        st.wakes_at = st.queue.peek().map(|Reverse((at, _))| *at);
        due
    }

    /// The sweep of `key` was answered (`answered`: deleted, or not bound
    /// to any of its leases), or failed (tried again after [`RETRY`]; until
    /// an answer its leases are not kept alive, and the key stays closed).
    fn settle(&self, key: &Arc<str>, answered: bool) {
        let mut st = lock(&self.state);
        let Some(entry) = st.keys.get_mut(key) else {
            return;
        };
        let leases = entry.leases.clone();
        if answered {
            let counted = entry.sweep == Sweep::Failed || entry.failed;
            st.keys.remove(key);
            if counted {
                for l in &leases {
                    if let Some(n) = st.unswept.get_mut(l) {
                        *n = n.saturating_sub(1);
                    }
                }
                st.unswept.retain(|_, n| *n > 0);
            }
        } else {
            entry.sweep = Sweep::Failed;
            if !std::mem::replace(&mut entry.failed, true) {
                for l in &leases {
                    *st.unswept.entry(*l).or_insert(0) += 1;
                }
            }
            let retry = plus(Instant::now(), RETRY);
            if st.queue(key, retry) {
                self.wake.notify_one();
            }
        }
        drop(st);
        self.settled.notify_waiters();
    }

    /// Sweeps every key that is due now: one guarded delete per key and
    /// lease, at most [`CONCURRENT`] at a time. Fails if one could not be
    /// confirmed (it is tried again after [`RETRY`]).
    pub(crate) async fn sweep_due(&self, client: &Client, timeout: Duration) -> Result<(), Error> {
        let due = self.take_due();
        let mut failed = None;
        for chunk in due.chunks(CONCURRENT) {
            let sweeps = chunk.iter().map(|(key, leases)| async move {
                let mut outcome = Ok(());
                for lease in leases {
                    if let Err(e) = delete_if_bound(client, key, *lease, timeout).await {
                        outcome = Err(e);
                        break;
                    }
                }
                (key, outcome)
            });
            for (key, outcome) in join_all(sweeps).await {
                self.settle(key, outcome.is_ok());
                if let Err(e) = outcome {
                    failed = Some(e);
                }
            }
        }
        match failed {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// Runs the futures concurrently and collects their outputs in order.
async fn join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set: Vec<_> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..set.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
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

/// Deletes `key` iff it is bound to `lease`.
async fn delete_if_bound(
    client: &Client,
    key: &str,
    lease: i64,
    timeout: Duration,
) -> Result<(), Error> {
    let txn = Txn::new()
        .when([Compare::lease(key, CompareOp::Equal, lease)])
        .and_then([TxnOp::delete(key, None)]);
    let mut kv = client.kv_client();
    timed("sweep of an abandoned key", timeout, kv.txn(txn))
        .await
        .map(|_| ())
}

/// One acquire or renewal of a key in flight (see [`Bindings`]).
#[derive(Debug)]
pub(crate) struct Claim {
    bindings: Weak<Bindings>,
    key: Arc<str>,
    /// The acquire found the key unknown: a refusal forgets it again.
    created: bool,
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

    /// A grant of the key, bound to session lease `lease`, was handed out
    /// (or renewed) counting from `from` for `ttl`: its due moves to no
    /// earlier than one TTL from there.
    pub(crate) fn granted(mut self, lease: i64, from: Instant, ttl: Duration) {
        self.done = true;
        self.finish(|e| {
            e.leases = vec![lease];
            e.due = e.due.max(plus(from, ttl));
            e.ttl = e.ttl.max(ttl);
        });
    }

    /// The request bound nothing to a session lease of this client (the
    /// key is another holder's, or ours on another client's lease): a key
    /// this acquire made known is forgotten again.
    pub(crate) fn unbound(mut self) {
        self.done = true;
        let created = self.created;
        let Some(b) = self.bindings.upgrade() else {
            return;
        };
        let mut st = lock(&b.state);
        let forget = match st.keys.get_mut(&self.key) {
            Some(e) => {
                e.in_flight = e.in_flight.saturating_sub(1);
                created && e.in_flight == 0 && e.sweep == Sweep::No
            }
            None => false,
        };
        if forget {
            st.keys.remove(&self.key);
        } else if let Some(due) = st.keys.get(&self.key).map(|e| e.due) {
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
    /// flight, and the key's due is queued.
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
        let due = e.due;
        if st.queue(&self.key, due) {
            b.wake.notify_one();
        }
    }
}

impl Drop for Claim {
    /// A request that gave no grant (failed, lost, or dropped half-way):
    /// whatever it may have bound is swept at the key's due.
    fn drop(&mut self) {
        if !self.done {
            self.finish(|_| {});
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
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = &mut woken => {}
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

    fn bindings() -> Arc<Bindings> {
        Arc::new(Bindings::default())
    }

    #[tokio::test]
    async fn a_granted_key_is_due_a_ttl_after_its_grant_counts_from() {
        let b = bindings();
        let from = Instant::now() - TTL;
        let c = b.begin_acquire("k", from, TTL, TTL).await.unwrap();
        c.may_bind(7);
        c.granted(7, from, TTL);
        let due = b.take_due();
        assert_eq!(due, vec![(Arc::from("k"), vec![7])]);
        assert!(b.begin_renew("k").is_none(), "a renewal during its sweep");
        b.settle(&Arc::from("k"), true);
        assert!(b.begin_renew("k").is_none(), "a renewal after its sweep");
        assert_eq!(b.len(), 0);
    }

    #[tokio::test]
    async fn a_key_in_flight_or_renewed_is_not_due() {
        let b = bindings();
        let long_ago = Instant::now() - 2 * TTL;
        let c = b.begin_acquire("k", long_ago, TTL, TTL).await.unwrap();
        c.may_bind(7);
        assert!(b.take_due().is_empty(), "in flight");
        c.granted(7, long_ago, TTL);
        let r = b.begin_renew("k").expect("known");
        assert!(b.take_due().is_empty(), "a renewal in flight");
        r.granted(7, Instant::now(), TTL);
        assert!(b.take_due().is_empty(), "renewed just now");
        assert_eq!(b.len(), 1);
    }

    #[tokio::test]
    async fn a_dropped_acquire_leaves_its_binding_to_be_swept() {
        let b = bindings();
        let long_ago = Instant::now() - 2 * TTL;
        let c = b.begin_acquire("k", long_ago, TTL, TTL).await.unwrap();
        c.may_bind(7);
        drop(c);
        assert_eq!(b.take_due(), vec![(Arc::from("k"), vec![7])]);
    }

    #[tokio::test]
    async fn a_refused_acquire_forgets_only_what_it_made_known() {
        let b = bindings();
        let now = Instant::now();
        let c = b.begin_acquire("k", now, TTL, TTL).await.unwrap();
        c.may_bind(7);
        c.unbound();
        assert_eq!(b.len(), 0, "nothing of ours is bound to the key");
        let mine = b.begin_acquire("k", now, TTL, TTL).await.unwrap();
        mine.granted(7, now, TTL);
        let other = b.begin_acquire("k", now, TTL, TTL).await.unwrap();
        other.unbound();
        assert_eq!(b.len(), 1, "our own grant of the key is kept");
    }

    #[tokio::test]
    async fn a_failed_sweep_holds_back_its_lease_until_it_lands() {
        let b = bindings();
        let long_ago = Instant::now() - 2 * TTL;
        let c = b.begin_acquire("k", long_ago, TTL, TTL).await.unwrap();
        c.granted(7, long_ago, TTL);
        let due = b.take_due();
        assert_eq!(due.len(), 1);
        b.settle(&Arc::from("k"), false);
        assert!(b.unswept(7) && b.must_sweep_before(7));
        assert!(!b.unswept(8));
        // An acquire waits for the sweep while it is being retried.
        tokio::time::sleep(RETRY * 2).await;
        let due = b.take_due();
        assert_eq!(due.len(), 1, "tried again");
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move {
                b.begin_acquire("k", Instant::now(), TTL, TTL)
                    .await
                    .map(|c| c.created)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "an acquire went ahead of the sweep");
        b.settle(&Arc::from("k"), true);
        assert!(!b.unswept(7));
        assert!(waiting.await.unwrap().unwrap(), "the key starts anew");
    }

    #[tokio::test]
    async fn a_closed_client_forgets_keys_whose_session_has_run_out() {
        let b = bindings();
        let long_ago = Instant::now() - 2 * TTL;
        let c = b.begin_acquire("k", long_ago, TTL, TTL).await.unwrap();
        c.granted(7, long_ago, TTL);
        assert_eq!(b.take_due().len(), 1);
        b.settle(&Arc::from("k"), false);
        lock(&b.state).closed = Some(Instant::now() - TTL);
        tokio::time::sleep(RETRY * 2).await;
        assert!(
            b.take_due().is_empty(),
            "swept again after its session ran out"
        );
        assert_eq!(b.len(), 0);
    }

    #[tokio::test]
    async fn an_acquire_waiting_on_a_sweep_gives_up_at_its_timeout() {
        let b = bindings();
        let long_ago = Instant::now() - 2 * TTL;
        b.begin_acquire("k", long_ago, TTL, TTL)
            .await
            .unwrap()
            .granted(7, long_ago, TTL);
        assert_eq!(b.take_due().len(), 1);
        let e = b
            .begin_acquire("k", Instant::now(), TTL, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(e.is_unknown_outcome() || matches!(e, Error::Unavailable { .. }));
    }
}
