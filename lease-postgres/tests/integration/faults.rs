//! Fault runs on a real PostgreSQL server: contenders acquire, renew,
//! write to a fenced resource and release while faults are injected; every
//! recorded history must be safe (no overlapping write windows, fences in
//! order, unknown outcomes counted both ways). The tests themselves are
//! `lease_conformance::fault_tests!`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::harness::PostgresHarness;
use lease_conformance::faults::{FaultKind, FaultPlan, FaultTuning};
use lease_conformance::history::{RealResource, WriteFuture};
use lease_core::Fence;
use lease_fence::postgres::{PgFenceError, PgFences};
use tokio::sync::Mutex;

/// The real resource: a table in the same PostgreSQL, each write admitted
/// by `lease_fence`'s `PgFences` in the write's own transaction.
struct PgResource {
    client: Mutex<tokio_postgres::Client>,
    fences: PgFences,
    table: String,
}

impl std::fmt::Debug for PgResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgResource")
            .field("table", &self.table)
            .finish()
    }
}

impl RealResource for PgResource {
    fn write<'a>(&'a self, key: &'a str, holder: &'a str, fence: Fence) -> WriteFuture<'a> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            let tx = client.transaction().await.map_err(|e| e.to_string())?;
            match self.fences.admit(&tx, key, fence).await {
                Ok(()) => {}
                Err(PgFenceError::Stale(_)) => return Ok(false),
                Err(e) => return Err(e.to_string()),
            }
            let value = i64::try_from(fence.get()).map_err(|e| e.to_string())?;
            tx.execute(
                &format!(
                    "INSERT INTO {} (key, holder, fence) VALUES ($1, $2, $3)",
                    self.table
                ),
                &[&key, &holder, &value],
            )
            .await
            .map_err(|e| e.to_string())?;
            tx.commit().await.map_err(|e| e.to_string())?;
            Ok(true)
        })
    }
}

async fn pg_resource() -> Result<Arc<dyn RealResource>, String> {
    let url = crate::common::server_url()?;
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let fences =
        PgFences::with_table(&crate::common::unique("fences")).map_err(|e| e.to_string())?;
    fences.migrate(&client).await.map_err(|e| e.to_string())?;
    let table = crate::common::unique("writes");
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (key text NOT NULL, holder text NOT NULL, fence bigint NOT NULL)"
        ))
        .await
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(PgResource {
        client: Mutex::new(client),
        fences,
        table,
    }))
}

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
        resource: || Box::pin(pg_resource()),
    }
);
