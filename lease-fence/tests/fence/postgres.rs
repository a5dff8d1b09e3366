//! PgFences on a real PostgreSQL server: the fence check and the data write
//! commit or abort together.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Fence, LeaseKey};
use lease_fence::postgres::{PgFenceError, PgFences};
use lease_keeper::Keeper;
use tokio_postgres::{Client, NoTls};

fn url() -> Option<String> {
    match lease_testkit::servers::postgres() {
        Ok(pg) => Some(pg.url.clone()),
        Err(e) if lease_conformance::skip_allowed("postgres") => {
            eprintln!("lease-fence: SKIPPED the PostgreSQL test (LEASE_TEST_SKIP): {e}");
            None
        }
        Err(e) => panic!(
            "PostgreSQL test server unavailable: {e} (run `cargo xtask provision --backend postgres` or set LEASE_TEST_POSTGRES_URL)"
        ),
    }
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A table of its own per test, and fences of its own.
async fn setup(client: &Client, name: &str) -> (PgFences, String) {
    let suffix = lease_core::HolderId::random()
        .to_string()
        .replace(['-', '.'], "_");
    let fences = PgFences::with_table(&format!("fences_{name}_{suffix}")).expect("table name");
    fences.migrate(client).await.expect("migrate");
    fences
        .migrate(client)
        .await
        .expect("migrate twice is harmless");
    let data = format!("data_{name}_{suffix}");
    client
        .batch_execute(&format!(
            "CREATE TABLE {data} (id bigserial PRIMARY KEY, writer text NOT NULL, fence bigint NOT NULL)"
        ))
        .await
        .expect("data table");
    (fences, data)
}

async fn write(
    client: &mut Client,
    fences: &PgFences,
    data: &str,
    writer: &str,
    fence: Fence,
) -> Result<(), PgFenceError> {
    let tx = client.transaction().await.expect("begin");
    fences.admit(&tx, "orders", fence).await?;
    tx.execute(
        &format!("INSERT INTO {data} (writer, fence) VALUES ($1, $2)"),
        &[&writer, &(fence.get() as i64)],
    )
    .await
    .expect("insert");
    tx.commit().await.expect("commit");
    Ok(())
}

async fn rows(client: &Client, data: &str) -> Vec<(String, i64)> {
    client
        .query(
            &format!("SELECT writer, fence FROM {data} ORDER BY id"),
            &[],
        )
        .await
        .expect("select")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Two holders of one lease; the old one paused past its TTL: its late
/// transaction is refused before it writes, the new one's stays committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_transaction_is_refused() {
    let Some(url) = url() else { return };
    let mut old_db = connect(&url).await;
    let mut new_db = connect(&url).await;
    let (fences, data) = setup(&old_db, "paused").await;

    let fake = Arc::new(lease_fake::Fake::new());
    let key = LeaseKey::new("orders/writer").expect("key");
    let old = Keeper::new(fake.clone())
        .acquire(&key)
        .ttl(Duration::from_secs(10))
        .await
        .expect("old holder");
    write(&mut old_db, &fences, &data, "old", old.fence())
        .await
        .expect("old writes");

    assert!(fake.expire(&key), "the old holder is paused past its TTL");
    let new = Keeper::new(fake.clone())
        .acquire(&key)
        .ttl(Duration::from_secs(10))
        .await
        .expect("new holder");
    write(&mut new_db, &fences, &data, "new", new.fence())
        .await
        .expect("new writes");

    match write(&mut old_db, &fences, &data, "old, late", old.fence()).await {
        Err(PgFenceError::Stale(s)) => assert_eq!((s.offered, s.seen), (old.fence(), new.fence())),
        other => panic!("the late write must be refused, got {other:?}"),
    }
    assert_eq!(
        rows(&new_db, &data).await,
        [
            ("old".to_owned(), old.fence().get() as i64),
            ("new".to_owned(), new.fence().get() as i64)
        ]
    );
}

/// A transaction that admits a fence and then aborts leaves nothing behind:
/// neither its write nor its fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_transaction_leaves_no_fence() {
    let Some(url) = url() else { return };
    let mut db = connect(&url).await;
    let (fences, data) = setup(&db, "abort").await;
    write(&mut db, &fences, &data, "first", Fence(3))
        .await
        .expect("first");
    {
        let tx = db.transaction().await.expect("begin");
        fences
            .admit(&tx, "orders", Fence(9))
            .await
            .expect("admitted");
        tx.rollback().await.expect("rollback");
    }
    write(&mut db, &fences, &data, "after the abort", Fence(4))
        .await
        .expect("9 never committed");
    assert_eq!(rows(&db, &data).await.len(), 2);
    assert!(matches!(
        write(&mut db, &fences, &data, "too large", Fence(u64::MAX)).await,
        Err(PgFenceError::FenceTooLarge(_))
    ));
}

/// Writers at many fences at once, each in its own transaction on its own
/// connection: the committed writes, in commit order, never go down, and
/// every refusal names a fence committed above it — the history a
/// sequential check would have left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_leave_the_history_a_sequential_check_would() {
    let Some(url) = url() else { return };
    let db = connect(&url).await;
    let (fences, data) = setup(&db, "concurrent").await;
    let fences = Arc::new(fences);
    let mut tasks = Vec::new();
    for i in 0..24u64 {
        let (url, fences, data) = (url.clone(), fences.clone(), data.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&url).await;
            let fence = Fence((i * 5) % 12 + 1);
            (
                fence,
                write(&mut client, &fences, &data, &format!("w{i}"), fence).await,
            )
        }));
    }
    let mut refused = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            (_, Ok(())) => {}
            (_, Err(PgFenceError::Stale(s))) => refused.push(s),
            (f, Err(e)) => panic!("fence {f}: {e:?}"),
        }
    }
    let committed: Vec<i64> = rows(&db, &data).await.into_iter().map(|(_, f)| f).collect();
    assert!(!committed.is_empty());
    assert!(
        committed.windows(2).all(|w| w[0] <= w[1]),
        "commit order went down: {committed:?}"
    );
    for s in &refused {
        assert!(s.seen > s.offered, "{s}");
        assert!(
            committed.contains(&(s.seen.get() as i64)),
            "{s}: never committed"
        );
    }
    let stored: i64 = db
        .query_one(
            &format!(
                "SELECT fence FROM {} WHERE resource = 'orders'",
                fences.table()
            ),
            &[],
        )
        .await
        .expect("fence row")
        .get(0);
    assert_eq!(Some(&stored), committed.last());
}

/// The same check through sqlx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_transactions_are_checked_the_same_way() {
    let Some(url) = url() else { return };
    let pool = sqlx::PgPool::connect(&url).await.expect("pool");
    let fences = PgFences::with_table(&format!(
        "fences_sqlx_{}",
        lease_core::HolderId::random()
            .to_string()
            .replace(['-', '.'], "_")
    ))
    .expect("table");
    let mut conn = pool.acquire().await.expect("conn");
    fences.migrate_sqlx(&mut conn).await.expect("migrate");
    drop(conn);

    let mut tx = pool.begin().await.expect("begin");
    fences
        .admit_sqlx(&mut tx, "orders", Fence(5))
        .await
        .expect("admitted");
    tx.commit().await.expect("commit");

    let mut tx = pool.begin().await.expect("begin");
    match fences.admit_sqlx(&mut tx, "orders", Fence(4)).await {
        Err(PgFenceError::Stale(s)) => assert_eq!((s.offered, s.seen), (Fence(4), Fence(5))),
        other => panic!("a lower fence must be refused, got {other:?}"),
    }
    tx.rollback().await.expect("rollback");
}

/// Admission must be the transaction's first statement, before any read the
/// write depends on: a newer holder that reads first, then admits, computes
/// its write from a state without the older holder's last accepted update
/// (still uncommitted when it read) and overwrites it. Admitting first makes
/// it wait for the older transaction, then read its committed update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admit_comes_before_the_reads_a_write_depends_on() {
    let Some(url) = url() else { return };
    let mut older = connect(&url).await;
    let mut newer = connect(&url).await;
    for admit_first in [false, true] {
        let (fences, data) = setup(&older, "first_statement").await;
        let counter = format!("{data}_counter");
        older
            .batch_execute(&format!(
                "CREATE TABLE {counter} (id int PRIMARY KEY, n bigint NOT NULL); INSERT INTO {counter} VALUES (1, 0)"
            ))
            .await
            .expect("counter");
        let read = format!("SELECT n FROM {counter} WHERE id = 1");
        let update = format!("UPDATE {counter} SET n = $1 WHERE id = 1");

        // The older holder (fence 1), the right way: admit, read, write.
        let a = older.transaction().await.expect("begin");
        fences
            .admit(&a, "counter", Fence(1))
            .await
            .expect("admitted");
        let n: i64 = a.query_one(&read, &[]).await.expect("read").get(0);
        a.execute(&update, &[&(n + 1)]).await.expect("update");

        let b_fences = fences.clone();
        let (b_read, b_update) = (read.clone(), update.clone());
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let newer_task = async move {
            let b = newer.transaction().await.expect("begin");
            let n: i64 = if admit_first {
                let _ = ready_tx.send(());
                // Waits here for the older transaction to end.
                b_fences
                    .admit(&b, "counter", Fence(2))
                    .await
                    .expect("admitted");
                b.query_one(&b_read, &[]).await.expect("read").get(0)
            } else {
                let n = b.query_one(&b_read, &[]).await.expect("read").get(0);
                let _ = ready_tx.send(());
                b_fences
                    .admit(&b, "counter", Fence(2))
                    .await
                    .expect("admitted");
                n
            };
            b.execute(&b_update, &[&(n + 1)]).await.expect("update");
            b.commit().await.expect("commit");
            newer
        };
        let newer_task = tokio::spawn(newer_task);
        ready.await.expect("the newer holder started");
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.commit()
            .await
            .expect("the older holder's update is accepted");
        newer = newer_task.await.expect("task");

        let n: i64 = older.query_one(&read, &[]).await.expect("read").get(0);
        if admit_first {
            assert_eq!(n, 2, "admitted first: both accepted updates count");
        } else {
            assert_eq!(
                n, 1,
                "read before admitting: the older holder's update was lost"
            );
        }
    }
}
