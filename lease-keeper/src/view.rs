//! [`LeaseView`]: what a kept lease knows about itself, the same for a
//! [`Lease`](crate::Lease) and a [`GroupLease`](crate::GroupLease).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Fence, Grant, HolderId, LeaseKey, Payload};
use tokio::time::Instant;

use crate::loss::LossReason;
use crate::state::{LossWatch, Shared};

/// What a kept lease knows about itself: its key and fence, whether a write
/// may start, its deadline, payload and loss.
///
/// [`Lease`](crate::Lease) and [`GroupLease`](crate::GroupLease) both
/// dereference to it, so every method here is theirs too. A `LeaseView` does
/// not hold the lease: cloning one, or dropping the clone, changes nothing.
#[derive(Clone)]
pub struct LeaseView {
    pub(crate) shared: Arc<Shared>,
}

impl LeaseView {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        LeaseView { shared }
    }

    /// The key.
    pub fn key(&self) -> &LeaseKey {
        &self.shared.key
    }

    /// Who holds it: this term's own holder id, drawn from the keeper's
    /// ([`HolderId::term`]).
    pub fn holder(&self) -> &HolderId {
        &self.shared.holder
    }

    /// The fencing token: stamp every write with it.
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// The effective TTL the backend granted.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// Whether a write may start now: false after [`deadline()`](LeaseView::deadline)
    /// and after loss.
    pub fn may_write(&self) -> bool {
        self.shared.may_write()
    }

    /// The write deadline on tokio's clock: the send instant of the last
    /// successful renewal (or of the acquire) plus the safe fraction of the
    /// TTL. Moves forward with every successful renewal and never otherwise.
    ///
    /// It is [`grant()`](LeaseView::grant)'s [`Grant::deadline`] itself,
    /// as a [`tokio::time::Instant`]: `lease.deadline().into_std() ==
    /// lease.grant().deadline()`. The keeper's types speak tokio's because
    /// its timers do, and because tokio's clock is the one a paused test
    /// runtime (`tokio::time::pause`) moves; `lease-core`'s `Grant` has no
    /// dependencies, so it speaks `std`'s.
    pub fn deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// The send instant (tokio's clock) of the last successful renewal, or of
    /// the acquire.
    pub fn refreshed_at(&self) -> Instant {
        self.shared.sent()
    }

    /// The grant as last established or renewed. Its deadline is the lease's
    /// own; its `may_write()` knows only time, not loss.
    pub fn grant(&self) -> Grant {
        self.shared.grant()
    }

    /// How many renewals have succeeded.
    pub fn renewals(&self) -> u64 {
        self.shared.live().renewals
    }

    /// The payload the backend last accepted.
    pub fn payload(&self) -> Payload {
        self.shared.live().payload.clone()
    }

    /// Replaces the payload on the next renewal (retried until one succeeds).
    pub fn set_payload(&self, payload: Payload) {
        self.shared.set_payload(payload);
    }

    /// The loss reason, if the lease is lost.
    pub fn loss(&self) -> Option<LossReason> {
        self.shared.loss()
    }

    /// Resolves when the lease is lost, with the reason.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: it only watches. A loss is never consumed:
    /// a later call, or [`loss()`](LeaseView::loss), still sees one that
    /// happened while no call was waiting.
    pub async fn lost(&self) -> LossReason {
        self.shared.lost().await
    }

    /// Whether a write may start, as a watch: `true` while
    /// [`may_write()`](LeaseView::may_write) is, turning `false` the moment it
    /// is not — at the [`deadline()`](LeaseView::deadline) even if the backend
    /// never answers, and on loss — and never `true` again. For a readiness
    /// probe, or to stop work with `changed()`. Called outside a tokio
    /// runtime, it turns false on loss only.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use lease_keeper::Keeper;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
    /// # let key = lease_core::LeaseKey::new("svc/primary")?;
    /// let lease = keeper.try_acquire(&key).ttl(Duration::from_secs(10)).await?;
    /// let mut writable = lease.writable();
    /// assert!(*writable.borrow());
    /// lease.release().await?;
    /// writable.wait_for(|w| !w).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn writable(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shared.writable()
    }

    /// A detached loss notification, to move into another task.
    pub fn loss_watch(&self) -> LossWatch {
        LossWatch::new(self.shared.subscribe())
    }
}

impl fmt::Debug for LeaseView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseView")
            .field("key", &self.shared.key)
            .field("holder", &self.shared.holder)
            .field("fence", &self.shared.fence)
            .field("ttl", &self.shared.ttl)
            .field("may_write", &self.may_write())
            .field("loss", &self.loss())
            .finish()
    }
}
