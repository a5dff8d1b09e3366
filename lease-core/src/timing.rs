//! Holder-side timing: the write deadline, the renew interval and their jitter.
//!
//! All of a holder's safety rests on one rule: it stops writing at a deadline
//! measured on its **own monotonic clock** from the instant it **sent** the
//! request that established or last renewed its grant. Measuring from the send
//! instant (not the answer) charges the request's whole round trip to the
//! holder, so even a slow answer can never stretch the window past what the
//! backend granted ([rslock] computes validity the same way).
//!
//! [rslock]: https://github.com/hexcowboy/rslock

use std::time::{Duration, Instant};

use crate::Error;

/// When to stop writing and when to renew, as fractions of the TTL.
///
/// Defaults: deadline at 2/3 of the TTL after the send instant, renew every
/// TTL/3 with ±10% jitter. Validated at construction so that a holder always
/// renews before its deadline and stops writing before the backend can expire
/// the grant: `0 < renew_fraction < deadline_fraction < 1`.
///
/// ```
/// use std::time::{Duration, Instant};
/// use lease_core::Timing;
/// let t = Timing::default();
/// let sent = Instant::now();
/// let ttl = Duration::from_secs(9);
/// assert_eq!(t.deadline(sent, ttl), sent + Duration::from_secs(6));
/// assert_eq!(t.renew_interval(ttl), Duration::from_secs(3));
/// assert!(Timing::new(0.5, 0.6, 0.1).is_err()); // renewing after the deadline
/// // The same by name:
/// let t = Timing::default().with_renew_fraction(0.2)?.with_deadline_fraction(0.5)?;
/// assert_eq!(t, Timing::new(0.5, 0.2, 0.1)?);
/// # Ok::<(), lease_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Timing {
    deadline_fraction: f64,
    renew_fraction: f64,
    jitter: f64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            deadline_fraction: 2.0 / 3.0,
            renew_fraction: 1.0 / 3.0,
            jitter: 0.1,
        }
    }
}

impl Timing {
    /// Custom timing.
    ///
    /// * `deadline_fraction`: the share of the TTL after the send instant during
    ///   which the holder may write.
    /// * `renew_fraction`: the share of the TTL between renewals.
    /// * `jitter`: renewals are spread uniformly over `interval × (1 ± jitter)`
    ///   so many holders do not renew in lockstep.
    ///
    /// # Errors
    /// [`Error::InvalidTiming`] unless `0 < renew_fraction < deadline_fraction < 1`,
    /// `0 ≤ jitter < 1` and `renew_fraction × (1 + jitter) < deadline_fraction`.
    pub fn new(deadline_fraction: f64, renew_fraction: f64, jitter: f64) -> Result<Self, Error> {
        let bad = |reason: String| Err(Error::InvalidTiming { reason });
        if !(deadline_fraction > 0.0 && deadline_fraction < 1.0) {
            return bad(format!(
                "deadline fraction {deadline_fraction} must be in (0, 1): a holder must stop writing before the backend can expire its grant"
            ));
        }
        if !(renew_fraction > 0.0 && renew_fraction < deadline_fraction) {
            return bad(format!(
                "renew fraction {renew_fraction} must be in (0, deadline fraction {deadline_fraction}): renew before the write deadline"
            ));
        }
        if !(0.0..1.0).contains(&jitter) {
            return bad(format!("jitter {jitter} must be in [0, 1)"));
        }
        if renew_fraction * (1.0 + jitter) >= deadline_fraction {
            return bad(format!(
                "renew fraction {renew_fraction} plus jitter {jitter} reaches the deadline fraction {deadline_fraction}"
            ));
        }
        Ok(Timing {
            deadline_fraction,
            renew_fraction,
            jitter,
        })
    }

    /// This timing with the write deadline at `fraction` of the TTL, by
    /// name rather than by position in [`new`](Self::new).
    ///
    /// Each setter checks the whole timing, so to move both fractions down,
    /// set the renew fraction first:
    /// `Timing::default().with_renew_fraction(0.1)?.with_deadline_fraction(0.3)?`.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_deadline_fraction(self, fraction: f64) -> Result<Self, Error> {
        Timing::new(fraction, self.renew_fraction, self.jitter)
    }

    /// This timing renewing every `fraction` of the TTL.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_renew_fraction(self, fraction: f64) -> Result<Self, Error> {
        Timing::new(self.deadline_fraction, fraction, self.jitter)
    }

    /// This timing with renewals spread over `interval × (1 ± jitter)`.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_jitter(self, jitter: f64) -> Result<Self, Error> {
        Timing::new(self.deadline_fraction, self.renew_fraction, jitter)
    }

    /// The share of the TTL during which the holder may write.
    pub fn deadline_fraction(&self) -> f64 {
        self.deadline_fraction
    }

    /// The share of the TTL between renewals.
    pub fn renew_fraction(&self) -> f64 {
        self.renew_fraction
    }

    /// The relative jitter applied to renew intervals.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// The write deadline of a grant whose request was sent at `sent`.
    ///
    /// This is the one place the deadline is computed: a [`Grant`](crate::Grant)
    /// and a keeper's lease both ask it. A TTL so long that the deadline is
    /// past the clock's range gives a deadline decades away, never a panic.
    pub fn deadline(&self, sent: Instant, ttl: Duration) -> Instant {
        later(sent, scaled(ttl, self.deadline_fraction))
    }

    /// The nominal interval between renewals.
    pub fn renew_interval(&self, ttl: Duration) -> Duration {
        scaled(ttl, self.renew_fraction)
    }

    /// A renew interval with jitter; `unit` is a uniform sample in `[0, 1)`
    /// (pass [`Timing::random_unit`] or your own RNG's).
    pub fn jittered_renew_interval(&self, ttl: Duration, unit: f64) -> Duration {
        let unit = unit.clamp(0.0, 1.0);
        let factor = 1.0 - self.jitter + 2.0 * self.jitter * unit;
        scaled(self.renew_interval(ttl), factor)
    }

    /// A uniform sample in `[0, 1)` from the standard library's hash keys;
    /// good enough for jitter, not for cryptography.
    pub fn random_unit() -> f64 {
        (crate::holder::random_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `t + d`, or an instant decades away where that is past the clock's range.
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    t.checked_add(d).or_else(|| t.checked_add(FAR)).unwrap_or(t)
}

/// `d × f` for a non-negative `f`, saturating where `Duration::mul_f64` would
/// panic.
fn scaled(d: Duration, f: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * f).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_setters_validate_as_new_does() {
        let t = Timing::default()
            .with_renew_fraction(0.2)
            .unwrap()
            .with_deadline_fraction(0.5)
            .unwrap()
            .with_jitter(0.05)
            .unwrap();
        assert_eq!(t, Timing::new(0.5, 0.2, 0.05).unwrap());
        // Each setter checks the whole: renewing after the deadline is refused.
        assert!(matches!(
            Timing::default().with_renew_fraction(0.7),
            Err(Error::InvalidTiming { .. })
        ));
        assert!(Timing::default().with_deadline_fraction(1.0).is_err());
        assert!(Timing::default().with_jitter(1.0).is_err());
    }

    #[test]
    fn validation() {
        assert!(Timing::new(2.0 / 3.0, 1.0 / 3.0, 0.1).is_ok());
        assert!(Timing::new(1.0, 0.3, 0.0).is_err());
        assert!(Timing::new(0.0, 0.0, 0.0).is_err());
        assert!(Timing::new(0.5, 0.5, 0.0).is_err());
        assert!(Timing::new(0.5, 0.3, 1.0).is_err());
        assert!(Timing::new(0.5, 0.45, 0.2).is_err());
        assert!(Timing::new(f64::NAN, 0.3, 0.0).is_err());
    }

    #[test]
    fn huge_ttls_never_panic() {
        let t = Timing::default();
        let now = Instant::now();
        assert!(t.deadline(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
        assert!(t.renew_interval(Duration::MAX) > Duration::from_secs(86_400 * 365));
        assert!(t.jittered_renew_interval(Duration::MAX, 1.0) > Duration::ZERO);
    }

    #[test]
    fn jitter_bounds() {
        let t = Timing::default();
        let ttl = Duration::from_secs(30);
        assert_eq!(t.jittered_renew_interval(ttl, 0.0), Duration::from_secs(9));
        assert_eq!(t.jittered_renew_interval(ttl, 1.0), Duration::from_secs(11));
        for _ in 0..1000 {
            let u = Timing::random_unit();
            assert!((0.0..1.0).contains(&u));
            let d = t.jittered_renew_interval(ttl, u);
            assert!(d >= Duration::from_secs(9) && d <= Duration::from_secs(11));
        }
    }
}
