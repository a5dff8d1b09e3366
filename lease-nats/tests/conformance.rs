//! The shared lease contract, run against a real nats-server.
//!
//! The server is `LEASE_TEST_NATS_URL` when set, else the one
//! `lease_conformance::servers` provides (a native nats-server provisioned by
//! `cargo xtask provision --backend nats`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::{conformance_tests, Harness};
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_nats::{NatsBackend, NatsConfig};

/// Clients of one bucket on one server.
struct NatsHarness {
    /// Clients connect through this relay, so latency can be injected.
    proxy: support::LatencyProxy,
    config: NatsConfig,
    /// Used for the raw writes of `write_corrupt`.
    admin: NatsBackend,
}

impl NatsHarness {
    async fn start() -> Result<Self, String> {
        let url = support::shared_url().await?;
        let config = NatsConfig::new("lease-conformance");
        let admin = NatsBackend::connect(&url, config.clone())
            .await
            .map_err(|e| format!("connecting to nats-server at {url}: {e}"))?;
        let proxy = support::LatencyProxy::start(&url)
            .await
            .map_err(|e| format!("starting the latency relay: {e}"))?;
        Ok(NatsHarness {
            proxy,
            config,
            admin,
        })
    }
}

impl Harness for NatsHarness {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let b = NatsBackend::connect(&self.proxy.url, self.config.clone()).await?;
            Ok(Arc::new(b) as Arc<dyn LeaseBackend>)
        })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(d + support::EXPIRY_SLACK))
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        Some(Box::pin(async move {
            support::put_raw(&self.admin, key, b"not a lease record").await
        }))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        self.proxy.set_latency(latency);
        true
    }

    fn model_cases(&self) -> u32 {
        24
    }
}

conformance_tests!(nats, async { NatsHarness::start().await });
