//! The test server itself: it starts, answers, restarts on its data and
//! pauses.

use lease_testkit::servers;

async fn answers(url: &str) -> Result<i32, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let row = client.query_one("SELECT 1 + 1", &[]).await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn private_server_restarts_on_its_data() {
    let mut pg = servers::spawn_postgres(None).unwrap_or_else(|e| panic!("{e}"));
    let (client, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
        .batch_execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
        .await
        .expect("write");
    pg.restart().expect("restart");
    let (client, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .expect("reconnect");
    tokio::spawn(conn);
    let row = client
        .query_one("SELECT v FROM kept", &[])
        .await
        .expect("read");
    assert_eq!(row.get::<_, i32>(0), 7);
    // A pause freezes the sessions already open too (each has a process of
    // its own, outside the postmaster's process group), not only new ones.
    pg.pause().expect("pause");
    let wait = std::time::Duration::from_millis(500);
    let open = tokio::time::timeout(wait, client.query_one("SELECT 1", &[])).await;
    assert!(
        open.is_err(),
        "an open session of a paused server must not answer"
    );
    let paused = tokio::time::timeout(wait, answers(&pg.url)).await;
    assert!(paused.is_err(), "a paused server must not answer");
    pg.resume().expect("resume");
    assert_eq!(answers(&pg.url).await.expect("answers after resume"), 2);
    let row = client
        .query_one("SELECT 1", &[])
        .await
        .expect("the session goes on");
    assert_eq!(row.get::<_, i32>(0), 1);
}
