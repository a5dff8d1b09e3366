//! [`Keeper`]: acquires leases (at once or waiting) and keeps them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    Acquire, AcquireRequest, Error, Grant, HolderId, Holding, LeaseBackend, LeaseKey, LeaseState,
    Payload, Timing,
};
use tokio::time::{sleep_until, timeout_at, Instant};
use tracing::Instrument;

use crate::group::LeaseGroup;
use crate::lease::Lease;

/// Why a waiting acquire gave up.
#[derive(Debug)]
#[non_exhaustive]
pub enum AcquireError {
    /// The key stayed held for the whole wait.
    Timeout {
        /// The key waited for.
        key: LeaseKey,
        /// How long the wait lasted.
        waited: Duration,
        /// The holder seen last, if a read or refused acquire named one.
        holder: Option<HolderId>,
    },
    /// The backend refused the request (bad input, corrupt record, …) or the
    /// keeper could not run (no tokio runtime).
    Backend(Error),
    /// The [`LeaseGroup`] was abandoned (one of its leases was lost); it
    /// takes no new leases.
    GroupAbandoned(crate::LeaseAbandoned),
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::Timeout {
                key,
                waited,
                holder: Some(h),
            } => write!(f, "lease {key} still held by {h} after waiting {waited:?}"),
            AcquireError::Timeout { key, waited, .. } => {
                write!(f, "lease {key} not acquired after waiting {waited:?}")
            }
            AcquireError::Backend(e) => e.fmt(f),
            AcquireError::GroupAbandoned(a) => {
                write!(f, "the lease group was abandoned: {a}")
            }
        }
    }
}

impl std::error::Error for AcquireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AcquireError::Backend(e) => Some(e),
            AcquireError::GroupAbandoned(a) => Some(a),
            AcquireError::Timeout { .. } => None,
        }
    }
}

impl From<Error> for AcquireError {
    fn from(e: Error) -> Self {
        AcquireError::Backend(e)
    }
}

/// Acquires leases on one backend, as one holder, and keeps them.
///
/// Cheap to clone; clones share the backend and the holder id.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use lease_core::{LeaseKey, Payload};
/// use lease_keeper::Keeper;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
/// let key = LeaseKey::new("cron/nightly-report")?;
/// let lease = keeper.acquire(&key, Duration::from_secs(10), Payload::empty(), Duration::from_secs(30)).await?;
/// assert!(lease.may_write());
/// println!("leader with fence {}", lease.fence());
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Keeper {
    backend: Arc<dyn LeaseBackend>,
    holder: HolderId,
    timing: Timing,
    poll_initial: Duration,
    poll_max: Duration,
}

impl fmt::Debug for Keeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keeper")
            .field("holder", &self.holder)
            .field("timing", &self.timing)
            .field("poll_initial", &self.poll_initial)
            .field("poll_max", &self.poll_max)
            .finish_non_exhaustive()
    }
}

/// First pause of a polling acquirer.
pub const DEFAULT_POLL_INITIAL: Duration = Duration::from_millis(50);
/// Longest pause of a polling acquirer.
pub const DEFAULT_POLL_MAX: Duration = Duration::from_millis(500);

impl Keeper {
    /// A keeper on `backend` with a fresh random holder id (stable for the
    /// keeper's life and its clones) and the default [`Timing`].
    pub fn new(backend: Arc<dyn LeaseBackend>) -> Self {
        Keeper {
            backend,
            holder: HolderId::random(),
            timing: Timing::default(),
            poll_initial: DEFAULT_POLL_INITIAL,
            poll_max: DEFAULT_POLL_MAX,
        }
    }

    /// Uses `holder` as the holder id. Reuse one id per process or worker:
    /// a retried acquire whose first answer was lost gets the same grant back.
    pub fn with_holder(mut self, holder: HolderId) -> Self {
        self.holder = holder;
        self
    }

    /// Uses `timing` for deadlines and renew intervals.
    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// How a waiting acquire polls backends without a watch: first pause
    /// `initial`, doubling up to `max`, each jittered by ±20%.
    pub fn with_poll(mut self, initial: Duration, max: Duration) -> Self {
        self.poll_initial = initial.max(Duration::from_millis(1));
        self.poll_max = max.max(self.poll_initial);
        self
    }

    /// The holder id.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// The timing in force.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LeaseBackend> {
        &self.backend
    }

    /// A new, empty [`LeaseGroup`] on this keeper's backend and holder.
    pub fn group(&self) -> LeaseGroup {
        LeaseGroup::new(self.clone())
    }

    /// Takes `key` if it is free (or already ours) and keeps it; `None` when
    /// someone else holds it.
    ///
    /// # Errors
    /// The backend's; [`Error::Unavailable`] means the outcome is unknown:
    /// retry with this keeper (same holder id) to get the grant back.
    /// [`Error::Unsupported`] outside a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// This method is not cancel safe. A future dropped while the acquire
    /// request is in flight leaves its outcome unknown, as
    /// [`Error::Unavailable`] does: the backend may have granted the key to
    /// this keeper's holder id, and nobody renews or releases that grant.
    /// Acquiring the key again with this keeper (or a clone, or any keeper
    /// with the same holder id) gets it back with the same fence; otherwise
    /// it keeps everyone else out until it expires after its TTL. Once the
    /// backend has answered, the [`Lease`] is built without another await,
    /// so a granted lease is never lost to a drop.
    pub async fn try_acquire(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        payload: Payload,
    ) -> Result<Option<Lease>, Error> {
        let rt = runtime()?;
        let span = tracing::info_span!("lease.acquire", key = %key, holder = %self.holder);
        match self
            .try_grant(key, ttl, payload.clone())
            .instrument(span)
            .await?
        {
            Ok((grant, sent)) => Ok(Some(self.keep(grant, sent, payload, &rt))),
            Err(_) => Ok(None),
        }
    }

    /// Takes `key`, waiting up to `wait` while someone else holds it, and keeps it.
    ///
    /// Where the backend can watch ([`Capabilities::watch`](lease_core::Capabilities::watch))
    /// the wait is woken by the key's release or expiry; otherwise it polls
    /// with jittered exponential backoff. Every wake-up is re-verified by an
    /// acquire attempt: a wake-up is a hint, never a grant.
    ///
    /// # Errors
    /// [`AcquireError::Timeout`] when the key stayed held; [`AcquireError::Backend`]
    /// for errors that retrying cannot fix (bad input, a corrupt record).
    /// Transport errors ([`Error::Unavailable`]) are retried until the wait ends.
    /// A wait that ends while an attempt is in flight cuts that attempt off
    /// and answers `Timeout`, yet the attempt may have left a grant behind,
    /// as a dropped future can (see *Cancel safety*).
    ///
    /// # Cancel safety
    ///
    /// This method is not cancel safe. A future dropped while an acquire
    /// attempt is in flight — or after an attempt whose outcome was unknown
    /// (a transport error), before the next one — may leave a grant to this
    /// keeper's holder id on the backend that nobody renews or releases, as
    /// with [`try_acquire`](Keeper::try_acquire): acquiring the key again with
    /// the same holder id gets it back with the same fence; otherwise it keeps
    /// everyone else out until it expires after its TTL. A future dropped
    /// while it only waits (watching the key or pausing between attempts
    /// that were refused) leaves nothing behind. Once an attempt is granted,
    /// the [`Lease`] is built without another await.
    pub async fn acquire(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        payload: Payload,
        wait: Duration,
    ) -> Result<Lease, AcquireError> {
        let rt = runtime()?;
        let span = tracing::info_span!("lease.acquire", key = %key, holder = %self.holder, wait_ms = wait.as_millis() as u64);
        let (grant, sent) = self
            .wait_grant(key, ttl, payload.clone(), wait)
            .instrument(span)
            .await?;
        Ok(self.keep(grant, sent, payload, &rt))
    }

    fn keep(
        &self,
        grant: Grant,
        sent: Instant,
        payload: Payload,
        rt: &tokio::runtime::Handle,
    ) -> Lease {
        Lease::start(self.backend.clone(), grant, sent, self.timing, payload, rt)
    }

    /// One acquire attempt: the grant with its send instant, or who holds the key.
    pub(crate) async fn try_grant(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        payload: Payload,
    ) -> Result<Result<(Grant, Instant), Holding>, Error> {
        let req = AcquireRequest::new(key.clone(), self.holder.clone())
            .ttl(ttl)
            .payload(payload);
        let sent = Instant::now();
        match self.backend.try_acquire(req).await? {
            Acquire::Granted(g) => {
                let g = g.with_timing(self.timing);
                tracing::info!(key = %key, holder = %self.holder, fence = %g.fence(), ttl_ms = g.ttl().as_millis() as u64, "lease acquired");
                Ok(Ok((g, sent)))
            }
            Acquire::Held(h) => {
                tracing::debug!(key = %key, holder = %self.holder, held_by = %h.holder, fence = %h.fence, "lease held by another");
                Ok(Err(h))
            }
        }
    }

    /// Acquire attempts until granted or `wait` has passed. Every attempt,
    /// watch and pause is bounded by the end of the wait; an attempt cut off
    /// by it has an unknown outcome, like a transport error.
    pub(crate) async fn wait_grant(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        payload: Payload,
        wait: Duration,
    ) -> Result<(Grant, Instant), AcquireError> {
        let start = Instant::now();
        // `Duration::MAX` (or anything past the clock's range) waits forever.
        let end = start.checked_add(wait);
        let until = |t: Instant| end.map_or(t, |e| t.min(e));
        let mut watch = self.backend.capabilities().watch;
        let mut pause = self.poll_initial;
        let mut last: Option<Holding> = None;
        let mut woke_fast = false;
        loop {
            let attempt = self.try_grant(key, ttl, payload.clone());
            let answer = match end {
                Some(end) => timeout_at(end, attempt).await.unwrap_or_else(|_| {
                    Err(Error::Unavailable {
                        detail: format!("acquire of {key} unanswered when the wait ended"),
                        source: None,
                    })
                }),
                None => attempt.await,
            };
            let seen = match answer {
                Ok(Ok(granted)) => return Ok(granted),
                Ok(Err(h)) => Some(h),
                Err(e) if e.is_unknown_outcome() => {
                    tracing::debug!(key = %key, holder = %self.holder, error = %e, "acquire attempt failed; retrying");
                    None
                }
                Err(e) => return Err(AcquireError::Backend(e)),
            };
            // A quick wake-up that changed nothing (same holder, same fence)
            // was spurious: pause once before watching again, so a chatty
            // watch cannot spin.
            let spurious = std::mem::take(&mut woke_fast)
                && matches!((&seen, &last), (Some(a), Some(b)) if a.holder == b.holder && a.fence == b.fence);
            if seen.is_some() {
                last = seen.clone();
            }
            let now = Instant::now();
            if end.is_some_and(|e| now >= e) {
                return Err(AcquireError::Timeout {
                    key: key.clone(),
                    waited: now - start,
                    holder: last.map(|h| h.holder),
                });
            }
            match seen {
                Some(h) if watch && !spurious => {
                    // Watch, but re-check at least every max(TTL, poll max):
                    // a missed event costs one such period, not the whole wait.
                    let recheck = until(later(now, ttl.max(self.poll_max)));
                    let state = LeaseState::Held(h);
                    let began = Instant::now();
                    match timeout_at(recheck, self.backend.wait_for_change(key, &state)).await {
                        Ok(Ok(())) => woke_fast = began.elapsed() < self.poll_initial,
                        Err(_) => {}
                        Ok(Err(Error::Unsupported { .. })) => watch = false,
                        Ok(Err(e)) => {
                            tracing::debug!(key = %key, error = %e, "watch failed; pausing before the next attempt");
                            sleep_until(until(later(Instant::now(), jittered(pause)))).await;
                            pause = pause.saturating_mul(2).min(self.poll_max);
                        }
                    }
                }
                Some(_) if watch => {
                    sleep_until(until(later(now, jittered(self.poll_initial)))).await;
                }
                _ => {
                    sleep_until(until(later(now, jittered(pause)))).await;
                    pause = pause.saturating_mul(2).min(self.poll_max);
                }
            }
        }
    }
}

/// `t + d`, or a far-off instant where that is past the clock's range (a
/// caller's `Duration::MAX` means "no limit", never a panic).
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    t.checked_add(d).or_else(|| t.checked_add(FAR)).unwrap_or(t)
}

/// `d` × a uniform factor in [0.8, 1.2).
fn jittered(d: Duration) -> Duration {
    scaled(d, 0.8 + 0.4 * Timing::random_unit())
}

/// `d × f` for a finite, non-negative `f`, saturating where `Duration::mul_f64`
/// would panic (a caller's huge poll interval or TTL).
pub(crate) fn scaled(d: Duration, f: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * f).unwrap_or(Duration::MAX)
}

/// The tokio runtime the keeper's background tasks run on.
pub(crate) fn runtime() -> Result<tokio::runtime::Handle, Error> {
    tokio::runtime::Handle::try_current().map_err(|_| Error::Unsupported {
        operation: "keeping a lease outside a tokio runtime",
    })
}
