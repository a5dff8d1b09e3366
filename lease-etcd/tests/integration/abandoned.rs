//! Abandoned grants on a session: a key nobody renews expires no later
//! than one TTL after its last renewal, even while the same client keeps
//! the session lease alive by renewing another key of that TTL — and a key
//! that is renewed on time is never removed.
//!
//! Each test keeps a second key of the same TTL renewed every third of a
//! TTL for its whole length, so the session lease never runs out: a key
//! that goes away went because it was abandoned, not with its session.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{Acquire, AcquireRequest, Grant, HolderId, LeaseBackend, LeaseKey, Renewal};
use lease_etcd::{EtcdBackend, EtcdConfig};

/// etcd checks for expired leases twice a second; a key on a lease of its
/// own is deleted up to that much after its TTL, plus the delete's commit.
const SLACK: Duration = Duration::from_millis(1000);

fn key(k: &str) -> LeaseKey {
    LeaseKey::new(k).unwrap()
}

/// A client with the default configuration, and one that reads around the
/// library.
async fn backends(prefix: &str) -> (Arc<EtcdBackend>, EtcdBackend, Duration) {
    let endpoints = common::shared_endpoints().expect("etcd server");
    let raw = common::wait_ready(&endpoints, None, Duration::from_secs(20))
        .await
        .expect("etcd ready");
    let b =
        EtcdBackend::connect(EtcdConfig::new(endpoints).key_prefix(common::unique_prefix(prefix)))
            .await
            .expect("connect");
    assert!(b.sessions(), "sessions are on by default");
    let ttl = common::three_second_ttl(&b);
    (Arc::new(b), raw, ttl)
}

async fn take(b: &EtcdBackend, k: &LeaseKey, ttl: Duration) -> Grant {
    match b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .expect("acquire")
    {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => panic!("{k} is held by {} (fence {})", h.holder, h.fence),
    }
}

/// Keeps `k` renewed every third of `ttl` until the returned flag is set;
/// the task fails if a renewal is lost or not answered in time.
fn keep_renewing(
    b: Arc<EtcdBackend>,
    mut g: Grant,
    ttl: Duration,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<u32>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let mut renewals = 0;
        while !flag.load(Ordering::Relaxed) {
            tokio::time::sleep(ttl / 3).await;
            match b.renew(&g, None).await.expect("renew the kept key") {
                Renewal::Renewed(n) => {
                    assert_eq!(n.fence(), g.fence());
                    g = n;
                    renewals += 1;
                }
                Renewal::Lost => panic!("a key renewed on time was lost"),
            }
        }
        b.release(&g).await.expect("release the kept key");
        renewals
    });
    (stop, task)
}

/// Another key of the same client and TTL, renewed throughout, so its
/// session lease never runs out.
struct Kept {
    stop: Arc<AtomicBool>,
    renewing: tokio::task::JoinHandle<u32>,
}

impl Kept {
    async fn start(b: &Arc<EtcdBackend>, ttl: Duration) -> Kept {
        let g = take(b, &key("a/kept"), ttl).await;
        let (stop, renewing) = keep_renewing(b.clone(), g, ttl);
        Kept { stop, renewing }
    }

    /// Stops the renewals (and releases the key); it must have been
    /// renewed at least three times.
    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        assert!(self.renewing.await.expect("renewing task") >= 3);
    }
}

/// Whether `k` is in etcd, read around the library.
async fn present(raw: &EtcdBackend, b: &EtcdBackend, k: &LeaseKey) -> bool {
    let mut kv = raw.client().kv_client();
    let resp = kv.get(b.etcd_key(k), None).await.expect("raw get");
    !resp.kvs().is_empty()
}

/// Waits until `k` is gone from etcd (at most `within`); when it went.
async fn gone_by(raw: &EtcdBackend, b: &EtcdBackend, k: &LeaseKey, within: Duration) -> Instant {
    let give_up = Instant::now() + within;
    loop {
        if !present(raw, b, k).await {
            return Instant::now();
        }
        assert!(
            Instant::now() < give_up,
            "{k} is still in etcd {within:?} after it was last renewed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A grant of the raw backend dropped without a release: its key stays
/// while its holder may write, and goes within one TTL of the acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_grant_expires_a_ttl_after_its_acquire() {
    let (b, raw, ttl) = backends("abandoned-grant").await;
    let kept = Kept::start(&b, ttl).await;
    let k = key("a/dropped");
    let start = Instant::now();
    let g = take(&b, &k, ttl).await;
    let deadline = g.deadline();
    drop(g);
    tokio::time::sleep_until(deadline.into()).await;
    assert!(
        present(&raw, &b, &k).await,
        "the key went before its holder's deadline"
    );
    let gone = gone_by(&raw, &b, &k, ttl * 4).await;
    assert!(
        gone <= start + ttl + SLACK,
        "gone {:?} after the acquire, TTL {ttl:?}",
        gone - start
    );
    kept.stop().await;
}

/// An acquire dropped while its transaction is on its way: nobody was
/// handed the grant, and the key goes within one TTL of the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_expires_a_ttl_after_the_call() {
    let (b, raw, ttl) = backends("abandoned-acquire").await;
    let kept = Kept::start(&b, ttl).await;
    let k = key("a/dropped");
    let start = Instant::now();
    let acquire = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            b.try_acquire(AcquireRequest::new(k, HolderId::random()).ttl(ttl))
                .await
        })
    };
    // Dropped as soon as its write is seen, most likely before its answer.
    while !present(&raw, &b, &k).await {
        assert!(start.elapsed() < ttl, "the acquire never wrote the key");
    }
    acquire.abort();
    let gone = gone_by(&raw, &b, &k, ttl * 4).await;
    assert!(
        gone <= start + ttl + SLACK,
        "gone {:?} after the acquire, TTL {ttl:?}",
        gone - start
    );
    kept.stop().await;
}

/// A renewal cancelled half-way, after which nobody renews: the key goes
/// within one TTL of that renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_renewal_expires_a_ttl_after_it() {
    let (b, raw, ttl) = backends("abandoned-renewal").await;
    let kept = Kept::start(&b, ttl).await;
    let k = key("a/cancelled");
    let g = take(&b, &k, ttl).await;
    tokio::time::sleep(ttl / 3).await;
    let g = match b.renew(&g, None).await.expect("renew") {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("lost"),
    };
    tokio::time::sleep(ttl / 3).await;
    let cancelled = Instant::now();
    // Polled once (its requests on their way), then dropped.
    let mut attempt = Box::pin(b.renew(&g, None));
    let first = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(attempt.as_mut(), cx))
    })
    .await;
    assert!(first.is_pending(), "the renewal was answered at once");
    drop(attempt);
    let gone = gone_by(&raw, &b, &k, ttl * 4).await;
    assert!(
        gone <= cancelled + ttl + SLACK,
        "gone {:?} after the cancelled renewal, TTL {ttl:?}",
        gone - cancelled
    );
    kept.stop().await;
}

/// A renewal after its holder's deadline but within the TTL still finds
/// its key (it would on a lease of its own), and a renewal of a key that
/// was swept is `Lost`; the key's next holder gets a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_keeps_the_key_and_one_after_its_sweep_is_lost() {
    let (b, raw, ttl) = backends("abandoned-late").await;
    let kept = Kept::start(&b, ttl).await;
    let k = key("a/late");
    let g = take(&b, &k, ttl).await;
    tokio::time::sleep_until((g.deadline() + Duration::from_millis(100)).into()).await;
    let g = match b.renew(&g, None).await.expect("late renew") {
        Renewal::Renewed(n) => n,
        Renewal::Lost => panic!("a renewal within the TTL was lost"),
    };
    assert!(g.may_write());
    gone_by(&raw, &b, &k, ttl * 4).await;
    assert_eq!(
        b.renew(&g, None).await.expect("renew after the sweep"),
        Renewal::Lost
    );
    let next = take(&b, &k, ttl).await;
    assert!(next.fence() > g.fence());
    b.release(&next).await.expect("release");
    kept.stop().await;
}

/// Many keys, some renewed on time and some abandoned, over several TTLs:
/// every renewed one is renewed every time (the renewing tasks fail on a
/// loss), every abandoned one goes within a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_keys_stay_while_abandoned_ones_beside_them_go() {
    let (b, raw, ttl) = backends("abandoned-mixed").await;
    let mut renewing = Vec::new();
    for i in 0..8 {
        let g = take(&b, &key(&format!("a/kept-{i}")), ttl).await;
        renewing.push(keep_renewing(b.clone(), g, ttl));
    }
    for round in 0..3 {
        let start = Instant::now();
        let mut dropped = Vec::new();
        for i in 0..8 {
            let k = key(&format!("a/dropped-{round}-{i}"));
            drop(take(&b, &k, ttl).await);
            dropped.push(k);
        }
        for k in &dropped {
            let gone = gone_by(&raw, &b, k, ttl * 4).await;
            assert!(
                gone <= start + ttl + SLACK * 2,
                "{k} gone {:?} after its acquire, TTL {ttl:?}",
                gone - start
            );
        }
    }
    for (stop, task) in renewing {
        stop.store(true, Ordering::Relaxed);
        assert!(task.await.expect("renewing task") >= 6);
    }
}

/// A key renewed on a session lease the client has just replaced by a new
/// one for its TTL (its known end was near; it is still alive in etcd)
/// keeps its key until the renewed grant's deadline: the renewal moves the
/// key's sweep on like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_on_a_replaced_session_lease_still_moves_its_sweep() {
    let (b, raw, ttl) = backends("abandoned-replaced").await;
    let k = key("a/old-session");
    let start = Instant::now();
    let g = take(&b, &k, ttl).await;
    let old = lease_of(&raw, &b, &k).await;
    // Close to the old session's known end, another acquire of the TTL
    // starts a new session.
    tokio::time::sleep_until((start + ttl - Duration::from_millis(200)).into()).await;
    let other = take(&b, &key("a/new-session"), ttl).await;
    assert_ne!(lease_of(&raw, &b, other.key()).await, old, "no new session");
    let g = match b.renew(&g, None).await.expect("renew") {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("a renewal within the TTL was lost"),
    };
    assert_eq!(lease_of(&raw, &b, &k).await, old);
    tokio::time::sleep_until((g.deadline() - Duration::from_millis(100)).into()).await;
    assert!(g.may_write());
    assert!(
        present(&raw, &b, &k).await,
        "the key went while its renewed grant may still write"
    );
    b.release(&g).await.expect("release");
    b.release(&other).await.expect("release");
}

/// A release whose answer comes after the same client acquired the key
/// again (the release's delete landed first): the new grant renews, and,
/// abandoned, goes within a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_answer_leaves_the_next_grant_renewable_and_swept() {
    let (b, raw, ttl) = backends("abandoned-release").await;
    let kept = Kept::start(&b, ttl).await;
    let k = key("a/released");
    let first = take(&b, &k, ttl).await;
    let mut release = Box::pin(b.release(&first));
    let polled = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(release.as_mut(), cx))
    })
    .await;
    assert!(polled.is_pending(), "the release was answered at once");
    let start = Instant::now();
    while present(&raw, &b, &k).await {
        assert!(start.elapsed() < ttl, "the release never landed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let next = take(&b, &k, ttl).await;
    release.await.expect("release");
    assert!(next.fence() > first.fence());
    let renewed_at = Instant::now();
    let next = match b.renew(&next, None).await.expect("renew") {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("the grant after a late release answer was lost"),
    };
    drop(next);
    let gone = gone_by(&raw, &b, &k, ttl * 4).await;
    assert!(
        gone <= renewed_at + ttl + SLACK,
        "gone {:?} after its last renewal, TTL {ttl:?}",
        gone - renewed_at
    );
    kept.stop().await;
}

/// The etcd lease a key is bound to, read around the library (0: no key).
async fn lease_of(raw: &EtcdBackend, b: &EtcdBackend, k: &LeaseKey) -> i64 {
    let mut kv = raw.client().kv_client();
    let resp = kv.get(b.etcd_key(k), None).await.expect("raw get");
    resp.kvs().first().map(|kv| kv.lease()).unwrap_or(0)
}

/// A renewal that names no etcd lease (a grant rebuilt from its holder and
/// fence, as a process that did not keep the grant's version does) while
/// the client is sweeping the key from its session lease: the key is
/// still there (the sweep's delete was lost with its connection, and is
/// tried again shortly), but it is abandoned, so the renewal is `Lost`.
/// Renewing it from the session's last keep-alive would promise a deadline
/// past the delete about to land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_versionless_renewal_during_a_sweep_of_its_key_is_lost() {
    let endpoints = common::shared_endpoints().expect("etcd server");
    let raw = common::wait_ready(&endpoints, None, Duration::from_secs(20))
        .await
        .expect("etcd ready");
    let upstream = lease_testkit::harness::socket_addr(&endpoints[0]).unwrap();
    let proxy = lease_conformance::faults::FaultProxy::start(upstream)
        .await
        .unwrap();
    let b = EtcdBackend::connect(
        EtcdConfig::new(vec![format!("http://{}", proxy.addr())])
            .key_prefix(common::unique_prefix("abandoned-versionless")),
    )
    .await
    .expect("connect");
    let ttl = common::three_second_ttl(&b);
    let k = key("a/versionless");
    let start = Instant::now();
    let kept = take(&b, &key("a/kept"), ttl).await;
    let g = take(&b, &k, ttl).await;
    let (holder, fence) = (g.holder().clone(), g.fence());
    drop(g);
    let due = start + ttl;

    // The session lease is kept alive just before the key's due, by a
    // renewal of the other key.
    tokio::time::sleep_until((due - Duration::from_millis(150)).into()).await;
    let kept = match b.renew(&kept, None).await.expect("renew the kept key") {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("the kept key was lost"),
    };
    // The sweep's delete (sent at the due) is held at the proxy, then lost
    // with its connection; it is tried again 200 ms later.
    proxy.blackhole(true);
    tokio::time::sleep_until((due + Duration::from_millis(500)).into()).await;
    proxy.sever();
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.blackhole(false);
    assert!(
        present(&raw, &b, &k).await,
        "the sweep's delete landed: the key must still be there for this test"
    );
    let rebuilt = Grant::new(
        k.clone(),
        holder,
        fence,
        ttl,
        start,
        lease_core::Version::default(),
    );
    let renewal = b.renew(&rebuilt, None).await.expect("renew");
    assert_eq!(
        renewal,
        Renewal::Lost,
        "an abandoned key was renewed while its sweep was under way"
    );
    gone_by(&raw, &b, &k, ttl).await;
    b.release(&kept).await.expect("release");
}
