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

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp};
use lease_core::audit::{AuditRecord, Removed};
use lease_core::{BreakNote, Broken, Error, Holding, LastBreak, LeaseKey, CONTENTION_ATTEMPTS};

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
                return Ok(Broken::new(previous, audit));
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
                    return parse_audit(key, &prefix, kv.value()).map(Some);
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

/// The format of this backend's audit records.
const AUDIT_FORMAT: &str = "lease-etcd-audit/1";

/// A break's audit body, found at `at`, back to what the break of `key` was
/// told and ended.
fn parse_audit(key: &LeaseKey, at: &str, body: &[u8]) -> Result<LastBreak, Error> {
    AuditRecord::from_json(body, AUDIT_FORMAT, key)
        .map(|record| record.last_break())
        .map_err(|detail| Error::corrupt(at, format!("audit record: {detail}")))
}

/// A break's audit body (see the module docs); `removed`: the value it
/// deleted when that was not a lease record.
fn audit_body(
    key: &LeaseKey,
    note: &BreakNote,
    previous: Option<&Holding>,
    removed: Option<&[u8]>,
) -> String {
    AuditRecord::new(
        Some(AUDIT_FORMAT),
        key,
        note,
        previous,
        removed.map(Removed::of),
    )
    .to_json()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::{Fence, HolderId, Payload};
    use std::time::Duration;

    fn key() -> LeaseKey {
        LeaseKey::new("jobs/a").unwrap()
    }

    fn note() -> BreakNote {
        BreakNote::new("op", "stuck").with_at_unix_ms(17)
    }

    /// Bodies exactly as breaks wrote them before the record was shared
    /// (keys in order, `removed` null when nothing was removed).
    const WRITTEN_BEFORE: [&[u8]; 2] = [
        br#"{"action":"break","at_unix_ms":17,"by":"op","format":"lease-etcd-audit/1","key":"jobs/a","previous":{"fence":9,"holder":"h-1","payload_len":3,"ttl_ms":5000},"reason":"stuck","removed":null,"removed_corrupt_record":false}"#,
        br#"{"action":"break","at_unix_ms":17,"by":"op","format":"lease-etcd-audit/1","key":"jobs/a","previous":null,"reason":"stuck","removed":{"head_base64":"anVuaw==","len":4},"removed_corrupt_record":true}"#,
    ];

    #[test]
    fn bodies_written_before_still_read_back() {
        let [held, junk] = WRITTEN_BEFORE;
        let holder = HolderId::new("h-1").unwrap();
        assert_eq!(
            parse_audit(&key(), "at", held).unwrap(),
            LastBreak::new(Some(holder), Some(Fence(9)), note())
        );
        assert_eq!(
            parse_audit(&key(), "at", junk).unwrap(),
            LastBreak::new(None, None, note())
        );
    }

    #[test]
    fn bodies_read_back_as_written() {
        let prev = Holding::new(
            HolderId::new("h-1").unwrap(),
            Fence(9),
            Duration::from_secs(5),
            Payload::new(b"abc".to_vec()).unwrap(),
        );
        let [held, junk] = WRITTEN_BEFORE;
        for (body, before) in [
            (audit_body(&key(), &note(), Some(&prev), None), held),
            (audit_body(&key(), &note(), None, Some(b"junk")), junk),
        ] {
            // The same fields and values as before.
            let now: serde_json::Value = serde_json::from_str(&body).unwrap();
            let then: serde_json::Value = serde_json::from_slice(before).unwrap();
            assert_eq!(now, then);
            assert_eq!(
                parse_audit(&key(), "at", body.as_bytes()).unwrap(),
                parse_audit(&key(), "at", before).unwrap()
            );
        }
    }

    #[test]
    fn other_records_are_corrupt() {
        let [held, _] = WRITTEN_BEFORE;
        let text = String::from_utf8(held.to_vec()).unwrap();
        for bad in [
            b"not json".to_vec(),
            text.replace("lease-etcd-audit/1", "lease-nats-audit/1")
                .into_bytes(),
            text.replace(r#""action":"break""#, r#""action":"acquire""#)
                .into_bytes(),
            // A child key's record, found under the same prefix.
            text.replace(r#""key":"jobs/a""#, r#""key":"jobs/a/b""#)
                .into_bytes(),
            text.replace(r#""at_unix_ms":17"#, r#""at_unix_ms":-17"#)
                .into_bytes(),
        ] {
            match parse_audit(&key(), "p/.audit/jobs/a/", &bad) {
                Err(Error::CorruptRecord { key, detail }) => {
                    assert_eq!(key, "p/.audit/jobs/a/");
                    assert!(detail.starts_with("audit record: "), "{detail}");
                }
                other => panic!("{:?} read as {other:?}", String::from_utf8_lossy(&bad)),
            }
        }
    }
}
