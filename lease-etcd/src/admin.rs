//! The administrative break ([`LeaseBackend::break_lease`](lease_core::LeaseBackend::break_lease))
//! on etcd.
//!
//! One transaction, guarded by the key's mod revision as just read, deletes
//! the lease key and writes the audit record at
//! `{prefix}.audit/{key}/{revision}` — outside the lease key space, since a
//! lease key never starts with `.` — where `{revision}` is the store revision
//! of the read that found the grant (unique: the guard makes the transaction
//! fail if anything wrote the key after that read, and a second break of the
//! same free key at the same revision is refused by the audit key's own
//! `create_revision == 0` guard). The next acquire creates the key afresh,
//! and its create revision — the fence — is above every revision before it.
//! The broken grant's etcd lease is then revoked (best effort) when it was
//! the key's own; a session lease, which other keys of its holder share, is
//! left alone (the break ends this key only, and the holder's next renewal
//! of it answers `Lost`). A value this
//! library did not write is deleted alone, its etcd lease left to whoever
//! owns it, and the audit record keeps its first 4 KiB. The record (format
//! `lease-etcd-audit/1`) has the fields every backend shares, documented in
//! [`lease_core::audit`].

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp};
use lease_core::{
    audit, BreakNote, Broken, Error, Fence, HolderId, Holding, LastBreak, LeaseKey,
    CONTENTION_ATTEMPTS,
};
use serde_json::json;

use crate::conn::Conn;
use crate::errors::timed;
use crate::record::{self, holding};

impl Conn {
    /// The etcd key of the audit record of a break of `key` at `revision`.
    pub(crate) fn audit_key(&self, key: &LeaseKey, revision: i64) -> String {
        format!("{}.audit/{}/{}", self.prefix, key, revision)
    }

    /// Break: deletes the key, whoever holds it, and writes the audit
    /// record in the same transaction.
    pub(crate) async fn break_lease(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        let ekey = self.etcd_key(key);
        for _ in 0..CONTENTION_ATTEMPTS {
            let (kv, rev) = self.get(&ekey).await?;
            // What was there: a live grant (etcd deletes expired keys with
            // their lease), a foreign or corrupt value, or nothing.
            let (previous, lease, guard) = match &kv {
                None => (
                    None,
                    0,
                    Compare::create_revision(ekey.as_str(), CompareOp::Equal, 0),
                ),
                Some(kv) => {
                    let guard =
                        Compare::mod_revision(ekey.as_str(), CompareOp::Equal, kv.mod_revision());
                    match record::decode(key, kv) {
                        Ok(s) => {
                            let left = self.remaining(s.lease).await?.unwrap_or_default();
                            // A session lease may carry other keys of its
                            // holder: the break ends this key alone.
                            let lease = if s.session { 0 } else { s.lease };
                            (Some(holding(s, left)), lease, guard)
                        }
                        // Not ours: its etcd lease (if any) may carry other
                        // programs' keys, so only this key is deleted.
                        Err(_) => (None, 0, guard),
                    }
                }
            };
            let audit = self.audit_key(key, rev);
            let removed = kv
                .as_ref()
                .filter(|_| previous.is_none())
                .map(KeyValue::value);
            let body = audit_body(key, note, previous.as_ref(), removed);
            let mut ops = vec![TxnOp::put(audit.as_str(), body, None)];
            if kv.is_some() {
                ops.push(TxnOp::delete(ekey.as_str(), None));
            }
            let txn = Txn::new()
                .when([
                    guard,
                    Compare::create_revision(audit.as_str(), CompareOp::Equal, 0),
                ])
                .and_then(ops);
            if self.txn("break transaction", txn).await?.succeeded() {
                if lease != 0 {
                    self.revoke_quietly(lease).await;
                }
                return Ok(Broken { previous, audit });
            }
            // The key changed since the read (renewed with a new payload,
            // released, expired, taken): look again.
        }
        Err(Error::Unavailable {
            detail: format!(
                "etcd key {ekey:?} kept changing during {CONTENTION_ATTEMPTS} break attempts"
            ),
            source: None,
        })
    }
}

impl Conn {
    /// The newest audit record of a break of `key`, read back.
    ///
    /// Audit keys are `{prefix}.audit/{key}/{revision}`; the prefix of `key`
    /// also covers the audit records of keys below it (`key/child`), so the
    /// records are read newest first (by create revision: each is written
    /// once) a page at a time, and the first whose last segment is a
    /// revision is the one.
    pub(crate) async fn last_break(&self, key: &LeaseKey) -> Result<Option<LastBreak>, Error> {
        let prefix = format!("{}.audit/{}/", self.prefix, key);
        let mut below: Option<i64> = None;
        loop {
            let mut opts = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(LAST_BREAK_PAGE);
            if let Some(r) = below {
                opts = opts.with_max_create_revision(r);
            }
            let mut kv = self.client.kv_client();
            let resp = timed(
                "get audit records",
                self.timeout,
                kv.get(prefix.as_str(), Some(opts)),
            )
            .await?;
            let kvs = resp.kvs();
            for kv in kvs {
                let name = kv.key_str().unwrap_or_default();
                let rest = name.strip_prefix(prefix.as_str()).unwrap_or_default();
                if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) {
                    return parse_audit(&prefix, kv.value()).map(Some);
                }
            }
            match kvs.last() {
                Some(last) if resp.more() => below = Some(last.create_revision().saturating_sub(1)),
                _ => return Ok(None),
            }
        }
    }
}

/// How many audit records one read of [`Conn::last_break`] takes.
const LAST_BREAK_PAGE: i64 = 64;

/// A break's audit body, back to what the break was told and ended.
fn parse_audit(at: &str, body: &[u8]) -> Result<LastBreak, Error> {
    let corrupt = |detail: &str| Error::CorruptRecord {
        key: at.to_owned(),
        detail: format!("audit record: {detail}"),
    };
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| corrupt(&format!("not JSON ({e})")))?;
    let text = |field: &str| {
        v.get(field)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| corrupt(&format!("no text field {field:?}")))
    };
    let at_unix_ms = v
        .get("at_unix_ms")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| corrupt("no number at_unix_ms"))?;
    let note = BreakNote::new(text("by")?, text("reason")?).with_at_unix_ms(at_unix_ms);
    let (holder, fence) = match v.get("previous") {
        None | Some(serde_json::Value::Null) => (None, None),
        Some(p) => {
            let holder = p
                .get("holder")
                .and_then(serde_json::Value::as_str)
                .and_then(|h| HolderId::new(h).ok())
                .ok_or_else(|| corrupt("previous.holder is not a holder id"))?;
            let fence = p
                .get("fence")
                .and_then(serde_json::Value::as_u64)
                .filter(|f| *f > 0)
                .map(Fence)
                .ok_or_else(|| corrupt("previous.fence is not a fence"))?;
            (Some(holder), Some(fence))
        }
    };
    Ok(LastBreak::new(holder, fence, note))
}

fn audit_body(
    key: &LeaseKey,
    note: &BreakNote,
    previous: Option<&Holding>,
    removed: Option<&[u8]>,
) -> String {
    json!({
        audit::FORMAT: "lease-etcd-audit/1",
        audit::ACTION: audit::ACTION_BREAK,
        audit::KEY: key.as_str(),
        audit::BY: note.by,
        audit::REASON: note.reason,
        audit::AT_UNIX_MS: note.at_unix_ms,
        audit::PREVIOUS: previous.map(|h| json!({
            audit::HOLDER: h.holder.as_str(),
            audit::FENCE: h.fence.get(),
            audit::TTL_MS: u64::try_from(h.ttl.as_millis()).unwrap_or(u64::MAX),
            audit::PAYLOAD_LEN: h.payload.len(),
        })),
        audit::REMOVED_CORRUPT_RECORD: removed.is_some(),
        // What was removed, so an operator can see what was there: the
        // first bytes, base64, and the whole length.
        audit::REMOVED: removed.map(|v| json!({
            audit::LEN: v.len(),
            audit::HEAD_BASE64: BASE64.encode(&v[..v.len().min(audit::REMOVED_HEAD_MAX)]),
        })),
    })
    .to_string()
}
