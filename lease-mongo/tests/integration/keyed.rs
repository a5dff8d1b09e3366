//! The keyed lease on a real MongoDB-compatible server: what the shared
//! conformance suite does not reach (upsert races, schema checks, the TTL-index
//! guard, round trips per operation).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, Error, HolderId, LeaseBackend, LeaseKey, LeaseState, Payload, Renewal,
};
use lease_mongo::{MongoBackend, MongoConfig};
use mongodb::bson::{doc, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::{ClientOptions, IndexOptions};
use mongodb::{Client, IndexModel};

fn key(name: &str) -> LeaseKey {
    LeaseKey::new(format!("t/{}", common::unique(name))).unwrap()
}

fn req(key: &LeaseKey, holder: &HolderId, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(key.clone(), holder.clone()).ttl(ttl)
}

async fn raw(config: &MongoConfig) -> mongodb::Collection<Document> {
    raw_on(&common::uri(), config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_upserts_are_contention_not_failure() {
    let uri = common::uri();
    let config = common::fresh_config();
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(Arc::new(common::backend(&uri, &config).await));
    }
    for round in 0..15 {
        // A key nobody has touched: every acquire is an upsert of a new document.
        let k = key(&format!("race{round}"));
        let mut tasks = Vec::new();
        for c in &clients {
            let (c, k) = (c.clone(), k.clone());
            tasks.push(tokio::spawn(async move {
                c.try_acquire(req(&k, &HolderId::random(), Duration::from_secs(30)))
                    .await
            }));
        }
        let mut winners = Vec::new();
        let mut held = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(Acquire::Granted(g)) => winners.push(g),
                Ok(Acquire::Held(h)) => held.push(h),
                Err(e) => panic!("round {round}: a racing acquire failed instead of losing: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one winner");
        let w = &winners[0];
        assert!(
            w.fence().get() > 1,
            "a first grant's fence is the clock floor"
        );
        for h in held {
            assert_eq!((&h.holder, h.fence), (w.holder(), w.fence()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_lives_in_a_document_release_keeps() {
    let uri = common::uri();
    let config = common::fresh_config();
    let b = common::backend(&uri, &config).await;
    let coll = raw(&config).await;
    let k = key("keep");
    let a = HolderId::random();
    let ttl = Duration::from_secs(1);
    let g1 = b
        .try_acquire(req(&k, &a, ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    b.release(&g1).await.unwrap();
    assert!(b.read(&k).await.unwrap().is_free());
    let stored = coll.find_one(doc! { "_id": k.as_str() }).await.unwrap();
    assert!(
        stored.is_some(),
        "release must keep the document holding the fence"
    );
    let g2 = b
        .try_acquire(req(&k, &a, ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(
        g2.fence() > g1.fence(),
        "same holder after release: a new grant"
    );
    tokio::time::sleep(ttl + Duration::from_millis(20)).await;
    assert!(b.read(&k).await.unwrap().is_free());
    assert_eq!(b.renew(&g2, None).await.unwrap(), Renewal::Lost);
    let g3 = b
        .try_acquire(req(&k, &a, ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(
        g3.fence() > g2.fence(),
        "same holder after expiry: a new grant"
    );
    // A new client (as after a restart of the holder) continues the sequence.
    let b2 = common::backend(&uri, &config).await;
    b.release(&g3).await.unwrap();
    let g4 = b2
        .try_acquire(req(&k, &HolderId::random(), ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(g4.fence() > g3.fence());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_reports_remaining_time_on_the_server_clock() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let k = key("remaining");
    let p = Payload::new(b"node-3".to_vec()).unwrap();
    let g = b
        .try_acquire(req(&k, &HolderId::random(), Duration::from_secs(5)).payload(p.clone()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let LeaseState::Held(h) = b.read(&k).await.unwrap() else {
        panic!("held")
    };
    let left = h.remaining.unwrap();
    assert!(left <= Duration::from_millis(4700), "{left:?}");
    assert!(left >= Duration::from_millis(3500), "{left:?}");
    assert_eq!(
        (h.fence, h.ttl, &h.payload),
        (g.fence(), Duration::from_secs(5), &p)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_malformed_documents_are_corrupt_and_untouched() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let coll = raw(&config).await;
    let cases = [
        doc! { "note": "another program's document" },
        doc! { "v": 2, "fence": 1_i64 },
        doc! { "v": 1, "fence": "seven", "holder": null },
        doc! { "v": 1, "fence": 3_i64, "holder": "x", "ttl_ms": 1000_i64, "expires_ms": 5_i64, "at_ms": 1_i64 },
    ];
    for (i, mut d) in cases.into_iter().enumerate() {
        let k = key(&format!("corrupt{i}"));
        d.insert("_id", k.as_str());
        coll.insert_one(d.clone()).await.unwrap();
        let holder = HolderId::random();
        match b
            .try_acquire(req(&k, &holder, Duration::from_secs(5)))
            .await
        {
            Err(Error::CorruptRecord { key, .. }) => assert_eq!(key, k.as_str()),
            other => panic!("case {i}: acquire gave {other:?}"),
        }
        assert!(
            matches!(b.read(&k).await, Err(Error::CorruptRecord { .. })),
            "case {i}: read"
        );
        let after = coll
            .find_one(doc! { "_id": k.as_str() })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            after, d,
            "case {i}: the document must be left exactly as it was"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_index_is_refused() {
    let config = common::fresh_config();
    let coll = raw(&config).await;
    let ttl_index = IndexModel::builder()
        .keys(doc! { "expires_at": 1 })
        .options(
            IndexOptions::builder()
                .expire_after(Duration::from_secs(60))
                .name("expiry".to_string())
                .build(),
        )
        .build();
    coll.create_index(ttl_index).await.unwrap();
    match MongoBackend::connect(&common::uri(), config).await {
        Err(Error::Backend(e)) => assert!(e.to_string().contains("TTL index"), "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // And a clean collection gets its index made once, idempotently.
    let config = common::fresh_config();
    common::backend(&common::uri(), &config).await;
    common::backend(&common::uri(), &config).await;
    let names = raw(&config).await.list_index_names().await.unwrap();
    assert!(names.contains(&"lease_expires_ms".to_string()), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_ttl_is_validated_and_used() {
    let uri = common::uri();
    assert!(matches!(
        MongoBackend::connect(
            &uri,
            common::fresh_config().default_ttl(Duration::from_secs(2 * 86400))
        )
        .await,
        Err(Error::InvalidTtl { .. })
    ));
    let b = common::backend(
        &uri,
        &common::fresh_config().default_ttl(Duration::from_millis(1500)),
    )
    .await;
    let r = b.request(key("dflt"), HolderId::random());
    assert_eq!(r.ttl, Duration::from_millis(1500));
    let g = b.try_acquire(r).await.unwrap().granted().unwrap();
    assert_eq!(g.ttl(), Duration::from_millis(1500));
}

/// Each operation is one request to the server (the goal: acquire and renew
/// in one round trip). Also prints the latency of each, for the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_operation() {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut options = ClientOptions::parse(common::uri()).await.unwrap();
    let log = seen.clone();
    options.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        if let CommandEvent::Started(s) = ev {
            log.lock().unwrap().push(s.command_name);
        }
    }));
    let client = Client::with_options(options).unwrap();
    let b = MongoBackend::new(client, common::fresh_config())
        .await
        .unwrap();
    let ttl = Duration::from_secs(10);
    let take = || std::mem::take(&mut *seen.lock().unwrap());
    take();
    let rounds = 30;
    let mut lat: [Vec<Duration>; 4] = Default::default();
    for i in 0..rounds {
        let k = key(&format!("rt{i}"));
        let t = Instant::now();
        let g = b
            .try_acquire(req(&k, &HolderId::random(), ttl))
            .await
            .unwrap()
            .granted()
            .unwrap();
        lat[0].push(t.elapsed());
        assert_eq!(take(), ["findAndModify"], "acquire");
        let t = Instant::now();
        let Renewal::Renewed(g) = b.renew(&g, None).await.unwrap() else {
            panic!("renew")
        };
        lat[1].push(t.elapsed());
        assert_eq!(take(), ["findAndModify"], "renew");
        let t = Instant::now();
        assert!(!b.read(&k).await.unwrap().is_free());
        lat[2].push(t.elapsed());
        assert_eq!(take(), ["aggregate"], "read");
        let t = Instant::now();
        b.release(&g).await.unwrap();
        lat[3].push(t.elapsed());
        assert_eq!(take(), ["update"], "release");
    }
    // The last break is one read of the lease document's stamp, also after
    // the key was taken again; a key with no stamp also asks the audit records.
    let k = key("rt-break");
    let g = b
        .try_acquire(req(&k, &HolderId::random(), ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(b.last_break(&k).await.unwrap(), None);
    assert_eq!(take(), ["findAndModify", "find", "find"], "never broken");
    let note = lease_core::BreakNote::new("t", "t").with_at_unix_ms(1);
    b.break_lease(&k, &note).await.unwrap();
    let _ = b
        .try_acquire(req(&k, &HolderId::random(), ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    take();
    let last = b.last_break(&k).await.unwrap().unwrap();
    assert_eq!(
        (last.holder, last.fence),
        (Some(g.holder().clone()), Some(g.fence()))
    );
    assert_eq!(take(), ["find"], "last_break");
    for (name, l) in ["acquire", "renew", "read", "release"]
        .iter()
        .zip(lat.iter_mut())
    {
        l.sort();
        eprintln!(
            "{name}: 1 request; p50 {:?}, p99 {:?} over {rounds}",
            l[l.len() / 2],
            l[(l.len() * 99 / 100).min(l.len() - 1)]
        );
    }
}

/// Fences keep rising across a kill -9 and restart of the server: the
/// counter is data, not memory. (SecantusDB keeps its storage directory;
/// run with `LEASE_TEST_MONGODB_URI` unset to use a private server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_survive_a_server_restart() {
    let mut server = lease_testkit::servers::spawn_mongo(None)
        .unwrap_or_else(|e| panic!("a private SecantusDB: {e}"));
    let config = common::fresh_config();
    let k = key("restart");
    let ttl = Duration::from_secs(30);
    let before = {
        let b = common::backend(&server.uri, &config).await;
        let g = b
            .try_acquire(req(&k, &HolderId::random(), ttl))
            .await
            .unwrap()
            .granted()
            .unwrap();
        b.release(&g).await.unwrap();
        let g = b
            .try_acquire(req(&k, &HolderId::random(), ttl))
            .await
            .unwrap()
            .granted()
            .unwrap();
        g.fence()
    };
    server.kill().unwrap();
    server.restart().unwrap();
    let b = common::backend(&server.uri, &config).await;
    // Still held by the grant from before the restart (its TTL has not run out).
    let LeaseState::Held(h) = b.read(&k).await.unwrap() else {
        panic!("the grant survived")
    };
    assert_eq!(h.fence, before);
    // Let it expire without waiting 30 s: an administrator's hand edit.
    raw_on(&server.uri, &config)
        .await
        .update_one(
            doc! { "_id": k.as_str() },
            doc! { "$set": { "expires_ms": 0_i64 } },
        )
        .await
        .unwrap();
    let g = b
        .try_acquire(req(&k, &HolderId::random(), ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(g.fence() > before, "the fence continues after the restart");
}

async fn raw_on(uri: &str, config: &MongoConfig) -> mongodb::Collection<Document> {
    Client::with_uri_str(uri)
        .await
        .unwrap()
        .database(&config.database)
        .collection(&config.collection)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_over_a_foreign_document_is_corrupt_not_lost() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let k = key("renew-corrupt");
    let g = b
        .try_acquire(req(&k, &HolderId::random(), Duration::from_secs(10)))
        .await
        .unwrap()
        .granted()
        .unwrap();
    raw(&config)
        .await
        .replace_one(
            doc! { "_id": k.as_str() },
            doc! { "note": "overwritten by another program" },
        )
        .await
        .unwrap();
    assert!(matches!(
        b.renew(&g, None).await,
        Err(Error::CorruptRecord { .. })
    ));
    // Release never touches it.
    b.release(&g).await.unwrap();
    assert!(matches!(b.read(&k).await, Err(Error::CorruptRecord { .. })));
}

/// `shutdown` ends the client while the runtime runs: the lease it held stays
/// held (no release), and later operations are errors, not panics or hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_the_client_and_keeps_the_lease() {
    let uri = common::uri();
    let config = common::fresh_config();
    let b = common::backend(&uri, &config).await;
    let k = key("shut");
    let holder = HolderId::random();
    let g = b
        .try_acquire(req(&k, &holder, Duration::from_secs(30)))
        .await
        .unwrap()
        .granted()
        .unwrap();
    b.shutdown().await;
    let after = tokio::time::timeout(Duration::from_secs(10), b.read(&k))
        .await
        .expect("an operation after shutdown answers at once");
    assert!(
        matches!(after, Err(Error::Unavailable { .. })),
        "read after shutdown: {after:?}"
    );
    // A second shutdown (another clone, or twice) is harmless.
    b.clone().shutdown().await;
    let other = common::backend(&uri, &config).await;
    let state = other.read(&k).await.unwrap();
    let h = state.holding().expect("still held after shutdown");
    assert_eq!((&h.holder, h.fence), (&holder, g.fence()));
    other.shutdown().await;
}

/// Fences keep rising when records vanish or are rewound behind the
/// library's back: a cleanup's `deleteMany`, a dropped collection, a restore
/// of an older copy of a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_over_deleted_and_rewound_records() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let coll = raw(&config).await;
    let k = key("rewind");
    let ttl = Duration::from_secs(30);
    let mut last = lease_core::Fence(0);
    let grant = || async {
        let g = b
            .try_acquire(req(&k, &HolderId::random(), ttl))
            .await
            .unwrap()
            .granted()
            .unwrap();
        b.release(&g).await.unwrap();
        g.fence()
    };
    let first = grant().await;
    let old_copy = coll
        .find_one(doc! { "_id": k.as_str() })
        .await
        .unwrap()
        .unwrap();
    for _ in 0..3 {
        last = grant().await;
    }
    // A restore of the dump taken after the first grant. (The assumption
    // the fences rest on: the server's clock moves on by a millisecond.)
    coll.replace_one(doc! { "_id": k.as_str() }, old_copy)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    let after_restore = grant().await;
    assert!(
        after_restore > last,
        "fence {after_restore} after a rewind is not above {last} (first was {first})"
    );
    coll.delete_many(doc! {}).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    let after_cleanup = grant().await;
    assert!(after_cleanup > after_restore, "after deleteMany");
    coll.drop().await.unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    let after_drop = grant().await;
    assert!(after_drop > after_cleanup, "after dropping the collection");
}

/// A write binds the server's `$$NOW` when it starts and may apply it much
/// later (a lock wait, a stalled primary): a renewal or re-acquire whose
/// answer the holder gave up on can land after the next one, which already
/// promised the holder a later deadline. Landing, it must never move the
/// record's expiry earlier than what is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_or_reacquire_landing_late_never_moves_the_expiry_earlier() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let ttl = Duration::from_secs(10);
    let k = key("late-renewal");
    let holder = HolderId::random();
    let g = b
        .try_acquire(req(&k, &holder, ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let coll = raw(&config).await;
    let stored = || async {
        let d = coll.find_one(doc! { "_id": k.as_str() }).await.unwrap();
        d.unwrap().get_i64("expires_ms").unwrap()
    };
    // A later write (bound 5 s later) landed first.
    let later = stored().await + 5_000;
    coll.update_one(
        doc! { "_id": k.as_str() },
        doc! { "$set": { "expires_ms": later } },
    )
    .await
    .unwrap();
    let Renewal::Renewed(_) = b.renew(&g, None).await.unwrap() else {
        panic!("the grant is live")
    };
    let after = stored().await;
    assert!(
        after >= later,
        "the renewal moved the expiry from {later} to {after}"
    );
    let again = b.try_acquire(req(&k, &holder, ttl)).await.unwrap();
    assert_eq!(again.granted().unwrap().fence(), g.fence());
    let after = stored().await;
    assert!(
        after >= later,
        "the re-acquire moved the expiry from {later} to {after}"
    );
}
