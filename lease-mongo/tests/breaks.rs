//! `break_lease` when its audit record cannot be written: the caller learns
//! that the break was applied, and a retry with the same note finishes the
//! audit without breaking the next, healthy holder.

mod common;

use std::time::Duration;

use lease_core::{AcquireRequest, BreakNote, Error, HolderId, LeaseBackend, LeaseKey};
use mongodb::bson::{doc, Document};
use mongodb::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_audit_is_reported_applied_and_a_retry_breaks_nobody_else() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let db = Client::with_uri_str(common::uri())
        .await
        .unwrap()
        .database(&config.database);
    // An audit collection that refuses every document.
    let audit = b.audit_collection();
    db.create_collection(&audit)
        .validator(doc! { "never_present": { "$exists": true } })
        .await
        .unwrap();
    let k = LeaseKey::new(format!("b/{}", common::unique("audit"))).unwrap();
    let ttl = Duration::from_secs(30);
    let a = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let note = BreakNote {
        by: "ops".into(),
        reason: "stuck".into(),
        at_unix_ms: 1_700_000_000_000,
    };
    match b.break_lease(&k, &note).await {
        Err(e @ Error::Unavailable { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("applied"),
                "says the break was applied: {text}"
            );
        }
        other => panic!("a break whose audit failed must not claim `not applied`: {other:?}"),
    }
    assert!(b.read(&k).await.unwrap().is_free(), "the break was applied");
    // The next, healthy holder.
    let next = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(next.fence() > a.fence());
    // The audit collection works again; the operator retries the same break.
    db.collection::<Document>(&audit).drop().await.unwrap();
    let broken = b.break_lease(&k, &note).await.unwrap();
    let still = b.read(&k).await.unwrap();
    let h = still
        .holding()
        .expect("the retry must not break the next holder");
    assert_eq!((&h.holder, h.fence), (next.holder(), next.fence()));
    let prev = broken
        .previous
        .expect("the retry reports the break it finished");
    assert_eq!((&prev.holder, prev.fence), (a.holder(), a.fence()));
    let records = db
        .collection::<Document>(&audit)
        .count_documents(doc! { "key": k.as_str() })
        .await
        .unwrap();
    assert_eq!(records, 1, "one audit record for the one break");
    // A new note is a new break.
    let later = BreakNote {
        at_unix_ms: note.at_unix_ms + 1,
        ..note.clone()
    };
    let broken = b.break_lease(&k, &later).await.unwrap();
    assert_eq!(
        broken.previous.map(|h| h.fence),
        Some(next.fence()),
        "a new break ends the next holder"
    );
    assert!(b.read(&k).await.unwrap().is_free());
}
