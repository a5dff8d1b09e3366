//! [`Leadership`]: a won campaign — proclaim, resign — and [`Resigner`], to
//! resign from elsewhere.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use lease_core::{Error, LeaseBackend, Payload};
use tokio::time::timeout;

use crate::lease::Lease;
use crate::loss::LossReason;
use crate::renew::{release, renew_attempt, Step};
use crate::state::Shared;
use crate::view::LeaseView;

/// Leadership of an election, won by [`Election::campaign`](crate::Election::campaign):
/// the kept lease on the election's key, renewed in the background.
///
/// It dereferences to the lease's [`LeaseView`]: stamp writes with
/// [`fence()`](LeaseView::fence), check [`may_write()`](LeaseView::may_write)
/// (false after the write [`deadline()`](LeaseView::deadline) and on loss),
/// await [`lost()`](LeaseView::lost). The advertised value is its
/// [`payload()`](LeaseView::payload).
///
/// * [`proclaim`](Leadership::proclaim) advertises a new value now;
/// * [`run`](Leadership::run) runs work only while leading;
/// * [`resign`](Leadership::resign) hands over at once; dropping a
///   `Leadership` resigns in the background instead (never blocking);
/// * [`resigner`](Leadership::resigner) resigns from another task, e.g. to
///   end a `run` on shutdown.
#[must_use = "dropping a Leadership resigns at once (a release sent in the background)"]
pub struct Leadership {
    lease: Lease,
    backend: Arc<dyn LeaseBackend>,
}

impl Leadership {
    pub(crate) fn new(lease: Lease, backend: Arc<dyn LeaseBackend>) -> Self {
        Leadership { lease, backend }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.lease.shared
    }

    /// Replaces the advertised value now: a renewal carrying `value`, sent at
    /// once (it also moves the write deadline forward). Leadership is kept.
    /// The next background renewal carries the value once more, so that a
    /// renewal already in flight when proclaiming cannot leave the old value
    /// behind for longer than one renew interval.
    ///
    /// Refused, with nothing sent, when a write may no longer start
    /// ([`may_write()`](LeaseView::may_write) is false: lost, resigned, or
    /// past the write deadline). If the renewal answers that the grant is
    /// gone, the leadership is lost and nothing was written: the backend
    /// renews only the live grant, so a leader that lost the key never
    /// overwrites its successor's value.
    ///
    /// # Errors
    /// [`ProclaimError::Lost`] when this process no longer leads (nothing
    /// written); [`ProclaimError::Backend`] when the renewal failed or got no
    /// answer before the write deadline: its outcome is unknown, and the value
    /// stays pending — the background renewals go on sending it until one
    /// succeeds (as [`set_payload`](LeaseView::set_payload) does).
    ///
    /// # Cancel safety
    ///
    /// This method is not cancel safe, but retrying is. A future dropped
    /// after its first poll leaves `value` pending: the background renewals
    /// send it, and the renewal in flight may or may not have stored it.
    pub async fn proclaim(&self, value: Payload) -> Result<(), ProclaimError> {
        let shared = self.shared();
        if !shared.may_write() {
            let dropped = crate::work::Dropped::now(shared);
            return Err(ProclaimError::Lost(
                crate::work::ended(shared, dropped).await,
            ));
        }
        shared.set_payload(value.clone());
        match renew_attempt(&self.backend, shared, shared.deadline()).await {
            Step::Renewed => {
                // A background renewal already in flight may still land
                // after this one and, on a backend that renews by
                // read-modify-write, put the old value back. The next
                // background renewal is sent only after that one answered:
                // it carries the value again, unless a newer one is pending.
                let mut live = shared.live();
                if live.next_payload.is_none() {
                    live.next_payload = Some(value);
                }
                Ok(())
            }
            Step::Lost => Err(ProclaimError::Lost(
                shared.loss().unwrap_or(LossReason::Expired),
            )),
            Step::Retry => Err(ProclaimError::Backend(Error::Unavailable {
                detail: format!(
                    "the renewal carrying the new value of {} failed or got no answer before \
                     the write deadline; its outcome is unknown, and later renewals send the \
                     value again",
                    shared.key
                ),
                source: None,
            })),
        }
    }

    /// Hands over now: releases the key, so a waiting candidate is woken at
    /// once (by the backend's watch, or at its next poll).
    /// [`may_write()`](LeaseView::may_write) is false before the release is
    /// sent. For a graceful handover, let the work return first, then resign.
    ///
    /// # Errors
    /// As [`Lease::release`]: the backend's error, after which the key expires
    /// by itself after its TTL.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe, as [`Lease::release`] is: the release goes
    /// on in a task of its own if this future is dropped.
    pub async fn resign(self) -> Result<(), Error> {
        self.lease.release().await
    }

    /// A handle that resigns this leadership from elsewhere — another task,
    /// a shutdown hook — while [`run`](Leadership::run) is under way, which
    /// then ends with [`WorkEnded::Resigned`](crate::WorkEnded::Resigned).
    pub fn resigner(&self) -> Resigner {
        Resigner {
            shared: self.shared().clone(),
            backend: self.backend.clone(),
        }
    }

    /// The kept lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

impl Deref for Leadership {
    type Target = LeaseView;

    /// What the leadership's lease knows about itself: fence, deadline,
    /// value (payload), loss.
    fn deref(&self) -> &LeaseView {
        &self.lease
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("key", self.key())
            .field("holder", self.holder())
            .field("fence", &self.fence())
            .field("may_write", &self.may_write())
            .field("loss", &self.loss())
            .finish()
    }
}

/// Resigns a [`Leadership`] from another task; from
/// [`Leadership::resigner`]. Cheap to clone. It does not hold the
/// leadership: dropping it changes nothing.
#[derive(Clone)]
pub struct Resigner {
    shared: Arc<Shared>,
    backend: Arc<dyn LeaseBackend>,
}

impl Resigner {
    /// Resigns: [`may_write()`](LeaseView::may_write) turns false at once
    /// (a [`run`](Leadership::run) under way drops its work and ends with
    /// [`WorkEnded::Resigned`](crate::WorkEnded::Resigned)), then, once that
    /// work has been dropped, the key is released so a waiting candidate is
    /// woken. Work stuck in one long poll delays the release, by at most
    /// the TTL; work stuck longer than that outlives its grant as any work
    /// past its deadline does, and only the resource's fence check stops its
    /// writes. Resigning a leadership that is already over sends nothing that
    /// could touch a successor.
    ///
    /// # Errors
    /// The release's error, as [`Leadership::resign`].
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: its first poll ends the leadership and
    /// hands the wait for the work and the release to a task of its own,
    /// which goes on if this future is dropped.
    pub async fn resign(&self) -> Result<(), Error> {
        let (shared, backend) = (self.shared.clone(), self.backend.clone());
        shared.lose(LossReason::Released);
        let resign = async move {
            // Bounded by the TTL: after it, the grant has expired anyway.
            let _ = timeout(shared.ttl, shared.work_dropped()).await;
            release(&backend, &shared, LossReason::Released)
                .outcome()
                .await
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => rt.spawn(resign).await.unwrap_or_else(|e| {
                Err(Error::Unavailable {
                    detail: format!("the resign task ended without an answer: {e}"),
                    source: None,
                })
            }),
            Err(_) => resign.await,
        }
    }
}

impl fmt::Debug for Resigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resigner")
            .field("key", &self.shared.key)
            .field("holder", &self.shared.holder)
            .field("fence", &self.shared.fence)
            .finish()
    }
}

/// Why [`Leadership::proclaim`] did not advertise the value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProclaimError {
    /// This process no longer leads (the reason says why). Nothing was
    /// written, unless the reason is [`LossReason::DeadlinePassed`]: a
    /// renewal carrying the value that was answered at the very instant of
    /// the write deadline stored it as the leadership ended, so observers
    /// may see it until the next leader proclaims its own.
    #[error("no longer leader ({0}); {value}", value = lost_value(.0))]
    Lost(LossReason),
    /// The renewal carrying the value failed or got no answer in time: its
    /// outcome is unknown, and later renewals send the value again.
    #[error(transparent)]
    Backend(Error),
}

/// What became of a value whose proclaim found the leadership lost.
fn lost_value(reason: &LossReason) -> &'static str {
    match reason {
        LossReason::DeadlinePassed => {
            "the value was not written, or was stored as the write deadline passed"
        }
        _ => "the value was not written",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value a renewal stored as the deadline passed is not reported as
    /// never written.
    #[test]
    fn a_proclaim_lost_at_the_deadline_does_not_say_nothing_was_written() {
        let late = ProclaimError::Lost(LossReason::DeadlinePassed).to_string();
        assert!(late.contains("or was stored"), "{late}");
        let refused = ProclaimError::Lost(LossReason::Expired).to_string();
        assert!(refused.ends_with("the value was not written"), "{refused}");
    }
}
