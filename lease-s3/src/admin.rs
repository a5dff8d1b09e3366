//! The administrative break ([`LeaseBackend::break_lease`](lease_core::LeaseBackend::break_lease))
//! on object stores.
//!
//! Like a release, without the holder check: the lease object is overwritten,
//! conditionally on the version just read, by a "released" record that keeps
//! the fence, so the next acquire takes the key at once with the next fence.
//! An object that is not a lease record (corrupt or foreign) is replaced the
//! same way; its fence is unknown, so the released record carries a fence
//! above the one its header names, if any, and at least the fence floor (the
//! wall clock in microseconds), so that no later fence can fall below an
//! earlier one. A missing lease object gets a released record the same way.
//!
//! The audit record is the object `{prefix}/.audit/{key}/{fence}-{at_unix_ms}`
//! (a JSON document), written *before* the lease object: an error that says
//! the break was not applied means exactly that, and a break whose own write
//! came back as a conflict (the client retried it) or lost its answer
//! recognises that write by its nonce. Lease keys never have a segment
//! starting with `.`, so no lease object can live under `{prefix}/.audit/`.
//!
//! The record says who broke the key and why, the grant it ended
//! (`previous`, or null), and whether it replaced an object that was not a
//! lease record (`removed_corrupt_record`). If it did, `removed` keeps what
//! was there, bounded, in the schema all backends share ([`lease_core::audit`]):
//! `{"len": <bytes>, "head_base64": <the first 4096 bytes, base64>}`. These
//! are the bytes of the very GET whose version the conditional write names,
//! so they are what the write replaced, never a later read. A break reads a
//! lease object whole or not at all (one larger than any lease record is
//! refused by its size, unread and unbroken), so `head_base64` always comes
//! from the whole object; should a store's metadata give a larger size than
//! the body it sent, `len` is that size and `removed` also says
//! `"truncated": true`. `removed` is null when nothing corrupt was replaced.
//!
//! [`last_break`](lease_core::LeaseBackend::last_break) reads these records
//! back without writing anything: one LIST of the key's own audit records
//! (`{prefix}/.audit/{key}/`, with a delimiter, so the records of a key
//! `{key}/more` are not among them), then one GET of the most recent, which
//! is the one with the highest fence in its name and, among equal fences,
//! the latest `at_unix_ms`. Both are compared as numbers. Fences only rise,
//! so breaks of different grants are ordered whatever the breakers' clocks
//! say; only breaks at one fence (a grant, then the free key it left) are
//! ordered by the breakers' clocks.

use std::sync::Arc;
use std::time::Duration;

use lease_core::audit::{AuditRecord, Removed};
use lease_core::{BreakNote, Broken, Error, Holding, LastBreak, LeaseKey, CONTENTION_ATTEMPTS};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

use crate::backend::ObjectStoreBackend;
use crate::conditional::{fence_floor, nonce, read_body, update_mode, version_tag, Put, Target};
use crate::errors::store_error;
use crate::record::{holding, Record, State};

/// Times [`last_break`](lease_core::LeaseBackend::last_break) lists the
/// audit records again when the one it chose vanished before its GET (a
/// break removing the record of an attempt it did not apply).
const MAX_LISTINGS: u32 = 3;

/// The largest audit record `last_break` reads: far above any record a
/// break writes with a note of human size. A larger object is refused by its
/// size, unread.
const MAX_AUDIT_LEN: u64 = 1 << 20;

/// The `format` of this backend's audit records.
const AUDIT_FORMAT: &str = "lease-s3-audit/1";

impl ObjectStoreBackend {
    /// The object path of the audit record of a break of `key`.
    pub fn audit_path(&self, key: &LeaseKey, fence: u64, at_unix_ms: u64) -> Result<Path, Error> {
        self.audit_object(key, &format!("/{fence}-{at_unix_ms}"))
    }

    /// `{prefix}/.audit/{key}{tail}` (`tail` empty for the key's directory).
    fn audit_object(&self, key: &LeaseKey, tail: &str) -> Result<Path, Error> {
        let name = format!(".audit/{}{tail}", key.as_str());
        let joined = if self.inner.prefix.as_ref().is_empty() {
            name
        } else {
            format!("{}/{name}", self.inner.prefix.as_ref())
        };
        Path::parse(&joined).map_err(|_| Error::InvalidKey {
            key: key.as_str().to_owned(),
            reason: "no valid audit object path under this prefix",
        })
    }

    /// The most recent break of `key`, from its audit records (see the
    /// module docs). Reads only: a LIST and a GET per attempt.
    pub(super) async fn read_last_break(&self, key: &LeaseKey) -> Result<Option<LastBreak>, Error> {
        let dir = self.audit_object(key, "")?;
        let store = &self.inner.conditional.store;
        for _ in 0..MAX_LISTINGS {
            let listing = store
                .list_with_delimiter(Some(&dir))
                .await
                .map_err(|e| store_error("LIST", &dir, e))?;
            let mut latest: Option<((u64, u64), Path)> = None;
            for meta in listing.objects {
                let Some(name) = direct_child(&dir, &meta.location) else {
                    // Not one of this key's records (the directory itself,
                    // as some tools create it, or a deeper path).
                    continue;
                };
                let order = parse_audit_name(&name).ok_or_else(|| {
                    Error::corrupt(
                        key,
                        format!(
                            "{}, among the audit records of its breaks, is not named \
                             `{{fence}}-{{at_unix_ms}}`, so its most recent break is unknown; \
                             left as it is",
                            meta.location
                        ),
                    )
                })?;
                if latest.as_ref().is_none_or(|(best, _)| order > *best) {
                    latest = Some((order, meta.location));
                }
            }
            let Some(((fence, at_unix_ms), path)) = latest else {
                return Ok(None);
            };
            let res = match store.get(&path).await {
                Ok(r) => r,
                // Removed since the listing: look again.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(store_error("GET", &path, e)),
            };
            let size = res.meta.size;
            if size > MAX_AUDIT_LEN {
                return Err(oversize_audit(key, &path, size));
            }
            let bytes = res
                .bytes()
                .await
                .map_err(|e| store_error("GET (body)", &path, e))?;
            let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
            if len > MAX_AUDIT_LEN {
                return Err(oversize_audit(key, &path, len));
            }
            return decode_audit(key, fence, at_unix_ms, &bytes)
                .map(Some)
                .map_err(|detail| {
                    Error::corrupt(
                        key,
                        format!(
                            "{path}, the audit record of its most recent break, is malformed \
                             ({detail}); left as it is"
                        ),
                    )
                });
        }
        Err(Error::Unavailable {
            detail: format!(
                "{key}: the most recent audit record vanished before it could be read, \
                 {MAX_LISTINGS} times in a row"
            ),
            source: None,
        })
    }

    pub(super) async fn break_key(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        let path = self.path(key)?;
        let marker = self.marker(key)?;
        let core = &self.inner.conditional;
        let store = &core.store;
        // The attempt whose write may have landed though its answer said
        // otherwise: its nonce, what it ended, and its audit record.
        let mut pending: Option<(String, Option<Holding>, Path)> = None;
        // What this client knows of the key's fences, for the fence floor.
        let seen = self.inner.keys.observation(key);
        for _ in 0..CONTENTION_ATTEMPTS {
            let res = match store.get(&path).await {
                Ok(r) => Some(r),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => return Err(store_error("GET", &path, e)),
            };
            let (mode, released, previous, removed) = match res {
                None => {
                    // Never used, or deleted outside the library: a released
                    // record lets the next acquire in at once, above every
                    // earlier fence.
                    let fence = fence_floor(&seen, note.at_unix_ms);
                    core.ensure_marker(
                        &Target {
                            path: &path,
                            marker: &marker,
                            name: key.as_str(),
                        },
                        BREAKER,
                        fence,
                        Duration::from_secs(1),
                    )
                    .await;
                    (PutMode::Create, released_record(fence), None, None)
                }
                Some(res) => {
                    let tag = version_tag(res.meta.e_tag.as_deref(), res.meta.version.as_deref())
                        .ok_or_else(|| {
                            Error::Backend(
                                format!("GET {path}: the store returned neither an ETag nor a version, so a conditional break is impossible")
                                    .into(),
                            )
                        })?;
                    // The size the store states for this very version.
                    let size = res.meta.size;
                    let body = read_body(&path, key.as_str(), res).await?;
                    let bytes = body.as_ref();
                    match Record::decode(bytes) {
                        Ok(r) if pending.as_ref().is_some_and(|(n, _, _)| *n == r.nonce) => {
                            // Our own write: the client retried it into a
                            // conflict with itself, or its answer was lost.
                            let (_, previous, audit) = pending
                                .take()
                                .unwrap_or_else(|| (String::new(), None, path.clone()));
                            return Ok(Broken::new(previous, audit.to_string()));
                        }
                        Ok(r) if r.state == State::Released => {
                            forget(store, pending.take()).await;
                            // Nothing live: only the audit record to write.
                            let audit = self.audit_path(key, r.fence, note.at_unix_ms)?;
                            write_audit(store, key, &audit, audit_body(key, note, None, None))
                                .await?;
                            return Ok(Broken::new(None, audit.to_string()));
                        }
                        Ok(r) => {
                            let previous: Holding = holding(key, r.clone())?;
                            let released = Record {
                                state: State::Released,
                                payload: Vec::new(),
                                nonce: nonce(),
                                ..r
                            };
                            (update_mode(&tag), released, Some(previous), None)
                        }
                        Err(_) => {
                            // Its fence is unknown: above what its header
                            // names, and at least the fence floor.
                            let named = header_fence(bytes).map_or(0, |f| f.saturating_add(1));
                            let fence = fence_floor(&seen, note.at_unix_ms).max(named);
                            // What the write (conditional on `tag`, the
                            // version these bytes came with) replaces.
                            let removed = Removed::of_read(bytes, size);
                            (
                                update_mode(&tag),
                                released_record(fence),
                                None,
                                Some(removed),
                            )
                        }
                    }
                }
            };
            forget(store, pending.take()).await;
            // The store must honour the condition, or this could overwrite a
            // grant taken after the read.
            core.ensure_probed().await?;
            // The audit record first: should it fail, nothing was broken, and
            // the error can say so.
            let audit = self.audit_path(key, released.fence, note.at_unix_ms)?;
            write_audit(
                store,
                key,
                &audit,
                audit_body(key, note, previous.as_ref(), removed.as_ref()),
            )
            .await?;
            let nonce = released.nonce.clone();
            match core.put(&path, released.encode(), mode).await {
                Ok(Put::Written(_)) => return Ok(Broken::new(previous, audit.to_string())),
                // Changed since the read, or our own write retried into a
                // conflict with itself: the next read tells.
                Ok(Put::Conflict) => pending = Some((nonce, previous, audit)),
                Err(e) if e.is_unknown_outcome() => {
                    // Applied or not: look once for our nonce.
                    if let Ok(Some(s)) = core.get(&path, key.as_str()).await {
                        if s.record.nonce == nonce {
                            return Ok(Broken::new(previous, audit.to_string()));
                        }
                    }
                    return Err(e);
                }
                Err(e) => {
                    forget(store, Some((nonce, previous, audit))).await;
                    return Err(e);
                }
            }
        }
        Err(Error::Unavailable {
            detail: format!(
                "{key}: the lease object changed under {CONTENTION_ATTEMPTS} conditional writes in a row"
            ),
            source: None,
        })
    }
}

/// The holder named in records and markers a break writes.
const BREAKER: &str = "lease-break";

fn released_record(fence: u64) -> Record {
    Record {
        state: State::Released,
        holder: BREAKER.into(),
        fence,
        ttl_ms: 1000,
        nonce: nonce(),
        payload: Vec::new(),
    }
}

/// Writes a break's audit record. A failure means the break was not applied
/// (the audit is written before the lease object).
async fn write_audit(
    store: &Arc<dyn ObjectStore>,
    key: &LeaseKey,
    audit: &Path,
    body: Vec<u8>,
) -> Result<(), Error> {
    store
        .put(audit, PutPayload::from(body))
        .await
        .map(|_| ())
        .map_err(|e| {
            Error::Backend(
                format!("lease key {key} was not broken: its audit record {audit} could not be written first: {e}")
                    .into(),
            )
        })
}

/// Removes the audit record of an attempt that was not applied (best effort:
/// a leftover says a break was attempted).
async fn forget(store: &Arc<dyn ObjectStore>, attempt: Option<(String, Option<Holding>, Path)>) {
    if let Some((_, _, audit)) = attempt {
        let _ = store.delete(&audit).await;
    }
}

/// The `fence` a damaged record's header line still names, if any.
fn header_fence(bytes: &[u8]) -> Option<u64> {
    let line = bytes.split(|&b| b == b'\n').next()?;
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    v.get("fence")?.as_u64().filter(|f| *f > 0)
}

/// The one path segment `location` adds to `dir`, if it is a direct child.
fn direct_child(dir: &Path, location: &Path) -> Option<String> {
    let mut parts = location.prefix_match(dir)?;
    let name = parts.next()?;
    parts.next().is_none().then(|| name.as_ref().to_owned())
}

/// `{fence}-{at_unix_ms}` as a break names its audit record: two decimal
/// numbers as `u64` writes them (digits only, no leading zeros).
fn parse_audit_name(name: &str) -> Option<(u64, u64)> {
    let (fence, at) = name.split_once('-')?;
    Some((canonical_u64(fence)?, canonical_u64(at)?))
}

fn canonical_u64(s: &str) -> Option<u64> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    // Digits only: an error here is an overflow.
    s.parse().ok()
}

fn oversize_audit(key: &LeaseKey, path: &Path, size: u64) -> Error {
    Error::corrupt(
        key,
        format!(
            "{path}, the audit record of its most recent break, has {size} bytes, more \
             than any a break writes ({MAX_AUDIT_LEN} at most): not read, left as it is"
        ),
    )
}

/// Reads the audit record named `{fence}-{at_unix_ms}`, checking it against
/// its name and key.
fn decode_audit(
    key: &LeaseKey,
    fence: u64,
    at_unix_ms: u64,
    bytes: &[u8],
) -> Result<LastBreak, String> {
    let record = AuditRecord::from_json(bytes, AUDIT_FORMAT, key)?;
    if record.note.at_unix_ms != at_unix_ms {
        return Err(format!(
            "the record says at_unix_ms {}, its name {at_unix_ms}",
            record.note.at_unix_ms
        ));
    }
    // A break of a live grant keeps its fence, and is named by it.
    if let Some(p) = record.previous.as_ref().filter(|p| p.fence.get() != fence) {
        return Err(format!(
            "the record names fence {} for the grant it ended, its name {fence}",
            p.fence
        ));
    }
    Ok(record.last_break())
}

/// A break's audit record (see the module docs); `removed`: what is kept of
/// the object it replaced when that was not a lease record.
fn audit_body(
    key: &LeaseKey,
    note: &BreakNote,
    previous: Option<&Holding>,
    removed: Option<&Removed>,
) -> Vec<u8> {
    AuditRecord::new(Some(AUDIT_FORMAT), key, note, previous, removed.cloned())
        .to_json()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_json(removed: Option<&Removed>) -> serde_json::Value {
        let key = LeaseKey::new("job").unwrap();
        let note = BreakNote::new("ops", "stuck").with_at_unix_ms(5);
        serde_json::from_slice(&audit_body(&key, &note, None, removed)).unwrap()
    }

    #[test]
    fn removed_keeps_the_length_and_the_first_4096_bytes() {
        let big: Vec<u8> = (0..5000u32).map(|i| (i % 256) as u8).collect();
        let r = Removed::of_read(&big, 5000);
        assert_eq!(
            (r.len, r.head.as_slice(), r.truncated),
            (5000, &big[..4096], false)
        );
        let v = body_json(Some(&r));
        assert_eq!(v["removed_corrupt_record"], true);
        assert_eq!(v["removed"]["len"], 5000);
        let key = LeaseKey::new("job").unwrap();
        let note = BreakNote::new("ops", "stuck").with_at_unix_ms(5);
        let body = audit_body(&key, &note, None, Some(&r));
        let record = AuditRecord::from_json(&body, AUDIT_FORMAT, &key).unwrap();
        assert_eq!(record.removed, Some(r));
        assert!(v["removed"].get("truncated").is_none(), "{v}");

        let r = Removed::of_read(b"xy", 2);
        assert_eq!(
            (r.len, r.head.as_slice(), r.truncated),
            (2, &b"xy"[..], false)
        );
        let r = Removed::of_read(b"", 0);
        assert_eq!((r.len, r.head.len(), r.truncated), (0, 0, false));
    }

    #[test]
    fn a_body_shorter_than_the_stated_size_is_marked_truncated() {
        let r = Removed::of_read(b"abc", u64::MAX);
        assert_eq!(
            (r.len, r.head.as_slice(), r.truncated),
            (u64::MAX, &b"abc"[..], true)
        );
        let v = body_json(Some(&r));
        assert_eq!(v["removed"]["len"], u64::MAX);
        assert_eq!(v["removed"]["truncated"], true);
        // A store that understates the size: the bytes read count.
        let r = Removed::of_read(b"abcd", 1);
        assert_eq!((r.len, r.truncated), (4, false));
    }

    #[test]
    fn nothing_removed_is_null_and_readers_ignore_the_field() {
        let v = body_json(None);
        assert_eq!(v["removed_corrupt_record"], false);
        assert!(v["removed"].is_null(), "{v}");
        let key = LeaseKey::new("job").unwrap();
        for removed in [None, Some(Removed::of_read(&[0xff; 5000], u64::MAX))] {
            let note = BreakNote::new("ops", "stuck").with_at_unix_ms(5);
            let body = audit_body(&key, &note, None, removed.as_ref());
            let last = decode_audit(&key, 9, 5, &body).unwrap();
            assert_eq!((last.holder, last.fence, last.note), (None, None, note));
        }
    }

    /// Records exactly as breaks wrote them before the record was shared.
    const WRITTEN_BEFORE: [&[u8]; 2] = [
        br#"{"action":"break","at_unix_ms":17,"by":"op","format":"lease-s3-audit/1","key":"jobs/a","previous":{"fence":9,"holder":"h-1","payload_len":3,"ttl_ms":5000},"reason":"stuck","removed":null,"removed_corrupt_record":false}"#,
        br#"{"action":"break","at_unix_ms":17,"by":"op","format":"lease-s3-audit/1","key":"jobs/a","previous":null,"reason":"stuck","removed":{"head_base64":"anVuaw==","len":9,"truncated":true},"removed_corrupt_record":true}"#,
    ];

    #[test]
    fn records_written_before_read_back_as_before() {
        use lease_core::{Fence, HolderId, Payload};

        let key = LeaseKey::new("jobs/a").unwrap();
        let note = BreakNote::new("op", "stuck").with_at_unix_ms(17);
        let holder = HolderId::new("h-1").unwrap();
        let [held, junk] = WRITTEN_BEFORE;
        assert_eq!(
            decode_audit(&key, 9, 17, held).unwrap(),
            LastBreak::new(Some(holder.clone()), Some(Fence(9)), note.clone())
        );
        assert_eq!(
            decode_audit(&key, 4, 17, junk).unwrap(),
            LastBreak::new(None, None, note.clone())
        );
        // Today's records hold the same fields and values.
        let prev = Holding::new(
            holder,
            Fence(9),
            Duration::from_secs(5),
            Payload::new(b"abc".to_vec()).unwrap(),
        );
        let removed = Removed::of_read(b"junk", 9);
        for (body, before) in [
            (audit_body(&key, &note, Some(&prev), None), held),
            (audit_body(&key, &note, None, Some(&removed)), junk),
        ] {
            let now: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let then: serde_json::Value = serde_json::from_slice(before).unwrap();
            assert_eq!(now, then);
        }
    }

    #[test]
    fn records_at_odds_with_their_name_or_key_are_malformed() {
        let key = LeaseKey::new("jobs/a").unwrap();
        let [held, _] = WRITTEN_BEFORE;
        let text = String::from_utf8(held.to_vec()).unwrap();
        // Named by another fence, or another time.
        assert!(decode_audit(&key, 8, 17, held).is_err());
        assert!(decode_audit(&key, 9, 18, held).is_err());
        for bad in [
            b"not json".to_vec(),
            text.replace("lease-s3-audit/1", "lease-etcd-audit/1")
                .into_bytes(),
            text.replace(r#""action":"break""#, r#""action":"acquire""#)
                .into_bytes(),
            text.replace(r#""key":"jobs/a""#, r#""key":"jobs/b""#)
                .into_bytes(),
            text.replace(r#""fence":9"#, r#""fence":-9"#).into_bytes(),
        ] {
            let got = decode_audit(&key, 9, 17, &bad);
            assert!(
                got.is_err(),
                "{:?} read as {got:?}",
                String::from_utf8_lossy(&bad)
            );
        }
    }
}
