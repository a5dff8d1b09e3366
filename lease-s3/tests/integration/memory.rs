//! A long-running service touches many distinct keys (`jobs/<uuid>`): what a
//! client remembers per key must stay bounded.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{AcquireRequest, HolderId, LeaseBackend, LeaseKey, Payload, Renewal};
use lease_s3::ObjectStoreBackend;
use object_store::memory::InMemory;
use object_store::ObjectStore;

const KEYS: usize = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_memory_stays_flat_over_100000_keys() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let c = ObjectStoreBackend::new(store.clone(), "leases").unwrap();
    let other = ObjectStoreBackend::new(store, "leases").unwrap();
    let me = HolderId::random();
    let payload = Payload::new(vec![7u8; 1024]).unwrap();
    let mut peak = (0, 0);
    for i in 0..KEYS {
        let k = LeaseKey::new(format!("jobs/{i:08}")).unwrap();
        let g = c
            .try_acquire(
                AcquireRequest::new(k.clone(), me.clone())
                    .ttl(Duration::from_secs(60))
                    .payload(payload.clone()),
            )
            .await
            .unwrap()
            .granted()
            .unwrap();
        if i % 2 == 0 {
            // Renewed and released: nothing about it is needed any more.
            let g = match c.renew(&g, None).await.unwrap() {
                Renewal::Renewed(g) => g,
                Renewal::Lost => panic!("lost"),
            };
            c.release(&g).await.unwrap();
        } else {
            // Left held, and watched by another client.
            other.read(&k).await.unwrap();
        }
        if i % 500 == 0 {
            let now = c.cached_keys();
            peak = (peak.0.max(now.0), peak.1.max(now.1));
        }
    }
    let end = (c.cached_keys(), other.cached_keys());
    eprintln!(
        "after {KEYS} keys: holder caches {} keys / {} payload bytes (peak {} / {}), \
         observer caches {} keys",
        end.0 .0, end.0 .1, peak.0, peak.1, end.1 .0
    );
    assert!(peak.0 <= 5_000, "holder cached up to {} keys", peak.0);
    assert!(
        peak.1 <= 9 << 20,
        "holder cached up to {} payload bytes",
        peak.1
    );
    assert!(end.1 .0 <= 5_000, "observer caches {} keys", end.1 .0);
}

/// Forgetting a key's observation only restarts it: a silent holder's lease
/// is taken over later than it could have been, never sooner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_observation_delays_a_takeover_and_never_hastens_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let holder = ObjectStoreBackend::new(store.clone(), "leases").unwrap();
    let taker = ObjectStoreBackend::new(store, "leases").unwrap();
    let ttl = Duration::from_secs(1);
    let k = LeaseKey::new("jobs/silent").unwrap();
    let _ = holder
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let me = HolderId::random();
    // The taker starts watching, then touches enough other keys to forget it.
    assert!(taker
        .try_acquire(AcquireRequest::new(k.clone(), me.clone()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .is_none());
    for i in 0..5_000 {
        let other = LeaseKey::new(format!("jobs/other-{i}")).unwrap();
        taker
            .try_acquire(AcquireRequest::new(other, me.clone()).ttl(ttl))
            .await
            .unwrap();
    }
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    // A TTL has passed since the first observation, but it was forgotten.
    assert!(
        taker
            .try_acquire(AcquireRequest::new(k.clone(), me.clone()).ttl(ttl))
            .await
            .unwrap()
            .granted()
            .is_none(),
        "taken over on an observation this client no longer had"
    );
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert!(taker
        .try_acquire(AcquireRequest::new(k, me).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .is_some());
}
