//! The protected resource of the fencing argument: it refuses writes stamped
//! with a fence below the highest it has accepted per key — by default
//! `lease_fence::Fences`, the rule users get, or a [`RealResource`] (an
//! object store, a database) that checks fences itself.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lease_core::{Fence, Grant};
use lease_fence::Fences;

use super::{History, Op, OpKind, OpOutcome};

/// The future a [`RealResource`] write returns.
pub type WriteFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, String>> + Send + 'a>>;

/// A real resource the fault runs write to, which checks fences itself: a
/// `lease_fence::FencedStore` over an object store, `PgFences` in a
/// PostgreSQL transaction, a service behind `CheckFenceLayer`. The run's
/// history checker then judges what *it* accepted.
pub trait RealResource: Send + Sync + fmt::Debug {
    /// Writes on `key` as `holder`, stamped with `fence`: `Ok(true)` when
    /// the resource accepted the write, `Ok(false)` when it refused it as
    /// stale, `Err` when the outcome is unknown (a transport error).
    fn write<'a>(&'a self, key: &'a str, holder: &'a str, fence: Fence) -> WriteFuture<'a>;
}

/// A resource that accepts a write only if its fence is at least the highest
/// fence it has accepted for that key (Kleppmann's fencing token check).
/// Every write, accepted or rejected, is recorded in the [`History`] in the
/// resource's own order, so [`check`](super::check) can replay it.
///
/// [`FencedResource::unfenced`] builds the resource *without* the check, to
/// show what the fence protects against: under paused holders it accepts
/// stale writes, and the checker reports them.
/// [`FencedResource::real`] writes to a [`RealResource`] instead, one write
/// at a time so that the recorded order is the resource's.
pub struct FencedResource {
    check: Check,
    history: History,
    /// One write at a time: the order of the history is the resource's.
    turn: tokio::sync::Mutex<()>,
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

    /// Writes go to `resource`, which checks fences itself.
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
        let _turn = self.turn.lock().await;
        let (accept, seen) = match &self.check {
            Check::Fences(fences) => {
                let seen = fences.seen(key);
                (fences.check(key, fence).is_ok(), seen)
            }
            Check::None => (true, None),
            Check::Real(resource) => {
                match resource.write(key, holder, fence).await {
                    Ok(accept) => (accept, None),
                    Err(e) => {
                        self.unknown.fetch_add(1, Ordering::Relaxed);
                        eprintln!("lease-conformance: a write to {resource:?} has an unknown outcome: {e}");
                        return false;
                    }
                }
            }
        };
        if accept {
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
        // Recorded during the write's turn: recording order is its order.
        self.history.push(op);
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
