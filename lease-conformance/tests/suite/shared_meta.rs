//! Proof the shared/exclusive and permit properties can fail: each runs
//! against a fake with one seeded defect in what the primitives rely on,
//! must catch it, and must pass on the healthy fake (so it fails for the
//! defect).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lease_conformance::properties::{self, Property};
use lease_conformance::{Failure, FakeHarness, Outcome};
use lease_core::{
    Acquire, AcquireRequest, BoxFuture, Error, Fence, Grant, LeaseBackend, LeaseKey, LeaseLayer,
    LeaseState,
};
use lease_fake::Fake;

use crate::seeded::{runtime, Seeded};

/// What a defect does to the fake.
#[derive(Clone, Copy)]
enum Defect {
    /// Reads of shared registrations always say free: an exclusive holder
    /// that drains them waits for nobody.
    RegistrationsUnseen,
    /// Reads of an exclusive intent always say free: shared holders never
    /// back out for a waiting exclusive one.
    IntentUnseen,
    /// Every permit acquire lands on a key of its own: permits exclude
    /// nobody.
    PermitsUnshared,
    /// A shared phase is granted with the fence of the key's first phase:
    /// the generation a shared holder learns is stale.
    StalePhaseFence,
}

struct Defective {
    fake: Fake,
    defect: Defect,
    first_phase: Mutex<HashMap<LeaseKey, Fence>>,
}

impl LeaseLayer for Defective {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        let hide = match self.defect {
            Defect::RegistrationsUnseen => key.as_str().contains("/shared-"),
            Defect::IntentUnseen => key.as_str().ends_with("/exclusive"),
            _ => false,
        };
        if hide {
            return Box::pin(async { Ok(LeaseState::Free) });
        }
        self.fake.read(key)
    }
    fn try_acquire(&self, mut req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            if matches!(self.defect, Defect::PermitsUnshared)
                && req.key.as_str().contains("/permit-")
            {
                req.key = LeaseKey::new(format!(
                    "{}/{}",
                    req.key,
                    req.holder.as_str().replace('~', "-")
                ))?;
            }
            let shared = req.holder.as_str() == lease_keeper::SHARED_HOLDER;
            let key = req.key.clone();
            match self.fake.try_acquire(req).await? {
                Acquire::Granted(g) if shared && matches!(self.defect, Defect::StalePhaseFence) => {
                    let first = *self
                        .first_phase
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(key)
                        .or_insert(g.fence());
                    Ok(Acquire::Granted(Grant::new(
                        g.key().clone(),
                        g.holder().clone(),
                        first,
                        g.ttl(),
                        g.sent_at(),
                        g.version().clone(),
                    )))
                }
                other => Ok(other),
            }
        })
    }
}

fn catches(name: &str, property: Property, defect: Defect, what: &'static str) {
    let healthy = runtime().block_on(async { property(&FakeHarness::new()).await });
    assert_eq!(
        healthy,
        Ok(Outcome::Passed),
        "{name} must pass on the healthy fake"
    );
    let seeded = runtime().block_on(async {
        let inner = FakeHarness::new();
        let client = Arc::new(Defective {
            fake: inner.fake.clone(),
            defect,
            first_phase: Mutex::new(HashMap::new()),
        });
        property(&Seeded::new(what, inner, client)).await
    });
    match seeded {
        Err(Failure(msg)) => eprintln!("{name} caught {what}: {msg}"),
        Ok(outcome) => panic!("{name} did not catch {what}: it reported {outcome:?}"),
    }
}

#[test]
fn an_exclusive_holder_that_waits_for_nobody_is_caught() {
    catches(
        "shared_and_exclusive_never_overlap",
        properties::shared_and_exclusive_never_overlap,
        Defect::RegistrationsUnseen,
        "unseen-registrations",
    );
}

#[test]
fn shared_holders_that_ignore_a_waiting_exclusive_one_are_caught() {
    catches(
        "an_exclusive_waiter_is_not_starved",
        properties::an_exclusive_waiter_is_not_starved,
        Defect::IntentUnseen,
        "unseen-intent",
    );
}

#[test]
fn permits_that_exclude_nobody_are_caught() {
    catches(
        "permits_never_exceed_their_number",
        properties::permits_never_exceed_their_number,
        Defect::PermitsUnshared,
        "unshared-permits",
    );
}

#[test]
fn a_stale_phase_fence_is_caught() {
    catches(
        "fences_rise_across_shared_and_exclusive_phases",
        properties::fences_rise_across_shared_and_exclusive_phases,
        Defect::StalePhaseFence,
        "stale-phase-fence",
    );
}

/// The fault runs' shared and exclusive holders, judged by the history
/// checker: an exclusive holder that waits for nobody is caught as work
/// overlapping a shared phase's.
#[test]
fn the_history_checker_catches_an_exclusive_holder_that_waits_for_nobody() {
    use lease_conformance::faults::{self, FaultKind, FaultPlan};
    use lease_conformance::history::ViolationKind;
    let plan = FaultPlan::new(FaultKind::None)
        .contenders(1)
        .elections(0)
        .shared(5)
        .permits(0)
        .ttl(std::time::Duration::from_millis(600))
        .duration(std::time::Duration::from_secs(4));
    let healthy = runtime()
        .block_on(async { faults::run_unchecked(&FakeHarness::new(), &plan).await })
        .expect("the run starts");
    assert!(
        healthy.check.is_safe(),
        "the healthy fake must pass: {healthy}"
    );
    assert!(
        healthy.check.work_runs >= 5,
        "too little work to judge: {healthy}"
    );
    let seeded = runtime()
        .block_on(async {
            let inner = FakeHarness::new();
            let client = Arc::new(Defective {
                fake: inner.fake.clone(),
                defect: Defect::RegistrationsUnseen,
                first_phase: Mutex::new(HashMap::new()),
            });
            faults::run_unchecked(&Seeded::new("unseen-registrations", inner, client), &plan).await
        })
        .expect("the run starts");
    assert!(
        seeded.check.found(ViolationKind::WorkOverlap)
            || seeded.check.found(ViolationKind::Overlap),
        "the checker missed an exclusive holder that waits for nobody: {seeded}"
    );
}
