//! Fault runs on a real etcd: contenders acquire, renew, write to a fenced
//! resource and release while faults are injected (through a proxy in front
//! of the server, or on the server process); every recorded history must be
//! safe: no overlapping write windows, fences in order, unknown outcomes
//! counted both ways. The tests themselves are `lease_conformance::fault_tests!`.

use std::time::Duration;

use crate::common::harness::EtcdHarness;
use lease_conformance::faults::{FaultKind, FaultPlan, FaultTuning};

fn plan(kind: FaultKind) -> FaultPlan {
    FaultPlan::new(kind)
        .ttl(Duration::from_secs(1))
        .duration(Duration::from_secs(6))
        .contenders(4)
}

async fn shared() -> EtcdHarness {
    EtcdHarness::start().await.unwrap_or_else(|e| panic!("{e}"))
}

async fn private() -> EtcdHarness {
    EtcdHarness::private()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

lease_conformance::fault_tests!(
    shared(),
    private(),
    FaultTuning {
        plan,
        blackhole: Duration::from_millis(700),
        paused_holders: Duration::from_millis(1500),
        server_pause: Duration::from_millis(1500),
        clock: "etcd lease TTLs, judged on its monotonic clock, which a wall-clock step does not move; Go reads its clocks through the vDSO, out of libfaketime's reach",
        resource: lease_testkit::resources::in_memory_store,
    }
);
