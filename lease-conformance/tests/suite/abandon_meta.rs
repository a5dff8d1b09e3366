//! Proof the abandoned-grant property can fail: against a fake whose
//! renewal of any key keeps every other grant it handed out alive too (a
//! server-side lease shared by a client's keys, with nothing deleting the
//! ones nobody renews), it must catch the abandoned key that never goes,
//! and it must pass on the healthy fake.

use std::sync::{Arc, Mutex};

use lease_conformance::properties;
use lease_conformance::{Failure, FakeHarness, Outcome};
use lease_core::{
    Acquire, AcquireRequest, BoxFuture, Error, Grant, LeaseBackend, LeaseLayer, Payload, Renewal,
};
use lease_fake::Fake;

use crate::seeded::{runtime, Seeded};

/// Every grant handed out, renewed whenever any one of them is.
struct SharedLife {
    fake: Fake,
    grants: Mutex<Vec<Grant>>,
}

impl SharedLife {
    fn grants(&self) -> std::sync::MutexGuard<'_, Vec<Grant>> {
        self.grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl LeaseLayer for SharedLife {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            let a = self.fake.try_acquire(req).await?;
            if let Acquire::Granted(g) = &a {
                self.grants().push(g.clone());
            }
            Ok(a)
        })
    }
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let others: Vec<Grant> = self.grants().clone();
            for other in others.iter().filter(|o| o.key() != grant.key()) {
                if let Ok(Renewal::Renewed(n)) = self.fake.renew(other, None).await {
                    let mut all = self.grants();
                    all.retain(|x| x.key() != n.key());
                    all.push(n);
                }
            }
            self.fake.renew(grant, payload).await
        })
    }
}

#[test]
fn a_key_kept_alive_by_its_clients_other_renewals_is_caught() {
    let property = properties::an_abandoned_grant_expires_while_its_client_renews_another;
    let healthy = runtime().block_on(async { property(&FakeHarness::new()).await });
    assert_eq!(
        healthy,
        Ok(Outcome::Passed),
        "must pass on the healthy fake"
    );
    let seeded = runtime().block_on(async {
        let inner = FakeHarness::new();
        let client = Arc::new(SharedLife {
            fake: inner.fake.clone(),
            grants: Mutex::new(Vec::new()),
        });
        property(&Seeded::new("shared-life", inner, client)).await
    });
    match seeded {
        Err(Failure(msg)) => eprintln!("caught a key kept alive by other renewals: {msg}"),
        Ok(outcome) => panic!("the abandoned key kept alive was not caught: {outcome:?}"),
    }
}
