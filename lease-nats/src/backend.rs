//! [`NatsBackend`] and its [`LeaseBackend`] implementation: each operation
//! is a method of the same name in `operations`, `watch` or `admin`.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use async_nats::jetstream::{kv, Context};
use async_nats::Client;
use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Grant, LastBreak,
    LeaseBackend, LeaseKey, LeaseState, Payload, Renewal,
};

use crate::cache::Cache;
use crate::config::NatsConfig;

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
    /// Per-key hints that save round trips (the payload last written, the
    /// last message seen), bounded.
    pub(crate) cache: Cache,
    /// The highest stream sequence this client has seen (in a write's
    /// acknowledgement, a read, a watch or the stream's state at connect).
    /// Every message stored after that was seen has a higher sequence; one
    /// that does not means the stream's sequence went backwards, and the fence
    /// it would give is refused.
    pub(crate) max_seq: AtomicU64,
    pub(crate) requests: AtomicU64,
}

impl LeaseBackend for NatsBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(self.try_acquire(req))
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(self.renew(grant, payload))
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.release(grant))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(self.read(key))
    }

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(self.break_lease(key, note))
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
        Box::pin(self.last_break(key))
    }

    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.wait_for_change(key, seen))
    }
}
