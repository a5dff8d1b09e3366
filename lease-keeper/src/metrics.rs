//! Metrics through the [`metrics`](https://docs.rs/metrics) facade, with the
//! `metrics` feature (off by default).
//!
//! With the feature on, an [`InstrumentedBackend`](crate::InstrumentedBackend)
//! reports every operation of the backend it wraps, and the keeper reports
//! what it sees over a lease's life, to whatever recorder the application
//! installed (Prometheus, StatsD, OpenTelemetry…: any `metrics` exporter).
//! Without a recorder installed, or without the feature, nothing is recorded
//! and nothing is paid for.
//!
//! | name | type | unit | labels | what |
//! | --- | --- | --- | --- | --- |
//! | `lease_backend_operations_total` | counter | operations | `backend`, `op`, `outcome` | every backend operation, counted once when it ends |
//! | `lease_backend_operation_duration_seconds` | histogram | seconds | `backend`, `op`, `outcome` | from the call to the answer (or to the drop of an unfinished call) |
//! | `lease_renew_deadline_remaining_seconds` | histogram | seconds | `backend` | at each successful renewal: how long until the renewed grant's write deadline, 0 if it already passed |
//! | `lease_held` | gauge | leases | `backend`, `key` | leases this process holds on the key through the wrapped backend (0 or 1 per backend: at most one grant of a key is live) |
//! | `lease_acquire_wait_seconds` | histogram | seconds | `backend`, `outcome` | how long a keeper's acquire waited, from its start to its answer |
//! | `lease_losses_total` | counter | losses | `backend`, `reason` | leases a keeper stopped holding for any reason but their holder's release |
//! | `lease_hold_seconds` | histogram | seconds | `backend`, `reason` | how long a keeper held a lease, from the grant to the end, by how it ended |
//!
//! The labels take these values:
//!
//! * `backend`: the name of the backend, as the
//!   [`InstrumentedBackend`](crate::InstrumentedBackend) was
//!   [labelled](crate::InstrumentedBackend::with_label) (for the backend
//!   metrics) and the [`Keeper`](crate::Keeper) was
//!   [labelled](crate::Keeper::with_backend_label) (for the keeper's):
//!   `etcd`, `nats`, `mongodb`… as [`lease::connect`](https://docs.rs/lease)
//!   names them, or [`UNNAMED`] where nothing named it.
//! * `op`: `acquire`, `renew`, `release`, `read`, `watch`, `break`,
//!   `last_break`.
//! * `outcome` of an operation: `granted` or `held` (acquire), `renewed` or
//!   `lost` (renew), `released` (release), `free` or `held` (read),
//!   `changed` (watch), `broken` (break), `found` or `none` (last_break);
//!   for every operation `cancelled` when its future was dropped before it
//!   answered, and the kind of error when it failed: `unavailable`,
//!   `unsupported`, `invalid_key`, `invalid_holder`, `invalid_ttl`,
//!   `invalid_timing`, `payload_too_large`, `corrupt_record`,
//!   `preconditions_ignored`, `backend`, or `error` for any other.
//! * `outcome` of an acquire wait: `granted`, `held` (refused at once by an
//!   acquire that does not wait), `timed_out`, `error` (the backend refused
//!   the request), `abandoned` (the lease's group was abandoned).
//! * `reason`: `taken_over`, `expired`, `broken`, `deadline_passed`,
//!   `abandoned`, and for the hold time also `released`.
//! * `key`: the lease key as it was given.
//!
//! The attempts of an operation are the sum of its counter over every
//! `outcome`; its failures, the sum over the error kinds.
//!
//! Time left to the deadline is the margin a holder keeps: it shrinks as
//! renewals get slower, and a renewal that answers with nothing left is
//! worth nothing (the holder may already have stopped writing). Watch it
//! before a lease is lost to it.
//!
//! # The held-leases gauge
//!
//! A lease counts as held from a granted acquire (a repeated acquire of the
//! same grant counts once) until it is released, a renewal answers lost, an
//! acquire or break shows it gone, or its TTL passes without a successful
//! renewal (counted on tokio's clock from just before the request that
//! granted or renewed it). Under a tokio runtime a small task lowers the
//! gauge when a TTL passes even if nothing calls the backend any more; the
//! task ends when no lease is held. The gauge only ever counts grants it
//! saw granted, so it never goes below zero. Leases taken through two
//! wrappers of one backend add up, as two processes' do in the exporter.
//!
//! The `key` label makes one series per key: with very many keys (say a
//! [`LeaseGroup`](crate::LeaseGroup) of thousands), have the exporter drop or
//! aggregate it. The histograms carry no key for that reason.
//!
//! The names are also constants of this module, to refer to them in code.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "metrics")]
pub(crate) use held::HeldLeases;

use crate::loss::LossReason;

/// The `backend` label of a backend or keeper that was not given one.
pub const UNNAMED: &str = "unnamed";

/// The label [`UNNAMED`], shared.
pub(crate) fn unnamed() -> Arc<str> {
    Arc::from(UNNAMED)
}

/// Name of the counter of backend operations (labels `op`, `outcome`).
pub const OPERATIONS: &str = "lease_backend_operations_total";
/// Name of the histogram of backend operation latency in seconds (labels
/// `op`, `outcome`).
pub const OPERATION_DURATION: &str = "lease_backend_operation_duration_seconds";
/// Name of the histogram of the time left to the write deadline at each
/// successful renewal, in seconds.
pub const RENEW_DEADLINE_REMAINING: &str = "lease_renew_deadline_remaining_seconds";
/// Name of the gauge of leases held per key (label `key`).
pub const HELD: &str = "lease_held";
/// Name of the histogram of a keeper's acquire wait in seconds (label
/// `outcome`).
pub const ACQUIRE_WAIT: &str = "lease_acquire_wait_seconds";
/// Name of the counter of leases lost (label `reason`).
pub const LOSSES: &str = "lease_losses_total";
/// Name of the histogram of how long leases were held, in seconds (label
/// `reason`).
pub const HOLD: &str = "lease_hold_seconds";

/// How a keeper's acquire ended, for [`record_acquire_wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireWaitOutcome {
    /// The lease was granted.
    Granted,
    /// The key was held by someone else, and the acquire did not wait
    /// (`try_acquire`).
    Held,
    /// The wait ran out with the key still held.
    TimedOut,
    /// The backend refused the request.
    Error,
    /// The lease's group was abandoned.
    Abandoned,
}

impl AcquireWaitOutcome {
    /// How an acquire that answered `result` ended.
    pub(crate) fn of<T>(result: &Result<T, crate::AcquireError>) -> Self {
        use crate::AcquireError;
        match result {
            Ok(_) => AcquireWaitOutcome::Granted,
            Err(AcquireError::Held { .. }) => AcquireWaitOutcome::Held,
            Err(AcquireError::Timeout { .. }) => AcquireWaitOutcome::TimedOut,
            Err(AcquireError::GroupAbandoned(_)) => AcquireWaitOutcome::Abandoned,
            Err(AcquireError::Backend(_)) => AcquireWaitOutcome::Error,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            AcquireWaitOutcome::Granted => "granted",
            AcquireWaitOutcome::Held => "held",
            AcquireWaitOutcome::TimedOut => "timed_out",
            AcquireWaitOutcome::Error => "error",
            AcquireWaitOutcome::Abandoned => "abandoned",
        }
    }
}

/// The `reason` label of a loss.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn reason_label(reason: &LossReason) -> &'static str {
    match reason {
        LossReason::TakenOver { .. } => "taken_over",
        LossReason::Expired => "expired",
        LossReason::Broken { .. } => "broken",
        LossReason::DeadlinePassed => "deadline_passed",
        LossReason::Released => "released",
        LossReason::Abandoned => "abandoned",
    }
}

/// The `outcome` label of a failed operation: the kind of error.
pub(crate) fn error_label(e: &lease_core::Error) -> &'static str {
    use lease_core::Error;
    match e {
        Error::Unavailable { .. } => "unavailable",
        Error::Unsupported { .. } => "unsupported",
        Error::InvalidKey { .. } => "invalid_key",
        Error::InvalidHolder { .. } => "invalid_holder",
        Error::InvalidTtl { .. } => "invalid_ttl",
        Error::InvalidTiming { .. } => "invalid_timing",
        Error::PayloadTooLarge { .. } => "payload_too_large",
        Error::CorruptRecord { .. } => "corrupt_record",
        Error::PreconditionsIgnored { .. } => "preconditions_ignored",
        Error::Backend(_) => "backend",
        _ => "error",
    }
}

/// Describes every metric (name, unit, help text) to the installed recorder,
/// so exporters that show units and help have them.
#[cfg(feature = "metrics")]
pub(crate) fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        OPERATIONS,
        Unit::Count,
        "Backend lease operations, by operation and outcome"
    );
    describe_histogram!(
        OPERATION_DURATION,
        Unit::Seconds,
        "Latency of backend lease operations, from the call to the answer"
    );
    describe_histogram!(
        RENEW_DEADLINE_REMAINING,
        Unit::Seconds,
        "Time left to the write deadline at each successful renewal"
    );
    describe_gauge!(HELD, Unit::Count, "Leases held by this process, per key");
    describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "How long a keeper's acquire waited, by outcome"
    );
    describe_counter!(
        LOSSES,
        Unit::Count,
        "Leases lost, by reason (a release is not a loss)"
    );
    describe_histogram!(
        HOLD,
        Unit::Seconds,
        "How long leases were held, by how they ended"
    );
}

/// Does nothing: the `metrics` feature is off.
#[cfg(not(feature = "metrics"))]
pub(crate) fn describe() {}

/// One backend operation ended (`outcome`) after `latency`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn record_operation(
    backend: &Arc<str>,
    op: &'static str,
    outcome: &'static str,
    latency: Duration,
) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!(OPERATIONS, "backend" => backend.clone(), "op" => op, "outcome" => outcome)
            .increment(1);
        ::metrics::histogram!(OPERATION_DURATION, "backend" => backend.clone(), "op" => op, "outcome" => outcome)
            .record(latency.as_secs_f64());
    }
}

/// A renewal succeeded with `left` until the renewed grant's deadline.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn record_deadline_left(backend: &Arc<str>, left: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(RENEW_DEADLINE_REMAINING, "backend" => backend.clone())
        .record(left.as_secs_f64());
}

/// A keeper's acquire ended with `outcome` after waiting `waited` (from the
/// start of the acquire to its answer, including a try_acquire that does
/// not wait).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn record_acquire_wait(
    backend: &Arc<str>,
    waited: Duration,
    outcome: AcquireWaitOutcome,
) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(ACQUIRE_WAIT, "backend" => backend.clone(), "outcome" => outcome.label())
        .record(waited.as_secs_f64());
}

/// A kept lease ended for `reason`; counts a loss unless its holder
/// released it ([`LossReason::Released`] is not a loss and is not counted).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn record_loss(backend: &Arc<str>, reason: &LossReason) {
    #[cfg(feature = "metrics")]
    if !matches!(reason, LossReason::Released) {
        ::metrics::counter!(LOSSES, "backend" => backend.clone(), "reason" => reason_label(reason))
            .increment(1);
    }
}

/// A kept lease ended for `reason` after being held for `held` (from its
/// grant to its end).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn record_hold(backend: &Arc<str>, held: Duration, reason: &LossReason) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(HOLD, "backend" => backend.clone(), "reason" => reason_label(reason))
        .record(held.as_secs_f64());
}

/// The held-leases gauge, without the `metrics` feature: tracks nothing.
#[cfg(not(feature = "metrics"))]
#[derive(Clone)]
pub(crate) struct HeldLeases;

#[cfg(not(feature = "metrics"))]
impl HeldLeases {
    pub(crate) fn new(_backend: Arc<str>) -> Self {
        HeldLeases
    }
    pub(crate) fn granted(&self, _: &lease_core::Grant, _: crate::clock::Sent) {}
    pub(crate) fn seen_held(&self, _: &lease_core::LeaseKey, _: &lease_core::Holding) {}
    pub(crate) fn ended(
        &self,
        _: &lease_core::LeaseKey,
        _: &lease_core::HolderId,
        _: lease_core::Fence,
    ) {
    }
    pub(crate) fn seen_free(&self, _: &lease_core::LeaseKey) {}
    pub(crate) fn sweep(&self) {}
}

#[cfg(feature = "metrics")]
mod held {
    //! The held-leases gauge: which grant of each key this process holds,
    //! and until when.

    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, HashMap};
    use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

    use lease_core::{Fence, Grant, HolderId, Holding, LeaseKey};
    use tokio::sync::Notify;
    use tokio::time::Instant;

    use super::HELD;

    /// The grants held through one wrapper, one per key (at most one grant
    /// of a key is live), each raising the gauge of its key by one.
    #[derive(Clone)]
    pub(crate) struct HeldLeases {
        shared: Arc<Shared>,
    }

    struct Shared {
        /// The `backend` label of the gauge.
        backend: Arc<str>,
        state: Mutex<State>,
        /// Wakes the sweeper when a TTL ends earlier than the one it sleeps to.
        wake: Notify,
    }

    #[derive(Default)]
    struct State {
        held: HashMap<LeaseKey, Held>,
        /// When each grant's TTL ends, with the stamp of the entry it was
        /// pushed for; entries replaced since are skipped when they surface.
        expiries: BinaryHeap<Reverse<(Instant, u64, LeaseKey)>>,
        next_stamp: u64,
        /// The sweeper task, while one runs.
        sweeper: Option<Sweeper>,
        next_sweeper: u64,
    }

    /// A running sweeper: which one, and the instant it sleeps to (`None`
    /// before it first looked).
    struct Sweeper {
        id: u64,
        target: Option<Instant>,
    }

    /// Owned by a sweeper task's future: when it ends, or is dropped
    /// unfinished (its runtime shut down), the next grant starts another.
    struct SweeperGuard {
        held: HeldLeases,
        id: u64,
    }

    impl Drop for SweeperGuard {
        fn drop(&mut self) {
            let mut s = self.held.lock();
            if s.sweeper.as_ref().is_some_and(|w| w.id == self.id) {
                s.sweeper = None;
            }
        }
    }

    struct Held {
        holder: HolderId,
        fence: Fence,
        stamp: u64,
    }

    impl HeldLeases {
        pub(crate) fn new(backend: Arc<str>) -> Self {
            HeldLeases {
                shared: Arc::new(Shared {
                    backend,
                    state: Mutex::default(),
                    wake: Notify::new(),
                }),
            }
        }

        fn lock(&self) -> MutexGuard<'_, State> {
            self.shared
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        }

        /// `grant` was granted or renewed by a request handed over at `sent`:
        /// held until its TTL after the instant it counts from.
        pub(crate) fn granted(&self, grant: &Grant, sent: crate::clock::Sent) {
            let expires = crate::clock::counted_from(grant, sent).checked_add(grant.ttl());
            let key = grant.key();
            let (raised, wake, spawn) = {
                let mut s = self.lock();
                let stamp = s.next_stamp;
                s.next_stamp = stamp.wrapping_add(1);
                let entry = Held {
                    holder: grant.holder().clone(),
                    fence: grant.fence(),
                    stamp,
                };
                // A different grant of the key replaces the old one, which
                // cannot be live any more: the count stays.
                let raised = s.held.insert(key.clone(), entry).is_none();
                let mut wake = false;
                let mut spawn = false;
                if let Some(at) = expires {
                    s.expiries.push(Reverse((at, stamp, key.clone())));
                    match &s.sweeper {
                        None => spawn = true,
                        Some(Sweeper {
                            target: Some(target),
                            ..
                        }) if at < *target => wake = true,
                        Some(_) => {}
                    }
                }
                if spawn {
                    spawn = self.spawn_sweeper(&mut s);
                }
                (raised, wake, spawn)
            };
            if raised {
                ::metrics::gauge!(HELD, "backend" => self.shared.backend.clone(), "key" => key.to_string())
                    .increment(1.0);
            }
            if wake && !spawn {
                self.shared.wake.notify_one();
            }
        }

        /// A refused acquire or a read showed `holding` on `key`: a grant of
        /// ours that is not that one is gone.
        pub(crate) fn seen_held(&self, key: &LeaseKey, holding: &Holding) {
            let gone = {
                let mut s = self.lock();
                match s.held.get(key) {
                    Some(h) if h.holder != holding.holder || h.fence != holding.fence => {
                        s.held.remove(key).is_some()
                    }
                    _ => false,
                }
            };
            if gone {
                self.lower(key);
            }
        }

        /// A break found `key` free (or holding a corrupt record): no grant
        /// of ours is live there.
        pub(crate) fn seen_free(&self, key: &LeaseKey) {
            let gone = self.lock().held.remove(key).is_some();
            if gone {
                self.lower(key);
            }
        }

        /// The grant (`holder`, `fence`) of `key` ended (released, lost,
        /// broken): no longer held, if it was.
        pub(crate) fn ended(&self, key: &LeaseKey, holder: &HolderId, fence: Fence) {
            let gone = {
                let mut s = self.lock();
                match s.held.get(key) {
                    Some(h) if h.holder == *holder && h.fence == fence => {
                        s.held.remove(key).is_some()
                    }
                    _ => false,
                }
            };
            if gone {
                self.lower(key);
            }
        }

        /// Forgets the grants whose TTL has passed.
        pub(crate) fn sweep(&self) {
            let gone = self.lock().expired(Instant::now());
            for key in &gone {
                self.lower(key);
            }
        }

        /// Starts the sweeper on the current tokio runtime, if there is one.
        fn spawn_sweeper(&self, s: &mut State) -> bool {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return false;
            };
            let id = s.next_sweeper;
            s.next_sweeper = id.wrapping_add(1);
            s.sweeper = Some(Sweeper { id, target: None });
            let guard = SweeperGuard {
                held: self.clone(),
                id,
            };
            drop(runtime.spawn(async move { guard.held.sweep_until_empty(guard.id).await }));
            true
        }

        /// Lowers the gauge as TTLs pass, until nothing is held.
        async fn sweep_until_empty(&self, id: u64) {
            loop {
                let next = {
                    let mut s = self.lock();
                    let gone = s.expired(Instant::now());
                    let next = s.expiries.peek().map(|Reverse((at, _, _))| *at);
                    s.sweeper = next.map(|at| Sweeper {
                        id,
                        target: Some(at),
                    });
                    drop(s);
                    for key in &gone {
                        self.lower(key);
                    }
                    next
                };
                let Some(next) = next else { return };
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    _ = self.shared.wake.notified() => {}
                }
            }
        }
    }

    impl State {
        /// Removes the grants whose TTL ended by `now`; their keys.
        fn expired(&mut self, now: Instant) -> Vec<LeaseKey> {
            let mut gone = Vec::new();
            while let Some(Reverse((at, _, _))) = self.expiries.peek() {
                if *at > now {
                    break;
                }
                let Some(Reverse((_, stamp, key))) = self.expiries.pop() else {
                    break;
                };
                if self.held.get(&key).is_some_and(|h| h.stamp == stamp) {
                    self.held.remove(&key);
                    gone.push(key);
                }
            }
            gone
        }
    }

    impl HeldLeases {
        fn lower(&self, key: &LeaseKey) {
            ::metrics::gauge!(HELD, "backend" => self.shared.backend.clone(), "key" => key.to_string())
                .decrement(1.0);
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Duration;

    use lease_core::{
        Acquire, AcquireRequest, BreakNote, HolderId, LeaseBackend, LeaseKey, Renewal,
    };
    use lease_fake::Fake;
    use metrics::{Label, Unit};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use metrics_util::MetricKind;

    use super::*;
    use crate::InstrumentedBackend;

    /// Runs `test` on a paused current-thread runtime with a recorder of
    /// its own (metrics recorded on this thread only).
    fn with_recorder<F: Future<Output = ()>>(test: impl FnOnce(Snapshotter) -> F) {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        ::metrics::with_local_recorder(&recorder, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
                .block_on(test(snapshotter))
        });
    }

    /// One metric: kind, name, labels, unit and value.
    type Metric = (
        MetricKind,
        String,
        Vec<(String, String)>,
        Option<Unit>,
        DebugValue,
    );

    /// Every value recorded so far. A snapshot of the debugging recorder
    /// drains it (counters and gauges are reset to zero, histograms
    /// emptied), so this adds the snapshots up: with gauges only ever
    /// raised and lowered, their sum is their value.
    struct Seen {
        snapshotter: Snapshotter,
        all: Vec<Metric>,
        /// The `backend` label every metric looked up must have.
        backend: &'static str,
    }

    impl Seen {
        fn new(snapshotter: Snapshotter) -> Seen {
            Seen {
                snapshotter,
                all: Vec::new(),
                backend: UNNAMED,
            }
        }

        /// Looks up the metrics labelled `backend`.
        fn of(mut self, backend: &'static str) -> Seen {
            self.backend = backend;
            self
        }

        /// Adds what was recorded since the last call.
        fn now(&mut self) -> &Seen {
            for (ck, unit, _, value) in self.snapshotter.snapshot().into_vec() {
                let (kind, key) = ck.into_parts();
                let labels: Vec<(String, String)> = key
                    .labels()
                    .map(|l: &Label| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                let name = key.name().to_owned();
                let old = self
                    .all
                    .iter_mut()
                    .find(|(k, n, l, ..)| *k == kind && *n == name && *l == labels);
                match old {
                    None => self.all.push((kind, name, labels, unit, value)),
                    Some(old) => {
                        old.4 = match (&old.4, value) {
                            (DebugValue::Counter(a), DebugValue::Counter(b)) => {
                                DebugValue::Counter(a + b)
                            }
                            (DebugValue::Gauge(a), DebugValue::Gauge(b)) => {
                                DebugValue::Gauge(*a + b)
                            }
                            (DebugValue::Histogram(a), DebugValue::Histogram(b)) => {
                                DebugValue::Histogram(a.iter().copied().chain(b).collect())
                            }
                            (a, b) => panic!("{a:?} then {b:?}"),
                        }
                    }
                }
            }
            self
        }

        fn get(
            &self,
            kind: MetricKind,
            name: &str,
            labels: &[(&str, &str)],
        ) -> Option<&DebugValue> {
            let backend = [("backend", self.backend)];
            let labels: Vec<_> = labels.iter().chain(&backend).collect();
            self.all.iter().find_map(|(k, n, l, _, v)| {
                let same = l.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(lk, lv)| l.iter().any(|(k2, v2)| k2 == lk && v2 == lv));
                (*k == kind && n == name && same).then_some(v)
            })
        }

        fn unit(&self, name: &str) -> Option<Unit> {
            self.all
                .iter()
                .find(|(_, n, ..)| n == name)
                .and_then(|e| e.3)
        }

        fn count(&self, op: &str, outcome: &str) -> u64 {
            match self.get(
                MetricKind::Counter,
                OPERATIONS,
                &[("op", op), ("outcome", outcome)],
            ) {
                Some(DebugValue::Counter(n)) => *n,
                None => 0,
                Some(other) => panic!("{other:?}"),
            }
        }

        fn held(&self, key: &LeaseKey) -> f64 {
            match self.get(MetricKind::Gauge, HELD, &[("key", key.as_str())]) {
                Some(DebugValue::Gauge(v)) => v.into_inner(),
                None => 0.0,
                Some(other) => panic!("{other:?}"),
            }
        }

        fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
            match self.get(MetricKind::Histogram, name, labels) {
                Some(DebugValue::Histogram(v)) => v.iter().map(|x| x.into_inner()).collect(),
                None => Vec::new(),
                Some(other) => panic!("{other:?}"),
            }
        }
    }

    fn key(k: &str) -> LeaseKey {
        LeaseKey::new(k).unwrap()
    }

    #[test]
    fn operations_are_counted_and_timed_by_op_and_outcome() {
        with_recorder(|snap| async move {
            let mut m = Seen::new(snap);
            let fake = Fake::new();
            let backend = InstrumentedBackend::new(Arc::new(fake.clone()));
            let k = key("metrics/ops");
            let me = HolderId::random();
            let req = AcquireRequest::new(k.clone(), me.clone()).ttl(Duration::from_secs(9));
            let grant = backend.try_acquire(req).await.unwrap().granted().unwrap();
            let refused = AcquireRequest::new(k.clone(), HolderId::random());
            assert!(matches!(
                backend.try_acquire(refused).await.unwrap(),
                Acquire::Held(_)
            ));
            let grant = match backend.renew(&grant, None).await.unwrap() {
                Renewal::Renewed(g) => g,
                Renewal::Lost => panic!("lost"),
            };
            backend.read(&k).await.unwrap();
            fake.fail_next(1);
            assert!(backend.release(&grant).await.is_err());
            backend.release(&grant).await.unwrap();
            assert_eq!(backend.renew(&grant, None).await.unwrap(), Renewal::Lost);
            drop(backend.read(&k));
            let note = BreakNote::new("ops", "test").with_at_unix_ms(0);
            backend.break_lease(&k, &note).await.unwrap();
            assert!(backend.last_break(&k).await.unwrap().is_some());

            let seen = m.now();
            for (op, outcome) in [
                ("acquire", "granted"),
                ("acquire", "held"),
                ("renew", "renewed"),
                ("renew", "lost"),
                ("read", "held"),
                ("read", "cancelled"),
                ("release", "unavailable"),
                ("release", "released"),
                ("break", "broken"),
                ("last_break", "found"),
            ] {
                assert_eq!(seen.count(op, outcome), 1, "{op} {outcome}");
                let latency =
                    seen.histogram(OPERATION_DURATION, &[("op", op), ("outcome", outcome)]);
                assert_eq!(latency.len(), 1, "{op} {outcome}");
                assert!(latency[0] >= 0.0);
            }
            assert_eq!(seen.count("acquire", "unavailable"), 0);
            let left = seen.histogram(RENEW_DEADLINE_REMAINING, &[]);
            assert_eq!(left.len(), 1, "{left:?}");
            assert!(left[0] > 0.0 && left[0] <= 6.0, "{left:?}");
            assert_eq!(seen.unit(OPERATION_DURATION), Some(Unit::Seconds));
            assert_eq!(seen.unit(OPERATIONS), Some(Unit::Count));
        });
    }

    #[test]
    fn the_held_gauge_rises_once_per_grant_and_never_goes_below_zero() {
        with_recorder(|snap| async move {
            let mut m = Seen::new(snap);
            let fake = Fake::new();
            let backend = InstrumentedBackend::new(Arc::new(fake.clone()));
            let k = key("metrics/held");
            let me = HolderId::random();
            let req = AcquireRequest::new(k.clone(), me.clone()).ttl(Duration::from_secs(30));
            let grant = backend
                .try_acquire(req.clone())
                .await
                .unwrap()
                .granted()
                .unwrap();
            assert_eq!(m.now().held(&k), 1.0);
            // The same grant again, a renewal, a refused acquire: still one.
            let again = backend
                .try_acquire(req.clone())
                .await
                .unwrap()
                .granted()
                .unwrap();
            assert_eq!(again.fence(), grant.fence());
            let _ = backend.renew(&grant, None).await.unwrap();
            let refused = AcquireRequest::new(k.clone(), HolderId::random());
            assert!(backend
                .try_acquire(refused)
                .await
                .unwrap()
                .granted()
                .is_none());
            assert_eq!(m.now().held(&k), 1.0);

            backend.release(&grant).await.unwrap();
            assert_eq!(m.now().held(&k), 0.0);
            // Released twice, and a renewal that finds it lost: no lower.
            backend.release(&grant).await.unwrap();
            assert_eq!(backend.renew(&grant, None).await.unwrap(), Renewal::Lost);
            assert_eq!(m.now().held(&k), 0.0);

            // Lost on renewal: down.
            let grant = backend
                .try_acquire(req.clone())
                .await
                .unwrap()
                .granted()
                .unwrap();
            assert_eq!(m.now().held(&k), 1.0);
            fake.expire(&k);
            assert_eq!(backend.renew(&grant, None).await.unwrap(), Renewal::Lost);
            assert_eq!(m.now().held(&k), 0.0);

            // Taken by someone else behind our back: a refused acquire shows it.
            let _grant = backend
                .try_acquire(req.clone())
                .await
                .unwrap()
                .granted()
                .unwrap();
            fake.expire(&k);
            let theirs = AcquireRequest::new(k.clone(), HolderId::random());
            let theirs = fake.try_acquire(theirs).await.unwrap().granted().unwrap();
            assert_eq!(m.now().held(&k), 1.0);
            assert!(backend
                .try_acquire(req.clone())
                .await
                .unwrap()
                .granted()
                .is_none());
            assert_eq!(m.now().held(&k), 0.0);

            // Broken: down.
            fake.release(&theirs).await.unwrap();
            let _grant = backend
                .try_acquire(req.clone())
                .await
                .unwrap()
                .granted()
                .unwrap();
            assert_eq!(m.now().held(&k), 1.0);
            let note = BreakNote::new("ops", "test").with_at_unix_ms(0);
            backend.break_lease(&k, &note).await.unwrap();
            assert_eq!(m.now().held(&k), 0.0);
        });
    }

    #[test]
    fn the_held_gauge_falls_when_a_ttl_passes_without_renewal_even_with_no_call() {
        with_recorder(|snap| async move {
            let mut m = Seen::new(snap);
            let backend = InstrumentedBackend::new(Arc::new(Fake::new()));
            let (short, long) = (key("metrics/short"), key("metrics/long"));
            let me = HolderId::random();
            let take = |k: &LeaseKey, secs| {
                AcquireRequest::new(k.clone(), me.clone()).ttl(Duration::from_secs(secs))
            };
            let long_grant = backend
                .try_acquire(take(&long, 20))
                .await
                .unwrap()
                .granted();
            let short_grant = backend
                .try_acquire(take(&short, 4))
                .await
                .unwrap()
                .granted();
            assert!(long_grant.is_some() && short_grant.is_some());
            let seen = m.now();
            assert_eq!((seen.held(&short), seen.held(&long)), (1.0, 1.0));

            tokio::time::sleep(Duration::from_secs(3)).await;
            let seen = m.now();
            assert_eq!((seen.held(&short), seen.held(&long)), (1.0, 1.0));
            tokio::time::sleep(Duration::from_secs(2)).await;
            let seen = m.now();
            assert_eq!((seen.held(&short), seen.held(&long)), (0.0, 1.0));
            // A renewal pushes the end on: renewed at 5 s, held to 25 s.
            let long_grant = long_grant.unwrap();
            let _ = backend.renew(&long_grant, None).await.unwrap();
            tokio::time::sleep(Duration::from_secs(17)).await;
            assert_eq!(m.now().held(&long), 1.0);
            tokio::time::sleep(Duration::from_secs(4)).await;
            assert_eq!(m.now().held(&long), 0.0);
            // The short grant's late release lowers nothing.
            backend.release(&short_grant.unwrap()).await.unwrap();
            assert_eq!(m.now().held(&short), 0.0);
        });
    }

    #[test]
    fn a_sweeper_lost_with_its_runtime_is_started_again_on_the_next() {
        let recorder = DebuggingRecorder::new();
        let mut m = Seen::new(recorder.snapshotter());
        let backend = InstrumentedBackend::new(Arc::new(Fake::new()));
        let (first, second) = (key("metrics/runtime-1"), key("metrics/runtime-2"));
        let me = HolderId::random();
        let paused = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        ::metrics::with_local_recorder(&recorder, || {
            // The first runtime ends while its sweeper sleeps.
            paused().block_on(async {
                let req =
                    AcquireRequest::new(first.clone(), me.clone()).ttl(Duration::from_secs(60));
                assert!(backend.try_acquire(req).await.unwrap().granted().is_some());
            });
            paused().block_on(async {
                let req =
                    AcquireRequest::new(second.clone(), me.clone()).ttl(Duration::from_secs(2));
                assert!(backend.try_acquire(req).await.unwrap().granted().is_some());
                assert_eq!(m.now().held(&second), 1.0);
                tokio::time::sleep(Duration::from_secs(3)).await;
                assert_eq!(m.now().held(&second), 0.0);
            });
        });
    }

    #[test]
    fn keeper_hooks_record_waits_losses_and_holds() {
        with_recorder(|snap| async move {
            let mut m = Seen::new(snap);
            let b = unnamed();
            record_acquire_wait(&b, Duration::from_millis(1500), AcquireWaitOutcome::Granted);
            record_acquire_wait(&b, Duration::from_secs(2), AcquireWaitOutcome::TimedOut);
            record_acquire_wait(&b, Duration::ZERO, AcquireWaitOutcome::Held);
            let refused: Result<(), crate::AcquireError> =
                Err(lease_core::Error::Unsupported { operation: "x" }.into());
            assert_eq!(AcquireWaitOutcome::of(&refused), AcquireWaitOutcome::Error);
            assert_eq!(AcquireWaitOutcome::of(&Ok(())), AcquireWaitOutcome::Granted);
            record_loss(&b, &LossReason::Expired);
            record_loss(&b, &LossReason::DeadlinePassed);
            record_loss(&b, &LossReason::Expired);
            record_loss(&b, &LossReason::Released);
            record_hold(&b, Duration::from_secs(7), &LossReason::Released);
            record_hold(&b, Duration::from_secs(3), &LossReason::Expired);
            let seen = m.now();
            assert_eq!(
                seen.histogram(ACQUIRE_WAIT, &[("outcome", "granted")]),
                [1.5]
            );
            assert_eq!(
                seen.histogram(ACQUIRE_WAIT, &[("outcome", "timed_out")]),
                [2.0]
            );
            assert_eq!(seen.histogram(ACQUIRE_WAIT, &[("outcome", "held")]), [0.0]);
            let losses = |reason| match seen.get(MetricKind::Counter, LOSSES, &[("reason", reason)])
            {
                Some(DebugValue::Counter(n)) => *n,
                _ => 0,
            };
            assert_eq!(
                (
                    losses("expired"),
                    losses("deadline_passed"),
                    losses("released")
                ),
                (2, 1, 0)
            );
            assert_eq!(seen.histogram(HOLD, &[("reason", "released")]), [7.0]);
            assert_eq!(seen.histogram(HOLD, &[("reason", "expired")]), [3.0]);
        });
    }

    /// The keeper's own loops call the hooks: an acquire records its wait,
    /// a takeover its loss, every ending its hold time.
    #[test]
    fn the_keeper_records_waits_losses_and_holds() {
        with_recorder(|snap| async move {
            let mut m = Seen::new(snap);
            let fake = std::sync::Arc::new(lease_fake::Fake::new());
            let k = key("metrics/keeper");
            let a = crate::Keeper::new(fake.clone());
            let b = crate::Keeper::new(fake.clone());
            let ttl = Duration::from_secs(3);
            let first = a.acquire(&k).ttl(ttl).await.expect("granted");
            assert!(matches!(
                b.try_acquire(&k).ttl(ttl).await,
                Err(crate::AcquireError::Held { .. })
            ));
            first.release().await.expect("released");
            let second = b.acquire(&k).ttl(ttl).await.expect("granted");
            assert!(fake.expire(&k));
            let third = a.acquire(&k).ttl(ttl).await.expect("taken over");
            tokio::time::timeout(Duration::from_secs(10), second.lost())
                .await
                .expect("b's loss is noticed at its next renewal");
            drop(third);
            let seen = m.now();
            assert_eq!(
                seen.histogram(ACQUIRE_WAIT, &[("outcome", "granted")])
                    .len(),
                3
            );
            assert_eq!(
                seen.histogram(ACQUIRE_WAIT, &[("outcome", "held")]).len(),
                1
            );
            // The first lease released, the third dropped (a drop releases).
            assert_eq!(seen.histogram(HOLD, &[("reason", "released")]).len(), 2);
            let taken_over = seen.get(MetricKind::Counter, LOSSES, &[("reason", "taken_over")]);
            assert!(
                matches!(taken_over, Some(DebugValue::Counter(1))),
                "{taken_over:?}"
            );
            assert_eq!(seen.histogram(HOLD, &[("reason", "taken_over")]).len(), 1);
        });
    }

    /// A labelled wrapper and keeper put their `backend` label on every
    /// metric they record.
    #[test]
    fn every_metric_carries_the_backend_label() {
        with_recorder(|snap| async move {
            let mut m = Seen::new(snap).of("etcd");
            let fake = Fake::new();
            let backend: Arc<dyn LeaseBackend> =
                Arc::new(InstrumentedBackend::new(Arc::new(fake.clone())).with_label("etcd"));
            let keeper = crate::Keeper::new(backend).with_backend_label("etcd");
            assert_eq!(keeper.backend_label(), "etcd");
            let k = key("metrics/labelled");
            let ttl = Duration::from_secs(3);
            let first = keeper.acquire(&k).ttl(ttl).await.expect("granted");
            tokio::time::sleep(ttl).await;
            assert!(fake.expire(&k));
            tokio::time::timeout(Duration::from_secs(10), first.lost())
                .await
                .expect("the loss is noticed at the next renewal");
            drop(first);
            let seen = m.now();
            assert_eq!(seen.count("acquire", "granted"), 1);
            assert!(seen.count("renew", "renewed") >= 1);
            assert!(!seen.histogram(RENEW_DEADLINE_REMAINING, &[]).is_empty());
            assert_eq!(
                seen.histogram(ACQUIRE_WAIT, &[("outcome", "granted")])
                    .len(),
                1
            );
            assert_eq!(seen.histogram(HOLD, &[("reason", "expired")]).len(), 1);
            assert!(matches!(
                seen.get(MetricKind::Counter, LOSSES, &[("reason", "expired")]),
                Some(DebugValue::Counter(1))
            ));
            assert_eq!(seen.held(&k), 0.0);
            for (kind, name, labels, ..) in &seen.all {
                assert!(
                    labels.iter().any(|(k, v)| k == "backend" && v == "etcd"),
                    "{kind:?} {name} {labels:?}"
                );
            }
        });
    }
}
