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

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use lease_core::{
    audit, BreakNote, Broken, Error, Fence, HolderId, LastBreak, LeaseKey, LeaseState,
};
use serde_json::{json, Value};
use tokio_postgres::types::Type;

use crate::backend::PostgresBackend;
use crate::record::{answer_columns, millis, well_formed, Answer, FORMAT};

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
             VALUES ($1, '{FORMAT}', NULL, floor(extract(epoch FROM now()) * 1000)::bigint * 1000, \
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
                "SELECT {cols}, convert_to(row_to_json(t)::text, 'UTF8') AS dump \
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
                    let head = dump.get(..audit::REMOVED_HEAD_MAX).unwrap_or(&dump);
                    (
                        None,
                        Some(json!({
                            audit::LEN: dump.len(),
                            audit::HEAD_BASE64: BASE64.encode(head),
                        })),
                    )
                }
            }
        }
    };
    let previous_json = previous.as_ref().map(|h| {
        json!({
            audit::HOLDER: h.holder.as_str(),
            audit::FENCE: h.fence.get(),
            audit::TTL_MS: millis(h.ttl),
            audit::PAYLOAD_LEN: h.payload.len(),
        })
    });
    let record = json!({
        audit::FORMAT: AUDIT_FORMAT,
        audit::ACTION: audit::ACTION_BREAK,
        audit::KEY: key.as_str(),
        audit::BY: note.by,
        audit::REASON: note.reason,
        audit::AT_UNIX_MS: note.at_unix_ms,
        audit::PREVIOUS: previous_json,
        audit::REMOVED_CORRUPT_RECORD: removed.is_some(),
        audit::REMOVED: removed,
    });
    let seq_row = tx
        .query_typed(
            &format!(
                "INSERT INTO {} (key, record) VALUES ($1, $2::text::jsonb) RETURNING seq",
                sql.audit
            ),
            &[
                (&key.as_str(), Type::TEXT),
                (&record.to_string(), Type::TEXT),
            ],
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
             VALUES ($1, '{FORMAT}', NULL, floor(extract(epoch FROM now()) * 1000)::bigint * 1000, \
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
    Ok(Broken {
        previous,
        audit: format!("{} seq {seq}", sql.audit),
    })
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
            return parse_break(key, &v, &v, "its last_break stamp").map(Some);
        }
        match audit_record {
            None => Ok(None),
            Some(text) => {
                let v: Value = serde_json::from_str(&text)
                    .map_err(|e| Error::corrupt(key, format!("its newest audit record: {e}")))?;
                let previous = v.get(audit::PREVIOUS).cloned().unwrap_or(Value::Null);
                parse_break(key, &v, &previous, "its newest audit record").map(Some)
            }
        }
    }
}

/// The note from `note_at`, the previous holding from `previous_at`.
fn parse_break(
    key: &LeaseKey,
    note_at: &Value,
    previous_at: &Value,
    what: &str,
) -> Result<LastBreak, Error> {
    let bad =
        |field: &str| Error::corrupt(key, format!("{what}: `{field}` is missing or malformed"));
    let text = |field: &'static str| {
        note_at
            .get(field)
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(|| bad(field))
    };
    let at_unix_ms = note_at
        .get(audit::AT_UNIX_MS)
        .and_then(Value::as_u64)
        .ok_or_else(|| bad(audit::AT_UNIX_MS))?;
    let holder = match previous_at.get(audit::HOLDER) {
        None | Some(Value::Null) => None,
        Some(Value::String(h)) => Some(HolderId::new(h.clone()).map_err(|_| bad(audit::HOLDER))?),
        Some(_) => return Err(bad(audit::HOLDER)),
    };
    let fence = match previous_at.get(audit::FENCE) {
        None | Some(Value::Null) => None,
        Some(f) => Some(Fence(f.as_u64().ok_or_else(|| bad(audit::FENCE))?)),
    };
    Ok(LastBreak::new(
        holder,
        fence,
        BreakNote::new(text(audit::BY)?, text(audit::REASON)?).with_at_unix_ms(at_unix_ms),
    ))
}
