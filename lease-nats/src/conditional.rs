//! The conditional publish every write is, and the leader reads it is
//! guarded on.
//!
//! Every change to a key (acquire, renew, release, break) is one JetStream
//! publish with `Nats-Expected-Last-Subject-Sequence`, so a writer that read
//! an older message can never overwrite a newer one. Every request is
//! counted, and every stream sequence seen in an answer raises the floor a
//! later write must be stored above: one stored at or below it means the
//! stream's sequence went backwards, and the fence it would give is refused.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::header::{self, HeaderValue};
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::stream::{LastRawMessageError, LastRawMessageErrorKind};
use async_nats::HeaderMap;
use bytes::Bytes;
use lease_core::{Error, LeaseKey};

use crate::backend::NatsBackend;
use crate::cache::Seen;
use crate::errors::{js_error_code, publish_error, read_error};
use crate::record::{self, Slot};

/// `JSStreamWrongLastSequenceConstantErr`: the check failed inside a clustered
/// stream's proposal path (10071 is the single-server answer).
const WRONG_LAST_SEQUENCE_CLUSTERED: u64 = 10164;

/// What a conditional publish did.
pub(crate) enum Put {
    Stored(u64),
    WrongLastSequence,
    /// Stored at `seq`, which is not above `floor`, a sequence this client saw
    /// before sending: the stream's sequence went backwards.
    Rewound {
        seq: u64,
        floor: u64,
    },
}

impl NatsBackend {
    pub(crate) fn subject(&self, key: &LeaseKey) -> String {
        format!("{}{}", self.inner.subject_prefix, key.as_str())
    }

    pub(crate) fn count(&self) {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes a stream sequence seen in an answer from the server.
    pub(crate) fn saw_seq(&self, seq: u64) {
        self.inner.max_seq.fetch_max(seq, Ordering::Relaxed);
    }

    /// Publishes a purge marker expecting `expected` as the key's last
    /// sequence (release and break). The key reads free at once.
    ///
    /// `covers` is the TTL of the message the marker replaces (`None`: it has
    /// none, or it is unknown). The marker lives at least that long, then
    /// disappears instead of piling up per released key: after a crash,
    /// nats-server can bring back messages removed shortly before, and drops
    /// again only those whose TTL has passed — a marker that expired before
    /// the record it replaced would let that record (a released grant) come
    /// back to life. A message without TTL gets a marker without TTL.
    pub(crate) async fn purge_expecting(
        &self,
        key: &LeaseKey,
        expected: u64,
        covers: Option<Duration>,
    ) -> Result<Put, Error> {
        let mut headers = HeaderMap::new();
        headers.insert(record::KV_OPERATION, "PURGE");
        headers.insert(header::NATS_ROLLUP, "sub");
        let marker_ttl = covers.map(|ttl| ttl.max(self.inner.config.marker_ttl));
        let put = self
            .put(key, headers, Bytes::new(), expected, marker_ttl)
            .await?;
        if let Put::Stored(seq) | Put::Rewound { seq, .. } = put {
            self.inner.cache.forget(key);
            self.inner.cache.saw(key, Seen::Free(seq));
        }
        Ok(put)
    }

    /// Publishes `body` to `subject` on condition that the subject's last
    /// stream sequence is `expected` (0: no message). `Ok(None)` when the
    /// condition failed, whichever way the server said so.
    pub(crate) async fn publish_expecting(
        &self,
        subject: String,
        mut headers: HeaderMap,
        body: Bytes,
        expected: u64,
    ) -> Result<Option<PublishAck>, PublishError> {
        // The number itself: its text is made once, in the header.
        headers.insert(
            header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            HeaderValue::from(expected),
        );
        self.count();
        // Boxed: async-nats' publish future is most of a kilobyte, and held
        // inline it makes every operation's future larger than a kilobyte,
        // an allocation glibc's malloc answers by consolidating all its
        // small free chunks first (a third of the client's CPU per renewal
        // in a group of 100,000 leases).
        let publish = Box::pin(self.inner.js.publish_with_headers(subject, headers, body));
        let ack = match publish.await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match ack {
            Ok(ack) => Ok(Some(ack)),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(None),
            // A clustered stream answers a failed sequence check with 10164
            // ("wrong last sequence", no number), which async-nats does not map.
            Err(e) if js_error_code(&e) == Some(WRONG_LAST_SEQUENCE_CLUSTERED) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The last message of the lease bucket's `subject`, read from the stream
    /// leader; `Ok(None)` when it has none. Notes its sequence as seen.
    pub(crate) async fn last_message(
        &self,
        subject: &str,
    ) -> Result<Option<StreamMessage>, LastRawMessageError> {
        self.count();
        // Boxed, as the publish in `publish_expecting` is.
        let got = Box::pin(
            self.inner
                .kv
                .stream
                .raw_message_builder()
                .last_by_subject(subject)
                .send(),
        )
        .await;
        match got {
            Ok(msg) => {
                self.saw_seq(msg.sequence);
                Ok(Some(msg))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn put(
        &self,
        key: &LeaseKey,
        mut headers: HeaderMap,
        body: Bytes,
        expected: u64,
        ttl: Option<Duration>,
    ) -> Result<Put, Error> {
        if let Some(ttl) = ttl {
            // Whole seconds (the TTL rule rounded grants' TTLs up already);
            // never shorter than asked.
            let secs = ttl
                .as_secs()
                .saturating_add(u64::from(ttl.subsec_nanos() > 0))
                .max(1);
            headers.insert(header::NATS_MESSAGE_TTL, HeaderValue::from(secs));
        }
        // Every sequence seen so far belongs to a message stored before this
        // one is sent: the server must give this one a higher sequence.
        let floor = self.inner.max_seq.load(Ordering::Relaxed);
        match self
            .publish_expecting(self.subject(key), headers, body, expected)
            .await
        {
            Ok(Some(ack)) if ack.sequence <= floor => Ok(Put::Rewound {
                seq: ack.sequence,
                floor,
            }),
            Ok(Some(ack)) => {
                self.saw_seq(ack.sequence);
                Ok(Put::Stored(ack.sequence))
            }
            Ok(None) => Ok(Put::WrongLastSequence),
            Err(e) => Err(publish_error(key, e)),
        }
    }

    /// The last message of `key`'s subject, read from the stream leader so the
    /// answer is as current as the conditional writes it is followed by.
    pub(crate) async fn slot(&self, key: &LeaseKey) -> Result<Slot, Error> {
        let slot = match self.last_message(&self.subject(key)).await {
            Ok(Some(msg)) => record::judge(key, msg.sequence, Some(&msg.headers), &msg.payload)?,
            Ok(None) => Slot::Empty,
            Err(e) => return Err(read_error(key, e)),
        };
        self.inner.cache.note_slot(key, &slot);
        Ok(slot)
    }
}
