//! Fault injection and fault runs: safety under failure, checked on
//! recorded histories.
//!
//! # How a backend plugs in
//!
//! A backend's conformance harness (its [`Harness`]) overrides
//! [`Harness::fault_hooks`] to return a [`FaultHooks`] — usually itself —
//! implementing only the hooks it can honour; every other fault kind is then
//! reported "not applicable" instead of passing silently:
//!
//! * a real server behind TCP: [`FaultHooks::upstream`] (the server's
//!   address) and [`FaultHooks::client_via`] (a client of the same store
//!   that connects to another address). [`run`] then starts a
//!   [`FaultProxy`] in front of the server and gives every contender a
//!   client through it: lost responses, latency, severed connections and
//!   blackholes apply.
//! * a server process the harness launched: [`FaultHooks::server`], e.g.
//!   [`Launched`] around the launcher's handle (a [`ServerProcess`]):
//!   pause/resume, and kill/restart when [`ServerControl::durable`]; or
//!   [`PidProcess`] for pause/resume by process id alone.
//! * an in-process backend (the fake): the clock and fault hooks
//!   ([`FaultHooks::advance_clock`], [`jump_clock`](FaultHooks::jump_clock),
//!   [`lose_next_responses`](FaultHooks::lose_next_responses),
//!   [`fail_next`](FaultHooks::fail_next)); `FakeHarness` implements them.
//!
//! Then one test per fault kind:
//!
//! ```ignore
//! let report = faults::run(&harness, &FaultPlan::new(FaultKind::Sever).ttl(Duration::from_secs(2))).await?;
//! ```
//!
//! [`run`] starts `contenders` holders that acquire, renew, write to a
//! [`FencedResource`] while `may_write()` holds, release and retry on one or
//! a few keys for `duration`, while an injector applies the fault; every
//! operation is recorded in a [`History`] and [`check`]ed. Paused holders
//! work on every backend (the holder's own task freezes).

mod driver;
mod proxy;
#[doc(hidden)]
pub mod tests_macro;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use driver::{run, run_unchecked};
pub use tests_macro::{
    real_resource_row, run_with_progress, server_clock_steps_kind, FaultTuning, ResourceFuture,
    NO_FAILED_REQUESTS_HOOK, PROGRESS_ATTEMPTS,
};

/// Environment variable: when set to a number of seconds, every fault run
/// lasts that long instead of its plan's duration — the long soak, kept out
/// of CI's bounded runs (`LEASE_FAULT_SOAK=600 cargo test … faults`).
pub const SOAK_ENV: &str = "LEASE_FAULT_SOAK";

/// The soak duration from [`SOAK_ENV`], if set to a positive number of seconds.
pub fn soak() -> Option<Duration> {
    std::env::var(SOAK_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
}

/// What a fault row's report file is called: this prefix and the plan's
/// [`FaultPlan::status_name`] (`fault_lost_responses`, …).
pub const FAULT_ROW_PREFIX: &str = "fault_";

/// Every [`FaultPlan::status_name`], in the order a report lists the fault
/// rows: the baseline, the faults on requests, on holders, on the clock, on
/// connections, then on the server process.
pub const FAULT_ROWS: &[&str] = &[
    "none",
    "lost_responses",
    "failed_requests",
    "latency",
    "paused_holders",
    "clock_jumps_small",
    "clock_jumps_large",
    "sever",
    "blackhole",
    "server_pause",
    "server_restart",
    "delayed_releases",
    "real_resource",
];

/// Writes the outcome of one fault run where `cargo xtask conformance`
/// collects its matrix: `$LEASE_REPORT_DIR/<backend>/fault_<kind>` holds
/// `pass`, `n/a: <reason>` or `fail: <first line>` (nothing happens when
/// the variable is unset). Returns the result unchanged.
pub fn record_status(
    backend: &str,
    kind: FaultKind,
    result: Result<Report, crate::Failure>,
) -> Result<Report, crate::Failure> {
    record_status_as(backend, kind.name(), result)
}

/// Like [`record_status`], under the plan's [`FaultPlan::status_name`]: the
/// one to use when a backend runs the same kind at several sizes (small and
/// large clock jumps), so each size gets its own matrix row.
pub fn record_plan_status(
    backend: &str,
    plan: &FaultPlan,
    result: Result<Report, crate::Failure>,
) -> Result<Report, crate::Failure> {
    record_status_as(backend, plan.status_name(), result)
}

/// Like [`record_status`], under `fault_<name>`.
pub fn record_status_as(
    backend: &str,
    name: &str,
    result: Result<Report, crate::Failure>,
) -> Result<Report, crate::Failure> {
    let Ok(dir) = std::env::var(crate::REPORT_ENV) else {
        return result;
    };
    let line = match &result {
        Ok(r) => match &r.not_applicable {
            Some(reason) => format!("n/a: {reason}"),
            None => "pass".to_string(),
        },
        Err(f) => format!("fail: {}", f.0.lines().next().unwrap_or_default()),
    };
    let dir = std::path::Path::new(&dir).join(backend);
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join(format!("{FAULT_ROW_PREFIX}{name}")), line));
    if let Err(e) = written {
        eprintln!("lease-conformance: could not write the fault report for {backend}: {e}");
    }
    result
}
pub use crate::hooks::FaultHooks;
pub use crate::process::{wait_stopped, Launched, PidProcess, ServerControl, ServerProcess};
pub use proxy::{FaultProxy, ProxyStats, DEFAULT_DROP_WINDOW};

#[allow(unused_imports)] // for the docs
use crate::history::{check, FencedResource, History, RealResource};
use crate::history::{CheckReport, OpKind, OpOutcome};
#[allow(unused_imports)] // for the docs
use crate::Harness;

/// Which fault a run injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultKind {
    /// None: the baseline run.
    None,
    /// Requests applied whose answers are lost, about four times per TTL (the
    /// fake's hook, or the proxy's "forward the request, drop the response").
    LostResponses,
    /// Requests that fail before being applied, about four times per TTL (fake).
    FailedRequests,
    /// Every request takes this much longer (the fake's latency hook, or the
    /// proxy delaying each chunk).
    Latency(Duration),
    /// Holders freeze for this long (past their deadline) at random points:
    /// between checking `may_write()` and writing, before renewing, and
    /// while an answer waits to be read. Applies to every backend.
    PausedHolders(Duration),
    /// The backend's clock jumps forward by `forward`, then back by
    /// `backward`, about once per TTL (fake). A forward jump larger than the
    /// slack between deadline and TTL legitimately breaks exclusion: the run
    /// then counts overlaps instead of failing on them and relies on the
    /// fenced resource.
    ClockJumps {
        /// Size of each forward jump.
        forward: Duration,
        /// Size of each backward jump.
        backward: Duration,
    },
    /// Every open connection is severed about twice per TTL (proxy), each
    /// time right after the next request has been forwarded to the server
    /// (waiting up to a quarter TTL for one), so the sever cuts an exchange
    /// in flight: the client sees its connection close mid-request (an
    /// unknown outcome, unless its driver retries), not just an idle
    /// connection to re-open. The report's proxy line says how many
    /// connections were cut while awaiting an answer.
    Sever,
    /// The network swallows everything for this long, about once per TTL (proxy).
    Blackhole(Duration),
    /// The server process is frozen (SIGSTOP) for this long, then thawed.
    ServerPause(Duration),
    /// The server process is killed and restarted on the same data (durable servers).
    ServerRestart,
    /// The election candidates' releases reach the backend only this long
    /// after they are sent, and a candidate whose work ended drops its
    /// leadership and campaigns again at once: the release of one term is
    /// still on its way when the next term of the same keeper acquires the
    /// key. The plain contenders' releases time out at once (their outcome
    /// unknown to the contender, as a blackhole leaves it) and still reach
    /// the backend this long after, while the contender may already have
    /// acquired again. Applies to every backend.
    DelayedReleases(Duration),
}

impl FaultKind {
    /// A short name for reports and report files (`lost_responses`, …).
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::None => "none",
            FaultKind::LostResponses => "lost_responses",
            FaultKind::FailedRequests => "failed_requests",
            FaultKind::Latency(_) => "latency",
            FaultKind::PausedHolders(_) => "paused_holders",
            FaultKind::ClockJumps { .. } => "clock_jumps",
            FaultKind::Sever => "sever",
            FaultKind::Blackhole(_) => "blackhole",
            FaultKind::ServerPause(_) => "server_pause",
            FaultKind::ServerRestart => "server_restart",
            FaultKind::DelayedReleases(_) => "delayed_releases",
        }
    }
}

/// What a fault run does.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// The fault.
    pub kind: FaultKind,
    /// Holders competing (each with its own client).
    pub contenders: usize,
    /// Election candidates (each a keeper on its own client) campaigning
    /// on a key of their own beside the contenders: each leader runs work
    /// through `Leadership::run` (writing to the resource while it may),
    /// then resigns; the history checks that no two leaders' work overlaps
    /// and none outlives its grant's write window. Default 2.
    pub elections: usize,
    /// Holders of shared and exclusive leases (each a keeper on its own
    /// client) on a key of their own beside the others: each takes the key
    /// shared or, one time in three, exclusively, runs work (writing to the
    /// resource while it may) and leaves; the history checks that no
    /// exclusive holder's work overlaps anyone else's and that no work
    /// outlives its grant's write window. Default 3.
    pub shared: usize,
    /// Holders of one of two permits (each a keeper on its own client) on
    /// a key of their own, running work the same way: each permit is a
    /// grant of its own slot key, held to the same checks. Default 3.
    pub permits: usize,
    /// Keys they compete for.
    pub keys: usize,
    /// How long they compete.
    pub duration: Duration,
    /// Requested TTL (rounded by the backend).
    pub ttl: Duration,
    /// Seed of the run's random choices (timings, pauses, keys).
    pub seed: u64,
    /// A call without an answer after this long counts as unknown outcome
    /// (default: the TTL).
    pub op_timeout: Option<Duration>,
    /// Whether the protected resource checks fences (default true; false
    /// is the counter-example of the fencing demo).
    pub fenced_resource: bool,
    /// A real resource to write to instead of the in-memory one (its own
    /// fence check is then what the history checker judges).
    pub real_resource: Option<Arc<dyn RealResource>>,
}

impl FaultPlan {
    /// Four contenders on one key and two election candidates on another,
    /// for 3 s (or the [`SOAK_ENV`] duration)
    /// with a 300 ms TTL (suits the fake; real servers with whole-second
    /// TTLs want `.ttl(1 s)` or more and longer runs).
    pub fn new(kind: FaultKind) -> FaultPlan {
        FaultPlan {
            kind,
            contenders: 4,
            elections: 2,
            shared: 3,
            permits: 3,
            keys: 1,
            duration: soak().unwrap_or(Duration::from_secs(3)),
            ttl: Duration::from_millis(300),
            seed: 0x5eed,
            op_timeout: None,
            fenced_resource: true,
            real_resource: None,
        }
    }

    /// Sets the number of contenders.
    pub fn contenders(mut self, n: usize) -> Self {
        self.contenders = n.max(1);
        self
    }

    /// Sets the number of election candidates (see [`FaultPlan::elections`]).
    pub fn elections(mut self, n: usize) -> Self {
        self.elections = n;
        self
    }

    /// Sets the number of shared/exclusive holders (see [`FaultPlan::shared`]).
    pub fn shared(mut self, n: usize) -> Self {
        self.shared = n;
        self
    }

    /// Sets the number of permit holders (see [`FaultPlan::permits`]).
    pub fn permits(mut self, n: usize) -> Self {
        self.permits = n;
        self
    }

    /// Sets the number of keys.
    pub fn keys(mut self, n: usize) -> Self {
        self.keys = n.max(1);
        self
    }

    /// Sets the duration (the soak duration from [`SOAK_ENV`] wins when set).
    pub fn duration(mut self, d: Duration) -> Self {
        self.duration = soak().unwrap_or(d);
        self
    }

    /// Sets the requested TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets the per-call timeout.
    pub fn op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = Some(d);
        self
    }

    /// The name this plan's status is reported under: [`FaultKind::name`],
    /// except that clock jumps say whether their forward jump stays within
    /// the slack between deadline and requested TTL (`clock_jumps_small`:
    /// windows must stay exclusive) or not (`clock_jumps_large`: overlaps
    /// are tolerated and the fenced resource must refuse stale writes), and
    /// a plan with a [`real_resource`](FaultPlan::real_resource) reports as
    /// `real_resource`.
    pub fn status_name(&self) -> &'static str {
        if self.real_resource.is_some() {
            return "real_resource";
        }
        match self.kind {
            FaultKind::ClockJumps { forward, .. } => {
                let slack = self
                    .ttl
                    .mul_f64(1.0 - lease_core::Timing::default().deadline_fraction());
                if forward <= slack {
                    "clock_jumps_small"
                } else {
                    "clock_jumps_large"
                }
            }
            k => k.name(),
        }
    }

    /// Uses a resource that ignores fences (the fencing demo's counter-example).
    pub fn unfenced_resource(mut self) -> Self {
        self.fenced_resource = false;
        self
    }

    /// Writes to `resource`, which checks fences itself, instead of the
    /// in-memory resource; the plan then reports as `real_resource`.
    pub fn real_resource(mut self, resource: Arc<dyn RealResource>) -> Self {
        self.real_resource = Some(resource);
        self
    }
}

/// What a fault run did and what the checker found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The harness's name.
    pub backend: &'static str,
    /// The fault.
    pub kind: FaultKind,
    /// Why the fault could not be injected on this backend (then nothing ran).
    pub not_applicable: Option<String>,
    /// The effective TTL.
    pub ttl: Duration,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Faults injected (drops, pauses, jumps, severs…).
    pub faults_injected: u64,
    /// Operations by kind and outcome.
    pub counts: Vec<((OpKind, OpOutcome), usize)>,
    /// The checker's findings.
    pub check: CheckReport,
    /// Whether windows were held to exclusion (off for large forward clock jumps).
    pub exclusive_windows: bool,
    /// What went through the proxy, when one was used.
    pub proxy: Option<ProxyStats>,
}

impl Report {
    /// A report for a fault that cannot be injected on `backend`, saying
    /// why (for harnesses that know better than the driver, e.g. a restart
    /// of a server that keeps its state in memory).
    pub fn inapplicable(
        backend: &'static str,
        kind: FaultKind,
        reason: impl Into<String>,
    ) -> Report {
        Report {
            backend,
            kind,
            not_applicable: Some(reason.into()),
            ttl: Duration::ZERO,
            elapsed: Duration::ZERO,
            faults_injected: 0,
            counts: Vec::new(),
            check: CheckReport::default(),
            exclusive_windows: true,
            proxy: None,
        }
    }

    /// `Ok(self)` when the checker found the history safe, else a failure
    /// naming every violation (what [`run`] returns).
    pub fn into_result(self) -> Result<Report, crate::Failure> {
        if self.check.is_safe() {
            Ok(self)
        } else {
            Err(crate::Failure(self.to_string()))
        }
    }

    /// How many operations of `kind` ended with `outcome`.
    pub fn count(&self, kind: OpKind, outcome: OpOutcome) -> usize {
        self.counts
            .iter()
            .find(|(k, _)| *k == (kind, outcome))
            .map_or(0, |(_, n)| *n)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = &self.not_applicable {
            return write!(
                f,
                "{} {}: not applicable: {r}",
                self.backend,
                self.kind.name()
            );
        }
        write!(
            f,
            "{} {}: {:.2?} at TTL {:?}, {} ops, {} grants, {} unknown, {} dropped by their caller, {} faults, writes {} accepted / {} rejected",
            self.backend,
            self.kind.name(),
            self.elapsed,
            self.ttl,
            self.check.ops,
            self.check.grants,
            self.check.unknown,
            self.check.dropped,
            self.faults_injected,
            self.check.writes_accepted,
            self.check.writes_rejected,
        )?;
        if self.check.retried_unknown_acquires > 0 {
            write!(
                f,
                ", {} unknown acquires retried ({} granted)",
                self.check.retried_unknown_acquires, self.check.retries_granted
            )?;
        }
        if self.check.reacquired_after_unknown_release > 0 {
            write!(
                f,
                ", {} grants acquired again after a release with unknown outcome (no window)",
                self.check.reacquired_after_unknown_release
            )?;
        }
        if !self.exclusive_windows {
            write!(
                f,
                ", {} tolerated overlaps (clock jumps beyond the deadline slack)",
                self.check.tolerated_overlaps
            )?;
        }
        write!(f, "; ")?;
        for (i, ((k, o), n)) in self.counts.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{k} {o} {n}")?;
        }
        if let Some(p) = &self.proxy {
            write!(
                f,
                "; proxy: {} connections, {} requests, {} severed ({} awaiting an answer), {} responses dropped",
                p.connections, p.requests, p.severed, p.severed_awaiting, p.dropped_exchanges
            )?;
        }
        if !self.check.is_safe() {
            write!(f, "\nVIOLATIONS:\n{}", self.check.summary())?;
        }
        Ok(())
    }
}

/// A small deterministic generator (splitmix64) for the run's choices.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// `d` scaled by a factor uniform in `[lo, hi)`.
    pub(crate) fn around(&mut self, d: Duration, lo: f64, hi: f64) -> Duration {
        d.mul_f64(lo + (hi - lo) * self.unit())
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}
