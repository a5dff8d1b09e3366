//! `break_lease` and `last_break`: the audit record in the shared schema,
//! the fence kept, the removed value's head in base64, the record read back.

use std::time::Duration;

use lease_core::audit::{AuditRecord, Removed};
use lease_core::{Acquire, BreakNote, HolderId, LeaseBackend, LeaseKey, Payload, Renewal};

use crate::common::{admin, backend, fresh_config, unique, url};

const FORMAT: &str = "lease-redis-audit/1";

async fn audit(
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
    key: &LeaseKey,
) -> Vec<AuditRecord> {
    let records: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(name)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap();
    records
        .iter()
        .map(|r| AuditRecord::from_json(r, FORMAT, key).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

#[tokio::test]
async fn a_break_ends_the_grant_and_leaves_the_shared_audit_record() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let key = LeaseKey::new(unique("b")).unwrap();
    assert!(b.last_break(&key).await.unwrap().is_none());
    let holder = HolderId::random();
    let payload = Payload::new(b"abc".to_vec()).unwrap();
    let g = b
        .try_acquire(
            b.request(key.clone(), holder.clone())
                .ttl(Duration::from_secs(20))
                .payload(payload.clone()),
        )
        .await
        .unwrap()
        .granted()
        .unwrap();
    let note = BreakNote::new("ops@host \"quoted\"", "stuck / {braces} é")
        .with_at_unix_ms(1_700_000_000_000);
    let broken = b.break_lease(&key, &note).await.unwrap();
    let previous = broken.previous.clone().expect("the grant it ended");
    assert_eq!((&previous.holder, previous.fence), (&holder, g.fence()));
    assert_eq!(previous.payload, payload);
    assert_eq!(broken.audit, format!("{} #1", config.audit_key(&key)));
    assert!(b.read(&key).await.unwrap().is_free());

    let last = b.last_break(&key).await.unwrap().expect("a break");
    assert_eq!(last.holder.as_ref(), Some(&holder));
    assert_eq!(last.fence, Some(g.fence()));
    assert_eq!(last.note, note);

    let records = audit(&mut admin, &config.audit_key(&key), &key).await;
    let held =
        lease_core::Holding::new(holder.clone(), g.fence(), Duration::from_secs(20), payload);
    assert_eq!(
        records,
        vec![AuditRecord::new(Some(FORMAT), &key, &note, Some(&held), None).with_seq(1)]
    );

    // The old grant is gone for good; the next one is above it.
    assert!(matches!(b.renew(&g, None).await.unwrap(), Renewal::Lost));
    let Acquire::Granted(next) = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap()
    else {
        panic!("free after the break");
    };
    assert!(next.fence() > g.fence());
    // A second break: the newest record answers, numbered 2.
    let second = BreakNote::new("ops", "again");
    let broken = b.break_lease(&key, &second).await.unwrap();
    assert_eq!(broken.previous.map(|h| h.fence), Some(next.fence()));
    assert!(broken.audit.ends_with(" #2"), "{}", broken.audit);
    assert_eq!(b.last_break(&key).await.unwrap().unwrap().note, second);
    // The lease and counter deleted behind the library's back: the audit
    // list still answers, and fences still rise.
    let _: i64 = redis::cmd("DEL")
        .arg(config.lease_key(&key))
        .arg(config.counter_key(&key))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(b.last_break(&key).await.unwrap().unwrap().note, second);
    let third = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(third.fence() > next.fence());
}

#[tokio::test]
async fn breaking_a_free_key_is_recorded_too() {
    let url = url();
    let b = backend(&url, &fresh_config()).await;
    let key = LeaseKey::new(unique("free")).unwrap();
    let broken = b
        .break_lease(&key, &BreakNote::new("ops", "clean up"))
        .await
        .unwrap();
    assert!(broken.previous.is_none());
    let last = b.last_break(&key).await.unwrap().expect("recorded");
    assert!(last.holder.is_none() && last.fence.is_none());
    assert_eq!(last.note.reason, "clean up");
    // Nothing but the audit record was created.
    assert!(b.read(&key).await.unwrap().is_free());
}

/// The script encodes the removed value in base64 itself: every byte
/// value, every padding length, and the cut at 4096 bytes.
#[tokio::test]
async fn a_removed_value_is_kept_as_its_length_and_head_in_base64() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let all_bytes: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    for len in [1, 2, 3, 4, 5, 255, 256, 4095, 4096, 4097, 5000] {
        let key = LeaseKey::new(unique("removed")).unwrap();
        let value = &all_bytes[..len];
        let _: () = redis::cmd("SET")
            .arg(config.lease_key(&key))
            .arg(value)
            .query_async(&mut admin)
            .await
            .unwrap();
        b.break_lease(&key, &BreakNote::new("ops", "junk"))
            .await
            .unwrap();
        let records = audit(&mut admin, &config.audit_key(&key), &key).await;
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].removed, Some(Removed::of(value)), "length {len}");
        assert!(records[0].previous.is_none());
    }
}

/// A holder id with the characters JSON escapes (`"`, `\\`, `/`) is kept
/// whole in the audit record the script writes; the same holder id taking
/// the key again after the break gets a new term, and its broken grant
/// stays lost.
#[tokio::test]
async fn holder_ids_json_escapes_and_the_term_after_a_break() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let key = LeaseKey::new(unique("escapes")).unwrap();
    let holder = HolderId::new(r#"a"b\c/d{e}~'"#).unwrap();
    let g = b
        .try_acquire(b.request(key.clone(), holder.clone()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let note = BreakNote::new("ops", "escapes");
    b.break_lease(&key, &note).await.unwrap();
    let records = audit(&mut admin, &config.audit_key(&key), &key).await;
    let previous = records[0].previous.as_ref().expect("the grant it ended");
    assert_eq!((&previous.holder, previous.fence), (&holder, g.fence()));
    assert_eq!(
        b.last_break(&key).await.unwrap().unwrap().holder,
        Some(holder.clone())
    );
    let again = b
        .try_acquire(b.request(key.clone(), holder))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(again.fence() > g.fence());
    assert!(matches!(b.renew(&g, None).await.unwrap(), Renewal::Lost));
    b.release(&g).await.unwrap();
    assert_eq!(
        b.read(&key).await.unwrap().holding().map(|h| h.fence),
        Some(again.fence())
    );
}
