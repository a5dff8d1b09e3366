//! Fault runs on a real PostgreSQL server: contenders acquire, renew,
//! write to a fenced resource and release while faults are injected; every
//! recorded history must be safe (no overlapping write windows, fences in
//! order, unknown outcomes counted both ways). The tests themselves are
//! `lease_conformance::fault_tests!`.

use std::time::Duration;

use crate::common::harness::PostgresHarness;
use lease_conformance::faults::{FaultKind, FaultPlan, FaultTuning};

fn plan(kind: FaultKind) -> FaultPlan {
    FaultPlan::new(kind)
        .ttl(Duration::from_secs(1))
        .duration(Duration::from_secs(5))
        .contenders(4)
}

async fn shared() -> PostgresHarness {
    PostgresHarness::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn private() -> PostgresHarness {
    PostgresHarness::private()
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
        clock: "now(), the server's wall clock",
        // A table in the same PostgreSQL, each write admitted by
        // lease-fence's PgFences in the write's own transaction.
        resource: lease_testkit::resources::postgres,
    }
);
