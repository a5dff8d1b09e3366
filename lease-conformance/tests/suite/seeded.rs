//! A harness whose every client is one seeded-defect wrapper around the
//! fake, and the runtime the meta tests run properties on.

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::{FakeHarness, Harness};
use lease_core::{BoxFuture, Error, LeaseBackend};

/// The fake's harness (its clock, its `pass`), handing out `client`.
pub struct Seeded {
    name: &'static str,
    inner: FakeHarness,
    client: Arc<dyn LeaseBackend>,
}

impl Seeded {
    /// `client` wraps `inner`'s fake; `name` names the defect in reports.
    pub fn new(name: &'static str, inner: FakeHarness, client: Arc<dyn LeaseBackend>) -> Self {
        Seeded {
            name,
            inner,
            client,
        }
    }
}

impl Harness for Seeded {
    fn name(&self) -> &'static str {
        self.name
    }
    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        let c = self.client.clone();
        Box::pin(async move { Ok(c) })
    }
    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        self.inner.pass(d)
    }
}

/// A multi-threaded runtime, as the real-server tests use.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}
