//! The [`LeaseBackend`] implementation on JetStream KV.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::stream::{LastRawMessageError, LastRawMessageErrorKind};
use async_nats::jetstream::Context;
use async_nats::{Client, HeaderMap};
use bytes::Bytes;
use futures_util::StreamExt;
use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Fence, Grant,
    HolderId, Holding, LastBreak, LeaseBackend, LeaseKey, LeaseState, Payload, Renewal, Version,
};

use crate::cache::Bounded;
use crate::errors::{contended, js_error_code, publish_error, read_error, rewound};
use crate::record::{self, Record, Slot};
use crate::NatsConfig;

/// How many times one operation re-reads a key that changed under it, and
/// tries again, before it gives up with [`Error::Unavailable`]. Each retry
/// means another writer won a race in between (another client, or the server's expiry marker; a stale hint from this client's cache costs one attempt too), and
/// the next attempt normally sees the winner and answers from it, so two
/// suffice under ordinary contention; the same value in every backend of
/// the workspace.
pub(crate) const CONTENTION_ATTEMPTS: usize = 4;

/// `JSStreamWrongLastSequenceConstantErr`: the check failed inside a clustered
/// stream's proposal path (10071 is the single-server answer).
pub(crate) const WRONG_LAST_SEQUENCE_CLUSTERED: u64 = 10164;

pub(crate) const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const MESSAGE_TTL: &str = "Nats-TTL";
const ROLLUP: &str = "Nats-Rollup";

/// Leases on a NATS JetStream KV bucket with per-key TTLs (nats-server ≥ 2.11).
///
/// * **Acquire** publishes the record with `Nats-Expected-Last-Subject-Sequence`
///   (0, or the sequence of the tombstone/expiry marker last seen on the key)
///   and `Nats-TTL`: one round trip on a never-used key or one whose marker this
///   client has seen (read, watched or released it); three otherwise. A key
///   this client last saw held is read first (one round trip when it still
///   is). The fence is the stream sequence of that create.
/// * **Renew** publishes the record again expecting the grant's last sequence,
///   with `Nats-TTL`: one round trip. A wrong sequence means loss.
/// * **Release** publishes a purge marker (with a TTL no shorter than the
///   grant's) expecting the grant's last sequence: one round trip; a lost
///   grant is left alone.
/// * **Expiry** is the server's: it removes the message when its TTL runs out
///   and writes a delete marker, which watchers see at once.
///
/// Cloning is cheap; clones share the connection.
#[derive(Clone)]
pub struct NatsBackend {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for NatsBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBackend")
            .field("subject_prefix", &self.inner.subject_prefix)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) js: Context,
    pub(crate) kv: kv::Store,
    /// `$KV.<bucket>.`: a key's subject is this plus the key.
    pub(crate) subject_prefix: String,
    pub(crate) config: NatsConfig,
    pub(crate) capabilities: Capabilities,
    /// The payload last written for each key by this client, with the sequence
    /// of that message: lets a renew without a new payload keep the stored one
    /// in a single round trip. A miss costs one read.
    /// Bounded: an evicted entry costs one read.
    pub(crate) payloads: Mutex<Bounded<LeaseKey, (u64, Payload)>>,
    /// What this client last saw as a key's last message (by a read, a
    /// watch, its own acquire or release): an acquire starts from it, so
    /// taking a released or expired key is one publish, and asking for a
    /// held key one read. Bounded: a missing or wrong entry costs one
    /// more round trip (every write is conditional), never a wrong grant.
    pub(crate) last_seen: Mutex<Bounded<LeaseKey, Seen>>,
    /// The highest stream sequence this client has seen (in a write's
    /// acknowledgement, a read, a watch or the stream's state at connect).
    /// Every message stored after that was seen has a higher sequence; one
    /// that does not means the stream's sequence went backwards, and the fence
    /// it would give is refused.
    pub(crate) max_seq: AtomicU64,
    pub(crate) requests: AtomicU64,
}

/// A key's last message as this client last saw it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Seen {
    /// Free: no message (0) or a tombstone/marker at this sequence.
    Free(u64),
    /// A lease record.
    Held,
}

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
    /// Keys held in this client's per-key caches (for observing that they stay
    /// bounded).
    #[doc(hidden)]
    pub fn cached_keys(&self) -> usize {
        self.payloads().len() + self.last_seen().len()
    }

    /// An acquire request for `key` by `holder` with the configured default TTL.
    pub fn request(&self, key: LeaseKey, holder: HolderId) -> AcquireRequest {
        AcquireRequest::new(key, holder).ttl(self.inner.config.default_ttl)
    }

    /// The underlying connection.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The configuration in force.
    pub fn config(&self) -> &NatsConfig {
        &self.inner.config
    }

    /// JetStream requests this backend (all clones) has sent: for measuring
    /// round trips per operation.
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    pub(crate) fn subject(&self, key: &LeaseKey) -> String {
        format!("{}{}", self.inner.subject_prefix, key.as_str())
    }

    pub(crate) fn count(&self) {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn check_payload(&self, payload: &Payload) -> Result<(), Error> {
        let max = self.inner.capabilities.max_payload;
        if payload.len() > max {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max,
            });
        }
        Ok(())
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
        headers.insert(ROLLUP, "sub");
        let marker_ttl = covers.map(|ttl| ttl.max(self.inner.config.marker_ttl));
        let put = self
            .put(key, headers, Bytes::new(), expected, marker_ttl)
            .await?;
        if let Put::Stored(seq) | Put::Rewound { seq, .. } = put {
            self.forget(key);
            self.saw(key, Seen::Free(seq));
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
        headers.insert(
            EXPECTED_LAST_SUBJECT_SEQUENCE,
            expected.to_string().as_str(),
        );
        self.count();
        let ack = match self
            .inner
            .js
            .publish_with_headers(subject, headers, body)
            .await
        {
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
        let got = self
            .inner
            .kv
            .stream
            .raw_message_builder()
            .last_by_subject(subject)
            .send()
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

    async fn put(
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
            headers.insert(MESSAGE_TTL, secs.to_string().as_str());
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
    async fn slot(&self, key: &LeaseKey) -> Result<Slot, Error> {
        let slot = match self.last_message(&self.subject(key)).await {
            Ok(Some(msg)) => record::judge(key, msg.sequence, Some(&msg.headers), &msg.payload)?,
            Ok(None) => Slot::Empty,
            Err(e) => return Err(read_error(key, e)),
        };
        self.note_slot(key, &slot);
        Ok(slot)
    }

    async fn state(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        Ok(match self.slot(key).await? {
            Slot::Empty | Slot::Tombstone { .. } => LeaseState::Free,
            Slot::Live { record, .. } => LeaseState::Held(holding(record)),
        })
    }

    async fn acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        let ttl = self.inner.capabilities.ttl.effective(req.ttl)?;
        self.check_payload(&req.payload)?;
        let sent = Instant::now();
        let fresh = record::encode(&req.holder, None, ttl, req.payload.as_bytes());
        // Start from what this client last saw: a free key is created at once
        // (expecting no message, or the tombstone seen), a held one is read
        // first. A wrong guess costs one more round trip.
        let mut expected = match self.last_seen().get(&req.key) {
            Some(Seen::Free(seq)) => Some(seq),
            Some(Seen::Held) => None,
            None => Some(0),
        };
        for _ in 0..CONTENTION_ATTEMPTS {
            if let Some(e) = expected {
                let put = self
                    .put(&req.key, HeaderMap::new(), fresh.clone(), e, Some(ttl))
                    .await?;
                match put {
                    Put::Stored(seq) => {
                        self.remember(&req.key, seq, req.payload.clone());
                        self.saw(&req.key, Seen::Held);
                        let grant =
                            Grant::new(req.key, req.holder, Fence(seq), ttl, sent, version(seq));
                        return Ok(Acquire::Granted(grant));
                    }
                    Put::Rewound { seq, floor } => {
                        // Not granted. Take the record back so the key is not
                        // blocked for a TTL by a grant nobody was given.
                        let removed = matches!(
                            self.purge_expecting(&req.key, seq, Some(ttl)).await,
                            Ok(Put::Stored(_) | Put::Rewound { .. })
                        );
                        return Err(rewound(&req.key, "acquire", seq, floor, !removed));
                    }
                    Put::WrongLastSequence => {}
                }
            }
            match self.slot(&req.key).await? {
                Slot::Empty => expected = Some(0),
                // Free, but a create must name the marker's sequence: async-nats'
                // own create would fall back to an update without TTL here.
                Slot::Tombstone { seq } => expected = Some(seq),
                Slot::Live { seq, record } if record.holder == req.holder => {
                    // Our own live grant (an earlier answer was lost): the same
                    // fence, extended from this request and with its payload.
                    let body = record::encode(
                        &req.holder,
                        Some(record.fence),
                        ttl,
                        req.payload.as_bytes(),
                    );
                    match self
                        .put(&req.key, HeaderMap::new(), body, seq, Some(ttl))
                        .await?
                    {
                        Put::Stored(new_seq) => {
                            self.remember(&req.key, new_seq, req.payload.clone());
                            let grant = Grant::new(
                                req.key,
                                req.holder,
                                record.fence,
                                ttl,
                                sent,
                                version(new_seq),
                            );
                            return Ok(Acquire::Granted(grant));
                        }
                        Put::Rewound { seq, floor } => {
                            return Err(rewound(&req.key, "acquire", seq, floor, true));
                        }
                        Put::WrongLastSequence => {}
                    }
                    expected = None;
                }
                Slot::Live { record, .. } => return Ok(Acquire::Held(holding(record))),
            }
        }
        Err(contended(&req.key, "acquire"))
    }

    async fn renew_grant(&self, grant: &Grant, payload: Option<Payload>) -> Result<Renewal, Error> {
        if let Some(p) = &payload {
            self.check_payload(p)?;
        }
        let sent = Instant::now();
        let key = grant.key();
        let Some(mut expected) = parse_version(grant.version()) else {
            return Err(Error::Backend(
                format!(
                    "grant version {:?} was not made by lease-nats",
                    grant.version()
                )
                .into(),
            ));
        };
        let mut body_payload = payload.clone().or_else(|| {
            self.payloads()
                .get(key)
                .filter(|(seq, _)| *seq == expected)
                .map(|(_, p)| p)
        });
        for _ in 0..CONTENTION_ATTEMPTS {
            let p = match body_payload.take() {
                Some(p) => p,
                // Not written by this client: take the stored payload (and the
                // current sequence, in case a renew's answer was lost).
                None => match self.own_slot(grant).await? {
                    Some((seq, record)) => {
                        expected = seq;
                        record.payload
                    }
                    None => {
                        self.forget(key);
                        return Ok(Renewal::Lost);
                    }
                },
            };
            let body = record::encode(
                grant.holder(),
                Some(grant.fence()),
                grant.ttl(),
                p.as_bytes(),
            );
            match self
                .put(key, HeaderMap::new(), body, expected, Some(grant.ttl()))
                .await?
            {
                Put::Stored(seq) => {
                    self.remember(key, seq, p);
                    return Ok(Renewal::Renewed(grant.renewed(sent, version(seq))));
                }
                // The renewal was stored, but the stream is not the one the
                // grant was made in: the holder must stop by its deadline.
                Put::Rewound { seq, floor } => {
                    self.forget(key);
                    return Err(rewound(key, "renew", seq, floor, true));
                }
                Put::WrongLastSequence => {
                    // Lost, unless an earlier renew of ours was applied and only
                    // its answer lost: then the key is still ours at a later sequence.
                    match self.own_slot(grant).await? {
                        Some((seq, record)) => {
                            expected = seq;
                            body_payload = Some(payload.clone().unwrap_or(record.payload));
                        }
                        None => {
                            self.forget(key);
                            return Ok(Renewal::Lost);
                        }
                    }
                }
            }
        }
        Err(contended(key, "renew"))
    }

    /// The key's current record and sequence iff it is still `grant`'s.
    async fn own_slot(&self, grant: &Grant) -> Result<Option<(u64, Record)>, Error> {
        Ok(match self.slot(grant.key()).await? {
            Slot::Live { seq, record }
                if record.holder == *grant.holder() && record.fence == grant.fence() =>
            {
                Some((seq, record))
            }
            _ => None,
        })
    }

    async fn release_grant(&self, grant: &Grant) -> Result<(), Error> {
        let key = grant.key();
        let Some(mut expected) = parse_version(grant.version()) else {
            return Err(Error::Backend(
                format!(
                    "grant version {:?} was not made by lease-nats",
                    grant.version()
                )
                .into(),
            ));
        };
        // The record's TTL as this client wrote it (acquire and renew send the
        // grant's TTL); a record found by a read may carry a longer one.
        let mut covers = grant.ttl();
        for _ in 0..CONTENTION_ATTEMPTS {
            match self.purge_expecting(key, expected, Some(covers)).await? {
                Put::Stored(_) => return Ok(()),
                Put::Rewound { seq, floor } => {
                    return Err(rewound(key, "release", seq, floor, true))
                }
                Put::WrongLastSequence => match self.own_slot(grant).await? {
                    // Still ours at a later sequence (a renew's answer was lost).
                    Some((seq, record)) => {
                        expected = seq;
                        covers = covers.max(record.ttl);
                    }
                    // Lost already: leave the new holder (or the free key) alone.
                    None => {
                        self.forget(key);
                        return Ok(());
                    }
                },
            }
        }
        Err(contended(key, "release"))
    }

    async fn wait(&self, key: &LeaseKey, seen: &LeaseState) -> Result<(), Error> {
        // Watch first, then look: a change between the look and the wait is
        // still delivered by the watch.
        self.count();
        let mut watch = self
            .inner
            .kv
            .watch(key.as_str())
            .await
            .map_err(|e| Error::unavailable(format!("watching lease key {key} failed"), e))?;
        match self.state(key).await {
            Ok(now) if now.same_state(seen) => {}
            Ok(_) | Err(Error::CorruptRecord { .. }) => return Ok(()),
            Err(e) => return Err(e),
        }
        while let Some(entry) = watch.next().await {
            let entry = entry
                .map_err(|e| Error::unavailable(format!("watch of lease key {key} failed"), e))?;
            self.saw_seq(entry.revision);
            let now = match entry.operation {
                Operation::Delete | Operation::Purge => {
                    self.saw(key, Seen::Free(entry.revision));
                    LeaseState::Free
                }
                Operation::Put => match record::decode(key, entry.revision, &entry.value) {
                    Ok(r) => {
                        self.saw(key, Seen::Held);
                        LeaseState::Held(holding(r))
                    }
                    Err(_) => return Ok(()),
                },
            };
            // Every renewal is a put: wake for a new holder, a release or
            // a new payload, not for a renewal that only extended the grant.
            if !now.same_state(seen) {
                return Ok(());
            }
        }
        // The watch ended (connection closed): wake the caller to re-read.
        Ok(())
    }
}

impl LeaseBackend for NatsBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(self.acquire(req))
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(self.renew_grant(grant, payload))
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.release_grant(grant))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(self.state(key))
    }

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(self.break_key(key, note))
    }

    /// One read of the key's latest-break entry in the audit bucket (see
    /// [`NatsBackend::audit_bucket`]); a missing bucket or entry is `None`.
    ///
    /// # Errors
    /// [`Error::CorruptRecord`] for an entry that is not a lease-nats audit
    /// body of this key (left as it is); [`Error::Backend`] when the server
    /// refuses the read (e.g. permissions); [`Error::Unavailable`] when it
    /// cannot be reached.
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(self.read_last_break(key))
    }

    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.wait(key, seen))
    }
}

/// The TTL a stored message carries in its `Nats-TTL` header: `None` when it
/// has none ("never", absent) or one this client cannot read, which the
/// callers treat as "no TTL" — the safe side for a marker that must outlive it.
pub(crate) fn message_ttl(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(MESSAGE_TTL)?.as_str().trim();
    let (digits, unit) = match value.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => value.split_at(i),
        None => (value, "s"),
    };
    let n: u64 = digits.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

pub(crate) fn holding(r: Record) -> Holding {
    // The remaining time stays unknown: JetStream does not report a
    // message's remaining TTL, and computing it from the stored timestamp
    // would compare a remote clock with ours.
    Holding::new(r.holder, r.fence, r.ttl, r.payload)
}

fn version(seq: u64) -> Version {
    Version::new(seq.to_string())
}

fn parse_version(v: &Version) -> Option<u64> {
    v.as_str().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ttls_are_read_or_unknown() {
        let ttl = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(MESSAGE_TTL, v);
            message_ttl(&h)
        };
        assert_eq!(ttl("60"), Some(Duration::from_secs(60)));
        assert_eq!(ttl("30s"), Some(Duration::from_secs(30)));
        assert_eq!(ttl("2m"), Some(Duration::from_secs(120)));
        assert_eq!(ttl("1h"), Some(Duration::from_secs(3600)));
        for unknown in ["never", "", "1.5s", "99999999999999999999", "5d"] {
            assert_eq!(ttl(unknown), None, "{unknown:?}");
        }
        assert_eq!(message_ttl(&HeaderMap::new()), None);
    }

    #[test]
    fn versions_round_trip() {
        assert_eq!(parse_version(&version(17)), Some(17));
        assert_eq!(parse_version(&Version::new("etag")), None);
    }
}
