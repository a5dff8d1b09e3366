//! Administrative operations: [`break_lease`](lease_core::LeaseBackend::break_lease)
//! and [`last_break`](lease_core::LeaseBackend::last_break).
//!
//! A break runs as one transaction: it locks the key's row (first writing
//! a free one when the key has none, so that an acquire racing the break
//! either commits first and is the holder the break reports, or waits for
//! the break and finds the key free), writes the
//! audit record to `{table}_audit` (the shared schema of
//! [`lease_core::audit`], with `format: "lease-postgres-audit/1"` and the
//! audit table's `seq`), replaces the row by a released one that keeps its
//! fence (or, for a corrupt row, one whose fence is the server's clock in
//! milliseconds × 1000, above every fence this crate handed out for the
//! key) stamped with the break in `last_break`, and notifies the watchers.
//! Either all of it happens or none: a break that timed out may be
//! retried after reading the key and its last break.

use lease_core::audit::{self, AuditRecord, Removed};
use lease_core::{BreakNote, Broken, Error, Fence, HolderId, LastBreak, LeaseKey, LeaseState};
use serde_json::{json, Value};
use tokio_postgres::types::Type;

use crate::backend::PostgresBackend;
use crate::record::{answer_columns, well_formed, Answer, CLOCK_FENCE, FORMAT};

/// The `format` of this backend's audit records.
pub(crate) const AUDIT_FORMAT: &str = "lease-postgres-audit/1";

impl PostgresBackend {
    pub(crate) async fn break_lease(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        let (mut client, left) = self.client("break").await?;
        let result =
            tokio::time::timeout(left, break_in_transaction(self, &mut client, key, note)).await;
        match result {
            Ok(Ok(broken)) => Ok(broken),
            Ok(Err(BreakError::Lease(e))) => Err(e),
            Ok(Err(BreakError::Postgres(e))) => self.settle("break", client, Ok(Err(e))),
            Err(elapsed) => self.settle("break", client, Err(elapsed)),
        }
    }
}

/// How a break's transaction failed: a statement's error (the connection
/// may be broken), or a verdict on the row.
enum BreakError {
    Postgres(tokio_postgres::Error),
    Lease(Error),
}

impl From<tokio_postgres::Error> for BreakError {
    fn from(e: tokio_postgres::Error) -> Self {
        BreakError::Postgres(e)
    }
}

impl From<Error> for BreakError {
    fn from(e: Error) -> Self {
        BreakError::Lease(e)
    }
}

async fn break_in_transaction(
    backend: &PostgresBackend,
    client: &mut deadpool_postgres::Object,
    key: &LeaseKey,
    note: &BreakNote,
) -> Result<Broken, BreakError> {
    let sql = &backend.inner.sql;
    let tx = client.transaction().await?;
    // A key with no row yet gives `FOR UPDATE` nothing to lock: a first
    // acquire committing meanwhile would be ended by the write below while
    // this break recorded no holder. Writing a free row first (or waiting for
    // the concurrent insert of one, then doing nothing) makes the row exist,
    // so the `SELECT` below locks it and sees whoever committed it.
    tx.query_typed(
        &format!(
            "INSERT INTO {table} (key, format, holder, fence, ttl_ms, expires_at, payload) \
             VALUES ($1, '{FORMAT}', NULL, {CLOCK_FENCE}, \
                     10000, NULL, '\\x'::bytea) \
             ON CONFLICT (key) DO NOTHING",
            table = sql.table
        ),
        &[(&key.as_str(), Type::TEXT)],
    )
    .await?;
    let rows = tx
        .query_typed(
            &format!(
                "SELECT {cols}, convert_to(row_to_json(t)::text, 'UTF8'::name) AS dump \
                 FROM {table} t WHERE t.key = $1 FOR UPDATE",
                cols = answer_columns("old", "t"),
                table = sql.table
            ),
            &[(&key.as_str(), Type::TEXT)],
        )
        .await?;
    let (previous, removed) = match rows.first() {
        None => (None, None),
        Some(row) => {
            let answer = Answer::from_row(key, row)?;
            match answer.state(key) {
                Ok(LeaseState::Held(h)) => (Some(h), None),
                Ok(LeaseState::Free) => (None, None),
                Err(_) => {
                    let dump: Vec<u8> = row.try_get("dump").unwrap_or_default();
                    (None, Some(Removed::of(&dump)))
                }
            }
        }
    };
    let record = AuditRecord::new(Some(AUDIT_FORMAT), key, note, previous.as_ref(), removed);
    let seq_row = tx
        .query_typed(
            &format!(
                "INSERT INTO {} (key, record) VALUES ($1, $2::text::jsonb) RETURNING seq",
                sql.audit
            ),
            &[(&key.as_str(), Type::TEXT), (&record.to_json(), Type::TEXT)],
        )
        .await?;
    let seq: i64 = seq_row
        .first()
        .and_then(|r| r.try_get(0).ok())
        .unwrap_or_default();
    let stamp = json!({
        audit::BY: note.by,
        audit::REASON: note.reason,
        audit::AT_UNIX_MS: note.at_unix_ms,
        audit::HOLDER: previous.as_ref().map(|h| h.holder.as_str()),
        audit::FENCE: previous.as_ref().map(|h| h.fence.get()),
        "seq": seq,
    });
    let wf = well_formed("t");
    tx.query_typed(
        &format!(
            "INSERT INTO {table} AS t (key, format, holder, fence, ttl_ms, expires_at, payload, last_break) \
             VALUES ($1, '{FORMAT}', NULL, {CLOCK_FENCE}, \
                     10000, NULL, '\\x'::bytea, $2::text::jsonb) \
             ON CONFLICT (key) DO UPDATE SET \
               format = '{FORMAT}', holder = NULL, expires_at = NULL, payload = '\\x'::bytea, \
               fence = CASE WHEN {wf} THEN t.fence \
                            WHEN t.fence BETWEEN 1 AND 9223372036854775806 THEN greatest(t.fence, EXCLUDED.fence) \
                            ELSE EXCLUDED.fence END, \
               ttl_ms = CASE WHEN {wf} THEN t.ttl_ms ELSE EXCLUDED.ttl_ms END, \
               last_break = EXCLUDED.last_break \
             RETURNING t.fence",
            table = sql.table
        ),
        &[(&key.as_str(), Type::TEXT), (&stamp.to_string(), Type::TEXT)],
    )
    .await
    ?;
    tx.query_typed(
        "SELECT pg_notify($1, $2)::text",
        &[(&sql.channel, Type::TEXT), (&key.as_str(), Type::TEXT)],
    )
    .await?;
    tx.commit().await?;
    Ok(Broken::new(previous, format!("{} seq {seq}", sql.audit)))
}

impl PostgresBackend {
    pub(crate) async fn last_break(&self, key: &LeaseKey) -> Result<Option<LastBreak>, Error> {
        let sql = &self.inner.sql;
        let rows = self
            .query(
                "last break",
                &format!(
                    "SELECT (SELECT last_break::text FROM {table} WHERE key = $1) AS stamp, \
                            (SELECT record::text FROM {audit} WHERE key = $1 ORDER BY seq DESC LIMIT 1) AS audit",
                    table = sql.table,
                    audit = sql.audit
                ),
                &[(&key.as_str(), Type::TEXT)],
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let stamp: Option<String> = row.try_get("stamp").ok().flatten();
        let audit_record: Option<String> = row.try_get("audit").ok().flatten();
        if let Some(stamp) = stamp {
            let v: Value = serde_json::from_str(&stamp)
                .map_err(|e| Error::corrupt(key, format!("its last_break stamp: {e}")))?;
            return parse_break(key, &v, "its last_break stamp").map(Some);
        }
        match audit_record {
            None => Ok(None),
            Some(text) => parse_audit(key, &text).map(Some),
        }
    }
}

/// The newest audit record of `key`, `text`, back to the break it records.
fn parse_audit(key: &LeaseKey, text: &str) -> Result<LastBreak, Error> {
    AuditRecord::from_json(text.as_bytes(), AUDIT_FORMAT, key)
        .map(|record| record.last_break())
        .map_err(|detail| Error::corrupt(key, format!("its newest audit record: {detail}")))
}

/// The break a `last_break` stamp `v` tells of: the note and the previous
/// holder and fence, all at its top level.
fn parse_break(key: &LeaseKey, v: &Value, what: &str) -> Result<LastBreak, Error> {
    let bad =
        |field: &str| Error::corrupt(key, format!("{what}: `{field}` is missing or malformed"));
    let text = |field: &'static str| {
        v.get(field)
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(|| bad(field))
    };
    let at_unix_ms = v
        .get(audit::AT_UNIX_MS)
        .and_then(Value::as_u64)
        .ok_or_else(|| bad(audit::AT_UNIX_MS))?;
    let holder = match v.get(audit::HOLDER) {
        None | Some(Value::Null) => None,
        Some(Value::String(h)) => Some(HolderId::new(h.clone()).map_err(|_| bad(audit::HOLDER))?),
        Some(_) => return Err(bad(audit::HOLDER)),
    };
    let fence = match v.get(audit::FENCE) {
        None | Some(Value::Null) => None,
        Some(f) => Some(Fence(f.as_u64().ok_or_else(|| bad(audit::FENCE))?)),
    };
    Ok(LastBreak::new(
        holder,
        fence,
        BreakNote::new(text(audit::BY)?, text(audit::REASON)?).with_at_unix_ms(at_unix_ms),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LeaseKey {
        LeaseKey::new("jobs/a").unwrap()
    }

    fn note() -> BreakNote {
        BreakNote::new("op", "stuck").with_at_unix_ms(17)
    }

    /// Records exactly as breaks wrote them before the record was shared,
    /// as `jsonb` gives them back: a live grant's, and a corrupt row's.
    const WRITTEN_BEFORE: [&str; 2] = [
        r#"{"by": "op", "key": "jobs/a", "action": "break", "format": "lease-postgres-audit/1", "reason": "stuck", "removed": null, "previous": {"fence": 9, "holder": "h-1", "ttl_ms": 5000, "payload_len": 3}, "at_unix_ms": 17, "removed_corrupt_record": false}"#,
        r#"{"by": "op", "key": "jobs/a", "action": "break", "format": "lease-postgres-audit/1", "reason": "stuck", "removed": {"len": 4, "head_base64": "anVuaw=="}, "previous": null, "at_unix_ms": 17, "removed_corrupt_record": true}"#,
    ];

    #[test]
    fn records_written_before_read_back_as_before() {
        let [held, junk] = WRITTEN_BEFORE;
        let holder = HolderId::new("h-1").unwrap();
        assert_eq!(
            parse_audit(&key(), held).unwrap(),
            LastBreak::new(Some(holder.clone()), Some(Fence(9)), note())
        );
        assert_eq!(
            parse_audit(&key(), junk).unwrap(),
            LastBreak::new(None, None, note())
        );
        // Today's records hold the same fields and values.
        let prev = lease_core::Holding::new(
            holder,
            Fence(9),
            std::time::Duration::from_secs(5),
            lease_core::Payload::new(b"abc".to_vec()).unwrap(),
        );
        for (record, before) in [
            AuditRecord::new(Some(AUDIT_FORMAT), &key(), &note(), Some(&prev), None),
            AuditRecord::new(
                Some(AUDIT_FORMAT),
                &key(),
                &note(),
                None,
                Some(Removed::of(b"junk")),
            ),
        ]
        .into_iter()
        .zip(WRITTEN_BEFORE)
        {
            let now: Value = serde_json::from_str(&record.to_json()).unwrap();
            let then: Value = serde_json::from_str(before).unwrap();
            assert_eq!(now, then);
        }
    }

    #[test]
    fn other_records_are_corrupt() {
        let [held, _] = WRITTEN_BEFORE;
        for bad in [
            "not json".to_owned(),
            held.replace("lease-postgres-audit/1", "lease-s3-audit/1"),
            held.replace(r#""action": "break""#, r#""action": "acquire""#),
            held.replace(r#""key": "jobs/a""#, r#""key": "jobs/b""#),
            held.replace(r#""at_unix_ms": 17"#, r#""at_unix_ms": -17"#),
        ] {
            match parse_audit(&key(), &bad) {
                Err(Error::CorruptRecord { key, detail }) => {
                    assert_eq!(key, "jobs/a");
                    assert!(detail.starts_with("its newest audit record: "), "{detail}");
                }
                other => panic!("{bad:?} read as {other:?}"),
            }
        }
    }
}
