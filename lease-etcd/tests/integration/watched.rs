//! Renewals with sessions verified by the client's watch of its prefix
//! instead of a read per key: no read or transaction for the keys while
//! the watch runs, every change acknowledged before a renewal began seen
//! by it, and reads again on a cluster of several members (where a
//! member's watch may lag what another acknowledged).

use crate::common;
use crate::requests::{private_member, received_by, sessions};

use std::time::Duration;

use etcd_client::{Client, PutOptions};
use lease_conformance::faults::FaultProxy;
use lease_core::{AcquireRequest, Grant, HolderId, LeaseBackend, LeaseKey, Renewal};
use lease_etcd::{EtcdBackend, EtcdConfig};

const TTL: Duration = Duration::from_secs(30);

/// Range and Txn requests: what a read of a key, batched or not, costs.
fn key_requests(url: &str) -> u64 {
    received_by(url, |m| m == "Range" || m == "Txn")
}

/// Every message the server received but the background membership and
/// status checks.
fn all_requests(url: &str) -> u64 {
    received_by(url, |m| m != "MemberList" && m != "Status")
}

/// A private one-member etcd (its URL), and a client with sessions under
/// `prefix` that reaches it through a fault proxy. Keep the members:
/// dropping them stops the server.
async fn behind_a_proxy(prefix: &str) -> (Vec<common::Member>, String, FaultProxy, EtcdBackend) {
    let (members, url, _direct) = private_member(sessions, prefix).await;
    let upstream = lease_testkit::harness::socket_addr(&url).expect("etcd address");
    let proxy = FaultProxy::start(upstream).await.expect("proxy");
    let b = EtcdBackend::connect(sessions(
        EtcdConfig::new([format!("http://{}", proxy.addr())]),
        prefix,
    ))
    .await
    .expect("a client behind the proxy");
    (members, url, proxy, b)
}

async fn grant(b: &EtcdBackend, key: &str) -> Grant {
    let req = AcquireRequest::new(LeaseKey::new(key).unwrap(), HolderId::random()).ttl(TTL);
    b.try_acquire(req)
        .await
        .unwrap()
        .granted()
        .expect("a free key")
}

/// Renews every grant at once; each must be renewed.
async fn renew_all(b: &EtcdBackend, grants: Vec<Grant>) -> Vec<Grant> {
    let tasks: Vec<_> = grants
        .into_iter()
        .map(|g| {
            let b = b.clone();
            tokio::spawn(async move {
                match b.renew(&g, None).await.expect("renew") {
                    Renewal::Renewed(r) => {
                        assert_eq!(r.fence(), g.fence(), "a renewal keeps the fence");
                        r
                    }
                    Renewal::Lost => panic!("{} lost while nobody touched it", g.key()),
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("renewal task"));
    }
    out
}

/// 64 keys renewed together, twice: the server sees no read and no
/// transaction, only the session's keep-alives and the watch's progress
/// requests, a handful for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_on_a_session_read_no_key_while_the_watch_runs() {
    let (_members, url, b) = private_member(sessions, "watched/").await;
    let mut grants = Vec::new();
    for i in 0..64 {
        grants.push(grant(&b, &format!("k/{i}")).await);
    }
    let (keys_before, all_before) = (key_requests(&url), all_requests(&url));
    let grants = renew_all(&b, grants).await;
    let grants = renew_all(&b, grants).await;
    let (keys, all) = (
        key_requests(&url) - keys_before,
        all_requests(&url) - all_before,
    );
    eprintln!("128 renewals of 64 keys: {keys} reads or transactions, {all} messages in all");
    assert_eq!(keys, 0, "renewals read their keys");
    assert!(
        all <= 16,
        "128 renewals sent {all} messages: keep-alives and progress requests not shared"
    );
    for g in &grants {
        b.release(g).await.unwrap();
    }
}

/// What another party does to a held key right before its holder renews.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// Deletes it (a break, an operator).
    Delete,
    /// Writes another value over it on the same lease.
    Overwrite,
    /// Deletes it, then another holder acquires it.
    TakeOver,
    /// The same client releases it and acquires it again: a new term.
    NewTerm,
}

/// Every change acknowledged before a renewal began is seen by it: the
/// renewal is never `Renewed`. Each change is made and acknowledged, then
/// the renewal starts at once, many times over, on a client whose renewals
/// are verified by its watch (checked first: a renewal of an untouched key
/// reads nothing). The holder's client reaches etcd through a proxy that
/// delays its traffic while the change is made, so its watch hears of the
/// change well after the change was acknowledged to the others: a renewal
/// that trusted the mirror without catching up first would renew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_acknowledged_before_a_renewal_is_seen_by_it() {
    let (_members, url, proxy, b) = behind_a_proxy("seen/").await;
    let raw = Client::connect([url.clone()], None)
        .await
        .expect("raw client");
    let rival = EtcdBackend::connect(sessions(EtcdConfig::new([url.clone()]), "seen/"))
        .await
        .expect("rival client");
    let control = grant(&b, "control").await;
    let before = key_requests(&url);
    let control = renew_all(&b, vec![control]).await;
    assert_eq!(
        key_requests(&url),
        before,
        "the watch does not verify renewals"
    );
    b.release(&control[0]).await.unwrap();

    let changes = [
        Change::Delete,
        Change::Overwrite,
        Change::TakeOver,
        Change::NewTerm,
    ];
    for round in 0..5 {
        for change in changes {
            let key = format!("k/{round}/{change:?}");
            let g = grant(&b, &key).await;
            let g = renew_all(&b, vec![g]).await.remove(0);
            let ekey = format!("seen/{key}");
            let mut kv = raw.kv_client();
            proxy.set_latency(Duration::from_millis(25));
            match change {
                Change::Delete => {
                    kv.delete(ekey.as_str(), None).await.expect("delete");
                }
                Change::Overwrite => {
                    let lease = kv
                        .get(ekey.as_str(), None)
                        .await
                        .expect("get")
                        .kvs()
                        .first()
                        .map(|k| k.lease())
                        .expect("the key");
                    let opts = PutOptions::new().with_lease(lease);
                    kv.put(ekey.as_str(), "someone else's", Some(opts))
                        .await
                        .expect("put");
                }
                Change::TakeOver => {
                    kv.delete(ekey.as_str(), None).await.expect("delete");
                    let _held = grant(&rival, &key).await;
                }
                Change::NewTerm => {
                    b.release(&g).await.expect("release");
                    let again = AcquireRequest::new(g.key().clone(), g.holder().clone()).ttl(TTL);
                    let next = b
                        .try_acquire(again)
                        .await
                        .unwrap()
                        .granted()
                        .expect("the key again");
                    assert!(next.fence() > g.fence(), "a new term's fence is above");
                }
            }
            let r = b.renew(&g, None).await;
            proxy.set_latency(Duration::ZERO);
            assert!(
                !matches!(r, Ok(Renewal::Renewed(_))),
                "round {round}: a renewal begun after {change:?} was acknowledged renewed the grant"
            );
        }
    }
}

/// On a cluster of three members the watch does not verify renewals:
/// they read their keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_several_members_renewals_read_their_keys() {
    let members = common::start_cluster(3, None).expect("start a three-member etcd");
    let urls: Vec<String> = members.iter().map(|m| m.client_url.clone()).collect();
    common::wait_ready(&urls, None, Duration::from_secs(30))
        .await
        .expect("etcd cluster ready");
    let b = EtcdBackend::connect(sessions(EtcdConfig::new(urls.clone()), "three/"))
        .await
        .unwrap();
    let mut grants = Vec::new();
    for i in 0..8 {
        grants.push(grant(&b, &format!("k/{i}")).await);
    }
    let count = || urls.iter().map(|u| key_requests(u)).sum::<u64>();
    let before = count();
    let grants = renew_all(&b, grants).await;
    let reads = count() - before;
    assert!(
        reads > 0,
        "8 renewals on three members read nothing: the watch verified them"
    );
    for g in &grants {
        b.release(g).await.unwrap();
    }
}

/// After the watch's connection is cut (and nothing written since), the
/// restarted watch verifies renewals again: once one renewal reads nothing,
/// the next ones read nothing either. A watch started past the store's
/// revision has its progress requests dropped by etcd, which left every
/// renewal waiting for an answer that never came, then reading its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_watch_verifies_renewals_again() {
    let (_members, url, proxy, b) = behind_a_proxy("restart/").await;
    let mut g = grant(&b, "k").await;
    proxy.sever();
    // The watch restarts after a pause (backed off, as after any failure);
    // renewals read meanwhile.
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let before = key_requests(&url);
        // Renewals right after the cut may fail on the broken connection.
        let renewed = match b.renew(&g, None).await {
            Ok(Renewal::Renewed(r)) => Some(r),
            Ok(Renewal::Lost) => panic!("lost while nobody touched it"),
            Err(_) => None,
        };
        if let Some(r) = renewed {
            g = r;
            if key_requests(&url) == before {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < give_up,
            "renewals still read their key 30 s after the watch's connection was cut"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = key_requests(&url);
    for _ in 0..3 {
        g = renew_all(&b, vec![g]).await.remove(0);
    }
    assert_eq!(key_requests(&url), before, "renewals read their key");
    b.release(&g).await.unwrap();
}

/// With an empty key prefix the client's keys are the whole keyspace, and
/// the watch covers it all (etcd refuses an empty key, so the range starts
/// at `\0`): renewals read nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_prefix_is_watched_whole() {
    let (_members, url, b) = private_member(|c, _| c.key_prefix(""), "").await;
    let grants = vec![grant(&b, "a").await, grant(&b, "b/c").await];
    let before = key_requests(&url);
    let grants = renew_all(&b, grants).await;
    assert_eq!(key_requests(&url), before, "renewals read their keys");
    for g in &grants {
        b.release(g).await.unwrap();
    }
}
