//! What a client remembers per key, bounded: the version of each key's
//! object it last saw or wrote and since when (its observation, the clock a
//! takeover waits on), and the ETag and payload of its last write.
//!
//! Forgetting is always safe: a forgotten observation only restarts (a
//! takeover comes later, never earlier, as for a fresh client), and a
//! forgotten payload costs the next renewal without a payload one GET.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use lease_core::LeaseKey;

use crate::conditional::{self, Observation};

/// How many keys a client remembers. Past this, the least recently used
/// entries are forgotten: forgetting an observation only restarts it (a
/// takeover comes later, never earlier, as for a fresh client), and
/// forgetting a payload costs the next renewal without a payload one GET.
const MAX_KEYS: usize = 4096;

/// How many payload bytes a client keeps for renewals without a payload;
/// past this the least recently used are dropped.
const MAX_CACHED_PAYLOAD: usize = 8 << 20;

/// Per-key state, bounded by [`MAX_KEYS`] and [`MAX_CACHED_PAYLOAD`].
#[derive(Default)]
struct Keys {
    map: HashMap<LeaseKey, KeyState>,
    /// Advances on every use; an entry's `used` says how recently.
    tick: u64,
    payload_bytes: usize,
}

impl Keys {
    fn touch(&mut self, key: &LeaseKey) -> &mut KeyState {
        self.tick = self.tick.wrapping_add(1);
        let tick = self.tick;
        let entry = self.map.entry(key.clone()).or_default();
        entry.used = tick;
        entry
    }

    fn set_written(&mut self, key: &LeaseKey, written: Option<Written>) {
        let add = written.as_ref().map_or(0, |w| w.payload.len());
        let old = std::mem::replace(&mut self.touch(key).written, written);
        let sub = old.map_or(0, |w| w.payload.len());
        self.payload_bytes = self.payload_bytes.saturating_sub(sub).saturating_add(add);
        self.trim();
    }

    fn forget(&mut self, key: &LeaseKey) {
        if let Some(k) = self.map.remove(key) {
            let sub = k.written.map_or(0, |w| w.payload.len());
            self.payload_bytes = self.payload_bytes.saturating_sub(sub);
        }
    }

    /// Forgets the least recently used quarter once over a limit, so the
    /// cost is amortised over many operations.
    fn trim(&mut self) {
        if self.map.len() > MAX_KEYS {
            let mut by_age: Vec<(u64, LeaseKey)> =
                self.map.iter().map(|(k, s)| (s.used, k.clone())).collect();
            by_age.sort_unstable_by_key(|(used, _)| *used);
            let excess = self.map.len() - MAX_KEYS * 3 / 4;
            for (_, k) in by_age.into_iter().take(excess) {
                self.forget(&k);
            }
        }
        if self.payload_bytes > MAX_CACHED_PAYLOAD {
            let mut by_age: Vec<(u64, LeaseKey)> = self
                .map
                .iter()
                .filter(|(_, s)| s.written.is_some())
                .map(|(k, s)| (s.used, k.clone()))
                .collect();
            by_age.sort_unstable_by_key(|(used, _)| *used);
            for (_, k) in by_age {
                if self.payload_bytes <= MAX_CACHED_PAYLOAD * 3 / 4 {
                    break;
                }
                if let Some(s) = self.map.get_mut(&k) {
                    let sub = s.written.take().map_or(0, |w| w.payload.len());
                    self.payload_bytes = self.payload_bytes.saturating_sub(sub);
                }
            }
        }
    }
}

/// What this client knows about one key.
#[derive(Default)]
struct KeyState {
    /// When it was last used (see [`Keys::tick`]).
    used: u64,
    /// The version this client last saw or wrote, and since when: the
    /// per-(client, key) counterpart of a `BucketLeaseWatch`.
    obs: Option<Observation>,
    /// Our last successful write, so a renewal on top of it needs no read
    /// first.
    written: Option<Written>,
}

/// A version of a key's object this client wrote.
struct Written {
    etag: String,
    /// What a renewal that keeps the payload writes again.
    payload: Vec<u8>,
    /// The TTL in that version: a renewal on top of it writes no shorter.
    ttl: Duration,
}

/// The per-key memory one client (and its clones) share.
#[derive(Default)]
pub(crate) struct KeyCache {
    keys: Mutex<Keys>,
}

impl KeyCache {
    fn keys(&self) -> MutexGuard<'_, Keys> {
        // Every update is a single assignment: a panic elsewhere cannot leave
        // an entry half-written, so a poisoned lock is safe to reuse.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The number of keys remembered, and the payload bytes kept.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        let keys = self.keys();
        (keys.map.len(), keys.payload_bytes)
    }

    pub(crate) fn observation(&self, key: &LeaseKey) -> Option<Observation> {
        self.keys().map.get(key).and_then(|k| k.obs.clone())
    }

    /// Folds what one operation observed back into the shared state. Two
    /// observations of the same ETag keep the earlier start (ETags never
    /// repeat, so it was there throughout); a different ETag replaces the old
    /// one, which can only make a takeover later, never earlier.
    pub(crate) fn merge(&self, key: &LeaseKey, obs: Option<Observation>) {
        let Some(new) = obs else { return };
        let mut keys = self.keys();
        conditional::merge(&mut keys.touch(key).obs, new);
        keys.trim();
    }

    /// This client wrote `key`'s object at `etag`, with `payload` and `ttl`.
    pub(crate) fn remember_write(
        &self,
        key: &LeaseKey,
        etag: &str,
        payload: Vec<u8>,
        ttl: Duration,
    ) {
        let written = Written {
            etag: etag.to_owned(),
            payload,
            ttl,
        };
        self.keys().set_written(key, Some(written));
    }

    /// Drops the payload of our last write of `key`: no renewal needs it.
    pub(crate) fn forget_write(&self, key: &LeaseKey) {
        self.keys().set_written(key, None);
    }

    /// Forgets `key` altogether.
    pub(crate) fn forget(&self, key: &LeaseKey) {
        self.keys().forget(key);
    }

    /// The payload and TTL this client wrote at `key`'s object as `etag`,
    /// if that is its last write there and still remembered.
    pub(crate) fn cached_write(&self, key: &LeaseKey, etag: &str) -> Option<(Vec<u8>, Duration)> {
        self.keys()
            .map
            .get(key)
            .and_then(|k| k.written.as_ref())
            .filter(|w| w.etag == etag)
            .map(|w| (w.payload.clone(), w.ttl))
    }
}
