//! Reaching the server: the test server itself (restart on its data,
//! pause), ACL users from the URL, a wrong port or a silent server failing
//! fast with the cause, and the persistence settings read at connect.

use std::time::{Duration, Instant};

use lease_core::{Error, ErrorChain, HolderId, LeaseBackend, LeaseKey};
use lease_redis::{RedisBackend, RedisConfig};
use lease_testkit::servers::{self, RedisOptions};

use crate::common::{admin, backend, fresh_config, snapshot, unique, url};

#[tokio::test]
async fn the_private_server_restarts_on_its_data_and_pauses() {
    let mut server = servers::spawn_redis(None).unwrap_or_else(|e| panic!("{e}"));
    let mut conn = admin(&server.url).await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("kept")
        .arg("7")
        .query_async(&mut conn)
        .await
        .unwrap();
    server.kill().unwrap();
    server.restart().unwrap();
    let mut conn = admin(&server.url).await.unwrap();
    let v: String = redis::cmd("GET")
        .arg("kept")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, "7", "the append-only file kept it");
    server.pause().unwrap();
    let wait = Duration::from_millis(500);
    let ping = redis::cmd("PING");
    let answer = tokio::time::timeout(wait, ping.query_async::<String>(&mut conn)).await;
    // Unanswered: the client's own response timeout or ours.
    assert!(
        !matches!(answer, Ok(Ok(_))),
        "a paused server must not answer: {answer:?}"
    );
    server.resume().unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn acl_users_come_from_the_url_and_a_wrong_password_is_refused() {
    let server = RedisOptions::new()
        .acl_user("app", "s3cret")
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(server.url.contains("app:s3cret@"), "{}", server.url);
    let b = backend(&server.url, &RedisConfig::new("acl:")).await;
    let key = LeaseKey::new("k").unwrap();
    let g = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    b.release(&g).await.unwrap();

    let wrong = server.url.replace("s3cret", "wrong");
    let e = RedisBackend::connect(&wrong, RedisConfig::new("acl:"))
        .await
        .expect_err("wrong password");
    assert!(
        matches!(e, Error::Backend(_)),
        "a refusal, not an unknown outcome: {e}"
    );
    assert!(
        ErrorChain::new(&e)
            .to_string()
            .contains("authentication failed"),
        "{e}"
    );
    let anonymous = server.url.replace("app:s3cret@", "");
    let e = RedisBackend::connect(&anonymous, RedisConfig::new("acl:"))
        .await
        .expect_err("no user");
    assert!(!e.is_unknown_outcome(), "{e}");

    // A user that may not read the configuration still leases; the
    // persistence settings are then unknown.
    let mut conn = admin(&server.url).await.unwrap();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("-config")
        .query_async(&mut conn)
        .await
        .unwrap();
    let b = backend(&server.url, &RedisConfig::new("acl:")).await;
    assert_eq!(b.persistence().keeps_acknowledged_writes(), None);
    assert!(b.read(&key).await.unwrap().is_free());
}

#[tokio::test]
async fn a_wrong_port_fails_fast_with_the_cause() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let start = Instant::now();
    let e = RedisBackend::connect(&format!("redis://127.0.0.1:{port}"), fresh_config())
        .await
        .expect_err("nothing listens there");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert!(e.is_unknown_outcome(), "{e}");
    let chain = ErrorChain::new(&e).to_string();
    assert!(chain.contains(&format!("127.0.0.1:{port}")), "{chain}");
    assert!(chain.to_lowercase().contains("refused"), "{chain}");
}

/// A server that accepts connections and never answers: connecting gives
/// up at the connect timeout, an operation on a connection that stops
/// answering at the request timeout; neither hangs.
#[tokio::test]
async fn a_silent_server_gives_up_at_the_timeouts() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let config = fresh_config().connect_timeout(Duration::from_millis(300));
    let start = Instant::now();
    let e = RedisBackend::connect(&format!("redis://{addr}"), config)
        .await
        .expect_err("no answer");
    assert!(e.to_string().contains("no answer within 300ms"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    hold.abort();

    let url = url();
    let upstream = lease_testkit::harness::socket_addr(&url).unwrap();
    let proxy = lease_conformance::faults::FaultProxy::start(upstream)
        .await
        .unwrap();
    let via = url.replacen(&upstream.to_string(), &proxy.addr().to_string(), 1);
    let b = RedisBackend::connect(
        &via,
        fresh_config().request_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let key = LeaseKey::new(unique("silent")).unwrap();
    proxy.blackhole(true);
    let start = Instant::now();
    let e = b.read(&key).await.expect_err("no answer");
    assert!(e.is_unknown_outcome(), "{e}");
    assert!(
        start.elapsed() < Duration::from_millis(800),
        "{:?}",
        start.elapsed()
    );
    proxy.blackhole(false);
    // The connection that did not answer was dropped: a new one answers.
    assert!(b.read(&key).await.unwrap().is_free());
}

#[tokio::test]
async fn the_test_server_keeps_every_acknowledged_write() {
    let b = backend(&url(), &fresh_config()).await;
    let p = b.persistence();
    assert_eq!(p.append_only, Some(true));
    assert_eq!(p.append_fsync.as_deref(), Some("always"));
    assert_eq!(p.keeps_acknowledged_writes(), Some(true));
}

/// A user the server refuses one command of a script (ACL): a channel
/// permission missing (Redis 7 gives new users none), or a list command.
/// A Redis script that fails halfway keeps the writes it made, so every
/// operation must be refused before its first write: the keys stay
/// byte-identical, and the refusal is an error, not a grant, renewal,
/// release or break that happened anyway.
#[tokio::test]
async fn a_user_refused_a_command_of_a_script_changes_nothing() {
    let server = RedisOptions::new()
        .acl_user("app", "s3cret")
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let config = RedisConfig::new("acl:");
    let b = backend(&server.url, &config).await;
    let mut admin = admin(&server.url).await.unwrap();
    let held = LeaseKey::new("held").unwrap();
    let free = LeaseKey::new("free").unwrap();
    let g = b
        .try_acquire(b.request(held.clone(), HolderId::random()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let names: Vec<String> = [&held, &free]
        .iter()
        .flat_map(|k| {
            [
                config.lease_key(k),
                config.counter_key(k),
                config.audit_key(k),
            ]
        })
        .collect();
    let mut before = Vec::new();
    for name in &names {
        before.push(snapshot(&mut admin, name).await);
    }
    for rules in [&["resetchannels"][..], &["-rpush"], &["-llen"]] {
        let mut setuser = redis::cmd("ACL");
        setuser.arg("SETUSER").arg("app").arg("&*").arg("+@all");
        for r in rules {
            setuser.arg(*r);
        }
        let _: () = setuser.query_async(&mut admin).await.unwrap();
        let refused = |op: &str, r: Result<(), Error>| match r {
            Err(Error::Backend(e)) => {
                assert!(
                    e.to_string().contains("may not run"),
                    "{rules:?}: {op}: {e}"
                )
            }
            other => panic!("{rules:?}: {op}: expected a refusal, got {other:?}"),
        };
        let payload = lease_core::Payload::new(b"new".to_vec()).unwrap();
        let note = lease_core::BreakNote::new("ops", "acl");
        let me = HolderId::random();
        // Without a channel every script is refused (each publishes); without
        // a list command, a break.
        if rules == ["resetchannels"] {
            refused(
                "acquire",
                b.try_acquire(b.request(free.clone(), me)).await.map(|_| ()),
            );
            refused("renew", b.renew(&g, Some(payload)).await.map(|_| ()));
            refused("release", b.release(&g).await);
        }
        refused("break", b.break_lease(&held, &note).await.map(|_| ()));
        let mut after = Vec::new();
        for name in &names {
            after.push(snapshot(&mut admin, name).await);
        }
        assert_eq!(after, before, "{rules:?}: a refused script wrote");
    }
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("&*")
        .arg("+@all")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(matches!(
        b.renew(&g, None).await.unwrap(),
        lease_core::Renewal::Renewed(_)
    ));
    b.release(&g).await.unwrap();
}

async fn config_set(conn: &mut redis::aio::MultiplexedConnection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

/// A server that evicts keys under memory pressure (a `maxmemory` with a
/// policy other than `noeviction`; managed services often default to
/// `volatile-lru`) evicts a live grant like any key with an expiry: the
/// key is free while its holder may still write. Nothing a client does
/// prevents it, so the backend reports the setting (and warns at connect).
#[tokio::test]
async fn a_server_that_may_evict_live_grants_is_reported() {
    let server = RedisOptions::new()
        .without_persistence()
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut admin = admin(&server.url).await.unwrap();
    let config = RedisConfig::new("evict:");
    let b = backend(&server.url, &config).await;
    assert_eq!(
        b.persistence().may_evict_grants(),
        Some(false),
        "noeviction"
    );
    config_set(&mut admin, "maxmemory-policy", "volatile-lru").await;
    let b = backend(&server.url, &config).await;
    assert_eq!(
        b.persistence().may_evict_grants(),
        Some(false),
        "no memory limit: nothing is evicted"
    );
    config_set(&mut admin, "maxmemory", "1gb").await;
    let b = backend(&server.url, &config).await;
    let p = b.persistence();
    assert_eq!(p.may_evict_grants(), Some(true));
    assert_eq!(p.max_memory_policy.as_deref(), Some("volatile-lru"));

    // What the report is about: a live grant evicted.
    let key = LeaseKey::new("k").unwrap();
    let g = b
        .try_acquire(
            b.request(key.clone(), HolderId::random())
                .ttl(Duration::from_secs(60)),
        )
        .await
        .unwrap()
        .granted()
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut admin)
        .await
        .unwrap();
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory");
    config_set(&mut admin, "maxmemory", &(used + 512 * 1024).to_string()).await;
    let filler = "x".repeat(16 * 1024);
    for i in 0..200 {
        // Keys without an expiry: volatile-lru evicts only keys with one.
        let _ = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&filler)
            .query_async::<()>(&mut admin)
            .await;
        if b.read(&key).await.map(|s| s.is_free()).unwrap_or(false) {
            break;
        }
    }
    config_set(&mut admin, "maxmemory", "0").await;
    assert!(
        b.read(&key).await.unwrap().is_free(),
        "the grant was not evicted"
    );
    assert!(g.may_write(), "its holder still may write");
    assert!(matches!(
        b.try_acquire(b.request(key.clone(), HolderId::random()))
            .await
            .unwrap(),
        lease_core::Acquire::Granted(_)
    ));
}
