//! etcd: the harness ([`EtcdHarness`]), and the helpers the etcd tests
//! share (the shared server's endpoints, waiting for a cluster, private
//! clusters, key prefixes of their own).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::faults::{FaultTuning, Launched};
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_etcd::{EtcdBackend, EtcdConfig, TlsConfig};

pub use super::{check_write_windows, or_panic, WriteWindow};
use super::{one_second_tuning, plan, socket_addr, Backend, ServerHarness};
use crate::servers;

pub use crate::servers::{EtcdMember as Member, ServerTls};

/// The leader sweeps expired leases every 500 ms and commits each revoke
/// through raft; this covers both with 500 ms to spare for a loaded machine,
/// and still leaves 600 ms of a 4 s lease when `reacquire_extends_the_lease`
/// reads it at 1.1 × TTL plus two slacks.
pub const EXPIRY_SLACK: Duration = Duration::from_millis(1000);

/// The etcd part of the harness: clients of one key prefix.
pub struct Etcd {
    prefix: String,
    /// etcd raises every lease to its minimum TTL, ⌈1.5 × election timeout⌉
    /// (2 s with the default 1 s election timeout, 1 s on the test
    /// servers' fast elections). A shorter grant lives that long on the
    /// server (safe for holders, whose deadline counts from the TTL they
    /// were promised), so waiting out "a TTL" must wait at least this.
    server_min_ttl: Duration,
    /// Raw writes that bypass the lease layer.
    raw: EtcdBackend,
    upstream: Vec<String>,
    /// Whether the clients share session leases among their keys (set
    /// explicitly either way, so each column keeps its meaning whatever
    /// lease-etcd's default).
    sessions: bool,
}

/// The conformance and fault-run harness on a real etcd.
pub type EtcdHarness = ServerHarness<Etcd>;

impl ServerHarness<Etcd> {
    /// The fault runs' plans and fault lengths on etcd.
    pub const FAULT_TUNING: FaultTuning = one_second_tuning(
        plan::<1, 6>,
        "etcd lease TTLs, judged on its monotonic clock, which a wall-clock step does not move; Go reads its clocks through the vDSO, out of libfaketime's reach",
        crate::resources::in_memory_store,
    );

    /// On the test process's shared server.
    pub async fn shared() -> Result<Self, String> {
        Self::on(shared_endpoints()?, None).await
    }

    /// On a private server of its own, which fault runs may pause, kill and
    /// restart (its data directory survives: etcd is durable).
    pub async fn private() -> Result<Self, String> {
        let server = servers::spawn_etcd(None).map_err(|e| e.to_string())?;
        let endpoints = server.endpoints.clone();
        Self::on(endpoints, Some(Launched::new(server, true))).await
    }

    /// The same harness whose clients use sessions, lease-etcd's default (a
    /// column of the conformance matrix of its own, `etcd_sessions`; the
    /// `etcd` column's clients give every key an etcd lease of its own).
    pub fn with_sessions(mut self) -> Self {
        self.backend.sessions = true;
        self
    }

    async fn on(
        upstream: Vec<String>,
        server: Option<Launched<servers::Etcd>>,
    ) -> Result<Self, String> {
        let first = upstream.first().ok_or("no etcd endpoint")?;
        let addr = socket_addr(first)?;
        let raw = wait_ready(&upstream, None, Duration::from_secs(20)).await?;
        // Ask the server: a 1 s grant comes back with the TTL it really got.
        let mut lc = raw.client().lease_client();
        let granted = lc.grant(1, None).await.map_err(|e| e.to_string())?;
        let _ = lc.revoke(granted.id()).await;
        let server_min_ttl = Duration::from_secs(granted.ttl().max(1).unsigned_abs());
        let etcd = Etcd {
            prefix: unique_prefix("conformance"),
            server_min_ttl,
            raw,
            upstream,
            sessions: false,
        };
        ServerHarness::new(etcd, Some(addr), server, None).await
    }
}

impl Backend for Etcd {
    type Server = servers::Etcd;

    fn name(&self) -> &'static str {
        if self.sessions {
            "etcd_sessions"
        } else {
            "etcd"
        }
    }

    fn connect(
        &self,
        via: Option<SocketAddr>,
    ) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        let endpoints = match via {
            Some(addr) => vec![format!("http://{addr}")],
            None => self.upstream.clone(),
        };
        Box::pin(async move {
            let config = EtcdConfig::new(endpoints)
                .key_prefix(self.prefix.clone())
                // Fault runs pause and blackhole the server: give up on a
                // request well within a TTL, as a holder should.
                .request_timeout(Duration::from_secs(2))
                .sessions(self.sessions);
            let backend = EtcdBackend::connect(config).await?;
            Ok(Arc::new(backend) as Arc<dyn LeaseBackend>)
        })
    }

    fn pass(&self, d: Duration) -> Duration {
        d.max(self.server_min_ttl) + EXPIRY_SLACK
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let mut kv = self.raw.client().kv_client();
            kv.put(
                format!("{}{}", self.prefix, key),
                "not a lease record",
                None,
            )
            .await
            .map(|_| ())
            .map_err(|e| Error::Backend(Box::new(e)))
        })
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        // `etcdctl del`: the key goes, its etcd lease stays alive.
        Box::pin(async move {
            let mut kv = self.raw.client().kv_client();
            kv.delete(format!("{}{}", self.prefix, key), None)
                .await
                .map(|_| ())
                .map_err(|e| Error::Backend(Box::new(e)))
        })
    }

    fn model_cases(&self) -> u32 {
        48
    }
}

/// The endpoints of the etcd every test of this process shares:
/// `LEASE_TEST_ETCD_ENDPOINTS` when set, else a native member started once
/// per test process (and stopped when it exits).
pub fn shared_endpoints() -> Result<Vec<String>, String> {
    servers::etcd()
        .map(|e| e.endpoints.clone())
        .map_err(|e| e.to_string())
}

/// Connects until the cluster answers (an elected leader), or fails after
/// `limit`.
pub async fn wait_ready(
    endpoints: &[String],
    tls: Option<TlsConfig>,
    limit: Duration,
) -> Result<EtcdBackend, String> {
    let start = Instant::now();
    loop {
        let mut config = EtcdConfig::new(endpoints.to_vec()).dial_timeout(Duration::from_secs(1));
        if let Some(t) = &tls {
            config = config.tls(t.clone());
        }
        match EtcdBackend::connect(config).await {
            Ok(b) => return Ok(b),
            Err(e) if start.elapsed() > limit => {
                return Err(format!(
                    "etcd at {endpoints:?} not ready after {limit:?}: {e}"
                ))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A TTL of three seconds as `b` takes it (etcd rounds a TTL up to whole
/// seconds and has a minimum): short enough for tests that wait for
/// expiry.
pub fn three_second_ttl(b: &EtcdBackend) -> Duration {
    b.capabilities()
        .ttl
        .effective(Duration::from_secs(3))
        .unwrap_or(Duration::from_secs(3))
}

/// Starts `n` members forming one cluster on loopback (plaintext, or with
/// `tls` on the client port), with fast elections: 50 ms heartbeats and a
/// 500 ms election timeout (etcd's minimum lease TTL becomes 1 s). Use
/// [`wait_ready`] before the first request.
pub fn start_cluster(n: usize, tls: Option<&ServerTls>) -> Result<Vec<Member>, String> {
    start_cluster_timed(n, tls, 50, 500)
}

/// [`start_cluster`] with the given heartbeat interval and election timeout
/// (ms); etcd's defaults are 100 and 1000.
pub fn start_cluster_timed(
    n: usize,
    tls: Option<&ServerTls>,
    heartbeat_ms: u64,
    election_ms: u64,
) -> Result<Vec<Member>, String> {
    servers::spawn_etcd_cluster(n, tls, heartbeat_ms, election_ms).map_err(|e| e.to_string())
}

/// A key prefix unique to this test process, so runs sharing a server (and
/// earlier runs' leftovers) never meet.
pub fn unique_prefix(tag: &str) -> String {
    format!(
        "lease-etcd-test/{tag}/{}-{}/",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

/// A free loopback port (the OS picks; another process may take it before
/// the test uses it, which shows as a failure to bind).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}
