//! Proof the suite can fail: each property is run against a fake with one
//! seeded defect, and must catch it. A suite that passes a broken backend
//! proves nothing about the real ones.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_conformance::properties::{self, Property};
use lease_conformance::{Failure, FakeHarness, Harness, Outcome, Verdict};
use lease_core::{
    Acquire, AcquireRequest, BoxFuture, Error, Fence, Grant, LastBreak, LeaseBackend, LeaseKey,
    LeaseLayer, LeaseState, Payload, Renewal,
};
use lease_fake::Fake;

/// The defects a backend could plausibly have.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Defect {
    /// The fence counter restarts after a release (it lived in the deleted record).
    FenceReusedAfterRelease,
    /// Renew does not check that the grant is still ours.
    RenewSucceedsAfterTakeover,
    /// Release deletes the key whoever holds it (ShedLock's NATS unlock).
    ReleaseRemovesAnotherHolder,
    /// Acquire decides on a read taken before its write (check-then-act).
    TwoWinnersUnderConcurrency,
    /// Read refreshes or clears state as a side effect.
    ReadMutates,
    /// The deadline counts from the answer, not from the send.
    DeadlineIgnoresSendInstant,
    /// The fence counter lived in the record, so a record deleted outside
    /// the library restarts it (a lifecycle rule, `aws s3 rm`, `deleteOne`).
    FenceRestartsAfterOutsideDelete,
    /// A renew dropped after it was applied leaves the backend expecting a
    /// version the caller's grant does not carry, and the backend does not
    /// recognise its own write: the live grant can never be renewed again.
    CancelledRenewStrandsTheGrant,
    /// A break leaves no record the backend reads back, so a broken holder
    /// is told its lease expired.
    BreakIsForgotten,
    /// A re-acquire of one's own live grant writes the request's TTL over
    /// the grant's, so a shorter one ends the term before the deadline of
    /// the grant whose answer did arrive.
    ReacquireShortensTheTerm,
    /// The re-acquire keeps the live grant's TTL but answers the request's:
    /// the new grant object gives up writing long before the key runs out.
    ReacquireReportsAShorterTtl,
    /// A renewal writes the renewing grant's own TTL into the record: an
    /// earlier, shorter grant of a term that a re-acquire lengthened cuts
    /// the term short while the longer grant may still write.
    RenewWritesItsOwnTtl,
    /// Acquire takes a key another holder holds live (an expiry judged by a
    /// clock that runs ahead, a TTL stored in the wrong unit). Its answers
    /// come a few milliseconds late, so the next request is sent past the
    /// fake's shortest TTL in real time though the fake's clock has not
    /// moved: a property that excused a late grant on a simulated clock
    /// would miss it.
    TakesLiveKey,
}

/// A fake with one defect. Shared by all clients of a harness.
struct Broken {
    fake: Fake,
    defect: Defect,
    /// FenceReusedAfterRelease: per key, how far reported fences lag real ones,
    /// and whether a release happened since the last grant.
    lag: Mutex<HashMap<LeaseKey, (u64, bool)>>,
    /// FenceRestartsAfterOutsideDelete: the last real fence granted per key.
    last_real: Mutex<HashMap<LeaseKey, u64>>,
    /// CancelledRenewStrandsTheGrant: keys whose renew was dropped half-way.
    stranded: Arc<Mutex<std::collections::HashSet<LeaseKey>>>,
    /// ReacquireShortensTheTerm, RenewWritesItsOwnTtl: per key, the
    /// fake-clock instant at which the shortened grant runs out.
    cut: Mutex<HashMap<LeaseKey, Duration>>,
}

/// Marks its key stranded unless disarmed: dropped with the renew future.
struct StrandOnDrop {
    key: Option<LeaseKey>,
    stranded: Arc<Mutex<std::collections::HashSet<LeaseKey>>>,
}

impl Drop for StrandOnDrop {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            if let Ok(mut s) = self.stranded.lock() {
                s.insert(k);
            }
        }
    }
}

impl Broken {
    /// ReacquireShortensTheTerm: expires a grant whose shortened TTL ran out.
    fn cut_expired(&self, key: &LeaseKey) {
        let now = self.fake.now();
        if let Ok(mut m) = self.cut.lock() {
            if m.get(key).is_some_and(|at| now >= *at) {
                m.remove(key);
                self.fake.expire(key);
            }
        }
    }

    fn shown(&self, key: &LeaseKey, real: Fence) -> Fence {
        let lag = self
            .lag
            .lock()
            .map(|m| m.get(key).map_or(0, |e| e.0))
            .unwrap_or(0);
        Fence(real.0 - lag)
    }

    fn real(&self, g: &Grant) -> Grant {
        let lag = self
            .lag
            .lock()
            .map(|m| m.get(g.key()).map_or(0, |e| e.0))
            .unwrap_or(0);
        with_fence(g, Fence(g.fence().0 + lag), g.sent_at())
    }
}

fn with_fence(g: &Grant, fence: Fence, sent_at: Instant) -> Grant {
    Grant::new(
        g.key().clone(),
        g.holder().clone(),
        fence,
        g.ttl(),
        sent_at,
        g.version().clone(),
    )
    .with_timing(g.timing())
}

fn show_state(b: &Broken, key: &LeaseKey, s: LeaseState) -> LeaseState {
    match s {
        LeaseState::Held(mut h) => {
            h.fence = b.shown(key, h.fence);
            LeaseState::Held(h)
        }
        free => free,
    }
}

impl LeaseLayer for Broken {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            let key = req.key.clone();
            let holder = req.holder.clone();
            let ttl = req.ttl;
            match self.defect {
                Defect::FenceReusedAfterRelease | Defect::FenceRestartsAfterOutsideDelete => {
                    let r = self.fake.try_acquire(req).await?;
                    if let Acquire::Granted(g) = &r {
                        if let Ok(mut m) = self.last_real.lock() {
                            m.insert(key.clone(), g.fence().0);
                        }
                        if let Ok(mut m) = self.lag.lock() {
                            let e = m.entry(key.clone()).or_insert((0, false));
                            if e.1 {
                                e.0 += 1;
                                e.1 = false;
                            }
                            let _ = g;
                        }
                    }
                    Ok(match r {
                        Acquire::Granted(g) => Acquire::Granted(with_fence(
                            &g,
                            self.shown(&key, g.fence()),
                            g.sent_at(),
                        )),
                        Acquire::Held(mut h) => {
                            h.fence = self.shown(&key, h.fence);
                            Acquire::Held(h)
                        }
                    })
                }
                Defect::TwoWinnersUnderConcurrency => {
                    let before = self.fake.read(&key).await?;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let sent = Instant::now();
                    match self.fake.try_acquire(req).await? {
                        Acquire::Held(h) if before.is_free() => {
                            let ttl = self.fake.capabilities().ttl.effective(ttl)?;
                            Ok(Acquire::Granted(Grant::new(
                                key,
                                holder,
                                Fence(h.fence.0 + 1),
                                ttl,
                                sent,
                                Default::default(),
                            )))
                        }
                        other => Ok(other),
                    }
                }
                Defect::ReacquireShortensTheTerm | Defect::ReacquireReportsAShorterTtl => {
                    self.cut_expired(&key);
                    let ttl = self.fake.capabilities().ttl.effective(ttl)?;
                    let ours = matches!(self.fake.read(&key).await?, LeaseState::Held(h) if h.holder == holder);
                    Ok(match self.fake.try_acquire(req).await? {
                        Acquire::Granted(g) if ours && ttl < g.ttl() => {
                            if self.defect == Defect::ReacquireShortensTheTerm {
                                if let Ok(mut m) = self.cut.lock() {
                                    m.insert(key.clone(), self.fake.now() + ttl);
                                }
                            }
                            Acquire::Granted(
                                Grant::new(
                                    key,
                                    holder,
                                    g.fence(),
                                    ttl,
                                    g.sent_at(),
                                    g.version().clone(),
                                )
                                .with_timing(g.timing()),
                            )
                        }
                        other => other,
                    })
                }
                Defect::RenewWritesItsOwnTtl => {
                    self.cut_expired(&key);
                    self.fake.try_acquire(req).await
                }
                Defect::TakesLiveKey => {
                    if matches!(self.fake.read(&key).await?, LeaseState::Held(h) if h.holder != holder)
                    {
                        self.fake.expire(&key);
                    }
                    let answer = self.fake.try_acquire(req).await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    answer
                }
                Defect::DeadlineIgnoresSendInstant => {
                    Ok(match self.fake.try_acquire(req).await? {
                        Acquire::Granted(g) => {
                            Acquire::Granted(with_fence(&g, g.fence(), Instant::now()))
                        }
                        held => held,
                    })
                }
                _ => self.fake.try_acquire(req).await,
            }
        })
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            match self.defect {
                Defect::FenceReusedAfterRelease | Defect::FenceRestartsAfterOutsideDelete => {
                    Ok(match self.fake.renew(&self.real(grant), payload).await? {
                        Renewal::Renewed(g) => {
                            Renewal::Renewed(with_fence(&g, grant.fence(), g.sent_at()))
                        }
                        Renewal::Lost => Renewal::Lost,
                    })
                }
                Defect::RenewSucceedsAfterTakeover => {
                    Ok(match self.fake.renew(grant, payload).await? {
                        Renewal::Lost => {
                            Renewal::Renewed(grant.renewed(Instant::now(), grant.version().clone()))
                        }
                        renewed => renewed,
                    })
                }
                Defect::DeadlineIgnoresSendInstant => {
                    Ok(match self.fake.renew(grant, payload).await? {
                        Renewal::Renewed(g) => {
                            Renewal::Renewed(g.renewed(Instant::now(), g.version().clone()))
                        }
                        lost => lost,
                    })
                }
                Defect::RenewWritesItsOwnTtl => {
                    let key = grant.key();
                    self.cut_expired(key);
                    let stored = match self.fake.read(key).await? {
                        LeaseState::Held(h) => Some(h.ttl),
                        _ => None,
                    };
                    let r = self.fake.renew(grant, payload).await?;
                    if let (Renewal::Renewed(_), Some(stored)) = (&r, stored) {
                        if let Ok(mut m) = self.cut.lock() {
                            if grant.ttl() < stored {
                                m.insert(key.clone(), self.fake.now().saturating_add(grant.ttl()));
                            } else {
                                m.remove(key);
                            }
                        }
                    }
                    Ok(r)
                }
                Defect::CancelledRenewStrandsTheGrant => {
                    if self
                        .stranded
                        .lock()
                        .map(|s| s.contains(grant.key()))
                        .unwrap_or(false)
                    {
                        return Ok(Renewal::Lost);
                    }
                    let mut guard = StrandOnDrop {
                        key: Some(grant.key().clone()),
                        stranded: self.stranded.clone(),
                    };
                    let r = self.fake.renew(grant, payload).await?;
                    // The answer travels back: an await point after the
                    // renewal was applied.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    guard.key = None;
                    Ok(r)
                }
                _ => self.fake.renew(grant, payload).await,
            }
        })
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            match self.defect {
                Defect::FenceReusedAfterRelease => {
                    let real = self.real(grant);
                    let was_ours = matches!(self.fake.read(grant.key()).await?, LeaseState::Held(h) if h.fence == real.fence());
                    self.fake.release(&real).await?;
                    if was_ours {
                        if let Ok(mut m) = self.lag.lock() {
                            m.entry(grant.key().clone()).or_insert((0, false)).1 = true;
                        }
                    }
                    Ok(())
                }
                Defect::FenceRestartsAfterOutsideDelete => {
                    self.fake.release(&self.real(grant)).await
                }
                Defect::ReleaseRemovesAnotherHolder => {
                    self.fake.release(grant).await?;
                    self.fake.expire(grant.key());
                    Ok(())
                }
                _ => self.fake.release(grant).await,
            }
        })
    }

    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(async move {
            match self.defect {
                Defect::BreakIsForgotten => Ok(None),
                _ => self.fake.last_break(key).await,
            }
        })
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(async move {
            if self.defect == Defect::RenewWritesItsOwnTtl {
                self.cut_expired(key);
            }
            let s = self.fake.read(key).await?;
            match self.defect {
                Defect::FenceReusedAfterRelease | Defect::FenceRestartsAfterOutsideDelete => {
                    Ok(show_state(self, key, s))
                }
                Defect::ReadMutates => {
                    self.fake.expire(key);
                    Ok(s)
                }
                _ => Ok(s),
            }
        })
    }
}

struct BrokenHarness {
    inner: FakeHarness,
    broken: Arc<Broken>,
}

impl BrokenHarness {
    fn new(defect: Defect) -> Self {
        let inner = FakeHarness::new();
        let broken = Arc::new(Broken {
            fake: inner.fake.clone(),
            defect,
            lag: Mutex::default(),
            last_real: Mutex::default(),
            stranded: Arc::default(),
            cut: Mutex::default(),
        });
        BrokenHarness { inner, broken }
    }
}

impl Harness for BrokenHarness {
    fn name(&self) -> &'static str {
        "broken-fake"
    }
    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        let c: Arc<dyn LeaseBackend> = self.broken.clone();
        Box::pin(async move { Ok(c) })
    }
    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        self.inner.pass(d)
    }
    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        self.inner.write_corrupt(key)
    }
    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        if self.broken.defect == Defect::FenceRestartsAfterOutsideDelete {
            // Fences shown from now on restart at 1.
            let last = self
                .broken
                .last_real
                .lock()
                .map_or(0, |m| m.get(key).copied().unwrap_or(0));
            if let Ok(mut m) = self.broken.lag.lock() {
                m.insert(key.clone(), (last, false));
            }
        }
        self.inner.delete_outside(key)
    }
    fn set_latency(&self, latency: Duration) -> bool {
        self.inner.set_latency(latency)
    }
    fn model_cases(&self) -> u32 {
        256
    }
}

fn verdict(defect: Defect, property: Property) -> Verdict {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let h = BrokenHarness::new(defect);
        property(&h).await
    })
}

/// Asserts that `property` catches `defect`, and that it passes on the
/// healthy fake (so it fails for the defect, not for some other reason).
fn caught(defect: Defect, name: &str, property: Property) {
    let healthy = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async { property(&FakeHarness::new()).await });
    assert_eq!(
        healthy,
        Ok(Outcome::Passed),
        "{name} must pass on the healthy fake"
    );
    match verdict(defect, property) {
        Err(Failure(msg)) => eprintln!("{defect:?} caught by {name}: {msg}"),
        Ok(outcome) => panic!("{name} did not catch {defect:?}: it reported {outcome:?}"),
    }
}

#[test]
fn fence_reused_after_release_is_caught() {
    caught(
        Defect::FenceReusedAfterRelease,
        "fences_increase",
        properties::fences_increase,
    );
    caught(
        Defect::FenceReusedAfterRelease,
        "release_frees_the_key",
        properties::release_frees_the_key,
    );
    caught(
        Defect::FenceReusedAfterRelease,
        "model_interleavings",
        properties::model_interleavings,
    );
}

#[test]
fn renew_after_takeover_is_caught() {
    caught(
        Defect::RenewSucceedsAfterTakeover,
        "renew_after_takeover_is_lost",
        properties::renew_after_takeover_is_lost,
    );
    caught(
        Defect::RenewSucceedsAfterTakeover,
        "model_interleavings",
        properties::model_interleavings,
    );
}

#[test]
fn release_removing_another_holder_is_caught() {
    caught(
        Defect::ReleaseRemovesAnotherHolder,
        "release_of_lost_grant_leaves_new_holder",
        properties::release_of_lost_grant_leaves_new_holder,
    );
    caught(
        Defect::ReleaseRemovesAnotherHolder,
        "model_interleavings",
        properties::model_interleavings,
    );
}

#[test]
fn two_winners_under_concurrency_are_caught() {
    caught(
        Defect::TwoWinnersUnderConcurrency,
        "exactly_one_winner",
        properties::exactly_one_winner,
    );
}

#[test]
fn read_that_mutates_is_caught() {
    caught(
        Defect::ReadMutates,
        "read_changes_nothing",
        properties::read_changes_nothing,
    );
    caught(
        Defect::ReadMutates,
        "model_interleavings",
        properties::model_interleavings,
    );
}

#[test]
fn fence_restarting_after_an_outside_delete_is_caught() {
    caught(
        Defect::FenceRestartsAfterOutsideDelete,
        "outside_delete_keeps_fences_rising",
        properties::outside_delete_keeps_fences_rising,
    );
}

#[test]
fn a_grant_stranded_by_a_cancelled_renew_is_caught() {
    caught(
        Defect::CancelledRenewStrandsTheGrant,
        "cancelled_operations_leave_the_contract_intact",
        properties::cancelled_operations_leave_the_contract_intact,
    );
}

#[test]
fn a_forgotten_break_is_caught() {
    caught(
        Defect::BreakIsForgotten,
        "break_frees_the_key_and_keeps_fences_rising",
        properties::break_frees_the_key_and_keeps_fences_rising,
    );
    caught(
        Defect::BreakIsForgotten,
        "keeper_reports_a_break_as_broken",
        properties::keeper_reports_a_break_as_broken,
    );
}

#[test]
fn a_reacquire_that_shortens_the_term_is_caught() {
    caught(
        Defect::ReacquireShortensTheTerm,
        "reacquire_with_a_shorter_ttl_keeps_the_term",
        properties::reacquire_with_a_shorter_ttl_keeps_the_term,
    );
    caught(
        Defect::ReacquireReportsAShorterTtl,
        "reacquire_with_a_shorter_ttl_keeps_the_term",
        properties::reacquire_with_a_shorter_ttl_keeps_the_term,
    );
}

#[test]
fn a_renewal_that_writes_its_own_shorter_ttl_is_caught() {
    caught(
        Defect::RenewWritesItsOwnTtl,
        "renewing_an_earlier_grant_keeps_the_longer_term",
        properties::renewing_an_earlier_grant_keeps_the_longer_term,
    );
}

#[test]
fn deadline_ignoring_the_send_instant_is_caught() {
    caught(
        Defect::DeadlineIgnoresSendInstant,
        "deadline_counts_from_the_send_instant",
        properties::deadline_counts_from_the_send_instant,
    );
}

#[test]
fn a_grant_of_a_live_key_is_caught() {
    caught(
        Defect::TakesLiveKey,
        "after_expiry_another_holder_acquires",
        properties::after_expiry_another_holder_acquires,
    );
    caught(
        Defect::TakesLiveKey,
        "fences_increase",
        properties::fences_increase,
    );
    caught(
        Defect::TakesLiveKey,
        "release_of_lost_grant_leaves_new_holder",
        properties::release_of_lost_grant_leaves_new_holder,
    );
}

/// Every defect is caught by the suite as a whole, and the healthy fake passes it all.
#[test]
fn the_whole_suite_fails_every_broken_backend() {
    let all = [
        Defect::FenceReusedAfterRelease,
        Defect::RenewSucceedsAfterTakeover,
        Defect::ReleaseRemovesAnotherHolder,
        Defect::TwoWinnersUnderConcurrency,
        Defect::ReadMutates,
        Defect::DeadlineIgnoresSendInstant,
        Defect::FenceRestartsAfterOutsideDelete,
        Defect::CancelledRenewStrandsTheGrant,
        Defect::BreakIsForgotten,
        Defect::ReacquireShortensTheTerm,
        Defect::ReacquireReportsAShorterTtl,
        Defect::RenewWritesItsOwnTtl,
        Defect::TakesLiveKey,
    ];
    for defect in all {
        let failed: Vec<&str> = properties::ALL
            .iter()
            .filter(|(_, p)| verdict(defect, *p).is_err())
            .map(|(name, _)| *name)
            .collect();
        assert!(!failed.is_empty(), "no property caught {defect:?}");
        eprintln!("{defect:?} caught by {failed:?}");
    }
}

/// The macro's list of tests and the `ALL` table name the same properties.
#[test]
fn the_macro_lists_every_property() {
    let runner = include_str!("../../src/runner.rs");
    let start = runner
        .find("macro_rules! conformance_tests")
        .expect("macro present");
    let body = &runner[start..];
    let body = &body[..body.find("};").expect("macro end")];
    let listed = body
        .lines()
        .filter(|l| {
            l.trim()
                .trim_end_matches(',')
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_')
                && !l.trim().is_empty()
        })
        .count();
    assert_eq!(
        listed,
        properties::ALL.len(),
        "conformance_tests! lists {listed} properties, ALL has {}",
        properties::ALL.len()
    );
    for (name, _) in properties::ALL {
        assert!(
            body.contains(name),
            "conformance_tests! does not run {name}"
        );
    }
}
