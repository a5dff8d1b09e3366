//! Terms: each acquire through a keeper is a grant of its own, end to end.
//! A late release of a dropped term never ends the next one, each new term's
//! fence is above the last, and two tasks sharing a keeper never both hold a
//! key.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{BoxFuture, Error, Grant, LeaseBackend, LeaseKey, LeaseLayer, Payload};
use lease_keeper::{AcquireError, Lease};
use tokio::time::{sleep, timeout, Instant};

use super::keeper::{keeper_on, keeper_ttl};
use super::{clients, key, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// A client whose releases reach the backend only `delay` after they are
/// sent: a release in flight while its holder already acquires again.
pub struct SlowRelease {
    inner: Arc<dyn LeaseBackend>,
    delay: Duration,
}

impl std::fmt::Debug for SlowRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowRelease")
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl SlowRelease {
    /// Wraps `inner`, delaying every release by `delay`.
    pub fn new(inner: Arc<dyn LeaseBackend>, delay: Duration) -> Arc<Self> {
        Arc::new(SlowRelease { inner, delay })
    }
}

impl LeaseLayer for SlowRelease {
    fn inner(&self) -> &dyn LeaseBackend {
        &*self.inner
    }
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            sleep(self.delay).await;
            self.inner.release(grant).await
        })
    }
}

/// A client whose releases time out at once — the caller is told their
/// outcome is unknown ([`Error::Unavailable`]) — and still reach the
/// backend `delay` later: a release held by the network (a blackhole lets
/// the bytes through when it lifts) after its caller gave up on it.
pub struct LateRelease {
    inner: Arc<dyn LeaseBackend>,
    delay: Duration,
}

impl std::fmt::Debug for LateRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LateRelease")
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl LateRelease {
    /// Wraps `inner`: every release answers "unknown" at once and reaches
    /// `inner` `delay` later (on a task of its own, which needs a tokio
    /// runtime).
    pub fn new(inner: Arc<dyn LeaseBackend>, delay: Duration) -> Arc<Self> {
        Arc::new(LateRelease { inner, delay })
    }
}

impl LeaseLayer for LateRelease {
    fn inner(&self) -> &dyn LeaseBackend {
        &*self.inner
    }
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        let (inner, grant, delay) = (self.inner.clone(), grant.clone(), self.delay);
        tokio::spawn(async move {
            sleep(delay).await;
            let _ = inner.release(&grant).await;
        });
        Box::pin(async move {
            Err(Error::Unavailable {
                detail: format!("release timed out; it reaches the backend {delay:?} later"),
                source: None,
            })
        })
    }
}

/// How long the properties here wait for a key to be granted.
fn patience(ttl: Duration) -> Duration {
    Duration::from_secs(10) + ttl * 4
}

/// A holder drops its lease (or its leadership) and acquires the key again at
/// once, while the first term's release is still on its way: the new term's
/// fence is above the first's, and no other holder is granted the key while
/// the new term may still write — not when the late release lands, nor
/// after.
pub fn a_new_term_never_overlaps_the_last(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("terms-late-release");
        let cs = clients(h, 2).await?;
        let ttl = keeper_ttl(&cs[0].capabilities());
        let delay = (ttl / 4).clamp(Duration::from_millis(100), Duration::from_millis(500));
        let a = keeper_on(SlowRelease::new(cs[0].clone(), delay));
        let b = keeper_on(cs[1].clone());
        let limit = patience(ttl);

        // A lease dropped, then taken again.
        let first = a
            .try_acquire(&key)
            .ttl(ttl)
            .await
            .map_err(|e| Failure(format!("a fresh key {key} was refused: {e}")))?;
        let f1 = first.fence();
        drop(first);
        let second = a
            .acquire(&key)
            .ttl(ttl)
            .wait(limit)
            .await
            .map_err(|e| Failure(format!("the second term of {key} was not granted: {e}")))?;
        ensure!(
            second.fence() > f1,
            "the second term of {key} got fence {}, not above the first term's {f1}",
            second.fence()
        );
        no_other_holder_while(&b, &key, ttl, &second, delay + ttl / 2).await?;
        let f2 = second.fence();
        drop(second);

        // A leadership dropped, then campaigned for again.
        let election = a.election(&key).with_ttl(ttl);
        let lead = election
            .campaign(Payload::empty())
            .wait(limit)
            .await
            .map_err(|e| Failure(format!("the third term of {key} was not granted: {e}")))?;
        ensure!(
            lead.fence() > f2,
            "the campaign's term got fence {}, not above the dropped lease's {f2}",
            lead.fence()
        );
        let f3 = lead.fence();
        drop(lead);
        let again = election
            .campaign(Payload::empty())
            .wait(limit)
            .await
            .map_err(|e| Failure(format!("the recampaign on {key} was not granted: {e}")))?;
        ensure!(
            again.fence() > f3,
            "the recampaign's term got fence {}, not above the dropped leadership's {f3}",
            again.fence()
        );
        no_other_holder_while(&b, &key, ttl, &again, delay + ttl / 2).await?;
        again.resign().await?;
        Ok(Outcome::Passed)
    })
}

/// For `span`, another keeper tries `key` again and again; it must never be
/// granted while `term` may still write.
async fn no_other_holder_while(
    other: &lease_keeper::Keeper,
    key: &LeaseKey,
    ttl: Duration,
    term: &lease_keeper::LeaseView,
    span: Duration,
) -> Result<(), Failure> {
    let end = Instant::now() + span;
    while Instant::now() < end {
        match timeout(ttl, other.try_acquire(key).ttl(ttl)).await {
            Ok(Ok(l)) => {
                let overlap = term.may_write();
                let fence = l.fence();
                let _ = l.release().await;
                ensure!(
                    !overlap,
                    "another holder was granted {key} with fence {fence} while the term with fence {} may still write",
                    term.fence()
                );
                return Ok(());
            }
            Ok(Err(AcquireError::Held { .. })) | Err(_) => {}
            Ok(Err(AcquireError::Backend(e))) if e.is_unknown_outcome() => {}
            Ok(Err(e)) => return Err(Failure(format!("another holder's try on {key}: {e}"))),
        }
        sleep(ttl / 20).await;
    }
    Ok(())
}

/// Two tasks share one keeper (it is cheap to clone): while one holds a key
/// the other's `try_acquire` is refused, naming the first term, and its
/// waiting `acquire` gets the key only after the first released it, with a
/// higher fence.
pub fn two_tasks_on_one_keeper_never_both_hold_a_key(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("terms-two-tasks");
        let cs = clients(h, 1).await?;
        let ttl = keeper_ttl(&cs[0].capabilities());
        let keeper = keeper_on(cs[0].clone());
        let first = keeper
            .try_acquire(&key)
            .ttl(ttl)
            .await
            .map_err(|e| Failure(format!("a fresh key {key} was refused: {e}")))?;
        match keeper.clone().try_acquire(&key).ttl(ttl).await {
            Err(AcquireError::Held { holder, fence, .. }) => ensure!(
                &holder == first.holder() && fence == first.fence(),
                "the refusal names {holder} with fence {fence}, not the first task's term {} with fence {}",
                first.holder(),
                first.fence()
            ),
            Ok(l) => {
                return Err(Failure(format!(
                    "a second task on the same keeper was granted {key} (fence {}) while the first holds it (fence {})",
                    l.fence(),
                    first.fence()
                )))
            }
            Err(e) => return Err(Failure(format!("the second task's try on {key}: {e}"))),
        }
        let waiter = {
            let (keeper, key) = (keeper.clone(), key.clone());
            tokio::spawn(async move { keeper.acquire(&key).ttl(ttl).wait(patience(ttl)).await })
        };
        sleep(ttl / 4).await;
        ensure!(
            !waiter.is_finished(),
            "a second task's waiting acquire of {key} ended while the first task holds it"
        );
        let f1 = first.fence();
        release(first).await?;
        let second = match timeout(patience(ttl), waiter).await {
            Ok(Ok(Ok(l))) => l,
            Ok(Ok(Err(e))) => return Err(Failure(format!("the second task's acquire: {e}"))),
            Ok(Err(e)) => return Err(Failure(format!("the second task panicked: {e}"))),
            Err(_) => return Err(Failure("the second task's acquire never ended".into())),
        };
        ensure!(
            second.fence() > f1,
            "the second task's fence {} is not above the first's {f1}",
            second.fence()
        );
        release(second).await?;
        Ok(Outcome::Passed)
    })
}

async fn release(l: Lease) -> Result<(), Failure> {
    l.release().await.map_err(Failure::from)
}
