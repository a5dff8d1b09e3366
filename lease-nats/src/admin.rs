//! The administrative break ([`LeaseBackend::break_lease`](lease_core::LeaseBackend::break_lease))
//! on JetStream KV.
//!
//! The key's last message (a live record, or one that does not parse) is
//! replaced by a purge marker published with `Nats-Expected-Last-Subject-Sequence`
//! set to that message's sequence — exactly what a release does, without
//! the holder check. The key reads free at once; the next create gets a
//! later stream sequence, so the fence keeps rising.
//!
//! The audit record goes to a companion KV bucket `{bucket}_audit` (created on
//! the first break), under `{key}/{sequence}/{at_unix_ms}`: `{sequence}` is
//! the purge marker's stream sequence (or, for a key that was already free,
//! the sequence of its last message). A separate bucket is a separate stream
//! with its own subjects (`$KV.{bucket}_audit.>`), so an audit record can
//! never be read as a lease, count against a lease key's history, or be
//! purged by a lease's rollup.
//!
//! # The audit body
//!
//! One line of JSON (format `lease-nats-audit/1`): `action` (`"break"`),
//! `key`, `seq`, the note (`by`, `reason`, `at_unix_ms`), `previous` (the
//! broken grant's `holder`, `fence`, `ttl_ms` and `payload_len`, or null),
//! `removed_corrupt_record` (whether the break removed a message that is not
//! a lease record: foreign or corrupt) and `removed`, what such a message
//! held, bounded: `{"len": <its whole length in bytes>, "head_base64": <its
//! first 4096 bytes, standard base64>}` (null when nothing corrupt was
//! removed). These are the bytes of the very message the purge marker was
//! guarded on, not a later read. The field names and the limit are the schema
//! every backend shares ([`lease_core::audit`]). The history entry and
//! the latest-break entry carry the same body.
//!
//! # Reading the last break back
//!
//! [`LeaseBackend::last_break`](lease_core::LeaseBackend::last_break) must not
//! list the history (unbounded), and no subject wildcard can pick the newest
//! `{key}/…` entry (`/` is not a token separator). So each break also writes a
//! copy of its audit body to the key's *latest* entry,
//! `/lease-nats/last-break/{key}`, which `last_break` reads in one request.
//! That name cannot collide with a history entry (a lease key never starts
//! with `/`) nor with the latest entry of another key.
//!
//! The order is: the break itself, then the history entry, then the latest
//! entry. A crash (or failure) between any two leaves the latest entry at an
//! earlier break, or absent, so `last_break` may miss the newest break but
//! never reports one that did not happen. The latest entry is replaced by a
//! conditional write (expecting its last revision) and only by a break at a
//! lease-stream sequence at least its own: two breakers racing cannot leave the
//! older break as the latest. A latest entry whose sequence lies beyond the
//! lease stream's last sequence comes from an earlier incarnation of the lease
//! bucket (deleted and made again) and is replaced.
//!
//! Breaks recorded before the latest entry existed have only their history
//! entry: `last_break` reports nothing for them.

use async_nats::jetstream::kv;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{
    LastRawMessageError, LastRawMessageErrorKind, StorageType, Stream,
};
use async_nats::jetstream::ErrorCode;
use async_nats::HeaderMap;
use bytes::Bytes;
use lease_core::audit::{AuditRecord, Removed};
use lease_core::{BreakNote, Broken, Error, Holding, LastBreak, LeaseKey, CONTENTION_ATTEMPTS};
use serde::Deserialize;

use std::time::Duration;

use crate::backend::NatsBackend;
use crate::cache::Seen;
use crate::conditional::Put;
use crate::errors::{contended, read_error, rewound};
use crate::record::{self, holding, message_ttl, Slot};

/// The format of audit bodies (history and latest entries alike).
const AUDIT_FORMAT: &str = "lease-nats-audit/1";

/// Where a key's latest-break entry lives in the audit bucket: this plus the
/// lease key. No history entry starts with `/` (no lease key does).
const LATEST_PREFIX: &str = "/lease-nats/last-break/";

/// What the key's last message is, tolerating one that does not parse.
enum Last {
    /// Free: no message (0) or a tombstone/marker at this sequence.
    Free(u64),
    /// A lease record at this sequence, with the TTL of its message.
    Live(u64, Holding, Option<Duration>),
    /// A value that does not parse, with the TTL of its message and its
    /// payload (what a break removes, kept in part by its audit record).
    Corrupt(u64, Option<Duration>, Bytes),
}

impl NatsBackend {
    /// The name of the companion bucket holding break audit records.
    pub fn audit_bucket(&self) -> String {
        format!("{}_audit", self.inner.config.bucket)
    }

    async fn last(&self, key: &LeaseKey) -> Result<Last, Error> {
        match self.last_message(&self.subject(key)).await {
            Ok(Some(msg)) => Ok({
                let ttl = message_ttl(&msg.headers);
                match record::judge(key, msg.sequence, Some(&msg.headers), &msg.payload) {
                    Ok(Slot::Empty) => Last::Free(0),
                    Ok(Slot::Tombstone { seq }) => Last::Free(seq),
                    Ok(Slot::Live { seq, record }) => Last::Live(seq, holding(record), ttl),
                    Err(_) => Last::Corrupt(msg.sequence, ttl, msg.payload),
                }
            }),
            Ok(None) => Ok(Last::Free(0)),
            Err(e) => Err(read_error(key, e)),
        }
    }

    async fn audit_store(&self) -> Result<kv::Store, Error> {
        let name = self.audit_bucket();
        let js = &self.inner.js;
        if let Ok(store) = js.get_key_value(name.as_str()).await {
            return Ok(store);
        }
        let config = kv::Config {
            bucket: name.clone(),
            description: format!(
                "lease-nats: audit records of administrative breaks in {}",
                self.inner.config.bucket
            ),
            history: 1,
            storage: StorageType::File,
            num_replicas: self.inner.config.replicas,
            ..Default::default()
        };
        match js.create_key_value(config).await {
            Ok(store) => Ok(store),
            // Another breaker may have created it in between.
            Err(create_err) => js.get_key_value(name.as_str()).await.map_err(|_| {
                Error::unavailable(
                    format!("cannot open or create the audit bucket {name:?}"),
                    create_err,
                )
            }),
        }
    }

    pub(crate) async fn break_lease(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        let mut outcome = None;
        for _ in 0..CONTENTION_ATTEMPTS {
            // `removed`: the payload of a message that is not a record, from
            // the very read the purge below is guarded on (`seq`).
            let (seq, previous, removed, covers) = match self.last(key).await? {
                Last::Free(seq) => {
                    self.inner.cache.saw(key, Seen::Free(seq));
                    outcome = Some((seq, None, None));
                    break;
                }
                Last::Live(seq, h, ttl) => (seq, Some(h), None, ttl),
                Last::Corrupt(seq, ttl, payload) => (seq, None, Some(payload), ttl),
            };
            // The marker outlives the message it replaces (see purge_expecting).
            match self.purge_expecting(key, seq, covers).await? {
                Put::Stored(marker) => {
                    outcome = Some((marker, previous, removed));
                    break;
                }
                // Applied, but in a stream whose sequence went backwards.
                Put::Rewound { seq, floor } => {
                    return Err(rewound(key, "break", seq, floor, true));
                }
                // Renewed, released or expired since the read: look again.
                Put::WrongLastSequence => {}
            }
        }
        let Some((seq, previous, removed)) = outcome else {
            return Err(contended(key, "break"));
        };
        let store = self
            .audit_store()
            .await
            .map_err(|e| after_break(key, NOT_WRITTEN, e))?;
        let audit_key = format!("{}/{}/{}", key.as_str(), seq, note.at_unix_ms);
        let body = audit_body(key, note, seq, previous.as_ref(), removed.as_deref());
        self.count();
        store
            .put(audit_key.as_str(), body.clone())
            .await
            .map_err(|e| {
                after_break(
                    key,
                    NOT_WRITTEN,
                    Error::unavailable(format!("writing the audit record {audit_key}"), e),
                )
            })?;
        // Only after the history entry: a latest entry never names a break
        // whose record is missing.
        self.record_latest(&store, key, seq, body)
            .await
            .map_err(|e| after_break(key, LATEST_NOT_WRITTEN, e))?;
        Ok(Broken::new(
            previous,
            format!("NATS KV bucket {} key {audit_key}", self.audit_bucket()),
        ))
    }

    /// Makes `body` (the audit body of a break at lease-stream sequence `seq`)
    /// the key's latest-break entry, unless that entry holds a later break.
    async fn record_latest(
        &self,
        store: &kv::Store,
        key: &LeaseKey,
        seq: u64,
        body: Bytes,
    ) -> Result<(), Error> {
        let bucket = self.audit_bucket();
        let name = latest_key(key);
        let subject = format!("$KV.{bucket}.{name}");
        let at = || format!("the latest-break entry {name} of NATS KV bucket {bucket}");
        for _ in 0..CONTENTION_ATTEMPTS {
            let expected = match self.latest_message(&store.stream, &subject).await {
                Ok(None) => 0,
                Ok(Some(msg)) => {
                    // A body that does not say its sequence (not ours, or
                    // damaged) is replaced: the history keeps every break.
                    let stored = if is_tombstone(&msg.headers) {
                        None
                    } else {
                        stored_seq(&msg.payload)
                    };
                    if let Some(stored) = stored {
                        if stored > seq && !self.beyond_lease_stream(stored).await? {
                            // A later break is recorded already.
                            return Ok(());
                        }
                    }
                    msg.sequence
                }
                Err(e) => return Err(Error::unavailable(format!("reading {}", at()), e)),
            };
            match self
                .publish_expecting(subject.clone(), HeaderMap::new(), body.clone(), expected)
                .await
            {
                Ok(Some(_)) => return Ok(()),
                // Another breaker wrote it in between: look again.
                Ok(None) => {}
                Err(e) => return Err(Error::unavailable(format!("writing {}", at()), e)),
            }
        }
        Err(Error::Unavailable {
            detail: format!(
                "{} changed under {CONTENTION_ATTEMPTS} attempts in a row",
                at()
            ),
            source: None,
        })
    }

    /// Whether lease-stream sequence `seq` lies beyond the lease stream's last
    /// sequence: it was not given by this incarnation of the lease bucket.
    async fn beyond_lease_stream(&self, seq: u64) -> Result<bool, Error> {
        self.count();
        let info = self.inner.kv.stream.get_info().await.map_err(|e| {
            Error::unavailable(
                format!(
                    "reading the state of NATS KV bucket {:?}",
                    self.inner.config.bucket
                ),
                e,
            )
        })?;
        self.saw_seq(info.state.last_sequence);
        Ok(seq > info.state.last_sequence)
    }

    /// The last message on `subject` in the audit `stream`, from its leader;
    /// `None` when there is none or the stream does not exist.
    async fn latest_message<I>(
        &self,
        stream: &Stream<I>,
        subject: &str,
    ) -> Result<Option<StreamMessage>, LastRawMessageError> {
        self.count();
        let got = stream
            .raw_message_builder()
            .last_by_subject(subject)
            .send()
            .await;
        match got {
            Ok(msg) => Ok(Some(msg)),
            Err(e) => match e.kind() {
                LastRawMessageErrorKind::NoMessageFound => Ok(None),
                LastRawMessageErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    Ok(None)
                }
                _ => Err(e),
            },
        }
    }

    /// [`LeaseBackend::last_break`](lease_core::LeaseBackend::last_break):
    /// one read of the key's latest-break entry; nothing is written, and a
    /// missing audit bucket (no break ever) is not created.
    pub(crate) async fn last_break(&self, key: &LeaseKey) -> Result<Option<LastBreak>, Error> {
        let bucket = self.audit_bucket();
        let name = latest_key(key);
        let at = format!("NATS KV bucket {bucket} key {name}");
        // Only checks the name: no request, and nothing created.
        let stream = self
            .inner
            .js
            .get_stream_no_info(format!("KV_{bucket}"))
            .await
            .map_err(|e| Error::Backend(format!("audit bucket {bucket:?}: {e}").into()))?;
        let subject = format!("$KV.{bucket}.{name}");
        let msg = match self.latest_message(&stream, &subject).await {
            Ok(Some(msg)) => msg,
            Ok(None) => return Ok(None),
            Err(e) => return Err(audit_read_error(&at, e)),
        };
        // Deleted or purged by hand: no break on record.
        if is_tombstone(&msg.headers) {
            return Ok(None);
        }
        parse_audit(key, &at, &msg.payload).map(|(last, _)| Some(last))
    }
}

/// What a break whose audit failed did not write.
const NOT_WRITTEN: &str = "its audit record could not be written";
const LATEST_NOT_WRITTEN: &str = "its audit record was written, but not its latest-break entry \
     (last_break may report an earlier break, or none)";

/// The break itself was applied; only (part of) its audit record is missing.
///
/// Not [`Error::Backend`], which says "not applied": a caller retrying the
/// break would end the next, healthy holder's grant. An applied operation
/// reported as an error is, to the contract, an outcome the caller must not
/// take as "nothing happened": [`Error::Unavailable`], with the detail saying
/// what is known.
fn after_break(key: &LeaseKey, missing: &str, e: Error) -> Error {
    Error::Unavailable {
        detail: format!(
            "lease key {key} was broken (the break was applied: do not break it again, a new \
             holder may have it by now), but {missing}"
        ),
        source: Some(Box::new(e)),
    }
}

/// The audit bucket key of `key`'s latest-break entry.
fn latest_key(key: &LeaseKey) -> String {
    format!("{LATEST_PREFIX}{}", key.as_str())
}

/// A KV delete or purge tombstone (or a server's marker).
fn is_tombstone(headers: &HeaderMap) -> bool {
    headers.get(record::MARKER_REASON).is_some()
        || headers
            .get(record::KV_OPERATION)
            .is_some_and(|op| op.as_str() != "PUT")
}

fn audit_read_error(at: &str, e: LastRawMessageError) -> Error {
    match e.kind() {
        LastRawMessageErrorKind::JetStream(js) if js.code() < 500 => {
            Error::Backend(format!("reading {at}: {e}").into())
        }
        _ => Error::unavailable(format!("reading {at}"), e),
    }
}

/// The audit body of a break (see the module docs for its fields).
///
/// `seq` is the lease-stream sequence of the break (the purge marker's, or
/// the free key's last message's): it orders breaks of one key. `removed` is
/// the payload of the message the break removed when that was not a lease
/// record (foreign or corrupt); its first
/// [`REMOVED_HEAD_MAX`](lease_core::audit::REMOVED_HEAD_MAX) bytes are kept.
fn audit_body(
    key: &LeaseKey,
    note: &BreakNote,
    seq: u64,
    previous: Option<&Holding>,
    removed: Option<&[u8]>,
) -> Bytes {
    let record = AuditRecord::new(
        Some(AUDIT_FORMAT),
        key,
        note,
        previous,
        removed.map(Removed::of),
    );
    Bytes::from(record.with_seq(seq).to_json())
}

/// The lease-stream sequence a latest-break entry records, if it says one.
fn stored_seq(body: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    struct Seq {
        seq: Option<u64>,
    }
    serde_json::from_slice::<Seq>(body).ok()?.seq
}

/// Parses the audit body found at `at` for `key`, back to the break it
/// records and its lease-stream sequence (if the body has one: bodies
/// written before the latest-break entry existed have none).
fn parse_audit(key: &LeaseKey, at: &str, body: &[u8]) -> Result<(LastBreak, Option<u64>), Error> {
    let record = AuditRecord::from_json(body, AUDIT_FORMAT, key)
        .map_err(|detail| Error::corrupt(at, format!("audit record: {detail}")))?;
    Ok((record.last_break(), record.seq))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::{audit, Fence, HolderId};

    fn key() -> LeaseKey {
        LeaseKey::new("jobs/a").unwrap()
    }

    fn note() -> BreakNote {
        BreakNote::new("op", "stuck").with_at_unix_ms(17)
    }

    #[test]
    fn audit_bodies_read_back() {
        let holder = HolderId::new("h-1").unwrap();
        let prev = Holding::new(
            holder.clone(),
            Fence(9),
            std::time::Duration::from_secs(5),
            lease_core::Payload::empty(),
        );
        let body = audit_body(&key(), &note(), 12, Some(&prev), None);
        let (last, seq) = parse_audit(&key(), "at", &body).unwrap();
        assert_eq!(last, LastBreak::new(Some(holder), Some(Fence(9)), note()));
        assert_eq!(seq, Some(12));
        assert_eq!(stored_seq(&body), Some(12));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["removed_corrupt_record"], false);
        assert!(v["removed"].is_null(), "{v}");
        let free = audit_body(&key(), &note(), 0, None, Some(b"junk"));
        let (last, seq) = parse_audit(&key(), "at", &free).unwrap();
        assert_eq!((last.holder, last.fence, seq), (None, None, Some(0)));
    }

    #[test]
    fn removed_values_are_kept_bounded() {
        for len in [
            0,
            1,
            audit::REMOVED_HEAD_MAX - 1,
            audit::REMOVED_HEAD_MAX,
            audit::REMOVED_HEAD_MAX + 1,
            70_000,
        ] {
            let value: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let body = audit_body(&key(), &note(), 3, None, Some(&value));
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["removed_corrupt_record"], true);
            assert_eq!(v["removed"]["len"].as_u64(), Some(len as u64));
            let record = AuditRecord::from_json(&body, AUDIT_FORMAT, &key()).unwrap();
            let removed = record.removed.unwrap();
            assert_eq!(
                removed.head,
                value[..len.min(audit::REMOVED_HEAD_MAX)],
                "len {len}"
            );
            // Read back as before: the new field is ignored.
            let (last, seq) = parse_audit(&key(), "at", &body).unwrap();
            assert_eq!((last.holder, last.fence, seq), (None, None, Some(3)));
            assert_eq!(stored_seq(&body), Some(3));
        }
    }

    /// Bodies exactly as breaks wrote them before the record was shared.
    const WRITTEN_BEFORE: [&[u8]; 2] = [
        br#"{"action":"break","at_unix_ms":17,"by":"op","format":"lease-nats-audit/1","key":"jobs/a","previous":{"fence":9,"holder":"h-1","payload_len":3,"ttl_ms":5000},"reason":"stuck","removed":null,"removed_corrupt_record":false,"seq":12}"#,
        br#"{"action":"break","at_unix_ms":17,"by":"op","format":"lease-nats-audit/1","key":"jobs/a","previous":null,"reason":"stuck","removed":{"head_base64":"anVuaw==","len":4},"removed_corrupt_record":true,"seq":0}"#,
    ];

    #[test]
    fn bodies_written_before_read_back_as_before() {
        let [held, junk] = WRITTEN_BEFORE;
        let holder = HolderId::new("h-1").unwrap();
        let (last, seq) = parse_audit(&key(), "at", held).unwrap();
        assert_eq!(
            last,
            LastBreak::new(Some(holder.clone()), Some(Fence(9)), note())
        );
        assert_eq!((seq, stored_seq(held)), (Some(12), Some(12)));
        let (last, seq) = parse_audit(&key(), "at", junk).unwrap();
        assert_eq!(last, LastBreak::new(None, None, note()));
        assert_eq!((seq, stored_seq(junk)), (Some(0), Some(0)));
        // Today's bodies hold the same fields and values.
        let prev = Holding::new(
            holder,
            Fence(9),
            std::time::Duration::from_secs(5),
            lease_core::Payload::new(b"abc".to_vec()).unwrap(),
        );
        for (body, before) in [
            (audit_body(&key(), &note(), 12, Some(&prev), None), held),
            (audit_body(&key(), &note(), 0, None, Some(b"junk")), junk),
        ] {
            let now: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let then: serde_json::Value = serde_json::from_slice(before).unwrap();
            assert_eq!(now, then);
        }
    }

    #[test]
    fn old_bodies_are_read_leniently() {
        // As written before bodies carried "seq".
        let old = br#"{"format":"lease-nats-audit/1","action":"break","key":"jobs/a",
            "by":"op","reason":"stuck","at_unix_ms":17,
            "previous":{"holder":"h-1","fence":9,"ttl_ms":5000,"payload_len":0},
            "removed_corrupt_record":false}"#;
        let (last, seq) = parse_audit(&key(), "at", old).unwrap();
        assert_eq!(last.fence, Some(Fence(9)));
        assert_eq!(last.note, note());
        assert_eq!(seq, None);
        assert_eq!(stored_seq(old), None);
    }

    #[test]
    fn malformed_bodies_are_corrupt() {
        for bad in [
            &b""[..],
            b"not json",
            b"{}",
            br#"{"format":"lease-nats-audit/9","action":"break","key":"jobs/a","by":"","reason":"","at_unix_ms":1}"#,
            br#"{"format":"lease-nats-audit/1","action":"acquire","key":"jobs/a","by":"","reason":"","at_unix_ms":1}"#,
            br#"{"format":"lease-nats-audit/1","action":"break","key":"jobs/b","by":"","reason":"","at_unix_ms":1}"#,
            br#"{"format":"lease-nats-audit/1","action":"break","key":"jobs/a","by":"","reason":"","at_unix_ms":-1}"#,
            br#"{"format":"lease-nats-audit/1","action":"break","key":"jobs/a","by":"","reason":"","at_unix_ms":1,"previous":{"holder":"","fence":3}}"#,
            br#"{"format":"lease-nats-audit/1","action":"break","key":"jobs/a","by":"","reason":"","at_unix_ms":1,"previous":{"holder":"h","fence":0}}"#,
            br#"{"format":"lease-nats-audit/1","action":"break","key":"jobs/a","by":"","reason":"","at_unix_ms":1,"previous":{"holder":"h","fence":18446744073709551616}}"#,
        ] {
            match parse_audit(&key(), "bucket b key k", bad) {
                Err(Error::CorruptRecord { key, detail }) => {
                    assert_eq!(key, "bucket b key k");
                    assert!(detail.starts_with("audit record: "), "{detail}");
                }
                other => panic!("{:?} read as {other:?}", String::from_utf8_lossy(bad)),
            }
        }
    }

    #[test]
    fn latest_keys_collide_with_nothing() {
        let k = key();
        let latest = latest_key(&k);
        assert_eq!(latest, "/lease-nats/last-break/jobs/a");
        // No lease key (so no history entry `{key}/…`) starts with `/`.
        assert!(LeaseKey::new(latest.as_str()).is_err());
        assert_ne!(latest, latest_key(&LeaseKey::new("jobs/a/1").unwrap()));
    }
}
