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

/// How many times in a row a backend's read-then-conditional-write may lose
/// its condition to another writer before the operation gives up with an
/// error naming the contention.
///
/// Every backend of the workspace that implements an operation as a read
/// followed by a compare-and-set bounds its retries with this number, so a
/// key that many writers fight over fails the same way on every backend
/// instead of spinning. Four lets an operation survive three interleaved
/// writers, and a fifth concurrent change within one operation says the key
/// is fought over rather than unlucky.
pub const CONTENTION_ATTEMPTS: usize = 4;

/// One backend's implementation of the lease contract (see the crate docs for
/// the normative rules). Object-safe: `Arc<dyn LeaseBackend>` is the common
/// currency of keepers, groups and the conformance suite.
///
/// Implementations must be cheap to share between tasks; clones of a client
/// talk to the same store.
///
/// # Dropped futures
///
/// A future dropped before it completes (cancelled by `tokio::select!`, a
/// timeout or an aborted task) has an unknown outcome, exactly like
/// [`Error::Unavailable`]: every request it sent may or may not have been
/// applied. The rules for that case hold for it too: a holder retries with
/// the same holder id, and treats a held lease as possibly lost once its
/// deadline passes. Each method's *Cancel safety* section says what a dropped
/// call may have done on the backend.
pub trait LeaseBackend: Send + Sync {
    /// What this backend promises.
    fn capabilities(&self) -> Capabilities;

    /// Take `req.key` if it is free (never held, released or expired) or already
    /// held by `req.holder` (then the same grant and fence come back, with the
    /// longer of the live grant's TTL and the requested one).
    ///
    /// Returns [`Acquire::Held`] when someone else holds it. Errors change
    /// nothing, except [`Error::Unavailable`], whose outcome is unknown: retry
    /// with the same holder id.
    ///
    /// # Cancel safety
    ///
    /// This method is not cancel safe. A dropped future may have taken the
    /// key for `req.holder`, with nobody renewing the grant and nobody told
    /// its fence. Retrying with the same holder id gets
    /// that grant back (same fence); otherwise it keeps other holders out
    /// until it expires after its TTL, like any grant that is not renewed.
    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>>;

    /// Extend `grant` iff (holder, fence) is still the live grant, replacing the
    /// payload when one is given. Loss is [`Renewal::Lost`], never an error.
    ///
    /// # Cancel safety
    ///
    /// This method is not cancel safe, but retrying is. A dropped future may
    /// or may not have extended the grant and stored `payload`. Whichever
    /// happened, `grant` keeps its own deadline, counted from the send of the
    /// request that produced it, and renewing the same `grant` again succeeds
    /// as long as (holder, fence) is still live. Treat the lease as possibly
    /// lost once that deadline passes without a successful renewal.
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>>;

    /// Give `grant` up. Touches only the caller's own live grant: releasing a
    /// lost grant is an `Ok` no-op that leaves the new holder alone.
    ///
    /// # Cancel safety
    ///
    /// This method is not cancel safe, but retrying is. A dropped future may
    /// or may not have released the grant; nothing finishes the release for
    /// it. Releasing the same `grant` again is safe either way (a grant
    /// already released is a no-op). Left unreleased, the key stays held
    /// until the grant expires after its TTL.
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>>;

    /// Observe a key. Never mutates anything.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: it never mutates anything, so a dropped
    /// read has changed nothing.
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>>;

    /// Resolves when the key's state may have changed since `seen`: a new
    /// holder took it, it was released or expired, **or its holder renewed it
    /// with a new payload** (an election leader proclaiming a value, which
    /// observers waiting here must see without waiting for a poll). A renewal
    /// that keeps the payload is no change: waiting acquirers are not woken
    /// by every renewal. Wakes may be spurious: callers re-read after waking.
    /// [`LeaseState::same_state`] is the comparison a change is judged by.
    ///
    /// Backends whose [`Capabilities::watch`] is false keep this default, which
    /// answers [`Error::Unsupported`] at once; callers then poll.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: it only watches, so a dropped wait has
    /// changed nothing. A change counts from `seen`, not from the call, so a
    /// new call with the same `seen` resolves at once if the key changed
    /// while no call was waiting.
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
    ///
    /// # Cancel safety
    ///
    /// This method is not cancel safe, and retrying it blindly is not safe
    /// either. A dropped future may have ended the grant, written the audit
    /// record, both or neither: backends write the two together or one after
    /// the other, in their own order. A second break ends whatever grant is
    /// live by then, which may be a new holder's that acquired the key after
    /// the first break (unless the backend documents that it recognises a
    /// retry of its own break): read the key and
    /// [`last_break`](Self::last_break) before breaking again.
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
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: it never mutates anything, so a dropped
    /// call has changed nothing.
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        let _ = key;
        Box::pin(async { Ok(None) })
    }

    /// Closes the backend's client, for this value and every clone sharing
    /// it; afterwards its requests fail with [`Error::Unavailable`]. Held
    /// leases are not released: they expire by their TTL.
    ///
    /// A backend needs this when its client must be closed while the async
    /// runtime still runs. The MongoDB driver is one: it cleans a dropped
    /// client up in a task it spawns at drop time, and if the runtime is
    /// tearing its tasks down at that moment that task can panic inside the
    /// driver. Call it before the runtime ends; a wrapper forwards it to the
    /// backend it wraps. Backends with nothing to close keep this default,
    /// which does nothing. A frozen server can hold it up: wrap it in a
    /// timeout where the exit must not wait.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe in the sense that a dropped call leaves
    /// no lease in a state it would not reach anyway: it touches no lease.
    /// Whether the client is closed after a dropped call is up to the
    /// backend (it may be half-closed): call it again to be sure.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The most recent break of a key, read back by [`LeaseBackend::last_break`].
///
/// Built by backends with [`LastBreak::new`]; it may gain fields, so it
/// cannot be written as a struct literal outside this crate.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LastBreak {
    /// The holder of the grant the break ended (`None`: the key was free, or
    /// held a corrupt record).
    pub holder: Option<HolderId>,
    /// That grant's fence.
    pub fence: Option<Fence>,
    /// Who broke it, why and when.
    pub note: BreakNote,
}

impl LastBreak {
    /// The break `note` describes, which ended the grant of `holder` with
    /// `fence` (both `None`: the key was free, or held a corrupt record).
    pub fn new(holder: Option<HolderId>, fence: Option<Fence>, note: BreakNote) -> Self {
        LastBreak {
            holder,
            fence,
            note,
        }
    }
}

/// Who breaks a lease and why, for the audit record [`LeaseBackend::break_lease`] leaves.
///
/// Built with [`BreakNote::new`]; it may gain fields, so it cannot be written
/// as a struct literal outside this crate.
///
/// ```
/// use lease_core::BreakNote;
/// let note = BreakNote::new("ops@host-3", "host decommissioned");
/// assert_eq!(note.by, "ops@host-3");
/// assert!(note.at_unix_ms > 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakNote {
    /// Who did it (user, host, tool).
    pub by: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// When, as milliseconds since the Unix epoch on the breaker's clock
    /// (recorded for people; never used to judge expiry).
    pub at_unix_ms: u64,
}

impl BreakNote {
    /// A note by `by`, for `reason`, stamped with the current time of this
    /// machine's clock.
    pub fn new(by: impl Into<String>, reason: impl Into<String>) -> Self {
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        BreakNote {
            by: by.into(),
            reason: reason.into(),
            at_unix_ms,
        }
    }

    /// The same note, stamped with `at_unix_ms` instead.
    pub fn with_at_unix_ms(mut self, at_unix_ms: u64) -> Self {
        self.at_unix_ms = at_unix_ms;
        self
    }
}

/// What [`LeaseBackend::break_lease`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Broken {
    /// The grant that was live, if any (`None`: the key was free or held a
    /// corrupt record, which was removed).
    pub previous: Option<Holding>,
    /// Where the audit record was written, in the backend's own terms
    /// (an etcd key, a bucket and key, an object path, a collection and id).
    pub audit: String,
}

impl Broken {
    /// What a break did: the grant it ended (`None`: the key was free or
    /// held a corrupt record, which was removed), and where its audit
    /// record was written, in the backend's own terms.
    pub fn new(previous: Option<Holding>, audit: impl Into<String>) -> Self {
        Broken {
            previous,
            audit: audit.into(),
        }
    }
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
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        (**self).shutdown()
    }
}
