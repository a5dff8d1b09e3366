//! Grants and what a read observes.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Fence, HolderId, LeaseKey, Payload, Timing};

/// A backend's own handle on a grant (a revision, an ETag, a lease id…),
/// opaque to callers; backends put here whatever they need to renew and
/// release exactly this grant.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Version(Arc<str>);

impl Version {
    /// Wraps a backend's version text.
    pub fn new(v: impl Into<String>) -> Self {
        Version(v.into().into())
    }

    /// The version text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version({:?})", &*self.0)
    }
}

/// A live lease held by this process, as established or last renewed.
///
/// A grant is a snapshot: renewing returns a new `Grant` with a later
/// [`sent_at`](Grant::sent_at). It knows its own write deadline (contract point 6),
/// computed from the local monotonic instant at which the request that
/// produced it was **sent**.
///
/// That request is usually the call's own, but a grant may rest on an earlier
/// one: a key bound to an etcd lease this client shares among its keys lives
/// as long as that lease, which was last extended by a keep-alive sent before
/// the call. Such a grant counts from that earlier send, so its holder gets
/// less write time, never more.
///
/// Dropping a grant sends nothing: the key stays held until the grant is
/// released ([`LeaseBackend::release`](crate::LeaseBackend::release)) or its
/// TTL runs out without a renewal.
#[derive(Clone, Debug, PartialEq)]
#[must_use = "dropping a Grant does not release it: the key stays held until the grant is released or its TTL runs out"]
pub struct Grant {
    key: LeaseKey,
    holder: HolderId,
    fence: Fence,
    ttl: Duration,
    sent_at: Instant,
    version: Version,
    timing: Timing,
}

impl Grant {
    /// Built by backends. `sent_at` must be taken **before** the request that
    /// established or renewed the grant's life was sent (it may lie before
    /// the call, never after its answer); `ttl` is the effective TTL.
    pub fn new(
        key: LeaseKey,
        holder: HolderId,
        fence: Fence,
        ttl: Duration,
        sent_at: Instant,
        version: Version,
    ) -> Self {
        Grant {
            key,
            holder,
            fence,
            ttl,
            sent_at,
            version,
            timing: Timing::default(),
        }
    }

    /// The same grant with different holder-side timing.
    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// The same grant, counted from `sent_at` instead: an instant the caller
    /// took before it handed the request to the backend (a keeper takes its
    /// own, on its own clock, so that its lease and this grant agree on the
    /// deadline). It must not be later than the send, nor later than the
    /// grant's own [`sent_at`](Self::sent_at) when that lies before the call.
    pub fn with_sent_at(mut self, sent_at: Instant) -> Self {
        self.sent_at = sent_at;
        self
    }

    /// The same grant, renewed by a request sent at `sent_at`, now at `version`.
    pub fn renewed(&self, sent_at: Instant, version: Version) -> Self {
        Grant {
            sent_at,
            version,
            ..self.clone()
        }
    }

    /// The key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// Who holds it.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// The fencing token of this grant.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The effective TTL (after the backend's rounding).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Local monotonic instant at which the establishing or last renewing
    /// request was sent: within the call, or before it when the grant rests
    /// on an earlier request (see [`Grant`]).
    pub fn sent_at(&self) -> Instant {
        self.sent_at
    }

    /// The backend's handle on this grant.
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// The holder-side timing in force.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// After this instant the holder must not start a write.
    pub fn deadline(&self) -> Instant {
        self.timing.deadline(self.sent_at, self.ttl)
    }

    /// Whether the holder may start a write now (before the deadline).
    ///
    /// This only knows time; a lease keeper also turns it false on loss.
    pub fn may_write(&self) -> bool {
        Instant::now() < self.deadline()
    }

    /// When to renew next, without jitter.
    pub fn renew_at(&self) -> Instant {
        crate::timing::later(self.sent_at, self.timing.renew_interval(self.ttl))
    }
}

/// What a read (or a refused acquire) knows about the current holder of a key.
///
/// Built by backends with [`Holding::new`]; it may gain fields, so it cannot
/// be written as a struct literal outside this crate.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holding {
    /// The current holder.
    pub holder: HolderId,
    /// The fence of its grant.
    pub fence: Fence,
    /// Remaining time as the backend reports it, where it knows it (backend-clock
    /// backends); `None` where expiry is judged by observers.
    pub remaining: Option<Duration>,
    /// The TTL the grant was taken or last renewed with.
    pub ttl: Duration,
    /// The payload stored with the grant.
    pub payload: Payload,
}

impl Holding {
    /// `holder` holds the key with the grant of `fence`, taken or last
    /// renewed with `ttl`, storing `payload`; the remaining time unknown
    /// (see [`with_remaining`](Self::with_remaining)).
    pub fn new(holder: HolderId, fence: Fence, ttl: Duration, payload: Payload) -> Self {
        Holding {
            holder,
            fence,
            remaining: None,
            ttl,
            payload,
        }
    }

    /// The remaining time as the backend reports it (`None`: not known).
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }
}

/// The observed state of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Nobody holds it (never held, released or expired).
    Free,
    /// A live grant exists.
    Held(Holding),
}

impl LeaseState {
    /// The holding, if held.
    pub fn holding(&self) -> Option<&Holding> {
        match self {
            LeaseState::Free => None,
            LeaseState::Held(h) => Some(h),
        }
    }

    /// Whether nobody holds the key.
    pub fn is_free(&self) -> bool {
        matches!(self, LeaseState::Free)
    }

    /// Whether two observations show the same grant (same holder and fence),
    /// or both show the key free — the remaining time and payload aside, which
    /// a renewal changes. What tells a change of holder; a watch, which must
    /// also wake for a new payload, compares [`same_state`](Self::same_state).
    pub fn same_grant(&self, other: &LeaseState) -> bool {
        match (self, other) {
            (LeaseState::Free, LeaseState::Free) => true,
            (LeaseState::Held(x), LeaseState::Held(y)) => {
                x.holder == y.holder && x.fence == y.fence
            }
            _ => false,
        }
    }

    /// Whether two observations show the same grant with the same payload,
    /// or both show the key free — the remaining time aside, which changes
    /// with every read. What a watch compares to decide it must wake: a new
    /// holder, a release, an expiry, or a renewal that stored a new payload
    /// (an election leader proclaiming a value), but not a renewal that only
    /// extended the grant.
    pub fn same_state(&self, other: &LeaseState) -> bool {
        self.same_grant(other)
            && self.holding().map(|h| &h.payload) == other.holding().map(|h| &h.payload)
    }

    /// How long a waiter that read this state may wait for a change
    /// notification before it reads the key again: until a seen grant runs
    /// out (its [`remaining`](Holding::remaining) time, else its TTL, plus a
    /// few milliseconds for the server to count it expired), and never longer
    /// than `idle`. An expiry sends no notification on most backends, and a
    /// notification can be lost; this bound is what finds either.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lease_core::LeaseState;
    /// let idle = Duration::from_secs(1);
    /// assert_eq!(LeaseState::Free.recheck_within(idle), idle);
    /// ```
    pub fn recheck_within(&self, idle: Duration) -> Duration {
        /// Slack after a grant's remaining time, for the server to count it
        /// expired.
        const EXPIRY_SLACK: Duration = Duration::from_millis(5);
        match self {
            LeaseState::Held(h) => h
                .remaining
                .unwrap_or(h.ttl)
                .saturating_add(EXPIRY_SLACK)
                .min(idle),
            LeaseState::Free => idle,
        }
    }
}

/// The outcome of [`LeaseBackend::try_acquire`](crate::LeaseBackend::try_acquire).
#[derive(Clone, Debug, PartialEq)]
pub enum Acquire {
    /// The caller holds the key now (or already did: the same grant again).
    Granted(Grant),
    /// Someone else holds it.
    Held(Holding),
}

impl Acquire {
    /// The grant, if granted.
    #[must_use = "dropping the grant does not release it: the key stays held until its TTL runs out"]
    pub fn granted(self) -> Option<Grant> {
        match self {
            Acquire::Granted(g) => Some(g),
            Acquire::Held(_) => None,
        }
    }
}

/// The outcome of [`LeaseBackend::renew`](crate::LeaseBackend::renew).
#[derive(Clone, Debug, PartialEq)]
pub enum Renewal {
    /// Still ours; the new grant carries the new send instant.
    Renewed(Grant),
    /// Released, expired or taken over: it will never come back.
    Lost,
}

/// What to acquire, for whom, for how long, with what payload.
///
/// ```
/// use std::time::Duration;
/// use lease_core::{AcquireRequest, HolderId, LeaseKey};
/// let req = AcquireRequest::new(LeaseKey::new("cron/report").unwrap(), HolderId::random())
///     .ttl(Duration::from_secs(15));
/// assert_eq!(req.ttl, Duration::from_secs(15));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The key.
    pub key: LeaseKey,
    /// Who asks; reuse it on retries.
    pub holder: HolderId,
    /// Requested TTL; rounded by the backend ([`TtlRule::effective`](crate::TtlRule::effective)).
    /// Zero means the backend's minimum.
    pub ttl: Duration,
    /// Payload to store with the grant.
    pub payload: Payload,
}

impl AcquireRequest {
    /// A request with the default TTL of 10 s and an empty payload.
    pub fn new(key: LeaseKey, holder: HolderId) -> Self {
        AcquireRequest {
            key,
            holder,
            ttl: DEFAULT_TTL,
            payload: Payload::empty(),
        }
    }

    /// Sets the TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the payload.
    pub fn payload(mut self, payload: Payload) -> Self {
        self.payload = payload;
        self
    }
}

/// The TTL used when none is given: 10 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
