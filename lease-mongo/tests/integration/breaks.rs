//! `break_lease` when its audit record cannot be written: the caller learns
//! that the break was applied, and a retry with the same note finishes the
//! audit without breaking the next, healthy holder.

use crate::common;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use lease_core::{
    AcquireRequest, BreakNote, Broken, Error, HolderId, LastBreak, LeaseBackend, LeaseKey, Renewal,
};
use mongodb::bson::{doc, oid::ObjectId, Bson, Document};
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
    let note = BreakNote::new("ops", "stuck").with_at_unix_ms(1_700_000_000_000);
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
    let later = note.clone().with_at_unix_ms(note.at_unix_ms + 1);
    let broken = b.break_lease(&k, &later).await.unwrap();
    assert_eq!(
        broken.previous.map(|h| h.fence),
        Some(next.fence()),
        "a new break ends the next holder"
    );
    assert!(b.read(&k).await.unwrap().is_free());
}

fn note(reason: &str, at_unix_ms: u64) -> BreakNote {
    BreakNote::new("ops@host", reason).with_at_unix_ms(at_unix_ms)
}

fn bytes(d: &Document) -> Vec<u8> {
    mongodb::bson::to_vec(d).unwrap()
}

/// `last_break` reads the break back from the lease document's stamp after
/// another holder took (and renewed, and released) the key, and the next
/// break replaces it; a malformed stamp is `CorruptRecord`, and the
/// document stays byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_break_survives_a_new_holder_and_refuses_a_malformed_stamp() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let coll = Client::with_uri_str(common::uri())
        .await
        .unwrap()
        .database(&config.database)
        .collection::<Document>(&config.collection);
    let k = LeaseKey::new(format!("b/{}", common::unique("last"))).unwrap();
    let ttl = Duration::from_secs(30);
    assert_eq!(b.last_break(&k).await.unwrap(), None, "no document yet");
    let a = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(b.last_break(&k).await.unwrap(), None, "held, never broken");
    let first = note("stuck", 1_700_000_000_000);
    b.break_lease(&k, &first).await.unwrap();
    // Someone else takes the key, renews and releases it.
    let next = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let next = match b.renew(&next, None).await.unwrap() {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("the new holder lost the key"),
    };
    let expected = LastBreak::new(Some(a.holder().clone()), Some(a.fence()), first.clone());
    assert_eq!(b.last_break(&k).await.unwrap(), Some(expected.clone()));
    b.release(&next).await.unwrap();
    assert_eq!(b.last_break(&k).await.unwrap(), Some(expected));
    // The stamp, not the audit record, answered: it is on the document.
    let stamped = coll
        .find_one(doc! { "_id": k.as_str() })
        .await
        .unwrap()
        .unwrap();
    let seq = stamped
        .get_document("last_break")
        .unwrap()
        .get_i64("seq")
        .unwrap();
    // A later break (of the next holder, by a breaker whose clock is behind)
    // is the last one now, and its sequence number is higher.
    let next = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let second = note("rebalancing", 5);
    b.break_lease(&k, &second).await.unwrap();
    assert_eq!(
        b.last_break(&k).await.unwrap(),
        Some(LastBreak::new(
            Some(next.holder().clone()),
            Some(next.fence()),
            second
        ))
    );
    let good = coll
        .find_one(doc! { "_id": k.as_str() })
        .await
        .unwrap()
        .unwrap();
    let seq2 = good
        .get_document("last_break")
        .unwrap()
        .get_i64("seq")
        .unwrap();
    assert!(seq2 > seq, "seq {seq2} after {seq}");

    let malformed: [(&str, Document); 9] = [
        (
            "not a document",
            doc! { "$set": { "last_break": "broken" } },
        ),
        ("null", doc! { "$set": { "last_break": Bson::Null } }),
        ("by a number", doc! { "$set": { "last_break.by": 5 } }),
        ("no reason", doc! { "$unset": { "last_break.reason": "" } }),
        (
            "negative time",
            doc! { "$set": { "last_break.at_unix_ms": -1_i64 } },
        ),
        (
            "fence as text",
            doc! { "$set": { "last_break.previous.fence": "7" } },
        ),
        (
            "fence zero",
            doc! { "$set": { "last_break.previous.fence": 0_i64 } },
        ),
        (
            "bad holder",
            doc! { "$set": { "last_break.previous.holder": "has space" } },
        ),
        ("seq as text", doc! { "$set": { "last_break.seq": "1" } }),
    ];
    for (case, damage) in malformed {
        coll.replace_one(doc! { "_id": k.as_str() }, good.clone())
            .await
            .unwrap();
        coll.update_one(doc! { "_id": k.as_str() }, damage)
            .await
            .unwrap();
        let before = coll
            .find_one(doc! { "_id": k.as_str() })
            .await
            .unwrap()
            .unwrap();
        match b.last_break(&k).await {
            Err(Error::CorruptRecord { key, detail }) => {
                assert_eq!(key, k.as_str(), "{case}");
                assert!(detail.contains("last_break"), "{case}: {detail}");
            }
            other => panic!("{case}: a malformed stamp gave {other:?}"),
        }
        let after = coll
            .find_one(doc! { "_id": k.as_str() })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(bytes(&after), bytes(&before), "{case}: left as it was");
    }
    b.shutdown().await;
}

/// A document without a stamp (deleted and re-created behind the library's
/// back) is answered from the audit records, newest by `seq` — not by the
/// breaker's clock nor by `_id`; a malformed audit record is
/// `CorruptRecord`, and stays byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_break_falls_back_to_the_newest_audit_record() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let db = Client::with_uri_str(common::uri())
        .await
        .unwrap()
        .database(&config.database);
    let coll = db.collection::<Document>(&config.collection);
    let audit = db.collection::<Document>(&b.audit_collection());
    let k = LeaseKey::new(format!("b/{}", common::unique("audit-last"))).unwrap();
    let ttl = Duration::from_secs(30);
    // A free key with no document: the break leaves a released record.
    b.break_lease(&k, &note("nothing there", 9)).await.unwrap();
    assert!(b.read(&k).await.unwrap().is_free());
    let a = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    // The breaker's clock went backwards: at_unix_ms is below the first's.
    let latest = note("stuck", 3);
    b.break_lease(&k, &latest).await.unwrap();
    // A record that sorts first by `_id` and by time, but not by `seq`.
    audit
        .insert_one(doc! {
            "_id": mongodb::bson::oid::ObjectId::from_bytes([0xff; 12]),
            "action": "break", "key": k.as_str(), "by": "old", "reason": "old",
            "at_unix_ms": 4_000_000_000_000_i64, "previous": Bson::Null, "seq": 1_i64,
        })
        .await
        .unwrap();
    coll.delete_one(doc! { "_id": k.as_str() }).await.unwrap();
    let expected = Some(LastBreak::new(
        Some(a.holder().clone()),
        Some(a.fence()),
        latest,
    ));
    assert_eq!(b.last_break(&k).await.unwrap(), expected, "no document");
    let g = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(b.last_break(&k).await.unwrap(), expected, "re-created");
    b.release(&g).await.unwrap();
    // The newest audit record, damaged.
    let newest = audit
        .find_one(doc! { "key": k.as_str(), "reason": "stuck" })
        .await
        .unwrap()
        .unwrap();
    let id = newest.get_object_id("_id").unwrap();
    audit
        .update_one(
            doc! { "_id": id },
            doc! { "$set": { "previous.fence": "many" } },
        )
        .await
        .unwrap();
    let before = audit.find_one(doc! { "_id": id }).await.unwrap().unwrap();
    match b.last_break(&k).await {
        Err(Error::CorruptRecord { detail, .. }) => {
            assert!(detail.contains(&id.to_hex()), "names the record: {detail}")
        }
        other => panic!("a malformed audit record gave {other:?}"),
    }
    let after = audit.find_one(doc! { "_id": id }).await.unwrap().unwrap();
    assert_eq!(bytes(&after), bytes(&before), "left as it was");
    b.shutdown().await;
}

/// How much of a replaced record the audit record keeps (as lease-etcd).
const AUDIT_KEEP: usize = 4096;

/// The audit record `broken.audit` names (`{db}.{collection} _id {hex}`).
async fn audit_record(db: &mongodb::Database, audit: &str, broken: &Broken) -> Document {
    let (_, hex) = broken
        .audit
        .rsplit_once(" _id ")
        .unwrap_or_else(|| panic!("no _id in {:?}", broken.audit));
    let id = ObjectId::parse_str(hex).unwrap();
    db.collection::<Document>(audit)
        .find_one(doc! { "_id": id })
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no audit record {}", broken.audit))
}

/// The audit record keeps the replaced document's BSON length and its first
/// `AUDIT_KEEP` bytes, base64.
fn assert_keeps(record: &Document, replaced: &[u8], case: &str) {
    assert_eq!(
        record.get_bool("removed_corrupt_record"),
        Ok(true),
        "{case}: {record}"
    );
    let removed = record
        .get_document("removed")
        .unwrap_or_else(|_| panic!("{case}: no `removed` in {record}"));
    let len = removed
        .get("len")
        .and_then(Bson::as_i64)
        .or_else(|| removed.get("len").and_then(Bson::as_i32).map(i64::from));
    assert_eq!(
        len,
        Some(i64::try_from(replaced.len()).unwrap()),
        "{case}: len"
    );
    let head = BASE64
        .decode(removed.get_str("head_base64").unwrap())
        .unwrap();
    assert_eq!(
        head,
        replaced[..replaced.len().min(AUDIT_KEEP)],
        "{case}: head"
    );
}

/// A break that replaces a corrupt or foreign document keeps what it
/// removed in its audit record, bounded: the BSON length and the first 4096
/// bytes, base64 (the whole document when it is smaller). `last_break`
/// ignores it; a break of a healthy grant records nothing removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_of_a_corrupt_record_keeps_what_it_removed_bounded() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let db = Client::with_uri_str(common::uri())
        .await
        .unwrap()
        .database(&config.database);
    let coll = db.collection::<Document>(&config.collection);
    let audit = b.audit_collection();
    let cases = [
        (
            "large foreign",
            doc! { "owner": "another program", "blob": "x".repeat(5000), "n": 7_i64 },
        ),
        (
            "small corrupt",
            doc! { "lease_schema": "lease-mongo/keyed-lease/2", "fence": "lots" },
        ),
    ];
    for (i, (case, body)) in cases.into_iter().enumerate() {
        let k = LeaseKey::new(format!("b/{}", common::unique(&format!("removed{i}")))).unwrap();
        let mut d = doc! { "_id": k.as_str() };
        d.extend(body);
        coll.insert_one(d).await.unwrap();
        // As stored.
        let stored = coll
            .find_one(doc! { "_id": k.as_str() })
            .await
            .unwrap()
            .unwrap();
        let replaced = bytes(&stored);
        let at = 1_700_000_000_000 + u64::try_from(i).unwrap();
        let broken = b.break_lease(&k, &note(case, at)).await.unwrap();
        assert_eq!(broken.previous, None, "{case}");
        assert!(b.read(&k).await.unwrap().is_free(), "{case}: replaced");
        assert_keeps(&audit_record(&db, &audit, &broken).await, &replaced, case);
        assert_eq!(
            b.last_break(&k).await.unwrap(),
            Some(LastBreak::new(None, None, note(case, at))),
            "{case}: last_break"
        );
        // A later break of a healthy grant removed nothing.
        let g = b
            .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()))
            .await
            .unwrap()
            .granted()
            .unwrap();
        let again = b.break_lease(&k, &note("healthy", at + 10)).await.unwrap();
        assert_eq!(again.previous.as_ref().map(|h| h.fence), Some(g.fence()));
        let record = audit_record(&db, &audit, &again).await;
        assert_eq!(record.get_bool("removed_corrupt_record"), Ok(false));
        assert!(
            matches!(record.get("removed"), None | Some(Bson::Null)),
            "{case}: a healthy break removed nothing: {record}"
        );
    }
    b.shutdown().await;
}

/// When the audit write of such a break fails, the retry with the same note
/// still records the document the break replaced (not the record it left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_break_still_keeps_what_it_removed() {
    let config = common::fresh_config();
    let b = common::backend(&common::uri(), &config).await;
    let db = Client::with_uri_str(common::uri())
        .await
        .unwrap()
        .database(&config.database);
    let coll = db.collection::<Document>(&config.collection);
    let audit = b.audit_collection();
    db.create_collection(&audit)
        .validator(doc! { "never_present": { "$exists": true } })
        .await
        .unwrap();
    let k = LeaseKey::new(format!("b/{}", common::unique("removed-retry"))).unwrap();
    coll.insert_one(doc! { "_id": k.as_str(), "blob": "y".repeat(5000) })
        .await
        .unwrap();
    let stored = coll
        .find_one(doc! { "_id": k.as_str() })
        .await
        .unwrap()
        .unwrap();
    let replaced = bytes(&stored);
    let first = note("foreign", 1_700_000_000_000);
    assert!(
        matches!(
            b.break_lease(&k, &first).await,
            Err(Error::Unavailable { .. })
        ),
        "the audit write was refused"
    );
    db.collection::<Document>(&audit).drop().await.unwrap();
    let broken = b.break_lease(&k, &first).await.unwrap();
    assert_keeps(
        &audit_record(&db, &audit, &broken).await,
        &replaced,
        "retry",
    );
    assert_eq!(
        b.last_break(&k).await.unwrap(),
        Some(LastBreak::new(None, None, first))
    );
    b.shutdown().await;
}
