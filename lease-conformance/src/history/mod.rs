//! Recorded histories of lease operations, and the checker that judges them.
//!
//! A [`History`] records every operation a test makes — acquire, renew,
//! release, read, and the writes holders make to a protected resource —
//! with its invocation and completion instants (local monotonic clock), the
//! holder, the key, the outcome (ok / refused / lost / unknown / failed) and
//! the fences involved. [`check`] then judges the whole history:
//!
//! 1. **Exclusion**: no two grants' *write windows* on a key overlap, and no
//!    observation made entirely inside one grant's window shows another grant
//!    (or a free key). A grant's window runs from the instant its holder
//!    learned of it (the answer) to its deadline (`sent_at + fraction × TTL`,
//!    extended by every successful renewal, cut at the holder's release or
//!    at a renewal answered `Lost`; a grant answered after its deadline opens
//!    no window, nor does a renewal answered after its holder began to
//!    release the grant — one a keeper had in flight when it resigned —
//!    nor an acquire that hands back a grant whose release had an unknown
//!    outcome: that release may still land and free the key at any time).
//!    The grant's validity starts at `sent_at`; the holder cannot write before
//!    the answer, so the window the check uses starts there. A renewal
//!    answered after the window had ended leaves a *gap* (deadline to
//!    answer) where the holder could not write: a key seen free there is no
//!    early expiry (a renewal that reached the server late may revive a grant
//!    nobody took meanwhile); every other check spans the gap. Where the
//!    backend's clock jumps forward past the deadline slack, overlaps are
//!    counted instead of failed — but never two grants under one holder
//!    name, except the shared phases', which all share one.
//! 2. **Fencing**: fences never go backwards — an operation invoked after
//!    another completed never observes a lower fence on the same key — and a
//!    fence names one holder only.
//! 3. **Unknown outcomes**: an operation whose outcome is unknown counts as
//!    both applied and not applied (the rule of etcd's robustness tests). A
//!    grant observed that nobody was told of must be explained by an earlier
//!    acquire of that holder with unknown outcome; the retry of such an
//!    acquire gets the same fence or a refusal by *another* holder, and never
//!    a second live grant beside the first.
//! 4. **Fenced resource**: a [`FencedResource`] rejects writes whose fence is
//!    lower than the highest it has seen; the checker replays its log and
//!    fails on any accepted stale write.
//! 5. **Leaders' work** (recorded by election holders): no two leaders' work
//!    on a key overlaps, and no work runs past its grant's write window
//!    (plus a scheduling slack, [`CheckOptions::work_slack`]) or without one.
//!    A [`RecordingBackend`] records the calls of holders the test does not
//!    drive itself (a keeper campaigning in an election).
//!
//! Hand-made histories (see `tests/suite/history_meta.rs`) prove each check fails
//! on the violation it names.

mod check;
mod recorded;
mod resource;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, Error, Fence, Grant, LeaseBackend, LeaseKey, LeaseState, Renewal,
};

pub use check::{
    check, flagged_ops, CheckOptions, CheckReport, Violation, ViolationKind, WORK_SLACK_SHARE,
};
pub use recorded::RecordingBackend;
pub use resource::{FenceFuture, FencedResource, RealResource, WriteFuture};

/// What an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum OpKind {
    /// `try_acquire`.
    Acquire,
    /// `renew`.
    Renew,
    /// `release`.
    Release,
    /// `read`.
    Read,
    /// A write to the protected resource, stamped with the holder's fence.
    Write,
    /// Work a leader ran while leading (`Leadership::run`), from its start
    /// to the instant it returned or was dropped.
    Work,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Acquire => "acquire",
            OpKind::Renew => "renew",
            OpKind::Release => "release",
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Work => "work",
        })
    }
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpOutcome {
    /// Applied and answered: granted, renewed, released, read; a write the
    /// resource accepted.
    Ok,
    /// An acquire refused because another grant is live (`Acquire::Held`).
    Refused,
    /// A renew answered `Lost`; a write the resource rejected as stale.
    Lost,
    /// The outcome is unknown (`Error::Unavailable`, or a timeout that
    /// dropped the request in flight): it counts as applied *and* not applied.
    Unknown,
    /// A known failure that changed nothing (bad input, corrupt record…).
    Failed,
}

impl fmt::Display for OpOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpOutcome::Ok => "ok",
            OpOutcome::Refused => "refused",
            OpOutcome::Lost => "lost",
            OpOutcome::Unknown => "unknown",
            OpOutcome::Failed => "failed",
        })
    }
}

/// One recorded operation.
///
/// Field use by kind:
/// * acquire `Ok`, renew `Ok`: `fence`, `sent_at`, `deadline` of the grant
///   returned;
/// * acquire `Refused`, read `Ok`: `observed` is the holder and fence seen
///   (`None` for a free key on a read);
/// * renew `Lost`/`Unknown`, release: `fence` of the grant acted on;
/// * write: `fence` stamped on the write, `invoked` the instant the writer
///   checked `may_write()`, `completed` the instant the resource judged it;
/// * work: `fence` of the leadership it ran under, `invoked` its start,
///   `completed` the instant it returned or was dropped.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    /// Recording order (for writes: the resource's own order).
    pub seq: u64,
    /// The holder (client) that made the call.
    pub holder: String,
    /// The key.
    pub key: String,
    /// What it did.
    pub kind: OpKind,
    /// When the caller started it.
    pub invoked: Instant,
    /// When the caller saw the answer (or gave up).
    pub completed: Instant,
    /// How it ended.
    pub outcome: OpOutcome,
    /// The fence of the grant returned or acted on.
    pub fence: Option<Fence>,
    /// The returned grant's send instant.
    pub sent_at: Option<Instant>,
    /// The returned grant's write deadline.
    pub deadline: Option<Instant>,
    /// What a refusal or a read saw: `(holder, fence)`, `None` when free.
    pub observed: Option<(String, Fence)>,
    /// Free text (error messages).
    pub detail: String,
    /// The caller dropped the call before its answer (a keeper's own
    /// deadline, a resign): its outcome is unknown, as `outcome` says, but
    /// no backend error made it so.
    pub dropped: bool,
}

impl Op {
    /// An operation with nothing but its identity, interval and outcome;
    /// the builder methods below fill the rest.
    pub fn new(
        kind: OpKind,
        holder: impl Into<String>,
        key: impl Into<String>,
        invoked: Instant,
        completed: Instant,
        outcome: OpOutcome,
    ) -> Op {
        Op {
            seq: 0,
            holder: holder.into(),
            key: key.into(),
            kind,
            invoked,
            completed,
            outcome,
            fence: None,
            sent_at: None,
            deadline: None,
            observed: None,
            detail: String::new(),
            dropped: false,
        }
    }

    /// Sets the fence.
    pub fn fence(mut self, fence: u64) -> Op {
        self.fence = Some(Fence(fence));
        self
    }

    /// Sets the returned grant's send instant and deadline.
    pub fn window(mut self, sent_at: Instant, deadline: Instant) -> Op {
        self.sent_at = Some(sent_at);
        self.deadline = Some(deadline);
        self
    }

    /// Sets what a refusal or read observed.
    pub fn observed(mut self, holder: impl Into<String>, fence: u64) -> Op {
        self.observed = Some((holder.into(), Fence(fence)));
        self
    }

    /// Sets the detail text.
    pub fn detail(mut self, detail: impl Into<String>) -> Op {
        self.detail = detail.into();
        self
    }

    /// The fence this operation saw live on the backend, if it saw one:
    /// a granted acquire's or a successful renew's own fence, or the holder
    /// a refusal or read observed.
    pub fn fence_seen(&self) -> Option<(&str, Fence)> {
        match (self.kind, self.outcome) {
            (OpKind::Acquire | OpKind::Renew, OpOutcome::Ok) => {
                self.fence.map(|f| (self.holder.as_str(), f))
            }
            (OpKind::Acquire, OpOutcome::Refused) | (OpKind::Read, OpOutcome::Ok) => {
                self.observed.as_ref().map(|(h, f)| (h.as_str(), *f))
            }
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} {} {} by {} on {:?}",
            self.seq, self.kind, self.outcome, self.holder, self.key
        )?;
        if let Some(fence) = self.fence {
            write!(f, " fence {fence}")?;
        }
        if let Some((h, fence)) = &self.observed {
            write!(f, " (saw {h} with fence {fence})")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// Records operations from many tasks; clones share one history.
///
/// The recording helpers ([`acquire`](History::acquire), [`renew`](History::renew),
/// …) call the backend, take the instants around the call and classify the
/// answer; a call that does not finish within `timeout` is dropped and
/// recorded as [`OpOutcome::Unknown`].
#[derive(Clone)]
pub struct History {
    inner: Arc<Mutex<Vec<Op>>>,
    origin: Instant,
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops = self.inner.lock().map(|ops| ops.len()).unwrap_or_default();
        f.debug_struct("History").field("ops", &ops).finish()
    }
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History {
            inner: Arc::new(Mutex::new(Vec::new())),
            origin: Instant::now(),
        }
    }

    /// The instant the history was created (reports show times relative to it).
    pub fn origin(&self) -> Instant {
        self.origin
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Op>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `op`, numbering it.
    pub fn push(&self, mut op: Op) {
        let mut ops = self.lock();
        op.seq = ops.len() as u64;
        ops.push(op);
    }

    /// A copy of every operation so far, in recording order.
    pub fn ops(&self) -> Vec<Op> {
        self.lock().clone()
    }

    /// How many operations of each kind ended how.
    pub fn counts(&self) -> BTreeMap<(OpKind, OpOutcome), usize> {
        let mut m = BTreeMap::new();
        for op in self.lock().iter() {
            *m.entry((op.kind, op.outcome)).or_insert(0) += 1;
        }
        m
    }

    /// Runs `call` with a timeout; `None` when it timed out.
    async fn timed<T>(
        timeout: Duration,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(Error::Unavailable {
                detail: format!("no answer within {timeout:?} (request dropped in flight)"),
                source: None,
            }),
        }
    }

    /// `try_acquire`, recorded.
    pub async fn acquire(
        &self,
        backend: &dyn LeaseBackend,
        req: AcquireRequest,
        timeout: Duration,
    ) -> Result<Acquire, Error> {
        let holder = req.holder.to_string();
        let key = req.key.to_string();
        let invoked = Instant::now();
        let r = Self::timed(timeout, backend.try_acquire(req)).await;
        let completed = Instant::now();
        let op = Op::new(
            OpKind::Acquire,
            holder,
            key,
            invoked,
            completed,
            OpOutcome::Ok,
        );
        let op = match &r {
            Ok(Acquire::Granted(g)) => granted(op, g),
            Ok(Acquire::Held(h)) => Op {
                outcome: OpOutcome::Refused,
                observed: Some((h.holder.to_string(), h.fence)),
                ..op
            },
            Err(e) => errored(op, e),
        };
        self.push(op);
        r
    }

    /// `renew`, recorded.
    pub async fn renew(
        &self,
        backend: &dyn LeaseBackend,
        grant: &Grant,
        timeout: Duration,
    ) -> Result<Renewal, Error> {
        let invoked = Instant::now();
        let r = Self::timed(timeout, backend.renew(grant, None)).await;
        let completed = Instant::now();
        let op = Op::new(
            OpKind::Renew,
            grant.holder().to_string(),
            grant.key().to_string(),
            invoked,
            completed,
            OpOutcome::Ok,
        );
        let op = Op {
            fence: Some(grant.fence()),
            ..op
        };
        let op = match &r {
            Ok(Renewal::Renewed(g)) => granted(op, g),
            Ok(Renewal::Lost) => Op {
                outcome: OpOutcome::Lost,
                ..op
            },
            Err(e) => errored(op, e),
        };
        self.push(op);
        r
    }

    /// `release`, recorded.
    pub async fn release(
        &self,
        backend: &dyn LeaseBackend,
        grant: &Grant,
        timeout: Duration,
    ) -> Result<(), Error> {
        let invoked = Instant::now();
        let r = Self::timed(timeout, backend.release(grant)).await;
        let completed = Instant::now();
        let op = Op::new(
            OpKind::Release,
            grant.holder().to_string(),
            grant.key().to_string(),
            invoked,
            completed,
            OpOutcome::Ok,
        );
        let op = Op {
            fence: Some(grant.fence()),
            ..op
        };
        let op = match &r {
            Ok(()) => op,
            Err(e) => errored(op, e),
        };
        self.push(op);
        r
    }

    /// `read` by `observer`, recorded.
    pub async fn read(
        &self,
        backend: &dyn LeaseBackend,
        observer: &str,
        key: &LeaseKey,
        timeout: Duration,
    ) -> Result<LeaseState, Error> {
        let invoked = Instant::now();
        let r = Self::timed(timeout, backend.read(key)).await;
        let completed = Instant::now();
        let op = Op::new(
            OpKind::Read,
            observer,
            key.to_string(),
            invoked,
            completed,
            OpOutcome::Ok,
        );
        let op = match &r {
            Ok(LeaseState::Held(h)) => Op {
                observed: Some((h.holder.to_string(), h.fence)),
                ..op
            },
            Ok(LeaseState::Free) => op,
            Err(e) => errored(op, e),
        };
        self.push(op);
        r
    }

    /// Number of recorded operations.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

fn granted(op: Op, g: &Grant) -> Op {
    Op {
        outcome: OpOutcome::Ok,
        fence: Some(g.fence()),
        sent_at: Some(g.sent_at()),
        deadline: Some(g.deadline()),
        ..op
    }
}

fn errored(op: Op, e: &Error) -> Op {
    Op {
        outcome: if e.is_unknown_outcome() {
            OpOutcome::Unknown
        } else {
            OpOutcome::Failed
        },
        detail: e.to_string(),
        ..op
    }
}
