//! NATS: the harness ([`NatsHarness`]), and the helpers the NATS tests
//! share (the shared server's URL, raw writes, private servers).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::faults::{FaultTuning, Launched};
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_nats::{NatsBackend, NatsConfig};

pub use super::{check_write_windows, or_panic, WriteWindow};
use super::{plan, socket_addr, Backend, ServerHarness};
use crate::servers;

pub use crate::servers::NatsNode as Server;

/// How long after a TTL runs out nats-server may take to remove the message
/// (its expiry timer ticks about once a second) and write the marker.
pub const EXPIRY_SLACK: Duration = Duration::from_millis(1500);

/// How [`delete_outside`](lease_conformance::Harness::delete_outside)
/// removes a key's record, as an operator would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutsideDelete {
    /// `nats kv del`: a KV delete, leaving a tombstone without TTL.
    KvDelete,
    /// `nats stream purge --subject`: every message of the key's subject
    /// removed from the stream, leaving nothing.
    StreamPurge,
}

/// The NATS part of the harness: clients of one bucket.
pub struct Nats {
    url: String,
    config: NatsConfig,
    /// Raw writes that bypass the lease layer.
    admin: NatsBackend,
    outside: OutsideDelete,
}

/// The conformance and fault-run harness on a real nats-server.
pub type NatsHarness = ServerHarness<Nats>;

impl ServerHarness<Nats> {
    /// The fault runs' plans and fault lengths on NATS.
    pub const FAULT_TUNING: FaultTuning = FaultTuning {
        plan: plan::<2, 8>,
        blackhole: Duration::from_millis(1500),
        paused_holders: Duration::from_millis(2500),
        server_pause: Duration::from_millis(2500),
        clock: "the wall clock that judges message TTLs (Nats-TTL); Go reads it through the vDSO, out of libfaketime's reach, so only a step of the whole machine's clock could move it",
        resource: crate::resources::in_memory_store,
    };

    /// On the server shared by this test process.
    pub async fn shared() -> Result<Self, String> {
        let url = shared_url().await?;
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

    /// This harness, deleting records outside the library the way given.
    pub fn deleting_by(mut self, outside: OutsideDelete) -> Self {
        self.backend.outside = outside;
        self
    }

    async fn on(url: String, server: Option<Launched<servers::Nats>>) -> Result<Self, String> {
        let upstream = socket_addr(&url)?;
        // Requests answer within a TTL or count as unknown outcomes.
        let config = NatsConfig::new("lease-conformance")
            .request_timeout(Duration::from_secs(2))
            .create_bucket(true);
        let admin = NatsBackend::connect(&url, config.clone())
            .await
            .map_err(|e| format!("connecting to nats-server at {url}: {e}"))?;
        let nats = Nats {
            url,
            config,
            admin,
            outside: OutsideDelete::KvDelete,
        };
        ServerHarness::new(nats, Some(upstream), server, None).await
    }
}

impl Nats {
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
}

impl Backend for Nats {
    type Server = servers::Nats;

    fn name(&self) -> &'static str {
        "nats"
    }

    fn connect(
        &self,
        via: Option<SocketAddr>,
    ) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        let url = via.map_or_else(|| self.url.clone(), |addr| format!("nats://{addr}"));
        Box::pin(async move {
            let b = NatsBackend::connect(&url, self.config.clone()).await?;
            Ok(Arc::new(b) as Arc<dyn LeaseBackend>)
        })
    }

    fn pass(&self, d: Duration) -> Duration {
        d + EXPIRY_SLACK
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(put_raw(&self.admin, key, b"not a lease record"))
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.delete_record(key))
    }

    fn model_cases(&self) -> u32 {
        24
    }
}

/// The server every test of this process shares: `LEASE_TEST_NATS_URL`, or
/// the native nats-server [`servers::nats`] starts once.
pub async fn shared_url() -> Result<String, String> {
    tokio::task::spawn_blocking(|| {
        servers::nats()
            .map(|n| n.url.clone())
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("starting nats-server: {e}"))?
}

/// Stores `bytes` at `key` as a plain KV put (no TTL), as another program would.
pub async fn put_raw(b: &NatsBackend, key: &LeaseKey, bytes: &[u8]) -> Result<(), Error> {
    let js = async_nats::jetstream::new(b.client().clone());
    let subject = format!("$KV.{}.{}", b.config().bucket, key.as_str());
    let ack = js
        .publish(subject, bytes.to_vec().into())
        .await
        .map_err(|e| Error::unavailable("raw put", e))?;
    ack.await.map_err(|e| Error::unavailable("raw put", e))?;
    Ok(())
}

/// A fresh temporary directory for a test's servers (the test removes it).
pub fn temp_dir(name: &str) -> Result<std::path::PathBuf, String> {
    let d = std::env::temp_dir().join(format!(
        "lease-nats-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&d).map_err(|e| format!("temp dir {}: {e}", d.display()))?;
    Ok(d)
}
