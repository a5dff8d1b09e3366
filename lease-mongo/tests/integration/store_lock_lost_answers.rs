//! The writer/fsck protocol under an unknown outcome, on a real
//! MongoDB-compatible server behind a fault proxy: a writer registration
//! whose insert was applied but whose answer was lost must not block fsck
//! until someone uses `force`.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use lease_conformance::faults::FaultProxy;
use lease_mongo::store_lock::{StoreLeases, StoreLockTiming};
use mongodb::bson::{doc, Document};
use mongodb::options::{ClientOptions, ServerAddress};
use mongodb::Client;

/// Stale after 400 ms; fsck gives up after 4 s of draining; requests time
/// out after 500 ms.
fn timing() -> StoreLockTiming {
    StoreLockTiming::default()
        .refresh_interval(Duration::from_millis(200))
        .stale_multiplier(2)
        .poll(Duration::from_millis(5), Duration::from_millis(40))
        .drain_timeout(Some(Duration::from_secs(4)))
        .request_timeout(Duration::from_millis(500))
}

async fn upstream() -> SocketAddr {
    let o = ClientOptions::parse(common::uri()).await.unwrap();
    match o.hosts.as_slice() {
        [ServerAddress::Tcp { host, port }] => {
            tokio::net::lookup_host((host.as_str(), port.unwrap_or(27017)))
                .await
                .unwrap()
                .next()
                .unwrap()
        }
        other => panic!("a single-host test server, not {other:?}"),
    }
}

/// A writer's side through `proxy`, an fsck side straight to the server,
/// and the raw collection, all on a fresh collection.
async fn sides(
    proxy: &FaultProxy,
    timing: StoreLockTiming,
) -> (StoreLeases, StoreLeases, mongodb::Collection<Document>) {
    let name = common::unique("store_faults");
    let via = Client::with_uri_str(format!(
        "mongodb://{}/?directConnection=true&retryWrites=false",
        proxy.addr()
    ))
    .await
    .unwrap();
    let direct = Client::with_uri_str(common::uri()).await.unwrap();
    let writer_side = StoreLeases::in_collection(&via.database("lease_test"), &name, timing)
        .await
        .unwrap();
    let fsck_side = StoreLeases::in_collection(&direct.database("lease_test"), &name, timing)
        .await
        .unwrap();
    (
        writer_side,
        fsck_side,
        direct.database("lease_test").collection(&name),
    )
}

async fn registrations(raw: &mongodb::Collection<Document>) -> u64 {
    raw.count_documents(doc! { "kind": "writer" })
        .await
        .unwrap()
}

/// The registration insert is applied, its answer lost: the writer's error
/// says the outcome is unknown, its registration is cleaned up, and fsck
/// (without force) proceeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_registration_answer_is_cleaned_up() {
    let proxy = FaultProxy::start(upstream().await).await.unwrap();
    proxy.set_drop_window(Duration::from_millis(300));
    let (writer_side, fsck_side, raw) = sides(&proxy, timing()).await;
    proxy.drop_responses(1);
    let r = writer_side.acquire_writer("w").await;
    assert!(r.is_err(), "the registration's answer was dropped: {r:?}");
    proxy.heal();
    let fsck = fsck_side.acquire_fsck("fsck", false).await;
    assert!(
        fsck.is_ok(),
        "fsck blocked by a registration whose insert outcome was unknown: {:?} ({} registrations left)",
        fsck.err(),
        registrations(&raw).await
    );
}

/// As above, and the clean-up fails too (the network goes silent right
/// after the insert): the leftover registration was never confirmed, so
/// once stale it ages out and fsck (without force) proceeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_registration_ages_out() {
    let proxy = FaultProxy::start(upstream().await).await.unwrap();
    proxy.set_drop_window(Duration::from_secs(30));
    let (writer_side, fsck_side, raw) = sides(&proxy, timing()).await;
    proxy.drop_responses(1);
    let acquire = tokio::spawn(async move { writer_side.acquire_writer("w").await });
    // The insert has reached the server; silence everything after it.
    tokio::time::timeout(Duration::from_secs(5), async {
        while registrations(&raw).await == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the registration reached the server");
    proxy.blackhole(true);
    let r = tokio::time::timeout(Duration::from_secs(60), acquire)
        .await
        .expect("acquire_writer ends")
        .unwrap();
    assert!(r.is_err(), "the registration's answer was dropped: {r:?}");
    assert_eq!(registrations(&raw).await, 1, "the clean-up could not run");
    let fsck = fsck_side.acquire_fsck("fsck", false).await;
    assert!(
        fsck.is_ok(),
        "fsck blocked by a registration that was never confirmed: {:?}",
        fsck.err()
    );
    assert_eq!(registrations(&raw).await, 0);
    proxy.heal();
}
