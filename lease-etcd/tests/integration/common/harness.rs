//! The etcd [`Harness`] for the conformance suite and the fault runs.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::faults::{FaultHooks, Launched, ServerControl};
use lease_conformance::Harness;
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_testkit::servers;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The leader sweeps expired leases every 500 ms and commits each revoke
/// through raft; this covers both with 500 ms to spare for a loaded machine,
/// and still leaves 600 ms of a 4 s lease when `reacquire_extends_the_lease`
/// reads it at 1.1 × TTL plus two slacks.
const EXPIRY_SLACK: Duration = Duration::from_millis(1000);

pub struct EtcdHarness {
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
    /// Injected latency (µs) on every byte clients send: the clients talk to
    /// etcd through a loopback proxy that holds each chunk this long.
    delay_us: Arc<AtomicU64>,
    /// The server itself (no latency proxy), for fault proxies.
    upstream: SocketAddr,
    /// A private server the fault runs may pause, kill and restart.
    server: Option<Launched<servers::Etcd>>,
    /// Whether the clients share session leases among their keys.
    sessions: bool,
}

/// A loopback TCP proxy to `upstream` that delays the client → server
/// direction by `delay_us`, so a request is applied that much after it was
/// sent. Runs on the test's runtime, which ends with the test.
async fn start_proxy(upstream: SocketAddr, delay_us: Arc<AtomicU64>) -> Result<String, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("proxy bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let delay_us = delay_us.clone();
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut ri, mut wi) = inbound.into_split();
                let (mut ro, mut wo) = outbound.into_split();
                let up = async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = ri.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let d = delay_us.load(Ordering::Relaxed);
                        if d > 0 {
                            tokio::time::sleep(Duration::from_micros(d)).await;
                        }
                        if wo.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = wo.shutdown().await;
                };
                let down = async move {
                    let _ = tokio::io::copy(&mut ro, &mut wi).await;
                    let _ = wi.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    Ok(format!("http://{addr}"))
}

impl EtcdHarness {
    /// On the test process's shared server.
    pub async fn start() -> Result<Self, String> {
        Self::on(super::shared_endpoints()?, None).await
    }

    /// The same harness whose clients use sessions.
    pub fn with_sessions(mut self) -> Self {
        self.sessions = true;
        self
    }

    /// On a private server of its own, which fault runs may pause, kill and
    /// restart (its data directory survives: etcd is durable).
    pub async fn private() -> Result<Self, String> {
        let server = servers::spawn_etcd(None).map_err(|e| e.to_string())?;
        let endpoints = server.endpoints.clone();
        Self::on(endpoints, Some(Launched::new(server, true))).await
    }

    async fn on(
        upstream: Vec<String>,
        server: Option<Launched<servers::Etcd>>,
    ) -> Result<Self, String> {
        let first = upstream.first().ok_or("no etcd endpoint")?;
        let upstream_addr: SocketAddr = first
            .trim_start_matches("http://")
            .parse()
            .map_err(|err| format!("endpoint {first}: {err}"))?;
        let delay_us = Arc::new(AtomicU64::new(0));
        let mut endpoints = Vec::new();
        for e in &upstream {
            let addr: SocketAddr = e
                .trim_start_matches("http://")
                .parse()
                .map_err(|err| format!("endpoint {e}: {err}"))?;
            endpoints.push(start_proxy(addr, delay_us.clone()).await?);
        }
        let prefix = super::unique_prefix("conformance");
        let raw = super::wait_ready(&upstream, None, Duration::from_secs(20)).await?;
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
            delay_us,
            upstream: upstream_addr,
            server,
            sessions: false,
        })
    }

    /// A client of this harness's store at `endpoints`.
    async fn connect(&self, endpoints: Vec<String>) -> Result<Arc<dyn LeaseBackend>, Error> {
        let config = EtcdConfig::new(endpoints)
            .key_prefix(self.prefix.clone())
            // Fault runs pause and blackhole the server: give up on a
            // request well within a TTL, as a holder should.
            .request_timeout(Duration::from_secs(2))
            .sessions(self.sessions);
        let backend = EtcdBackend::connect(config).await?;
        Ok(Arc::new(backend) as Arc<dyn LeaseBackend>)
    }
}

impl Harness for EtcdHarness {
    fn name(&self) -> &'static str {
        // Sessions are a column of the conformance matrix of their own.
        if self.sessions {
            "etcd_sessions"
        } else {
            "etcd"
        }
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(self.connect(self.endpoints.clone()))
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(
            d.max(self.server_min_ttl) + EXPIRY_SLACK,
        ))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.delay_us.store(us, Ordering::Relaxed);
        true
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

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        // `etcdctl del`: the key goes, its etcd lease stays alive.
        Some(Box::pin(async move {
            let mut kv = self.raw.client().kv_client();
            kv.delete(format!("{}{}", self.prefix, key), None)
                .await
                .map(|_| ())
                .map_err(|e| Error::Backend(Box::new(e)))
        }))
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }

    fn model_cases(&self) -> u32 {
        48
    }
}

impl FaultHooks for EtcdHarness {
    fn upstream(&self) -> Option<SocketAddr> {
        Some(self.upstream)
    }

    fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>>> {
        Some(Box::pin(self.connect(vec![format!("http://{addr}")])))
    }

    fn server(&self) -> Option<&dyn ServerControl> {
        self.server.as_ref().map(|s| s as &dyn ServerControl)
    }
}
