//! The protected resource of the fencing argument: it refuses writes stamped
//! with a fence below the highest it has accepted per key — by default
//! `lease_fence::Fences`, the rule users get, or a [`RealResource`] (an
//! object store, a database) that checks fences itself.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use lease_core::{Fence, Grant};
use lease_fence::Fences;

use super::{History, Op, OpKind, OpOutcome};

/// The future a [`RealResource`] write returns.
pub type WriteFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, String>> + Send + 'a>>;

/// The future [`RealResource::fence`] returns.
pub type FenceFuture<'a> = Pin<Box<dyn Future<Output = Result<Option<Fence>, String>> + Send + 'a>>;

/// A real resource the fault runs write to, which checks fences itself: a
/// `lease_fence::FencedStore` over an object store, `PgFences` in a
/// PostgreSQL transaction, a service behind `CheckFenceLayer`. The run's
/// history checker then judges what *it* accepted.
pub trait RealResource: Send + Sync + fmt::Debug {
    /// Writes on `key` as `holder`, stamped with `fence`: `Ok(true)` when
    /// the resource accepted the write, `Ok(false)` when it refused it as
    /// stale, `Err` when the outcome is unknown (a transport error).
    ///
    /// Called concurrently, from every contender at once: the resource's
    /// own check is all that orders them.
    fn write<'a>(&'a self, key: &'a str, holder: &'a str, fence: Fence) -> WriteFuture<'a>;

    /// The fence the resource now holds for `key` (its last accepted
    /// write's), read from the resource's *data* — not from the check's own
    /// register, whose fence never falls: `Ok(None)` when it holds none or
    /// cannot tell. Read back after every accepted write, it shows a stale
    /// write that landed *after* a newer one although both were answered as
    /// accepted — what a check that is not atomic with the write lets
    /// through, and what the writers' answers alone cannot show. It cannot
    /// show a stale write that a still later newer write covered before the
    /// read: read-backs make such a store likely to be caught in a long
    /// run, not certain.
    fn fence<'a>(&'a self, key: &'a str) -> FenceFuture<'a> {
        let _ = key;
        Box::pin(async { Ok(None) })
    }
}

/// A resource that accepts a write only if its fence is at least the highest
/// fence it has accepted for that key (Kleppmann's fencing token check).
/// Every write, accepted or rejected, is recorded in the [`History`] in the
/// resource's own order, so [`check`](super::check) can replay it.
///
/// [`FencedResource::unfenced`] builds the resource *without* the check, to
/// show what the fence protects against: under paused holders it accepts
/// stale writes, and the checker reports them.
/// [`FencedResource::real`] writes to a [`RealResource`] instead, from
/// every writer at once, so that the resource's own check is the only thing
/// between them (see [`real`](FencedResource::real) for how its writes are
/// recorded).
pub struct FencedResource {
    check: Check,
    history: History,
    /// One write at a time for the in-memory checks: the order of the
    /// history is the resource's.
    turn: tokio::sync::Mutex<()>,
    /// A real resource's writes, held until none is in flight.
    real: Mutex<RealWrites>,
    accepted: AtomicU64,
    rejected: AtomicU64,
    unknown: AtomicU64,
}

impl fmt::Debug for FencedResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let check = match &self.check {
            Check::Fences(_) => "lease_fence::Fences".to_string(),
            Check::None => "none".to_string(),
            Check::Real(r) => format!("{r:?}"),
        };
        f.debug_struct("FencedResource")
            .field("check", &check)
            .field("accepted", &self.accepted())
            .field("rejected", &self.rejected())
            .field("unknown", &self.unknown())
            .finish()
    }
}

enum Check {
    Fences(Fences),
    None,
    Real(Arc<dyn RealResource>),
}

impl FencedResource {
    fn with(history: History, check: Check) -> FencedResource {
        FencedResource {
            check,
            history,
            turn: tokio::sync::Mutex::new(()),
            real: Mutex::default(),
            accepted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
        }
    }

    /// A fenced resource (the in-memory `lease_fence::Fences`) recording
    /// into `history`.
    pub fn new(history: History) -> FencedResource {
        Self::with(history, Check::Fences(Fences::new()))
    }

    /// A resource that ignores fences (accepts every write): the
    /// counter-example for the fencing demo.
    pub fn unfenced(history: History) -> FencedResource {
        Self::with(history, Check::None)
    }

    /// Writes go to `resource`, which checks fences itself, concurrently.
    ///
    /// Concurrent writes answer in an order that need not be the order the
    /// resource applied them, so they are recorded once none is in flight,
    /// in an order consistent with real time (a write whose call ended
    /// before another's began comes first) that puts, among writes whose
    /// calls overlapped, the lower fence first: the order most favourable
    /// to the resource, so a violation the checker finds is one no order
    /// of the resource could explain. A stale write that overlapped the
    /// newer one it landed after is caught by reading the resource's fence
    /// back after each accepted write ([`RealResource::fence`]): a fence
    /// below one accepted by a call that ended before the read began is
    /// recorded as an accepted write at that lower fence, after it.
    pub fn real(history: History, resource: Arc<dyn RealResource>) -> FencedResource {
        Self::with(history, Check::Real(resource))
    }

    /// A write by `grant`'s holder, decided at `checked_at` (when the holder
    /// saw `may_write()` true). Returns whether the resource accepted it.
    pub async fn write(&self, grant: &Grant, checked_at: Instant) -> bool {
        self.write_as(
            grant.holder().as_str(),
            grant.key().as_str(),
            grant.fence(),
            checked_at,
        )
        .await
    }

    /// A write stamped with `fence` by `holder` on `key`. A real resource's
    /// write whose outcome is unknown is counted ([`unknown`](Self::unknown))
    /// but not recorded: the history holds only what the resource decided.
    pub async fn write_as(
        &self,
        holder: &str,
        key: &str,
        fence: Fence,
        checked_at: Instant,
    ) -> bool {
        if let Check::Real(resource) = &self.check {
            return self
                .write_real(resource.as_ref(), holder, key, fence, checked_at)
                .await;
        }
        let _turn = self.turn.lock().await;
        let (accept, seen) = match &self.check {
            Check::Fences(fences) => {
                let seen = fences.seen(key);
                (fences.check(key, fence).is_ok(), seen)
            }
            Check::None | Check::Real(_) => (true, None),
        };
        self.count(accept);
        let mut op = write_op(holder, key, fence, checked_at, Instant::now(), accept);
        if let Some(h) = seen {
            op.detail = format!("highest fence seen before: {h}");
        }
        // Recorded during the write's turn: recording order is its order.
        self.history.push(op);
        accept
    }

    fn count(&self, accept: bool) {
        if accept {
            self.accepted.fetch_add(1, Ordering::Relaxed);
        } else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn write_real(
        &self,
        resource: &dyn RealResource,
        holder: &str,
        key: &str,
        fence: Fence,
        checked_at: Instant,
    ) -> bool {
        let _in_flight = InFlight::start(self);
        let call_start = Instant::now();
        let accept = match resource.write(key, holder, fence).await {
            Ok(accept) => accept,
            Err(e) => {
                self.unknown.fetch_add(1, Ordering::Relaxed);
                eprintln!("lease-conformance: a write to {resource:?} has an unknown outcome: {e}");
                return false;
            }
        };
        let call_end = Instant::now();
        self.count(accept);
        let read_back = if accept {
            let read_start = Instant::now();
            match resource.fence(key).await {
                Ok(Some(now)) => Some((now, read_start)),
                Ok(None) => None,
                Err(e) => {
                    eprintln!("lease-conformance: reading {key} back from {resource:?}: {e}");
                    None
                }
            }
        } else {
            None
        };
        let op = write_op(holder, key, fence, checked_at, call_end, accept);
        self.real
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pending
            .push(RealWrite {
                op,
                call_start,
                call_end,
                read_back,
            });
        accept
    }

    /// The highest fence accepted on `key` (for the in-memory resources;
    /// `None` for a real one, whose state is its own).
    pub fn highest(&self, key: &str) -> Option<Fence> {
        match &self.check {
            Check::Fences(fences) => fences.seen(key),
            Check::None | Check::Real(_) => None,
        }
    }

    /// Writes accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Writes rejected as stale so far.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Writes to a real resource whose outcome is unknown.
    pub fn unknown(&self) -> u64 {
        self.unknown.load(Ordering::Relaxed)
    }
}

fn write_op(
    holder: &str,
    key: &str,
    fence: Fence,
    checked_at: Instant,
    judged: Instant,
    accept: bool,
) -> Op {
    let outcome = if accept {
        OpOutcome::Ok
    } else {
        OpOutcome::Lost
    };
    let mut op = Op::new(OpKind::Write, holder, key, checked_at, judged, outcome);
    op.fence = Some(fence);
    op
}

/// A real resource's writes not yet recorded, and what is needed to judge
/// read-backs against writes already recorded.
#[derive(Default)]
struct RealWrites {
    in_flight: usize,
    pending: Vec<RealWrite>,
    /// Per key: (end of the call, fence) of every accepted write.
    accepted: BTreeMap<String, Vec<(Instant, Fence)>>,
}

struct RealWrite {
    op: Op,
    call_start: Instant,
    call_end: Instant,
    /// The resource's fence read back after an accepted write, and when the
    /// read began.
    read_back: Option<(Fence, Instant)>,
}

/// Counts a real write in flight; the last one to end (or be dropped)
/// records the pending writes.
struct InFlight<'a>(&'a FencedResource);

impl<'a> InFlight<'a> {
    fn start(resource: &'a FencedResource) -> Self {
        let mut real = resource.real.lock().unwrap_or_else(PoisonError::into_inner);
        real.in_flight = real.in_flight.saturating_add(1);
        InFlight(resource)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut real = self.0.real.lock().unwrap_or_else(PoisonError::into_inner);
        real.in_flight = real.in_flight.saturating_sub(1);
        if real.in_flight == 0 {
            real.record(&self.0.history);
        }
    }
}

impl RealWrites {
    /// Records the pending writes (none is in flight), key by key, in the
    /// order most favourable to the resource that real time allows, then
    /// the read-backs that no order explains.
    fn record(&mut self, history: &History) {
        let mut by_key: BTreeMap<String, Vec<RealWrite>> = BTreeMap::new();
        for w in self.pending.drain(..) {
            by_key.entry(w.op.key.clone()).or_default().push(w);
        }
        for (key, mut left) in by_key {
            let done = self.accepted.entry(key).or_default();
            let mut late = Vec::new();
            while !left.is_empty() {
                // The writes no remaining write must precede; of those, the
                // lowest fence.
                let next = (0..left.len())
                    .filter(|&i| !left.iter().any(|o| o.call_end < left[i].call_start))
                    .min_by_key(|&i| (left[i].op.fence, left[i].call_start))
                    .unwrap_or(0);
                let w = left.swap_remove(next);
                if w.op.outcome == OpOutcome::Ok {
                    if let Some(fence) = w.op.fence {
                        done.push((w.call_end, fence));
                    }
                }
                if let Some(seen) = w.read_back {
                    late.push((w.op.key.clone(), seen));
                }
                history.push(w.op);
            }
            for (key, (now, read_start)) in late {
                let before = done
                    .iter()
                    .filter(|(end, _)| *end < read_start)
                    .map(|(_, f)| *f)
                    .max();
                if let Some(higher) = before.filter(|h| now < *h) {
                    let mut op = write_op(
                        "(the resource's own state)",
                        &key,
                        now,
                        read_start,
                        read_start,
                        true,
                    );
                    op.detail = format!(
                        "the resource held fence {now} when read back after a write at fence {higher} had been accepted: a write at {now} was applied after it"
                    );
                    history.push(op);
                }
            }
        }
    }
}
