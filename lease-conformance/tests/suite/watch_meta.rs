//! Proof the watch property can fail: it runs against a fake whose
//! `wait_for_change` wakes only for a new holder, a release or an expiry,
//! never for a payload change, and must catch it (and pass on the healthy
//! fake, so it fails for the defect).

use std::sync::Arc;

use lease_conformance::properties;
use lease_conformance::{Failure, FakeHarness, Outcome};
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey, LeaseLayer, LeaseState};
use lease_fake::Fake;

use crate::seeded::{runtime, Seeded};

/// A fake whose wait ignores payload changes: whenever the key still shows
/// the grant the caller saw, it waits again from what it shows now.
struct PayloadBlind {
    fake: Fake,
}

impl LeaseLayer for PayloadBlind {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }

    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            loop {
                let now = self.fake.read(key).await?;
                if !now.same_grant(seen) {
                    return Ok(());
                }
                self.fake.wait_for_change(key, &now).await?;
            }
        })
    }
}

#[test]
fn a_watch_blind_to_payload_changes_is_caught() {
    let healthy = runtime().block_on(async {
        properties::a_watch_wakes_on_a_payload_change(&FakeHarness::new()).await
    });
    assert_eq!(
        healthy,
        Ok(Outcome::Passed),
        "a_watch_wakes_on_a_payload_change must pass on the healthy fake"
    );
    let blind = runtime().block_on(async {
        let inner = FakeHarness::new();
        let blind = Arc::new(PayloadBlind {
            fake: inner.fake.clone(),
        });
        properties::a_watch_wakes_on_a_payload_change(&Seeded::new(
            "payload-blind-fake",
            inner,
            blind,
        ))
        .await
    });
    match blind {
        Err(Failure(msg)) => eprintln!("a payload-blind watch caught: {msg}"),
        Ok(outcome) => panic!(
            "a_watch_wakes_on_a_payload_change did not catch a payload-blind watch: it reported {outcome:?}"
        ),
    }
}
