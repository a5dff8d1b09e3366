//! Acquiring: the builders [`Acquiring`] and [`TryAcquiring`], the polling
//! [`Backoff`], and the attempt loop behind them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    Acquire, AcquireRequest, Error, Grant, HolderId, Holding, LeaseBackend, LeaseKey, LeaseState,
    Payload, Timing,
};
use tokio::time::{sleep_until, timeout_at, Instant};

use crate::clock::{jittered, later, Sent};
use crate::error::AcquireError;
use crate::key::IntoLeaseKey;

/// The future of an acquire: what awaiting an [`Acquiring`] or a
/// [`TryAcquiring`] runs.
pub type AcquireFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, AcquireError>> + Send + 'a>>;

/// `acquire`, boxed, with how long it waited recorded in the keeper's
/// metrics under the backend `label`, whatever it ends with.
pub(crate) fn timed<T: Send + 'static>(
    label: Arc<str>,
    acquire: impl Future<Output = Result<T, AcquireError>> + Send + 'static,
) -> AcquireFuture<'static, T> {
    Box::pin(async move {
        let start = Instant::now();
        let result = acquire.await;
        crate::metrics::record_acquire_wait(
            &label,
            start.elapsed(),
            crate::metrics::AcquireWaitOutcome::of(&result),
        );
        result
    })
}

/// A waiting acquire, set up by [`Keeper::acquire`](crate::Keeper::acquire)
/// or [`LeaseGroup::acquire`](crate::LeaseGroup::acquire); `.await` it to run it.
///
/// Unless set: the TTL is the keeper's ([`Keeper::with_ttl`](crate::Keeper::with_ttl),
/// by default [`DEFAULT_TTL`](lease_core::DEFAULT_TTL)), the wait has no end,
/// and the payload is empty.
///
/// It holds a clone of the keeper or group (both cheap to clone), not a
/// borrow, so its future is `'static` and can be spawned:
///
/// ```
/// # use std::sync::Arc;
/// use std::future::IntoFuture;
/// # use lease_keeper::Keeper;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
/// let key: lease_core::LeaseKey = "jobs/a".parse()?;
/// let waiting = tokio::spawn(keeper.acquire(&key).into_future());
/// let lease = waiting.await??;
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "an acquire does nothing until it is awaited"]
pub struct Acquiring<T> {
    pub(crate) on: T,
    /// The key, or why the one given is not one (reported when awaited).
    pub(crate) key: Result<LeaseKey, Error>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Duration,
    pub(crate) payload: Payload,
}

impl<T> Acquiring<T> {
    pub(crate) fn new(on: T, key: impl IntoLeaseKey) -> Self {
        Acquiring {
            on,
            key: key.into_lease_key(),
            ttl: None,
            wait: Duration::MAX,
            payload: Payload::empty(),
        }
    }

    /// The TTL to ask for (the backend rounds it, see
    /// [`TtlRule::effective`](lease_core::TtlRule::effective)).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait while someone else holds the key; then the acquire
    /// fails with [`AcquireError::Timeout`]. `Duration::MAX` (the default)
    /// waits for ever.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The payload to store with the grant.
    pub fn payload(mut self, payload: Payload) -> Self {
        self.payload = payload;
        self
    }
}

impl<T> fmt::Debug for Acquiring<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquiring")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("payload", &self.payload)
            .finish_non_exhaustive()
    }
}

/// A single acquire attempt, set up by [`Keeper::try_acquire`](crate::Keeper::try_acquire)
/// or [`LeaseGroup::try_acquire`](crate::LeaseGroup::try_acquire); `.await` it
/// to run it. Refused, it fails with [`AcquireError::Held`], naming the holder.
///
/// Unless set: the TTL is the keeper's, and the payload is empty. Like
/// [`Acquiring`], it holds a clone of the keeper or group: its future is
/// `'static`.
#[must_use = "an acquire does nothing until it is awaited"]
pub struct TryAcquiring<T> {
    pub(crate) on: T,
    /// The key, or why the one given is not one (reported when awaited).
    pub(crate) key: Result<LeaseKey, Error>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) payload: Payload,
}

impl<T> TryAcquiring<T> {
    pub(crate) fn new(on: T, key: impl IntoLeaseKey) -> Self {
        TryAcquiring {
            on,
            key: key.into_lease_key(),
            ttl: None,
            payload: Payload::empty(),
        }
    }

    /// The TTL to ask for (the backend rounds it, see
    /// [`TtlRule::effective`](lease_core::TtlRule::effective)).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The payload to store with the grant.
    pub fn payload(mut self, payload: Payload) -> Self {
        self.payload = payload;
        self
    }
}

impl<T> fmt::Debug for TryAcquiring<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TryAcquiring")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("payload", &self.payload)
            .finish_non_exhaustive()
    }
}

/// How a waiting acquire polls a backend without a watch: a first pause,
/// doubled after every refused attempt up to a longest pause, each jittered
/// by ±20%. Default: 50 ms, up to 500 ms.
///
/// ```
/// use std::time::Duration;
/// use lease_keeper::Backoff;
/// let b = Backoff::default()
///     .first_pause(Duration::from_millis(20))
///     .longest_pause(Duration::from_secs(2));
/// assert_eq!(b.first(), Duration::from_millis(20));
/// assert_eq!(b.longest(), Duration::from_secs(2));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    first: Duration,
    longest: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            first: Duration::from_millis(50),
            longest: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    /// The first pause (at least 1 ms).
    pub fn first_pause(mut self, first: Duration) -> Self {
        self.first = first.max(Duration::from_millis(1));
        self
    }

    /// The longest pause (never shorter than the first).
    pub fn longest_pause(mut self, longest: Duration) -> Self {
        self.longest = longest;
        self
    }

    /// The first pause.
    pub fn first(&self) -> Duration {
        self.first
    }

    /// The longest pause: never shorter than the first.
    pub fn longest(&self) -> Duration {
        self.longest.max(self.first)
    }
}

/// The attempts of one acquire call: the keeper's backend, timing and
/// backoff, and the holder id of the term this call may start — drawn afresh
/// for every call ([`HolderId::term`]) and kept by its retries, so a retry
/// after a lost answer gets its own grant back while no other call, earlier
/// or later, can share that grant.
pub(crate) struct Attempts {
    pub backend: Arc<dyn LeaseBackend>,
    pub holder: HolderId,
    pub timing: Timing,
    pub backoff: Backoff,
}

impl Attempts {
    /// One acquire attempt: the grant with its send instant, or who holds the key.
    pub(crate) async fn try_grant(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        payload: Payload,
    ) -> Result<Result<(Grant, Sent), Holding>, Error> {
        let req = AcquireRequest::new(key.clone(), self.holder.clone())
            .ttl(ttl)
            .payload(payload);
        let sent = Sent::now();
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

    /// One acquire attempt of a term that is not tried again: if its outcome
    /// is unknown (an error says so, or the future is dropped in flight),
    /// the grant it may have left is settled in the background. A caller
    /// that goes on after an unknown outcome does so with a fresh term, so
    /// that settling can never release a grant it keeps.
    pub(crate) async fn try_grant_settled(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        payload: Payload,
    ) -> Result<Result<(Grant, Sent), Holding>, Error> {
        let mut unsettled = Unsettled::new(self, key, ttl);
        let answer = self.try_grant(key, ttl, payload).await;
        if !matches!(&answer, Err(e) if e.is_unknown_outcome()) {
            unsettled.settled();
        }
        answer
    }

    /// One acquire attempt, refused as [`AcquireError::Held`].
    pub(crate) async fn grant_once(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        payload: Payload,
    ) -> Result<(Grant, Sent), AcquireError> {
        match self.try_grant_settled(key, ttl, payload).await? {
            Ok(granted) => Ok(granted),
            Err(h) => Err(AcquireError::Held {
                key: key.clone(),
                holder: h.holder,
                fence: h.fence,
            }),
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
    ) -> Result<(Grant, Sent), AcquireError> {
        let start = Instant::now();
        // `Duration::MAX` (or anything past the clock's range) waits forever.
        let end = start.checked_add(wait);
        let until = |t: Instant| end.map_or(t, |e| t.min(e));
        let mut watch = self.backend.capabilities().watch;
        let (first, longest) = (self.backoff.first(), self.backoff.longest());
        let mut pause = first;
        let mut last: Option<Holding> = None;
        let mut woke_fast = false;
        let mut unsettled = Unsettled::new(self, key, ttl);
        loop {
            unsettled.unknown();
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
                Ok(Ok(granted)) => {
                    unsettled.settled();
                    return Ok(granted);
                }
                Ok(Err(h)) => {
                    // Refused: no grant of this term exists now.
                    unsettled.settled();
                    Some(h)
                }
                Err(e) if e.is_unknown_outcome() => {
                    tracing::debug!(key = %key, holder = %self.holder, error = %lease_core::ErrorChain::new(&e), "acquire attempt failed; retrying");
                    None
                }
                Err(e) => {
                    unsettled.settled();
                    return Err(AcquireError::Backend(e));
                }
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
                    waited: now.saturating_duration_since(start),
                    holder: last.map(|h| h.holder),
                });
            }
            match seen {
                Some(h) if watch && !spurious => {
                    // Watch, but re-check at least every max(TTL, longest pause):
                    // a missed event costs one such period, not the whole wait.
                    let recheck = until(later(now, ttl.max(longest)));
                    let state = LeaseState::Held(h);
                    let began = Instant::now();
                    match timeout_at(recheck, self.backend.wait_for_change(key, &state)).await {
                        Ok(Ok(())) => woke_fast = began.elapsed() < first,
                        Err(_) => {}
                        Ok(Err(Error::Unsupported { .. })) => watch = false,
                        Ok(Err(e)) => {
                            tracing::debug!(key = %key, error = %lease_core::ErrorChain::new(&e), "watch failed; pausing before the next attempt");
                            sleep_until(until(later(Instant::now(), jittered(pause)))).await;
                            pause = pause.saturating_mul(2).min(longest);
                        }
                    }
                }
                Some(_) if watch => {
                    sleep_until(until(later(now, jittered(first)))).await;
                }
                _ => {
                    sleep_until(until(later(now, jittered(pause)))).await;
                    pause = pause.saturating_mul(2).min(longest);
                }
            }
        }
    }
}

/// An acquire attempt of one term whose outcome is unknown (in flight, cut
/// off, or answered by a transport error). The term's own next attempt
/// adopts a grant it may have left; if there is none — the call ends or its
/// future is dropped — this settles it from a task of its own: a read, and
/// only if the key is held by this term, that term's grant taken back (an
/// acquire with its holder id returns it whole) and released. A key found
/// free or held by anyone else is left alone: settling never takes a key
/// the attempt did not. Without this, a grant nobody renews or releases
/// would keep everyone out for its TTL, as no later call shares the term.
/// An attempt still on its way when the read is answered can land after it;
/// such a grant expires after its TTL.
struct Unsettled<'a> {
    attempts: &'a Attempts,
    key: &'a LeaseKey,
    ttl: Duration,
    armed: bool,
}

impl<'a> Unsettled<'a> {
    /// Armed: an attempt is about to be sent.
    fn new(attempts: &'a Attempts, key: &'a LeaseKey, ttl: Duration) -> Self {
        Unsettled {
            attempts,
            key,
            ttl,
            armed: true,
        }
    }

    /// An attempt is about to be sent (its outcome unknown until answered).
    fn unknown(&mut self) {
        self.armed = true;
    }

    /// An answer says whether the term holds the key: nothing to settle.
    fn settled(&mut self) {
        self.armed = false;
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let req = AcquireRequest::new(self.key.clone(), self.attempts.holder.clone()).ttl(self.ttl);
        let backend = self.attempts.backend.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(settle(backend, req));
            }
            Err(_) => {
                tracing::debug!(key = %self.key, holder = %self.attempts.holder,
                    "acquire with an unknown outcome ended outside a tokio runtime; a grant it left expires after its TTL");
            }
        }
    }
}

/// Releases the grant an attempt of `req`'s term left, if the key is held
/// by that term; each step bounded by the TTL (by then such a grant has
/// expired anyway).
pub(crate) async fn settle(backend: Arc<dyn LeaseBackend>, req: AcquireRequest) {
    let (key, holder) = (req.key.clone(), req.holder.clone());
    let ttl = req.ttl.max(Duration::from_millis(1));
    let ours = match tokio::time::timeout(ttl, backend.read(&key)).await {
        Ok(Ok(LeaseState::Held(h))) => h.holder == holder,
        Ok(Ok(LeaseState::Free)) => false,
        _ => {
            tracing::debug!(key = %key, holder = %holder, "could not read the key of an abandoned acquire; a grant it left expires after its TTL");
            return;
        }
    };
    if !ours {
        return;
    }
    // Held by this very term: the same holder id gets that grant back, with
    // what its release needs.
    let grant = match tokio::time::timeout(ttl, backend.try_acquire(req)).await {
        Ok(Ok(Acquire::Granted(g))) => g,
        _ => {
            tracing::debug!(key = %key, holder = %holder, "could not take back the grant of an abandoned acquire; it expires after its TTL");
            return;
        }
    };
    match tokio::time::timeout(ttl, backend.release(&grant)).await {
        Ok(Ok(())) => {
            tracing::debug!(key = %key, holder = %holder, fence = %grant.fence(), "released the grant of an abandoned acquire")
        }
        _ => {
            tracing::debug!(key = %key, holder = %holder, fence = %grant.fence(), "could not release the grant of an abandoned acquire; it expires after its TTL")
        }
    }
}
