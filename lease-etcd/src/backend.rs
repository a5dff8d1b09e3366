//! [`EtcdBackend`]: the lease contract on etcd's leases and transactions.
//!
//! Each operation is a method of the client state all clones share
//! ([`Conn`]), in the module named for it: acquire, renew, release and read
//! in `operations`, the watch in `watch`, the break and its audit trail in
//! `admin`; the acquire with sessions on in `session`.

use std::sync::Arc;

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Grant, LastBreak,
    LeaseBackend, LeaseKey, LeaseState, Payload, Renewal,
};

use crate::conn::Conn;

/// Leases with fencing tokens on an etcd cluster.
///
/// * **Acquire** grants an etcd lease with the TTL, then one transaction puts
///   the key bound to that lease iff the key does not exist (`create_revision
///   == 0`), and otherwise reads the holder. etcd deletes the key when the
///   lease expires, so "free or expired" is exactly "absent". 2 round trips
///   when the key is free.
/// * The **fence** is the key's create revision: cluster-wide monotonic, so it
///   never goes backwards across release, expiry, takeover or restart
///   ([`FenceScope::Global`](lease_core::FenceScope::Global)).
/// * **Renew** sends one keep-alive for the grant's etcd lease and, at the
///   same time, reads the key to check that it still carries our (holder,
///   fence): a keep-alive on its own could keep a lease alive whose key is
///   gone, and must never make a lost key look held. Renewed only when both
///   say so; the deadline counts from the keep-alive's send. 1 round trip
///   (2 requests); renewals of one lease at the same time share a keep-alive.
/// * **Release** deletes the key iff its create revision is still our fence,
///   then revokes the lease.
/// * With [sessions](crate::EtcdConfig::sessions), the keys of one TTL share
///   one etcd lease instead: acquire is one transaction beside a shared
///   keep-alive (1 round trip), release one guarded delete that leaves the
///   session lease alone, and the loss of the session lease ends all its
///   keys. See the crate docs for the trade-off.
/// * **Read** returns the holder and the remaining time etcd reports for the
///   lease; it never writes.
///
/// Dropping the backend never revokes a held lease: an abandoned lease
/// simply expires after its TTL.
///
/// Clones share one connection pool.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Conn>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl LeaseBackend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(self.inner.try_acquire(req))
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(self.inner.renew(grant, payload))
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.inner.release(grant))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(self.inner.read(key))
    }

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(self.inner.break_lease(key, note))
    }

    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(self.inner.last_break(key))
    }

    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.inner.wait_for_change(key, seen))
    }
}
