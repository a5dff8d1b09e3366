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

use async_nats::jetstream::kv;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, StorageType};
use bytes::Bytes;
use lease_core::{BreakNote, Broken, Error, Holding, LeaseKey};
use serde_json::json;

use std::time::Duration;

use super::{
    contended, holding, message_ttl, read_error, rewound, NatsBackend, Put, Seen, MAX_ATTEMPTS,
};
use crate::record::{self, Slot};

/// What the key's last message is, tolerating one that does not parse.
enum Last {
    /// Free: no message (0) or a tombstone/marker at this sequence.
    Free(u64),
    /// A lease record at this sequence, with the TTL of its message.
    Live(u64, Holding, Option<Duration>),
    /// A value that does not parse, with the TTL of its message.
    Corrupt(u64, Option<Duration>),
}

impl NatsBackend {
    /// The name of the companion bucket holding break audit records.
    pub fn audit_bucket(&self) -> String {
        format!("{}_audit", self.inner.config.bucket)
    }

    async fn last(&self, key: &LeaseKey) -> Result<Last, Error> {
        self.count();
        let got = self
            .inner
            .kv
            .stream
            .raw_message_builder()
            .last_by_subject(self.subject(key))
            .send()
            .await;
        match got {
            Ok(msg) => Ok({
                self.saw_seq(msg.sequence);
                let ttl = message_ttl(&msg.headers);
                match record::judge(key, msg.sequence, Some(&msg.headers), &msg.payload) {
                    Ok(Slot::Empty) => Last::Free(0),
                    Ok(Slot::Tombstone { seq }) => Last::Free(seq),
                    Ok(Slot::Live { seq, record }) => Last::Live(seq, holding(record), ttl),
                    Err(_) => Last::Corrupt(msg.sequence, ttl),
                }
            }),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(Last::Free(0)),
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

    pub(super) async fn break_key(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        let mut outcome = None;
        for _ in 0..MAX_ATTEMPTS {
            let (seq, previous, corrupt, covers) = match self.last(key).await? {
                Last::Free(seq) => {
                    self.saw(key, Seen::Free(seq));
                    outcome = Some((seq, None, false));
                    break;
                }
                Last::Live(seq, h, ttl) => (seq, Some(h), false, ttl),
                Last::Corrupt(seq, ttl) => (seq, None, true, ttl),
            };
            // The marker outlives the message it replaces (see purge_expecting).
            match self.purge_expecting(key, seq, covers).await? {
                Put::Stored(marker) => {
                    outcome = Some((marker, previous, corrupt));
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
        let Some((seq, previous, corrupt)) = outcome else {
            return Err(contended(key, "break"));
        };
        let store = self.audit_store().await.map_err(|e| after_break(key, e))?;
        let audit_key = format!("{}/{}/{}", key.as_str(), seq, note.at_unix_ms);
        self.count();
        store
            .put(
                audit_key.as_str(),
                audit_body(key, note, previous.as_ref(), corrupt),
            )
            .await
            .map_err(|e| {
                after_break(
                    key,
                    Error::unavailable(format!("writing the audit record {audit_key}"), e),
                )
            })?;
        Ok(Broken {
            previous,
            audit: format!("NATS KV bucket {} key {audit_key}", self.audit_bucket()),
        })
    }
}

/// The break itself was applied; only its audit record is missing.
///
/// Not [`Error::Backend`], which says "not applied": a caller retrying the
/// break would end the next, healthy holder's grant. An applied operation
/// reported as an error is, to the contract, an outcome the caller must not
/// take as "nothing happened": [`Error::Unavailable`], with the detail saying
/// what is known.
fn after_break(key: &LeaseKey, e: Error) -> Error {
    Error::Unavailable {
        detail: format!(
            "lease key {key} was broken (the break was applied: do not break it again, a new \
             holder may have it by now), but its audit record could not be written"
        ),
        source: Some(Box::new(e)),
    }
}

fn audit_body(
    key: &LeaseKey,
    note: &BreakNote,
    previous: Option<&Holding>,
    corrupt: bool,
) -> Bytes {
    Bytes::from(
        json!({
            "format": "lease-nats-audit/1",
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
            "removed_corrupt_record": corrupt,
        })
        .to_string(),
    )
}
