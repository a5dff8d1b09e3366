//! [`KeyTurns`]: one acquire at a time per key, among the acquires of one
//! owner (a [`LeaseGroup`](crate::LeaseGroup)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lease_core::LeaseKey;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Lets the acquires of one key take turns, while acquires of different keys
/// run at once. Entries live only while someone holds or waits for a turn.
#[derive(Default)]
pub(crate) struct KeyTurns {
    keys: Mutex<HashMap<LeaseKey, Arc<AsyncMutex<()>>>>,
}

/// A turn at a key, from [`KeyTurns::take`]; the next waiter's turn starts
/// when it is dropped.
pub(crate) struct Turn<'a> {
    turns: &'a KeyTurns,
    key: LeaseKey,
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyTurns {
    /// Waits for `key`'s turn.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped wait leaves no turn taken.
    pub(crate) async fn take(&self, key: &LeaseKey) -> Turn<'_> {
        let lock = {
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.entry(key.clone()).or_default().clone()
        };
        let mut turn = Turn {
            turns: self,
            key: key.clone(),
            guard: None,
        };
        turn.guard = Some(lock.lock_owned().await);
        turn
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut keys = self.turns.keys.lock().unwrap_or_else(|p| p.into_inner());
        self.guard = None;
        // The map's reference is the last one: nobody holds or waits.
        if keys.get(&self.key).is_some_and(|l| Arc::strong_count(l) == 1) {
            keys.remove(&self.key);
        }
    }
}
