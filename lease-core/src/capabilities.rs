//! What a backend can promise, so callers branch on capabilities, not names.

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::{Error, MAX_PAYLOAD_LEN};

/// Whose clock decides that a grant has expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeAuthority {
    /// The backend's own clock (etcd lease TTL, NATS message TTL, MongoDB `$$NOW`).
    BackendClock,
    /// The service has no usable clock (object stores): a foreign grant is taken
    /// over only after the taker saw it unchanged for at least one TTL on its own
    /// monotonic clock. Remote timestamps are never compared with local ones.
    LocalObservation,
}

/// How strongly a grant excludes a second holder on this service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Exclusion {
    /// Acquisition is an atomic conditional write on a linearizable store:
    /// at most one live grant per key at any instant of the backend's time.
    Atomic,
    /// Atomic conditional writes, but expiry is judged by observers' own clocks
    /// (see [`TimeAuthority::LocalObservation`]): exclusion holds as long as no
    /// holder stalls past its deadline without noticing — honour `may_write()`
    /// and fence your writes.
    ObservedExpiry,
}

/// Over which keys fences are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceScope {
    /// Fences increase per key only.
    PerKey,
    /// Fences increase across every key of the backend (etcd revisions, a NATS
    /// stream's sequence): a fence also orders grants of different keys.
    Global,
}

/// The TTLs a backend accepts and how it rounds them.
///
/// Built with [`TtlRule::new`] and [`TtlRule::rounded_to`]; it may gain
/// fields, so it cannot be written as a struct literal outside this crate.
///
/// ```
/// use std::time::Duration;
/// use lease_core::TtlRule;
/// let rule = TtlRule::new(Duration::from_secs(1)..=Duration::from_secs(3600))
///     .rounded_to(Duration::from_secs(1));
/// assert_eq!(rule.min, Duration::from_secs(1));
/// assert_eq!(rule.max, Duration::from_secs(3600));
/// assert_eq!(rule.granularity, Duration::from_secs(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TtlRule {
    /// TTLs are rounded **up** to a multiple of this.
    pub granularity: Duration,
    /// The shortest TTL; a requested TTL of zero means this.
    pub min: Duration,
    /// The longest TTL accepted.
    pub max: Duration,
}

impl TtlRule {
    /// TTLs from the shortest to the longest of `range`, not rounded (a
    /// granularity of 1 ns) until [`rounded_to`](TtlRule::rounded_to) says so.
    pub const fn new(range: RangeInclusive<Duration>) -> Self {
        TtlRule {
            granularity: Duration::from_nanos(1),
            min: *range.start(),
            max: *range.end(),
        }
    }

    /// The same rule, rounding TTLs up to a multiple of `granularity`.
    pub const fn rounded_to(mut self, granularity: Duration) -> Self {
        self.granularity = granularity;
        self
    }

    /// The TTL the backend will really use for `requested`: zero counts as the
    /// minimum, anything else is rounded up to the granularity.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lease_core::TtlRule;
    /// let rule = TtlRule::new(Duration::from_secs(1)..=Duration::from_secs(3600))
    ///     .rounded_to(Duration::from_secs(1));
    /// assert_eq!(rule.effective(Duration::ZERO).unwrap(), Duration::from_secs(1));
    /// assert_eq!(rule.effective(Duration::from_millis(1500)).unwrap(), Duration::from_secs(2));
    /// assert!(rule.effective(Duration::from_secs(3601)).is_err());
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTtl`] when the rounded TTL exceeds the maximum.
    pub fn effective(&self, requested: Duration) -> Result<Duration, Error> {
        let g = self.granularity.as_nanos().max(1);
        let rounded = requested.as_nanos().div_ceil(g) * g;
        let rounded = rounded.max(self.min.as_nanos());
        if rounded > self.max.as_nanos() {
            return Err(Error::InvalidTtl {
                requested,
                reason: format!(
                    "longer than this backend's maximum of {:?} (accepted: {:?} to {:?} in steps of {:?})",
                    self.max, self.min, self.max, self.granularity
                ),
            });
        }
        // `rounded <= max`, which came from a Duration, so it fits.
        let secs = (rounded / 1_000_000_000) as u64;
        let nanos = (rounded % 1_000_000_000) as u32;
        Ok(Duration::new(secs, nanos))
    }
}

/// What a backend promises; see the crate docs for how each is used.
///
/// Built with [`Capabilities::new`] and its `with_*` methods; it may gain
/// fields, so it cannot be written as a struct literal outside this crate.
///
/// ```
/// use std::time::Duration;
/// use lease_core::{Capabilities, Exclusion, FenceScope, TimeAuthority, TtlRule};
/// let caps = Capabilities::new(
///     TimeAuthority::BackendClock,
///     TtlRule::new(Duration::from_secs(1)..=Duration::from_secs(3600)),
/// )
/// .with_watch(true)
/// .with_fence_scope(FenceScope::Global);
/// assert_eq!(caps.exclusion, Exclusion::Atomic);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Whose clock decides expiry.
    pub time_authority: TimeAuthority,
    /// Accepted TTLs and their rounding.
    pub ttl: TtlRule,
    /// Whether [`LeaseBackend::wait_for_change`](crate::LeaseBackend::wait_for_change)
    /// is served by a server-side watch (otherwise waiting acquirers poll).
    pub watch: bool,
    /// How strongly a grant excludes a second holder.
    pub exclusion: Exclusion,
    /// Over which keys fences are ordered.
    pub fence_scope: FenceScope,
    /// Largest payload this backend stores (at most [`MAX_PAYLOAD_LEN`](crate::MAX_PAYLOAD_LEN)).
    pub max_payload: usize,
}

impl Capabilities {
    /// What a backend with this clock and these TTLs promises, at the least:
    /// no watch, per-key fences, payloads up to [`MAX_PAYLOAD_LEN`], and the
    /// exclusion its clock allows ([`Exclusion::Atomic`] on the backend's
    /// clock, [`Exclusion::ObservedExpiry`] on observers').
    pub const fn new(time_authority: TimeAuthority, ttl: TtlRule) -> Self {
        Capabilities {
            time_authority,
            ttl,
            watch: false,
            exclusion: match time_authority {
                TimeAuthority::BackendClock => Exclusion::Atomic,
                TimeAuthority::LocalObservation => Exclusion::ObservedExpiry,
            },
            fence_scope: FenceScope::PerKey,
            max_payload: MAX_PAYLOAD_LEN,
        }
    }

    /// Whether waiting acquirers are woken by a server-side watch.
    pub const fn with_watch(mut self, watch: bool) -> Self {
        self.watch = watch;
        self
    }

    /// How strongly a grant excludes a second holder.
    pub const fn with_exclusion(mut self, exclusion: Exclusion) -> Self {
        self.exclusion = exclusion;
        self
    }

    /// Over which keys fences are ordered.
    pub const fn with_fence_scope(mut self, fence_scope: FenceScope) -> Self {
        self.fence_scope = fence_scope;
        self
    }

    /// The largest payload stored (at most [`MAX_PAYLOAD_LEN`]).
    pub const fn with_max_payload(mut self, max_payload: usize) -> Self {
        self.max_payload = max_payload;
        self
    }
}
