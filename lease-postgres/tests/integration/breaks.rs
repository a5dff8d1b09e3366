//! `break_lease` and `last_break`: the audit record in the shared schema,
//! the fence kept, the stamp read back.

use lease_core::{audit, Acquire, BreakNote, HolderId, LeaseBackend, LeaseKey};

use crate::common::{admin, backend, fresh_config, unique, url};

#[tokio::test]
async fn a_break_ends_the_grant_and_leaves_the_shared_audit_record() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let key = LeaseKey::new(unique("b")).unwrap();
    assert!(b.last_break(&key).await.unwrap().is_none());
    let holder = HolderId::random();
    let g = b
        .try_acquire(b.request(key.clone(), holder.clone()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let note = BreakNote::new("ops@host", "stuck").with_at_unix_ms(1_700_000_000_000);
    let broken = b.break_lease(&key, &note).await.unwrap();
    let previous = broken.previous.expect("the grant it ended");
    assert_eq!(previous.holder, holder);
    assert_eq!(previous.fence, g.fence());
    assert!(broken
        .audit
        .starts_with(&format!("{}_audit seq ", config.table)));
    assert!(b.read(&key).await.unwrap().is_free());

    let last = b.last_break(&key).await.unwrap().expect("a break");
    assert_eq!(last.holder.as_ref(), Some(&holder));
    assert_eq!(last.fence, Some(g.fence()));
    assert_eq!(last.note, note);

    let admin = admin(&url).await;
    let record: serde_json::Value = admin
        .query_one(
            &format!(
                "SELECT record::text FROM {}_audit WHERE key = $1",
                config.table
            ),
            &[&key.as_str()],
        )
        .await
        .map(|r| serde_json::from_str(r.get::<_, &str>(0)).unwrap())
        .unwrap();
    assert_eq!(record[audit::FORMAT], "lease-postgres-audit/1");
    assert_eq!(record[audit::ACTION], audit::ACTION_BREAK);
    assert_eq!(record[audit::KEY], key.as_str());
    assert_eq!(record[audit::BY], "ops@host");
    assert_eq!(record[audit::REASON], "stuck");
    assert_eq!(record[audit::AT_UNIX_MS], 1_700_000_000_000_u64);
    assert_eq!(record[audit::PREVIOUS][audit::HOLDER], holder.as_str());
    assert_eq!(record[audit::PREVIOUS][audit::FENCE], g.fence().get());
    assert_eq!(record[audit::PREVIOUS][audit::TTL_MS], 10_000);
    assert_eq!(record[audit::PREVIOUS][audit::PAYLOAD_LEN], 0);
    assert_eq!(record[audit::REMOVED_CORRUPT_RECORD], false);
    assert!(record[audit::REMOVED].is_null());

    // The old grant is gone for good; the next one is above it, and the
    // stamp still names the break after the key was taken again.
    assert!(matches!(
        b.renew(&g, None).await.unwrap(),
        lease_core::Renewal::Lost
    ));
    let Acquire::Granted(next) = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap()
    else {
        panic!("free after the break");
    };
    assert!(next.fence() > g.fence());
    assert_eq!(b.last_break(&key).await.unwrap().unwrap().note, note);
}

#[tokio::test]
async fn breaking_a_free_or_missing_key_is_recorded_too() {
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
}

#[tokio::test]
async fn last_break_falls_back_to_the_audit_records() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let key = LeaseKey::new(unique("fallback")).unwrap();
    b.try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap();
    b.break_lease(&key, &BreakNote::new("ops", "first"))
        .await
        .unwrap();
    b.break_lease(&key, &BreakNote::new("ops", "second"))
        .await
        .unwrap();
    // The row deleted behind the library's back: the newest audit record
    // still answers.
    admin(&url)
        .await
        .execute(
            &format!("DELETE FROM {} WHERE key = $1", config.table),
            &[&key.as_str()],
        )
        .await
        .unwrap();
    assert_eq!(
        b.last_break(&key).await.unwrap().unwrap().note.reason,
        "second"
    );
}
