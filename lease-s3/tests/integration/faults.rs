//! Fault runs (`lease_conformance::faults::run`) on the object-store
//! backend: contenders acquire, renew, write to a fenced resource and
//! release while faults are injected; every recorded history must be safe.
//! Each kind reports its status to the conformance matrix, as
//! `fault_<kind>` under `s3_memory` and `s3`:
//!
//! * `s3_memory` — object_store's `InMemory` behind a wrapper: lost
//!   responses are PUTs the wrapper applies and then answers with an error
//!   (acceptable only for the in-memory store, where there is no wire to
//!   lose them on), failed requests are refused by the wrapper before they
//!   reach the store, latency delays each request; paused holders. No
//!   network or server: sever, blackhole, server pause and restart are n/a.
//! * `s3` — moto behind a `FaultProxy`: lost responses are the proxy's
//!   "forward the request, drop the response", plus latency, severed
//!   connections, blackholes, paused holders, failed requests (refused by a
//!   wrapper before they are sent), and a private moto paused with SIGSTOP.
//!   A restart is n/a: moto keeps its state in memory. The rows use the
//!   default client configuration, whose retries (3) absorb most dropped
//!   answers and cut requests (a retried conditional PUT finds its own
//!   landed write); `server_lost_answers_reach_a_client_that_does_not_retry`
//!   runs the same faults without retries, so holders see unknown outcomes.
//!
//! Neither store has a clock the test could move: expiry is judged on each
//! taker's own monotonic clock, so clock jumps are n/a on both.

use std::time::{Duration, Instant};

use crate::common::{or_panic, MemoryFaultHarness, S3FaultHarness};
use lease_conformance::faults::{self, FaultKind, FaultPlan, Report};
use lease_conformance::Harness;

/// The S3 server serves one request at a time: tests sharing it take turns,
/// so one run's load is not another's latency fault.
static SERVER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whole seconds are the backend's TTL granularity; 2 s leaves a deadline
/// of 1.33 s for requests that queue at a server serving one at a time.
const TTL: Duration = Duration::from_secs(2);
const RUN: Duration = Duration::from_secs(8);
const MEMORY_RUN: Duration = Duration::from_secs(6);

fn plan(kind: FaultKind, run: Duration) -> FaultPlan {
    FaultPlan::new(kind).ttl(TTL).duration(run).contenders(4)
}

/// The plan of a run without faults, which must see no unknown outcome
/// from the backend: the object-store protocol makes none by itself. (A
/// resigning election candidate may drop its keeper's renewal in flight;
/// that call is counted apart, in `dropped`.)
fn quiet_plan(run: Duration) -> FaultPlan {
    plan(FaultKind::None, run)
}

/// Runs `plan` on `h` with [`faults::run_with_progress`], reports the
/// outcome under `module` in the conformance matrix, and panics on a failure.
async fn safe_run(module: &str, h: &dyn Harness, plan: FaultPlan) -> Report {
    let started = Instant::now();
    let result = faults::run_with_progress(h, &plan).await;
    eprintln!(
        "{module} {}: whole test {:.2?}",
        plan.status_name(),
        started.elapsed()
    );
    match faults::record_plan_status(module, &plan, result) {
        Ok(r) => r,
        Err(f) => panic!(
            "{module}: unsafe or empty history under {}:\n{f}",
            plan.status_name()
        ),
    }
}

/// Records `kind` as not applicable on `module`, after checking the driver
/// refuses it on `h` too (when given).
async fn not_applicable(module: &str, h: Option<&dyn Harness>, kind: FaultKind, reason: &str) {
    let p = plan(kind, RUN);
    if let Some(h) = h {
        let r = faults::run(h, &p).await.unwrap_or_else(|f| panic!("{f}"));
        assert!(
            r.not_applicable.is_some(),
            "{module}: {} ran: {r}",
            p.status_name()
        );
    }
    let backend = if module == "s3" { "s3" } else { "s3_memory" };
    let report = Report::inapplicable(backend, kind, reason);
    eprintln!("{report}");
    faults::record_plan_status(module, &p, Ok(report)).unwrap_or_else(|f| panic!("{f}"));
}

const NO_CLOCK: &str = "no backend clock to move: an object store has none, and expiry is judged \
                        on each taker's own monotonic clock (a stalled clock is a paused holder)";

// ---- s3_memory ----

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_no_faults() {
    let p = quiet_plan(MEMORY_RUN);
    let elections = p.elections;
    let r = safe_run("s3_memory", &MemoryFaultHarness::new(), p).await;
    assert_eq!(r.check.unknown, 0, "{r}");
    if let Err(why) = faults::tests_macro::dropped_within_terms(&r, elections) {
        panic!("{why}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_delayed_releases() {
    let r = safe_run(
        "s3_memory",
        &MemoryFaultHarness::new(),
        plan(FaultKind::DelayedReleases(TTL / 4), MEMORY_RUN),
    )
    .await;
    // Terms last one to four TTLs: a short run ends few of them.
    assert!(r.faults_injected >= 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_lost_responses() {
    let r = safe_run(
        "s3_memory",
        &MemoryFaultHarness::new(),
        plan(FaultKind::LostResponses, MEMORY_RUN),
    )
    .await;
    assert!(r.faults_injected >= 3, "{r}");
    assert!(r.check.unknown >= 2, "few unknown outcomes: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_failed_requests() {
    let r = safe_run(
        "s3_memory",
        &MemoryFaultHarness::new(),
        plan(FaultKind::FailedRequests, MEMORY_RUN),
    )
    .await;
    assert!(r.faults_injected >= 3, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_latency() {
    safe_run(
        "s3_memory",
        &MemoryFaultHarness::new(),
        plan(FaultKind::Latency(Duration::from_millis(150)), MEMORY_RUN),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_paused_holders() {
    let r = safe_run(
        "s3_memory",
        &MemoryFaultHarness::new(),
        plan(FaultKind::PausedHolders(TTL * 5 / 4), MEMORY_RUN),
    )
    .await;
    assert!(r.faults_injected >= 2, "few pauses: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_real_resource() {
    faults::real_resource_row(
        "s3_memory",
        &MemoryFaultHarness::new(),
        plan(FaultKind::PausedHolders(TTL * 5 / 4), MEMORY_RUN),
        lease_testkit::resources::in_memory_store(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_inapplicable_kinds_say_why() {
    let h = MemoryFaultHarness::new();
    let in_process = "in-process store: no connection to sever or blackhole, no server process";
    for (kind, reason) in [
        (FaultKind::Sever, in_process),
        (FaultKind::Blackhole(TTL), in_process),
        (FaultKind::ServerPause(TTL), in_process),
        (FaultKind::ServerRestart, in_process),
        (
            FaultKind::ClockJumps {
                forward: TTL / 4,
                backward: TTL,
            },
            NO_CLOCK,
        ),
        (
            FaultKind::ClockJumps {
                forward: TTL,
                backward: TTL / 2,
            },
            NO_CLOCK,
        ),
    ] {
        not_applicable("s3_memory", Some(&h), kind, reason).await;
    }
}

// ---- s3 (the S3 server, through a fault proxy) ----

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_no_faults() {
    let _turn = SERVER_TURN.lock().await;
    // Patient holders: on CI's loaded machine an answer can come after the
    // fault runs' 700 ms request timeout (2 to 4 unknown outcomes in one
    // run of three, on the shared server and on a private one alike). That
    // unknown is the timeout's; this run is about the protocol making none.
    let patience = Duration::from_secs(10);
    let p = quiet_plan(RUN).op_timeout(patience);
    let elections = p.elections;
    let mut h = or_panic(S3FaultHarness::shared());
    h.request_timeout = patience;
    let r = safe_run("s3", &h, p).await;
    assert_eq!(r.check.unknown, 0, "{r}");
    if let Err(why) = faults::tests_macro::dropped_within_terms(&r, elections) {
        panic!("{why}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_delayed_releases() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &or_panic(S3FaultHarness::shared()),
        plan(FaultKind::DelayedReleases(TTL / 4), RUN),
    )
    .await;
    assert!(r.faults_injected >= 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_lost_responses() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &or_panic(S3FaultHarness::shared()),
        plan(FaultKind::LostResponses, RUN),
    )
    .await;
    assert!(r.faults_injected >= 3, "{r}");
    let proxy = r.proxy.expect("a proxied run");
    assert!(proxy.dropped_exchanges >= 3, "{r}");
}

/// The same faults with a client that never retries: every dropped answer
/// and cut request reaches the holder as an unknown outcome, so the
/// checker's unknown-outcome rules get exercised on the real server too.
/// Not a matrix row of its own (the rows test the default configuration).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_lost_answers_reach_a_client_that_does_not_retry() {
    let _turn = SERVER_TURN.lock().await;
    let mut h = or_panic(S3FaultHarness::shared());
    h.client_retries = false;
    for kind in [FaultKind::LostResponses, FaultKind::Sever] {
        let p = plan(kind, RUN);
        let r = match faults::run(&h, &p).await {
            Ok(r) => r,
            Err(f) => panic!("s3 without client retries, {}:\n{f}", kind.name()),
        };
        eprintln!("{r} (no client retries)");
        assert!(r.not_applicable.is_none(), "{r}");
        assert!(r.check.grants >= 2, "too few grants: {r}");
        assert!(r.check.unknown >= 3, "few unknown outcomes: {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_failed_requests() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &or_panic(S3FaultHarness::shared()),
        plan(FaultKind::FailedRequests, RUN),
    )
    .await;
    assert!(r.faults_injected >= 3, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_latency() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &or_panic(S3FaultHarness::shared()),
        plan(FaultKind::Latency(Duration::from_millis(60)), RUN),
    )
    .await;
    assert!(r.proxy.is_some(), "latency goes through the proxy: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_severed_connections() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &or_panic(S3FaultHarness::shared()),
        plan(FaultKind::Sever, RUN),
    )
    .await;
    assert!(r.faults_injected >= 3, "{r}");
    // moto closes each connection after its answer: a sever must still
    // have cut some requests in flight, else this run proved nothing.
    let proxy = r.proxy.expect("a proxied run");
    assert!(proxy.severed >= 2, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_blackhole() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &or_panic(S3FaultHarness::shared()),
        // Half a TTL of silence, about once per TTL: long enough that
        // renewals time out, short enough that grants keep changing hands.
        plan(FaultKind::Blackhole(TTL / 2), RUN + RUN / 4),
    )
    .await;
    assert!(r.faults_injected >= 2, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_paused_holders() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &or_panic(S3FaultHarness::shared()),
        plan(FaultKind::PausedHolders(TTL * 5 / 4), RUN),
    )
    .await;
    assert!(r.faults_injected >= 2, "few pauses: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_real_resource() {
    let _turn = SERVER_TURN.lock().await;
    faults::real_resource_row(
        "s3",
        &or_panic(S3FaultHarness::shared()),
        plan(FaultKind::PausedHolders(TTL * 5 / 4), RUN),
        lease_testkit::resources::s3_store(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_pause() {
    // A private moto: freezing the shared one would stall other tests.
    let h = or_panic(S3FaultHarness::private());
    let r = safe_run(
        "s3",
        &h,
        plan(FaultKind::ServerPause(Duration::from_millis(2500)), RUN),
    )
    .await;
    assert!(r.faults_injected >= 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_inapplicable_kinds_say_why() {
    let h = or_panic(S3FaultHarness::shared());
    not_applicable(
        "s3",
        None,
        FaultKind::ServerRestart,
        "moto keeps its state in memory: a restart empties the bucket, losing every lease \
         record and fence counter (no durable backend to restart)",
    )
    .await;
    for kind in [
        FaultKind::ClockJumps {
            forward: TTL / 4,
            backward: TTL,
        },
        FaultKind::ClockJumps {
            forward: TTL,
            backward: TTL / 2,
        },
    ] {
        not_applicable("s3", Some(&h), kind, NO_CLOCK).await;
    }
}
