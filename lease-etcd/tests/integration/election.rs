//! lease-keeper's election observer on etcd, whose remaining times are
//! whole seconds.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{AcquireRequest, HolderId, LeaseBackend, LeaseKey, Payload, Renewal};
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_keeper::Keeper;
use tokio::time::{sleep, timeout, Instant};

use crate::common::{shared_endpoints, unique_prefix};

/// etcd reports a grant with under a second left as 0 s remaining. Such a
/// leader is still the leader: one renewal late by a few hundred
/// milliseconds must not make the observer report no leader, nor stay stuck
/// there once the renewal extended the same grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_under_a_second_left_is_still_the_leader() {
    let endpoints = shared_endpoints().unwrap_or_else(|e| panic!("{e}"));
    let b = EtcdBackend::connect(EtcdConfig::new(endpoints).key_prefix(unique_prefix("elect")))
        .await
        .expect("connect");
    let key = LeaseKey::new("leader").unwrap();
    let ttl = Duration::from_secs(2);
    let granted_at = Instant::now();
    let g = b
        .try_acquire(
            AcquireRequest::new(key.clone(), HolderId::random())
                .ttl(ttl)
                .payload(Payload::new("value").unwrap()),
        )
        .await
        .expect("acquire")
        .granted()
        .expect("a fresh key");
    let backend: Arc<dyn LeaseBackend> = Arc::new(b.clone());
    let mut observer = Keeper::new(backend)
        .election(&key)
        .with_poll_interval(Duration::from_millis(100))
        .observe();
    let first = timeout(Duration::from_secs(5), observer.changed())
        .await
        .expect("a first read");
    let leader = first.expect("the leader");
    assert_eq!(leader.fence, g.fence());
    // The renewal comes late: in the TTL's last second, where etcd says 0 s
    // are left, and the observer reads every 100 ms meanwhile.
    sleep((granted_at + Duration::from_millis(1_600)).saturating_duration_since(Instant::now()))
        .await;
    assert!(
        matches!(b.renew(&g, None).await.expect("renew"), Renewal::Renewed(_)),
        "the grant was live"
    );
    sleep(Duration::from_millis(800)).await;
    while let Ok(change) = timeout(Duration::from_millis(10), observer.changed()).await {
        assert_eq!(
            change.as_ref().map(|l| l.fence),
            Some(g.fence()),
            "the observer reported {change:?} while {} led throughout",
            g.holder()
        );
    }
    assert_eq!(
        observer.current().map(|l| l.fence),
        Some(g.fence()),
        "the observer does not show the leader"
    );
    b.release(&g).await.expect("release");
}
