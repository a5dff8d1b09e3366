//! Fault runs on a real MongoDB-compatible server: contenders acquire, renew,
//! write to a fenced resource and release while faults are injected; every
//! recorded history must be safe (no overlapping write windows, fences in
//! order, unknown outcomes counted both ways).

mod common;

use std::time::Duration;

use common::MongoHarness;
use lease_conformance::faults::{self, FaultKind, FaultPlan, Report};
use lease_conformance::{Failure, Harness};

fn plan(kind: FaultKind) -> FaultPlan {
    FaultPlan::new(kind)
        .ttl(Duration::from_secs(1))
        .duration(Duration::from_secs(5))
        .contenders(4)
}

/// Runs `kind`, checks the history is safe and the run did enough, reports
/// the outcome as `fault_<kind>` in the `mongo` column of the conformance
/// matrix, and panics on a failure.
async fn safe_run(h: &MongoHarness, kind: FaultKind) -> Report {
    let p = plan(kind);
    let result = faults::run(h, &p).await.and_then(|report| {
        eprintln!("{report}");
        let fail = |what: &str| Err(Failure(format!("{what}: {report}")));
        if report.not_applicable.is_some() {
            return fail("not applicable");
        }
        // Progress, not safety: enough happened for the check to mean something
        // (a frozen server or a long blackhole leaves room for only a few grants).
        if report.check.grants < 2 {
            return fail("too few grants");
        }
        if report.check.writes_accepted < 5 {
            return fail("too few writes");
        }
        Ok(report)
    });
    match faults::record_plan_status(h.name(), &p, result) {
        Ok(r) => r,
        Err(f) => panic!("unsafe or empty history under {}:\n{f}", kind.name()),
    }
}

async fn shared() -> MongoHarness {
    MongoHarness::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn private() -> MongoHarness {
    MongoHarness::private()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_faults() {
    safe_run(&shared().await, FaultKind::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_responses() {
    let r = safe_run(&shared().await, FaultKind::LostResponses).await;
    assert!(r.faults_injected >= 3, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn latency() {
    safe_run(
        &shared().await,
        FaultKind::Latency(Duration::from_millis(60)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn severed_connections() {
    let r = safe_run(&shared().await, FaultKind::Sever).await;
    assert!(r.faults_injected >= 3, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blackhole() {
    safe_run(
        &shared().await,
        FaultKind::Blackhole(Duration::from_millis(700)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_holders() {
    safe_run(
        &shared().await,
        FaultKind::PausedHolders(Duration::from_millis(1500)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_pause() {
    safe_run(
        &private().await,
        FaultKind::ServerPause(Duration::from_millis(1500)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_restart() {
    safe_run(&private().await, FaultKind::ServerRestart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inapplicable_kinds_say_why() {
    let h = shared().await;
    let ttl = plan(FaultKind::None).ttl;
    let clock = "the server's clock ($$NOW) is the time authority and not the test's to move";
    for (kind, reason) in [
        (
            FaultKind::FailedRequests,
            "the client has no hook to refuse a request before sending it (a wrapper \
             above the backend would run none of its code); severed connections and \
             blackholes lose requests on the way instead",
        ),
        (
            FaultKind::ClockJumps {
                forward: ttl / 4,
                backward: ttl,
            },
            clock,
        ),
        (
            FaultKind::ClockJumps {
                forward: ttl,
                backward: ttl / 2,
            },
            clock,
        ),
    ] {
        let p = plan(kind);
        // The driver itself refuses these kinds on this harness …
        let r = faults::run(&h, &p).await.unwrap_or_else(|f| panic!("{f}"));
        assert!(r.not_applicable.is_some(), "{} ran: {r}", p.status_name());
        eprintln!("{r}");
        // … and the matrix says why in this backend's terms.
        let report = Report::inapplicable(h.name(), kind, reason);
        faults::record_plan_status(h.name(), &p, Ok(report)).unwrap_or_else(|f| panic!("{f}"));
    }
}
