//! When each lease of a group is next refreshed: a timetable of slots.
//!
//! A group of many leases inserts one refresh time per renewal, at a random
//! point of each lease's refresh window. Kept in one ordered tree of every
//! entry, that insert walks a path of cache misses (a tree of 100,000
//! entries) and was the largest cost of a renewal in a large group. Here
//! times are grouped into slots as long as the scheduler's coalescing
//! window: an insert finds its slot in a small tree (one per slot in use)
//! and appends to it, and the scheduler takes a slot's entries when the
//! slot begins. Entries of a slot are started together anyway: whatever is
//! due within the coalescing window starts on the same wake-up.
//!
//! An entry whose refresh window opens after its slot begins (a window
//! narrower than a slot) is held apart, keyed by that exact instant, so
//! that no refresh starts before its window opens.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// A refresh to start: when it is due (`at`), the earliest it may start,
/// and what it is for.
pub(crate) struct Entry<T> {
    pub(crate) at: Instant,
    pub(crate) earliest: Instant,
    pub(crate) item: T,
}

/// Slots of a fixed length counted from an origin.
#[derive(Clone, Copy)]
struct Grid {
    origin: Instant,
    /// Nanoseconds per slot (at least 1).
    slot_nanos: u128,
}

impl Grid {
    fn slot_of(self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(since / self.slot_nanos).unwrap_or(u64::MAX)
    }

    fn start(self, slot: u64) -> Instant {
        let nanos = u128::from(slot).saturating_mul(self.slot_nanos);
        let offset = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        self.origin.checked_add(offset).unwrap_or(self.origin)
    }
}

pub(crate) struct Timetable<T> {
    grid: Grid,
    /// Every entry of a slot, by its place in `store`. Places are four
    /// bytes, so a slot's vector stays under a kilobyte up to 256 entries:
    /// glibc's malloc answers every larger allocation by consolidating its
    /// small free chunks first, which a vector of whole entries growing in
    /// every slot (a hundred a second) made a tenth of a NATS client's CPU.
    slots: BTreeMap<u64, Vec<u32>>,
    /// The entries of all slots; `None` at a free place.
    store: Vec<Option<Entry<T>>>,
    /// Free places in `store`.
    free: Vec<u32>,
    /// Emptied slots' vectors, kept for new slots.
    spare: Vec<Vec<u32>>,
    /// Entries that may not start when their slot begins, by the instant
    /// they may (numbered: two may share one).
    waiting: BTreeMap<(Instant, u64), Entry<T>>,
    numbered: u64,
}

/// Emptied slot vectors kept for reuse, at most (a group of 100,000 leases
/// with a TTL of a minute empties and begins a hundred slots a second).
const SPARE_SLOTS: usize = 256;

impl<T> Timetable<T> {
    /// Slots of `slot` each, counted from `origin`.
    pub(crate) fn new(origin: Instant, slot: Duration) -> Self {
        Timetable {
            grid: Grid {
                origin,
                slot_nanos: slot.as_nanos().max(1),
            },
            slots: BTreeMap::new(),
            store: Vec::new(),
            free: Vec::new(),
            spare: Vec::new(),
            waiting: BTreeMap::new(),
            numbered: 0,
        }
    }

    pub(crate) fn insert(&mut self, entry: Entry<T>) {
        let place = match self.free.pop() {
            Some(place) => place,
            None => match u32::try_from(self.store.len()) {
                Ok(place) => {
                    self.store.push(None);
                    place
                }
                // Four billion entries: the rest wait apart, in order.
                Err(_) => return self.wait(entry),
            },
        };
        let slot = self.grid.slot_of(entry.at);
        if let Some(cell) = self.store.get_mut(place as usize) {
            *cell = Some(entry);
        }
        let spare = &mut self.spare;
        self.slots
            .entry(slot)
            .or_insert_with(|| spare.pop().unwrap_or_default())
            .push(place);
    }

    fn wait(&mut self, entry: Entry<T>) {
        self.numbered = self.numbered.wrapping_add(1);
        self.waiting.insert((entry.earliest, self.numbered), entry);
    }

    /// When the scheduler should next wake: the start of the first slot
    /// in use, or the first instant a waiting entry may start.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        let slot = self.slots.keys().next().map(|s| self.grid.start(*s));
        let waiting = self.waiting.keys().next().map(|(at, _)| *at);
        match (slot, waiting) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// An entry that may start at `now`, if any: from a waiting entry whose
    /// instant has come, or a slot that has begun (an entry of it whose
    /// window is still closed moves to the waiting ones).
    pub(crate) fn pop_startable(&mut self, now: Instant) -> Option<Entry<T>> {
        if let Some(e) = self.waiting.first_entry() {
            if e.key().0 <= now {
                return Some(e.remove());
            }
        }
        loop {
            let mut first = self.slots.first_entry()?;
            if self.grid.start(*first.key()) > now {
                return None;
            }
            let place = first.get_mut().pop();
            if first.get().is_empty() {
                let emptied = first.remove();
                if self.spare.len() < SPARE_SLOTS {
                    self.spare.push(emptied);
                }
            }
            let Some(place) = place else { continue };
            let Some(entry) = self.store.get_mut(place as usize).and_then(Option::take) else {
                continue;
            };
            self.free.push(place);
            if entry.earliest > now {
                self.wait(entry);
                continue;
            }
            return Some(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn entry(at: Instant, earliest: Instant, item: u32) -> Entry<u32> {
        Entry { at, earliest, item }
    }

    fn drain(t: &mut Timetable<u32>, now: Instant) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(e) = t.pop_startable(now) {
            out.push(e.item);
        }
        out.sort_unstable();
        out
    }

    #[test]
    fn a_slot_starts_whole_when_it_begins() {
        let t0 = Instant::now();
        let mut t = Timetable::new(t0, 10 * MS);
        t.insert(entry(t0 + 25 * MS, t0, 1));
        t.insert(entry(t0 + 21 * MS, t0, 2));
        t.insert(entry(t0 + 31 * MS, t0, 3));
        assert_eq!(t.next_wake(), Some(t0 + 20 * MS));
        assert_eq!(drain(&mut t, t0 + 19 * MS), Vec::<u32>::new());
        // Due within the slot: both start when it begins, before their `at`.
        assert_eq!(drain(&mut t, t0 + 20 * MS), vec![1, 2]);
        assert_eq!(t.next_wake(), Some(t0 + 30 * MS));
        assert_eq!(drain(&mut t, t0 + 30 * MS), vec![3]);
        assert_eq!(t.next_wake(), None);
    }

    #[test]
    fn nothing_starts_before_its_window_opens() {
        let t0 = Instant::now();
        let mut t = Timetable::new(t0, 10 * MS);
        // Its window opens 5 ms into its slot.
        t.insert(entry(t0 + 27 * MS, t0 + 25 * MS, 1));
        t.insert(entry(t0 + 22 * MS, t0 + 20 * MS, 2));
        assert_eq!(drain(&mut t, t0 + 20 * MS), vec![2]);
        assert_eq!(t.next_wake(), Some(t0 + 25 * MS));
        assert_eq!(drain(&mut t, t0 + 24 * MS), Vec::<u32>::new());
        assert_eq!(drain(&mut t, t0 + 25 * MS), vec![1]);
        assert_eq!(t.next_wake(), None);
    }

    #[test]
    fn times_before_the_origin_or_far_ahead_are_slotted() {
        let t0 = Instant::now() + 3600 * 1000 * MS;
        let mut t = Timetable::new(t0, 10 * MS);
        t.insert(entry(Instant::now(), Instant::now(), 1));
        assert_eq!(t.next_wake(), Some(t0));
        assert_eq!(drain(&mut t, t0), vec![1]);
        let far = t0 + Duration::from_secs(100 * 365 * 24 * 3600);
        t.insert(entry(far, far, 2));
        assert!(t.next_wake().is_some_and(|w| w <= far));
        assert_eq!(drain(&mut t, far), vec![2]);
    }

    /// A small xorshift: the model test's choices, reproducible by seed.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    /// Review of a8e0eda, against a model: entries inserted at random
    /// (some before the origin, windows narrower and wider than a slot,
    /// inserted while the scheduler runs, into slots already begun), taken
    /// by a scheduler that wakes at `next_wake` and starts at most a few per
    /// wake-up (the in-flight cap, entries left in their slot). Every entry
    /// comes out exactly once, never before its window opens, and — with
    /// the cap lifted — never after its `at`; `next_wake` never lies in the
    /// future while an entry may start.
    #[test]
    fn a_model_scheduler_starts_every_entry_once_within_its_window() {
        for seed in 1..200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let t0 = Instant::now();
            let origin = t0 + 50 * MS;
            let mut t = Timetable::new(origin, 10 * MS);
            let capped = seed % 2 == 0;
            let mut now = t0;
            let mut expected: Vec<(Instant, Instant, u32)> = Vec::new();
            let mut seen = vec![false; 400];
            let mut next_item = 0u32;
            let insert = |t: &mut Timetable<u32>,
                          rng: &mut Rng,
                          now: Instant,
                          out: &mut Vec<(Instant, Instant, u32)>,
                          next_item: &mut u32| {
                let at = now + MS * rng.below(300) as u32 + Duration::from_micros(rng.below(1000));
                let window = match rng.below(3) {
                    0 => Duration::ZERO,
                    1 => Duration::from_micros(rng.below(10_000)),
                    _ => MS * rng.below(200) as u32,
                };
                let earliest = at.checked_sub(window).unwrap_or(at).max(now);
                // As the scheduler's push does: never more than a slot early.
                let earliest = earliest.max(at.checked_sub(10 * MS).unwrap_or(at));
                t.insert(entry(at, earliest, *next_item));
                out.push((at, earliest, *next_item));
                *next_item += 1;
            };
            for _ in 0..100 {
                insert(&mut t, &mut rng, now, &mut expected, &mut next_item);
            }
            let mut rounds = 0;
            while let Some(wake) = t.next_wake() {
                rounds += 1;
                assert!(rounds < 100_000, "seed {seed}: no progress");
                now = now.max(wake);
                let cap = if capped { 1 + rng.below(4) } else { u64::MAX };
                let mut started = 0;
                while started < cap {
                    let Some(e) = t.pop_startable(now) else { break };
                    let i = e.item as usize;
                    assert!(!seen[i], "seed {seed}: entry {i} started twice");
                    seen[i] = true;
                    assert!(
                        now >= e.earliest,
                        "seed {seed}: entry {i} started before its window"
                    );
                    if !capped {
                        assert!(
                            now <= e.at.max(origin),
                            "seed {seed}: entry {i} started {:?} after its `at`",
                            now - e.at
                        );
                    }
                    started += 1;
                }
                if started < cap {
                    // Nothing more may start now: the next wake-up is later.
                    assert!(
                        t.next_wake().is_none_or(|w| w > now),
                        "seed {seed}: next_wake {:?} is not after {now:?} yet nothing starts",
                        t.next_wake()
                    );
                } else {
                    // A refresh in flight ends a little later.
                    now += Duration::from_micros(rng.below(3000));
                }
                if next_item < 400 && rng.below(3) == 0 {
                    insert(&mut t, &mut rng, now, &mut expected, &mut next_item);
                }
            }
            for (_, _, i) in &expected {
                assert!(seen[*i as usize], "seed {seed}: entry {i} was dropped");
            }
        }
    }
}
