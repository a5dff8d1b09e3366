//! Fault runs on the in-memory fake: every fault kind the fake supports
//! keeps every recorded history safe, the kinds it cannot support say so,
//! and broken variants of the fake make the same runs fail.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_conformance::faults::{self, FaultHooks, FaultKind, FaultPlan, Report};
use lease_conformance::history::{
    FenceFuture, OpKind, OpOutcome, RealResource, ViolationKind, WriteFuture,
};
use lease_conformance::properties::LateRelease;
use lease_conformance::{Failure, FakeHarness, Harness};
use lease_core::{
    Acquire, AcquireRequest, BoxFuture, Error, Fence, Grant, LeaseBackend, LeaseLayer, Payload,
    Renewal,
};
use lease_fake::Fake;

const TTL: Duration = Duration::from_millis(300);
const RUN: Duration = Duration::from_secs(3);

fn plan(kind: FaultKind) -> FaultPlan {
    FaultPlan::new(kind)
        .ttl(TTL)
        .duration(RUN)
        .contenders(4)
        .elections(2)
}

/// Runs `plan`, checks the run was safe and did enough, reports the
/// outcome to the conformance matrix under the plan's status name
/// (`fault_clock_jumps_small`, …), and panics on a failure.
async fn safe_run(h: &dyn Harness, plan: FaultPlan) -> Report {
    let started = Instant::now();
    let result = vet(&plan, started, faults::run(h, &plan).await);
    unwrap(faults::record_plan_status(h.name(), &plan, result))
}

/// As [`safe_run`], without reporting (a variant of a kind another test
/// reports already).
async fn safe_unreported_run(h: &dyn Harness, plan: FaultPlan) -> Report {
    let started = Instant::now();
    unwrap(vet(&plan, started, faults::run(h, &plan).await))
}

fn unwrap(result: Result<Report, Failure>) -> Report {
    match result {
        Ok(r) => r,
        Err(f) => panic!("fault run failed:\n{f}"),
    }
}

/// A safe run must also have run (not "not applicable"), within its time,
/// and done enough for the check to mean something.
fn vet(
    plan: &FaultPlan,
    started: Instant,
    result: Result<Report, Failure>,
) -> Result<Report, Failure> {
    let report = result?;
    eprintln!("{report}");
    let fail = |what: String| Err(Failure(format!("{what}: {report}")));
    if report.not_applicable.is_some() {
        return fail("not applicable on the fake".into());
    }
    if started.elapsed() >= plan.duration + Duration::from_secs(3) {
        return fail(format!("the run took {:?}", started.elapsed()));
    }
    if report.check.grants < 3 {
        return fail("too few grants".into());
    }
    if report.check.writes_accepted < 10 {
        return fail("too few writes".into());
    }
    Ok(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_faults() {
    let p = plan(FaultKind::None);
    let elections = p.elections;
    let r = safe_run(&FakeHarness::new(), p).await;
    assert_eq!(r.check.unknown, 0);
    if let Err(why) = lease_conformance::faults::tests_macro::dropped_within_terms(&r, elections) {
        panic!("{why}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delayed_releases() {
    let p = plan(FaultKind::None);
    let ttl = p.ttl;
    let r = safe_run(
        &FakeHarness::new(),
        plan(FaultKind::DelayedReleases(ttl / 4)),
    )
    .await;
    assert!(r.faults_injected >= 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_responses() {
    let r = safe_run(&FakeHarness::new(), plan(FaultKind::LostResponses)).await;
    assert!(r.faults_injected >= 5, "{r}");
    assert!(r.check.unknown >= 3, "few unknown outcomes: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_requests() {
    let r = safe_run(
        &FakeHarness::new(),
        plan(FaultKind::FailedRequests).duration(Duration::from_secs(4)),
    )
    .await;
    assert!(r.check.unknown >= 3, "few failed requests: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn latency() {
    let r = safe_run(
        &FakeHarness::new(),
        plan(FaultKind::Latency(Duration::from_millis(60))),
    )
    .await;
    assert_eq!(r.faults_injected, 1);
}

/// lease-fence's in-memory rule as the fake's real resource: the one a
/// resource written in Rust would use.
#[derive(Debug, Default)]
struct InMemoryFences(lease_fence::Fences);

impl RealResource for InMemoryFences {
    fn write<'a>(&'a self, key: &'a str, _: &'a str, fence: Fence) -> WriteFuture<'a> {
        Box::pin(async move { Ok(self.0.check(key, fence).is_ok()) })
    }

    fn fence<'a>(&'a self, key: &'a str) -> FenceFuture<'a> {
        Box::pin(async move { Ok(self.0.seen(key)) })
    }
}

/// A store whose conditional write lost its condition: it reads the fence,
/// refuses a lower one, then — some milliseconds later, as a store's read
/// and its put are two requests — writes unconditionally. One write at a
/// time it refuses every stale write (the row's probe passes); concurrent
/// writers race through the gap, and a stale write lands after a newer one.
#[derive(Debug, Default)]
struct CheckThenWrite(Mutex<std::collections::HashMap<String, Fence>>);

impl RealResource for CheckThenWrite {
    fn write<'a>(&'a self, key: &'a str, _: &'a str, fence: Fence) -> WriteFuture<'a> {
        Box::pin(async move {
            let seen = self.0.lock().unwrap().get(key).copied();
            if seen.is_some_and(|seen| fence < seen) {
                return Ok(false);
            }
            // A third of a TTL: long enough that a holder waking from its
            // pause often checks before its successor's first write lands.
            tokio::time::sleep(TTL / 3).await;
            self.0.lock().unwrap().insert(key.to_owned(), fence);
            Ok(true)
        })
    }

    fn fence<'a>(&'a self, key: &'a str) -> FenceFuture<'a> {
        Box::pin(async move { Ok(self.0.lock().unwrap().get(key).copied()) })
    }
}

/// Concurrent writes reach a real resource at once, and a stale write that
/// a non-atomic check let land after a newer one is found in the history —
/// by reading the resource back, since both writers were told "accepted".
/// A resource whose check is atomic leaves the same writes safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_to_a_real_resource_show_a_check_that_is_not_atomic() {
    use lease_conformance::history::{check, CheckOptions, FencedResource, History};
    for racy in [true, false] {
        let history = History::new();
        let store: Arc<dyn RealResource> = if racy {
            Arc::new(CheckThenWrite::default())
        } else {
            Arc::new(InMemoryFences::default())
        };
        let resource = Arc::new(FencedResource::real(history.clone(), store));
        let now = Instant::now();
        let newer = {
            let r = resource.clone();
            tokio::spawn(async move { r.write_as("b", "k", Fence(6), now).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let older = resource.write_as("a", "k", Fence(5), now).await;
        let newer = newer.await.expect("task");
        let report = check(&history.ops(), &CheckOptions::default());
        if racy {
            assert!(newer && older, "the gap lets both through");
            assert!(
                report
                    .violations
                    .iter()
                    .any(|v| v.kind == ViolationKind::StaleWriteAccepted),
                "{}",
                report.summary()
            );
        } else {
            assert!(newer, "the newer write is accepted");
            assert!(report.is_safe(), "{}", report.summary());
        }
    }
}

/// The row's concurrent probe fails a store whose check is not atomic with
/// its write, although one write at a time it refuses every stale write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[should_panic(expected = "let concurrent writes through out of order")]
async fn a_real_resource_whose_check_is_not_atomic_fails_the_row() {
    let h = FakeHarness::new();
    faults::real_resource_row(
        "fake_racy_resource",
        &h,
        plan(FaultKind::PausedHolders(TTL * 3 / 2)).duration(Duration::from_secs(4)),
        Box::pin(async { Ok(Arc::new(CheckThenWrite::default()) as Arc<dyn RealResource>) }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_resource() {
    let h = FakeHarness::new();
    faults::real_resource_row(
        h.name(),
        &h,
        plan(FaultKind::PausedHolders(TTL * 3 / 2)).duration(Duration::from_secs(4)),
        Box::pin(async { Ok(Arc::new(InMemoryFences::default()) as Arc<dyn RealResource>) }),
    )
    .await;
}

/// A real resource that forgot its check fails the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[should_panic(expected = "does not check fences")]
async fn a_real_resource_without_a_check_fails_the_row() {
    #[derive(Debug)]
    struct AcceptsAll;
    impl RealResource for AcceptsAll {
        fn write<'a>(&'a self, _: &'a str, _: &'a str, _: Fence) -> WriteFuture<'a> {
            Box::pin(async { Ok(true) })
        }
    }
    faults::real_resource_row(
        "fake_broken_resource",
        &FakeHarness::new(),
        plan(FaultKind::PausedHolders(TTL * 3 / 2)),
        Box::pin(async { Ok(Arc::new(AcceptsAll) as Arc<dyn RealResource>) }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_holders() {
    let r = safe_run(
        &FakeHarness::new(),
        plan(FaultKind::PausedHolders(TTL * 3 / 2)).duration(Duration::from_secs(4)),
    )
    .await;
    assert!(r.faults_injected >= 3, "few pauses: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn small_clock_jumps_keep_exclusion() {
    // Forward jumps within the slack between deadline (2/3 TTL) and TTL.
    let r = safe_run(
        &FakeHarness::new(),
        plan(FaultKind::ClockJumps {
            forward: TTL / 4,
            backward: TTL,
        }),
    )
    .await;
    assert!(r.exclusive_windows);
    assert!(r.faults_injected >= 3, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_clock_jumps_are_caught_by_the_fence() {
    // A forward jump of a whole TTL expires grants under their holders'
    // feet: windows may overlap (counted, not failed), and the fenced
    // resource must still refuse every stale write.
    let r = safe_run(
        &FakeHarness::new(),
        plan(FaultKind::ClockJumps {
            forward: TTL,
            backward: TTL / 2,
        }),
    )
    .await;
    assert!(!r.exclusive_windows);
    assert!(r.faults_injected >= 3, "{r}");
}

/// The fake, its clock stepped the way a server under libfaketime 0.9.10 is
/// (`lease_testkit`'s `ServerClock`): the server reads the clock at the
/// offset the test stepped it to, except now and then, when it reads the
/// true time. libfaketime re-reads its offset file on every clock call
/// through buffers every thread shares; a thread that reads the path while
/// another rewrites it opens nothing and falls back to no offset at all. A
/// SecantusDB under 12 busy connections, its clock stepped 3.25 s back
/// and left there, answered 8 of 16,599 `$$NOW`s 3.25 s ahead.
///
/// Here every 10 ms the clock shows the true time (the fake's own time
/// minus the steps made so far) for 2 ms.
struct TrueTimeGlitches {
    inner: FakeHarness,
    /// The steps made so far, in ms (negative: behind the true time); its
    /// lock also keeps a step out of a glitch.
    offset: Arc<Mutex<i64>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl TrueTimeGlitches {
    fn new() -> TrueTimeGlitches {
        let inner = FakeHarness::new();
        // Far from zero, so no backward step saturates.
        inner.fake.set(Duration::from_secs(3600));
        let offset = Arc::new(Mutex::new(0_i64));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (fake, off, halt) = (inner.fake.clone(), offset.clone(), stop.clone());
        std::thread::spawn(move || {
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(8));
                let guard = off.lock().unwrap();
                let o = *guard;
                let by = Duration::from_millis(o.unsigned_abs());
                // To the true time and back (forward moves by `advance`, so
                // the run's ticking is never lost on that side).
                if o < 0 {
                    fake.advance(by);
                } else {
                    fake.set(fake.now().saturating_sub(by));
                }
                std::thread::sleep(Duration::from_millis(2));
                if o < 0 {
                    fake.set(fake.now().saturating_sub(by));
                } else {
                    fake.advance(by);
                }
                drop(guard);
            }
        });
        TrueTimeGlitches {
            inner,
            offset,
            stop,
        }
    }
}

impl Drop for TrueTimeGlitches {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Harness for TrueTimeGlitches {
    fn name(&self) -> &'static str {
        "fake-true-time-glitches"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        self.inner.client()
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        self.inner.pass(d)
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }
}

impl FaultHooks for TrueTimeGlitches {
    fn advance_clock(&self, by: Duration) -> bool {
        self.inner.advance_clock(by)
    }

    fn jump_clock(&self, by: Duration, forward: bool) -> bool {
        let mut offset = self.offset.lock().unwrap();
        let ms = i64::try_from(by.as_millis()).unwrap();
        *offset += if forward { ms } else { -ms };
        self.inner.jump_clock(by, forward)
    }

    fn clock_reads_true_time(&self) -> bool {
        true
    }
}

/// The small clock steps every backend behind a real server runs
/// (`fault_tests!`'s `server_clock_steps_small`) keep write windows
/// exclusive on a server that reads the true time now and then: what the
/// row injects stays within the slack between deadline and TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn small_server_clock_steps_stay_within_the_slack_when_the_server_reads_true_time() {
    let h = TrueTimeGlitches::new();
    let r = safe_unreported_run(
        &h,
        plan(faults::server_clock_steps_kind(
            TTL,
            false,
            h.clock_reads_true_time(),
        )),
    )
    .await;
    assert!(r.exclusive_windows, "{r}");
    assert!(r.faults_injected >= 3, "{r}");
}

/// Why they must: forward by a quarter TTL and back by a whole one leaves
/// the server's clock further behind the true time at each round, and a
/// server that reads the true time then jumps forward by all of it at once
/// (the overlapping windows of the Mongo rehearsals); the checker sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clock_steps_drifting_behind_break_exclusion_when_the_server_reads_true_time() {
    must_fail(
        &TrueTimeGlitches::new(),
        plan(FaultKind::ClockJumps {
            forward: TTL / 4,
            backward: TTL,
        }),
        &[ViolationKind::Overlap, ViolationKind::EarlyExpiry],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_keys() {
    safe_unreported_run(
        &FakeHarness::new(),
        plan(FaultKind::LostResponses).keys(3).contenders(6),
    )
    .await;
}

/// The fake behind a network that holds every release until its caller
/// gave up on it (outcome unknown) and delivers it `delay` later, as a
/// blackhole does when it lifts.
struct LateReleases {
    inner: FakeHarness,
    delay: Duration,
}

impl Harness for LateReleases {
    fn name(&self) -> &'static str {
        "fake-late-releases"
    }
    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        let c: Arc<dyn LeaseBackend> =
            LateRelease::new(Arc::new(self.inner.fake.clone()), self.delay);
        Box::pin(async move { Ok(c) })
    }
    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        self.inner.pass(d)
    }
    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        self.inner.fault_hooks()
    }
}

/// A release whose outcome is unknown may still land later. A holder that
/// acquires again under the same holder id while it is on its way gets
/// the same grant back (the contract's re-acquire by a live grant's
/// holder), and the late release then frees the key under it: that holder
/// has no exclusive write window, whatever it believes. The contenders
/// take a new holder id per term (as a keeper does), so every window the
/// checker opens is one the contract guarantees, and the run is safe; the
/// checker opens no window for a grant re-acquired after its release's
/// outcome was unknown (and counts such re-acquires: none here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn releases_that_land_after_their_timeout_end_no_later_term() {
    let h = LateReleases {
        inner: FakeHarness::new(),
        // Contenders acquire again 0.2-0.5 TTL after a release: most late
        // releases land after that, while the grant they release still lives.
        delay: TTL.mul_f64(0.45),
    };
    let p = plan(FaultKind::None)
        .elections(0)
        .shared(0)
        .permits(0)
        .duration(Duration::from_secs(4));
    let r = safe_unreported_run(&h, p).await;
    let late = r
        .counts
        .iter()
        .find(|((k, o), _)| *k == OpKind::Release && *o == OpOutcome::Unknown)
        .map_or(0, |(_, n)| *n);
    assert!(late >= 3, "few late releases: {r}");
    assert_eq!(
        r.check.reacquired_after_unknown_release, 0,
        "contenders acquired a grant again after its release's outcome was unknown: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn network_and_server_faults_are_not_applicable_on_the_fake() {
    let h = FakeHarness::new();
    for kind in [
        FaultKind::Sever,
        FaultKind::Blackhole(TTL),
        FaultKind::ServerPause(TTL),
        FaultKind::ServerRestart,
    ] {
        let started = Instant::now();
        let p = plan(kind);
        let r = faults::run(&h, &p)
            .await
            .expect("not applicable is no failure");
        let reason = r.not_applicable.clone();
        assert!(reason.is_some(), "{kind:?} ran on the fake: {r}");
        // The matrix says why in the fake's terms.
        let why = Report::inapplicable(
            h.name(),
            kind,
            "in-process fake: no connection to sever or blackhole, no server process \
             (its own hooks inject lost responses, failed requests, latency and clock jumps)",
        );
        faults::record_plan_status(h.name(), &p, Ok(why)).expect("recorded");
        assert!(started.elapsed() < Duration::from_millis(100));
        eprintln!("{r}");
    }
}

// ---- the same runs must fail on broken fakes ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Defect {
    /// Renew succeeds whoever holds the key now.
    RenewSucceedsAfterTakeover,
    /// The grant's deadline counts from the answer, not the send; the
    /// transport below is slow both ways.
    DeadlineFromAnswer,
}

struct Broken {
    fake: Fake,
    defect: Defect,
    /// DeadlineFromAnswer: delays on the way to and from the store.
    slow: Mutex<u64>,
}

impl Broken {
    /// Network delay for one leg: 40% none, else 0.3 to 0.55 TTL.
    fn leg(&self) -> Duration {
        if self.defect != Defect::DeadlineFromAnswer {
            return Duration::ZERO;
        }
        let mut s = self.slow.lock().unwrap();
        *s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let x = (*s >> 33) % 100;
        if x < 40 {
            Duration::ZERO
        } else {
            TTL.mul_f64(0.3 + (x - 40) as f64 / 240.0)
        }
    }

    fn restamp(&self, g: Grant) -> Grant {
        match self.defect {
            Defect::DeadlineFromAnswer => g.renewed(Instant::now(), g.version().clone()),
            _ => g,
        }
    }
}

impl LeaseLayer for Broken {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            tokio::time::sleep(self.leg()).await;
            let r = self.fake.try_acquire(req).await;
            tokio::time::sleep(self.leg()).await;
            Ok(match r? {
                Acquire::Granted(g) => Acquire::Granted(self.restamp(g)),
                held => held,
            })
        })
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let sent = Instant::now();
            tokio::time::sleep(self.leg()).await;
            let r = self.fake.renew(grant, payload).await;
            tokio::time::sleep(self.leg()).await;
            Ok(match r? {
                Renewal::Renewed(g) => Renewal::Renewed(self.restamp(g)),
                Renewal::Lost if self.defect == Defect::RenewSucceedsAfterTakeover => {
                    Renewal::Renewed(grant.renewed(sent, grant.version().clone()))
                }
                lost => lost,
            })
        })
    }
}

struct BrokenHarness {
    inner: FakeHarness,
    backend: Arc<Broken>,
}

impl BrokenHarness {
    fn new(defect: Defect) -> BrokenHarness {
        let inner = FakeHarness::new();
        let backend = Arc::new(Broken {
            fake: inner.fake.clone(),
            defect,
            slow: Mutex::new(7),
        });
        BrokenHarness { inner, backend }
    }
}

impl Harness for BrokenHarness {
    fn name(&self) -> &'static str {
        "broken-fake"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        let c: Arc<dyn LeaseBackend> = self.backend.clone();
        Box::pin(async move { Ok(c) })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        self.inner.pass(d)
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(&self.inner)
    }
}

/// Runs a broken backend until the checker catches it, at most three times:
/// whether a defect surfaces in a bounded run depends on scheduling (on a
/// loaded machine one run may see no unlucky interleaving), but a checker
/// that passes three runs in a row is not catching it.
async fn must_fail(h: &dyn Harness, plan: FaultPlan, expected: &[ViolationKind]) {
    let mut runs = Vec::new();
    for _ in 0..3 {
        let report = faults::run_unchecked(h, &plan)
            .await
            .expect("the run starts");
        eprintln!("{report}");
        if report.check.is_safe() {
            runs.push(report.to_string());
            continue;
        }
        assert!(
            expected.iter().any(|k| report.check.found(*k)),
            "expected one of {expected:?}: {report}"
        );
        // `run` turns the same findings into a failure.
        let failure = report.into_result().expect_err("run must fail");
        assert!(failure.0.contains("VIOLATIONS"), "{failure}");
        return;
    }
    panic!(
        "the checker passed a broken backend in {} runs:\n{}",
        runs.len(),
        runs.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_after_takeover_is_caught_under_paused_holders() {
    must_fail(
        &BrokenHarness::new(Defect::RenewSucceedsAfterTakeover),
        plan(FaultKind::PausedHolders(TTL * 3 / 2))
            .duration(Duration::from_secs(4))
            .keys(2)
            .contenders(6),
        &[ViolationKind::Overlap, ViolationKind::FenceRegression],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadline_from_the_answer_is_caught_on_a_slow_network() {
    must_fail(
        &BrokenHarness::new(Defect::DeadlineFromAnswer),
        plan(FaultKind::None)
            .duration(Duration::from_secs(5))
            .keys(2)
            .contenders(6),
        // Shared holders renew one phase grant from several processes: a
        // deadline counted too late there shows as the next phase granted
        // while the last one's window is open, and as overlapping work.
        &[
            ViolationKind::Overlap,
            ViolationKind::EarlyExpiry,
            ViolationKind::DoubleGrant,
            ViolationKind::WorkOverlap,
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unfenced_resource_accepts_stale_writes_under_paused_holders() {
    // The fencing demo: the same paused holders, against a resource that
    // does not check fences, produce stale writes the checker reports;
    // the fenced resource (every other run here) rejects them.
    let h = FakeHarness::new();
    let p = plan(FaultKind::PausedHolders(TTL * 3 / 2))
        .duration(Duration::from_secs(5))
        .keys(2)
        .contenders(6)
        .unfenced_resource();
    let report = faults::run_unchecked(&h, &p).await.expect("the run starts");
    eprintln!("{report}");
    assert!(
        report.check.found(ViolationKind::StaleWriteAccepted),
        "{report}"
    );
    assert!(
        report.count(OpKind::Write, OpOutcome::Lost) == 0,
        "an unfenced resource rejects nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn too_little_progress_fails_after_every_attempt() {
    // One contender for a moment: one grant at most, in every run (and no
    // election candidates, shared holders or permit holders, whose grants
    // would count too).
    let p = plan(FaultKind::None)
        .duration(Duration::from_millis(20))
        .contenders(1)
        .elections(0)
        .shared(0)
        .permits(0);
    let f = faults::run_with_progress(&FakeHarness::new(), &p)
        .await
        .expect_err("a run with one grant is too little");
    assert!(
        f.0.contains(&format!(
            "too few grants in each of {} runs",
            faults::PROGRESS_ATTEMPTS
        )),
        "{f}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_violation_fails_the_first_run_without_retrying() {
    // The unfenced-resource demo above: stale writes are accepted.
    let p = plan(FaultKind::PausedHolders(TTL * 3 / 2))
        .duration(Duration::from_secs(5))
        .keys(2)
        .contenders(6)
        .unfenced_resource();
    let f = faults::run_with_progress(&FakeHarness::new(), &p)
        .await
        .expect_err("stale writes are a violation");
    assert!(f.0.contains("VIOLATIONS"), "{f}");
    assert!(!f.0.contains("in each of"), "a violation was retried: {f}");
}

/// The report's fault rows name every kind a plan can report under, once.
#[test]
fn fault_rows_name_every_kind() {
    let ms = Duration::from_millis;
    let kinds = [
        FaultKind::None,
        FaultKind::LostResponses,
        FaultKind::FailedRequests,
        FaultKind::Latency(ms(1)),
        FaultKind::PausedHolders(ms(1)),
        FaultKind::ClockJumps {
            forward: ms(1),
            backward: ms(1),
        },
        FaultKind::ClockJumps {
            forward: ms(10_000),
            backward: ms(1),
        },
        FaultKind::Sever,
        FaultKind::Blackhole(ms(1)),
        FaultKind::ServerPause(ms(1)),
        FaultKind::ServerRestart,
        FaultKind::DelayedReleases(ms(1)),
    ];
    let mut names: Vec<&str> = kinds
        .into_iter()
        .map(|k| FaultPlan::new(k).status_name())
        .collect();
    names.push(
        FaultPlan::new(FaultKind::PausedHolders(ms(1)))
            .real_resource(Arc::new(InMemoryFences::default()))
            .status_name(),
    );
    assert_eq!(names, faults::FAULT_ROWS);
}
