//! The administrative break under faults, on the in-memory store and on the
//! S3 server: an audit record that cannot be written, a break whose answer is
//! lost or retried into a conflict with itself, and the fence after breaking
//! a corrupt record.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::Faulty;
use lease_core::{
    Acquire, AcquireRequest, BreakNote, Error, Grant, HolderId, LastBreak, LeaseBackend, LeaseKey,
    LeaseState,
};
use lease_s3::ObjectStoreBackend;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

fn key(name: &str) -> LeaseKey {
    LeaseKey::new(name).unwrap()
}

fn client(store: &Arc<Faulty>, prefix: &str) -> ObjectStoreBackend {
    let s: Arc<dyn ObjectStore> = store.clone();
    ObjectStoreBackend::new(s, prefix).unwrap()
}

fn note() -> BreakNote {
    BreakNote::new("ops", "stuck").with_at_unix_ms(1)
}

async fn take(c: &ObjectStoreBackend, k: &LeaseKey) -> Grant {
    match c
        .try_acquire(
            AcquireRequest::new(k.clone(), HolderId::random()).ttl(Duration::from_secs(60)),
        )
        .await
        .unwrap()
    {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => panic!("held by {h:?}"),
    }
}

/// An error that says "not applied" must mean the live grant is untouched,
/// so that retrying cannot break a later, healthy holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_that_reports_not_applied_left_the_holder_alone() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("break-audit");
        let c = client(&faulty, &prefix);
        let k = key("job");
        let g = take(&c, &k).await;
        faulty.fail_puts_containing(Some("/.audit/"));
        let e = c.break_lease(&k, &note()).await.unwrap_err();
        faulty.fail_puts_containing(None);
        eprintln!("{name}: {e}");
        if !e.is_unknown_outcome() {
            match c.read(&k).await.unwrap() {
                LeaseState::Held(h) => assert_eq!(h.fence, g.fence(), "{name}"),
                LeaseState::Free => panic!(
                    "{name}: the break answered {e:?} (not applied) but the grant was broken"
                ),
            }
        }
    }
}

/// object_store retries a write answered 5xx; the retry then fails its
/// precondition against the break's own write. The break must still report
/// the grant it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_recognises_its_own_write_after_a_retry_or_a_lost_answer() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("break-retry");
        let c = client(&faulty, &prefix);
        for lose in [false, true] {
            let k = key(if lose { "lost" } else { "retried" });
            let g = take(&c, &k).await;
            if lose {
                faulty.lose_next_puts(1);
            } else {
                faulty.conflict_after_next_puts(1);
            }
            let broken = c
                .break_lease(&k, &note())
                .await
                .unwrap_or_else(|e| panic!("{name} (lost answer: {lose}): {e}"));
            let previous = broken.previous.unwrap_or_else(|| {
                panic!("{name} (lost answer: {lose}): the break ended a live grant but says none was held")
            });
            assert_eq!(
                (previous.holder, previous.fence),
                (g.holder().clone(), g.fence()),
                "{name}"
            );
            assert_eq!(c.read(&k).await.unwrap(), LeaseState::Free, "{name}");
            let next = take(&c, &k).await;
            assert!(next.fence() > g.fence(), "{name}");
        }
    }
}

/// Breaking a corrupt record must not let the next fence fall below earlier
/// ones, whatever fence the damaged header or the break's clock names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_a_corrupt_record_keeps_fences_rising() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("break-corrupt");
        let c = client(&faulty, &prefix);
        for body in [&b"{\"fence\":1,\"junk\":true}\nxx"[..], b"not json"] {
            let k = key("job");
            let mut last = take(&c, &k).await;
            for _ in 0..2 {
                c.release(&last).await.unwrap();
                last = take(&c, &k).await;
            }
            let path = Path::parse(format!("{prefix}/{}", k.as_str())).unwrap();
            faulty
                .inner
                .put(&path, PutPayload::from(body.to_vec()))
                .await
                .unwrap();
            assert!(matches!(c.read(&k).await, Err(Error::CorruptRecord { .. })));
            let broken = c.break_lease(&k, &note()).await.unwrap();
            assert!(broken.previous.is_none(), "{name}");
            let next = take(&c, &k).await;
            assert!(
                next.fence() > last.fence(),
                "{name}: fence {} after breaking {:?} is not above {}",
                next.fence(),
                String::from_utf8_lossy(body),
                last.fence()
            );
            c.release(&next).await.unwrap();
        }
    }
}

fn note_at(reason: &str, at_unix_ms: u64) -> BreakNote {
    BreakNote::new("ops", reason).with_at_unix_ms(at_unix_ms)
}

/// `last_break` reads back the most recent of several breaks: the highest
/// fence first (whatever the breakers' clocks say), then the latest time,
/// compared as numbers (`…-100` after `…-9`), and never a break of a key
/// below this one (`job/deeper`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_break_reads_the_most_recent_of_several_breaks() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("last-break");
        let c = client(&faulty, &prefix);
        let k = key("job");
        assert_eq!(c.last_break(&k).await.unwrap(), None, "{name}");
        // A live grant, broken late by its breaker's clock.
        let g1 = take(&c, &k).await;
        c.break_lease(&k, &note_at("first", 1000)).await.unwrap();
        // A later grant (higher fence), broken early by another clock.
        let g2 = take(&c, &k).await;
        assert!(g2.fence() > g1.fence(), "{name}");
        c.break_lease(&k, &note_at("second", 9)).await.unwrap();
        // The free key it left: the same fence, a later time.
        c.break_lease(&k, &note_at("third", 100)).await.unwrap();
        let deeper = key("job/deeper");
        let g = take(&c, &deeper).await;
        c.break_lease(&deeper, &note_at("deeper", 5000))
            .await
            .unwrap();

        let last = c.last_break(&k).await.unwrap();
        assert_eq!(
            last,
            Some(LastBreak::new(None, None, note_at("third", 100))),
            "{name}: the third break of {k} is the most recent"
        );
        let last = c.last_break(&deeper).await.unwrap();
        assert_eq!(
            last,
            Some(LastBreak::new(
                Some(g.holder().clone()),
                Some(g.fence()),
                note_at("deeper", 5000)
            )),
            "{name}"
        );
        // Another grant, broken with the earliest clock of all: its fence
        // makes it the most recent.
        let g3 = take(&c, &k).await;
        c.break_lease(&k, &note_at("fourth", 1)).await.unwrap();
        let last = c.last_break(&k).await.unwrap();
        assert_eq!(
            last,
            Some(LastBreak::new(
                Some(g3.holder().clone()),
                Some(g3.fence()),
                note_at("fourth", 1)
            )),
            "{name}"
        );
        // Another client, with no memory of the key, reads the same.
        let other = client(&faulty, &prefix);
        assert_eq!(other.last_break(&k).await.unwrap(), last, "{name}");
    }
}

/// A malformed object among a key's audit records (a damaged body, or a
/// name that is not `{fence}-{at_unix_ms}`) makes `last_break` a clear error
/// naming it, and is left byte for byte as it was: `last_break` writes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_break_refuses_a_malformed_audit_record_and_leaves_it_alone() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("last-break-malformed");
        let c = client(&faulty, &prefix);
        let cases: [(&str, &[u8]); 4] = [
            // Above every real fence, so it is the most recent.
            ("18446744073709551615-1", b"not json"),
            (
                "18446744073709551615-2",
                b"{\"format\":\"lease-s3-audit/1\",\"action\":\"break\",\"key\":\"other\",\"by\":\"x\",\"reason\":\"y\",\"previous\":null}",
            ),
            // Too big for a u64: neither wraps nor sorts by its digits.
            ("18446744073709551616-1", b"{}"),
            ("notes.txt", b"an operator's notes"),
        ];
        for (i, (object, body)) in cases.into_iter().enumerate() {
            let k = key(&format!("job-{i}"));
            let _ = take(&c, &k).await;
            c.break_lease(&k, &note()).await.unwrap();
            let path = Path::parse(format!("{prefix}/.audit/{}/{object}", k.as_str())).unwrap();
            faulty
                .inner
                .put(&path, PutPayload::from(body.to_vec()))
                .await
                .unwrap();
            let before = faulty.counts();
            let e = c.last_break(&k).await.unwrap_err();
            eprintln!("{name}: {e}");
            assert!(
                matches!(&e, Error::CorruptRecord { detail, .. } if detail.contains(object)),
                "{name}: {object}: {e:?}"
            );
            let after = faulty.counts();
            assert_eq!(
                (after.put, after.delete),
                (before.put, before.delete),
                "{name}: last_break wrote"
            );
            let stored = faulty
                .inner
                .get(&path)
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            assert_eq!(&stored[..], body, "{name}: {object} changed");
        }
    }
}

/// The audit record of a break, read back from the object `Broken::audit`
/// names.
async fn audit_json(faulty: &Faulty, broken: &lease_core::Broken, name: &str) -> serde_json::Value {
    let path = Path::parse(&broken.audit).unwrap();
    let bytes = faulty
        .inner
        .get(&path)
        .await
        .unwrap_or_else(|e| panic!("{name}: audit record {path}: {e}"))
        .bytes()
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{name}: audit record {path}: {e}"))
}

/// A break that replaces an object which is not a lease record keeps, in its
/// audit record, what it removed: the whole length and the first 4096 bytes
/// (base64), as lease-etcd does. A break of a live grant or a free key
/// removes nothing corrupt and says so; `last_break` reads such records as
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_a_corrupt_record_keeps_its_head_in_the_audit_record() {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;

    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("break-corrupt-audit");
        let c = client(&faulty, &prefix);
        // 5000 bytes of binary junk (not UTF-8, no lease header), and a
        // small foreign object.
        let big: Vec<u8> = (0..5000u32)
            .map(|i| u8::try_from((i * 131 + 7) % 251).unwrap() | 0x80)
            .collect();
        let small = b"{\"fence\":3,\"someone\":\"else\"}\nxy".to_vec();
        for (i, body) in [big, small].into_iter().enumerate() {
            let k = key(&format!("job-{i}"));
            let path = Path::parse(format!("{prefix}/{}", k.as_str())).unwrap();
            faulty
                .inner
                .put(&path, PutPayload::from(body.clone()))
                .await
                .unwrap();
            let broken = c.break_lease(&k, &note_at("corrupt", 7)).await.unwrap();
            assert!(broken.previous.is_none(), "{name}");
            let audit = audit_json(&faulty, &broken, name).await;
            assert_eq!(audit["removed_corrupt_record"], true, "{name}: {audit}");
            let removed = &audit["removed"];
            assert_eq!(
                removed["len"].as_u64(),
                Some(body.len() as u64),
                "{name}: {audit}"
            );
            let head = removed["head_base64"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no removed.head_base64 in {audit}"));
            let head = STANDARD.decode(head).unwrap();
            assert_eq!(head, body[..body.len().min(4096)], "{name}");
            // The whole object was read: nothing to flag.
            assert_ne!(removed["truncated"], true, "{name}: {audit}");
            // Readers of the record ignore the new field.
            assert_eq!(
                c.last_break(&k).await.unwrap(),
                Some(LastBreak::new(None, None, note_at("corrupt", 7))),
                "{name}"
            );
            // A break of the free key it left removes nothing corrupt.
            let again = c.break_lease(&k, &note_at("again", 8)).await.unwrap();
            let audit = audit_json(&faulty, &again, name).await;
            assert_eq!(audit["removed_corrupt_record"], false, "{name}: {audit}");
            assert!(audit["removed"].is_null(), "{name}: {audit}");
        }
        // Nor does a break of a live grant.
        let k = key("live");
        let _ = take(&c, &k).await;
        let broken = c.break_lease(&k, &note()).await.unwrap();
        assert!(broken.previous.is_some(), "{name}");
        let audit = audit_json(&faulty, &broken, name).await;
        assert_eq!(audit["removed_corrupt_record"], false, "{name}: {audit}");
        assert!(audit["removed"].is_null(), "{name}: {audit}");
    }
}
