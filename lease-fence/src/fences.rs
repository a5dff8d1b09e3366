//! The rule: the highest fence accepted per resource, and an atomic
//! admit-or-refuse against it.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use lease_core::Fence;
use tokio::sync::OwnedMutexGuard;

/// A write refused because its fence is below one the resource already
/// accepted: the writer's lease was taken over (it was paused, partitioned
/// or its deadline passed) and a newer holder has written since.
///
/// The writer must stop: retrying with the same fence can never succeed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("fence {offered} is below {seen}, the highest already accepted for {resource:?}")]
#[non_exhaustive]
pub struct Stale {
    /// The resource written.
    pub resource: String,
    /// The fence the refused write carried.
    pub offered: Fence,
    /// The highest fence the resource had accepted.
    pub seen: Fence,
}

/// The highest fence accepted for each resource, with an atomic
/// admit-or-refuse.
///
/// A lease alone cannot stop a holder that was paused past its expiry from
/// writing; only the resource can, by refusing a write whose fence is lower
/// than one it has already accepted. `Fences` is that check for a resource
/// written in Rust — an actor, a file, a socket server: give every write's
/// fence to [`admit`](Fences::admit) and do the write only if it is
/// admitted, while the [`Admission`] lives (or [`check`](Fences::check) it
/// under a lock of your own that the write holds too).
///
/// A fence equal to the highest is admitted (a holder writes many times
/// under one grant); a lower one is refused with [`Stale`]. A resource never
/// seen before admits any fence.
///
/// The fences live in memory. A resource that outlives its process must
/// [`restore`](Fences::restore) the highest fence it had accepted (stored
/// with its data) before it admits anything after a restart; otherwise a
/// stale writer could slip in after the restart.
///
/// # Memory
///
/// [`new`](Fences::new) keeps an entry for every resource it ever admitted,
/// which suits a fixed set of resources. Where the callers choose the
/// resource names (the keys an HTTP client presents to
/// `http::CheckFenceLayer`), use
/// [`bounded`](Fences::bounded): it keeps at most that many entries and,
/// to make room, forgets the least recently used idle ones — but never lets
/// a forgotten resource's fence fall. A forgotten resource's highest fence
/// is folded into a floor shared by the resources that hash to the same one
/// of a few thousand buckets, and a resource without an entry admits no
/// fence below its bucket's floor. So forgetting is always safe; its cost
/// is that a resource not seen for a long time, or never seen, may refuse a
/// fence that is below another forgotten resource's. That is harmless where
/// fences rise across keys (etcd's revisions, and the keys of one NATS
/// bucket); where each key counts its own fences from 1 (MongoDB,
/// PostgreSQL, S3), a new key's first fences can be refused for good once
/// busier keys were forgotten into its floor — a newer lease raises the fence
/// by one and will not catch up — and one client presenting huge fences on
/// many keys of its own raises every floor. Bound a set only where fences
/// rise across keys, or make the bound larger than the keys in use.
///
/// ```
/// use lease_core::Fence;
/// use lease_fence::Fences;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease_fence::Stale> {
/// let fences = Fences::new();
/// {
///     let _turn = fences.admit("orders.db", Fence(7)).await?;
///     // write, while no other write to orders.db can run
/// }
/// let refused = fences.admit("orders.db", Fence(6)).await.unwrap_err();
/// assert_eq!((refused.offered, refused.seen), (Fence(6), Fence(7)));
/// # Ok(())
/// # }
/// ```
#[derive(Default)]
pub struct Fences {
    resources: Mutex<Map>,
}

/// How many floors a bounded [`Fences`] keeps for the resources it forgot.
const FLOOR_BUCKETS: usize = 4096;

#[derive(Default)]
struct Map {
    entries: HashMap<String, Arc<Resource>>,
    /// The most entries kept; `None` keeps them all.
    bound: Option<usize>,
    /// The highest fence of every forgotten resource, by bucket of its
    /// name's hash (empty until something is forgotten).
    floors: Vec<Option<Fence>>,
    hasher: RandomState,
    /// Ticks on every use, to find the least recently used entries.
    clock: u64,
}

impl Map {
    fn bucket(&self, name: &str) -> usize {
        // The remainder is below FLOOR_BUCKETS, which fits any usize.
        usize::try_from(self.hasher.hash_one(name) % FLOOR_BUCKETS as u64).unwrap_or(0)
    }

    fn floor(&self, name: &str) -> Option<Fence> {
        self.floors.get(self.bucket(name)).copied().flatten()
    }

    /// Forgets the least recently used idle entries, down to half the
    /// bound, folding each one's fence into its bucket's floor. An entry
    /// with an admission waiting or holding its turn is never forgotten:
    /// a new entry for it would let a second write run beside that one.
    fn make_room(&mut self, bound: usize) {
        let mut idle: Vec<(u64, String)> = self
            .entries
            .iter()
            .filter(|(_, r)| Arc::strong_count(r) == 1 && Arc::strong_count(&r.turn) == 1)
            .map(|(name, r)| (r.last_used.load(Ordering::Relaxed), name.clone()))
            .collect();
        idle.sort_unstable();
        let excess = self.entries.len().saturating_sub(bound / 2);
        if self.floors.is_empty() {
            self.floors = vec![None; FLOOR_BUCKETS];
        }
        for (_, name) in idle.into_iter().take(excess) {
            let Some(gone) = self.entries.remove(&name) else {
                continue;
            };
            let highest = *gone.highest.lock().unwrap_or_else(PoisonError::into_inner);
            let bucket = self.bucket(&name);
            if let Some(floor) = self.floors.get_mut(bucket) {
                *floor = (*floor).max(highest);
            }
        }
    }
}

struct Resource {
    highest: Mutex<Option<Fence>>,
    /// Held for the whole of an admitted asynchronous write, so that a write
    /// at a lower fence admitted earlier can never land after one at a
    /// higher fence.
    turn: Arc<tokio::sync::Mutex<()>>,
    last_used: AtomicU64,
}

impl Resource {
    fn check(&self, name: &str, fence: Fence) -> Result<(), Stale> {
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        match *highest {
            Some(seen) if fence < seen => Err(Stale {
                resource: name.to_owned(),
                offered: fence,
                seen,
            }),
            _ => {
                *highest = Some(fence);
                Ok(())
            }
        }
    }
}

/// An admitted write's turn at its resource: no other write to the same
/// resource is admitted while it lives. Drop it when the write is done.
#[must_use = "the write is only protected while the Admission lives"]
pub struct Admission {
    fence: Fence,
    _turn: OwnedMutexGuard<()>,
}

impl Admission {
    /// The fence admitted.
    pub fn fence(&self) -> Fence {
        self.fence
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl Fences {
    /// No resource has accepted a fence yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps at most `max_resources` entries (at least 1), forgetting the
    /// least recently used idle ones without ever letting a fence fall: see
    /// the [type's documentation](Fences#memory). For resources named by
    /// callers, such as the keys `http::CheckFenceLayer`
    /// is presented.
    pub fn bounded(max_resources: usize) -> Self {
        Self {
            resources: Mutex::new(Map {
                bound: Some(max_resources.max(1)),
                ..Map::default()
            }),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, Map> {
        self.resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn resource(&self, name: &str) -> Arc<Resource> {
        let mut map = self.map();
        map.clock = map.clock.saturating_add(1);
        let now = map.clock;
        if let Some(slot) = map.entries.get(name) {
            slot.last_used.store(now, Ordering::Relaxed);
            return slot.clone();
        }
        if let Some(bound) = map.bound.filter(|b| map.entries.len() >= *b) {
            map.make_room(bound);
        }
        let slot = Arc::new(Resource {
            highest: Mutex::new(map.floor(name)),
            turn: Arc::default(),
            last_used: AtomicU64::new(now),
        });
        map.entries.insert(name.to_owned(), slot.clone());
        slot
    }

    /// Admits a write to `resource` at `fence`, or refuses it with
    /// [`Stale`], and holds the resource's turn while the returned
    /// [`Admission`] lives.
    ///
    /// Waits first for the turn of a write admitted earlier to end, so
    /// writes to one resource happen one at a time, each checked against
    /// every fence admitted before it. An admitted fence is recorded even if
    /// the write then fails: a lower fence stays refused.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped while it waits for the turn, it has checked and
    /// recorded nothing.
    pub async fn admit(&self, resource: &str, fence: Fence) -> Result<Admission, Stale> {
        let slot = self.resource(resource);
        let turn = slot.turn.clone().lock_owned().await;
        slot.check(resource, fence)?;
        Ok(Admission { fence, _turn: turn })
    }

    /// Checks `fence` against `resource` and records it, without taking the
    /// resource's turn: for a resource whose writes are serialised already —
    /// one task, an actor's mailbox, or a write done under the caller's own
    /// lock, taken before the check and held until the write is done:
    ///
    /// ```
    /// use std::sync::Mutex;
    /// use lease_core::Fence;
    /// use lease_fence::{Fences, Stale};
    ///
    /// struct Journal { fences: Fences, lines: Mutex<Vec<String>> }
    ///
    /// impl Journal {
    ///     fn append(&self, fence: Fence, line: &str) -> Result<(), Stale> {
    ///         let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
    ///         self.fences.check("journal", fence)?; // under the lock: no write can slip between
    ///         lines.push(line.to_owned());
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let journal = Journal { fences: Fences::new(), lines: Mutex::default() };
    /// journal.append(Fence(2), "new holder")?;
    /// assert!(journal.append(Fence(1), "paused old holder").is_err());
    /// # Ok::<(), Stale>(())
    /// ```
    pub fn check(&self, resource: &str, fence: Fence) -> Result<(), Stale> {
        self.resource(resource).check(resource, fence)
    }

    /// The highest fence `resource` has accepted, if any (for a resource a
    /// [`bounded`](Fences::bounded) `Fences` forgot: its floor, which is at
    /// least that).
    pub fn seen(&self, resource: &str) -> Option<Fence> {
        let map = self.map();
        let Some(slot) = map.entries.get(resource) else {
            return map.floor(resource);
        };
        let highest = slot.highest.lock().unwrap_or_else(PoisonError::into_inner);
        *highest
    }

    /// How many resources have an entry.
    pub fn len(&self) -> usize {
        self.map().entries.len()
    }

    /// Whether no resource has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Raises `resource`'s highest accepted fence to at least `fence`: after
    /// a restart, the fence stored with the resource's data, so that writers
    /// refused before the restart stay refused. Never lowers it.
    pub fn restore(&self, resource: &str, fence: Fence) {
        let slot = self.resource(resource);
        let mut highest = slot.highest.lock().unwrap_or_else(PoisonError::into_inner);
        if highest.is_none_or(|seen| seen < fence) {
            *highest = Some(fence);
        }
    }
}

impl fmt::Debug for Fences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map = self.map();
        f.debug_struct("Fences")
            .field("resources", &map.entries.len())
            .field("bound", &map.bound)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lower_fence_is_refused_an_equal_or_higher_one_admitted() {
        let fences = Fences::new();
        assert_eq!(fences.seen("r"), None);
        drop(fences.admit("r", Fence(5)).await.expect("first write"));
        drop(
            fences
                .admit("r", Fence(5))
                .await
                .expect("same holder again"),
        );
        let stale = fences.admit("r", Fence(4)).await.expect_err("lower fence");
        assert_eq!(
            stale,
            Stale {
                resource: "r".into(),
                offered: Fence(4),
                seen: Fence(5)
            }
        );
        assert_eq!(
            stale.to_string(),
            "fence 4 is below 5, the highest already accepted for \"r\""
        );
        drop(fences.admit("r", Fence(9)).await.expect("higher fence"));
        assert_eq!(fences.seen("r"), Some(Fence(9)));
        // Resources are independent.
        drop(
            fences
                .admit("other", Fence(1))
                .await
                .expect("other resource"),
        );
    }

    #[tokio::test]
    async fn a_write_admitted_first_finishes_before_a_later_one_is_checked() {
        let fences = Arc::new(Fences::new());
        let first = fences.admit("r", Fence(1)).await.expect("admitted");
        let f2 = fences.clone();
        let second = tokio::spawn(async move { f2.admit("r", Fence(2)).await.map(|a| a.fence()) });
        tokio::task::yield_now().await;
        assert!(
            !second.is_finished(),
            "the second write waits for the first's turn"
        );
        assert_eq!(fences.seen("r"), Some(Fence(1)));
        drop(first);
        assert_eq!(second.await.expect("task"), Ok(Fence(2)));
    }

    #[test]
    fn check_refuses_lower_fences_without_a_turn() {
        let fences = Fences::new();
        assert!(fences.check("r", Fence(3)).is_ok());
        assert_eq!(
            fences.check("r", Fence(2)).map_err(|e| e.seen),
            Err(Fence(3))
        );
        assert!(fences.check("r", Fence(3)).is_ok());
    }

    #[test]
    fn restore_raises_and_never_lowers() {
        let fences = Fences::new();
        fences.restore("r", Fence(10));
        assert!(fences.check("r", Fence(9)).is_err());
        fences.restore("r", Fence(2));
        assert_eq!(fences.seen("r"), Some(Fence(10)));
        assert!(format!("{fences:?}").contains("resources: 1"));
    }

    /// A bounded set forgets idle resources, but never lowers a forgotten
    /// resource's fence, and never forgets one whose turn is held.
    #[tokio::test]
    async fn a_bounded_set_forgets_idle_resources_without_lowering_their_fences() {
        let fences = Arc::new(Fences::bounded(4));
        drop(fences.admit("first", Fence(10)).await.expect("admitted"));
        let busy = fences.admit("busy", Fence(3)).await.expect("admitted");
        for i in 0..100u64 {
            // Above every forgotten fence: a key that shares a forgotten
            // one's floor is admitted all the same.
            fences
                .check(&format!("k{i}"), Fence(100 + i))
                .expect("new resource");
            assert!(fences.len() <= 5, "{i}: {fences:?}");
        }
        let stale = fences
            .check("first", Fence(9))
            .expect_err("forgotten, still fenced");
        assert!(stale.seen >= Fence(10), "{stale}");
        assert!(fences.seen("first") >= Some(Fence(10)));
        fences.check("first", Fence(500)).expect("a newer fence");

        // The busy resource kept its entry and its turn.
        let f2 = fences.clone();
        let second =
            tokio::spawn(async move { f2.admit("busy", Fence(4)).await.map(|a| a.fence()) });
        tokio::task::yield_now().await;
        assert!(!second.is_finished(), "waits for the held turn");
        drop(busy);
        assert_eq!(second.await.expect("task"), Ok(Fence(4)));

        let unbounded = Fences::new();
        for i in 0..100u64 {
            unbounded
                .check(&format!("k{i}"), Fence(i))
                .expect("new resource");
        }
        assert_eq!(unbounded.len(), 100);
    }

    /// Many writers at random fences: the writes that went in, in the order
    /// they went in, never go down, and every refusal names a fence that had
    /// really been accepted before, above the one refused — exactly what a
    /// sequential check would have decided.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writers_leave_the_history_a_sequential_check_would() {
        let fences = Arc::new(Fences::new());
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..200u64 {
            let (fences, log) = (fences.clone(), log.clone());
            // A spread of fences that repeat and arrive out of order.
            let fence = Fence((i * 7919) % 61);
            tasks.push(tokio::spawn(async move {
                match fences.admit("r", fence).await {
                    Ok(turn) => {
                        tokio::task::yield_now().await;
                        log.lock().expect("log").push(Ok(turn.fence()));
                        Ok(())
                    }
                    Err(stale) => {
                        log.lock().expect("log").push(Err(stale.clone()));
                        Err(stale)
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await.expect("task");
        }
        let log = log.lock().expect("log");
        let mut highest = None;
        let mut accepted = std::collections::BTreeSet::new();
        for entry in log.iter() {
            match entry {
                Ok(f) => {
                    assert!(highest <= Some(*f), "write at {f} after {highest:?}");
                    highest = Some(*f);
                    accepted.insert(*f);
                }
                Err(s) => {
                    assert!(s.offered < s.seen, "{s}");
                    assert!(
                        accepted.contains(&s.seen),
                        "refused by {} never accepted",
                        s.seen
                    );
                }
            }
        }
        assert_eq!(highest, fences.seen("r"));
        assert!(
            log.iter().any(Result::is_err),
            "the spread must produce refusals"
        );
    }
}
