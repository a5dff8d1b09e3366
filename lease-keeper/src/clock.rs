//! Time arithmetic that never panics, and the runtime the keeper runs on.

use std::time::Duration;

use lease_core::{Error, Timing};
use tokio::time::Instant;

/// `t + d`, or a far-off instant where that is past the clock's range (a
/// caller's `Duration::MAX` means "no limit", never a panic).
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    t.checked_add(d).or_else(|| t.checked_add(FAR)).unwrap_or(t)
}

/// `d × f` for a finite, non-negative `f`, saturating where `Duration::mul_f64`
/// would panic (a caller's huge poll interval or TTL).
pub(crate) fn scaled(d: Duration, f: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * f).unwrap_or(Duration::MAX)
}

/// `d` × a uniform factor in [0.8, 1.2).
pub(crate) fn jittered(d: Duration) -> Duration {
    scaled(d, 0.8 + 0.4 * Timing::random_unit())
}

/// The tokio runtime the keeper's background tasks run on.
pub(crate) fn runtime() -> Result<tokio::runtime::Handle, Error> {
    tokio::runtime::Handle::try_current().map_err(|_| Error::Unsupported {
        operation: "keeping a lease outside a tokio runtime",
    })
}
