//! The backend trait: the contract every backend implements.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{
    Acquire, AcquireRequest, Capabilities, Error, Fence, Grant, HolderId, Holding, LeaseKey,
    LeaseState, Payload, Renewal,
};

/// A boxed, sendable future: keeps [`LeaseBackend`] object-safe without the
/// `async-trait` crate.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One backend's implementation of the lease contract (see the crate docs for
/// the normative rules). Object-safe: `Arc<dyn LeaseBackend>` is the common
/// currency of keepers, groups and the conformance suite.
///
/// Implementations must be cheap to share between tasks; clones of a client
/// talk to the same store.
pub trait LeaseBackend: Send + Sync {
    /// What this backend promises.
    fn capabilities(&self) -> Capabilities;

    /// Take `req.key` if it is free (never held, released or expired) or already
    /// held by `req.holder` (then the same grant and fence come back).
    ///
    /// Returns [`Acquire::Held`] when someone else holds it. Errors change
    /// nothing, except [`Error::Unavailable`], whose outcome is unknown: retry
    /// with the same holder id.
    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>>;

    /// Extend `grant` iff (holder, fence) is still the live grant, replacing the
    /// payload when one is given. Loss is [`Renewal::Lost`], never an error.
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>>;

    /// Give `grant` up. Touches only the caller's own live grant: releasing a
    /// lost grant is an `Ok` no-op that leaves the new holder alone.
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>>;

    /// Observe a key. Never mutates anything.
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>>;

    /// Resolves when the key's state may have changed since `seen` (released,
    /// expired, taken) — possibly spuriously: callers re-read after waking.
    ///
    /// Backends whose [`Capabilities::watch`] is false keep this default, which
    /// answers [`Error::Unsupported`] at once; callers then poll.
    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (key, seen);
        Box::pin(async { Err(Error::Unsupported { operation: "watch" }) })
    }

    /// **Administrative**: ends whatever grant is live at `key` (or a corrupt
    /// record sitting there), so the next acquire succeeds at once — with a
    /// fence still above every earlier one — and leaves an audit record of
    /// `note` and the previous holder and fence outside the lease key space.
    ///
    /// This is an operator's assertion that the holder is dead or stuck. A
    /// holder that is merely slow keeps writing until its deadline: only
    /// fenced writes protect the resource from it. Never call this from
    /// ordinary lease-using code.
    ///
    /// Backends that cannot do it keep this default, [`Error::Unsupported`].
    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        let _ = (key, note);
        Box::pin(async { Err(Error::Unsupported { operation: "break" }) })
    }

    /// **Administrative**: the most recent [`break_lease`](Self::break_lease)
    /// of `key`, as its audit record tells it, or `None` if the key was never
    /// broken. Never mutates anything.
    ///
    /// A holder whose renewal answers [`Renewal::Lost`] asks this to tell a
    /// break of its own grant (an operator's decision, with the reason) from
    /// an expiry. Backends that keep no readable record keep this default,
    /// which answers `None`.
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        let _ = key;
        Box::pin(async { Ok(None) })
    }
}

/// The most recent break of a key, read back by [`LeaseBackend::last_break`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastBreak {
    /// The holder of the grant the break ended (`None`: the key was free, or
    /// held a corrupt record).
    pub holder: Option<HolderId>,
    /// That grant's fence.
    pub fence: Option<Fence>,
    /// Who broke it, why and when.
    pub note: BreakNote,
}

/// Who breaks a lease and why, for the audit record [`LeaseBackend::break_lease`] leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakNote {
    /// Who did it (user, host, tool).
    pub by: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// When, as milliseconds since the Unix epoch on the breaker's clock
    /// (recorded for people; never used to judge expiry).
    pub at_unix_ms: u64,
}

/// What [`LeaseBackend::break_lease`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broken {
    /// The grant that was live, if any (`None`: the key was free or held a
    /// corrupt record, which was removed).
    pub previous: Option<Holding>,
    /// Where the audit record was written, in the backend's own terms
    /// (an etcd key, a bucket and key, an object path, a collection and id).
    pub audit: String,
}

impl<T: LeaseBackend + ?Sized> LeaseBackend for Arc<T> {
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        (**self).try_acquire(req)
    }
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        (**self).renew(grant, payload)
    }
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        (**self).release(grant)
    }
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        (**self).read(key)
    }
    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).wait_for_change(key, seen)
    }
    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        (**self).break_lease(key, note)
    }
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        (**self).last_break(key)
    }
}
