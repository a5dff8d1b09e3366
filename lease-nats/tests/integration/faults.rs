//! Fault runs on a real nats-server: contenders acquire, renew, write to a
//! fenced resource and release while faults are injected (through a proxy in
//! front of the server, or on the server process); every recorded history
//! must be safe: no overlapping write windows, fences in order, unknown
//! outcomes counted both ways. The tests themselves are
//! `lease_conformance::fault_tests!`.

use std::time::Duration;

use crate::common::harness::NatsHarness;
use lease_conformance::faults::{FaultKind, FaultPlan, FaultTuning};

fn plan(kind: FaultKind) -> FaultPlan {
    FaultPlan::new(kind)
        .ttl(Duration::from_secs(2))
        .duration(Duration::from_secs(8))
        .contenders(4)
}

async fn shared() -> NatsHarness {
    NatsHarness::start().await.unwrap_or_else(|e| panic!("{e}"))
}

async fn private() -> NatsHarness {
    NatsHarness::private()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

lease_conformance::fault_tests!(
    shared(),
    private(),
    FaultTuning {
        plan,
        blackhole: Duration::from_millis(1500),
        paused_holders: Duration::from_millis(2500),
        server_pause: Duration::from_millis(2500),
        clock: "the wall clock that judges message TTLs (Nats-TTL); Go reads it through the vDSO, out of libfaketime's reach, so only a step of the whole machine's clock could move it",
        resource: lease_testkit::resources::in_memory_store,
    }
);
