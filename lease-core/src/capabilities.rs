//! What a backend can promise, so callers branch on capabilities, not names.

use std::time::Duration;

use crate::Error;

/// Whose clock decides that a grant has expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
pub enum FenceScope {
    /// Fences increase per key only.
    PerKey,
    /// Fences increase across every key of the backend (etcd revisions, a NATS
    /// stream's sequence): a fence also orders grants of different keys.
    Global,
}

/// The TTLs a backend accepts and how it rounds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TtlRule {
    /// TTLs are rounded **up** to a multiple of this.
    pub granularity: Duration,
    /// The shortest TTL; a requested TTL of zero means this.
    pub min: Duration,
    /// The longest TTL accepted.
    pub max: Duration,
}

impl TtlRule {
    /// The TTL the backend will really use for `requested`: zero counts as the
    /// minimum, anything else is rounded up to the granularity.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lease_core::TtlRule;
    /// let rule = TtlRule { granularity: Duration::from_secs(1), min: Duration::from_secs(1), max: Duration::from_secs(3600) };
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
