//! Shared and exclusive leases on one key (a reader-writer lock with
//! fences): [`Keeper::acquire_shared`] and [`Keeper::acquire_exclusive`].
//!
//! # How it works
//!
//! Built on the plain contract — one live grant per key — so it works on
//! every backend unchanged, and holds to the same rules. For a key `k`:
//!
//! * **`k` itself** carries the fences. An exclusive holder holds `k` as a
//!   plain lease. Shared holders together hold one grant of `k` under the
//!   shared holder id [`SHARED_HOLDER`] (a *shared phase*): the first one in
//!   takes it, later ones take the same grant again (same fence), and each
//!   renews it while it stays. So every shared holder of one phase has the
//!   same fence, an exclusive grant's fence is above every earlier phase's,
//!   and the next phase's is above the exclusive one's: a resource that
//!   refuses fences below the highest it has accepted refuses a shared
//!   holder's write made across an exclusive phase.
//! * **`k/shared-0` … `k/shared-31`** register shared holders: each takes
//!   one of these slots (as its own term) *before* it looks for an
//!   exclusive holder, and keeps it while it holds.
//! * **`k/exclusive`** is an exclusive holder's intent: it takes this first,
//!   then waits until no slot is held (the shared holders that came before
//!   it leave), then ends the shared phase and takes `k`.
//!
//! A shared holder that registers and then finds the intent taken backs
//! out and waits. Whatever the interleaving, one side sees the other: a
//! shared holder registered before the intent was taken is waited for, and
//! one registered after sees the intent. New shared holders are shut out
//! before the exclusive one waits for the others, so a stream of shared
//! holders never starves it. The same handshake as the MongoDB
//! writer/maintenance store lock, on every backend and with fences.
//!
//! A plain lease on `k` ([`Keeper::acquire`]) excludes shared holders too
//! (they cannot join a phase while it holds `k`), but without the intent: it
//! waits for the shared phase to end, which a stream of shared holders may
//! never let happen, and after the last one leaves the phase lives on until
//! its TTL runs out. Take `k` with [`Keeper::acquire_exclusive`] where
//! shared holders are about.
//!
//! The slot keys and `k/exclusive` belong to the lock: use no lease of your
//! own under `k/`.

use std::fmt;
use std::future::IntoFuture;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    Acquire, AcquireRequest, Error, Grant, HolderId, LeaseBackend, LeaseKey, LeaseState, Payload,
};
use tokio::time::Instant;
use tracing::Instrument;

use crate::acquire::{AcquireFuture, Acquiring};
use crate::clock::Sent;
use crate::error::AcquireError;
use crate::keeper::Keeper;
use crate::key::IntoLeaseKey;
use crate::lease::Lease;
use crate::loss::LossReason;
use crate::slots::{held_among, leave, slot_keys, take_one, wait_for_any, Unkept, WaitEnd};
use crate::view::LeaseView;

/// The most shared holders one key has at once; more wait for a place.
pub const MAX_SHARED: u32 = 32;

/// The holder id under which shared holders together hold their key: what
/// [`lease status`](https://docs.rs/lease-cli) and a read show as the
/// holder of a key held shared.
pub const SHARED_HOLDER: &str = "(shared)";

/// The shared holder id, as a [`HolderId`].
pub fn shared_holder() -> HolderId {
    // A literal of this crate that `HolderId::new` accepts.
    HolderId::new(SHARED_HOLDER).unwrap_or_else(|_| HolderId::random())
}

/// The slot keys shared holders of `key` register on.
pub fn shared_slots(key: &LeaseKey) -> Result<Vec<LeaseKey>, Error> {
    slot_keys(key, "shared", MAX_SHARED)
}

/// The key an exclusive holder of `key` takes first, to shut new shared
/// holders out.
pub fn exclusive_intent(key: &LeaseKey) -> Result<LeaseKey, Error> {
    LeaseKey::new(format!("{key}/exclusive"))
}

/// A waiting shared acquire, set up by [`Keeper::acquire_shared`]; the
/// `on` of an [`Acquiring`].
#[derive(Clone, Debug)]
pub struct SharedSide(Keeper);

/// A waiting exclusive acquire, set up by [`Keeper::acquire_exclusive`]; the
/// `on` of an [`Acquiring`].
#[derive(Clone, Debug)]
pub struct ExclusiveSide(Keeper);

impl Keeper {
    /// Takes `key` **shared**: with any number of other shared holders (up
    /// to [`MAX_SHARED`]), never with an exclusive one — `flock -s`, a read
    /// lock. Waits while an exclusive holder holds or waits for the key (for
    /// ever, unless [`Acquiring::wait`] bounds it; `wait(Duration::ZERO)`
    /// makes one attempt). The payload is stored with this holder's own
    /// registration.
    ///
    /// The [`SharedLease`] is kept like a [`Lease`]: renewed in the
    /// background, [`may_write`](SharedLease::may_write) false after its
    /// deadline and on loss. Its [`fence`](LeaseView::fence) is the shared
    /// phase's: the same for every shared holder of the phase, above every
    /// earlier exclusive grant of the key, below every later one. See the
    /// [module docs](crate::shared) for how.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use lease_keeper::Keeper;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
    /// let a = keeper.acquire_shared("store/layout").await?;
    /// let b = keeper.acquire_shared("store/layout").await?;
    /// assert_eq!(a.fence(), b.fence()); // one shared phase
    /// let phase = a.fence();
    /// a.release().await?;
    /// b.release().await?;
    ///
    /// let fsck = keeper.acquire_exclusive("store/layout").await?;
    /// assert!(fsck.fence() > phase);
    /// fsck.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](Keeper::acquire); [`AcquireError::Backend`] with
    /// [`Error::InvalidKey`] for a key too long to have slot keys under it.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Keeper::acquire): a registration or grant an attempt
    /// may have left is settled in the background or expires after its TTL.
    /// A shared phase grant taken by a dropped attempt is left to expire (or
    /// to the next exclusive holder, which ends it): other shared holders
    /// may be in it.
    pub fn acquire_shared(&self, key: impl IntoLeaseKey) -> Acquiring<SharedSide> {
        Acquiring::new(SharedSide(self.clone()), key)
    }

    /// Takes `key` **exclusively**: with no shared holder and no other
    /// exclusive one — `flock -x`, a write lock. First shuts new shared
    /// holders out, then waits for the ones in to leave, then takes the key
    /// (for ever, unless [`Acquiring::wait`] bounds it). A stream of shared
    /// holders cannot starve it.
    ///
    /// The result is a plain [`Lease`] on `key`, whose fence is above every
    /// earlier grant of the key, shared or exclusive.
    ///
    /// It costs more than a plain acquire: its intent, a read of each of
    /// the [`MAX_SHARED`] registration slots (sent at once) every time it
    /// looks for shared holders, the key, and the intent's release — about
    /// 35 requests uncontended. Take the key with
    /// [`acquire`](Keeper::acquire) where no shared holder is ever about.
    ///
    /// # Errors
    /// As [`acquire_shared`](Keeper::acquire_shared).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Keeper::acquire). A future dropped while it waits for
    /// shared holders to leave drops its intent, which is released in the
    /// background, letting shared holders in again.
    pub fn acquire_exclusive(&self, key: impl IntoLeaseKey) -> Acquiring<ExclusiveSide> {
        Acquiring::new(ExclusiveSide(self.clone()), key)
    }
}

/// A shared lease: this holder's registration and the shared phase it
/// joined, kept together. Dereferences to the phase's [`LeaseView`] (key,
/// fence, TTL, loss), whose deadline is the earlier of the phase's and the
/// registration's and which may write only while both may — so code that
/// takes a `&LeaseView` keeps a shared lease correctly. Its
/// [`holder`](LeaseView::holder) is the shared holder id of the phase;
/// [`SharedLease::holder`] and [`registration`](SharedLease::registration)
/// tell this holder's own term.
///
/// [`release`](SharedLease::release) gives it up; dropping it does so in the
/// background. Either leaves the phase to the other shared holders.
#[must_use = "dropping a SharedLease gives it up at once"]
pub struct SharedLease {
    phase: Lease,
    registration: Lease,
    _link: Link,
}

/// The task that carries a registration's loss over to the phase's view;
/// ends with the shared lease.
struct Link(tokio::task::JoinHandle<()>);

impl Drop for Link {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl SharedLease {
    fn new(backend: Arc<dyn LeaseBackend>, phase: Lease, registration: Lease) -> Self {
        // The phase's view is what callers watch: make it unwritable and lost
        // as soon as the registration is. And a holder out of the phase gives
        // its registration up at once, so that an exclusive holder waiting
        // for it need not wait for its TTL.
        let (phase_state, reg_state) = (phase.shared.clone(), registration.shared.clone());
        phase_state.bind_to(reg_state.clone());
        let link = tokio::spawn(async move {
            let mut registered = reg_state.writable();
            let mut joined = phase_state.writable();
            loop {
                if !*registered.borrow_and_update() {
                    // Writes stop at once. A refused renewal stops the
                    // registration before its read records why: the phase
                    // reports that reason, not a deadline that never passed.
                    phase_state.stop();
                    let dropped = crate::work::Dropped::now(&reg_state);
                    phase_state.lose(crate::work::ended(&reg_state, dropped).await);
                    return;
                }
                if !*joined.borrow_and_update() {
                    crate::renew::release(&backend, &reg_state, LossReason::Abandoned).detach();
                    return;
                }
                tokio::select! {
                    r = registered.changed() => if r.is_err() { return },
                    r = joined.changed() => if r.is_err() { return },
                }
            }
        });
        SharedLease {
            phase,
            registration,
            _link: Link(link),
        }
    }

    /// Whether a write may start now: both the phase and this holder's
    /// registration are within their deadlines and not lost.
    pub fn may_write(&self) -> bool {
        self.phase.may_write() && self.registration.may_write()
    }

    /// The earlier of the phase's and the registration's write deadlines.
    pub fn deadline(&self) -> Instant {
        self.phase.deadline().min(self.registration.deadline())
    }

    /// This holder's own term id (its registration's holder).
    pub fn holder(&self) -> &HolderId {
        self.registration.holder()
    }

    /// This holder's registration: the slot key it holds, with its own
    /// fence and payload.
    pub fn registration(&self) -> &LeaseView {
        &self.registration
    }

    /// Leaves: stops writes, stops renewing the phase (the other shared
    /// holders keep it) and releases the registration.
    ///
    /// # Errors
    /// The registration's release error; it then expires after its TTL.
    ///
    /// # Cancel safety
    ///
    /// As [`Lease::release`].
    pub async fn release(self) -> Result<(), Error> {
        let SharedLease {
            phase,
            registration,
            _link,
        } = self;
        drop(_link);
        let _ = phase.release().await;
        registration.release().await
    }
}

impl Deref for SharedLease {
    type Target = LeaseView;

    fn deref(&self) -> &LeaseView {
        &self.phase
    }
}

impl fmt::Debug for SharedLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedLease")
            .field("key", self.key())
            .field("holder", self.holder())
            .field("registration", self.registration.key())
            .field("fence", &self.fence())
            .field("may_write", &self.may_write())
            .finish()
    }
}

/// Why a shared attempt did not get in: what to watch before the next.
enum Blocked {
    /// Every slot was held (as seen).
    Full(Vec<(LeaseKey, LeaseState)>),
    /// An exclusive holder holds `key` or its intent (as seen).
    Exclusive(LeaseKey, LeaseState),
}

impl IntoFuture for Acquiring<SharedSide> {
    type Output = Result<SharedLease, AcquireError>;
    type IntoFuture = AcquireFuture<'static, SharedLease>;

    fn into_future(self) -> Self::IntoFuture {
        let label = self.on.0.label();
        crate::acquire::timed(label, async move {
            let key = self.key?;
            let keeper = self.on.0;
            let ttl = self.ttl.unwrap_or(keeper.ttl());
            let span = tracing::info_span!("lease.acquire_shared", backend = %keeper.backend_label(), key = %key);
            let Joined {
                registration,
                phase,
            } = shared(&keeper, &key, ttl, &self.payload, WaitEnd::new(self.wait))
                .instrument(span)
                .await?;
            let registration = keeper.keep_grant(registration.0, registration.1, self.payload)?;
            let phase = keeper
                .keep_grant(phase.0, phase.1, Payload::empty())?
                .never_released();
            Ok(SharedLease::new(
                keeper.backend().clone(),
                phase,
                registration,
            ))
        })
    }
}

/// The two grants a shared holder holds, each with the send instant of its
/// request, for the caller to keep at once (without another await).
pub(crate) struct Joined {
    /// The holder's own registration on a slot key.
    pub registration: (Grant, Sent),
    /// The shared phase's grant of the key.
    pub phase: (Grant, Sent),
}

/// Waits until `key` can be held shared and joins its phase.
pub(crate) async fn shared(
    keeper: &Keeper,
    key: &LeaseKey,
    ttl: Duration,
    payload: &Payload,
    end: WaitEnd,
) -> Result<Joined, AcquireError> {
    let slots = shared_slots(key)?;
    let intent = exclusive_intent(key)?;
    let backend = keeper.backend().clone();
    let (first, longest) = (keeper.backoff().first(), keeper.backoff().longest());
    let mut pause = first;
    let mut attempts = keeper.attempts();
    loop {
        let blocked = match join_phase(keeper, &mut attempts, key, &slots, &intent, ttl, payload)
            .await
        {
            Ok(Ok(joined)) => return Ok(joined),
            Ok(Err(blocked)) => Some(blocked),
            Err(e) if e.is_unknown_outcome() => {
                tracing::debug!(key = %key, error = %lease_core::ErrorChain::new(&e), "shared acquire attempt failed; retrying");
                None
            }
            Err(e) => return Err(AcquireError::Backend(e)),
        };
        if end.passed() {
            let holder = match &blocked {
                Some(Blocked::Exclusive(_, s)) => s.holding().cloned(),
                Some(Blocked::Full(seen)) => seen.first().and_then(|(_, s)| s.holding().cloned()),
                None => None,
            };
            return Err(end.timeout(key, holder));
        }
        let seen = match blocked {
            Some(Blocked::Full(seen)) => seen,
            Some(Blocked::Exclusive(k, s)) => vec![(k, s)],
            None => Vec::new(),
        };
        wait_for_any(&backend, &seen, pause, ttl.max(longest), &end).await;
        // Watches do the waiting where the backend has them; polls back
        // off, as a plain waiting acquire's do.
        pause = pause.saturating_mul(2).min(longest);
    }
}

/// One shared attempt: register, look for an exclusive holder, join the
/// phase.
async fn join_phase(
    keeper: &Keeper,
    attempts: &mut crate::acquire::Attempts,
    key: &LeaseKey,
    slots: &[LeaseKey],
    intent: &LeaseKey,
    ttl: Duration,
    payload: &Payload,
) -> Result<Result<Joined, Blocked>, Error> {
    let backend = keeper.backend().clone();
    let registration = match take_one(keeper, attempts, slots, ttl, payload).await? {
        Ok(granted) => granted,
        Err(seen) => return Ok(Err(Blocked::Full(seen))),
    };
    // Dropped before the end, the call gives its registration up.
    let unkept = Unkept::new(backend.clone(), &registration.0);
    // Registered first, then look: an exclusive holder that took its intent
    // before this read is seen here; one that takes it after sees this
    // registration and waits for it.
    match backend.read(intent).await {
        Ok(LeaseState::Free) => {}
        Ok(held) => {
            unkept.kept();
            leave(keeper, attempts, &registration.0).await;
            return Ok(Err(Blocked::Exclusive(intent.clone(), held)));
        }
        Err(e) => {
            unkept.kept();
            leave(keeper, attempts, &registration.0).await;
            return Err(e);
        }
    }
    let req = AcquireRequest::new(key.clone(), shared_holder()).ttl(ttl);
    let sent = Sent::now();
    let phase = match backend.try_acquire(req).await {
        Ok(Acquire::Granted(g)) => g.with_timing(keeper.timing()),
        Ok(Acquire::Held(h)) => {
            unkept.kept();
            leave(keeper, attempts, &registration.0).await;
            return Ok(Err(Blocked::Exclusive(key.clone(), LeaseState::Held(h))));
        }
        // A phase grant this attempt may have taken is left alone: other
        // shared holders may be in it. It expires, or the next exclusive
        // holder ends it.
        Err(e) => {
            unkept.kept();
            leave(keeper, attempts, &registration.0).await;
            return Err(e);
        }
    };
    if !registration.0.may_write() {
        // Registered too long ago: an exclusive holder may have seen the
        // slot free since. Start over.
        unkept.kept();
        leave(keeper, attempts, &registration.0).await;
        return Err(Error::Unavailable {
            detail: format!("the shared registration on {key} ran past its deadline while joining"),
            source: None,
        });
    }
    unkept.kept();
    tracing::info!(key = %key, holder = %registration.0.holder(), fence = %phase.fence(), registration = %registration.0.key(), "shared lease acquired");
    Ok(Ok(Joined {
        registration,
        phase: (phase, sent),
    }))
}

impl IntoFuture for Acquiring<ExclusiveSide> {
    type Output = Result<Lease, AcquireError>;
    type IntoFuture = AcquireFuture<'static, Lease>;

    fn into_future(self) -> Self::IntoFuture {
        let label = self.on.0.label();
        crate::acquire::timed(label, async move {
            let key = self.key?;
            let keeper = self.on.0;
            let ttl = self.ttl.unwrap_or(keeper.ttl());
            let span = tracing::info_span!("lease.acquire_exclusive", backend = %keeper.backend_label(), key = %key);
            exclusive(&keeper, &key, ttl, &self.payload, WaitEnd::new(self.wait))
                .instrument(span)
                .await
        })
    }
}

async fn exclusive(
    keeper: &Keeper,
    key: &LeaseKey,
    ttl: Duration,
    payload: &Payload,
    end: WaitEnd,
) -> Result<Lease, AcquireError> {
    let slots = shared_slots(key)?;
    let intent_key = exclusive_intent(key)?;
    let backend = keeper.backend().clone();
    let (first, longest) = (keeper.backoff().first(), keeper.backoff().longest());
    'intent: loop {
        // 1. Shut new shared holders out.
        let rest = end.remaining();
        let intent = if rest.is_zero() {
            keeper.try_acquire(&intent_key).ttl(ttl).await
        } else {
            keeper.acquire(&intent_key).ttl(ttl).wait(rest).await
        };
        let intent = match intent {
            Ok(l) => l,
            Err(AcquireError::Timeout { holder, .. }) => {
                return Err(AcquireError::Timeout {
                    key: key.clone(),
                    waited: end.elapsed(),
                    holder,
                })
            }
            Err(AcquireError::Held { holder, .. }) => {
                return Err(AcquireError::Timeout {
                    key: key.clone(),
                    waited: end.elapsed(),
                    holder: Some(holder),
                })
            }
            Err(e) => return Err(e),
        };
        // 2. Wait for the shared holders already in to leave.
        let mut pause = first;
        loop {
            if !intent.may_write() {
                continue 'intent;
            }
            let held = match held_among(&backend, &slots).await {
                Ok(h) => h,
                Err(e) if e.is_unknown_outcome() => {
                    wait_for_any(&backend, &[], pause, longest, &end).await;
                    pause = pause.saturating_mul(2).min(longest);
                    continue;
                }
                Err(e) => {
                    let _ = intent.release().await;
                    return Err(AcquireError::Backend(e));
                }
            };
            if held.is_empty() {
                break;
            }
            if end.passed() {
                let _ = intent.release().await;
                return Err(end.timeout(key, held.first().and_then(|(_, s)| s.holding().cloned())));
            }
            wait_for_any(&backend, &held, pause, ttl.max(longest), &end).await;
            pause = pause.saturating_mul(2).min(longest);
        }
        // 3. End the shared phase, take the key.
        let mut attempts = keeper.attempts();
        let mut pause = first;
        loop {
            // The intent must have been live without a break since the
            // slots were seen empty: else a shared holder may have joined.
            if !intent.may_write() {
                continue 'intent;
            }
            match attempts.try_grant_settled(key, ttl, payload.clone()).await {
                Ok(Ok((grant, sent))) => {
                    let lease = keeper.keep_grant(grant, sent, payload.clone())?;
                    let _ = intent.release().await;
                    return Ok(lease);
                }
                Ok(Err(h)) if h.holder.as_str() == SHARED_HOLDER => {
                    if !end_phase(keeper, key, ttl, &intent).await {
                        if end.passed() {
                            let _ = intent.release().await;
                            return Err(end.timeout(key, Some(h)));
                        }
                        wait_for_any(&backend, &[], pause, longest, &end).await;
                        pause = pause.saturating_mul(2).min(longest);
                    }
                }
                Ok(Err(h)) => {
                    // A plain holder, or an exclusive one that came first.
                    if end.passed() {
                        let _ = intent.release().await;
                        return Err(end.timeout(key, Some(h)));
                    }
                    wait_for_any(
                        &backend,
                        &[(key.clone(), LeaseState::Held(h))],
                        first,
                        ttl.max(longest),
                        &end,
                    )
                    .await;
                }
                Err(e) if e.is_unknown_outcome() => {
                    attempts = keeper.attempts();
                    if end.passed() {
                        let _ = intent.release().await;
                        return Err(end.timeout(key, None));
                    }
                    wait_for_any(&backend, &[], pause, longest, &end).await;
                    pause = pause.saturating_mul(2).min(longest);
                }
                Err(e) => {
                    let _ = intent.release().await;
                    return Err(AcquireError::Backend(e));
                }
            }
        }
    }
}

/// Ends a shared phase nobody is in any more: the shared holder id takes
/// the phase's grant back (the same grant) and releases it — each step only
/// while the intent still keeps new shared holders out.
///
/// Like any write under a lease, the release is sent within the intent's
/// deadline but may land later: an exclusive holder paused for a third of
/// its TTL between the check and the landing could end a phase that a
/// shared holder joined after the intent expired. The fences order the two
/// at the resource (the exclusive grant's is above the phase's).
async fn end_phase(keeper: &Keeper, key: &LeaseKey, ttl: Duration, intent: &Lease) -> bool {
    let backend = keeper.backend();
    if !intent.may_write() {
        return false;
    }
    let req = AcquireRequest::new(key.clone(), shared_holder()).ttl(ttl);
    match backend.try_acquire(req).await {
        Ok(Acquire::Granted(g)) if intent.may_write() => match backend.release(&g).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(key = %key, error = %lease_core::ErrorChain::new(&e), "ending an empty shared phase failed; trying again");
                false
            }
        },
        Ok(_) => false,
        Err(e) => {
            tracing::debug!(key = %key, error = %lease_core::ErrorChain::new(&e), "taking back an empty shared phase failed; trying again");
            false
        }
    }
}
