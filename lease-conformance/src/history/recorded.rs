//! [`RecordingBackend`]: a client whose every call lands in a [`History`],
//! for holders the test does not drive call by call (a keeper, an election).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, Error, Grant, LeaseBackend, LeaseKey, LeaseLayer,
    LeaseState, Payload, Renewal,
};

use super::{errored, granted, History, Op, OpKind, OpOutcome};

/// Wraps a client and records every acquire, renew, release and read in a
/// [`History`], as the history's own helpers do: the instants around the
/// call, the outcome, the fences. A call that takes longer than `timeout`
/// is dropped and recorded as unknown; so is a call its caller drops before
/// the answer (a keeper's own deadline), since it may have been applied.
/// Watches, breaks and capabilities pass through unrecorded.
pub struct RecordingBackend {
    inner: Arc<dyn LeaseBackend>,
    history: History,
    timeout: Duration,
}

impl RecordingBackend {
    /// Records `inner`'s calls in `history`; calls unanswered after
    /// `timeout` count as unknown outcome.
    pub fn new(inner: Arc<dyn LeaseBackend>, history: History, timeout: Duration) -> Self {
        RecordingBackend {
            inner,
            history,
            timeout,
        }
    }

    async fn timed<T>(&self, call: BoxFuture<'_, Result<T, Error>>) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(Error::Unavailable {
                detail: format!(
                    "no answer within {:?} (request dropped in flight)",
                    self.timeout
                ),
                source: None,
            }),
        }
    }
}

impl fmt::Debug for RecordingBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingBackend")
            .field("history", &self.history)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// An operation under way: recorded as unknown if its future is dropped
/// before the answer is classified.
struct Pending<'a> {
    history: &'a History,
    op: Option<Op>,
}

impl<'a> Pending<'a> {
    fn new(history: &'a History, op: Op) -> Self {
        Pending {
            history,
            op: Some(op),
        }
    }

    /// Records the answer, classified by `f` (given the op with its
    /// completion instant set).
    fn finish(mut self, f: impl FnOnce(Op) -> Op) {
        if let Some(mut op) = self.op.take() {
            op.completed = Instant::now();
            self.history.push(f(op));
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(mut op) = self.op.take() {
            op.completed = Instant::now();
            op.outcome = OpOutcome::Unknown;
            op.detail = "dropped by its caller before the answer".into();
            op.dropped = true;
            self.history.push(op);
        }
    }
}

fn start(kind: OpKind, holder: String, key: String) -> Op {
    let now = Instant::now();
    Op::new(kind, holder, key, now, now, OpOutcome::Ok)
}

impl LeaseLayer for RecordingBackend {
    fn inner(&self) -> &dyn LeaseBackend {
        &*self.inner
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            let op = start(OpKind::Acquire, req.holder.to_string(), req.key.to_string());
            let pending = Pending::new(&self.history, op);
            let r = self.timed(self.inner.try_acquire(req)).await;
            pending.finish(|op| match &r {
                Ok(Acquire::Granted(g)) => granted(op, g),
                Ok(Acquire::Held(h)) => Op {
                    outcome: OpOutcome::Refused,
                    observed: Some((h.holder.to_string(), h.fence)),
                    ..op
                },
                Err(e) => errored(op, e),
            });
            r
        })
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let op = Op {
                fence: Some(grant.fence()),
                ..start(
                    OpKind::Renew,
                    grant.holder().to_string(),
                    grant.key().to_string(),
                )
            };
            let pending = Pending::new(&self.history, op);
            let r = self.timed(self.inner.renew(grant, payload)).await;
            pending.finish(|op| match &r {
                Ok(Renewal::Renewed(g)) => granted(op, g),
                Ok(Renewal::Lost) => Op {
                    outcome: OpOutcome::Lost,
                    ..op
                },
                Err(e) => errored(op, e),
            });
            r
        })
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let op = Op {
                fence: Some(grant.fence()),
                ..start(
                    OpKind::Release,
                    grant.holder().to_string(),
                    grant.key().to_string(),
                )
            };
            let pending = Pending::new(&self.history, op);
            let r = self.timed(self.inner.release(grant)).await;
            pending.finish(|op| match &r {
                Ok(()) => op,
                Err(e) => errored(op, e),
            });
            r
        })
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(async move {
            // Reads change nothing: one dropped in flight is not recorded.
            let invoked = Instant::now();
            let r = self.timed(self.inner.read(key)).await;
            let op = Op::new(
                OpKind::Read,
                "reader",
                key.to_string(),
                invoked,
                Instant::now(),
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
            self.history.push(op);
            r
        })
    }
}
