//! Requests per operation, counted by the server itself (etcd's
//! `grpc_server_msg_received_total` on `/metrics`) on a private member, and
//! latency beside a raw single-request baseline on the same server.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use lease_core::{AcquireRequest, HolderId, LeaseBackend, LeaseKey, Payload, Renewal};
use lease_etcd::{EtcdBackend, EtcdConfig};

/// Every gRPC message the server has received so far for the operations:
/// the membership and status checks a client with sessions makes in the
/// background, every few seconds, are not counted.
fn received(url: &str) -> u64 {
    received_by(url, |m| m != "MemberList" && m != "Status")
}

/// The gRPC messages the server has received so far for the methods
/// `method` (given a method's name, such as `Range`) says yes to.
pub(crate) fn received_by(url: &str, method: impl Fn(&str) -> bool) -> u64 {
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).expect("metrics connection");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .filter(|l| {
            l.split("grpc_method=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .is_some_and(&method)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Requests `op` sent, as the server counted them.
async fn count<T>(url: &str, op: impl std::future::Future<Output = T>) -> (u64, T) {
    let before = received(url);
    let out = op.await;
    (received(url) - before, out)
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A private one-member etcd, so its counters count this test's requests
/// alone, and a backend on it (`configure` given the key prefix). Keep the
/// members: dropping them stops the server.
pub(crate) async fn private_member(
    configure: fn(EtcdConfig, &str) -> EtcdConfig,
    prefix: &str,
) -> (Vec<common::Member>, String, EtcdBackend) {
    let members = common::start_cluster(1, None).expect("start etcd");
    let url = members[0].client_url.clone();
    common::wait_ready(std::slice::from_ref(&url), None, Duration::from_secs(30))
        .await
        .expect("etcd ready");
    let b = EtcdBackend::connect(configure(EtcdConfig::new([url.clone()]), prefix))
        .await
        .unwrap();
    (members, url, b)
}

/// With the default configuration (sessions on), under `prefix`.
pub(crate) fn sessions(config: EtcdConfig, prefix: &str) -> EtcdConfig {
    let config = config.key_prefix(prefix);
    assert!(config.sessions, "sessions are on by default");
    config
}

/// Each key on an etcd lease of its own (sessions off).
#[tokio::test]
async fn requests_per_operation_on_own_leases() {
    let (_members, url, b) = private_member(|c, p| c.key_prefix(p).sessions(false), "rq/").await;
    let k = LeaseKey::new("counted").unwrap();
    let (a, other) = (HolderId::random(), HolderId::random());
    let req = |h: &HolderId| AcquireRequest::new(k.clone(), h.clone()).ttl(Duration::from_secs(30));

    let (n_acquire, g) = count(&url, b.try_acquire(req(&a))).await;
    let g = g.unwrap().granted().unwrap();
    let (n_refused, _) = count(&url, b.try_acquire(req(&other))).await;
    let (n_reacquire, g2) = count(&url, b.try_acquire(req(&a))).await;
    let g = g2.unwrap().granted().unwrap_or(g);
    let (n_renew, r) = count(&url, b.renew(&g, None)).await;
    let Renewal::Renewed(g) = r.unwrap() else {
        panic!("lost")
    };
    let (n_renew_payload, r) = count(
        &url,
        b.renew(&g, Some(Payload::new(b"x".to_vec()).unwrap())),
    )
    .await;
    let Renewal::Renewed(g) = r.unwrap() else {
        panic!("lost")
    };
    let (n_read, _) = count(&url, b.read(&k)).await;
    assert_eq!(
        b.open_keep_alive_streams(),
        1,
        "the renewed lease's stream stays open"
    );
    let (n_release, _) = count(&url, b.release(&g)).await;
    assert_eq!(b.open_keep_alive_streams(), 0, "release closes it");
    let (n_read_free, _) = count(&url, b.read(&k)).await;
    eprintln!(
        "etcd requests per operation: acquire {n_acquire}, refused acquire {n_refused}, \
         re-acquire {n_reacquire}, renew {n_renew}, renew with payload {n_renew_payload}, \
         read held {n_read}, read free {n_read_free}, release {n_release}"
    );
    assert_eq!(n_acquire, 2, "acquire: lease grant + one transaction");
    assert_eq!(n_renew, 2, "renew: keep-alive beside a verifying read");
    assert_eq!(
        n_renew_payload, 2,
        "renew with payload: keep-alive + guarded put"
    );
    assert_eq!(n_release, 2, "release: guarded delete + revoke");
    assert_eq!(n_read, 2, "read: get + lease time-to-live");
    assert_eq!(n_read_free, 1);
    assert!(n_refused <= 4, "refused acquire: {n_refused}");

    // Latency beside a raw single get on the same server and connection.
    let mut kv = b.client().kv_client();
    let mut raw = Vec::new();
    let mut acquire = Vec::new();
    let mut renew = Vec::new();
    let mut cycle = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        kv.get("rq/raw", Some(GetOptions::new().with_count_only()))
            .await
            .unwrap();
        raw.push(t.elapsed());
        let k = LeaseKey::new(format!("lat/{i}")).unwrap();
        let t = Instant::now();
        let g = b
            .try_acquire(AcquireRequest::new(k, a.clone()).ttl(Duration::from_secs(30)))
            .await
            .unwrap()
            .granted()
            .unwrap();
        acquire.push(t.elapsed());
        let t = Instant::now();
        let _ = b.renew(&g, None).await.unwrap();
        renew.push(t.elapsed());
        let t = Instant::now();
        b.release(&g).await.unwrap();
        cycle.push(acquire[acquire.len() - 1] + t.elapsed());
    }
    eprintln!(
        "p50 latency on loopback (debug build): raw get {:?}, acquire {:?}, acquire + release {:?}, renew {:?}",
        p50(raw),
        p50(acquire),
        p50(cycle),
        p50(renew)
    );
}

/// The same with sessions on: the keys of one TTL share one etcd lease.
/// An acquire on a session kept alive a moment ago is one transaction (the
/// grant counts from that keep-alive), a refused acquire one transaction, a
/// release one guarded delete, a renewal one keep-alive beside one read (one
/// round trip); concurrent renewals of many keys share their keep-alives and
/// their reads.
#[tokio::test]
async fn requests_per_operation_with_sessions() {
    let (_members, url, b) = private_member(sessions, "rqs/").await;
    let ttl = Duration::from_secs(30);
    let k = LeaseKey::new("counted").unwrap();
    let (a, other) = (HolderId::random(), HolderId::random());
    let req = |k: &LeaseKey, h: &HolderId| AcquireRequest::new(k.clone(), h.clone()).ttl(ttl);

    let (n_first, g0) = count(
        &url,
        b.try_acquire(req(&LeaseKey::new("first").unwrap(), &a)),
    )
    .await;
    let g0 = g0.unwrap().granted().unwrap();
    let (n_acquire, g) = count(&url, b.try_acquire(req(&k, &a))).await;
    let g = g.unwrap().granted().unwrap();
    let (n_refused, _) = count(&url, b.try_acquire(req(&k, &other))).await;
    let (n_refused_again, held) = count(&url, b.try_acquire(req(&k, &other))).await;
    assert!(held.unwrap().granted().is_none());
    let (n_reacquire, g2) = count(&url, b.try_acquire(req(&k, &a))).await;
    let g = g2.unwrap().granted().unwrap_or(g);
    let (n_renew, r) = count(&url, b.renew(&g, None)).await;
    let Renewal::Renewed(g) = r.unwrap() else {
        panic!("lost")
    };
    let (n_renew_payload, r) = count(
        &url,
        b.renew(&g, Some(Payload::new(b"x".to_vec()).unwrap())),
    )
    .await;
    let Renewal::Renewed(g) = r.unwrap() else {
        panic!("lost")
    };
    let (n_release, _) = count(&url, b.release(&g)).await;
    let (n_release0, _) = count(&url, b.release(&g0)).await;
    assert_eq!(
        b.open_keep_alive_streams(),
        1,
        "the session's stream stays open"
    );

    // Many keys at once: one read each, keep-alives shared.
    const N: usize = 32;
    let b2 = b.clone();
    let (n_acquire_many, grants) = count(&url, async move {
        let mut tasks = Vec::new();
        for i in 0..N {
            let b = b2.clone();
            let k = LeaseKey::new(format!("many/{i}")).unwrap();
            let h = HolderId::random();
            tasks.push(tokio::spawn(async move {
                b.try_acquire(AcquireRequest::new(k, h).ttl(ttl))
                    .await
                    .unwrap()
                    .granted()
                    .unwrap()
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    })
    .await;
    let b3 = b.clone();
    let (n_renew_many, grants) = count(&url, async move {
        let mut tasks = Vec::new();
        for g in grants {
            let b = b3.clone();
            tasks.push(tokio::spawn(async move {
                match b.renew(&g, None).await.unwrap() {
                    Renewal::Renewed(g) => g,
                    Renewal::Lost => panic!("lost"),
                }
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    })
    .await;
    eprintln!(
        "etcd requests per operation with sessions: first acquire {n_first}, acquire {n_acquire}, \
         refused acquire {n_refused}, refused again {n_refused_again}, re-acquire {n_reacquire}, \
         renew {n_renew}, renew with payload {n_renew_payload}, release {n_release}; \
         {N} concurrent acquires {n_acquire_many}, {N} concurrent renewals {n_renew_many}"
    );
    assert_eq!(
        n_first, 2,
        "first acquire: session lease grant + transaction"
    );
    assert_eq!(
        n_acquire, 1,
        "acquire on a fresh session: the transaction alone"
    );
    assert_eq!(n_release, 1, "release: one guarded delete");
    assert_eq!(n_release0, 1, "release: one guarded delete");
    assert_eq!(n_refused, 1, "refused acquire: the transaction alone");
    assert_eq!(n_refused_again, 1, "refused again: the transaction alone");
    assert_eq!(n_renew, 2, "renew: keep-alive beside a verifying read");
    assert_eq!(
        n_renew_payload, 2,
        "renew with payload: keep-alive beside a guarded put"
    );
    assert!(n_reacquire <= 3, "re-acquire: {n_reacquire}");
    assert!(
        n_acquire_many <= N as u64 + 2,
        "{N} concurrent acquires sent {n_acquire_many} requests: more than a transaction each"
    );
    assert!(
        n_renew_many <= N as u64 / 2,
        "{N} concurrent renewals sent {n_renew_many} requests: keep-alives and reads not shared"
    );
    for g in &grants {
        b.release(g).await.unwrap();
    }

    // Rough latency, sessions on, beside a raw get (a timing loop, not a
    // timed assertion; the benchmark measures the official figures).
    let mut kv = b.client().kv_client();
    let (mut raw, mut cycle, mut renew) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..50 {
        let t = Instant::now();
        kv.get("rqs/raw", Some(GetOptions::new().with_count_only()))
            .await
            .unwrap();
        raw.push(t.elapsed());
        let k = LeaseKey::new(format!("lat/{i}")).unwrap();
        let t = Instant::now();
        let g = b.try_acquire(req(&k, &a)).await.unwrap().granted().unwrap();
        b.release(&g).await.unwrap();
        cycle.push(t.elapsed());
        let g = b.try_acquire(req(&k, &a)).await.unwrap().granted().unwrap();
        let t = Instant::now();
        let _ = b.renew(&g, None).await.unwrap();
        renew.push(t.elapsed());
        b.release(&g).await.unwrap();
    }
    eprintln!(
        "p50 latency with sessions on loopback (debug build): raw get {:?}, acquire + release {:?}, renew {:?}",
        p50(raw),
        p50(cycle),
        p50(renew)
    );
}

/// With sessions, a renewal that comes after another key of the session was
/// kept alive lately sends its read alone, and counts from that keep-alive;
/// an acquire on a session last kept alive long ago sends a keep-alive
/// beside its transaction and counts from it.
#[tokio::test]
async fn a_recent_keep_alive_of_the_session_stands_in_for_a_renewals_own() {
    let (_members, url, b) = private_member(sessions, "rqk/").await;
    // A sixth of this TTL is 1 s: the session is fresh for 1 s after a
    // keep-alive, and a renewal must move on by 1 s to skip its own.
    let ttl = Duration::from_secs(6);
    let me = HolderId::random();
    let take = |name: &str| {
        let req = AcquireRequest::new(LeaseKey::new(name).unwrap(), me.clone()).ttl(ttl);
        let b = b.clone();
        async move { b.try_acquire(req).await.unwrap().granted().unwrap() }
    };
    let a = take("a").await;
    let bee = take("b").await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    // Stale session: b's renewal sends a keep-alive beside its read.
    let (n_first, r) = count(&url, b.renew(&bee, None)).await;
    let Renewal::Renewed(bee) = r.unwrap() else {
        panic!("lost")
    };
    // Fresh session, a counted from 1.3 s ago: its read alone.
    let t0 = Instant::now();
    let (n_second, r) = count(&url, b.renew(&a, None)).await;
    let Renewal::Renewed(a2) = r.unwrap() else {
        panic!("lost")
    };
    eprintln!("renewal on a stale session {n_first} requests, on a fresh one {n_second}");
    assert_eq!(n_first, 2, "keep-alive beside the read");
    assert_eq!(n_second, 1, "the read alone");
    // b's renewal counts from before its read (its keep-alive went out
    // just after); a's from that keep-alive itself, sent before a's read.
    assert!(
        a2.sent_at() >= bee.sent_at() && a2.sent_at() - bee.sent_at() < Duration::from_millis(500),
        "counts from b's keep-alive: {:?} vs {:?}",
        a2.sent_at(),
        bee.sent_at()
    );
    assert!(a2.sent_at() < t0 && a2.sent_at() > a.sent_at());
    assert!(
        a2.deadline() > t0 + ttl / 2,
        "a renewal leaves at least half the TTL"
    );

    // An acquire after the session went stale: a keep-alive beside the
    // transaction, counted from inside the call.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let t0 = Instant::now();
    let (n_acquire, c) = count(&url, async { take("c").await }).await;
    assert_eq!(n_acquire, 2, "transaction beside a keep-alive");
    assert!(c.sent_at() >= t0);
    for g in [&a2, &bee, &c] {
        b.release(g).await.unwrap();
    }
}
