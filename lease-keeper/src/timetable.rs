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
    /// Entries by the slot their `at` falls in.
    slots: BTreeMap<u64, Vec<Entry<T>>>,
    /// Entries that may not start when their slot begins, by the instant
    /// they may (numbered: two may share one).
    waiting: BTreeMap<(Instant, u64), Entry<T>>,
    numbered: u64,
}

impl<T> Timetable<T> {
    /// Slots of `slot` each, counted from `origin`.
    pub(crate) fn new(origin: Instant, slot: Duration) -> Self {
        Timetable {
            grid: Grid {
                origin,
                slot_nanos: slot.as_nanos().max(1),
            },
            slots: BTreeMap::new(),
            waiting: BTreeMap::new(),
            numbered: 0,
        }
    }

    pub(crate) fn insert(&mut self, entry: Entry<T>) {
        let slot = self.grid.slot_of(entry.at);
        self.slots.entry(slot).or_default().push(entry);
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
            let Some(entry) = first.get_mut().pop() else {
                first.remove();
                continue;
            };
            if first.get().is_empty() {
                first.remove();
            }
            if entry.earliest > now {
                self.numbered = self.numbered.wrapping_add(1);
                self.waiting.insert((entry.earliest, self.numbered), entry);
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
}
