//! Sessions: the keys one client holds with one TTL share one etcd lease.
//! Every promise of the contract must still hold per key; the loss of the
//! session lease ends all its keys. The shared suite and the fault runs
//! run again with sessions on (`sessions::suite::`, `sessions::fault_runs::`).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{Acquire, AcquireRequest, Grant, HolderId, LeaseBackend, LeaseKey, Renewal};
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_testkit::servers;

fn key(k: &str) -> LeaseKey {
    LeaseKey::new(k).unwrap()
}

async fn session_backend(prefix: &str) -> (EtcdBackend, EtcdBackend) {
    let endpoints = common::shared_endpoints().expect("etcd server");
    let raw = common::wait_ready(&endpoints, None, Duration::from_secs(20))
        .await
        .expect("etcd ready");
    let prefix = common::unique_prefix(prefix);
    let b = EtcdBackend::connect(
        EtcdConfig::new(endpoints)
            .key_prefix(&prefix)
            .sessions(true),
    )
    .await
    .expect("connect");
    assert!(b.sessions());
    (b, raw)
}

async fn take(b: &EtcdBackend, k: &LeaseKey, h: &HolderId, ttl: Duration) -> Grant {
    match b
        .try_acquire(AcquireRequest::new(k.clone(), h.clone()).ttl(ttl))
        .await
        .expect("acquire")
    {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => panic!("{k} is held by {} (fence {})", h.holder, h.fence),
    }
}

async fn renewed(b: &EtcdBackend, g: &Grant) -> Grant {
    match b.renew(g, None).await.expect("renew") {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("{} was lost", g.key()),
    }
}

/// The etcd lease a key is bound to, read around the library.
async fn lease_of(raw: &EtcdBackend, b: &EtcdBackend, k: &LeaseKey) -> i64 {
    let mut kv = raw.client().kv_client();
    let resp = kv.get(b.etcd_key(k), None).await.expect("raw get");
    resp.kvs().first().map(|kv| kv.lease()).unwrap_or(0)
}

/// Two keys of one TTL share one etcd lease and one keep-alive stream;
/// releasing one leaves the other held and renewable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_keys_share_a_session_and_a_release_leaves_the_other() {
    let (b, raw) = session_backend("sessions-two").await;
    let me = HolderId::random();
    let ttl = Duration::from_secs(30);
    let (k1, k2) = (key("s/one"), key("s/two"));
    let g1 = take(&b, &k1, &me, ttl).await;
    let g2 = take(&b, &k2, &me, ttl).await;
    let lease = lease_of(&raw, &b, &k1).await;
    assert!(lease != 0);
    assert_eq!(lease_of(&raw, &b, &k2).await, lease, "one session lease");
    assert!(g2.fence() > g1.fence());
    let g1 = renewed(&b, &g1).await;
    let g2 = renewed(&b, &g2).await;
    assert_eq!(b.open_keep_alive_streams(), 1, "one stream for the session");
    b.release(&g1).await.expect("release");
    assert!(b.read(&k1).await.expect("read").is_free());
    let g2 = renewed(&b, &g2).await;
    let held = b.read(&k2).await.expect("read");
    assert_eq!(held.holding().map(|h| h.fence), Some(g2.fence()));
    let mut lc = raw.client().lease_client();
    let left = lc.time_to_live(lease, None).await.expect("ttl").ttl();
    assert!(left > 0, "the release revoked the session lease");
    b.release(&g2).await.expect("release");
}

/// A session lease revoked behind the library's back takes every key with
/// it: each key's next renewal is Lost, the next holders get higher fences,
/// and the same client starts a new session for its next acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_loses_every_key_and_fences_keep_rising() {
    let (b, raw) = session_backend("sessions-revoked").await;
    let me = HolderId::random();
    let ttl = Duration::from_secs(30);
    let (k1, k2) = (key("s/one"), key("s/two"));
    let g1 = take(&b, &k1, &me, ttl).await;
    let g2 = take(&b, &k2, &me, ttl).await;
    let lease = lease_of(&raw, &b, &k1).await;
    raw.client()
        .lease_client()
        .revoke(lease)
        .await
        .expect("revoke");
    assert_eq!(b.renew(&g1, None).await.expect("renew"), Renewal::Lost);
    assert_eq!(b.renew(&g2, None).await.expect("renew"), Renewal::Lost);
    let other = EtcdBackend::connect(
        EtcdConfig::new(common::shared_endpoints().unwrap())
            .key_prefix(b.etcd_key(&key("x")).trim_end_matches('x'))
            .sessions(true),
    )
    .await
    .expect("connect");
    let stranger = HolderId::random();
    let n1 = take(&other, &k1, &stranger, ttl).await;
    assert!(
        n1.fence() > g2.fence(),
        "{} after {}",
        n1.fence(),
        g2.fence()
    );
    // The first client's next acquire does not reuse the revoked lease.
    let n2 = take(&b, &k2, &me, ttl).await;
    assert!(n2.fence() > n1.fence());
    let new_lease = lease_of(&raw, &b, &k2).await;
    assert!(
        new_lease != 0 && new_lease != lease,
        "bound to the revoked lease"
    );
    let n2 = renewed(&b, &n2).await;
    other.release(&n1).await.expect("release");
    b.release(&n2).await.expect("release");
}

/// A key deleted behind the library's back is Lost at its next renewal;
/// the other key of the same session renews on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_delete_loses_only_that_key() {
    let (b, raw) = session_backend("sessions-delete").await;
    let me = HolderId::random();
    let ttl = Duration::from_secs(30);
    let (k1, k2) = (key("s/one"), key("s/two"));
    let g1 = take(&b, &k1, &me, ttl).await;
    let g2 = take(&b, &k2, &me, ttl).await;
    raw.client()
        .kv_client()
        .delete(b.etcd_key(&k1), None)
        .await
        .expect("raw delete");
    // Renewed together, their reads share one request: each key still
    // gets its own answer.
    let (r1, r2) = tokio::join!(b.renew(&g1, None), b.renew(&g2, None));
    assert_eq!(r1.expect("renew"), Renewal::Lost);
    let Renewal::Renewed(g2) = r2.expect("renew") else {
        panic!("the key nobody deleted was lost")
    };
    assert_eq!(b.renew(&g1, None).await.expect("renew"), Renewal::Lost);
    let g2 = renewed(&b, &g2).await;
    // A payload renewal verifies the key too.
    let g3 = take(&b, &k1, &me, ttl).await;
    assert!(g3.fence() > g1.fence());
    raw.client()
        .kv_client()
        .delete(b.etcd_key(&k1), None)
        .await
        .expect("raw delete");
    let p = lease_core::Payload::new(b"x".to_vec()).unwrap();
    assert_eq!(b.renew(&g3, Some(p)).await.expect("renew"), Renewal::Lost);
    b.release(&g2).await.expect("release");
}

/// A grant counts from a keep-alive sent inside the acquire call, never from
/// an earlier one: an acquire on a session last kept alive long ago still
/// has its deadline a fraction of the TTL after the call began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_on_an_old_session_counts_from_its_own_call() {
    let (b, _raw) = session_backend("sessions-old").await;
    let me = HolderId::random();
    let ttl = Duration::from_secs(4);
    let g1 = take(&b, &key("s/one"), &me, ttl).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t0 = Instant::now();
    let g2 = take(&b, &key("s/two"), &me, ttl).await;
    let t1 = Instant::now();
    assert!(g2.sent_at() >= t0 && g2.sent_at() <= t1);
    let g1 = renewed(&b, &g1).await;
    b.release(&g1).await.expect("release");
    b.release(&g2).await.expect("release");
}

/// A session whose keep-alives stop being answered (the server is paused):
/// every kept lease of the session stops being writable by its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_session_self_fences_by_the_deadline() {
    let server = servers::spawn_etcd(None).expect("private etcd");
    let b = EtcdBackend::connect(
        EtcdConfig::new(server.endpoints.clone())
            .key_prefix("stall/")
            .request_timeout(Duration::from_millis(500))
            .sessions(true),
    )
    .await
    .expect("connect");
    let ttl = common::three_second_ttl(&b);
    let keeper = lease_keeper::Keeper::new(Arc::new(b) as Arc<dyn LeaseBackend>);
    let l1 = keeper
        .try_acquire(&key("s/one"))
        .ttl(ttl)
        .await
        .expect("acquire");
    let l2 = keeper
        .try_acquire(&key("s/two"))
        .ttl(ttl)
        .await
        .expect("acquire");
    // Let a renewal or two go through first.
    tokio::time::sleep(ttl / 2).await;
    assert!(l1.may_write() && l2.may_write());
    server.pause().expect("pause etcd");
    let paused = tokio::time::Instant::now();
    let deadline = l1.deadline().max(l2.deadline());
    assert!(
        deadline <= paused + ttl,
        "a deadline lies a TTL past the pause"
    );
    tokio::time::sleep_until(deadline + Duration::from_millis(20)).await;
    let writable = (l1.may_write(), l2.may_write());
    server.resume().expect("resume etcd");
    assert_eq!(
        writable,
        (false, false),
        "a lease still writable past its deadline"
    );
    drop((l1, l2));
}

/// The shared conformance suite with sessions on.
mod suite {
    use crate::common::EtcdHarness;
    use lease_conformance::conformance_tests;

    conformance_tests!(etcd_sessions, async {
        EtcdHarness::shared().await.map(EtcdHarness::with_sessions)
    });
}

/// The fault runs with sessions on.
mod fault_runs {
    use crate::common::{or_panic, EtcdHarness};

    lease_conformance::fault_tests!(
        async { or_panic(EtcdHarness::shared().await).with_sessions() },
        async { or_panic(EtcdHarness::private().await).with_sessions() },
        EtcdHarness::FAULT_TUNING
    );
}
