//! Fault runs on a real MongoDB-compatible server: contenders acquire, renew,
//! write to a fenced resource and release while faults are injected; every
//! recorded history must be safe (no overlapping write windows, fences in
//! order, unknown outcomes counted both ways).

mod common;

use std::time::Duration;

use common::MongoHarness;
use lease_conformance::faults::{self, FaultKind, FaultPlan, Report};

fn plan(kind: FaultKind) -> FaultPlan {
    FaultPlan::new(kind)
        .ttl(Duration::from_secs(1))
        .duration(Duration::from_secs(5))
        .contenders(4)
}

async fn safe_run(h: &MongoHarness, kind: FaultKind) -> Report {
    let report = match faults::run(h, &plan(kind)).await {
        Ok(r) => r,
        Err(f) => panic!("unsafe history under {}:\n{f}", kind.name()),
    };
    eprintln!("{report}");
    assert!(report.not_applicable.is_none(), "{report}");
    // Progress, not safety: enough happened for the check to mean something
    // (a frozen server or a long blackhole leaves room for only a few grants).
    assert!(report.check.grants >= 2, "too few grants: {report}");
    assert!(
        report.check.writes_accepted >= 5,
        "too few writes: {report}"
    );
    report
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
