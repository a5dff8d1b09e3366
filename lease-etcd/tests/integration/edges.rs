//! etcd at the edges of the contract: the TTL the server really enforces,
//! and a break that must not reach beyond its own key.

use crate::common;

use std::time::Duration;

use etcd_client::PutOptions;
use lease_core::{Acquire, AcquireRequest, BreakNote, HolderId, LeaseBackend, LeaseKey};
use lease_etcd::{EtcdBackend, EtcdConfig};

fn key(k: &str) -> LeaseKey {
    LeaseKey::new(k).unwrap()
}

/// With etcd's default timing (100 ms heartbeat, 1 s election timeout) the
/// server raises every lease below 2 s to 2 s: the capabilities and the
/// grant must say so, not etcd's nominal 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimum_ttl_is_what_the_server_enforces() {
    let members = common::start_cluster_timed(1, None, 100, 1000).expect("start etcd");
    let endpoints = vec![members[0].client_url.clone()];
    common::wait_ready(&endpoints, None, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", members[0].log_tail()));
    let b = EtcdBackend::connect(EtcdConfig::new(endpoints).key_prefix("edges/"))
        .await
        .expect("connect");
    let caps = b.capabilities();
    assert_eq!(caps.ttl.min, Duration::from_secs(2), "reported minimum TTL");
    let req =
        AcquireRequest::new(key("edges/min-ttl"), HolderId::random()).ttl(Duration::from_secs(1));
    let Acquire::Granted(g) = b.try_acquire(req).await.expect("acquire") else {
        panic!("a fresh key was held");
    };
    assert_eq!(g.ttl(), Duration::from_secs(2), "the grant's effective TTL");
    b.release(&g).await.expect("release");
}

/// A value this library did not write may be bound to someone else's etcd
/// lease, which may carry other keys: breaking it deletes that one key and
/// must not revoke the lease (which would delete the others).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_a_foreign_value_leaves_its_etcd_lease_alone() {
    let endpoints = common::shared_endpoints().expect("etcd server");
    let raw = common::wait_ready(&endpoints, None, Duration::from_secs(20))
        .await
        .expect("etcd ready");
    let prefix = common::unique_prefix("edges-break");
    let b = EtcdBackend::connect(EtcdConfig::new(endpoints).key_prefix(&prefix))
        .await
        .expect("connect");
    let mut client = raw.client().clone();
    let foreign = client.lease_grant(60, None).await.expect("grant").id();
    let other = format!("{prefix}.other-app/state");
    let k = key("edges/foreign");
    for (name, value) in [
        (other.clone(), "theirs"),
        (b.etcd_key(&k), "not a lease record"),
    ] {
        client
            .put(name, value, Some(PutOptions::new().with_lease(foreign)))
            .await
            .expect("raw put");
    }
    let broken = b
        .break_lease(
            &k,
            &BreakNote::new("edges-test", "a foreign value").with_at_unix_ms(0),
        )
        .await
        .expect("break");
    assert!(broken.previous.is_none());
    let left = client.get(other.as_str(), None).await.expect("get");
    assert_eq!(
        left.kvs().len(),
        1,
        "breaking one key revoked the foreign etcd lease and deleted {other}"
    );
    let ttl = client.lease_time_to_live(foreign, None).await.expect("ttl");
    assert!(ttl.ttl() > 0, "the foreign etcd lease was revoked");
    let _ = client.lease_revoke(foreign).await;
}

/// The last break of a key is read from its own audit records, newest
/// first: not from those of a key below it (`jobs/a/b` shares the prefix
/// of `jobs/a`), and not from an older break of the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_break_reads_only_its_own_newest_record() {
    let endpoints = common::shared_endpoints().expect("etcd server");
    common::wait_ready(&endpoints, None, Duration::from_secs(20))
        .await
        .expect("etcd ready");
    let prefix = common::unique_prefix("edges-last-break");
    let b = EtcdBackend::connect(EtcdConfig::new(endpoints).key_prefix(&prefix))
        .await
        .expect("connect");
    let note = |reason: &str| BreakNote::new("edges-test", reason).with_at_unix_ms(7);
    let (parent, child) = (key("jobs/a"), key("jobs/a/b"));
    assert_eq!(b.last_break(&parent).await.expect("read"), None);
    b.break_lease(&child, &note("child only"))
        .await
        .expect("break");
    assert_eq!(
        b.last_break(&parent).await.expect("read"),
        None,
        "the child's break was taken for the parent's"
    );
    for reason in ["first", "second"] {
        let req = AcquireRequest::new(parent.clone(), HolderId::random());
        let Acquire::Granted(_) = b.try_acquire(req).await.expect("acquire") else {
            panic!("the parent key was held");
        };
        b.break_lease(&parent, &note(reason)).await.expect("break");
    }
    b.break_lease(&child, &note("child again"))
        .await
        .expect("break");
    let last = b.last_break(&parent).await.expect("read").expect("a break");
    assert_eq!(last.note.reason, "second");
    assert!(last.holder.is_some() && last.fence.is_some(), "{last:?}");
    let last = b.last_break(&child).await.expect("read").expect("a break");
    assert_eq!(last.note.reason, "child again");
    assert_eq!(last.holder, None);
}
