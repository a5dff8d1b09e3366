//! NATS-specific behaviour on a real nats-server: expiry seen by watchers,
//! TTLs kept across tombstones and markers, restarts with file storage, and
//! the refusal of servers without per-message TTLs.

use crate::common;

use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, Grant, HolderId, LeaseBackend, LeaseKey, LeaseState, Renewal,
};
use lease_nats::{NatsBackend, NatsConfig};

const SEC: Duration = Duration::from_secs(1);

fn key(name: &str) -> LeaseKey {
    LeaseKey::new(format!("nt/{}/{name}", HolderId::random())).unwrap()
}

async fn shared(bucket: &str) -> NatsBackend {
    let url = common::shared_url().await.unwrap_or_else(|e| panic!("{e}"));
    NatsBackend::connect(&url, NatsConfig::new(bucket).create_bucket(true))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

async fn grant(b: &NatsBackend, key: &LeaseKey, ttl: Duration) -> Grant {
    let req = AcquireRequest::new(key.clone(), HolderId::random()).ttl(ttl);
    match b.try_acquire(req).await.expect("acquire") {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => panic!("{key} unexpectedly held by {}", h.holder),
    }
}

/// Polls until the key reads free; returns how long that took.
async fn until_free(b: &NatsBackend, key: &LeaseKey, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if b.read(key).await.expect("read").is_free() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{key} still held after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_sees_expiry_when_the_server_removes_the_key() {
    let holder = shared("lease-nats-tests").await;
    let watcher = shared("lease-nats-tests").await;
    let k = key("watched");
    let t0 = Instant::now();
    let g = grant(&holder, &k, SEC).await;
    let seen = watcher.read(&k).await.unwrap();
    assert!(matches!(&seen, LeaseState::Held(h) if h.fence == g.fence()));

    // Nobody renews: the server's TTL ends the grant, and its delete marker
    // must wake the watcher without any polling.
    tokio::time::timeout(SEC * 10, watcher.wait_for_change(&k, &seen))
        .await
        .expect("the watcher was not woken by the expiry")
        .expect("watch failed");
    let woke = t0.elapsed();
    eprintln!("watcher woke {woke:?} after an acquire with a 1 s TTL");
    assert!(
        woke >= SEC - Duration::from_millis(50),
        "woke before the TTL: {woke:?}"
    );
    assert!(
        // Generous for loaded CI machines; measured ~1.23 s on an idle one.
        woke <= SEC * 4,
        "woke too late: {woke:?}"
    );
    // Woken because the key is free now, not spuriously.
    assert!(watcher.read(&k).await.unwrap().is_free());

    // The next holder's fence is higher, though the marker is still there.
    let g2 = grant(&watcher, &k, SEC * 10).await;
    assert!(g2.fence() > g.fence(), "{} !> {}", g2.fence(), g.fence());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_wakes_on_release_and_ignores_renewals() {
    let b = shared("lease-nats-tests").await;
    let w = shared("lease-nats-tests").await;
    let k = key("released");
    let g = grant(&b, &k, SEC * 30).await;
    let seen = w.read(&k).await.unwrap();
    let wait = tokio::spawn({
        let w = w.clone();
        let k = k.clone();
        async move {
            w.wait_for_change(&k, &seen).await.unwrap();
            Instant::now()
        }
    });
    // Renewals change the message but not the grant: the watcher keeps waiting.
    let mut g = g;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        g = match b.renew(&g, None).await.unwrap() {
            Renewal::Renewed(g) => g,
            Renewal::Lost => panic!("lost"),
        };
    }
    assert!(!wait.is_finished(), "a renewal woke the watcher");
    let released = Instant::now();
    b.release(&g).await.unwrap();
    let woke = tokio::time::timeout(SEC * 5, wait)
        .await
        .expect("not woken")
        .unwrap();
    let lag = woke.saturating_duration_since(released);
    eprintln!("watcher woke {lag:?} after the release was sent");
    // The goal is 100 ms (measured: under 1 ms); loaded CI machines get slack.
    assert!(
        lag < Duration::from_millis(300),
        "woke {lag:?} after release"
    );
}

/// async-nats' `create` falls back to an update *without* TTL when the key's
/// last message is a tombstone or marker; a lease taken that way would never
/// expire. Ours must expire on every path: fresh key, over an expiry marker,
/// over a release marker, and after renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grant_keeps_its_ttl() {
    let b = shared("lease-nats-tests").await;
    let limit = SEC * 5;

    // Fresh key, expired by the server.
    let k = key("ttl");
    let g1 = grant(&b, &k, SEC).await;
    until_free(&b, &k, limit).await;

    // Over the expiry marker.
    let g2 = grant(&b, &k, SEC).await;
    assert!(g2.fence() > g1.fence());
    until_free(&b, &k, limit).await;

    // Over a release (purge) marker.
    let g3 = grant(&b, &k, SEC * 30).await;
    assert!(g3.fence() > g2.fence());
    b.release(&g3).await.unwrap();
    assert!(b.read(&k).await.unwrap().is_free());
    let g4 = grant(&b, &k, SEC).await;
    assert!(g4.fence() > g3.fence());
    until_free(&b, &k, limit).await;

    // Renewed twice, then abandoned: the last renewal's TTL still runs out.
    let g5 = grant(&b, &k, SEC * 2).await;
    let mut g = g5.clone();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        g = match b.renew(&g, None).await.unwrap() {
            Renewal::Renewed(g) => g,
            Renewal::Lost => panic!("renew lost"),
        };
    }
    let abandoned = Instant::now();
    until_free(&b, &k, limit).await;
    assert!(abandoned.elapsed() >= SEC * 2 - Duration::from_millis(100));
    assert!(matches!(b.renew(&g, None).await.unwrap(), Renewal::Lost));
    let g6 = grant(&b, &k, SEC).await;
    assert!(g6.fence() > g5.fence());
}

/// Re-acquiring our own grant (an answer was lost) extends it on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reacquire_extends_on_the_server() {
    let b = shared("lease-nats-tests").await;
    let k = key("reacquire");
    let me = HolderId::random();
    let req = AcquireRequest::new(k.clone(), me.clone()).ttl(SEC * 2);
    let g1 = b.try_acquire(req.clone()).await.unwrap().granted().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let g2 = b.try_acquire(req).await.unwrap().granted().unwrap();
    assert_eq!(g1.fence(), g2.fence());
    // ~3.1 s after g1: its 2 s TTL is over (the server removes expired
    // messages within ~0.3 s), the re-acquire's runs to ~3.5 s.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(
        !b.read(&k).await.unwrap().is_free(),
        "re-acquire did not extend the TTL"
    );
    // …and it still carries a TTL: the grant runs out without renewals.
    until_free(&b, &k, SEC * 5).await;
}

/// Round trips per operation, counted at the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_operation() {
    let b = shared("lease-nats-tests").await;
    let other = shared("lease-nats-tests").await;
    let stranger = shared("lease-nats-tests").await;
    let k = key("rtt");
    let count = |b: &NatsBackend, n0: u64| b.requests_sent() - n0;

    let n0 = b.requests_sent();
    let g = grant(&b, &k, SEC * 30).await;
    let acquire_fresh = count(&b, n0);
    let n0 = b.requests_sent();
    let g = match b.renew(&g, None).await.unwrap() {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("lost"),
    };
    let renew = count(&b, n0);
    let n0 = b.requests_sent();
    b.release(&g).await.unwrap();
    let release = count(&b, n0);

    // Another client that has read the key since the release knows the
    // marker's sequence: one publish.
    let n0 = other.requests_sent();
    assert!(other.read(&k).await.unwrap().is_free());
    let read = count(&other, n0);
    let n0 = other.requests_sent();
    let g = grant(&other, &k, SEC * 30).await;
    let acquire_after_read = count(&other, n0);
    other.release(&g).await.unwrap();

    // The releasing client itself knows it too.
    let n0 = other.requests_sent();
    let g = grant(&other, &k, SEC * 30).await;
    let acquire_after_own_release = count(&other, n0);
    other.release(&g).await.unwrap();

    // A client that never looked: publish, read, publish.
    let n0 = stranger.requests_sent();
    let _ = grant(&stranger, &k, SEC * 30).await;
    let acquire_blind = count(&stranger, n0);

    // Asking for a held key: publish and read the first time; once the client
    // has seen it held, one read.
    let req = AcquireRequest::new(k.clone(), HolderId::random()).ttl(SEC);
    let n0 = b.requests_sent();
    assert!(matches!(
        b.try_acquire(req.clone()).await.unwrap(),
        Acquire::Held(_)
    ));
    let refused_first = count(&b, n0);
    let n0 = b.requests_sent();
    assert!(matches!(
        b.try_acquire(req).await.unwrap(),
        Acquire::Held(_)
    ));
    let refused_again = count(&b, n0);
    eprintln!(
        "requests: acquire (fresh key) {acquire_fresh}, acquire over a marker: after a read {acquire_after_read}, after own release {acquire_after_own_release}, blind {acquire_blind}; refused acquire: first {refused_first}, again {refused_again}; renew {renew}, release {release}, read {read}"
    );
    assert_eq!((refused_first, refused_again), (2, 1));
    assert_eq!(
        (
            acquire_fresh,
            renew,
            release,
            read,
            acquire_after_read,
            acquire_after_own_release
        ),
        (1, 1, 1, 1, 1, 1)
    );
    assert_eq!(acquire_blind, 3);
}

/// A server without per-message TTLs must be refused by name and version.
/// Played by a listener that speaks just the greeting of a 2.9 server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_server_is_refused_with_the_version_needed() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let info = r#"INFO {"server_id":"OLD","server_name":"old","version":"2.9.25","proto":1,"go":"go1.20","host":"127.0.0.1","port":4222,"headers":true,"max_payload":1048576,"jetstream":true,"client_id":1}"#;
                let _ = w.write_all(format!("{info}\r\n").as_bytes()).await;
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.starts_with("PING") {
                        let _ = w.write_all(b"PONG\r\n").await;
                    }
                }
            });
        }
    });
    let url = format!("nats://127.0.0.1:{port}");
    let err = match NatsBackend::connect(&url, NatsConfig::new("x")).await {
        Ok(_) => panic!("a 2.9 server was accepted"),
        Err(e) => e,
    };
    let msg = err.to_string();
    eprintln!("{msg}");
    assert!(msg.contains("2.9.25") && msg.contains(">= 2.11"), "{msg}");
}

/// With file storage, fences after a restart exceed every fence before it —
/// also when every message of the stream had expired before the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_rising_across_a_restart() {
    let dir = common::temp_dir("restart").unwrap();
    let mut server = common::Server::single(&dir).unwrap();
    let config = NatsConfig::new("restart")
        .marker_ttl(SEC)
        .create_bucket(true);
    let b = NatsBackend::connect(&server.url(), config.clone())
        .await
        .unwrap();

    let held = key("held");
    let released = key("released");
    let expired = key("expired");
    let g_held = grant(&b, &held, SEC * 60).await;
    let g_rel = grant(&b, &released, SEC * 60).await;
    b.release(&g_rel).await.unwrap();
    let g_exp = grant(&b, &expired, SEC).await;
    let mut max_before = g_held.fence().max(g_rel.fence()).max(g_exp.fence());

    // Round 1: a clean stop with a live grant, a release marker and an expiry.
    until_free(&b, &expired, SEC * 5).await;
    drop(b);
    server.stop();
    server.start().unwrap();
    let b = NatsBackend::connect(&server.url(), config.clone())
        .await
        .unwrap();
    match b.read(&held).await.unwrap() {
        LeaseState::Held(h) => assert_eq!(h.fence, g_held.fence(), "live grant changed"),
        LeaseState::Free => panic!("a live 60 s grant vanished in a restart"),
    }
    let other = b
        .try_acquire(AcquireRequest::new(held.clone(), HolderId::random()).ttl(SEC))
        .await
        .unwrap();
    assert!(
        matches!(other, Acquire::Held(_)),
        "second holder after restart"
    );
    for k in [&released, &expired, &key("new")] {
        let g = grant(&b, k, SEC).await;
        assert!(
            g.fence() > max_before,
            "{k}: fence {} after restart <= {max_before}",
            g.fence()
        );
    }
    let renewed = b.renew(&g_held, None).await.unwrap();
    assert!(
        matches!(renewed, Renewal::Renewed(_)),
        "renew after restart: {renewed:?}"
    );

    // Round 2: every message gone (grants expired, markers expired), then a
    // hard kill: the stream is empty, yet its sequence must not restart.
    let g = match renewed {
        Renewal::Renewed(g) => g,
        Renewal::Lost => unreachable!(),
    };
    b.release(&g).await.unwrap();
    let last = grant(&b, &key("last"), SEC).await;
    max_before = last.fence();
    tokio::time::sleep(SEC * 4).await; // grant TTL + marker TTL + slack
    drop(b);
    server.kill();
    server.start().unwrap();
    let b = NatsBackend::connect(&server.url(), config).await.unwrap();
    // Also the released key: its release marker outlives the grant's TTL, so
    // the released record cannot come back with the server's recovery.
    for k in [&held, &key("after-kill")] {
        let g = grant(&b, k, SEC).await;
        assert!(
            g.fence() > max_before,
            "{k}: fence {} after kill <= {max_before}",
            g.fence()
        );
    }
    // A grant whose TTL ran out before the kill may come back for a moment
    // (the server removes it again at once).
    let k = last.key();
    let g = grant_eventually(&b, k).await;
    assert!(
        g.fence() > max_before,
        "{k}: fence {} after kill <= {max_before}",
        g.fence()
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grant of `key`, waiting out (up to 10 s) a grant with a short TTL that
/// holds it.
async fn grant_eventually(b: &NatsBackend, key: &LeaseKey) -> Grant {
    let start = Instant::now();
    loop {
        let req = AcquireRequest::new(key.clone(), HolderId::random()).ttl(SEC);
        match b.try_acquire(req).await.expect("acquire") {
            Acquire::Granted(g) => return g,
            Acquire::Held(h) => assert!(
                start.elapsed() < SEC * 10,
                "{key} still held by {} (ttl {:?})",
                h.holder,
                h.ttl
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A bucket made by someone else without message TTLs would keep leases
/// forever: refused at connection, by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_without_message_ttls_is_refused() {
    let url = common::shared_url().await.unwrap_or_else(|e| panic!("{e}"));
    let client = async_nats::connect(&url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let bucket = format!("plain-{}", &HolderId::random().as_str()[..8]);
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: bucket.clone(),
        history: 1,
        storage: async_nats::jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .unwrap();
    let err = match NatsBackend::connect(&url, NatsConfig::new(bucket.as_str())).await {
        Ok(_) => panic!("a bucket without message TTLs was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("per-message TTLs") && err.contains(&bucket),
        "{err}"
    );
    let _ = js.delete_key_value(&bucket).await;
}

/// Latency of each operation beside a raw JetStream KV put on the same server,
/// printed for the record (no timing assertion: CI machines vary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_beside_a_raw_put() {
    const N: usize = 100;
    let b = shared("lease-nats-tests").await;
    let js = async_nats::jetstream::new(b.client().clone());
    let kv = js.get_key_value("lease-nats-tests").await.unwrap();
    let pct = |mut v: Vec<Duration>| {
        v.sort();
        (v[v.len() / 2], v[v.len() * 99 / 100])
    };
    let (mut raw, mut acq, mut ren, mut rel) = (vec![], vec![], vec![], vec![]);
    let k = key("bench");
    for i in 0..N {
        let t = Instant::now();
        kv.put(format!("{}-raw", k.as_str()), format!("{i}").into())
            .await
            .unwrap();
        raw.push(t.elapsed());
        let t = Instant::now();
        let g = grant(&b, &k, SEC * 30).await;
        acq.push(t.elapsed());
        let t = Instant::now();
        let g = match b.renew(&g, None).await.unwrap() {
            Renewal::Renewed(g) => g,
            Renewal::Lost => panic!("lost"),
        };
        ren.push(t.elapsed());
        let t = Instant::now();
        b.release(&g).await.unwrap();
        rel.push(t.elapsed());
    }
    let _ = kv.purge(format!("{}-raw", k.as_str())).await;
    for (name, v) in [
        ("raw kv put", raw),
        ("acquire", acq),
        ("renew", ren),
        ("release", rel),
    ] {
        let (p50, p99) = pct(v);
        eprintln!("{name:>10}: p50 {p50:>10.2?}  p99 {p99:>10.2?}  ({N} ops)");
    }
}

/// TLS through async-nats' options: rustls needs a process-wide crypto
/// provider when the build also has aws-lc-rs (object_store's, in a workspace
/// build); the backend installs one instead of letting async-nats panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connection_with_a_private_ca() {
    let dir = common::temp_dir("tls").unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("openssl (Debian package `openssl`) is needed for this test");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=lease-nats test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
    ]);
    let path = |f: &str| dir.join(f).display().to_string();
    let server = common::Server::single_with(
        &dir,
        &[
            "--tls".into(),
            "--tlscert".into(),
            path("server.pem"),
            "--tlskey".into(),
            path("server.key"),
        ],
    )
    .unwrap();

    // The application chooses the process's rustls provider (no library
    // does): where ring and aws-lc-rs are both compiled in, as in a
    // workspace-wide build, async-nats cannot pick one for its TLS config.
    let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
    let options = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(dir.join("ca.pem"));
    let url = format!("tls://127.0.0.1:{}", server.port);
    let b = NatsBackend::connect_with_options(
        &url,
        options,
        NatsConfig::new("tls").create_bucket(true),
    )
    .await
    .unwrap_or_else(|e| panic!("TLS connect to {url}: {e}"));
    let k = key("tls");
    let g = grant(&b, &k, SEC * 5).await;
    assert!(matches!(b.read(&k).await.unwrap(), LeaseState::Held(h) if h.fence == g.fence()));
    b.release(&g).await.unwrap();

    // Without the CA the server's certificate is refused: a known refusal.
    let plain = async_nats::ConnectOptions::new().require_tls(true);
    match NatsBackend::connect_with_options(&url, plain, NatsConfig::new("tls").create_bucket(true))
        .await
    {
        Ok(_) => panic!("an unknown CA was accepted"),
        Err(e) => eprintln!("without the CA: {e}"),
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A break that was applied but whose audit record could not be written must
/// not be reported as "not applied": a caller retrying it would break the
/// next, healthy holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_applied_without_its_audit_record_says_so() {
    let url = common::shared_url().await.unwrap_or_else(|e| panic!("{e}"));
    let bucket = format!("brk-{}", &HolderId::random().as_str()[..8]);
    let b = NatsBackend::connect(&url, NatsConfig::new(bucket.as_str()).create_bucket(true))
        .await
        .unwrap();
    // An audit bucket that refuses every audit record (values of 8 bytes at most).
    let js = async_nats::jetstream::new(b.client().clone());
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: b.audit_bucket(),
        history: 1,
        max_value_size: 8,
        ..Default::default()
    })
    .await
    .unwrap();
    let k = key("broken");
    let g = grant(&b, &k, SEC * 30).await;
    let note = lease_core::BreakNote::new("test", "audit refused").with_at_unix_ms(1);
    let result = b.break_lease(&k, &note).await;
    let freed = b.read(&k).await.unwrap().is_free();
    let renewed = b.renew(&g, None).await.unwrap();
    let _ = js.delete_key_value(&b.audit_bucket()).await;
    let _ = js.delete_key_value(&bucket).await;
    let e = match result {
        Ok(broken) => panic!("reported a full success: {broken:?}"),
        Err(e) => e,
    };
    eprintln!("{e}");
    assert!(freed, "the break was not applied");
    assert!(
        e.is_unknown_outcome(),
        "an applied break is reported as known not applied: {e:?}"
    );
    assert!(e.to_string().contains("was broken"), "{e}");
    // The old grant is gone for good.
    assert!(matches!(renewed, Renewal::Lost), "{renewed:?}");
}

/// A service taking `jobs/<uuid>` keys touches each key once: the client's
/// per-key caches must not grow with the number of keys ever seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_key_caches_stay_bounded_over_100000_keys() {
    const KEYS: usize = 100_000;
    const TASKS: usize = 32;
    let b = shared("lease-nats-tests").await;
    let run = HolderId::random();
    let t0 = Instant::now();
    let mut sizes = Vec::new();
    for chunk in 0..10 {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let b = b.clone();
                let run = run.clone();
                tokio::spawn(async move {
                    for i in (t..KEYS / 10).step_by(TASKS) {
                        let n = chunk * (KEYS / 10) + i;
                        let k = LeaseKey::new(format!("jobs/{run}/{n}")).unwrap();
                        if n.is_multiple_of(50) {
                            // Every 50th key is taken and released (both caches
                            // get an entry); the others are read (one cache).
                            let g = grant(&b, &k, SEC * 30).await;
                            b.release(&g).await.unwrap();
                        } else {
                            assert!(b.read(&k).await.unwrap().is_free());
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        sizes.push(b.cached_keys());
    }
    eprintln!(
        "cached keys after each 10,000 of {KEYS} keys: {sizes:?} ({:?})",
        t0.elapsed()
    );
    let max = *sizes.iter().max().unwrap();
    // Two caches of two generations of 2,048 keys each.
    assert!(max <= 4 * 2048, "caches grew to {max} entries: {sizes:?}");
    // Flat: the last half of the run (50,000 more keys) grows nothing.
    let first_half = *sizes[..5].iter().max().unwrap();
    let second_half = *sizes[5..].iter().max().unwrap();
    assert!(
        second_half <= first_half + 2048,
        "caches kept growing: {sizes:?}"
    );
    // The cached hints still work: a key seen free is taken in one request.
    let k = LeaseKey::new(format!("jobs/{run}/fresh")).unwrap();
    assert!(b.read(&k).await.unwrap().is_free());
    let before = b.requests_sent();
    let g = grant(&b, &k, SEC * 5).await;
    assert_eq!(b.requests_sent() - before, 1, "acquire after a read");
    b.release(&g).await.unwrap();
}

/// `last_break` reads back the newest of three breaks of one key (newest by
/// the lease stream, whatever the breakers' clocks say), answers `None` for a
/// key never broken, and never writes: with no audit bucket it creates none.
/// A latest-break entry that is not an audit body is an error, left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_break_reads_the_newest_break_and_creates_nothing() {
    use lease_core::{BreakNote, Error, LastBreak};
    let url = common::shared_url().await.unwrap_or_else(|e| panic!("{e}"));
    let bucket = format!("lb-{}", &HolderId::random().as_str()[..8]);
    let b = NatsBackend::connect(&url, NatsConfig::new(bucket.as_str()).create_bucket(true))
        .await
        .unwrap();
    let js = async_nats::jetstream::new(b.client().clone());
    let last_seq = || async {
        let mut s = js.get_stream(format!("KV_{bucket}")).await.unwrap();
        s.info().await.unwrap().state.last_sequence
    };
    let audit_stream = format!("KV_{}", b.audit_bucket());

    let never = key("never");
    let before = last_seq().await;
    assert_eq!(b.last_break(&never).await.unwrap(), None);
    assert!(
        js.get_stream(audit_stream.as_str()).await.is_err(),
        "last_break created the audit bucket"
    );
    assert_eq!(
        last_seq().await,
        before,
        "last_break wrote to the lease bucket"
    );

    let k = key("thrice");
    let mut newest = None;
    // The last break carries an earlier wall-clock time than the first.
    for (i, at_unix_ms) in [(1, 3_000), (2, 1_000), (3, 2_000)] {
        let g = grant(&b, &k, SEC * 30).await;
        let note = BreakNote::new(format!("operator {i}"), format!("break {i}"))
            .with_at_unix_ms(at_unix_ms);
        let broken = b.break_lease(&k, &note).await.unwrap();
        assert_eq!(broken.previous.map(|p| p.fence), Some(g.fence()));
        newest = Some(LastBreak::new(
            Some(g.holder().clone()),
            Some(g.fence()),
            note,
        ));
    }
    assert_eq!(b.last_break(&k).await.unwrap(), newest);
    // The audit bucket exists now; a key never broken still has no break.
    assert_eq!(b.last_break(&never).await.unwrap(), None);

    // A latest-break entry that is not an audit body: an error, not touched.
    let audit = js.get_key_value(b.audit_bucket()).await.unwrap();
    let name = format!("/lease-nats/last-break/{k}");
    let rev = audit.put(name.as_str(), "garbage".into()).await.unwrap();
    match b.last_break(&k).await {
        Err(Error::CorruptRecord { key, detail }) => {
            assert!(key.contains(&name), "{key}");
            assert!(detail.contains("audit record"), "{detail}");
        }
        other => panic!("a garbage entry read as {other:?}"),
    }
    let entry = audit.entry(name.as_str()).await.unwrap().unwrap();
    assert_eq!((entry.revision, &entry.value[..]), (rev, &b"garbage"[..]));

    let _ = js.delete_key_value(&b.audit_bucket()).await;
    let _ = js.delete_key_value(&bucket).await;
}

/// A break that removes a value which is not a lease record (foreign or
/// corrupt) keeps what it removed in its audit record, bounded: the whole
/// length and the first 4096 bytes in base64 (`"removed"`), in both the
/// history entry and the latest-break entry, which `last_break` still reads.
/// A break of a live grant removes no such value: `"removed"` is null.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_of_a_corrupt_value_keeps_its_head_in_the_audit_record() {
    use base64::engine::general_purpose::STANDARD as BASE64;
    use base64::Engine as _;
    use lease_core::{BreakNote, Error, LastBreak};
    const KEEP: usize = 4096;
    let url = common::shared_url().await.unwrap_or_else(|e| panic!("{e}"));
    let bucket = format!("rm-{}", &HolderId::random().as_str()[..8]);
    let b = NatsBackend::connect(&url, NatsConfig::new(bucket.as_str()).create_bucket(true))
        .await
        .unwrap();
    let js = async_nats::jetstream::new(b.client().clone());
    let kv = js.get_key_value(bucket.as_str()).await.unwrap();

    // Not records: no lease-nats header; the big one is not even UTF-8.
    let big: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 256) as u8).collect();
    let exact: Vec<u8> = vec![0xff; KEEP];
    let small = b"a foreign value".to_vec();
    let mut results = Vec::new();
    for (name, value) in [("big", big), ("exact", exact), ("small", small)] {
        let k = key(name);
        kv.put(k.as_str(), value.clone().into()).await.unwrap();
        assert!(
            matches!(b.read(&k).await, Err(Error::CorruptRecord { .. })),
            "{name}: the value is not corrupt to the backend"
        );
        let note = BreakNote::new("test", format!("corrupt {name}")).with_at_unix_ms(5);
        let broken = b.break_lease(&k, &note).await.unwrap();
        assert!(broken.previous.is_none(), "{name}: {broken:?}");
        assert!(b.read(&k).await.unwrap().is_free(), "{name}: not freed");
        results.push((name, k, value, note, broken.audit));
    }
    // And a live grant, broken: nothing corrupt removed.
    let live = key("live");
    let g = grant(&b, &live, SEC * 30).await;
    let live_note = BreakNote::new("test", "live").with_at_unix_ms(6);
    let live_audit = b.break_lease(&live, &live_note).await.unwrap().audit;

    let audit = js.get_key_value(b.audit_bucket()).await.unwrap();
    let entry = |named: String| {
        let audit = audit.clone();
        async move {
            let prefix = format!("NATS KV bucket {}_audit key ", bucket_of(&named));
            let at = named
                .strip_prefix(prefix.as_str())
                .unwrap_or_else(|| panic!("audit {named:?} does not name a key"))
                .to_owned();
            let e = audit
                .entry(at.as_str())
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("no audit entry {at:?}"));
            e.value
        }
    };
    fn bucket_of(audit: &str) -> &str {
        audit
            .strip_prefix("NATS KV bucket ")
            .and_then(|r| r.split(' ').next())
            .and_then(|b| b.strip_suffix("_audit"))
            .unwrap_or_else(|| panic!("audit {audit:?} names no audit bucket"))
    }
    for (name, k, value, note, named) in results {
        let history = entry(named.clone()).await;
        let latest = audit
            .entry(format!("/lease-nats/last-break/{k}").as_str())
            .await
            .unwrap()
            .expect("no latest-break entry")
            .value;
        assert_eq!(history, latest, "{name}: the two entries differ");
        let body: serde_json::Value = serde_json::from_slice(&history).unwrap();
        eprintln!("{name}: {} byte audit body", history.len());
        assert_eq!(body["removed_corrupt_record"], true, "{name}: {body}");
        let removed = &body["removed"];
        assert_eq!(
            removed["len"].as_u64(),
            Some(value.len() as u64),
            "{name}: {body}"
        );
        let head = removed["head_base64"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no head_base64 in {body}"));
        let head = BASE64.decode(head).unwrap();
        assert_eq!(head, value[..value.len().min(KEEP)], "{name}");
        // last_break reads the body with the new field.
        assert_eq!(
            b.last_break(&k).await.unwrap(),
            Some(LastBreak::new(None, None, note)),
            "{name}"
        );
    }
    let body: serde_json::Value = serde_json::from_slice(&entry(live_audit).await).unwrap();
    assert_eq!(body["removed_corrupt_record"], false, "{body}");
    assert!(body["removed"].is_null(), "{body}");
    assert_eq!(
        b.last_break(&live).await.unwrap().and_then(|l| l.fence),
        Some(g.fence())
    );

    let _ = js.delete_key_value(&b.audit_bucket()).await;
    let _ = js.delete_key_value(&bucket).await;
}

/// A client renewing more keys than any fixed cache holds still renews each
/// in one publish: what it wrote at a key it keeps renewing stays known (a
/// miss would cost a read before every renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_10000_keys_sends_one_request_each() {
    const KEYS: usize = 10_000;
    const TASKS: usize = 32;
    let b = shared("lease-nats-tests").await;
    let run = HolderId::random();
    let take = |t: usize| {
        let b = b.clone();
        let run = run.clone();
        tokio::spawn(async move {
            let mut grants = Vec::new();
            for n in (t..KEYS).step_by(TASKS) {
                let k = LeaseKey::new(format!("many/{run}/{n}")).unwrap();
                grants.push(grant(&b, &k, SEC * 60).await);
            }
            grants
        })
    };
    let mut grants = Vec::new();
    for t in (0..TASKS).map(take).collect::<Vec<_>>() {
        grants.extend(t.await.unwrap());
    }
    // Twice round: the first renewals write on top of the acquires, the
    // second on top of the first renewals.
    for round in 0..2 {
        let before = b.requests_sent();
        let chunks: Vec<Vec<Grant>> = grants.chunks(KEYS / TASKS + 1).map(<[_]>::to_vec).collect();
        let tasks: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let b = b.clone();
                tokio::spawn(async move {
                    let mut renewed = Vec::new();
                    for g in chunk {
                        match b.renew(&g, None).await.unwrap() {
                            Renewal::Renewed(g) => renewed.push(g),
                            other => panic!("{other:?}"),
                        }
                    }
                    renewed
                })
            })
            .collect();
        grants.clear();
        for t in tasks {
            grants.extend(t.await.unwrap());
        }
        let sent = b.requests_sent() - before;
        assert_eq!(
            sent, KEYS as u64,
            "round {round}: {sent} requests for {KEYS} renewals"
        );
    }
    for g in &grants {
        b.release(g).await.unwrap();
    }
}
