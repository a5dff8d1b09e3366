//! The protected resource of the fencing argument: it remembers the highest
//! fence it has seen per key and rejects writes stamped with a lower one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use lease_core::{Fence, Grant};

use super::{History, Op, OpKind, OpOutcome};

/// A resource that accepts a write only if its fence is at least the highest
/// fence it has seen for that key (Kleppmann's fencing token check). Every
/// write, accepted or rejected, is recorded in the [`History`] in the
/// resource's own order, so [`check`](super::check) can replay it.
///
/// [`FencedResource::unfenced`] builds the resource *without* the check, to
/// show what the fence protects against: under paused holders it accepts
/// stale writes, and the checker reports them.
pub struct FencedResource {
    highest: Mutex<HashMap<String, Fence>>,
    history: History,
    fenced: bool,
    accepted: AtomicU64,
    rejected: AtomicU64,
}

impl FencedResource {
    /// A fenced resource recording into `history`.
    pub fn new(history: History) -> FencedResource {
        FencedResource {
            highest: Mutex::new(HashMap::new()),
            history,
            fenced: true,
            accepted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    /// A resource that ignores fences (accepts every write): the
    /// counter-example for the fencing demo.
    pub fn unfenced(history: History) -> FencedResource {
        FencedResource {
            fenced: false,
            ..FencedResource::new(history)
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Fence>> {
        self.highest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A write by `grant`'s holder, decided at `checked_at` (when the holder
    /// saw `may_write()` true). Returns whether the resource accepted it.
    pub fn write(&self, grant: &Grant, checked_at: Instant) -> bool {
        self.write_as(
            grant.holder().as_str(),
            grant.key().as_str(),
            grant.fence(),
            checked_at,
        )
    }

    /// A write stamped with `fence` by `holder` on `key`.
    pub fn write_as(&self, holder: &str, key: &str, fence: Fence, checked_at: Instant) -> bool {
        let mut highest = self.lock();
        let seen = highest.get(key).copied();
        let accept = !self.fenced || seen.is_none_or(|h| fence >= h);
        if accept {
            let h = highest.entry(key.to_string()).or_insert(fence);
            *h = (*h).max(fence);
            self.accepted.fetch_add(1, Ordering::Relaxed);
        } else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        let mut op = Op::new(
            OpKind::Write,
            holder,
            key,
            checked_at,
            Instant::now(),
            if accept {
                OpOutcome::Ok
            } else {
                OpOutcome::Lost
            },
        );
        op.fence = Some(fence);
        if let Some(h) = seen {
            op.detail = format!("highest fence seen before: {h}");
        }
        // Recorded under the resource's lock: recording order is its order.
        self.history.push(op);
        accept
    }

    /// The highest fence accepted on `key`.
    pub fn highest(&self, key: &str) -> Option<Fence> {
        self.lock().get(key).copied()
    }

    /// Writes accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Writes rejected as stale so far.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}
