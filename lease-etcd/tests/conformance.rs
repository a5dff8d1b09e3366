//! The shared conformance suite on a real etcd.

mod common;

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::{conformance_tests, Harness};
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_etcd::{EtcdBackend, EtcdConfig};

/// The leader sweeps expired leases every 500 ms and commits each revoke
/// through raft; this covers both.
const EXPIRY_SLACK: Duration = Duration::from_millis(800);

struct EtcdHarness {
    endpoints: Vec<String>,
    prefix: String,
    /// etcd raises every lease to its minimum TTL, ⌈1.5 × election timeout⌉
    /// (2 s with the default 1 s election timeout, 1 s on the harness's
    /// fast-election server). A shorter grant lives that long on the server
    /// (safe for holders, whose deadline counts from the TTL they were
    /// promised), so waiting out "a TTL" must wait at least this.
    server_min_ttl: Duration,
    /// Used for raw writes that bypass the lease layer.
    raw: EtcdBackend,
}

impl EtcdHarness {
    async fn start() -> Result<Self, String> {
        let endpoints = common::shared_endpoints()?;
        let prefix = common::unique_prefix("conformance");
        let raw = common::wait_ready(&endpoints, None, Duration::from_secs(20)).await?;
        // Ask the server: a 1 s grant comes back with the TTL it really got.
        let mut lc = raw.client().lease_client();
        let granted = lc.grant(1, None).await.map_err(|e| e.to_string())?;
        let _ = lc.revoke(granted.id()).await;
        let server_min_ttl = Duration::from_secs(granted.ttl().max(1).unsigned_abs());
        Ok(EtcdHarness {
            endpoints,
            prefix,
            server_min_ttl,
            raw,
        })
    }
}

impl Harness for EtcdHarness {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let config = EtcdConfig::new(self.endpoints.clone()).key_prefix(self.prefix.clone());
            let backend = EtcdBackend::connect(config).await?;
            Ok(Arc::new(backend) as Arc<dyn LeaseBackend>)
        })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(
            d.max(self.server_min_ttl) + EXPIRY_SLACK,
        ))
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        Some(Box::pin(async move {
            let mut kv = self.raw.client().kv_client();
            kv.put(
                format!("{}{}", self.prefix, key),
                "not a lease record",
                None,
            )
            .await
            .map(|_| ())
            .map_err(|e| Error::Backend(Box::new(e)))
        }))
    }
}

conformance_tests!(etcd, async { EtcdHarness::start().await });
