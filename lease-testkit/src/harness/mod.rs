//! The conformance and fault-run harnesses of the workspace's backends, one
//! per backend behind its cargo feature (`etcd`, `nats`, `s3`, `mongo`,
//! `postgres`, `redis`), shared by each backend's tests and by lease-bench
//! so the benchmark measures the clients the tests check.
//!
//! The backends behind a server process (etcd, NATS, MongoDB, PostgreSQL,
//! Redis) share one harness, [`ServerHarness`]: clients reach the server
//! through a [`FaultProxy`] (latency), fault runs put their own proxy in
//! front of the same upstream address, and a private server can be paused,
//! killed, restarted and (where it runs under libfaketime) have its clock
//! stepped.
//! What differs per backend is a [`Backend`]: how to connect a client to an
//! address, how to write behind the library's back, and how long expiry
//! takes to show. The object-store backend (module `s3`) judges expiry on
//! its clients' clocks and has harnesses of its own.
//!
//! Each backend module also has a `FAULT_TUNING` and `shared()` /
//! `private()` constructors, which
//! [`fault_tests!`](lease_conformance::fault_tests)`(harness: …)` expands to
//! the fault-run rows with.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::faults::{
    FaultHooks, FaultKind, FaultPlan, FaultProxy, FaultTuning, Launched, ResourceFuture,
    ServerControl, ServerProcess,
};
use lease_conformance::Harness;
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};

use crate::servers::clock::ServerClock;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "mongo")]
pub mod mongo;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "s3")]
pub mod s3;

/// What one backend adds to a [`ServerHarness`].
pub trait Backend: Send + Sync + 'static {
    /// The handle of a private server of this backend.
    type Server: ServerProcess + Sync + 'static;

    /// The harness's name in reports and the conformance matrix.
    fn name(&self) -> &'static str;

    /// A new client whose requests go to `via` (a proxy in front of the
    /// server), or to the server itself when `None`.
    fn connect(
        &self,
        via: Option<SocketAddr>,
    ) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>>;

    /// How long to sleep for `d` of backend time to pass, expiry noticed.
    fn pass(&self, d: Duration) -> Duration;

    /// Stores at `key` a record that is not a lease record, as another
    /// program would.
    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>>;

    /// Removes `key`'s record as an operator would.
    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>>;

    /// How many cases the model-interleaving property runs.
    fn model_cases(&self) -> u32;
}

/// The harness of a backend behind a server process: clients connect
/// through a latency proxy in front of the server's address, fault runs
/// through proxies of their own, and a private server is controlled as a
/// process (and by its clock, where it has one the test can step).
pub struct ServerHarness<B: Backend> {
    /// The backend's own part.
    pub backend: B,
    upstream: Option<SocketAddr>,
    latency: Option<FaultProxy>,
    server: Option<Launched<B::Server>>,
    clock: Option<ServerClock>,
}

impl<B: Backend> ServerHarness<B> {
    /// A harness on the server at `upstream` (`None` when the server is
    /// not one address, e.g. a replica set: then no latency and no proxied
    /// fault runs), with its process when this harness launched it, and
    /// the clock of that process when it can be stepped.
    pub async fn new(
        backend: B,
        upstream: Option<SocketAddr>,
        server: Option<Launched<B::Server>>,
        clock: Option<ServerClock>,
    ) -> Result<Self, String> {
        let latency = match upstream {
            Some(addr) => Some(
                FaultProxy::start(addr)
                    .await
                    .map_err(|e| format!("cannot start the latency proxy: {e}"))?,
            ),
            None => None,
        };
        Ok(ServerHarness {
            backend,
            upstream,
            latency,
            server,
            clock,
        })
    }

    /// The private server, when this harness launched one.
    pub fn server(&self) -> Option<&Launched<B::Server>> {
        self.server.as_ref()
    }
}

impl<B: Backend> std::ops::Deref for ServerHarness<B> {
    type Target = B;

    fn deref(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend> Harness for ServerHarness<B> {
    fn name(&self) -> &'static str {
        self.backend.name()
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        self.backend
            .connect(self.latency.as_ref().map(FaultProxy::addr))
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(self.backend.pass(d)))
    }

    fn real_clock(&self) -> bool {
        true
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        Some(self.backend.write_corrupt(key))
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        Some(self.backend.delete_outside(key))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        match &self.latency {
            Some(p) => {
                p.set_latency(latency);
                true
            }
            None => false,
        }
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }

    fn model_cases(&self) -> u32 {
        self.backend.model_cases()
    }
}

impl<B: Backend> FaultHooks for ServerHarness<B> {
    fn upstream(&self) -> Option<SocketAddr> {
        self.upstream
    }

    fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>>> {
        Some(self.backend.connect(Some(addr)))
    }

    fn server(&self) -> Option<&dyn ServerControl> {
        self.server.as_ref().map(|s| s as &dyn ServerControl)
    }

    fn jump_clock(&self, by: Duration, forward: bool) -> bool {
        self.clock
            .as_ref()
            .is_some_and(|c| c.step(by, forward).is_ok())
    }

    fn clock_reads_true_time(&self) -> bool {
        self.clock
            .as_ref()
            .is_some_and(ServerClock::reads_true_time)
    }
}

/// A fault plan: a TTL of `TTL_S` seconds, runs of `RUN_S` seconds, four
/// contenders.
pub fn plan<const TTL_S: u64, const RUN_S: u64>(kind: FaultKind) -> FaultPlan {
    FaultPlan::new(kind)
        .ttl(Duration::from_secs(TTL_S))
        .duration(Duration::from_secs(RUN_S))
        .contenders(4)
}

/// The fault lengths of a backend with 1 s TTLs: blackholes of 0.7 s
/// (renewals time out within a TTL), holders and the server frozen for
/// 1.5 s (past a lease).
pub const fn one_second_tuning(
    plan: fn(FaultKind) -> FaultPlan,
    clock: &'static str,
    resource: fn() -> ResourceFuture,
) -> FaultTuning {
    FaultTuning {
        plan,
        blackhole: Duration::from_millis(700),
        paused_holders: Duration::from_millis(1500),
        server_pause: Duration::from_millis(1500),
        clock,
        resource,
    }
}

/// The first address `host:port` (or `scheme://host:port/…`) resolves to.
pub fn socket_addr(endpoint: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let hostport = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .trim_end_matches('/');
    hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("cannot resolve the server address {endpoint}"))
}

/// A name no other test (or test process) uses: `tag` and a random part.
pub fn unique(tag: &str) -> String {
    format!("{tag}_{}", &lease_core::HolderId::random().as_str()[..16])
}

/// Panics with the reason: for tests, where a missing server must fail
/// loudly (nothing is ever skipped silently).
pub fn or_panic<T>(r: Result<T, String>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// One holder's write window on a key, as the holder saw it: from the
/// granting answer to the last instant it was allowed to write (its last
/// deadline, or the instant it sent its release).
#[derive(Debug, Clone)]
pub struct WriteWindow {
    /// The key.
    pub key: String,
    /// The holder.
    pub holder: String,
    /// The grant's fence.
    pub fence: lease_core::Fence,
    /// When the granting answer arrived: writes may start here.
    pub start: std::time::Instant,
    /// When the holder stopped being allowed to write.
    pub end: std::time::Instant,
}

/// Checks that per key, in order of their start, write windows never
/// overlap and fences rise: the first violation, described.
pub fn check_write_windows<'a>(
    windows: impl IntoIterator<Item = &'a WriteWindow>,
) -> Result<(), String> {
    let mut per_key: std::collections::BTreeMap<&str, Vec<&WriteWindow>> = Default::default();
    for w in windows {
        per_key.entry(w.key.as_str()).or_default().push(w);
    }
    for (key, mut ws) in per_key {
        ws.sort_by_key(|w| w.start);
        for pair in ws.windows(2) {
            let (x, y) = (pair[0], pair[1]);
            if y.fence <= x.fence {
                return Err(format!(
                    "{key}: fence {} ({}) granted after fence {} ({})",
                    y.fence, y.holder, x.fence, x.holder
                ));
            }
            if y.start < x.end {
                return Err(format!(
                    "{key}: {}#{} started writing {:?} before {}#{}'s window closed",
                    y.holder,
                    y.fence,
                    x.end - y.start,
                    x.holder,
                    x.fence
                ));
            }
        }
    }
    Ok(())
}
