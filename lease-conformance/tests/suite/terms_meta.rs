//! Proof the term properties can fail: they run against a fake that cannot
//! tell the terms of one keeper apart — every holder id is cut back to the
//! keeper's own before it reaches the fake, as when a keeper reused one
//! holder id for every acquire — and must catch it (and pass on the healthy
//! fake, so they fail for the defect).

use std::sync::Arc;

use std::time::Duration;

use lease_conformance::faults::{self, FaultHooks, FaultKind, FaultPlan};
use lease_conformance::history::ViolationKind;
use lease_conformance::properties::{self, Property};
use lease_conformance::{Failure, FakeHarness, Harness, Outcome};
use lease_core::{Acquire, AcquireRequest, BoxFuture, Error, HolderId, LeaseBackend, LeaseLayer};
use lease_fake::Fake;

use crate::seeded::{runtime, Seeded};

/// The fake, seeing every term id of a holder as the holder's own id.
struct TermBlind {
    fake: Fake,
}

/// `holder` without the term part [`HolderId::term`] appends.
fn untermed(holder: HolderId) -> HolderId {
    match holder.as_str().rsplit_once('~') {
        Some((base, _)) => HolderId::new(base).unwrap_or(holder),
        None => holder,
    }
}

impl LeaseLayer for TermBlind {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn try_acquire(&self, mut req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        req.holder = untermed(req.holder);
        self.fake.try_acquire(req)
    }
}

fn catches_term_blindness(name: &str, property: Property) {
    let healthy = runtime().block_on(async { property(&FakeHarness::new()).await });
    assert_eq!(
        healthy,
        Ok(Outcome::Passed),
        "{name} must pass on the healthy fake"
    );
    let blind = runtime().block_on(async {
        let inner = FakeHarness::new();
        let blind = Arc::new(TermBlind {
            fake: inner.fake.clone(),
        });
        property(&Seeded::new("term-blind-fake", inner, blind)).await
    });
    match blind {
        Err(Failure(msg)) => eprintln!("{name} caught a term-blind backend: {msg}"),
        Ok(outcome) => {
            panic!("{name} did not catch a term-blind backend: it reported {outcome:?}")
        }
    }
}

#[test]
fn a_late_release_ending_the_next_term_is_caught() {
    catches_term_blindness(
        "a_new_term_never_overlaps_the_last",
        properties::a_new_term_never_overlaps_the_last,
    );
}

#[test]
fn two_tasks_sharing_one_grant_are_caught() {
    catches_term_blindness(
        "two_tasks_on_one_keeper_never_both_hold_a_key",
        properties::two_tasks_on_one_keeper_never_both_hold_a_key,
    );
}

/// The fake's harness, clock and fault hooks included, whose clients cannot
/// tell one keeper's terms apart.
struct TermBlindHarness {
    inner: FakeHarness,
}

impl Harness for TermBlindHarness {
    fn name(&self) -> &'static str {
        "term-blind-fake"
    }
    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        let c: Arc<dyn LeaseBackend> = Arc::new(TermBlind {
            fake: self.inner.fake.clone(),
        });
        Box::pin(async move { Ok(c) })
    }
    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        self.inner.pass(d)
    }
    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        self.inner.fault_hooks()
    }
}

#[test]
fn delayed_releases_catch_terms_that_share_a_grant() {
    let plan = FaultPlan::new(FaultKind::DelayedReleases(Duration::from_millis(75)))
        .ttl(Duration::from_millis(300))
        .duration(Duration::from_secs(4))
        .contenders(1)
        .elections(2);
    let report = runtime()
        .block_on(faults::run_unchecked(
            &TermBlindHarness {
                inner: FakeHarness::new(),
            },
            &plan,
        ))
        .unwrap_or_else(|f| panic!("{f}"));
    eprintln!("{report}");
    assert!(
        report.check.found(ViolationKind::WorkOverlap)
            || report.check.found(ViolationKind::Overlap),
        "delayed releases did not catch a backend that lets terms share a grant: {report}"
    );
}
