//! A per-key map of bounded size for hints that save round trips.
//!
//! Everything kept here is a hint: every write it informs is a conditional
//! publish the server checks, so an entry that is missing (evicted) or stale
//! costs at most another round trip, never a wrong grant.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use lease_core::{LeaseKey, Payload};

use crate::record::Slot;

/// Keys of the recent generation before it becomes the old one: the map holds
/// at most twice this many.
pub(crate) const GENERATION: usize = 2048;

/// Two generations of entries: inserts go to the recent one; when it is full
/// it replaces the old one, whose entries are dropped. An entry read from the
/// old generation moves to the recent one, so keys in use stay.
pub(crate) struct Bounded<K, V> {
    recent: HashMap<K, V>,
    old: HashMap<K, V>,
    generation: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> Bounded<K, V> {
    pub(crate) fn new() -> Self {
        Bounded::with_generation(GENERATION)
    }

    pub(crate) fn with_generation(generation: usize) -> Self {
        Bounded {
            recent: HashMap::new(),
            old: HashMap::new(),
            generation: generation.max(1),
        }
    }

    pub(crate) fn get(&mut self, key: &K) -> Option<V> {
        if let Some(v) = self.recent.get(key) {
            return Some(v.clone());
        }
        let v = self.old.remove(key)?;
        self.insert(key.clone(), v.clone());
        Some(v)
    }

    pub(crate) fn insert(&mut self, key: K, value: V) {
        if !self.recent.contains_key(&key) && self.recent.len() >= self.generation {
            self.old = std::mem::take(&mut self.recent);
        }
        self.old.remove(&key);
        self.recent.insert(key, value);
    }

    pub(crate) fn remove(&mut self, key: &K) {
        self.recent.remove(key);
        self.old.remove(key);
    }

    pub(crate) fn len(&self) -> usize {
        self.recent.len() + self.old.len()
    }
}

/// A key's last message as this client last saw it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Seen {
    /// Free: no message (0) or a tombstone/marker at this sequence.
    Free(u64),
    /// A lease record.
    Held,
}

/// The record this client last wrote at a key: the sequence of that
/// message, and the payload and TTL it carries.
#[derive(Clone, Debug)]
pub(crate) struct Written {
    pub(crate) seq: u64,
    pub(crate) payload: Payload,
    /// The TTL in the record (and its `Nats-TTL`): a renewal on top of it
    /// writes no shorter one.
    pub(crate) ttl: Duration,
}

/// The per-key caches of a backend: hints that save round trips, never the
/// truth (every write is conditional).
pub(crate) struct Cache {
    /// The record last written for each key by this client: lets a renew
    /// on top of it go in a single round trip, keeping the stored payload
    /// (when it brings none) and never writing a shorter TTL than the
    /// stored one. A miss costs one read.
    /// Bounded: an evicted entry costs one read.
    written: Mutex<Bounded<LeaseKey, Written>>,
    /// What this client last saw as a key's last message (by a read, a
    /// watch, its own acquire or release): an acquire starts from it, so
    /// taking a released or expired key is one publish, and asking for a
    /// held key one read. Bounded: a missing or wrong entry costs one
    /// more round trip (every write is conditional), never a wrong grant.
    last_seen: Mutex<Bounded<LeaseKey, Seen>>,
}

impl Cache {
    pub(crate) fn new() -> Self {
        Cache {
            written: Mutex::new(Bounded::new()),
            last_seen: Mutex::new(Bounded::new()),
        }
    }

    pub(crate) fn written(&self) -> MutexGuard<'_, Bounded<LeaseKey, Written>> {
        // Every update is a single insert or remove: a poisoned map is whole.
        self.written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn last_seen(&self) -> MutexGuard<'_, Bounded<LeaseKey, Seen>> {
        // As for `written`: single inserts and removes only.
        self.last_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keys held in both maps.
    pub(crate) fn len(&self) -> usize {
        self.written().len() + self.last_seen().len()
    }

    pub(crate) fn saw(&self, key: &LeaseKey, seen: Seen) {
        self.last_seen().insert(key.clone(), seen);
    }

    /// Records what the key's last message was, as a hint for the next acquire.
    pub(crate) fn note_slot(&self, key: &LeaseKey, slot: &Slot) {
        match slot {
            Slot::Tombstone { seq } => self.saw(key, Seen::Free(*seq)),
            Slot::Empty => self.saw(key, Seen::Free(0)),
            Slot::Live { .. } => self.saw(key, Seen::Held),
        }
    }

    /// This client wrote `payload` with `ttl` at `key`, as message `seq`.
    pub(crate) fn remember(&self, key: &LeaseKey, seq: u64, payload: Payload, ttl: Duration) {
        self.written()
            .insert(key.clone(), Written { seq, payload, ttl });
    }

    /// The record this client wrote at `key` as message `seq`, if it is
    /// the last it wrote there and still remembered.
    pub(crate) fn written_at(&self, key: &LeaseKey, seq: u64) -> Option<Written> {
        self.written().get(key).filter(|w| w.seq == seq)
    }

    pub(crate) fn forget(&self, key: &LeaseKey) {
        self.written().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_bounded_and_keeps_keys_in_use() {
        let mut m = Bounded::with_generation(4);
        for i in 0..1000u32 {
            m.insert(i, i);
            // Key 0 is used all the time: it must stay.
            assert_eq!(m.get(&0), Some(0), "at {i}");
            assert!(m.len() <= 8, "{} entries at {i}", m.len());
        }
        assert_eq!(m.get(&999), Some(999));
        assert_eq!(m.get(&1), None);
        m.remove(&0);
        assert_eq!(m.get(&0), None);
    }

    #[test]
    fn an_update_replaces_in_either_generation() {
        let mut m = Bounded::with_generation(2);
        m.insert("a", 1);
        m.insert("b", 2);
        m.insert("c", 3); // "a" and "b" are old now
        m.insert("a", 10);
        assert_eq!(m.get(&"a"), Some(10));
        assert_eq!(m.len(), 3);
    }
}
