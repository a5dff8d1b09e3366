//! The keyed lease: [`MongoBackend`], one document per key, judged on `$$NOW`.

use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Exclusion, Fence,
    FenceScope, Grant, HolderId, Holding, LastBreak, LeaseBackend, LeaseKey, LeaseState, Payload,
    Renewal, TimeAuthority, TtlRule, Version, MAX_PAYLOAD_LEN,
};
use mongodb::bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use mongodb::options::{
    Acknowledgment, CollectionOptions, ReadConcern, ReadPreference, ReturnDocument,
    SelectionCriteria, WriteConcern,
};
use mongodb::{Client, Collection, IndexModel};

use crate::config::{check_request_timeout, MongoConfig};
use crate::errors::{is_duplicate_key, map};
use crate::record::{
    field, inserting, schema_filter, well_formed, Record, MAX_FENCE, MAX_TTL_MS, MIN_TTL_MS, SCHEMA,
};

/// Accepted TTLs: whole milliseconds (the resolution of `$$NOW`), 1 s to 1 day.
///
/// The floor is a second, not a millisecond: a holder may write only for 2/3
/// of the TTL counted from before its request was sent, so a TTL near one
/// round trip (plus a scheduling pause) would hand out grants that expire
/// before their answer arrives — exclusion on paper, no usable write window.
// The same limits a stored record's `ttl_ms` is checked against.
const TTL_RULE: TtlRule = TtlRule::new(
    Duration::from_millis(MIN_TTL_MS.unsigned_abs())
        ..=Duration::from_millis(MAX_TTL_MS.unsigned_abs()),
)
.rounded_to(Duration::from_millis(1));

const CAPABILITIES: Capabilities = Capabilities::new(TimeAuthority::BackendClock, TTL_RULE)
    // No change streams: they need a replica set, and the test server has none.
    .with_watch(false)
    .with_exclusion(Exclusion::Atomic)
    .with_fence_scope(FenceScope::PerKey)
    .with_max_payload(MAX_PAYLOAD_LEN);

/// How many times one operation re-reads a key that changed under it, and
/// tries again, before it gives up with [`Error::Unavailable`]. Each retry
/// means another writer won a race in between (another client; for an acquire, an upsert race lost with E11000: the lease document is never deleted, so once the racing insert landed the next attempt matches it), and
/// the next attempt normally sees the winner and answers from it, so two
/// suffice under ordinary contention; the same value in every backend of
/// the workspace.
pub(crate) const CONTENTION_ATTEMPTS: usize = 4;

/// Name of the index this crate creates on the lease collection.
const EXPIRY_INDEX: &str = "lease_expires_ms";

/// Runs one operation within `timeout`; past it, the outcome is unknown.
pub(crate) async fn bounded<T>(
    op: &'static str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::Unavailable {
            detail: format!(
                "lease-mongo: {op} got no answer within the request timeout of {timeout:?}; it may have been applied"
            ),
            source: None,
        }),
    }
}

/// The MongoDB lease backend. See the crate docs.
///
/// Cheap to clone; clones share the driver's connection pool.
#[derive(Clone, Debug)]
pub struct MongoBackend {
    pub(crate) coll: Collection<Document>,
    pub(crate) config: MongoConfig,
}

impl MongoBackend {
    /// A backend on `client`, after checking the collection: its indexes are
    /// created if missing, and a TTL index on it is refused.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`] for a default TTL over 1 day;
    /// [`Error::InvalidTiming`] for a zero or over-an-hour request timeout;
    /// [`Error::Backend`] when the collection has a TTL index (it would delete
    /// lease documents and with them the fence counter, letting fences go
    /// backwards); [`Error::Unavailable`] when the server cannot be reached
    /// within the request timeout.
    pub async fn new(client: Client, config: MongoConfig) -> Result<Self, Error> {
        CAPABILITIES.ttl.effective(config.default_ttl)?;
        check_request_timeout(config.request_timeout)?;
        let coll = client
            .database(&config.database)
            .collection_with_options::<Document>(
                &config.collection,
                durable(config.request_timeout),
            );
        bounded(
            "checking the lease collection's indexes",
            config.request_timeout,
            ensure_indexes(&coll),
        )
        .await?;
        Ok(MongoBackend { coll, config })
    }

    /// Connects to `uri` (a `mongodb://` connection string) and calls [`new`](Self::new).
    ///
    /// Server selection waits at most the request timeout (unless the URI
    /// sets `serverSelectionTimeoutMS`), and when every host named in the URI
    /// has refused or failed its first check, this fails at once with the
    /// driver's reason (a refused connection, an unknown host, a TLS
    /// failure) instead of waiting for the timeout.
    ///
    /// # Errors
    /// As [`new`](Self::new); a malformed URI is [`Error::Backend`].
    pub async fn connect(uri: &str, config: MongoConfig) -> Result<Self, Error> {
        check_request_timeout(config.request_timeout)?;
        let timeout = config.request_timeout;
        crate::probe::connect(uri, timeout, |client| Self::new(client, config)).await
    }

    /// As [`connect`](Self::connect), with options already parsed (by
    /// [`ClientOptions::parse`](mongodb::options::ClientOptions::parse), say,
    /// to read the URI's database first).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub async fn connect_with_options(
        options: mongodb::options::ClientOptions,
        config: MongoConfig,
    ) -> Result<Self, Error> {
        check_request_timeout(config.request_timeout)?;
        let timeout = config.request_timeout;
        crate::probe::connect_with(options, timeout, |client| Self::new(client, config)).await
    }

    /// Ends the driver's server sessions and closes its connections, while the
    /// async runtime still runs.
    ///
    /// Call it before the tokio runtime that used this backend shuts down
    /// (the end of `main`, of a `#[tokio::test]`). Without it, the driver's
    /// own clean-up of a dropped client is a task spawned at drop time; when
    /// the runtime is tearing down its tasks at that moment, that task can
    /// panic inside the driver (a harmless but alarming backtrace on stderr).
    ///
    /// It shuts down the [`Client`] this backend was built on, and with it
    /// every clone of that client: use it when the client is no longer
    /// needed. Held leases are not released; they expire by their TTL.
    /// Operations after it fail with [`Error::Unavailable`].
    pub async fn shutdown(&self) {
        self.coll.client().clone().shutdown().immediate(true).await;
    }

    /// An acquire request for `key` by `holder` with the configured default TTL.
    pub fn request(&self, key: LeaseKey, holder: HolderId) -> AcquireRequest {
        AcquireRequest::new(key, holder).ttl(self.config.default_ttl)
    }

    /// The configuration in force.
    pub fn config(&self) -> &MongoConfig {
        &self.config
    }

    /// The lease collection (for inspection and administration; writing to it
    /// by hand can break the contract).
    pub fn collection(&self) -> &Collection<Document> {
        &self.coll
    }

    async fn acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        // Taken before anything is sent: the grant's deadline counts from here.
        let sent = Instant::now();
        let ttl = CAPABILITIES.ttl.effective(req.ttl)?;
        let ttl_ms = millis(ttl);
        let filter = schema_filter(&req.key);
        let pipeline = acquire_pipeline(&req.holder, ttl_ms, &req.payload);
        let mut lost_race = false;
        for _ in 0..CONTENTION_ATTEMPTS {
            let answer = self
                .coll
                .find_one_and_update(filter.clone(), pipeline.clone())
                .upsert(true)
                .return_document(ReturnDocument::After)
                .await;
            match answer {
                Ok(Some(doc)) => return judge_acquire(req, ttl, sent, &doc),
                // An upsert asking for the new document always gets one from
                // MongoDB; SecantusDB answers null now and then when upserts
                // race. Whether ours was applied is unknown, and re-running it
                // is safe either way (the same holder gets the same grant back).
                Ok(None) => lost_race = true,
                // Two upserts of a new key raced and the other inserted first
                // (contention, not failure): the next attempt sees its document.
                // A second duplicate key in a row means the document at the key
                // does not match our schema filter: look at it to say why.
                Err(e) if is_duplicate_key(&e) && !lost_race => lost_race = true,
                Err(e) if is_duplicate_key(&e) => {
                    match self
                        .coll
                        .find_one(doc! { field::ID: req.key.as_str() })
                        .await
                    {
                        Ok(Some(doc)) => {
                            Record::parse(&req.key, &doc)?;
                        }
                        Ok(None) => {}
                        Err(e) => return Err(map("acquire: reading the contended key", e)),
                    }
                }
                Err(e) => return Err(map("acquire", e)),
            }
        }
        Err(Error::Unavailable {
            detail: format!(
                "lease-mongo: acquire of {} kept losing upsert races; something deletes lease documents",
                req.key
            ),
            source: None,
        })
    }

    async fn renew_grant(&self, grant: &Grant, payload: Option<Payload>) -> Result<Renewal, Error> {
        let sent = Instant::now();
        // The pipeline checks that the document is a well-formed record and
        // leaves it untouched otherwise.
        let filter = doc! {
            field::ID: grant.key().as_str(),
            field::HOLDER: grant.holder().as_str(),
            field::FENCE: fence_i64(grant.fence())?,
        };
        let answer = self
            .coll
            .find_one_and_update(filter, renew_pipeline(payload.as_ref()))
            .return_document(ReturnDocument::After)
            .await
            .map_err(|e| map("renew", e))?;
        let Some(doc) = answer else {
            // Released, taken over (a new fence or a new holder) — or the
            // document is no longer a lease record at all, which the contract
            // reports as corrupt rather than as a quiet loss. Only this rare
            // path pays a second request; if it fails, the grant is still
            // known to be gone.
            return match self
                .coll
                .find_one(doc! { field::ID: grant.key().as_str() })
                .await
            {
                Ok(Some(d)) => Record::parse(grant.key(), &d).map(|_| Renewal::Lost),
                _ => Ok(Renewal::Lost),
            };
        };
        let rec = Record::parse(grant.key(), &doc)?;
        match rec.live_holder(rec.at_ms) {
            Some(h) if h == grant.holder() && rec.fence() == grant.fence() => {
                Ok(Renewal::Renewed(grant.renewed(sent, version(rec.fence()))))
            }
            // Expired on the server's clock before this renew arrived.
            _ => Ok(Renewal::Lost),
        }
    }

    async fn release_grant(&self, grant: &Grant) -> Result<(), Error> {
        // Matching (holder, fence) touches only this grant: a new holder has a
        // new fence (or is someone else), so releasing a lost grant is a no-op.
        // The document stays, keeping the fence counter.
        // A malformed record is never touched, even one naming (holder, fence).
        let filter = doc! {
            field::ID: grant.key().as_str(),
            field::HOLDER: grant.holder().as_str(),
            field::FENCE: fence_i64(grant.fence())?,
            "$expr": well_formed(),
        };
        let update = doc! { "$set": { field::HOLDER: Bson::Null, field::PAYLOAD: binary(&[]) } };
        self.coll
            .update_one(filter, update)
            .await
            .map_err(|e| map("release", e))?;
        Ok(())
    }

    pub(crate) async fn read_key(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        // An aggregation, not a find: it returns the server's clock beside the
        // document in the same round trip, and it cannot write.
        let pipeline = vec![
            doc! { "$match": { field::ID: key.as_str() } },
            doc! { "$addFields": { NOW: now_ms() } },
        ];
        let mut cursor = self
            .coll
            .aggregate(pipeline)
            .await
            .map_err(|e| map("read", e))?;
        if !cursor.advance().await.map_err(|e| map("read", e))? {
            return Ok(LeaseState::Free);
        }
        let doc: Document = cursor
            .deserialize_current()
            .map_err(|e| map("read: decoding the document", e))?;
        let rec = Record::parse(key, &doc)?;
        let now = match doc.get(NOW).and_then(crate::record::as_i64) {
            Some(now) => now,
            None => {
                return Err(Error::Backend(
                    "lease-mongo: the server did not evaluate $$NOW in a read".into(),
                ))
            }
        };
        Ok(match rec.live_holder(now) {
            Some(h) => LeaseState::Held(
                Holding::new(h.clone(), rec.fence(), rec.ttl, rec.payload.clone())
                    .with_remaining(Some(rec.remaining(now))),
            ),
            None => LeaseState::Free,
        })
    }
}

impl LeaseBackend for MongoBackend {
    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(bounded(
            "acquire",
            self.config.request_timeout,
            self.acquire(req),
        ))
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(bounded(
            "renew",
            self.config.request_timeout,
            self.renew_grant(grant, payload),
        ))
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(bounded(
            "release",
            self.config.request_timeout,
            self.release_grant(grant),
        ))
    }

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(bounded(
            "break",
            self.config.request_timeout,
            self.break_key(key, note),
        ))
    }

    /// The lease document's `last_break` stamp, which acquire, renew and
    /// release leave alone (one `find`); the newest audit record of the key
    /// only when the document carries none. A malformed stamp or record is
    /// [`Error::CorruptRecord`], and stays as it is.
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(bounded(
            "last_break",
            self.config.request_timeout,
            self.read_last_break(key),
        ))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(bounded(
            "read",
            self.config.request_timeout,
            self.read_key(key),
        ))
    }
}

/// Reads the after-image of an acquire: ours, someone else's, or corrupt.
fn judge_acquire(
    req: AcquireRequest,
    ttl: Duration,
    sent: Instant,
    doc: &Document,
) -> Result<Acquire, Error> {
    let rec = Record::parse(&req.key, doc)?;
    // `at_ms` is this very update's `$$NOW`: the pipeline always stamps a
    // well-formed document, so liveness is judged on the server's clock.
    match rec.live_holder(rec.at_ms) {
        Some(h) if *h == req.holder => {
            let fence = rec.fence();
            Ok(Acquire::Granted(Grant::new(
                req.key,
                req.holder,
                fence,
                ttl,
                sent,
                version(fence),
            )))
        }
        Some(h) => Ok(Acquire::Held(
            Holding::new(h.clone(), rec.fence(), rec.ttl, rec.payload.clone())
                .with_remaining(Some(rec.remaining(rec.at_ms))),
        )),
        None => Err(Error::Backend(
            format!(
                "lease-mongo: the server left {} free after an acquire that should have taken it",
                req.key
            )
            .into(),
        )),
    }
}

/// How every lease collection is used, whatever the connection string says:
///
/// * writes wait for a majority **and the journal**: an acknowledged grant
///   (and its fence) must survive a crash and a failover, or a restarted
///   server could hand the same fence out again. With `w: 1` and no journal
///   wait, MongoDB acknowledges before the journal is flushed (and the test
///   server was seen to lose acknowledged fences on `kill -9`);
/// * reads see only majority-committed data, so a read never reports a
///   grant that a failover may roll back;
/// * everything goes to the primary, never to a lagging secondary.
///
/// `timeout` is the server's `wtimeout`: a write that a majority does not
/// acknowledge in time ends with a write concern error (an unknown outcome).
pub(crate) fn durable(timeout: Duration) -> CollectionOptions {
    CollectionOptions::builder()
        .write_concern(
            WriteConcern::builder()
                .w(Acknowledgment::Majority)
                .journal(true)
                .w_timeout(timeout)
                .build(),
        )
        .read_concern(ReadConcern::majority())
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        .build()
}

/// Creates the collection's index if missing, and refuses a TTL index.
async fn ensure_indexes(coll: &Collection<Document>) -> Result<(), Error> {
    let mut have_expiry = false;
    match coll.list_indexes().await {
        Ok(mut cursor) => {
            while cursor
                .advance()
                .await
                .map_err(|e| map("listing indexes", e))?
            {
                let index: IndexModel = cursor
                    .deserialize_current()
                    .map_err(|e| map("listing indexes", e))?;
                let options = index.options.unwrap_or_default();
                if options.expire_after.is_some() {
                    return Err(Error::Backend(
                        format!(
                            "lease-mongo: collection {} has a TTL index ({}); it would delete lease documents and with them the fence counter, so fences could go backwards. Drop it.",
                            coll.name(),
                            options.name.unwrap_or_default()
                        )
                        .into(),
                    ));
                }
                have_expiry |= options.name.as_deref() == Some(EXPIRY_INDEX);
            }
        }
        // NamespaceNotFound: the collection does not exist yet.
        Err(e) if matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == 26) =>
            {}
        Err(e) => return Err(map("listing indexes", e)),
    }
    if !have_expiry {
        // For operators' queries ("which leases expire next"); never a TTL index.
        let options = mongodb::options::IndexOptions::builder()
            .name(EXPIRY_INDEX.to_string())
            .build();
        let model = IndexModel::builder()
            .keys(doc! { field::EXPIRES_MS: 1 })
            .options(options)
            .build();
        coll.create_index(model)
            .await
            .map_err(|e| map("creating the expiry index", e))?;
    }
    Ok(())
}

/// Temporary fields of the update pipelines (removed before the write lands).
const NOW: &str = "_lease_now";
const FRESH: &str = "_lease_fresh";
const OK: &str = "_lease_ok";
const OURS: &str = "_lease_ours";
const NEW: &str = "_lease_new";
const GRANT: &str = "_lease_grant";
const LIVE: &str = "_lease_live";
const NEXT: &str = "_lease_next";
const WRITE: &str = "_lease_write";

/// The server's clock as milliseconds since the epoch.
///
/// Every time comparison in this crate is on these numbers, computed inside
/// the pipeline, never on dates: it is correct on MongoDB, and it sidesteps a
/// bug of SecantusDB (the wire-compatible test server), whose comparisons of
/// dates against `$$NOW` inside `$expr` match nothing. For the same reason no
/// query *filter* mentions the time: liveness is decided inside the update
/// pipeline and read back from the returned document.
fn now_ms() -> Document {
    doc! { "$toLong": "$$NOW" }
}

fn var(name: &str) -> String {
    format!("${name}")
}

/// `{$cond: [flag, then, $field]}`: set `field` to `then` where `flag` holds,
/// otherwise keep it as it is.
fn set_if(flag: &str, then: impl Into<Bson>, keep: &str) -> Document {
    doc! { "$cond": [ var(flag), then.into(), var(keep) ] }
}

/// The acquire update: one `findAndModify`, judged entirely on the server.
///
/// Takes the key when the document is new, released, expired, or already
/// ours; a new grant raises the fence in the same write. A document that
/// is not a well-formed record is left exactly as it is (the caller then
/// reports it as corrupt). `at_ms` is stamped with this update's `$$NOW` so
/// that the caller can judge the returned document on the server's clock.
fn acquire_pipeline(holder: &HolderId, ttl_ms: i64, payload: &Payload) -> Vec<Document> {
    let me = doc! { "$literal": holder.as_str() };
    vec![
        doc! { "$set": {
            NOW: now_ms(),
            // The upsert's filter seeds no field but `_id`: a document with
            // neither schema marker is the one being inserted.
            FRESH: inserting(),
            OK: well_formed(),
        } },
        doc! { "$set": {
            // Computed only on a record whose fence is known to be an integer.
            NEXT: { "$cond": [
                { "$or": [ var(OK), var(FRESH) ] },
                next_fence(),
                Bson::Null,
            ] },
            OURS: { "$and": [
                var(OK),
                { "$eq": [ var(field::HOLDER), me.clone() ] },
                { "$gt": [ var(field::EXPIRES_MS), var(NOW) ] },
            ] },
        } },
        doc! { "$set": {
            NEW: { "$and": [
                { "$not": [ var(OURS) ] },
                { "$or": [
                    var(FRESH),
                    { "$and": [
                        var(OK),
                        { "$or": [
                            { "$eq": [ { "$type": var(field::HOLDER) }, "null" ] },
                            { "$lte": [ var(field::EXPIRES_MS), var(NOW) ] },
                        ] },
                    ] },
                ] },
                { "$lte": [ var(NEXT), MAX_FENCE ] },
            ] },
        } },
        doc! { "$set": { GRANT: { "$or": [ var(OURS), var(NEW) ] }, WRITE: { "$or": [ var(OK), var(FRESH) ] } } },
        doc! { "$set": {
            // Written on every record this acquire writes (a legacy record
            // gains it; its `v` stays for the versions that still read it).
            field::SCHEMA: set_if(WRITE, SCHEMA, field::SCHEMA),
            // The fence rises in the same write that grants; a re-acquire
            // of our own live grant keeps it.
            field::FENCE: set_if(NEW, var(NEXT), field::FENCE),
            field::HOLDER: set_if(GRANT, me, field::HOLDER),
            field::TTL_MS: set_if(GRANT, ttl_ms, field::TTL_MS),
            // Extended from this request even when it was already ours: the
            // grant's deadline is counted from this request's send instant.
            field::EXPIRES_MS: set_if(GRANT, doc! { "$add": [ var(NOW), ttl_ms ] }, field::EXPIRES_MS),
            field::PAYLOAD: set_if(GRANT, doc! { "$literal": binary(payload.as_bytes()) }, field::PAYLOAD),
            field::AT_MS: set_if(WRITE, var(NOW), field::AT_MS),
        } },
        doc! { "$unset": [ NOW, FRESH, OK, OURS, NEW, GRANT, NEXT, WRITE ] },
    ]
}

/// The fence of a new grant: one above the record's, and at least the
/// server's clock in milliseconds × [`FENCES_PER_MS`].
///
/// The clock term is what keeps fences rising when the record is gone or
/// rewound behind this library's back (a `deleteOne`, a `deleteMany`
/// cleanup, a dropped collection, a `mongorestore` of an older dump): every
/// fence handed out at server time `t` ms is below `(t + 1) × 1000` as long
/// as fewer than 1000 grants of one key fall in one millisecond (each is a
/// majority, journaled write), so a grant on a new or rewound document at a
/// later millisecond is above all of them. It assumes the server's clock
/// does not step back, and moves on by a millisecond between the last grant
/// before such an outside change and the first grant after it.
fn next_fence() -> Document {
    doc! { "$max": [
        { "$add": [ { "$ifNull": [ var(field::FENCE), 0_i64 ] }, 1_i64 ] },
        clock_fence(),
    ] }
}

/// How many fences fit in one millisecond of the server's clock.
pub(crate) const FENCES_PER_MS: i64 = 1000;

/// `$$NOW` in milliseconds × [`FENCES_PER_MS`]: a floor no earlier grant's
/// fence reached.
pub(crate) fn clock_fence() -> Document {
    doc! { "$multiply": [ now_ms(), FENCES_PER_MS ] }
}

/// The renew update, applied only to the document still naming (holder,
/// fence) — the filter — and extending it only while live on `$$NOW`.
/// `at_ms` is stamped even when expired, so the caller can tell the two apart.
fn renew_pipeline(payload: Option<&Payload>) -> Vec<Document> {
    let mut set = doc! {
        field::EXPIRES_MS: set_if(LIVE, doc! { "$add": [ var(NOW), var(field::TTL_MS) ] }, field::EXPIRES_MS),
        field::AT_MS: set_if(OK, var(NOW), field::AT_MS),
    };
    if let Some(p) = payload {
        set.insert(
            field::PAYLOAD,
            set_if(
                LIVE,
                doc! { "$literal": binary(p.as_bytes()) },
                field::PAYLOAD,
            ),
        );
    }
    vec![
        doc! { "$set": { NOW: now_ms(), OK: well_formed() } },
        doc! { "$set": { LIVE: { "$and": [ var(OK), { "$gt": [ var(field::EXPIRES_MS), var(NOW) ] } ] } } },
        doc! { "$set": set },
        doc! { "$unset": [ NOW, OK, LIVE ] },
    ]
}

pub(crate) fn binary(bytes: &[u8]) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes: bytes.to_vec(),
    }
}

/// Whole milliseconds of an effective TTL (at most a day, so it fits).
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn fence_i64(f: Fence) -> Result<i64, Error> {
    i64::try_from(f.get()).map_err(|_| {
        Error::Backend(format!("lease-mongo: fence {f} does not fit the stored integer").into())
    })
}

fn version(fence: Fence) -> Version {
    Version::new(fence.get().to_string())
}
