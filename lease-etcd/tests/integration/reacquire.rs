//! Re-acquires of one's own live grant. Many processes re-acquire one
//! grant under one holder id routinely (lease-keeper's shared leases), so a
//! re-acquire must never shorten the key's life below what a concurrent
//! renewal of the same grant was told: with a TTL no longer than the
//! stored one it keeps the key on its etcd lease; with a longer one it
//! rebinds to a lease refreshed just before the rebind.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_conformance::faults::FaultProxy;
use lease_core::{
    Acquire, AcquireRequest, Grant, HolderId, LeaseBackend, LeaseKey, Payload, Renewal,
};
use lease_etcd::{EtcdBackend, EtcdConfig};

async fn backend_on(endpoints: Vec<String>, prefix: &str, sessions: bool) -> EtcdBackend {
    EtcdBackend::connect(
        EtcdConfig::new(endpoints)
            .key_prefix(prefix)
            .request_timeout(Duration::from_secs(10))
            .sessions(sessions),
    )
    .await
    .expect("connect")
}

async fn ready_endpoints() -> Vec<String> {
    let endpoints = common::shared_endpoints().expect("etcd server");
    common::wait_ready(&endpoints, None, Duration::from_secs(20))
        .await
        .expect("etcd ready");
    endpoints
}

/// The etcd lease the key is bound to, as the server says (0: no key).
async fn bound_lease(b: &EtcdBackend, k: &LeaseKey) -> i64 {
    let mut kv = b.client().kv_client();
    let resp = kv.get(b.etcd_key(k), None).await.expect("raw get");
    resp.kvs().first().map(|kv| kv.lease()).unwrap_or(0)
}

fn req(k: &LeaseKey, h: &HolderId, secs: u64) -> AcquireRequest {
    AcquireRequest::new(k.clone(), h.clone()).ttl(Duration::from_secs(secs))
}

async fn renewed(b: &EtcdBackend, g: &Grant) -> Grant {
    match b.renew(g, None).await.expect("renew") {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("a live grant renewed as lost"),
    }
}

/// A re-acquire with the stored TTL (or a shorter one) leaves the key on
/// its etcd lease, replaces the payload as a rebind did, and the earlier
/// grant keeps renewing on that same lease (each key on a lease of its own:
/// sessions off).
#[tokio::test]
async fn reacquire_with_no_longer_ttl_keeps_the_key_on_its_lease() {
    let b = backend_on(
        ready_endpoints().await,
        &common::unique_prefix("keep"),
        false,
    )
    .await;
    let k = LeaseKey::new("keep").unwrap();
    let a = HolderId::random();
    let g1 = b
        .try_acquire(req(&k, &a, 10))
        .await
        .unwrap()
        .granted()
        .expect("free key");
    let l1 = bound_lease(&b, &k).await;
    assert_ne!(l1, 0);

    let before = Instant::now();
    let g2 = b
        .try_acquire(req(&k, &a, 10))
        .await
        .unwrap()
        .granted()
        .expect("own grant back");
    assert_eq!(g2.fence(), g1.fence());
    assert_eq!(g2.ttl(), Duration::from_secs(10));
    assert!(g2.sent_at() >= before, "counted from within the call");
    assert_eq!(
        bound_lease(&b, &k).await,
        l1,
        "a re-acquire with the same TTL moved the key to another etcd lease"
    );

    // A shorter request gives way to the stored TTL, on the same lease,
    // and its payload replaces the stored one.
    let g3 = b
        .try_acquire(req(&k, &a, 5).payload(Payload::new(b"p2".to_vec()).unwrap()))
        .await
        .unwrap()
        .granted()
        .expect("own grant back");
    assert_eq!(g3.fence(), g1.fence());
    assert_eq!(g3.ttl(), Duration::from_secs(10));
    assert_eq!(bound_lease(&b, &k).await, l1);
    let h = b.read(&k).await.unwrap().holding().cloned().unwrap();
    assert_eq!(h.payload.as_bytes(), b"p2");
    assert_eq!(h.ttl, Duration::from_secs(10));

    // Every copy of the grant renews, on that lease.
    let g1 = renewed(&b, &g1).await;
    let g2 = renewed(&b, &g2).await;
    let g3 = renewed(&b, &g3).await;
    assert_eq!(bound_lease(&b, &k).await, l1);
    for g in [&g1, &g2, &g3] {
        assert_eq!(g.fence(), h.fence);
    }
    // A renewal with a payload after the re-acquire's write still lands.
    match b
        .renew(&g1, Some(Payload::new(b"p3".to_vec()).unwrap()))
        .await
        .unwrap()
    {
        Renewal::Renewed(_) => {}
        Renewal::Lost => panic!("lost"),
    }
    assert_eq!(
        b.read(&k)
            .await
            .unwrap()
            .holding()
            .unwrap()
            .payload
            .as_bytes(),
        b"p3"
    );
    b.release(&g3).await.unwrap();
    assert!(b.read(&k).await.unwrap().is_free());
}

/// The hazard of a rebind: holder A renews its grant every 100 ms (TTL
/// 3 s) directly; B re-acquires the same grant (same holder id) through a
/// proxy that delays every chunk 300 ms (each exchange takes about 1.2 s:
/// an HTTP/2 request and its answer are several chunks). Were B to rebind the key to the lease
/// it granted at the start of its call, the key would expire a TTL after
/// that grant, while A's last renewal before the rebind (which stops the
/// moment the key's lease changes, as a paused holder would) was told it
/// may write until 2 s after its send. A prober of another holder polls
/// throughout: it must never be granted while A's (or B's) latest grant
/// may still write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reacquire_never_shortens_a_renewed_grant() {
    slow_reacquire(3, 300, false).await;
}

/// The same with sessions (the default): A's key is on A's session lease,
/// which B must not keep alive (it carries A's other keys), so B moves the
/// key to a lease of its own, kept alive right before the move and right
/// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reacquire_with_sessions_never_shortens_a_renewed_grant() {
    slow_reacquire(3, 300, true).await;
}

/// The same with B asking for a longer TTL (4 s), which does rebind the
/// key: to a lease B kept alive right before the rebind, so the key still
/// outlives A's deadline. The link is slower (550 ms a chunk): the longer
/// lease hides a shorter delay. Counting from the lease's grant at the
/// start of the call instead fails this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_lengthening_reacquire_never_shortens_a_renewed_grant() {
    slow_reacquire(4, 550, false).await;
}

/// The lengthening re-acquire with sessions on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_lengthening_reacquire_with_sessions_never_shortens_a_renewed_grant() {
    slow_reacquire(4, 550, true).await;
}

async fn slow_reacquire(b_ttl: u64, latency_ms: u64, sessions: bool) {
    let endpoints = ready_endpoints().await;
    let prefix = common::unique_prefix("slowre");
    let a_b = backend_on(endpoints.clone(), &prefix, sessions).await;
    let prober = backend_on(endpoints.clone(), &prefix, sessions).await;
    let upstream = lease_testkit::harness::socket_addr(&endpoints[0]).unwrap();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let b_b = backend_on(vec![format!("http://{}", proxy.addr())], &prefix, sessions).await;

    let k = LeaseKey::new("shared").unwrap();
    let holder = HolderId::new("(shared)").unwrap();
    let ttl = 3;
    let g = a_b
        .try_acquire(req(&k, &holder, ttl))
        .await
        .unwrap()
        .granted()
        .expect("free key");
    let l1 = bound_lease(&a_b, &k).await;

    let latest_a = Arc::new(Mutex::new(g));
    let latest_b: Arc<Mutex<Option<Grant>>> = Arc::new(Mutex::new(None));
    let stop_a = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));

    // A: renews every 100 ms until told to stop (a pause holding its last
    // grant).
    let renewer = {
        let (b, latest, stop) = (a_b.clone(), latest_a.clone(), stop_a.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let g = latest.lock().unwrap().clone();
                match b.renew(&g, None).await {
                    Ok(Renewal::Renewed(g)) => *latest.lock().unwrap() = g,
                    Ok(Renewal::Lost) => return,
                    Err(e) => eprintln!("A's renewal failed: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // Stops A the moment the key's etcd lease changes (a rebind landed).
    let watcher = {
        let (b, k, stop, done) = (a_b.clone(), k.clone(), stop_a.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
                let now = bound_lease(&b, &k).await;
                if now != l1 {
                    eprintln!("the key moved from lease {l1:x} to {now:x}");
                    stop.store(true, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    // The prober: another holder, polling.
    let probe = {
        let (b, k, la, lb, done) = (
            prober.clone(),
            k.clone(),
            latest_a.clone(),
            latest_b.clone(),
            done.clone(),
        );
        tokio::spawn(async move {
            let other = HolderId::random();
            let mut violations = Vec::new();
            let start = Instant::now();
            while !done.load(Ordering::SeqCst) {
                if let Ok(Acquire::Granted(p)) = b.try_acquire(req(&k, &other, 3)).await {
                    let a_may = la.lock().unwrap().may_write();
                    let b_may = lb.lock().unwrap().as_ref().is_some_and(Grant::may_write);
                    let at = start.elapsed();
                    eprintln!("prober granted at {at:?}: A may write {a_may}, B may write {b_may}");
                    if a_may || b_may {
                        violations.push(at);
                    }
                    let _ = b.release(&p).await;
                    return (violations, true);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (violations, false)
        })
    };

    // Let A settle into its renewals, then B re-acquires over the slow link.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_latency(Duration::from_millis(latency_ms));
    let t = Instant::now();
    let b_grant = b_b.try_acquire(req(&k, &holder, b_ttl)).await;
    eprintln!("B's re-acquire took {:?}", t.elapsed());
    proxy.heal();
    match b_grant {
        Ok(Acquire::Granted(g)) => *latest_b.lock().unwrap() = Some(g),
        Ok(Acquire::Held(h)) => eprintln!("B was refused: held by {}", h.holder),
        Err(e) => eprintln!("B's re-acquire failed: {e}"),
    }
    // A pauses now at the latest (if the key's lease did not change
    // before); wait until every grant's deadline and the key's expiry have
    // passed.
    stop_a.store(true, Ordering::SeqCst);
    renewer.await.unwrap();
    tokio::time::sleep(Duration::from_secs(b_ttl) + common::EXPIRY_SLACK + Duration::from_secs(1))
        .await;
    done.store(true, Ordering::SeqCst);
    watcher.await.unwrap();
    let (violations, granted) = probe.await.unwrap();
    assert!(
        violations.is_empty(),
        "another holder was granted the key while a grant of the shared holder may still \
         write (at {violations:?} after the prober started)"
    );
    assert!(
        granted,
        "the key outlived every grant's deadline and its TTL: the prober never got it"
    );
}

/// A client whose acquire of a shared grant went unanswered keeps the key
/// in mind until a sweep after it, to delete whatever that acquire may have
/// bound to its session. When its next acquire finds the grant on another
/// client's lease and keeps it on a lease of its own, that sweep cannot
/// touch the key (it deletes only from this client's session leases), so a
/// renewal of the grant while the sweep runs must still renew it rather
/// than answer `Lost`: a false loss stops this member's work while the
/// phase goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_of_an_unanswered_acquire_does_not_lose_the_grant_kept_elsewhere() {
    let endpoints = ready_endpoints().await;
    let prefix = common::unique_prefix("sweep-elsewhere");
    let upstream = lease_testkit::harness::socket_addr(&endpoints[0]).unwrap();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let x = Arc::new(backend_on(vec![format!("http://{}", proxy.addr())], &prefix, true).await);
    let y = backend_on(endpoints.clone(), &prefix, true).await;
    let k = LeaseKey::new("shared").unwrap();
    let holder = HolderId::new("(shared)").unwrap();
    let ttl = common::three_second_ttl(&x);

    // X's session lease is granted first (as by an acquire of another key)
    // so that the acquire below is one transaction. That acquire is dropped
    // once its write has landed, before its answer (slowed by the proxy)
    // arrives: X will sweep the key one TTL on.
    let warm = x
        .try_acquire(req(&LeaseKey::new("warm").unwrap(), &HolderId::random(), 3))
        .await
        .unwrap()
        .granted()
        .expect("a free key");
    proxy.set_latency(Duration::from_millis(300));
    let start = Instant::now();
    let unanswered = {
        let (x, k, holder) = (x.clone(), k.clone(), holder.clone());
        tokio::spawn(async move { x.try_acquire(req(&k, &holder, 3)).await })
    };
    while bound_lease(&y, &k).await == 0 {
        assert!(start.elapsed() < ttl, "X's acquire never wrote the key");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    unanswered.abort();
    let _ = unanswered.await;
    proxy.heal();
    // Released, so that no sweep of it comes first.
    x.release(&warm).await.unwrap();
    let on_x_session = bound_lease(&y, &k).await;

    // Y (same holder) takes the grant onto a lease of its own; X's next
    // acquire finds it there and keeps it on one of X's own.
    let from_y = y
        .try_acquire(req(&k, &holder, 3))
        .await
        .unwrap()
        .granted()
        .expect("the shared grant for Y");
    let g = x
        .try_acquire(req(&k, &holder, 3))
        .await
        .unwrap()
        .granted()
        .expect("the shared grant for X");
    assert_eq!(g.fence(), from_y.fence());
    let elsewhere = bound_lease(&y, &k).await;
    assert_ne!(elsewhere, on_x_session, "the key stayed on X's session");
    assert!(
        start.elapsed() < ttl - Duration::from_millis(500),
        "the setup took too long"
    );

    // X's sweep starts at its due (a TTL after the unanswered acquire); the
    // proxy keeps its read in flight while X renews the grant.
    tokio::time::sleep_until((start + ttl - Duration::from_millis(300)).into()).await;
    let g = renewed(&x, &g).await;
    proxy.set_latency(Duration::from_millis(400));
    tokio::time::sleep_until((start + ttl + Duration::from_millis(150)).into()).await;
    assert!(
        g.may_write(),
        "the grant's window closed before the renewal"
    );
    let during = x.renew(&g, None).await.expect("renew during the sweep");
    proxy.heal();
    let g = match during {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("a grant kept on another lease was lost to this client's sweep"),
    };
    assert_eq!(g.fence(), from_y.fence());
    assert_eq!(bound_lease(&y, &k).await, elsewhere, "the key moved");
    let g = renewed(&x, &g).await;
    x.release(&g).await.unwrap();
}
