//! The conformance and fault-run harness for lease-nats.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::faults::{FaultHooks, Launched, ServerControl};
use lease_conformance::Harness;
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_nats::{NatsBackend, NatsConfig};
use lease_testkit::servers;

use super::{put_raw, LatencyProxy, EXPIRY_SLACK};

/// How [`Harness::delete_outside`] removes a key's record, as an operator would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutsideDelete {
    /// `nats kv del`: a KV delete, leaving a tombstone without TTL.
    KvDelete,
    /// `nats stream purge --subject`: every message of the key's subject
    /// removed from the stream, leaving nothing.
    StreamPurge,
}

/// Clients of one bucket on one nats-server.
pub struct NatsHarness {
    /// Ordinary clients connect through this relay, so latency can be injected.
    proxy: LatencyProxy,
    upstream: SocketAddr,
    config: NatsConfig,
    /// Used for the raw writes of `write_corrupt`.
    admin: NatsBackend,
    /// The server process, when this harness launched its own.
    server: Option<Launched<servers::Nats>>,
    outside: OutsideDelete,
}

impl NatsHarness {
    /// On the server shared by this test process.
    pub async fn start() -> Result<Self, String> {
        let url = super::shared_url().await?;
        Self::on(url, None).await
    }

    /// On a private nats-server with file storage, which fault runs may
    /// pause, kill and restart.
    pub async fn private() -> Result<Self, String> {
        let nats = tokio::task::spawn_blocking(|| servers::spawn_nats(None))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let url = nats.url.clone();
        Self::on(url, Some(Launched::new(nats, true))).await
    }

    async fn on(url: String, server: Option<Launched<servers::Nats>>) -> Result<Self, String> {
        let upstream: SocketAddr = url
            .trim_start_matches("nats://")
            .parse()
            .map_err(|e| format!("server address {url}: {e}"))?;
        // Requests answer within a TTL or count as unknown outcomes.
        let config = NatsConfig::new("lease-conformance")
            .request_timeout(Duration::from_secs(2))
            .create_bucket(true);
        let admin = NatsBackend::connect(&url, config.clone())
            .await
            .map_err(|e| format!("connecting to nats-server at {url}: {e}"))?;
        let proxy = LatencyProxy::start(&url)
            .await
            .map_err(|e| format!("starting the latency relay: {e}"))?;
        Ok(NatsHarness {
            proxy,
            upstream,
            config,
            admin,
            server,
            outside: OutsideDelete::KvDelete,
        })
    }

    /// This harness, deleting records outside the library the way given.
    pub fn deleting_by(mut self, outside: OutsideDelete) -> Self {
        self.outside = outside;
        self
    }

    /// Removes `key`'s record through async-nats directly, bypassing lease-nats.
    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        let js = async_nats::jetstream::new(self.admin.client().clone());
        let bucket = self.config.bucket.as_str();
        match self.outside {
            OutsideDelete::KvDelete => {
                let kv = js
                    .get_key_value(bucket)
                    .await
                    .map_err(|e| Error::unavailable("opening the bucket", e))?;
                kv.delete(key.as_str())
                    .await
                    .map_err(|e| Error::unavailable("kv delete", e))
            }
            OutsideDelete::StreamPurge => {
                let stream = js
                    .get_stream(format!("KV_{bucket}"))
                    .await
                    .map_err(|e| Error::unavailable("opening the stream", e))?;
                stream
                    .purge()
                    .filter(format!("$KV.{bucket}.{}", key.as_str()))
                    .await
                    .map(|_| ())
                    .map_err(|e| Error::unavailable("stream purge", e))
            }
        }
    }

    async fn connect(&self, url: String) -> Result<Arc<dyn LeaseBackend>, Error> {
        let b = NatsBackend::connect(&url, self.config.clone()).await?;
        Ok(Arc::new(b) as Arc<dyn LeaseBackend>)
    }
}

impl Harness for NatsHarness {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(self.connect(self.proxy.url.clone()))
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(d + EXPIRY_SLACK))
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        Some(Box::pin(async move {
            put_raw(&self.admin, key, b"not a lease record").await
        }))
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        Some(Box::pin(self.delete_record(key)))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        self.proxy.set_latency(latency);
        true
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }

    fn model_cases(&self) -> u32 {
        24
    }
}

impl FaultHooks for NatsHarness {
    fn upstream(&self) -> Option<SocketAddr> {
        Some(self.upstream)
    }

    fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>>> {
        Some(Box::pin(self.connect(format!("nats://{addr}"))))
    }

    fn server(&self) -> Option<&dyn ServerControl> {
        self.server.as_ref().map(|s| s as &dyn ServerControl)
    }
}
