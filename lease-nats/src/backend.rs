//! The [`LeaseBackend`] implementation on JetStream KV.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::stream::{LastRawMessageError, LastRawMessageErrorKind, StorageType};
use async_nats::jetstream::{self, Context};
use async_nats::{Client, ConnectOptions, HeaderMap};
use bytes::Bytes;
use futures_util::StreamExt;
use lease_core::{
    Acquire, AcquireRequest, BoxError, BoxFuture, BreakNote, Broken, Capabilities, Error,
    Exclusion, Fence, FenceScope, Grant, HolderId, Holding, LastBreak, LeaseBackend, LeaseKey,
    LeaseState, Payload, Renewal, TimeAuthority, TtlRule, Version, MAX_PAYLOAD_LEN,
};

use crate::cache::Bounded;
use crate::record::{self, Record, Slot};
use crate::NatsConfig;

/// The oldest nats-server with per-message TTLs (`Nats-TTL`, ADR-43).
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 11);

/// Bytes of a NATS message reserved for our record header and the JetStream
/// headers, out of the server's `max_payload`.
const ENVELOPE: usize = 1024;

/// How often one operation re-reads and retries after a concurrent change
/// before it reports the outcome unknown. Each retry means another client
/// changed the key in between, so a few suffice.
pub(crate) const MAX_ATTEMPTS: usize = 8;

/// `JSStreamWrongLastSequenceConstantErr`: the check failed inside a clustered
/// stream's proposal path (10071 is the single-server answer).
pub(crate) const WRONG_LAST_SEQUENCE_CLUSTERED: u64 = 10164;

pub(crate) const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const MESSAGE_TTL: &str = "Nats-TTL";
const ROLLUP: &str = "Nats-Rollup";

/// The bucket key of the anchor message: a key no [`LeaseKey`] can be
/// (a lease key never starts with `/`), so it never collides with a lease.
pub const ANCHOR_KEY: &str = "/lease-nats/anchor";

/// The anchor's body: says what it is to whoever looks at the bucket.
const ANCHOR_BODY: &[u8] =
    b"lease-nats anchor: a permanent message that keeps this bucket's stream \
non-empty, so that its sequence (the leases' fence counter) is never that of an empty stream. \
Do not delete it.";

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

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) js: Context,
    pub(crate) kv: kv::Store,
    /// `$KV.<bucket>.`: a key's subject is this plus the key.
    subject_prefix: String,
    pub(crate) config: NatsConfig,
    capabilities: Capabilities,
    /// The payload last written for each key by this client, with the sequence
    /// of that message: lets a renew without a new payload keep the stored one
    /// in a single round trip. A miss costs one read.
    /// Bounded: an evicted entry costs one read.
    payloads: Mutex<Bounded<LeaseKey, (u64, Payload)>>,
    /// What this client last saw as a key's last message (by a read, a
    /// watch, its own acquire or release): an acquire starts from it, so
    /// taking a released or expired key is one publish, and asking for a
    /// held key one read. Bounded: a missing or wrong entry costs one
    /// more round trip (every write is conditional), never a wrong grant.
    last_seen: Mutex<Bounded<LeaseKey, Seen>>,
    /// The highest stream sequence this client has seen (in a write's
    /// acknowledgement, a read, a watch or the stream's state at connect).
    /// Every message stored after that was seen has a higher sequence; one
    /// that does not means the stream's sequence went backwards, and the fence
    /// it would give is refused.
    max_seq: AtomicU64,
    requests: AtomicU64,
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
    /// Connects to `url` (one server, or a comma-separated list of a cluster's
    /// servers) with default connection options, opens the configured bucket
    /// (creating it only if [`NatsConfig::create_bucket`] says so) and writes
    /// its anchor ([`ANCHOR_KEY`]) if that is missing and this client may
    /// write it.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the server cannot be reached;
    /// [`Error::Backend`] when it is older than 2.11, has no JetStream, the
    /// bucket is missing (and not to be created), or it cannot be used for
    /// leases (no message TTLs or delete markers, a `max_age`, memory storage).
    pub async fn connect(url: &str, config: NatsConfig) -> Result<Self, Error> {
        Self::connect_with_options(url, ConnectOptions::new(), config).await
    }

    /// Connects with `options` (credentials, TLS, names… as async-nats offers).
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with_options(
        url: &str,
        options: ConnectOptions,
        config: NatsConfig,
    ) -> Result<Self, Error> {
        config.validate()?;
        install_crypto_provider();
        // A comma-separated list names several servers of one cluster: the
        // client fails over between them (and learns the others from INFO).
        let servers: Vec<&str> = url.split(',').map(str::trim).collect();
        let client = options
            .connect(servers)
            .await
            .map_err(|e| connect_error(url, e))?;
        Self::with_client(client, config).await
    }

    /// Uses an existing connection.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_client(client: Client, config: NatsConfig) -> Result<Self, Error> {
        config.validate()?;
        let info = client.server_info();
        check_server_version(&info.version)?;
        if !info.jetstream {
            return Err(refused(format!(
                "nats-server {} at {}:{} has JetStream disabled; lease-nats needs it (run nats-server with -js)",
                info.version, info.host, info.port
            )));
        }
        let js = jetstream::ContextBuilder::new()
            .timeout(config.request_timeout)
            .build(client.clone());
        let (kv, last_seq) = open_bucket(&js, &config).await?;
        let max_payload = info
            .max_payload
            .saturating_sub(ENVELOPE)
            .min(MAX_PAYLOAD_LEN);
        let capabilities = Capabilities {
            time_authority: TimeAuthority::BackendClock,
            ttl: TtlRule {
                granularity: Duration::from_secs(1),
                min: Duration::from_secs(1),
                max: Duration::from_secs(config.max_ttl.as_secs()),
            },
            watch: true,
            exclusion: Exclusion::Atomic,
            fence_scope: FenceScope::Global,
            max_payload,
        };
        let backend = NatsBackend {
            inner: Arc::new(Inner {
                subject_prefix: format!("$KV.{}.", config.bucket),
                client,
                js,
                kv,
                config,
                capabilities,
                payloads: Mutex::new(Bounded::new()),
                last_seen: Mutex::new(Bounded::new()),
                max_seq: AtomicU64::new(last_seq),
                requests: AtomicU64::new(0),
            }),
        };
        // Best effort: a client that may only read (a watcher, a status
        // check) must still connect, and any writer's connect writes it.
        let _ = backend.ensure_anchor().await;
        Ok(backend)
    }

    /// Writes the bucket's anchor unless it is there: a message on the key
    /// [`ANCHOR_KEY`] without a TTL, so the stream is never empty (nats-server
    /// has, in several versions, lost an empty stream's last sequence on
    /// restart or crash recovery). An anchor deleted or purged as a key leaves
    /// a tombstone, which keeps the stream non-empty too and is replaced here;
    /// one removed from the stream itself is written again by the next
    /// connect. A failure leaves the bucket as it was (the next connect tries
    /// again).
    async fn ensure_anchor(&self) -> Result<(), Error> {
        let subject = format!("{}{ANCHOR_KEY}", self.inner.subject_prefix);
        let bucket = &self.inner.config.bucket;
        self.count();
        let got = self
            .inner
            .kv
            .stream
            .raw_message_builder()
            .last_by_subject(subject.as_str())
            .send()
            .await;
        let expected = match got {
            Ok(msg) => {
                self.saw_seq(msg.sequence);
                let tombstone = msg.headers.get(record::MARKER_REASON).is_some()
                    || msg
                        .headers
                        .get(record::KV_OPERATION)
                        .is_some_and(|op| op.as_str() != "PUT");
                if !tombstone {
                    return Ok(());
                }
                msg.sequence
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => 0,
            Err(e) => {
                return Err(Error::unavailable(
                    format!("reading the anchor of NATS KV bucket {bucket:?}"),
                    e,
                ))
            }
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            EXPECTED_LAST_SUBJECT_SEQUENCE,
            expected.to_string().as_str(),
        );
        self.count();
        let ack = match self
            .inner
            .js
            .publish_with_headers(subject, headers, Bytes::from_static(ANCHOR_BODY))
            .await
        {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match ack {
            Ok(ack) => {
                self.saw_seq(ack.sequence);
                Ok(())
            }
            // Another client wrote it in between.
            Err(e)
                if e.kind() == PublishErrorKind::WrongLastSequence
                    || js_error_code(&e) == Some(WRONG_LAST_SEQUENCE_CLUSTERED) =>
            {
                Ok(())
            }
            Err(e) => Err(Error::unavailable(
                format!("writing the anchor of NATS KV bucket {bucket:?}"),
                e,
            )),
        }
    }

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

    fn payloads(&self) -> MutexGuard<'_, Bounded<LeaseKey, (u64, Payload)>> {
        // Every update is a single insert or remove: a poisoned map is whole.
        self.inner
            .payloads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn last_seen(&self) -> MutexGuard<'_, Bounded<LeaseKey, Seen>> {
        // As for `payloads`: single inserts and removes only.
        self.inner
            .last_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn saw(&self, key: &LeaseKey, seen: Seen) {
        self.last_seen().insert(key.clone(), seen);
    }

    /// Notes a stream sequence seen in an answer from the server.
    pub(crate) fn saw_seq(&self, seq: u64) {
        self.inner.max_seq.fetch_max(seq, Ordering::Relaxed);
    }

    /// Records what the key's last message was, as a hint for the next acquire.
    fn note_slot(&self, key: &LeaseKey, slot: &Slot) {
        match slot {
            Slot::Tombstone { seq } => self.saw(key, Seen::Free(*seq)),
            Slot::Empty => self.saw(key, Seen::Free(0)),
            Slot::Live { .. } => self.saw(key, Seen::Held),
        }
    }

    fn remember(&self, key: &LeaseKey, seq: u64, payload: Payload) {
        self.payloads().insert(key.clone(), (seq, payload));
    }

    fn forget(&self, key: &LeaseKey) {
        self.payloads().remove(key);
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

    async fn put(
        &self,
        key: &LeaseKey,
        mut headers: HeaderMap,
        body: Bytes,
        expected: u64,
        ttl: Option<Duration>,
    ) -> Result<Put, Error> {
        headers.insert(
            EXPECTED_LAST_SUBJECT_SEQUENCE,
            expected.to_string().as_str(),
        );
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
        self.count();
        let ack = self
            .inner
            .js
            .publish_with_headers(self.subject(key), headers, body)
            .await;
        let ack = match ack {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match ack {
            Ok(ack) if ack.sequence <= floor => Ok(Put::Rewound {
                seq: ack.sequence,
                floor,
            }),
            Ok(ack) => {
                self.saw_seq(ack.sequence);
                Ok(Put::Stored(ack.sequence))
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(Put::WrongLastSequence),
            // A clustered stream answers a failed sequence check with 10164
            // ("wrong last sequence", no number), which async-nats does not map.
            Err(e) if js_error_code(&e) == Some(WRONG_LAST_SEQUENCE_CLUSTERED) => {
                Ok(Put::WrongLastSequence)
            }
            Err(e) => Err(publish_error(key, e)),
        }
    }

    /// The last message of `key`'s subject, read from the stream leader so the
    /// answer is as current as the conditional writes it is followed by.
    async fn slot(&self, key: &LeaseKey) -> Result<Slot, Error> {
        self.count();
        let got = self
            .inner
            .kv
            .stream
            .raw_message_builder()
            .last_by_subject(self.subject(key))
            .send()
            .await;
        let slot = match got {
            Ok(msg) => {
                self.saw_seq(msg.sequence);
                record::judge(key, msg.sequence, Some(&msg.headers), &msg.payload)?
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Slot::Empty,
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
        for _ in 0..MAX_ATTEMPTS {
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
        for _ in 0..MAX_ATTEMPTS {
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
        for _ in 0..MAX_ATTEMPTS {
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
            Ok(now) if now.same_grant(seen) => {}
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
            if !now.same_grant(seen) {
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
    Holding {
        holder: r.holder,
        fence: r.fence,
        // JetStream does not report a message's remaining TTL, and computing it
        // from the stored timestamp would compare a remote clock with ours.
        remaining: None,
        ttl: r.ttl,
        payload: r.payload,
    }
}

fn version(seq: u64) -> Version {
    Version::new(seq.to_string())
}

fn parse_version(v: &Version) -> Option<u64> {
    v.as_str().parse().ok()
}

fn refused(reason: String) -> Error {
    Error::Backend(reason.into())
}

/// The server stored a message at `seq`, not above the sequence `floor` this
/// client had seen before sending it: the bucket's stream sequence went
/// backwards (data restored from an older copy, the bucket deleted and made
/// again, or a server that lost it). Fences from it could repeat earlier ones.
/// `applied`: whether what was stored stays (the outcome is then reported
/// unknown) or was taken back.
pub(crate) fn rewound(key: &LeaseKey, op: &str, seq: u64, floor: u64, applied: bool) -> Error {
    let detail = format!(
        "{op} of lease key {key}: the stream sequence went backwards (stored at {seq}, \
         but sequence {floor} was seen before): fences from this bucket could repeat earlier \
         ones, so none is given. Move the stream's sequence above {floor} (e.g. purge the \
         stream up to a sequence above it once no lease is held) or use a new bucket"
    );
    if applied {
        Error::Unavailable {
            detail,
            source: None,
        }
    } else {
        Error::Backend(detail.into())
    }
}

pub(crate) fn contended(key: &LeaseKey, op: &str) -> Error {
    Error::Unavailable {
        detail: format!(
            "{op} of lease key {key}: the key changed under {MAX_ATTEMPTS} attempts in a row"
        ),
        source: None,
    }
}

/// Refuses servers without per-message TTLs: on them a lease would be stored
/// without an expiry and never run out.
///
/// ```
/// assert!(lease_nats::check_server_version("2.15.1").is_ok());
/// assert!(lease_nats::check_server_version("2.11.0-RC.1").is_ok());
/// let err = lease_nats::check_server_version("2.9.25").unwrap_err();
/// assert!(err.to_string().contains("2.11"));
/// ```
///
/// # Errors
/// [`Error::Backend`] naming the version found and the version needed.
pub fn check_server_version(version: &str) -> Result<(), Error> {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().ok());
    let found = match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => {
            return Err(refused(format!(
                "cannot read the nats-server version {version:?}; lease-nats needs nats-server >= {}.{} (per-message TTLs)",
                MIN_SERVER_VERSION.0, MIN_SERVER_VERSION.1
            )))
        }
    };
    if found < MIN_SERVER_VERSION {
        return Err(refused(format!(
            "nats-server {version} is too old: lease-nats needs nats-server >= {}.{} for per-message TTLs (Nats-TTL); on older servers a lease would never expire",
            MIN_SERVER_VERSION.0, MIN_SERVER_VERSION.1
        )));
    }
    Ok(())
}

/// Opens the bucket (creating it when missing, if asked to) and checks that it
/// can hold leases safely. Returns it with its stream's last sequence.
async fn open_bucket(js: &Context, config: &NatsConfig) -> Result<(kv::Store, u64), Error> {
    let bucket = config.bucket.as_str();
    let stream_name = format!("KV_{bucket}");
    let exists = match js.get_stream(stream_name.as_str()).await {
        Ok(_) => true,
        Err(e) if stream_not_found(&e) => false,
        Err(e) => {
            return Err(Error::unavailable(
                format!("cannot read NATS KV bucket {bucket:?}"),
                e,
            ))
        }
    };
    if !exists && !config.create_bucket {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} does not exist. Its stream sequence is the leases' fence \
             counter: a bucket made afresh counts from 1 again, so it is not created unless \
             asked for (NatsConfig::create_bucket). Create it that way for a first deployment; \
             if it existed before and was deleted, fences from a new one can repeat old ones"
        )));
    }
    let store = if exists {
        js.get_key_value(bucket)
            .await
            .map_err(|e| Error::unavailable(format!("cannot open NATS KV bucket {bucket:?}"), e))?
    } else {
        let kv_config = kv::Config {
            bucket: bucket.to_owned(),
            description: "lease-nats: leases with fencing tokens".into(),
            history: 1,
            // Memory storage restarts the sequence, hence the fences, with
            // the server.
            storage: StorageType::File,
            num_replicas: config.replicas,
            // Allows per-message TTLs and makes the server leave a delete
            // marker (kept this long) when a grant expires: expiry becomes an
            // event watchers see.
            limit_markers: Some(config.marker_ttl),
            ..Default::default()
        };
        match js.create_key_value(kv_config).await {
            Ok(store) => store,
            // Another client may have created it in between.
            Err(create_err) => js.get_key_value(bucket).await.map_err(|_| {
                Error::unavailable(
                    format!("cannot create NATS KV bucket {bucket:?}"),
                    create_err,
                )
            })?,
        }
    };
    let info = store.stream.cached_info();
    let sc = &info.config;
    if !sc.allow_message_ttl {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} does not allow per-message TTLs: leases in it would never expire. Use a new bucket (lease-nats creates it with message TTLs and delete markers) or update the stream with allow_msg_ttl"
        )));
    }
    if sc.subject_delete_marker_ttl.is_none() {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} has no subject delete markers: an expired lease would vanish without an event, so watchers would never see it. Use a bucket created by lease-nats (or set subject_delete_marker_ttl)"
        )));
    }
    if !sc.max_age.is_zero() {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} has max_age {:?}: the server would drop a lease before its TTL. Use a bucket without max_age",
            sc.max_age
        )));
    }
    if sc.storage == StorageType::Memory {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} keeps its messages in memory: its stream sequence, the \
             leases' fence counter, starts again from 1 when the server restarts, so fences \
             would repeat. Use a bucket with file storage"
        )));
    }
    Ok((store.clone(), info.state.last_sequence))
}

fn stream_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    use async_nats::jetstream::context::GetStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    matches!(e.kind(), GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// Where TLS is used, rustls needs a process-wide crypto provider when more
/// than one is compiled in (ring from async-nats, aws-lc-rs from other crates
/// of the same binary), and panics inside async-nats without one. Installing
/// ring only when none is installed keeps an application's own choice.
fn install_crypto_provider() {
    use async_nats::rustls::crypto::{ring, CryptoProvider};
    if CryptoProvider::get_default().is_none() {
        // Losing the race to another installer is fine: one is installed.
        let _ = ring::default_provider().install_default();
    }
}

fn connect_error(url: &str, e: async_nats::ConnectError) -> Error {
    use async_nats::ConnectErrorKind as K;
    match e.kind() {
        K::ServerParse | K::Authentication | K::AuthorizationViolation | K::Tls => {
            Error::Backend(Box::new(e) as BoxError)
        }
        _ => Error::unavailable(format!("cannot connect to NATS at {url}"), e),
    }
}

fn publish_error(key: &LeaseKey, e: PublishError) -> Error {
    match e.kind() {
        // Refused before sending.
        PublishErrorKind::MaxPayloadExceeded => Error::Backend(Box::new(e)),
        PublishErrorKind::Other => match js_error(&e) {
            // The server answered with a refusal: nothing was stored.
            Some(code) if code < 500 => Error::Backend(Box::new(e)),
            _ => Error::unavailable(format!("write of lease key {key}"), e),
        },
        // Timed out, connection lost, no responders (stream leader being
        // elected), too many acks pending: the outcome is unknown.
        _ => Error::unavailable(format!("write of lease key {key}"), e),
    }
}

pub(crate) fn read_error(key: &LeaseKey, e: LastRawMessageError) -> Error {
    match e.kind() {
        LastRawMessageErrorKind::InvalidSubject => Error::InvalidKey {
            key: key.to_string(),
            reason: "not a valid NATS subject token sequence",
        },
        LastRawMessageErrorKind::JetStream(js) if js.code() < 500 => Error::Backend(Box::new(e)),
        _ => Error::unavailable(format!("read of lease key {key}"), e),
    }
}

/// The JetStream API error behind `e`, if that is what it is.
fn js_source(e: &PublishError) -> Option<&async_nats::jetstream::Error> {
    std::error::Error::source(e)?.downcast_ref::<async_nats::jetstream::Error>()
}

/// The status code (HTTP-like) of the JetStream API error behind `e`.
fn js_error(e: &PublishError) -> Option<usize> {
    js_source(e).map(|js| js.code())
}

/// The JetStream error code (`err_code`) behind `e`.
pub(crate) fn js_error_code(e: &PublishError) -> Option<u64> {
    js_source(e).map(|js| js.error_code().0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_gate() {
        assert!(check_server_version("2.11.0").is_ok());
        assert!(check_server_version("v2.12.3").is_ok());
        assert!(check_server_version("3.0.0").is_ok());
        for old in ["2.10.22", "2.9.0", "1.4.1", "", "garbage"] {
            let e = check_server_version(old).unwrap_err();
            assert!(e.to_string().contains(">= 2.11"), "{e}");
        }
    }

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
