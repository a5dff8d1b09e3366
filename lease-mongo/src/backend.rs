//! The keyed lease: [`MongoBackend`], one document per key, judged on `$$NOW`.
//!
//! Each contract operation lives beside its requests: acquire, renew, release
//! and read in `operations.rs`, break and last break in `admin.rs`; opening
//! the collection in `connect.rs`.

use std::time::Duration;

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Exclusion,
    FenceScope, Grant, LastBreak, LeaseBackend, LeaseKey, LeaseState, Payload, Renewal,
    TimeAuthority, TtlRule, MAX_PAYLOAD_LEN,
};
use mongodb::bson::Document;
use mongodb::Collection;

use crate::config::MongoConfig;
use crate::record::{MAX_TTL_MS, MIN_TTL_MS};

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

pub(crate) const CAPABILITIES: Capabilities =
    Capabilities::new(TimeAuthority::BackendClock, TTL_RULE)
        // No change streams: they need a replica set, and the test server has none.
        .with_watch(false)
        .with_exclusion(Exclusion::Atomic)
        .with_fence_scope(FenceScope::PerKey)
        .with_max_payload(MAX_PAYLOAD_LEN);

/// The MongoDB lease backend. See the crate docs.
///
/// Cheap to clone; clones share the driver's connection pool.
#[derive(Clone, Debug)]
pub struct MongoBackend {
    pub(crate) coll: Collection<Document>,
    pub(crate) config: MongoConfig,
}

impl LeaseBackend for MongoBackend {
    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
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

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(self.break_key(key, note))
    }

    /// The lease document's `last_break` stamp, which acquire, renew and
    /// release leave alone (one `find`); the newest audit record of the key
    /// only when the document carries none. A malformed stamp or record is
    /// [`Error::CorruptRecord`], and stays as it is.
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(self.read_last_break(key))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(self.read_key(key))
    }

    /// [`MongoBackend::shutdown`]: the driver must be shut down while the
    /// runtime still runs.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(MongoBackend::shutdown(self))
    }
}
