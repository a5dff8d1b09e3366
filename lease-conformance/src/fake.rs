//! The harness for `lease-fake`: time is the fake's clock.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_fake::Fake;

use crate::hooks::FaultHooks;
use crate::Harness;

/// Runs the suite on an in-memory [`Fake`]: `pass` advances its clock, so
/// expiry properties take no real time; it supports every hook.
#[derive(Clone, Debug, Default)]
pub struct FakeHarness {
    /// The store every client shares.
    pub fake: Fake,
}

impl FakeHarness {
    /// A harness over a fresh store.
    pub fn new() -> Self {
        FakeHarness { fake: Fake::new() }
    }

    /// A harness over the given store (e.g. one with whole-second TTLs).
    pub fn with(fake: Fake) -> Self {
        FakeHarness { fake }
    }
}

impl Harness for FakeHarness {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        let c: Arc<dyn LeaseBackend> = Arc::new(self.fake.clone());
        Box::pin(async move { Ok(c) })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        self.fake.advance(d);
        Box::pin(async {})
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        self.fake.write_raw(key, b"{not a lease record".to_vec());
        Some(Box::pin(async { Ok(()) }))
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        self.fake.delete_record(key);
        Some(Box::pin(async { Ok(()) }))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        self.fake.set_latency(latency);
        true
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }

    fn model_cases(&self) -> u32 {
        256
    }
}

/// The fake's fault hooks: its clock and its failure hooks.
impl FaultHooks for FakeHarness {
    fn advance_clock(&self, by: Duration) -> bool {
        self.fake.advance(by);
        true
    }

    fn jump_clock(&self, by: Duration, forward: bool) -> bool {
        let now = self.fake.now();
        self.fake.set(if forward {
            now.saturating_add(by)
        } else {
            now.saturating_sub(by)
        });
        true
    }

    fn lose_next_responses(&self, n: u32) -> bool {
        self.fake.lose_next_responses(n);
        true
    }

    fn fail_next(&self, n: u32) -> bool {
        self.fake.fail_next(n);
        true
    }
}
