//! The watch: a waiting acquirer is woken by LISTEN/NOTIFY within 100 ms
//! of a release, and by the expiry of the grant it saw.

use std::time::{Duration, Instant};

use lease_core::{HolderId, LeaseBackend, LeaseKey};

use crate::common::{backend, fresh_config, unique, url};

#[tokio::test]
async fn a_release_wakes_a_waiter_within_100_ms() {
    let url = url();
    let config = fresh_config();
    let holder = backend(&url, &config).await;
    let waiter = backend(&url, &config).await;
    assert!(waiter.capabilities().watch);
    let key = LeaseKey::new(unique("w")).unwrap();
    let me = HolderId::random();
    let mut woken = Vec::new();
    let mut last_fence = None;
    for _ in 0..3 {
        let g = holder
            .try_acquire(
                holder
                    .request(key.clone(), me.clone())
                    .ttl(Duration::from_secs(60)),
            )
            .await
            .unwrap()
            .granted()
            .unwrap();
        assert!(last_fence.is_none_or(|f| g.fence() > f));
        last_fence = Some(g.fence());
        let seen = waiter.read(&key).await.unwrap();
        assert!(!seen.is_free());
        // Let the watch connection come up. Until it listens, a wait
        // returns within 100 ms (it polls); once it listens, a wait that
        // nothing wakes lasts its idle bound (a second). On a loaded
        // machine connecting can outlast one polling wait.
        let up = Instant::now();
        loop {
            let t = Instant::now();
            waiter.wait_for_change(&key, &seen).await.unwrap();
            if t.elapsed() >= Duration::from_millis(500) {
                break;
            }
            assert!(
                up.elapsed() < Duration::from_secs(30),
                "the watch connection did not come up in 30 s"
            );
        }
        let w = waiter.clone();
        let (k, s) = (key.clone(), seen.clone());
        let wait = tokio::spawn(async move {
            w.wait_for_change(&k, &s).await.unwrap();
            Instant::now()
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!wait.is_finished(), "woken before anything changed");
        let released = Instant::now();
        holder.release(&g).await.unwrap();
        let at = wait.await.unwrap();
        woken.push(at.saturating_duration_since(released));
    }
    // The median of three: one wake delayed by a stalled scheduler on a
    // loaded machine is not the watch's fault; waits that poll (every
    // second) would put every wake far above it.
    woken.sort();
    assert!(
        woken[1] < Duration::from_millis(100),
        "woken {woken:?} after the releases"
    );
}

#[tokio::test]
async fn an_expiry_wakes_a_waiter() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let key = LeaseKey::new(unique("e")).unwrap();
    b.try_acquire(
        b.request(key.clone(), HolderId::random())
            .ttl(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let seen = b.read(&key).await.unwrap();
    let start = Instant::now();
    b.wait_for_change(&key, &seen).await.unwrap();
    // Woken by the poll bound at the seen grant's deadline: the key is free.
    while !b.read(&key).await.unwrap().is_free() {
        b.wait_for_change(&key, &seen).await.unwrap();
        assert!(start.elapsed() < Duration::from_secs(3));
    }
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
}
