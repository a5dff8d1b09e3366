//! [`fault_tests!`](crate::fault_tests): the fault-run tests every backend
//! behind a real server runs, written once.

use std::time::Duration;

use super::{record_plan_status, run, FaultKind, FaultPlan, Report};
use crate::history::RealResource;
use crate::{Failure, Harness};

/// What a backend's fault runs need beyond its harness: the plan for each
/// kind (TTL, duration, contenders) and how long the timed faults last.
#[derive(Debug, Clone, Copy)]
pub struct FaultTuning {
    /// The plan for a fault kind: TTL, duration, contenders.
    pub plan: fn(FaultKind) -> FaultPlan,
    /// How long each blackhole lasts.
    pub blackhole: Duration,
    /// How long paused holders stay frozen.
    pub paused_holders: Duration,
    /// How long the server process stays stopped.
    pub server_pause: Duration,
    /// What keeps time on the server (e.g. "etcd lease TTLs, on its
    /// monotonic clock"): where the private harness cannot step the server's
    /// clock ([`FaultHooks::jump_clock`](super::FaultHooks::jump_clock)),
    /// the clock-jump rows are n/a, and this says why.
    pub clock: &'static str,
    /// The real resource of the `real_resource` row: a store or database
    /// that checks fences itself (`lease_fence`'s `FencedStore`, `PgFences`,
    /// …), written to by holders paused past their leases.
    pub resource: fn() -> ResourceFuture,
}

/// What [`FaultTuning::resource`] returns: the real resource, or why it
/// could not be had (which fails the row: a test must be able to fail).
pub type ResourceFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<std::sync::Arc<dyn RealResource>, String>> + Send>,
>;

/// Why failed requests are n/a on backends whose client has no hook to
/// refuse a request before sending it.
pub const NO_FAILED_REQUESTS_HOOK: &str =
    "the client has no hook to refuse a request before sending it (a wrapper \
     above the backend would run none of its code); severed connections and \
     blackholes lose requests on the way instead";

/// How many runs a fault plan gets to make enough progress (see
/// [`run_with_progress`]).
pub const PROGRESS_ATTEMPTS: u32 = 3;

/// Runs `plan` on `h` and checks the history is safe and the run did enough
/// for that check to mean something: at least 2 grants and 5 accepted writes.
///
/// Safety is judged on every run and fails at once. Progress depends on
/// how busy the machine is (a loaded CI host, a TTL of 1–2 s and a fault
/// every second can leave room for a single grant), so a safe run that did
/// too little is run again, up to [`PROGRESS_ATTEMPTS`] runs in all; each
/// report is printed.
///
/// # Errors
/// A violation in any run, a fault that is not applicable, or too little
/// progress in every run.
pub async fn run_with_progress(h: &dyn Harness, plan: &FaultPlan) -> Result<Report, Failure> {
    let mut attempt = 1;
    loop {
        let report = run(h, plan).await?;
        eprintln!("{report}");
        if report.not_applicable.is_some() {
            return Err(Failure(format!("not applicable: {report}")));
        }
        let short = if report.check.grants < 2 {
            Some("too few grants")
        } else if report.check.writes_accepted < 5 {
            Some("too few writes")
        } else {
            None
        };
        match short {
            None => return Ok(report),
            Some(what) if attempt < PROGRESS_ATTEMPTS => {
                eprintln!(
                    "{what} in run {attempt} of at most {PROGRESS_ATTEMPTS} (its history was safe): running again"
                );
                attempt += 1;
            }
            Some(what) => {
                return Err(Failure(format!(
                    "{what} in each of {PROGRESS_ATTEMPTS} runs; the last: {report}"
                )))
            }
        }
    }
}

/// Runs `kind` with [`run_with_progress`], reports the outcome as
/// `fault_<kind>` in the harness's column of the conformance matrix, and
/// panics on a failure.
#[doc(hidden)]
pub async fn safe_run(h: &dyn Harness, tuning: &FaultTuning, kind: FaultKind) -> Report {
    let p = (tuning.plan)(kind);
    let result = run_with_progress(h, &p).await;
    match record_plan_status(h.name(), &p, result) {
        Ok(r) => r,
        Err(f) => panic!("unsafe or empty history under {}:\n{f}", kind.name()),
    }
}

/// The baseline run: safe, and the only calls without an answer are those
/// a caller dropped on purpose — at most one per election term (a keeper's
/// renewal in flight when its leader resigned) — see [`dropped_within_terms`].
#[doc(hidden)]
pub async fn no_faults(h: &dyn Harness, tuning: &FaultTuning) {
    let r = safe_run(h, tuning, FaultKind::None).await;
    if let Err(why) = dropped_within_terms(&r, (tuning.plan)(FaultKind::None).elections) {
        panic!("{}: {why}", h.name());
    }
}

/// Whether a run without faults dropped no more calls than its election
/// terms explain: each term ends once, dropping at most one call in flight
/// (its keeper's renewal); with `elections` candidates, a term that ran no
/// work can only be a candidate's last.
///
/// # Errors
/// What was dropped beyond that bound.
pub fn dropped_within_terms(r: &Report, elections: usize) -> Result<(), String> {
    let bound = r.check.work_runs + elections;
    if r.check.dropped > bound {
        return Err(format!(
            "{} calls dropped by their caller without a fault, more than the {} work runs and {elections} candidates explain: {r}",
            r.check.dropped, r.check.work_runs
        ));
    }
    Ok(())
}

/// Releases of the election candidates delayed by a quarter TTL, while each
/// candidate drops its leadership and campaigns again at once: no two
/// holders' windows or work may overlap ([`FaultKind::DelayedReleases`]).
#[doc(hidden)]
pub async fn delayed_releases(h: &dyn Harness, tuning: &FaultTuning) {
    let ttl = (tuning.plan)(FaultKind::None).ttl;
    let r = safe_run(h, tuning, FaultKind::DelayedReleases(ttl / 4)).await;
    // At least one leadership dropped while its release was delayed.
    assert!(r.faults_injected >= 1, "{r}");
}

/// Steps of the server's clock, on a harness that can step it: forward by
/// TTL/4 and back by a TTL (`small`: within the slack between the write
/// deadline and the TTL, so write windows must stay exclusive; back by
/// TTL/4 only where the server may read the true time, see
/// [`server_clock_steps_kind`]), or forward by a whole TTL and back by half
/// (`large`: grants expire under their holders, windows may overlap, and
/// the fenced resource must refuse every stale write). On a harness that
/// cannot, the row is n/a with the backend's reason.
#[doc(hidden)]
pub async fn server_clock_steps(h: &dyn Harness, tuning: &FaultTuning, large: bool) {
    let ttl = (tuning.plan)(FaultKind::None).ttl;
    let true_time = h.fault_hooks().is_some_and(|k| k.clock_reads_true_time());
    let kind = server_clock_steps_kind(ttl, large, true_time);
    let p = (tuning.plan)(kind);
    let steppable = h
        .fault_hooks()
        .is_some_and(|k| k.jump_clock(Duration::ZERO, true));
    if !steppable {
        let r = run(h, &p).await.unwrap_or_else(|f| panic!("{f}"));
        assert!(r.not_applicable.is_some(), "{} ran: {r}", p.status_name());
        let reason = format!(
            "the server's clock ({}) cannot be stepped by the test",
            tuning.clock
        );
        let report = Report::inapplicable(h.name(), kind, &reason);
        eprintln!("{report}");
        record_plan_status(h.name(), &p, Ok(report)).unwrap_or_else(|f| panic!("{f}"));
        return;
    }
    let r = safe_run(h, tuning, kind).await;
    assert!(r.faults_injected >= 3, "{r}");
    // Proof the server's clock moved: a step of a whole TTL expires live
    // grants under their holders, so another holder gets in early.
    assert!(
        !large || r.check.tolerated_overlaps > 0,
        "forward steps of a whole TTL ({ttl:?}) overlapped no grants: did the server's clock move? {r}"
    );
}

/// The clock steps of [`server_clock_steps`] at `ttl`: the small or the
/// large size, on a server that may read the true time now and then
/// ([`FaultHooks::clock_reads_true_time`](super::FaultHooks::clock_reads_true_time))
/// or not.
///
/// Small: forward by TTL/4, back by a TTL; or, on a server that may read
/// the true time, back by TTL/4, which keeps its clock between the true
/// time and TTL/4 ahead of it. A threaded server whose clock the test
/// steps with libfaketime 0.9.10 (preloaded) reads the true time now and
/// then instead of the stepped one: libfaketime re-reads its offset file on
/// every clock call through buffers all threads share, and a thread that
/// reads the path while another rewrites it opens nothing and falls back to
/// no offset (a SecantusDB under 12 busy connections, its clock stepped
/// 3.25 s back and left there, answered 8 of 16,599 `$$NOW`s 3.25 s
/// ahead). Stepping back by a whole TTL leaves the clock 3/4 TTL further
/// behind at each round, so a reading of the true time is a forward step
/// of several TTLs, far beyond the slack (TTL/3 at the default deadline)
/// within which the contract keeps windows exclusive: windows overlapped
/// on lease-mongo in loaded CI rehearsals (a grant renewed 377 ms before
/// another holder's acquire was answered, on a 1 s TTL). Kept within
/// [0, TTL/4] of the true time, no two readings of the server's clock are
/// further apart than that slack, whichever clock it read.
pub fn server_clock_steps_kind(ttl: Duration, large: bool, reads_true_time: bool) -> FaultKind {
    match (large, reads_true_time) {
        (true, _) => FaultKind::ClockJumps {
            forward: ttl,
            backward: ttl / 2,
        },
        (false, false) => FaultKind::ClockJumps {
            forward: ttl / 4,
            backward: ttl,
        },
        (false, true) => FaultKind::ClockJumps {
            forward: ttl / 4,
            backward: ttl / 4,
        },
    }
}

/// Paused holders writing to the backend's real resource
/// ([`FaultTuning::resource`]), reported as `real_resource`; see
/// [`real_resource_row`].
#[doc(hidden)]
pub async fn real_resource(h: &dyn Harness, tuning: &FaultTuning) {
    let plan = (tuning.plan)(FaultKind::PausedHolders(tuning.paused_holders));
    real_resource_row(h.name(), h, plan, (tuning.resource)()).await;
}

/// The `real_resource` row: `plan` (paused holders) run against a real
/// resource, reported under `module`, panicking on a failure. The history
/// checker judges what the resource accepted, so a pass means it accepted
/// no stale write. First the resource must show it refuses one at all (a
/// write at fence 2, then at fence 1, on a key of its own), since a run
/// whose pauses happen to send it none would prove nothing about its check,
/// and that concurrent writes leave it at the higher fence. The run's
/// holders write concurrently ([`FencedResource::real`](crate::history::FencedResource::real)).
pub async fn real_resource_row(
    module: &str,
    h: &dyn Harness,
    plan: FaultPlan,
    resource: ResourceFuture,
) {
    let fail = |why: String| -> ! {
        let _ = record_plan_status(module, &plan, Err(Failure(why.clone())));
        panic!("{module}: {why}");
    };
    let resource = match resource.await {
        Ok(r) => r,
        Err(e) => fail(format!("the real resource is unavailable: {e}")),
    };
    let probe = format!("real-resource-probe/{}", lease_core::HolderId::random());
    let first = resource.write(&probe, "probe", lease_core::Fence(2)).await;
    let stale = resource.write(&probe, "probe", lease_core::Fence(1)).await;
    if first != Ok(true) || stale != Ok(false) {
        fail(format!(
            "{resource:?} does not check fences: a write at fence 2 gave {first:?}, then one at fence 1 gave {stale:?} (expected accepted, then refused)"
        ));
    }
    if let Err(why) = concurrent_probe(resource.as_ref()).await {
        fail(why);
    }
    let plan = plan.real_resource(resource);
    let result = run_with_progress(h, &plan).await;
    if let Err(f) = record_plan_status(module, &plan, result) {
        panic!("{module}: unsafe or empty history with a real resource:\n{f}");
    }
}

/// Writes at fence 4 and, just after it began, at fence 3, at once, on keys
/// of the probe's own: whatever order the resource's check put them in, it
/// must hold fence 4 afterwards if it accepted the write at 4 (a resource
/// that cannot read its fence back, [`RealResource::fence`], is not
/// judged). A store whose check is not atomic with its write lets the
/// write at 3 through the gap and land last.
async fn concurrent_probe(resource: &dyn RealResource) -> Result<(), String> {
    for _ in 0..4 {
        let key = format!("real-resource-probe/{}", lease_core::HolderId::random());
        let (high, _) = tokio::join!(
            resource.write(&key, "probe-newer", lease_core::Fence(4)),
            async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                resource
                    .write(&key, "probe-older", lease_core::Fence(3))
                    .await
            }
        );
        let now = resource.fence(&key).await;
        if let (Ok(true), Ok(Some(now))) = (&high, &now) {
            if *now < lease_core::Fence(4) {
                return Err(format!(
                    "{resource:?} let concurrent writes through out of order: writes at fences 4 and 3 at once, the one at 4 accepted, left it at fence {now}"
                ));
            }
        }
    }
    Ok(())
}

/// Checks the driver refuses failed requests on this harness, and records
/// them as n/a with the backend's reason.
#[doc(hidden)]
pub async fn inapplicable_kinds_say_why(h: &dyn Harness, tuning: &FaultTuning) {
    for (kind, reason) in [(FaultKind::FailedRequests, NO_FAILED_REQUESTS_HOOK)] {
        let p = (tuning.plan)(kind);
        // The driver itself refuses these kinds on this harness …
        let r = run(h, &p).await.unwrap_or_else(|f| panic!("{f}"));
        assert!(r.not_applicable.is_some(), "{} ran: {r}", p.status_name());
        eprintln!("{r}");
        // … and the matrix says why in this backend's terms.
        let report = Report::inapplicable(h.name(), kind, reason);
        record_plan_status(h.name(), &p, Ok(report)).unwrap_or_else(|f| panic!("{f}"));
    }
}

/// Expands to the fault-run tests of a backend behind a real server, one
/// `#[tokio::test]` per kind, at the top level of the calling test file:
/// `no_faults`, `lost_responses`, `latency` (60 ms), `severed_connections`,
/// `blackhole`, `paused_holders` on the shared server (`$shared`),
/// `server_pause`, `server_restart`, `real_resource` (paused holders writing
/// to [`FaultTuning::resource`], on the shared server) and the two sizes of
/// `server_clock_steps` on a private one (`$private`; clock steps are n/a
/// with `clock` as the reason where it cannot step the server's clock), and
/// `inapplicable_kinds_say_why` (failed requests recorded as n/a with the
/// reason). Each run must be safe and make progress (≥ 2
/// grants, ≥ 5 accepted writes; lost responses and severs ≥ 3 faults
/// injected), and reports `fault_<kind>` to the conformance matrix under the
/// harness's name.
///
/// `$shared` and `$private` are async expressions yielding the harness
/// (panicking with a clear message when the server is unavailable);
/// `$tuning` is a [`FaultTuning`](crate::faults::FaultTuning). The calling
/// crate needs `tokio` (with `macros` and `rt-multi-thread`).
///
/// ```ignore
/// lease_conformance::fault_tests!(shared(), private(), FaultTuning {
///     plan,
///     blackhole: Duration::from_millis(700),
///     paused_holders: Duration::from_millis(1500),
///     server_pause: Duration::from_millis(1500),
///     clock: "etcd lease TTLs",
///     resource: lease_testkit::resources::in_memory_store,
/// });
/// // → no_faults, lost_responses, …, inapplicable_kinds_say_why
/// ```
///
/// A harness type with `shared()` and `private()` constructors (async,
/// yielding `Result<Self, String>`) and a `FAULT_TUNING` constant gives
/// the same tests in one line, each failing with the constructor's reason
/// when its server is unavailable:
///
/// ```ignore
/// lease_conformance::fault_tests!(harness: lease_testkit::harness::etcd::EtcdHarness);
/// ```
#[macro_export]
macro_rules! fault_tests {
    (harness: $h:ty $(,)?) => {
        $crate::fault_tests!(
            async { <$h>::shared().await.unwrap_or_else(|e| panic!("{e}")) },
            async { <$h>::private().await.unwrap_or_else(|e| panic!("{e}")) },
            <$h>::FAULT_TUNING
        );
    };
    ($shared:expr, $private:expr, $tuning:expr $(,)?) => {
        const __FAULT_TUNING: $crate::faults::FaultTuning = $tuning;

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn no_faults() {
            let h = $shared.await;
            $crate::faults::tests_macro::no_faults(&h, &__FAULT_TUNING).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn lost_responses() {
            let h = $shared.await;
            let r = $crate::faults::tests_macro::safe_run(
                &h,
                &__FAULT_TUNING,
                $crate::faults::FaultKind::LostResponses,
            )
            .await;
            assert!(r.faults_injected >= 3, "{r}");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn latency() {
            let h = $shared.await;
            $crate::faults::tests_macro::safe_run(
                &h,
                &__FAULT_TUNING,
                $crate::faults::FaultKind::Latency(::std::time::Duration::from_millis(60)),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn severed_connections() {
            let h = $shared.await;
            let r = $crate::faults::tests_macro::safe_run(
                &h,
                &__FAULT_TUNING,
                $crate::faults::FaultKind::Sever,
            )
            .await;
            assert!(r.faults_injected >= 3, "{r}");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn blackhole() {
            let h = $shared.await;
            $crate::faults::tests_macro::safe_run(
                &h,
                &__FAULT_TUNING,
                $crate::faults::FaultKind::Blackhole(__FAULT_TUNING.blackhole),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn paused_holders() {
            let h = $shared.await;
            $crate::faults::tests_macro::safe_run(
                &h,
                &__FAULT_TUNING,
                $crate::faults::FaultKind::PausedHolders(__FAULT_TUNING.paused_holders),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn delayed_releases() {
            let h = $shared.await;
            $crate::faults::tests_macro::delayed_releases(&h, &__FAULT_TUNING).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn server_pause() {
            let h = $private.await;
            $crate::faults::tests_macro::safe_run(
                &h,
                &__FAULT_TUNING,
                $crate::faults::FaultKind::ServerPause(__FAULT_TUNING.server_pause),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn server_restart() {
            let h = $private.await;
            $crate::faults::tests_macro::safe_run(
                &h,
                &__FAULT_TUNING,
                $crate::faults::FaultKind::ServerRestart,
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn server_clock_steps_small() {
            let h = $private.await;
            $crate::faults::tests_macro::server_clock_steps(&h, &__FAULT_TUNING, false).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn server_clock_steps_large() {
            let h = $private.await;
            $crate::faults::tests_macro::server_clock_steps(&h, &__FAULT_TUNING, true).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn real_resource() {
            let h = $shared.await;
            $crate::faults::tests_macro::real_resource(&h, &__FAULT_TUNING).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn inapplicable_kinds_say_why() {
            let h = $shared.await;
            $crate::faults::tests_macro::inapplicable_kinds_say_why(&h, &__FAULT_TUNING).await;
        }
    };
}
