//! Time arithmetic that never panics, and the runtime the keeper runs on.

use std::time::Duration;

use lease_core::{Error, Grant, Timing};
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

/// When the keeper handed a request to the backend: on its own clock
/// (tokio's, which tests may pause) and on the standard clock that backends
/// stamp grants with, taken together so the two can be matched.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sent {
    /// On the keeper's clock.
    pub(crate) at: Instant,
    /// On the standard clock.
    std: std::time::Instant,
}

impl Sent {
    /// Now, on both clocks.
    pub(crate) fn now() -> Sent {
        Sent {
            at: Instant::now(),
            std: std::time::Instant::now(),
        }
    }
}

/// The instant `grant` counts from on the keeper's clock: `sent`, taken by
/// the keeper before it handed the request over, unless the grant's own send
/// instant lies before that (a grant resting on a request sent before the
/// call, such as an etcd session lease's last keep-alive); then it counts
/// from as far before `sent` as the grant's instant lies, so the holder never
/// gets more time than the backend granted.
pub(crate) fn counted_from(grant: &Grant, sent: Sent) -> Instant {
    match sent.std.checked_duration_since(grant.sent_at()) {
        Some(back) if !back.is_zero() => sent
            .at
            .checked_sub(back)
            .unwrap_or_else(|| Instant::from_std(grant.sent_at())),
        _ => sent.at,
    }
}
