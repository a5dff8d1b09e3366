//! The keyed contract ([`LeaseBackend`]) on `{prefix}/{key}` objects:
//! [`ObjectStoreBackend`]. Acquire, renew, release and read live in
//! `operations.rs`, break and last break in `admin.rs`, building the value
//! in `connect.rs`.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Exclusion,
    FenceScope, Grant, LastBreak, LeaseBackend, LeaseKey, LeaseState, Payload, Renewal,
    TimeAuthority, TtlRule, MAX_PAYLOAD_LEN,
};
use object_store::path::Path;

use crate::cache::KeyCache;
use crate::conditional::ConditionalStore;

/// TTLs in whole seconds from 1 s to a day: expiry is judged by observers'
/// clocks with second-scale sleeps, so finer steps would promise nothing.
pub(crate) const TTL_RULE: TtlRule =
    TtlRule::new(Duration::from_secs(1)..=Duration::from_secs(24 * 3600))
        .rounded_to(Duration::from_secs(1));

const CAPABILITIES: Capabilities = Capabilities::new(TimeAuthority::LocalObservation, TTL_RULE)
    .with_watch(false)
    // The weakest lease-core can name, and still an assumption: the
    // probe checks that preconditions are honoured one request at a
    // time, not that check-and-store is atomic under concurrency.
    .with_exclusion(Exclusion::ObservedExpiry)
    .with_fence_scope(FenceScope::PerKey)
    .with_max_payload(MAX_PAYLOAD_LEN);

/// Leases on any [`ObjectStore`](object_store::ObjectStore) with conditional
/// puts (S3 and S3-compatible servers, GCS, Azure,
/// [`InMemory`](object_store::memory::InMemory)); one object per key at
/// `{prefix}/{key}`.
///
/// Clones share the store and this client's observations. Object stores have
/// no clock a client can use, so a foreign lease counts as expired only after
/// **this client** saw the same version of its object for a whole TTL: a fresh
/// client (or a fresh process) waits one TTL before it can take over a lease
/// whose holder went silent ([`TimeAuthority::LocalObservation`]). Every
/// [`read`](LeaseBackend::read) and refused [`try_acquire`](LeaseBackend::try_acquire)
/// advances that observation; keep polling to take an abandoned key over.
///
/// What a client remembers per key is bounded (about 4,000 keys and 8 MiB of
/// cached payloads, least recently used first out; a released key is
/// forgotten at once), so a service touching ever new keys stays flat.
/// Forgetting a key only makes the client behave like a fresh one for it.
///
/// Costs: acquire 2 requests (GET + conditional PUT; the first write of a
/// client also probes the store once with 3 PUTs and a DELETE), renew 1
/// (conditional PUT), release 1, read 1, [`last_break`](LeaseBackend::last_break)
/// 2 (LIST + GET). After a lost answer the retry costs one more GET.
#[derive(Clone)]
pub struct ObjectStoreBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conditional: ConditionalStore,
    pub(crate) prefix: Path,
    pub(crate) keys: KeyCache,
}

impl std::fmt::Debug for ObjectStoreBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStoreBackend")
            .field("store", &self.inner.conditional.store.to_string())
            .field("prefix", &self.inner.prefix.as_ref())
            .finish()
    }
}

impl LeaseBackend for ObjectStoreBackend {
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

    /// Reads the audit records `{prefix}/.audit/{key}/{fence}-{at_unix_ms}`
    /// that [`break_lease`](LeaseBackend::break_lease) writes: one LIST, then
    /// one GET of the record with the highest fence and, among equal fences,
    /// the latest `at_unix_ms` (numbers, not names, are compared). Writes
    /// nothing.
    ///
    /// A break writes its audit record before the lease object, so one that
    /// failed after that (with an unknown outcome, or whose removal of the
    /// record failed too) still reads as a break here.
    ///
    /// # Errors
    /// [`Error::CorruptRecord`] when an object among the key's audit records
    /// has a name that is not `{fence}-{at_unix_ms}`, or the most recent is
    /// not an audit record of a break of this key; either is left untouched.
    /// [`Error::Unavailable`] or [`Error::Backend`] when the store fails the
    /// LIST or the GET.
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(self.read_last_break(key))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(self.read_key(key))
    }
}
