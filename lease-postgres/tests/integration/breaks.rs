//! `break_lease` and `last_break`: the audit record in the shared schema,
//! the fence kept, the stamp read back.

use lease_core::{audit, Acquire, BreakNote, HolderId, LeaseBackend, LeaseKey};

use crate::common::{admin, audit_record, backend, fresh_config, insert_row, unique, url};

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
    let record = audit_record(&admin, &config.table, key.as_str()).await;
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

/// A first acquire of a key with no row yet, committing while a break waits
/// for it, is the holder that break ends: the break must say so in its
/// answer, its audit record and its stamp, never "nobody held it".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_racing_a_first_acquire_names_the_holder_it_ended() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let key = LeaseKey::new(unique("race")).unwrap();
    let table = config.table.clone();
    // The first acquire, as its statement writes the row, left uncommitted.
    let mut first = admin(&url).await;
    let tx = first.transaction().await.unwrap();
    insert_row(
        &tx,
        &table,
        key.as_str(),
        "'lease-postgres/1', 'first-holder', 7, 10000, now() + interval '10 seconds', ''::bytea",
    )
    .await
    .unwrap();
    let note = BreakNote::new("ops", "race");
    let breaking = {
        let (b, key, note) = (b.clone(), key.clone(), note.clone());
        tokio::spawn(async move { b.break_lease(&key, &note).await })
    };
    // Wait until the break waits on the uncommitted row.
    let watcher = admin(&url).await;
    let waiting = format!("%{table}%");
    let mut waited = false;
    for _ in 0..500 {
        let n: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE $1",
                &[&waiting],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            waited = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(waited, "the break never waited on the first acquire's row");
    tx.commit().await.unwrap();
    let broken = breaking.await.unwrap().unwrap();
    let first_holder = HolderId::new("first-holder").unwrap();
    let previous = broken
        .previous
        .as_ref()
        .map(|h| (h.holder.clone(), h.fence));
    assert_eq!(
        previous,
        Some((first_holder.clone(), lease_core::Fence(7))),
        "the break ended the first acquire's grant but reported {:?}",
        broken.previous
    );
    let last = b.last_break(&key).await.unwrap().expect("a break");
    assert_eq!(last.holder, Some(first_holder.clone()));
    assert_eq!(last.fence, Some(lease_core::Fence(7)));
    let record = audit_record(&watcher, &table, key.as_str()).await;
    assert_eq!(record[audit::PREVIOUS][audit::HOLDER], "first-holder");
    assert_eq!(record[audit::PREVIOUS][audit::FENCE], 7);
    assert!(b.read(&key).await.unwrap().is_free());
}
