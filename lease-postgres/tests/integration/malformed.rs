//! Bad input and corrupt rows: refused before anything is sent, or reported
//! as `CorruptRecord` with the row left byte-identical.

use std::time::Duration;

use lease_core::{Acquire, BreakNote, Error, HolderId, LeaseBackend, LeaseKey, LeaseState};
use lease_postgres::{PostgresBackend, PostgresConfig};

use crate::common::{
    admin, audit_record, backend, fresh_config, insert_row, row_text, unique, url,
};

#[tokio::test]
async fn bad_table_names_are_refused_before_connecting() {
    for bad in ["Leases", "l;drop table x", "a.b.c", "", "1x", "x\""] {
        let e = PostgresBackend::connect_lazy(&url(), PostgresConfig::new(bad))
            .expect_err("a bad table name is refused");
        assert!(e.to_string().contains("table name"), "{bad}: {e}");
    }
}

#[tokio::test]
async fn bad_timing_and_urls_are_refused() {
    let e = PostgresBackend::connect_lazy(&url(), fresh_config().request_timeout(Duration::ZERO))
        .expect_err("zero timeout");
    assert!(matches!(e, Error::InvalidTiming { .. }), "{e}");
    let e = PostgresBackend::connect_lazy("postgres://h:notaport/db", fresh_config())
        .expect_err("bad URL");
    assert!(e.to_string().contains("URL"), "{e}");
}

#[tokio::test]
async fn ttls_out_of_range_are_refused() {
    let url = url();
    let b = backend(&url, &fresh_config()).await;
    let key = LeaseKey::new(unique("k")).unwrap();
    for ttl in [Duration::from_secs(2 * 86_400)] {
        let e = b
            .try_acquire(b.request(key.clone(), HolderId::random()).ttl(ttl))
            .await
            .expect_err("too long");
        assert!(matches!(e, Error::InvalidTtl { .. }), "{e}");
    }
    // Below the minimum is rounded up to it.
    let g = b
        .try_acquire(
            b.request(key, HolderId::random())
                .ttl(Duration::from_millis(10)),
        )
        .await
        .unwrap()
        .granted()
        .expect("granted");
    assert_eq!(g.ttl(), Duration::from_secs(1));
}

#[tokio::test]
async fn corrupt_rows_are_errors_and_stay_byte_identical() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let admin = admin(&url).await;
    let table = &config.table;
    // Each one wrong in one way, as another program (or a bad restore)
    // might write it.
    let cases = [
        ("format", "'other/1', 'h', 5, 10000, now() + interval '1 hour', ''::bytea"),
        ("fence", "'lease-postgres/1', 'h', 0, 10000, now() + interval '1 hour', ''::bytea"),
        ("ttl", "'lease-postgres/1', 'h', 5, 5, now() + interval '1 hour', ''::bytea"),
        ("holder", "'lease-postgres/1', 'a holder with spaces', 5, 10000, now() + interval '1 hour', ''::bytea"),
        ("empty holder", "'lease-postgres/1', '', 5, 10000, now() + interval '1 hour', ''::bytea"),
        ("holder of 129 characters", "'lease-postgres/1', repeat('h', 129), 5, 10000, now() + interval '1 hour', ''::bytea"),
        ("non-ASCII holder", "'lease-postgres/1', 'hé', 5, 10000, now() + interval '1 hour', ''::bytea"),
        ("holder ending in a newline", "'lease-postgres/1', E'h\\n', 5, 10000, now() + interval '1 hour', ''::bytea"),
        ("deadline", "'lease-postgres/1', 'h', 5, 10000, NULL, ''::bytea"),
        ("free with deadline", "'lease-postgres/1', NULL, 5, 10000, now(), ''::bytea"),
        ("payload", "'lease-postgres/1', 'h', 5, 10000, now() + interval '1 hour', decode(repeat('00', 70000), 'hex')"),
    ];
    for (what, values) in cases {
        let key = LeaseKey::new(unique("corrupt")).unwrap();
        insert_row(&admin, table, key.as_str(), values)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let before = row_text(&admin, table, key.as_str()).await;
        let me = HolderId::random();
        let e = b.read(&key).await.expect_err(what);
        assert!(matches!(e, Error::CorruptRecord { .. }), "{what}: read {e}");
        let e = b
            .try_acquire(b.request(key.clone(), me.clone()))
            .await
            .expect_err(what);
        assert!(
            matches!(e, Error::CorruptRecord { .. }),
            "{what}: acquire {e}"
        );
        assert_eq!(
            row_text(&admin, table, key.as_str()).await,
            before,
            "{what}"
        );
        // A break replaces it, keeps what it was in the audit record, and
        // the key can be taken again.
        let broken = b
            .break_lease(&key, &BreakNote::new("ops", what))
            .await
            .unwrap_or_else(|e| panic!("{what}: break {e}"));
        assert!(broken.previous.is_none(), "{what}");
        let audit = audit_record(&admin, table, key.as_str()).await;
        assert_eq!(audit["removed_corrupt_record"], true, "{what}");
        assert!(audit["removed"]["len"].as_u64().unwrap() > 0, "{what}");
        assert!(matches!(
            b.try_acquire(b.request(key.clone(), me)).await,
            Ok(Acquire::Granted(_))
        ));
    }
}

/// A row whose grant has expired is judged by the server's row checks
/// alone (a live one's holder is checked again on this side when its answer
/// is read): one with a holder that is no holder id is corrupt, not free,
/// for a read and for an acquire, and stays as it is.
#[tokio::test]
async fn an_expired_row_with_a_bad_holder_is_corrupt_not_free() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let admin = admin(&url).await;
    let holders = [
        "'a holder with spaces'",
        "''",
        "repeat('h', 129)",
        "repeat('h', 128) || 'é'",
        "'hé'",
        "E'h\\n'",
        "E'\\th'",
        "E'h\\x7f'",
    ];
    for holder in holders {
        let key = LeaseKey::new(unique("expired-bad-holder")).unwrap();
        let values = format!(
            "'lease-postgres/1', {holder}, 5, 10000, now() - interval '1 second', ''::bytea"
        );
        insert_row(&admin, &config.table, key.as_str(), &values)
            .await
            .unwrap_or_else(|e| panic!("{holder}: {e}"));
        let before = row_text(&admin, &config.table, key.as_str()).await;
        let by_the_check = |op: &str, e: Error| match e {
            Error::CorruptRecord { detail, .. } => assert!(
                detail.contains("`holder` is not a holder id"),
                "{holder}: {op}: {detail}"
            ),
            e => panic!("{holder}: {op}: {e}"),
        };
        by_the_check("read", b.read(&key).await.expect_err(holder));
        by_the_check(
            "acquire",
            b.try_acquire(b.request(key.clone(), HolderId::random()))
                .await
                .expect_err(holder),
        );
        assert_eq!(
            row_text(&admin, &config.table, key.as_str()).await,
            before,
            "{holder}"
        );
    }
}

/// The longest holder id a row may carry, and the widest range of
/// characters, reads as held: the row checks refuse no more than they must.
#[tokio::test]
async fn a_holder_of_128_printable_characters_is_well_formed() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let admin = admin(&url).await;
    for holder in ["h".repeat(128), "!~".repeat(64)] {
        let key = LeaseKey::new(unique("long-holder")).unwrap();
        let values = format!(
            "'lease-postgres/1', '{holder}', 5, 60000, now() + interval '30 seconds', ''::bytea"
        );
        insert_row(&admin, &config.table, key.as_str(), &values)
            .await
            .unwrap();
        match b.read(&key).await {
            Ok(LeaseState::Held(h)) => assert_eq!(h.holder.as_str(), holder),
            other => panic!("{holder}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn wrong_column_types_are_corrupt_not_free() {
    let url = url();
    let admin = admin(&url).await;
    let table = unique("foreign");
    // Someone else's table under the configured name.
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (key text PRIMARY KEY, format text, holder int, fence text, \
             ttl_ms int, expires_at text, payload text, last_break text); \
             INSERT INTO {table} VALUES ('k', 'x', 1, 'f', 1, 'e', 'p', NULL)"
        ))
        .await
        .unwrap();
    let b = PostgresBackend::connect(&url, PostgresConfig::new(table))
        .await
        .expect("the tables exist");
    let key = LeaseKey::new("k").unwrap();
    let e = b.read(&key).await.expect_err("not a lease table");
    assert!(!e.is_unknown_outcome(), "{e}");
}

/// A deadline no writer of this crate can have set — infinite, or a
/// century past its TTL — is a corrupt row: every operation reports it as
/// `CorruptRecord` naming `expires_at` and leaves it byte-identical (never
/// "cannot subtract infinite timestamps", never a live holder blocking the
/// key for a century); a break replaces it as a corrupt row.
#[tokio::test]
async fn impossible_deadlines_are_corrupt_for_every_operation() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let admin = admin(&url).await;
    let table = &config.table;
    for (what, deadline) in [
        ("deadline a century away", "now() + interval '100 years'"),
        ("infinite deadline", "'infinity'::timestamptz"),
    ] {
        let key = LeaseKey::new(unique("deadline")).unwrap();
        let me = HolderId::random();
        let g = b
            .try_acquire(b.request(key.clone(), me.clone()))
            .await
            .unwrap()
            .granted()
            .expect("a fresh key");
        admin
            .execute(
                &format!("UPDATE {table} SET expires_at = {deadline} WHERE key = $1"),
                &[&key.as_str()],
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let before = row_text(&admin, table, key.as_str()).await;
        let corrupt = |op: &str, r: Result<String, Error>| match r {
            Err(Error::CorruptRecord { detail, .. }) => assert!(
                detail.contains("expires_at"),
                "{what}: {op}: the error does not name the column: {detail}"
            ),
            other => panic!("{what}: {op}: expected CorruptRecord, got {other:?}"),
        };
        corrupt("read", b.read(&key).await.map(|s| format!("{s:?}")));
        corrupt(
            "acquire by another",
            b.try_acquire(b.request(key.clone(), HolderId::random()))
                .await
                .map(|a| format!("{a:?}")),
        );
        corrupt(
            "acquire by its holder",
            b.try_acquire(b.request(key.clone(), me.clone()))
                .await
                .map(|a| format!("{a:?}")),
        );
        corrupt("renew", b.renew(&g, None).await.map(|r| format!("{r:?}")));
        corrupt("release", b.release(&g).await.map(|r| format!("{r:?}")));
        assert_eq!(
            row_text(&admin, table, key.as_str()).await,
            before,
            "{what}: the row changed"
        );
        let broken = b
            .break_lease(&key, &BreakNote::new("ops", what))
            .await
            .unwrap_or_else(|e| panic!("{what}: break {e}"));
        assert!(
            broken.previous.is_none(),
            "{what}: a break reported a live holder: {:?}",
            broken.previous
        );
        let audit = audit_record(&admin, table, key.as_str()).await;
        assert_eq!(audit["removed_corrupt_record"], true, "{what}");
        let Acquire::Granted(next) = b
            .try_acquire(b.request(key.clone(), HolderId::random()))
            .await
            .unwrap()
        else {
            panic!("{what}: the key is not free after the break");
        };
        assert!(next.fence() > g.fence(), "{what}");
    }
}
