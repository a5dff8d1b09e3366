//! Per-key maps for hints that save round trips.
//!
//! Everything kept here is a hint: every write it informs is a conditional
//! publish the server checks, so an entry that is missing (evicted) or stale
//! costs at most another round trip, never a wrong grant.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

    pub(crate) fn len(&self) -> usize {
        self.recent.len() + self.old.len()
    }
}

/// Entries that are of use only until an instant of their own: each is kept
/// until then however many there are, so a client renewing any number of
/// keys finds every one of them, and dropped after it, so keys written once
/// and abandoned do not pile up. Expired entries are swept when the map has
/// doubled since the last sweep: amortised O(1) per insert, and never more
/// than twice the entries still of use (or `floor`).
pub(crate) struct Expiring<K, V> {
    map: HashMap<K, (Instant, V)>,
    sweep_at: usize,
    floor: usize,
}

impl<K: Eq + Hash, V: Clone> Expiring<K, V> {
    pub(crate) fn new(floor: usize) -> Self {
        Expiring {
            map: HashMap::new(),
            sweep_at: floor,
            floor,
        }
    }

    /// The entry for `key`, expired or not: a stale hint is still a hint.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        self.map.get(key).map(|(_, v)| v.clone())
    }

    pub(crate) fn insert(&mut self, key: K, value: V, until: Instant) {
        if self.map.len() >= self.sweep_at {
            let now = Instant::now();
            self.map.retain(|_, (until, _)| *until > now);
            self.sweep_at = self.map.len().saturating_mul(2).max(self.floor);
        }
        self.map.insert(key, (until, value));
    }

    pub(crate) fn remove(&mut self, key: &K) {
        self.map.remove(key);
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
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
    /// stored one. A miss costs one read. Kept until the record's TTL has
    /// passed since it was written (a renewal after that finds the key
    /// expired anyway), so every key this client keeps renewing stays,
    /// however many, and a key abandoned without a release goes.
    written: Mutex<Expiring<LeaseKey, Written>>,
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
            written: Mutex::new(Expiring::new(GENERATION)),
            last_seen: Mutex::new(Bounded::new()),
        }
    }

    pub(crate) fn written(&self) -> MutexGuard<'_, Expiring<LeaseKey, Written>> {
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
        let until = Instant::now().checked_add(ttl);
        let entry = Written { seq, payload, ttl };
        let mut written = self.written();
        match until {
            Some(until) => written.insert(key.clone(), entry, until),
            // A TTL past the clock's range: nothing to keep it for.
            None => written.remove(key),
        }
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
    }

    #[test]
    fn expiring_keeps_every_live_entry_and_sweeps_expired_ones() {
        let mut m = Expiring::new(4);
        let later = Instant::now() + Duration::from_secs(3600);
        for i in 0..1000u32 {
            m.insert(i, i, later);
        }
        // Live entries are never dropped, however many.
        assert_eq!(m.len(), 1000);
        assert!((0..1000).all(|i| m.get(&i) == Some(i)));
        let past = Instant::now();
        for i in 1000..3000u32 {
            m.insert(i, i, past);
        }
        // Expired ones are swept once the map doubles: at most twice the
        // live entries remain, and the live ones are all still there.
        assert!(m.len() <= 2 * 1000 + 1, "{} entries", m.len());
        assert!((0..1000).all(|i| m.get(&i) == Some(i)));
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
