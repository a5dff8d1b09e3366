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
//! The broken grant's etcd lease is then revoked (best effort); a value this
//! library did not write is deleted alone, its etcd lease left to whoever
//! owns it, and the audit record keeps its first 4 KiB.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp};
use lease_core::{BreakNote, Broken, Error, Holding, LeaseKey};
use serde_json::json;

use super::{holding, EtcdBackend, MAX_ATTEMPTS};
use crate::record;

impl EtcdBackend {
    /// The etcd key of the audit record of a break of `key` at `revision`.
    pub fn audit_key(&self, key: &LeaseKey, revision: i64) -> String {
        format!("{}.audit/{}/{}", self.inner.prefix, key, revision)
    }

    pub(super) async fn break_key(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        let ekey = self.etcd_key(key);
        for _ in 0..MAX_ATTEMPTS {
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
                            let lease = s.lease;
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
            detail: format!("etcd key {ekey:?} kept changing during {MAX_ATTEMPTS} break attempts"),
            source: None,
        })
    }
}

/// How much of a removed corrupt value the audit record keeps.
const AUDIT_KEEP: usize = 4096;

fn audit_body(
    key: &LeaseKey,
    note: &BreakNote,
    previous: Option<&Holding>,
    removed: Option<&[u8]>,
) -> String {
    json!({
        "format": "lease-etcd-audit/1",
        "action": "break",
        "key": key.as_str(),
        "by": note.by,
        "reason": note.reason,
        "at_unix_ms": note.at_unix_ms,
        "previous": previous.map(|h| json!({
            "holder": h.holder.as_str(),
            "fence": h.fence.get(),
            "ttl_ms": u64::try_from(h.ttl.as_millis()).unwrap_or(u64::MAX),
            "payload_len": h.payload.len(),
        })),
        "removed_corrupt_value": removed.is_some(),
        // What was removed, so an operator can see what was there: the
        // first bytes, base64, and the whole length.
        "removed": removed.map(|v| json!({
            "len": v.len(),
            "head_base64": BASE64.encode(&v[..v.len().min(AUDIT_KEEP)]),
        })),
    })
    .to_string()
}
