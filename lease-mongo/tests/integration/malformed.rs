//! Malformed records on a real MongoDB-compatible server: acquire, renew,
//! release and read agree on what a lease record is, and every one of them
//! leaves a malformed record byte-identical. Only `break_lease` replaces it.

use crate::common;

use std::time::{Duration, Instant};

use lease_core::{
    AcquireRequest, BreakNote, Error, Fence, Grant, HolderId, LeaseBackend, LeaseKey, Version,
};
use mongodb::bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use mongodb::Client;

fn key(name: &str) -> LeaseKey {
    LeaseKey::new(format!("m/{}", common::unique(name))).unwrap()
}

fn bin(len: usize) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes: vec![7; len],
    })
}

/// A well-formed record as an earlier version of this library wrote it
/// (schema marker `v: 1`), held by `h1` with fence 5, live for an hour or
/// expired long ago.
fn legacy(live: bool) -> Document {
    let far = 4_000_000_000_000_i64; // year 2096, in ms
    doc! {
        "v": 1, "fence": 5_i64, "holder": "h1", "ttl_ms": 10_000_i64,
        "expires_ms": if live { far } else { 1_000_i64 }, "at_ms": 500_i64,
        "payload": bin(3),
    }
}

/// (name, field, replacement); `None` removes the field.
fn shapes() -> Vec<(&'static str, &'static str, Option<Bson>)> {
    vec![
        ("fence0", "fence", Some(Bson::Int64(0))),
        ("fence-3", "fence", Some(Bson::Int64(-3))),
        ("fence-text", "fence", Some(Bson::String("5".into()))),
        ("fence-double", "fence", Some(Bson::Double(5.0))),
        ("fence-missing", "fence", None),
        ("fence-huge", "fence", Some(Bson::Int64(i64::MAX))),
        ("ttl-1", "ttl_ms", Some(Bson::Int64(-1))),
        ("ttl0", "ttl_ms", Some(Bson::Int64(0))),
        ("ttl-huge", "ttl_ms", Some(Bson::Int64(i64::MAX))),
        ("ttl-missing", "ttl_ms", None),
        (
            "holder-space",
            "holder",
            Some(Bson::String("has space".into())),
        ),
        ("holder-empty", "holder", Some(Bson::String(String::new()))),
        (
            "holder-newline",
            "holder",
            Some(Bson::String("h1\n".into())),
        ),
        ("holder-long", "holder", Some(Bson::String("h".repeat(129)))),
        ("holder-int", "holder", Some(Bson::Int32(5))),
        ("holder-missing", "holder", None),
        ("expires-double", "expires_ms", Some(Bson::Double(1.5))),
        ("expires-negative", "expires_ms", Some(Bson::Int64(-5))),
        ("expires-missing", "expires_ms", None),
        ("at-missing", "at_ms", None),
        ("at-text", "at_ms", Some(Bson::String("now".into()))),
        ("payload-text", "payload", Some(Bson::String("text".into()))),
        ("payload-missing", "payload", None),
        ("payload-oversize", "payload", Some(bin(64 * 1024 + 1))),
        ("marker-v2", "v", Some(Bson::Int32(2))),
        ("marker-double", "v", Some(Bson::Double(1.0))),
        ("marker-missing", "v", None),
    ]
}

async fn raw(config: &lease_mongo::MongoConfig) -> mongodb::Collection<Document> {
    Client::with_uri_str(common::uri())
        .await
        .unwrap()
        .database(&config.database)
        .collection(&config.collection)
}

/// A document for a failure message, without the bulk of a big payload.
fn short(d: &Document) -> String {
    let mut d = d.clone();
    if let Some(Bson::Binary(b)) = d.get("payload") {
        let len = b.bytes.len();
        d.insert("payload", format!("<{len} bytes>"));
    }
    d.to_string()
}

fn grant(k: &LeaseKey, holder: &str, fence: u64) -> Grant {
    Grant::new(
        k.clone(),
        HolderId::new(holder).unwrap(),
        Fence(fence),
        Duration::from_secs(10),
        Instant::now(),
        Version::new(fence.to_string()),
    )
}

/// Every malformed shape, live and expired, through acquire (by the holder
/// the record names and by a stranger), renew, release and read: each
/// refuses with `CorruptRecord` (release: a no-op) and the stored document
/// stays byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_leaves_a_malformed_record_byte_identical() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let coll = raw(&config).await;
    let mut failures = Vec::new();
    for live in [true, false] {
        for (name, field, value) in shapes() {
            let k = key(name);
            let mut d = legacy(live);
            match &value {
                Some(v) => d.insert(field, v.clone()),
                None => d.remove(field),
            };
            d.insert("_id", k.as_str());
            coll.insert_one(d).await.unwrap();
            // As stored (the server puts `_id` first).
            let d = coll
                .find_one(doc! { "_id": k.as_str() })
                .await
                .unwrap()
                .unwrap();
            let case = format!("{name} ({})", if live { "live" } else { "expired" });
            let mut check = |op: &str, outcome: String, ok: bool| {
                if !ok {
                    let outcome: String = outcome.chars().take(200).collect();
                    failures.push(format!("{case}: {op} gave {outcome}"));
                }
            };
            for who in ["h1", "stranger"] {
                let r = b
                    .try_acquire(
                        AcquireRequest::new(k.clone(), HolderId::new(who).unwrap())
                            .ttl(Duration::from_secs(5)),
                    )
                    .await;
                let ok = matches!(r, Err(Error::CorruptRecord { .. }));
                check(&format!("acquire by {who}"), format!("{r:?}"), ok);
            }
            let g = grant(&k, "h1", 5);
            let r = b.renew(&g, None).await;
            let ok = matches!(r, Err(Error::CorruptRecord { .. }));
            check("renew", format!("{r:?}"), ok);
            let r = b.release(&g).await;
            let ok = r.is_ok();
            check("release", format!("{r:?}"), ok);
            let r = b.read(&k).await;
            let ok = matches!(r, Err(Error::CorruptRecord { .. }));
            check("read", format!("{r:?}"), ok);
            let after = coll
                .find_one(doc! { "_id": k.as_str() })
                .await
                .unwrap()
                .unwrap();
            let same = mongodb::bson::to_vec(&after).unwrap() == mongodb::bson::to_vec(&d).unwrap();
            if !same {
                failures.push(format!(
                    "{case}: changed from {} to {}",
                    short(&d),
                    short(&after)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A legacy `{_id, v: 1}` with no lease fields — `v` is a common field name —
/// is another program's document, not a free key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_common_marker_alone_is_not_a_fresh_record() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let coll = raw(&config).await;
    let cases = [
        doc! { "v": 1 },
        doc! { "v": 1, "name": "x" },
        doc! { "v": 1_i64, "fence": 3_i64 },
        // Even this version's own marker with nothing else is not a record.
        doc! { "lease_schema": "lease-mongo/keyed-lease/2" },
    ];
    for (i, extra) in cases.into_iter().enumerate() {
        let k = key(&format!("v1-{i}"));
        let mut d = doc! { "_id": k.as_str() };
        d.extend(extra);
        coll.insert_one(d.clone()).await.unwrap();
        let r = b
            .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()))
            .await;
        assert!(
            matches!(r, Err(Error::CorruptRecord { .. })),
            "case {i}: acquire over {d} gave {r:?}"
        );
        assert!(
            matches!(b.read(&k).await, Err(Error::CorruptRecord { .. })),
            "case {i}: read"
        );
        let after = coll
            .find_one(doc! { "_id": k.as_str() })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(after, d, "case {i}: untouched");
    }
}

/// Records an earlier version wrote (`v: 1`, well formed) keep working:
/// read, renewed and released by their holder, taken over once expired, with
/// fences still rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_records_keep_working() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let coll = raw(&config).await;
    let k = key("legacy-live");
    let mut d = legacy(true);
    d.insert("_id", k.as_str());
    coll.insert_one(d).await.unwrap();
    let h = b.read(&k).await.unwrap();
    let h = h.holding().expect("held");
    assert_eq!((h.holder.as_str(), h.fence), ("h1", Fence(5)));
    let g = grant(&k, "h1", 5);
    assert!(
        matches!(b.renew(&g, None).await, Ok(lease_core::Renewal::Renewed(_))),
        "renew by the legacy holder"
    );
    b.release(&g).await.unwrap();
    assert!(b.read(&k).await.unwrap().is_free());
    let g2 = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()))
        .await
        .unwrap()
        .granted()
        .expect("free after release");
    assert!(g2.fence() > Fence(5), "{}", g2.fence());

    let k = key("legacy-expired");
    let mut d = legacy(false);
    d.insert("_id", k.as_str());
    coll.insert_one(d).await.unwrap();
    let g = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()))
        .await
        .unwrap()
        .granted()
        .expect("expired legacy record is free");
    assert!(g.fence() > Fence(5), "{}", g.fence());
}
/// `break_lease` replaces a malformed record by a released one; the next
/// grant's fence is above the fence the malformed record named, and above
/// every fence granted before it on this key — whatever the breaker's clock
/// says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_of_a_malformed_record_keeps_fences_rising() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let coll = raw(&config).await;
    let k = key("break-corrupt");
    let mut g1 = None;
    for _ in 0..3 {
        let g = b
            .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()))
            .await
            .unwrap()
            .granted()
            .unwrap();
        b.release(&g).await.unwrap();
        g1 = Some(g);
    }
    let g1 = g1.unwrap();
    // Someone damages the record; its own fence is unreadable.
    coll.update_one(
        doc! { "_id": k.as_str() },
        doc! { "$set": { "fence": "lots" } },
    )
    .await
    .unwrap();
    // A breaker whose clock is wrong (at the epoch).
    let note = BreakNote::new("ops", "damaged").with_at_unix_ms(0);
    b.break_lease(&k, &note).await.unwrap();
    let g2 = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()))
        .await
        .unwrap()
        .granted()
        .expect("free after the break");
    assert!(
        g2.fence() > g1.fence(),
        "fence {} after the break is not above {}",
        g2.fence(),
        g1.fence()
    );
}
