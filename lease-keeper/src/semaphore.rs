//! Counting semaphores with fences: [`Keeper::acquire_permit`].
//!
//! `N` permits on a key `k` are the slot keys `k/permit-0` …
//! `k/permit-<N-1>`; a permit is a plain grant on one of them, so it is
//! kept, renewed, lost and released exactly like a [`Lease`], carries its
//! own fence (the slot's), and frees its place after its TTL when its
//! holder stops renewing it. Built on the plain contract alone, it works on
//! every backend unchanged.
//!
//! # Changing `N`
//!
//! The number of permits is the acquirer's: each acquire takes one of the
//! first `N` slots it is given. Raising `N` lets more holders in at once
//! from then on. Lowering it lets no new holder into a slot at or above the
//! new `N`, while holders already there keep their permits until they
//! release or lose them: until then, at most the highest `N` any live
//! holder acquired with hold permits at once; after, the new `N`. Holders
//! that keep acquiring with different `N` are each held to their own.
//!
//! The slot keys belong to the semaphore: use no lease of your own under
//! `k/`.

use std::future::IntoFuture;
use std::time::Duration;

use lease_core::{Error, Grant, LeaseKey};
use tracing::Instrument;

use crate::acquire::{AcquireFuture, Acquiring};
use crate::clock::Sent;
use crate::error::AcquireError;
use crate::keeper::Keeper;
use crate::key::IntoLeaseKey;
use crate::lease::Lease;
use crate::slots::{slot_keys, take_one, wait_for_any, WaitEnd};

/// The most permits one key can have.
pub const MAX_PERMITS: u32 = 1024;

/// The slot keys of `permits` permits on `key`.
///
/// # Errors
/// [`Error::InvalidKey`] when `permits` is 0 or above [`MAX_PERMITS`], or
/// the key is too long to have slot keys under it.
pub fn permit_slots(key: &LeaseKey, permits: u32) -> Result<Vec<LeaseKey>, Error> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::InvalidKey {
            key: key.to_string(),
            reason: "a semaphore has 1 to 1024 permits",
        });
    }
    slot_keys(key, "permit", permits)
}

/// A waiting permit acquire, set up by [`Keeper::acquire_permit`]; the `on`
/// of an [`Acquiring`].
#[derive(Clone, Debug)]
pub struct PermitSide {
    keeper: Keeper,
    permits: u32,
}

impl Keeper {
    /// Takes one of `permits` permits on `key` — a counting semaphore,
    /// `consul lock -n`: at most `permits` holders at once. Waits while all
    /// are taken (for ever, unless [`Acquiring::wait`] bounds it;
    /// `wait(Duration::ZERO)` makes one attempt), woken by a watch where
    /// the backend has one.
    ///
    /// The permit is a plain [`Lease`] on one slot key under `key` (see the
    /// [module docs](crate::semaphore), also for what changing `permits`
    /// means), with that slot's fence.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use lease_keeper::{AcquireError, Keeper};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
    /// let a = keeper.acquire_permit("gpu/pool", 2).await?;
    /// let b = keeper.acquire_permit("gpu/pool", 2).await?;
    /// let third = keeper.acquire_permit("gpu/pool", 2).wait(Duration::ZERO).await;
    /// assert!(matches!(third, Err(AcquireError::Timeout { .. })));
    /// a.release().await?;
    /// let c = keeper.acquire_permit("gpu/pool", 2).await?; // a's place
    /// # b.release().await?; c.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](Keeper::acquire); [`AcquireError::Backend`] with
    /// [`Error::InvalidKey`] for 0 permits, more than [`MAX_PERMITS`], or a
    /// key too long to have slot keys under it.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Keeper::acquire).
    pub fn acquire_permit(&self, key: impl IntoLeaseKey, permits: u32) -> Acquiring<PermitSide> {
        Acquiring::new(
            PermitSide {
                keeper: self.clone(),
                permits,
            },
            key,
        )
    }
}

impl IntoFuture for Acquiring<PermitSide> {
    type Output = Result<Lease, AcquireError>;
    type IntoFuture = AcquireFuture<'static, Lease>;

    fn into_future(self) -> Self::IntoFuture {
        let label = self.on.keeper.label();
        crate::acquire::timed(label, async move {
            let key = self.key?;
            let PermitSide { keeper, permits } = self.on;
            let ttl = self.ttl.unwrap_or(keeper.ttl());
            let span = tracing::info_span!("lease.acquire_permit", backend = %keeper.backend_label(), key = %key, permits);
            let (grant, sent) = permit(
                &keeper,
                &key,
                permits,
                ttl,
                &self.payload,
                WaitEnd::new(self.wait),
            )
            .instrument(span)
            .await?;
            Ok(keeper.keep_grant(grant, sent, self.payload)?)
        })
    }
}

/// Waits for one of `permits` permits on `key` and takes it: its grant and
/// the send instant of its request, for the caller to keep at once.
pub(crate) async fn permit(
    keeper: &Keeper,
    key: &LeaseKey,
    permits: u32,
    ttl: Duration,
    payload: &lease_core::Payload,
    end: WaitEnd,
) -> Result<(Grant, Sent), AcquireError> {
    let slots = permit_slots(key, permits)?;
    let backend = keeper.backend().clone();
    let (first, longest) = (keeper.backoff().first(), keeper.backoff().longest());
    let mut pause = first;
    let mut attempts = keeper.attempts();
    loop {
        let seen = match take_one(keeper, &mut attempts, &slots, ttl, payload).await {
            Ok(Ok(granted)) => return Ok(granted),
            Ok(Err(seen)) => seen,
            Err(e) if e.is_unknown_outcome() => Vec::new(),
            Err(e) => return Err(AcquireError::Backend(e)),
        };
        if end.passed() {
            return Err(end.timeout(key, seen.first().and_then(|(_, s)| s.holding().cloned())));
        }
        wait_for_any(&backend, &seen, pause, ttl.max(longest), &end).await;
        // Watches do the waiting where the backend has them; polls back
        // off, as a plain waiting acquire's do.
        pause = pause.saturating_mul(2).min(longest);
    }
}
