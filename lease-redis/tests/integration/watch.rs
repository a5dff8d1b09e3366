//! The watch: a waiting acquirer is woken by the scripts' `PUBLISH` within
//! 100 ms of a release, by the expiry of the grant it saw, and, while its
//! subscription is down, by polling every 100 ms.

use std::time::{Duration, Instant};

use lease_core::{HolderId, LeaseBackend, LeaseKey, LeaseState};
use lease_redis::RedisBackend;

use crate::common::{admin, backend, fresh_config, unique, url};

/// Waits on `key` from `seen` in a task; the instant it woke.
fn wait(b: &RedisBackend, key: &LeaseKey, seen: &LeaseState) -> tokio::task::JoinHandle<Instant> {
    let (b, k, s) = (b.clone(), key.clone(), seen.clone());
    tokio::spawn(async move {
        b.wait_for_change(&k, &s).await.unwrap();
        Instant::now()
    })
}

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
    for _ in 0..5 {
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
        let seen = waiter.read(&key).await.unwrap();
        assert!(!seen.is_free());
        // Let the subscription come up: until it listens, waits poll.
        let _ = waiter.wait_for_change(&key, &seen).await;
        let w = wait(&waiter, &key, &seen);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!w.is_finished(), "woken before anything changed");
        let released = Instant::now();
        holder.release(&g).await.unwrap();
        woken.push(w.await.unwrap().saturating_duration_since(released));
    }
    // The median, so one wake delayed by a loaded machine does not fail the
    // test, while waiters that only poll (once a second) would: 3 of 5
    // polls landing within 100 ms of a release is a chance below 1%.
    woken.sort();
    assert!(
        woken[2] < Duration::from_millis(100),
        "median wake {:?} after the release (all: {woken:?})",
        woken[2]
    );
}

#[tokio::test]
async fn an_expiry_wakes_a_waiter_at_the_grants_end() {
    let url = url();
    let b = backend(&url, &fresh_config()).await;
    let key = LeaseKey::new(unique("e")).unwrap();
    b.try_acquire(
        b.request(key.clone(), HolderId::random())
            .ttl(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let seen = b.read(&key).await.unwrap();
    let start = Instant::now();
    while !b.read(&key).await.unwrap().is_free() {
        b.wait_for_change(&key, &seen).await.unwrap();
        assert!(start.elapsed() < Duration::from_secs(3));
    }
    assert!(
        start.elapsed() < Duration::from_millis(1200),
        "{:?}",
        start.elapsed()
    );
}

/// The subscription killed by the server (`CLIENT KILL TYPE pubsub`): the
/// waiters poll every 100 ms until it is back, then messages wake them
/// again.
#[tokio::test]
async fn a_dropped_subscription_falls_back_to_polling_and_comes_back() {
    // A server of its own: killing the subscriptions of the shared one
    // would wake the other tests' waiters.
    let server = lease_testkit::servers::spawn_redis(None).unwrap_or_else(|e| panic!("{e}"));
    let url = server.url.clone();
    let config = fresh_config();
    let holder = backend(&url, &config).await;
    let waiter = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let key = LeaseKey::new(unique("drop")).unwrap();
    for round in 0..2 {
        let g = holder
            .try_acquire(
                holder
                    .request(key.clone(), HolderId::random())
                    .ttl(Duration::from_secs(60)),
            )
            .await
            .unwrap()
            .granted()
            .unwrap();
        let seen = waiter.read(&key).await.unwrap();
        let _ = waiter.wait_for_change(&key, &seen).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Every subscription of the server, ours among them.
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(killed >= 1, "round {round}: no subscription to kill");
        let w = wait(&waiter, &key, &seen);
        let released = Instant::now();
        holder.release(&g).await.unwrap();
        let d = w.await.unwrap().saturating_duration_since(released);
        // Polling every 100 ms; a waiter that did not fall back to polling
        // would wait for the resubscription or the 60 s TTL. The margin is
        // for a loaded machine.
        assert!(
            d < Duration::from_millis(600),
            "round {round}: woken {d:?} after the release"
        );
    }
}
