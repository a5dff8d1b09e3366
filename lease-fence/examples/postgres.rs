//! PgFences: the fence check inside the writer's own PostgreSQL transaction.
//!
//! Run it with
//! `cargo run -p lease-fence --features postgres --example postgres -- postgres://user@host/db`
//! (a database where it may create the tables `lease_fences` and
//! `fence_example_reports`).

use lease_core::Fence;
use lease_fence::postgres::{PgFenceError, PgFences};
use tokio_postgres::NoTls;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: postgres <postgres://user@host/db>")?;
    let (mut client, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(connection);
    let fences = PgFences::new();
    fences.migrate(&client).await?;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS fence_example_reports (id bigserial PRIMARY KEY, body text NOT NULL)")
        .await?;

    for (who, fence) in [("b", Fence(2)), ("a, paused until now", Fence(1))] {
        let tx = client.transaction().await?;
        // The transaction's first statement: before the write, and before
        // every read the write depends on (the count below), so a newer
        // holder waits for an older one's transaction and reads its update.
        match fences.admit(&tx, "reports/daily", fence).await {
            Ok(()) => {
                let earlier: i64 = tx
                    .query_one("SELECT count(*) FROM fence_example_reports", &[])
                    .await?
                    .get(0);
                let body = format!("{who}, after {earlier} earlier reports");
                tx.execute(
                    "INSERT INTO fence_example_reports (body) VALUES ($1)",
                    &[&body],
                )
                .await?;
                tx.commit().await?;
                println!("{who} at fence {fence}: committed");
            }
            Err(PgFenceError::Stale(stale)) => {
                tx.rollback().await?;
                println!("{who} at fence {fence}: refused, rolled back: {stale}");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
