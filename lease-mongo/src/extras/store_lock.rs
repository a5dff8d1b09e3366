//! A writer/fsck store lock: many shared *writer* leases against one exclusive
//! *fsck* lease, with an insert-then-check handshake on the server's clock.
//!
//! A writer first inserts its own registration and only then looks for the
//! fsck singleton; fsck does the opposite half of the handshake, installing
//! the singleton first and then draining fresh writer registrations. Whatever
//! the interleaving, one of the two sees the other: a writer that inserted
//! before fsck looked is drained (fsck waits for it), and a writer that
//! inserted after sees the singleton and backs out. So a writer and fsck are
//! never both active.
//!
//! Liveness is a heartbeat stamped with MongoDB's `$$NOW` (as milliseconds)
//! and judged on the server: a registration is *stale* when its heartbeat is
//! older than [`StoreLockTiming::stale_after`]. Stale is not dead: the protocol
//! never assumes an owner died on its own. A stale fsck lease still blocks
//! writers and stale writer residue still blocks fsck, until an administrator
//! asserts otherwise with `force` or [`StoreLeases::clear_stale_lock`].
//!
//! One exception, safe by construction: a writer registration is inserted
//! `pending` and confirmed only at the end of a successful
//! [`StoreLeases::acquire_writer`], by an update that must still find it
//! pending. A registration left pending — its insert's answer was lost and
//! the best-effort removal failed too — belongs to a writer that never got a
//! [`WriterLease`]; once stale, fsck removes it without `force`, and should
//! that writer still try to confirm, it finds nothing and backs out.
//!
//! Every request is bounded by [`StoreLockTiming::request_timeout`]; one that
//! gets no answer in time is an unknown outcome
//! ([`lease_core::Error::Unavailable`]).
//!
//! Layout: one collection (default `store_leases`) holding
//!
//! ```text
//! { _id: "writer:<identifier>", kind: "writer", identifier, owner, heartbeat_ms, checked_ms,
//!   pending: true }                // only until the acquisition succeeded
//! { _id: "fsck",                kind: "fsck",   identifier, owner, heartbeat_ms, checked_ms }
//! { _id: "generation",          kind: "generation", generation }   // never deleted
//! ```
//!
//! The layout generation is bumped by every fsck once it has drained the
//! writers; a writer records the generation it saw at acquisition
//! ([`WriterLease::generation`]), so it can tell that an fsck ran since.
//!
//! # How it relates to the lease contract
//!
//! This is a product of its own beside [`MongoBackend`](crate::MongoBackend),
//! not an implementation of [`lease_core::LeaseBackend`]: its leases are
//! shared (many writers) or exclusive (one fsck) per store rather than one
//! holder per key, they carry no fencing token, and the conformance suite
//! does not check them. It shares the crate's error mapping and request
//! bounds, and the server's clock as the time authority. Use
//! [`MongoBackend`](crate::MongoBackend) when you need keyed, fenced leases.
//!
//! `lease-keeper`'s shared and exclusive leases (`Keeper::acquire_shared`,
//! `Keeper::acquire_exclusive`) are the general form of this protocol: the
//! same register-then-check handshake, built on the lease contract so that
//! they run on every backend, MongoDB included, with fences where this lock
//! has a layout generation (a shared holder's fence is its phase's; an
//! exclusive grant's is above it). The two do not see each other: a store
//! guarded by this lock keeps using it; new code that wants fenced shared
//! leases uses the keeper's.

use std::fmt;
use std::future::IntoFuture;
use std::ops::Deref;
use std::time::{Duration, Instant};

use lease_core::HolderId;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::{Collection, Database, IndexModel};

use crate::errors::{is_duplicate_key, map};
use crate::record::as_i64;

/// Default collection of the store leases.
pub const DEFAULT_COLLECTION: &str = "store_leases";

const FSCK_ID: &str = "fsck";
const GENERATION_ID: &str = "generation";
const KIND_INDEX: &str = "store_lease_kind";
/// Marks a writer registration whose acquisition has not succeeded (yet).
const PENDING: &str = "pending";

/// Server-clock lease timings of the writer/fsck protocol.
///
/// Start from [`StoreLockTiming::default`] and change what you need with the
/// setters; it may gain fields, so it cannot be written as a struct literal.
///
/// ```
/// use std::time::Duration;
/// use lease_mongo::store_lock::StoreLockTiming;
/// let t = StoreLockTiming::default()
///     .refresh_interval(Duration::from_secs(1))
///     .drain_timeout(Some(Duration::from_secs(30)));
/// assert_eq!(t.stale_after(), Duration::from_secs(4));
/// assert!(t.validate().is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreLockTiming {
    /// Maximum normal interval between heartbeats (default 2 s). Owners must
    /// call `refresh_heartbeat` at least this often.
    pub refresh_interval: Duration,
    /// Number of refresh intervals after which a heartbeat is stale (default 4).
    pub stale_multiplier: u32,
    /// First sleep of fsck's writer drain (default 20 ms).
    pub poll_initial: Duration,
    /// Longest sleep of fsck's writer drain; sleeps double up to it (default 250 ms).
    pub poll_max: Duration,
    /// How long fsck waits for fresh writers to finish before backing out with
    /// [`StoreLockedError`]; `None` (the default) waits as long as they stay
    /// fresh. Prefer this to cancelling [`StoreLeases::acquire_fsck`] from
    /// outside: a cancelled drain leaves the singleton installed, blocking
    /// writers until it goes stale and is cleared.
    pub drain_timeout: Option<Duration>,
    /// How long one request to the server may take before its outcome is
    /// reported unknown (default 5 s; also the server's `wtimeout` for the
    /// majority write concern). Keep it below `refresh_interval`.
    pub request_timeout: Duration,
}

impl Default for StoreLockTiming {
    fn default() -> Self {
        StoreLockTiming {
            refresh_interval: Duration::from_secs(2),
            stale_multiplier: 4,
            poll_initial: Duration::from_millis(20),
            poll_max: Duration::from_millis(250),
            drain_timeout: None,
            request_timeout: crate::DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

impl StoreLockTiming {
    /// Sets [`refresh_interval`](Self::refresh_interval).
    pub fn refresh_interval(mut self, interval: Duration) -> Self {
        self.refresh_interval = interval;
        self
    }

    /// Sets [`stale_multiplier`](Self::stale_multiplier).
    pub fn stale_multiplier(mut self, multiplier: u32) -> Self {
        self.stale_multiplier = multiplier;
        self
    }

    /// Sets the drain's first and longest sleep
    /// ([`poll_initial`](Self::poll_initial), [`poll_max`](Self::poll_max)).
    pub fn poll(mut self, initial: Duration, max: Duration) -> Self {
        self.poll_initial = initial;
        self.poll_max = max;
        self
    }

    /// Sets [`drain_timeout`](Self::drain_timeout).
    pub fn drain_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The age after which a heartbeat is stale: `refresh_interval × stale_multiplier`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lease_mongo::store_lock::StoreLockTiming;
    /// assert_eq!(StoreLockTiming::default().stale_after(), Duration::from_secs(8));
    /// ```
    pub fn stale_after(&self) -> Duration {
        self.refresh_interval.saturating_mul(self.stale_multiplier)
    }

    /// Checks that the timings can work.
    ///
    /// # Errors
    /// [`lease_core::Error::InvalidTiming`] unless `refresh_interval > 0`,
    /// `stale_multiplier ≥ 2` (one late heartbeat must not make an owner
    /// stale) and `0 < poll_initial ≤ poll_max`.
    pub fn validate(&self) -> Result<(), lease_core::Error> {
        let bad = |reason: String| Err(lease_core::Error::InvalidTiming { reason });
        if self.refresh_interval.is_zero() {
            return bad("refresh_interval must be positive".into());
        }
        if self.stale_multiplier < 2 {
            return bad(format!(
                "stale_multiplier {} must be at least 2: one late heartbeat must not make an owner stale",
                self.stale_multiplier
            ));
        }
        if self.request_timeout.is_zero() {
            return bad("request_timeout must be positive".into());
        }
        if self.poll_initial.is_zero() || self.poll_initial > self.poll_max {
            return bad(format!(
                "poll_initial {:?} must be positive and at most poll_max {:?}",
                self.poll_initial, self.poll_max
            ));
        }
        Ok(())
    }

    fn stale_ms(&self) -> i64 {
        i64::try_from(self.stale_after().as_millis()).unwrap_or(i64::MAX)
    }
}

/// An fsck lease or a live writer prevents the requested operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreLockedError {
    /// What is in the way.
    pub reason: String,
}

/// A lease owner tried to refresh after its lease was displaced (by a forced
/// fsck, [`StoreLeases::clear_stale_lock`], or its own heartbeat going stale).
///
/// A kind of [`StoreLockedError`]: [`StoreLeaseError::is_store_locked`]
/// is true for both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseLostError {
    /// The displaced lease's identifier.
    pub identifier: String,
    /// What happened to it.
    pub reason: String,
}

/// Everything the store-lease protocol can fail with.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreLeaseError {
    /// See [`StoreLockedError`].
    Locked(StoreLockedError),
    /// See [`LeaseLostError`].
    Lost(LeaseLostError),
    /// The server failed or is unreachable ([`lease_core::Error::Unavailable`]
    /// when the outcome is unknown), or the timings are invalid.
    Backend(lease_core::Error),
}

impl StoreLeaseError {
    /// Whether this is a [`StoreLockedError`] or a [`LeaseLostError`] (a
    /// kind of it).
    pub fn is_store_locked(&self) -> bool {
        matches!(self, StoreLeaseError::Locked(_) | StoreLeaseError::Lost(_))
    }

    /// Whether this is a [`LeaseLostError`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, StoreLeaseError::Lost(_))
    }

    fn locked(reason: impl Into<String>) -> Self {
        StoreLeaseError::Locked(StoreLockedError {
            reason: reason.into(),
        })
    }
}

impl fmt::Display for StoreLockedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store locked: {}", self.reason)
    }
}

impl fmt::Display for LeaseLostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store lease {} lost: {}", self.identifier, self.reason)
    }
}

impl fmt::Display for StoreLeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLeaseError::Locked(e) => e.fmt(f),
            StoreLeaseError::Lost(e) => e.fmt(f),
            StoreLeaseError::Backend(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for StoreLockedError {}
impl std::error::Error for LeaseLostError {}

impl std::error::Error for StoreLeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Each variant prints its inner error's own message, so the
            // chain continues with that error's cause, not the error again.
            StoreLeaseError::Locked(e) => e.source(),
            StoreLeaseError::Lost(e) => e.source(),
            StoreLeaseError::Backend(e) => e.source(),
        }
    }
}

impl From<lease_core::Error> for StoreLeaseError {
    fn from(e: lease_core::Error) -> Self {
        StoreLeaseError::Backend(e)
    }
}

fn backend(op: &'static str) -> impl FnOnce(mongodb::error::Error) -> StoreLeaseError {
    move |e| StoreLeaseError::Backend(map(op, e))
}

/// A request that gets no answer within `timeout` has an unknown outcome.
fn no_answer(op: &'static str, timeout: Duration) -> StoreLeaseError {
    StoreLeaseError::Backend(lease_core::Error::no_answer(
        format!("lease-mongo: {op}"),
        timeout,
    ))
}

/// Bounds one request to the server in time (see [`StoreLockTiming::request_timeout`]).
trait Timed: IntoFuture + Sized {
    /// The request's own result, or an unknown outcome after `timeout`.
    async fn timed(
        self,
        timeout: Duration,
        op: &'static str,
    ) -> Result<Self::Output, StoreLeaseError> {
        tokio::time::timeout(timeout, self.into_future())
            .await
            .map_err(|_| no_answer(op, timeout))
    }
}

impl<F: IntoFuture> Timed for F {}

/// Which protocol role a lease plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreLeaseKind {
    /// One of many shared writers.
    Writer,
    /// The exclusive fsck singleton.
    Fsck,
}

impl StoreLeaseKind {
    fn as_str(self) -> &'static str {
        match self {
            StoreLeaseKind::Writer => "writer",
            StoreLeaseKind::Fsck => "fsck",
        }
    }
}

/// The writer/fsck protocol on one collection. See the module docs.
#[derive(Clone, Debug)]
pub struct StoreLeases {
    coll: Collection<Document>,
    timing: StoreLockTiming,
}

/// Shared lease state and heartbeat operations for writer and fsck leases.
#[derive(Clone, Debug)]
pub struct StoreLease {
    coll: Collection<Document>,
    doc_id: String,
    identifier: String,
    owner: String,
    kind: StoreLeaseKind,
    timing: StoreLockTiming,
}

/// A writer registration plus the layout generation seen during acquisition.
#[derive(Clone, Debug)]
pub struct WriterLease {
    lease: StoreLease,
    generation: u64,
}

/// The singleton fsck exclusion lease, with the layout generation it set.
#[derive(Clone, Debug)]
pub struct FsckLease {
    lease: StoreLease,
    generation: u64,
}

impl WriterLease {
    /// The layout generation this writer observed at acquisition. An fsck
    /// that ran since has bumped it: compare with a later writer's.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl FsckLease {
    /// The layout generation this fsck installed (writers acquiring after it
    /// see this one, or a later one).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl Deref for WriterLease {
    type Target = StoreLease;
    fn deref(&self) -> &StoreLease {
        &self.lease
    }
}

impl Deref for FsckLease {
    type Target = StoreLease;
    fn deref(&self) -> &StoreLease {
        &self.lease
    }
}

/// `{$toLong: "$$NOW"}`: the server's clock in milliseconds. Ages are
/// computed as numbers inside pipelines, never by comparing dates with
/// `$$NOW` in a filter's `$expr` — that form matches nothing on SecantusDB,
/// the test server, and numbers are just as correct on MongoDB.
fn now_ms() -> Document {
    doc! { "$toLong": "$$NOW" }
}

/// A registration as seen by an aggregation, with its age on the server's clock.
struct Seen {
    id: Bson,
    identifier: String,
    owner: String,
    heartbeat_ms: Option<i64>,
    age_ms: Option<i64>,
    /// A writer registration whose acquisition never succeeded.
    pending: bool,
}

impl Seen {
    fn from_doc(d: &Document) -> Seen {
        Seen {
            id: d.get("_id").cloned().unwrap_or(Bson::Null),
            identifier: d.get_str("identifier").unwrap_or("?").to_string(),
            owner: d.get_str("owner").unwrap_or("?").to_string(),
            heartbeat_ms: d.get("heartbeat_ms").and_then(as_i64),
            age_ms: d.get("age_ms").and_then(as_i64),
            pending: d.get_bool(PENDING).unwrap_or(false),
        }
    }

    /// A registration with no readable heartbeat counts as stale: it cannot
    /// prove it is alive, and only an administrator may dismiss it.
    fn is_stale(&self, timing: &StoreLockTiming) -> bool {
        self.age_ms.is_none_or(|age| age > timing.stale_ms())
    }

    fn describe(&self) -> String {
        match self.age_ms {
            Some(age) => format!(
                "{} ({}, heartbeat {age} ms old)",
                self.owner, self.identifier
            ),
            None => format!("{} ({}, no heartbeat)", self.owner, self.identifier),
        }
    }
}

impl StoreLeases {
    /// The protocol on `database`'s [`DEFAULT_COLLECTION`]; creates its index
    /// if missing.
    ///
    /// # Errors
    /// Invalid timings ([`lease_core::Error::InvalidTiming`]) or a server failure.
    pub async fn new(
        database: &Database,
        timing: StoreLockTiming,
    ) -> Result<Self, StoreLeaseError> {
        Self::in_collection(database, DEFAULT_COLLECTION, timing).await
    }

    /// Connects to `uri` (a `mongodb://` connection string) and calls
    /// [`new`](Self::new) on database `database`.
    ///
    /// Like [`MongoBackend::connect`](crate::MongoBackend::connect): fails at
    /// once, with the driver's reason, when no host of the URI can be reached.
    ///
    /// # Errors
    /// As [`new`](Self::new); a malformed URI is a backend error.
    pub async fn connect(
        uri: &str,
        database: &str,
        timing: StoreLockTiming,
    ) -> Result<Self, StoreLeaseError> {
        timing.validate()?;
        crate::connect::connect(uri, timing.request_timeout, |client| async move {
            Self::new(&client.database(database), timing).await
        })
        .await
    }

    /// The protocol on a collection of your choice (give it to this protocol alone).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub async fn in_collection(
        database: &Database,
        collection: &str,
        timing: StoreLockTiming,
    ) -> Result<Self, StoreLeaseError> {
        timing.validate()?;
        // Majority + journal writes, majority reads, primary only: see `connect::durable`.
        let coll = database.collection_with_options::<Document>(
            collection,
            crate::connect::durable(timing.request_timeout),
        );
        let index = IndexModel::builder()
            .keys(doc! { "kind": 1 })
            .options(
                mongodb::options::IndexOptions::builder()
                    .name(KIND_INDEX.to_string())
                    .build(),
            )
            .build();
        // Idempotent on the server: an identical index already present is a no-op.
        coll.create_index(index)
            .timed(timing.request_timeout, "creating the store-lease index")
            .await?
            .map_err(backend("creating the store-lease index"))?;
        Ok(StoreLeases { coll, timing })
    }

    /// The timings in force.
    pub fn timing(&self) -> StoreLockTiming {
        self.timing
    }

    /// Inserts a writer lease, then checks for fsck and observes the layout
    /// generation.
    ///
    /// The ordering is the writer half of the insert-then-check handshake. A
    /// stale fsck lease intentionally still blocks writers: clearing it is an
    /// explicit administrative assertion that its owner is dead
    /// ([`clear_stale_lock`](Self::clear_stale_lock)).
    ///
    /// `owner` is a human-readable name for reports (host, pid, job).
    ///
    /// The registration is confirmed at the end (one more request), so that
    /// a registration left behind by a failed acquisition ages out on its own
    /// (see the module docs).
    ///
    /// # Errors
    /// [`StoreLockedError`] when an fsck lease (fresh or stale) exists; the
    /// writer's own registration is removed again first. An unknown outcome
    /// ([`lease_core::Error::Unavailable`]) after a best-effort removal of
    /// the registration.
    pub async fn acquire_writer(&self, owner: &str) -> Result<WriterLease, StoreLeaseError> {
        let identifier = HolderId::random().as_str().to_string();
        let lease = self.lease(
            StoreLeaseKind::Writer,
            format!("writer:{identifier}"),
            identifier,
            owner,
        );
        // 1. Insert ourselves, stamped with the server's clock and marked
        // unconfirmed until this acquisition has succeeded.
        let mut register = lease.stamp();
        if let Ok(set) = register.get_document_mut("$set") {
            set.insert(PENDING, true);
        }
        let inserted = match self
            .coll
            .update_one(doc! { "_id": &lease.doc_id }, vec![register])
            .upsert(true)
            .timed(self.timing.request_timeout, "registering a writer")
            .await
            .and_then(|r| r.map_err(backend("registering a writer")))
        {
            Ok(r) => r,
            Err(e) => return Err(lease.abandon(e).await),
        };
        // The whole handshake rests on this registration existing before the
        // fsck check: never proceed on an answer that does not prove it.
        if inserted.upserted_id.is_none() && inserted.matched_count == 0 {
            let found = self
                .coll
                .find_one(doc! { "_id": &lease.doc_id })
                .timed(
                    self.timing.request_timeout,
                    "confirming a writer registration",
                )
                .await
                .and_then(|r| r.map_err(backend("confirming a writer registration")));
            match found {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(StoreLeaseError::Backend(lease_core::Error::Unavailable {
                        detail:
                            "the server neither inserted nor matched this writer's registration"
                                .into(),
                        source: None,
                    }))
                }
                Err(e) => return Err(lease.abandon(e).await),
            }
        }
        // 2. Only then look for fsck, 3. and then read the generation: an fsck
        // that released between 2 and 3 bumped it before deleting its singleton.
        // 4. Confirm the registration: from here on it is a writer that may
        // be working, which only `force` may dismiss. An fsck that judged
        // it stale before that removed it, and then the confirmation finds
        // nothing and this writer backs out.
        let confirmed = async {
            let generation = self.check_fsck_then_generation().await?;
            let r = self
                .coll
                .update_one(
                    doc! { "_id": &lease.doc_id, "identifier": &lease.identifier, PENDING: true },
                    // Fresh again from here: an fsck whose removal of the
                    // unconfirmed registration loses this race re-reads it
                    // and waits for this writer.
                    vec![
                        doc! { "$set": { "heartbeat_ms": now_ms(), "checked_ms": now_ms() } },
                        doc! { "$unset": [ PENDING ] },
                    ],
                )
                .timed(self.timing.request_timeout, "confirming a writer registration")
                .await?
                .map_err(backend("confirming a writer registration"))?;
            if r.matched_count == 1 {
                Ok(generation)
            } else {
                Err(StoreLeaseError::locked(
                    "this writer's registration went stale before it was confirmed and was removed by fsck; try again",
                ))
            }
        }
        .await;
        match confirmed {
            Ok(generation) => Ok(WriterLease { lease, generation }),
            Err(e) => Err(lease.abandon(e).await),
        }
    }

    async fn check_fsck_then_generation(&self) -> Result<u64, StoreLeaseError> {
        let fsck = self
            .coll
            .find_one(doc! { "_id": FSCK_ID })
            .timed(self.timing.request_timeout, "looking for the fsck lease")
            .await?
            .map_err(backend("looking for the fsck lease"))?;
        if let Some(f) = fsck {
            let f = Seen::from_doc(&f);
            return Err(StoreLeaseError::locked(format!(
                "an fsck lease is held by {} ({}); a stale one still blocks writers until clear_stale_lock",
                f.owner, f.identifier
            )));
        }
        self.generation().await
    }

    /// The current layout generation (0 before any fsck ran).
    ///
    /// # Errors
    /// A server failure.
    pub async fn generation(&self) -> Result<u64, StoreLeaseError> {
        let g = self
            .coll
            .find_one(doc! { "_id": GENERATION_ID })
            .timed(self.timing.request_timeout, "reading the layout generation")
            .await?
            .map_err(backend("reading the layout generation"))?;
        Ok(g.as_ref()
            .and_then(|d| d.get("generation"))
            .and_then(as_i64)
            .and_then(|g| u64::try_from(g).ok())
            .unwrap_or(0))
    }

    /// Installs the fsck singleton and drains fresh writer registrations,
    /// then bumps the layout generation.
    ///
    /// Draining waits for the writer registrations present once the singleton
    /// is installed (later ones see it and back out by themselves), polling
    /// them with a backoff from
    /// [`poll_initial`](StoreLockTiming::poll_initial) doubling to
    /// [`poll_max`](StoreLockTiming::poll_max), refreshing the singleton's own
    /// heartbeat meanwhile, until no fresh writer is left (or
    /// [`drain_timeout`](StoreLockTiming::drain_timeout) passes).
    ///
    /// **`force`** may replace a pre-existing fsck lease and may proceed past
    /// stale writer residue (deleting it). It is an administrative assertion
    /// that those owners are dead; using it against a still-running owner can
    /// corrupt the store.
    ///
    /// # Errors
    /// [`StoreLockedError`] when another fsck lease exists (unless `force`),
    /// when stale writer residue is found (unless `force`), or when the drain
    /// times out; the singleton is removed again first.
    pub async fn acquire_fsck(
        &self,
        owner: &str,
        force: bool,
    ) -> Result<FsckLease, StoreLeaseError> {
        let identifier = HolderId::random().as_str().to_string();
        let lease = self.lease(StoreLeaseKind::Fsck, FSCK_ID.to_string(), identifier, owner);
        match self.install_fsck(&lease, force).await {
            Ok(()) => {}
            // Perhaps installed after all: remove it (by our identifier).
            Err(e @ StoreLeaseError::Backend(_)) => return Err(lease.abandon(e).await),
            Err(e) => return Err(e),
        }
        let drained = async {
            self.drain_writers(&lease, force).await?;
            self.bump_generation().await
        }
        .await;
        match drained {
            Ok(generation) => Ok(FsckLease { lease, generation }),
            Err(e) => Err(lease.abandon(e).await),
        }
    }

    async fn install_fsck(&self, lease: &StoreLease, force: bool) -> Result<(), StoreLeaseError> {
        // Without force the filter names our identifier, so an existing
        // singleton makes the upsert collide on `_id` (E11000): someone else
        // holds fsck. With force the filter matches any singleton and replaces it.
        let filter = if force {
            doc! { "_id": FSCK_ID }
        } else {
            doc! { "_id": FSCK_ID, "identifier": &lease.identifier }
        };
        for attempt in 0..2 {
            let installed = self
                .coll
                .update_one(filter.clone(), vec![lease.stamp()])
                .upsert(true)
                .await;
            match installed {
                // An insert, or (forced) a replacement: ours.
                Ok(r) if r.upserted_id.is_some() || r.matched_count == 1 => return Ok(()),
                // Neither inserted nor matched: not an answer MongoDB gives, but
                // a racing upsert on the test server can end like this. Whose
                // singleton is it? Read it back rather than assume.
                Ok(_) => return self.confirm_fsck(lease).await,
                // Two forced installs raced on an empty slot: go again, replacing the winner.
                Err(e) if is_duplicate_key(&e) && force && attempt == 0 => continue,
                Err(e) if is_duplicate_key(&e) => {
                    let holder = self
                        .coll
                        .find_one(doc! { "_id": FSCK_ID })
                        .await
                        .ok()
                        .flatten()
                        .map(|d| Seen::from_doc(&d).describe())
                        .unwrap_or_else(|| "another process".into());
                    return Err(StoreLeaseError::locked(format!(
                        "an fsck lease is already held by {holder}; only force (after verifying its owner died) replaces it"
                    )));
                }
                Err(e) => return Err(backend("installing the fsck singleton")(e)),
            }
        }
        Err(StoreLeaseError::locked(
            "forced fsck installs kept racing each other",
        ))
    }

    async fn confirm_fsck(&self, lease: &StoreLease) -> Result<(), StoreLeaseError> {
        let found = self
            .coll
            .find_one(doc! { "_id": FSCK_ID })
            .timed(self.timing.request_timeout, "confirming the fsck singleton")
            .await?
            .map_err(backend("confirming the fsck singleton"))?;
        match found {
            Some(d) if d.get_str("identifier").ok() == Some(lease.identifier.as_str()) => Ok(()),
            Some(d) => Err(StoreLeaseError::locked(format!(
                "an fsck lease is already held by {}",
                Seen::from_doc(&d).describe()
            ))),
            None => Err(StoreLeaseError::locked(
                "the fsck singleton could not be installed (a racing install); try again",
            )),
        }
    }

    async fn aged(&self, filter: Document) -> Result<Vec<Seen>, StoreLeaseError> {
        let pipeline = vec![
            doc! { "$match": filter },
            doc! { "$project": {
                "identifier": 1, "owner": 1, "heartbeat_ms": 1, PENDING: 1,
                "age_ms": { "$subtract": [ now_ms(), "$heartbeat_ms" ] },
            } },
        ];
        let mut cursor = self
            .coll
            .aggregate(pipeline)
            .timed(self.timing.request_timeout, "listing registrations")
            .await?
            .map_err(backend("listing registrations"))?;
        let mut out = Vec::new();
        while cursor
            .advance()
            .timed(self.timing.request_timeout, "listing registrations")
            .await?
            .map_err(backend("listing registrations"))?
        {
            let d: Document = cursor
                .deserialize_current()
                .map_err(backend("listing registrations"))?;
            out.push(Seen::from_doc(&d));
        }
        Ok(out)
    }

    async fn drain_writers(&self, lease: &StoreLease, force: bool) -> Result<(), StoreLeaseError> {
        let started = Instant::now();
        let mut last_refresh = Instant::now();
        let mut sleep = self.timing.poll_initial;
        // Only the registrations present now need draining: this read comes
        // after the singleton was installed, so a writer inserting after it
        // checks after it too, sees the singleton and backs out on its own.
        // Waiting for those latecomers as well would let a stream of
        // retrying writers starve fsck forever (each transient registration
        // keeping the drain busy while itself being refused).
        let mut filter = doc! { "kind": StoreLeaseKind::Writer.as_str() };
        loop {
            let writers = self.aged(filter.clone()).await?;
            let (stale, fresh): (Vec<_>, Vec<_>) =
                writers.into_iter().partition(|w| w.is_stale(&self.timing));
            let mut waiting: Vec<Bson> = Vec::new();
            // A stale registration that was never confirmed belongs to an
            // acquisition that failed (its answer lost, say): that writer
            // never started, and if it still tries to confirm, it finds its
            // registration gone and backs out. It ages out without force.
            let residue: Vec<_> = stale.iter().filter(|w| !w.pending).collect();
            if !residue.is_empty() && !force {
                let names: Vec<_> = residue.iter().map(|w| w.describe()).collect();
                return Err(StoreLeaseError::locked(format!(
                    "stale writer residue: {}; verify those writers died, then run fsck with force",
                    names.join(", ")
                )));
            }
            if !stale.is_empty() {
                let mut revived: Vec<Bson> = Vec::new();
                for w in &stale {
                    // Only the registration as we judged it: a writer that
                    // refreshed (or confirmed) meanwhile is fresh again and
                    // will be drained.
                    let mut filter =
                        doc! { "_id": w.id.clone(), "kind": StoreLeaseKind::Writer.as_str() };
                    match w.heartbeat_ms {
                        Some(h) => filter.insert("heartbeat_ms", h),
                        None => filter.insert("heartbeat_ms", doc! { "$exists": false }),
                    };
                    if !force {
                        filter.insert(PENDING, true);
                    }
                    let deleted = self
                        .coll
                        .delete_one(filter)
                        .timed(self.timing.request_timeout, "removing stale writer residue")
                        .await?
                        .map_err(backend("removing stale writer residue"))?;
                    if deleted.deleted_count == 0 {
                        revived.push(w.id.clone());
                    }
                }
                waiting = revived;
            }
            waiting.extend(fresh.iter().map(|w| w.id.clone()));
            if waiting.is_empty() {
                return Ok(());
            }
            filter = doc! { "kind": StoreLeaseKind::Writer.as_str(), "_id": { "$in": waiting } };
            if let Some(limit) = self.timing.drain_timeout {
                if started.elapsed() >= limit {
                    let names: Vec<_> = fresh.iter().map(Seen::describe).collect();
                    return Err(StoreLeaseError::locked(format!(
                        "writers still active after {limit:?}: {}",
                        names.join(", ")
                    )));
                }
            }
            if last_refresh.elapsed() >= self.timing.refresh_interval / 2 {
                lease.refresh_heartbeat(false).await?;
                last_refresh = Instant::now();
            }
            tokio::time::sleep(sleep).await;
            sleep = (sleep * 2).min(self.timing.poll_max);
        }
    }

    async fn bump_generation(&self) -> Result<u64, StoreLeaseError> {
        let after = self
            .coll
            .find_one_and_update(
                doc! { "_id": GENERATION_ID },
                doc! { "$inc": { "generation": 1_i64 }, "$set": { "kind": GENERATION_ID } },
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .timed(self.timing.request_timeout, "bumping the layout generation")
            .await?
            .map_err(backend("bumping the layout generation"))?;
        after
            .as_ref()
            .and_then(|d| d.get("generation"))
            .and_then(as_i64)
            .and_then(|g| u64::try_from(g).ok())
            .ok_or_else(|| {
                StoreLeaseError::Backend(lease_core::Error::Backend(
                    "the layout generation document is not a counter".into(),
                ))
            })
    }

    /// Clears a stale fsck lock after an administrator verified its owner died.
    /// Returns whether a lock was cleared
    /// (`false`: there was none).
    ///
    /// **This has no fencing: clearing a merely slow fsck can corrupt the
    /// store.** It refuses while the fsck heartbeat is fresh, but a stale
    /// heartbeat only means the owner stopped refreshing, not that it stopped
    /// working.
    ///
    /// # Errors
    /// [`StoreLockedError`] while the fsck heartbeat is fresh, or when the
    /// lock changed while being cleared.
    pub async fn clear_stale_lock(&self) -> Result<bool, StoreLeaseError> {
        let found = self.aged(doc! { "_id": FSCK_ID }).await?;
        let Some(f) = found.into_iter().next() else {
            return Ok(false);
        };
        if !f.is_stale(&self.timing) {
            return Err(StoreLeaseError::locked(format!(
                "the fsck lease of {} is fresh (stale after {:?}); refusing to clear it",
                f.describe(),
                self.timing.stale_after()
            )));
        }
        let mut filter = doc! { "_id": FSCK_ID, "identifier": &f.identifier };
        if let Some(h) = f.heartbeat_ms {
            filter.insert("heartbeat_ms", h);
        }
        let deleted = self
            .coll
            .delete_one(filter)
            .timed(self.timing.request_timeout, "clearing the stale fsck lock")
            .await?
            .map_err(backend("clearing the stale fsck lock"))?;
        if deleted.deleted_count == 1 {
            Ok(true)
        } else {
            Err(StoreLeaseError::locked(
                "the fsck lease changed while being cleared (refreshed or replaced); look again",
            ))
        }
    }

    fn lease(
        &self,
        kind: StoreLeaseKind,
        doc_id: String,
        identifier: String,
        owner: &str,
    ) -> StoreLease {
        StoreLease {
            coll: self.coll.clone(),
            doc_id,
            identifier,
            owner: owner.to_string(),
            kind,
            timing: self.timing,
        }
    }
}

impl StoreLease {
    /// This lease's unique identifier.
    pub fn identifier(&self) -> &str {
        &self.identifier
    }

    /// The owner name given at acquisition.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Writer or fsck.
    pub fn kind(&self) -> StoreLeaseKind {
        self.kind
    }

    /// The timings in force.
    pub fn timing(&self) -> StoreLockTiming {
        self.timing
    }

    /// The registration document, stamped with the server's clock.
    fn stamp(&self) -> Document {
        doc! { "$set": {
            "kind": self.kind.as_str(),
            "identifier": { "$literal": &self.identifier },
            "owner": { "$literal": &self.owner },
            "heartbeat_ms": now_ms(),
            "checked_ms": now_ms(),
        } }
    }

    /// Refreshes this lease's heartbeat with MongoDB's `$$NOW`.
    ///
    /// Call it at least every [`refresh_interval`](StoreLockTiming::refresh_interval).
    /// A heartbeat that has already gone stale is not revived unless `force`:
    /// others may have treated this owner as dead, so it must stop instead.
    ///
    /// # Errors
    /// [`LeaseLostError`] when the registration was displaced (removed by a
    /// forced fsck or [`StoreLeases::clear_stale_lock`], replaced by a forced
    /// fsck), or when it was stale and `force` is false.
    pub async fn refresh_heartbeat(&self, force: bool) -> Result<(), StoreLeaseError> {
        let stale_ms = self.timing.stale_ms();
        let pipeline = vec![
            doc! { "$set": { "checked_ms": now_ms() } },
            doc! { "$set": { "heartbeat_ms": { "$cond": [
                { "$or": [
                    force,
                    { "$lte": [ { "$subtract": [ "$checked_ms", "$heartbeat_ms" ] }, stale_ms ] },
                ] },
                "$checked_ms",
                "$heartbeat_ms",
            ] } } },
        ];
        let after = self
            .coll
            .find_one_and_update(
                doc! { "_id": &self.doc_id, "identifier": &self.identifier },
                pipeline,
            )
            .return_document(ReturnDocument::After)
            .timed(self.timing.request_timeout, "refreshing a heartbeat")
            .await?
            .map_err(backend("refreshing a heartbeat"))?;
        let lost = |reason: String| {
            Err(StoreLeaseError::Lost(LeaseLostError {
                identifier: self.identifier.clone(),
                reason,
            }))
        };
        let Some(d) = after else {
            return lost(format!(
                "its {} registration is gone (displaced by a forced fsck or clear_stale_lock)",
                self.kind.as_str()
            ));
        };
        let heartbeat = d.get("heartbeat_ms").and_then(as_i64);
        let checked = d.get("checked_ms").and_then(as_i64);
        match (heartbeat, checked) {
            (Some(h), Some(c)) if h == c => Ok(()),
            (h, c) => lost(format!(
                "its heartbeat went stale ({} ms old, stale after {:?}); others may treat it as dead",
                match (h, c) {
                    (Some(h), Some(c)) => (c - h).to_string(),
                    _ => "?".into(),
                },
                self.timing.stale_after()
            )),
        }
    }

    /// Removes this process's lease document. Releasing a lease that was
    /// already displaced is a no-op.
    ///
    /// # Errors
    /// A server failure (the registration may still be there).
    pub async fn release(&self) -> Result<(), StoreLeaseError> {
        self.delete().await.map_err(StoreLeaseError::Backend)
    }

    /// Backs out of an acquisition that failed with `e`: removes this
    /// registration, best effort. When that fails too, an unconfirmed writer
    /// registration ages out by itself once stale (fsck removes it without
    /// `force`); an fsck singleton needs `clear_stale_lock`.
    async fn abandon(&self, e: StoreLeaseError) -> StoreLeaseError {
        match self.delete().await {
            Ok(()) => e,
            Err(undo) => {
                let left = match self.kind {
                    StoreLeaseKind::Writer => {
                        "it was never confirmed, so fsck removes it once it is stale"
                    }
                    StoreLeaseKind::Fsck => "writers stay blocked until clear_stale_lock",
                };
                StoreLeaseError::Backend(lease_core::Error::Unavailable {
                    detail: format!(
                        "{e}; and removing this {} registration failed too ({undo}): {left}",
                        self.kind.as_str()
                    ),
                    source: None,
                })
            }
        }
    }

    async fn delete(&self) -> Result<(), lease_core::Error> {
        let timeout = self.timing.request_timeout;
        let op = "releasing a store lease";
        match tokio::time::timeout(
            timeout,
            self.coll
                .delete_one(doc! { "_id": &self.doc_id, "identifier": &self.identifier })
                .into_future(),
        )
        .await
        {
            Ok(r) => r.map(|_| ()).map_err(|e| map(op, e)),
            Err(_) => Err(lease_core::Error::no_answer(
                format!("lease-mongo: {op}"),
                timeout,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let t = StoreLockTiming::default();
        assert_eq!(t.refresh_interval, Duration::from_secs(2));
        assert_eq!(t.stale_multiplier, 4);
        assert_eq!(t.poll_initial, Duration::from_millis(20));
        assert_eq!(t.poll_max, Duration::from_millis(250));
        assert_eq!(t.stale_after(), Duration::from_secs(8));
        assert_eq!(t.stale_ms(), 8000);
        assert!(t.validate().is_ok());
        for bad in [
            StoreLockTiming {
                refresh_interval: Duration::ZERO,
                ..t
            },
            StoreLockTiming {
                stale_multiplier: 1,
                ..t
            },
            StoreLockTiming {
                poll_initial: Duration::ZERO,
                ..t
            },
            StoreLockTiming {
                poll_initial: Duration::from_secs(1),
                ..t
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(lease_core::Error::InvalidTiming { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn lease_lost_is_a_store_locked_error() {
        let lost = StoreLeaseError::Lost(LeaseLostError {
            identifier: "x".into(),
            reason: "gone".into(),
        });
        assert!(lost.is_store_locked() && lost.is_lease_lost());
        let locked = StoreLeaseError::locked("fsck");
        assert!(locked.is_store_locked() && !locked.is_lease_lost());
        let backend = StoreLeaseError::from(lease_core::Error::Unsupported { operation: "x" });
        assert!(!backend.is_store_locked());
        assert_eq!(lost.to_string(), "store lease x lost: gone");
    }

    #[test]
    fn unreadable_heartbeats_count_as_stale() {
        let t = StoreLockTiming::default();
        let seen = |age_ms| Seen {
            id: Bson::Null,
            identifier: "i".into(),
            owner: "o".into(),
            heartbeat_ms: Some(1),
            age_ms,
            pending: false,
        };
        assert!(!seen(Some(8000)).is_stale(&t));
        assert!(seen(Some(8001)).is_stale(&t));
        assert!(seen(None).is_stale(&t));
    }
}
