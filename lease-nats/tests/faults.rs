//! Fault runs on a real nats-server: contenders acquire, renew, write to a
//! fenced resource and release while faults are injected (through a proxy in
//! front of the server, or on the server process); every recorded history
//! must be safe: no overlapping write windows, fences in order, unknown
//! outcomes counted both ways.

mod support;

use std::time::Duration;

use lease_conformance::faults::{self, FaultKind, FaultPlan, Report};
use support::harness::NatsHarness;

fn plan(kind: FaultKind) -> FaultPlan {
    FaultPlan::new(kind)
        .ttl(Duration::from_secs(2))
        .duration(Duration::from_secs(8))
        .contenders(4)
}

async fn safe_run(h: &NatsHarness, kind: FaultKind) -> Report {
    let report = match faults::run(h, &plan(kind)).await {
        Ok(r) => r,
        Err(f) => panic!("unsafe history under {}:\n{f}", kind.name()),
    };
    eprintln!("{report}");
    assert!(report.not_applicable.is_none(), "{report}");
    assert!(report.check.grants >= 2, "too few grants: {report}");
    assert!(
        report.check.writes_accepted >= 5,
        "too few writes: {report}"
    );
    report
}

async fn shared() -> NatsHarness {
    NatsHarness::start().await.unwrap_or_else(|e| panic!("{e}"))
}

async fn private() -> NatsHarness {
    NatsHarness::private()
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
        FaultKind::Blackhole(Duration::from_millis(1500)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_holders() {
    safe_run(
        &shared().await,
        FaultKind::PausedHolders(Duration::from_millis(2500)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_pause() {
    safe_run(
        &private().await,
        FaultKind::ServerPause(Duration::from_millis(2500)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_restart() {
    safe_run(&private().await, FaultKind::ServerRestart).await;
}
