//! [`Keeper`]: acquires leases (at once or waiting) and keeps them.

use std::fmt;
use std::future::Future;
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Grant, HolderId, LeaseBackend, Payload, Timing, DEFAULT_TTL};
use tracing::Instrument;

use crate::acquire::{AcquireFuture, Acquiring, Attempts, Backoff, TryAcquiring};
use crate::clock::{runtime, Sent};
use crate::error::AcquireError;
use crate::key::IntoLeaseKey;
use crate::lease::Lease;

/// Acquires leases on one backend, as one holder, and keeps them.
///
/// Cheap to clone; clones share the backend and the holder id, and may be
/// used from many tasks at once.
///
/// # Terms
///
/// Every acquire call is a *term* of its own, with its own holder id drawn
/// from the keeper's ([`HolderId::term`]: the keeper's id, `~`, 16 random hex
/// digits); the retries inside one call keep it. So:
///
/// * a key is held by at most one term at a time, also within one keeper:
///   while a task holds a key, another task's [`try_acquire`](Keeper::try_acquire)
///   of it (on this keeper or a clone) is refused with [`AcquireError::Held`]
///   naming the first term, and its [`acquire`](Keeper::acquire) waits for the
///   first term's release — as a `tokio::sync::Mutex` would; there is no
///   reentrancy;
/// * a late release of a dropped lease can never end a later term, and every
///   term's fence is above the previous one's;
/// * a grant left on the backend under an earlier term's id (an acquire whose
///   answer was lost, a record a crashed server brought back) is never taken
///   for a new term's own.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use lease_core::LeaseKey;
/// use lease_keeper::Keeper;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
/// let key = LeaseKey::new("cron/nightly-report")?;
/// let lease = keeper
///     .acquire(&key)
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(30))
///     .await?;
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
    backoff: Backoff,
    ttl: Duration,
    backend_label: Arc<str>,
}

impl fmt::Debug for Keeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keeper")
            .field("holder", &self.holder)
            .field("timing", &self.timing)
            .field("backoff", &self.backoff)
            .field("ttl", &self.ttl)
            .field("backend_label", &self.backend_label)
            .finish_non_exhaustive()
    }
}

impl Keeper {
    /// A keeper on `backend` with a fresh random holder id (stable for the
    /// keeper's life and its clones; each acquire's term id is drawn from it),
    /// the default [`Timing`] and [`Backoff`], and a default TTL of
    /// [`DEFAULT_TTL`].
    pub fn new(backend: Arc<dyn LeaseBackend>) -> Self {
        Keeper {
            backend,
            holder: HolderId::random(),
            timing: Timing::default(),
            backoff: Backoff::default(),
            ttl: DEFAULT_TTL,
            backend_label: crate::metrics::unnamed(),
        }
    }

    /// Names the backend in the `backend` field of the keeper's spans
    /// (`lease.acquire`, `lease.keep`, `lease.group`) and the `backend` label
    /// of its metrics; [`UNNAMED`](crate::metrics::UNNAMED) unless set. Give
    /// it the name its [`InstrumentedBackend`](crate::InstrumentedBackend) has
    /// ([`lease::Connection::keeper`](https://docs.rs/lease) does), so that
    /// the keeper's records and the backend's go together.
    pub fn with_backend_label(mut self, label: impl Into<Arc<str>>) -> Self {
        self.backend_label = label.into();
        self
    }

    /// The name of the backend in the keeper's spans and metrics (see
    /// [`with_backend_label`](Self::with_backend_label)).
    pub fn backend_label(&self) -> &str {
        &self.backend_label
    }

    /// The backend label, shared.
    pub(crate) fn label(&self) -> Arc<str> {
        self.backend_label.clone()
    }

    /// Uses `holder` as the holder id: a name for this process or worker
    /// that operators see in `lease status` and break records. Each acquire
    /// call still gets a term id of its own drawn from it
    /// ([`HolderId::term`]), so reusing one name across processes and
    /// restarts never lets one term take over another's grant.
    pub fn with_holder(mut self, holder: HolderId) -> Self {
        self.holder = holder;
        self
    }

    /// Uses `timing` for deadlines and renew intervals.
    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// How a waiting acquire polls backends without a watch.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The TTL of acquires that do not set their own.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The holder id that every term's id is drawn from (a lease's own is
    /// [`LeaseView::holder`](crate::LeaseView::holder)).
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// The timing in force.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// The polling backoff in force.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The TTL of acquires that do not set their own.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LeaseBackend> {
        &self.backend
    }

    /// Takes `key` if it is free and keeps it, as a new term (see *Terms*
    /// above). Set the TTL and payload on the returned [`TryAcquiring`], then
    /// `.await` it. The key is a [`LeaseKey`](lease_core::LeaseKey) or a
    /// string ([`IntoLeaseKey`]).
    ///
    /// # Errors
    /// [`AcquireError::Held`] when someone else holds the key — another
    /// process, or another term of this keeper — naming them;
    /// [`AcquireError::Backend`] with [`Error::InvalidKey`](lease_core::Error::InvalidKey)
    /// for a string that is no key (nothing is sent);
    /// the backend's errors as [`AcquireError::Backend`], where
    /// [`Error::Unavailable`](lease_core::Error::Unavailable) means the
    /// outcome is unknown: the keeper then settles it in the background
    /// (releases a grant the attempt left, if it finds one), and
    /// acquiring again is a new term; [`Error::Unsupported`](lease_core::Error::Unsupported)
    /// outside a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// This method is not cancel safe, though the keeper cleans up after
    /// it. A future dropped while the acquire request is in flight leaves
    /// its outcome unknown; the keeper settles it from a task of its own — a
    /// read, and if the key is held by this call's term, a release of that
    /// grant — so it does not keep everyone else out for its TTL. Settling
    /// never takes a key the attempt did not. A request still on its way
    /// when that read is answered can land after it: such a grant expires
    /// after its TTL. Once the backend has
    /// answered, the [`Lease`] is built without another await, so a granted
    /// lease is never lost to a drop.
    pub fn try_acquire(&self, key: impl IntoLeaseKey) -> TryAcquiring<Keeper> {
        TryAcquiring::new(self.clone(), key)
    }

    /// Takes `key`, waiting while someone else holds it (for ever, unless
    /// [`Acquiring::wait`] bounds it), and keeps it. Set the TTL, wait and
    /// payload on the returned [`Acquiring`], then `.await` it. The key is a
    /// [`LeaseKey`](lease_core::LeaseKey) or a string ([`IntoLeaseKey`]).
    ///
    /// Where the backend can watch ([`Capabilities::watch`](lease_core::Capabilities::watch))
    /// the wait is woken by the key's release or expiry; otherwise it polls
    /// with jittered exponential backoff ([`Backoff`]). Every wake-up is
    /// re-verified by an acquire attempt: a wake-up is a hint, never a grant.
    ///
    /// # Errors
    /// [`AcquireError::Timeout`] when the key stayed held; [`AcquireError::Backend`]
    /// for errors that retrying cannot fix (bad input — a string that is no
    /// key among it —, a corrupt record).
    /// Transport errors ([`Error::Unavailable`](lease_core::Error::Unavailable))
    /// are retried until the wait ends. A wait that ends while an attempt is
    /// in flight cuts that attempt off and answers `Timeout`, yet the attempt
    /// may have left a grant behind, as a dropped future can (see *Cancel safety*).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Keeper::try_acquire): a future dropped while an
    /// acquire attempt is in flight — or after an attempt whose outcome was
    /// unknown (a transport error), before the next one — is settled by the
    /// keeper in the background (the term's grant, if any, is taken back and
    /// released); a wait that ends in [`AcquireError::Timeout`] after such an
    /// attempt is settled the same way. A future dropped while it only waits
    /// (watching the key or pausing between attempts that were refused)
    /// leaves nothing behind. Once an attempt is granted, the [`Lease`] is
    /// built without another await.
    pub fn acquire(&self, key: impl IntoLeaseKey) -> Acquiring<Keeper> {
        Acquiring::new(self.clone(), key)
    }

    /// The attempts of one acquire call, under a holder id of its own
    /// ([`HolderId::term`] of the keeper's).
    pub(crate) fn attempts(&self) -> Attempts {
        Attempts {
            backend: self.backend.clone(),
            holder: self.holder.term(),
            timing: self.timing,
            backoff: self.backoff,
        }
    }

    /// Keeps `grant`, acquired by a request handed over at `sent`, in the
    /// current tokio runtime.
    pub(crate) fn keep_grant(
        &self,
        grant: Grant,
        sent: Sent,
        payload: Payload,
    ) -> Result<Lease, lease_core::Error> {
        Ok(self.keep(grant, sent, payload, &runtime()?))
    }

    fn keep(
        &self,
        grant: Grant,
        sent: Sent,
        payload: Payload,
        rt: &tokio::runtime::Handle,
    ) -> Lease {
        Lease::start(
            self.backend.clone(),
            grant,
            sent,
            self.timing,
            payload,
            self.label(),
            rt,
        )
    }
}

impl IntoFuture for Acquiring<Keeper> {
    type Output = Result<Lease, AcquireError>;
    type IntoFuture = AcquireFuture<'static, Lease>;

    fn into_future(self) -> Self::IntoFuture {
        let label = self.on.label();
        crate::acquire::timed(label, async move {
            let key = self.key?;
            let keeper = self.on;
            let rt = runtime()?;
            let ttl = self.ttl.unwrap_or(keeper.ttl);
            let wait_ms = u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX);
            let attempts = keeper.attempts();
            let span = tracing::info_span!("lease.acquire", backend = %keeper.backend_label, key = %key, holder = %attempts.holder, wait_ms);
            let (grant, sent) = attempts
                .wait_grant(&key, ttl, self.payload.clone(), self.wait)
                .instrument(span)
                .await?;
            Ok(keeper.keep(grant, sent, self.payload, &rt))
        })
    }
}

impl IntoFuture for TryAcquiring<Keeper> {
    type Output = Result<Lease, AcquireError>;
    type IntoFuture = AcquireFuture<'static, Lease>;

    fn into_future(self) -> Self::IntoFuture {
        let label = self.on.label();
        crate::acquire::timed(label, async move {
            let key = self.key?;
            let keeper = self.on;
            let rt = runtime()?;
            let ttl = self.ttl.unwrap_or(keeper.ttl);
            let attempts = keeper.attempts();
            let span = tracing::info_span!("lease.acquire", backend = %keeper.backend_label, key = %key, holder = %attempts.holder);
            let (grant, sent) = attempts
                .grant_once(&key, ttl, self.payload.clone())
                .instrument(span)
                .await?;
            Ok(keeper.keep(grant, sent, self.payload, &rt))
        })
    }
}

impl Keeper {
    /// Acquires `key` (waiting as [`acquire`](Keeper::acquire) does, with
    /// this keeper's defaults), runs `work` while the lease may be written
    /// under, then releases it: `work` runs on at most one holder at a time,
    /// and is dropped no later than the write deadline (see [`Lease::run`](crate::Lease::run)).
    ///
    /// Use [`acquire`](Keeper::acquire) and [`Lease::run`](crate::Lease::run) to set the TTL or
    /// the wait, or to keep the lease after the work.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use lease_keeper::{Keeper, WorkEnded};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
    /// let key = lease_core::LeaseKey::new("cron/nightly-backup")?;
    /// match keeper.run_exclusive(&key, async { "backed up" }).await? {
    ///     WorkEnded::Finished(what) => println!("{what}"),
    ///     other => eprintln!("stopped early: {other:?}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// The acquire's: [`AcquireError`]. A failed release is not an error of
    /// the work: it is logged, and the key expires after its TTL.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` wherever it is and the lease with
    /// it, which is released in the background as any dropped lease is.
    pub async fn run_exclusive<F: Future>(
        &self,
        key: impl IntoLeaseKey,
        work: F,
    ) -> Result<crate::WorkEnded<F::Output>, AcquireError> {
        let lease = self.acquire(key).await?;
        let ended = lease.run(work).await;
        let key = lease.key().clone();
        if let Err(e) = lease.release().await {
            tracing::warn!(key = %key, error = %lease_core::ErrorChain::new(&e), "releasing after the exclusive work failed; the key expires after its TTL");
        }
        Ok(ended)
    }
}
