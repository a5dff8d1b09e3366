//! Fault runs (`lease_conformance::faults::run`) on the object-store
//! backend: contenders acquire, renew, write to a fenced resource and
//! release while faults are injected; every recorded history must be safe.
//! Each kind reports its status to the conformance matrix, as
//! `fault_<kind>` under `s3_memory` and `s3`:
//!
//! * `s3_memory` — object_store's `InMemory` behind a wrapper: lost
//!   responses are PUTs the wrapper applies and then answers with an error
//!   (acceptable only for the in-memory store, where there is no wire to
//!   lose them on), failed requests are refused by the wrapper before they
//!   reach the store, latency delays each request; paused holders. No
//!   network or server: sever, blackhole, server pause and restart are n/a.
//! * `s3` — moto behind a `FaultProxy`: lost responses are the proxy's
//!   "forward the request, drop the response", plus latency, severed
//!   connections, blackholes, paused holders, failed requests (refused by a
//!   wrapper before they are sent), and a private moto paused with SIGSTOP.
//!   A restart is n/a: moto keeps its state in memory. The rows use the
//!   default client configuration, whose retries (3) absorb most dropped
//!   answers and cut requests (a retried conditional PUT finds its own
//!   landed write); `server_lost_answers_reach_a_client_that_does_not_retry`
//!   runs the same faults without retries, so holders see unknown outcomes.
//!
//! Neither store has a clock the test could move: expiry is judged on each
//! taker's own monotonic clock, so clock jumps are n/a on both.

use crate::common;

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::Faulty;
use async_trait::async_trait;
use futures_core::stream::BoxStream;
use lease_conformance::faults::{
    self, FaultHooks, FaultKind, FaultPlan, Launched, Report, ServerControl,
};
use lease_conformance::Harness;
use lease_core::{BoxFuture, Error, LeaseBackend};
use lease_s3::{ObjectStoreBackend, S3Config};
use lease_testkit::servers;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    BackoffConfig, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RetryConfig,
};

/// The S3 server serves one request at a time: tests sharing it take turns,
/// so one run's load is not another's latency fault.
static SERVER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whole seconds are the backend's TTL granularity; 2 s leaves a deadline
/// of 1.33 s for requests that queue at a server serving one at a time.
const TTL: Duration = Duration::from_secs(2);
const RUN: Duration = Duration::from_secs(8);
const MEMORY_RUN: Duration = Duration::from_secs(6);

fn plan(kind: FaultKind, run: Duration) -> FaultPlan {
    FaultPlan::new(kind).ttl(TTL).duration(run).contenders(4)
}

/// The plan of a run without faults, which must see no unknown outcome
/// from the backend: the object-store protocol makes none by itself. (A
/// resigning election candidate may drop its keeper's renewal in flight;
/// that call is counted apart, in `dropped`.)
fn quiet_plan(run: Duration) -> FaultPlan {
    plan(FaultKind::None, run)
}

/// An object store whose next requests can be refused before they are sent
/// (`fail_next`): the store never sees them.
struct Refusing {
    inner: Arc<dyn ObjectStore>,
    refuse: Arc<AtomicU32>,
}

impl Refusing {
    fn refused(&self, what: &str, location: &Path) -> Option<object_store::Error> {
        self.refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| object_store::Error::Generic {
                store: "Refusing",
                source: format!("injected: {what} {location} failed before it was sent").into(),
            })
    }
}

impl fmt::Debug for Refusing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Refusing({})", self.inner)
    }
}

impl fmt::Display for Refusing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Refusing({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Refusing {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if !location.as_ref().contains(".lease-probe-") {
            if let Some(e) = self.refused("PUT", location) {
                return Err(e);
            }
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if let Some(e) = self.refused("GET", location) {
            return Err(e);
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// `s3_memory`: one `InMemory` store behind `Faulty` (latency, lost answers)
/// and `Refusing` (failed requests); each contender gets its own client.
struct MemoryHarness {
    store: Arc<Faulty>,
    refuse: Arc<AtomicU32>,
    prefix: String,
}

impl MemoryHarness {
    fn new() -> MemoryHarness {
        MemoryHarness {
            store: Faulty::new(Arc::new(InMemory::new())),
            refuse: Arc::new(AtomicU32::new(0)),
            prefix: common::unique_prefix("fault-runs"),
        }
    }
}

impl Harness for MemoryHarness {
    fn name(&self) -> &'static str {
        "s3_memory"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let store: Arc<dyn ObjectStore> = Arc::new(Refusing {
                inner: self.store.clone(),
                refuse: self.refuse.clone(),
            });
            let c: Arc<dyn LeaseBackend> = Arc::new(ObjectStoreBackend::new(store, &self.prefix)?);
            Ok(c)
        })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(d + Duration::from_millis(100)))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        self.store.set_latency(latency);
        true
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }
}

impl FaultHooks for MemoryHarness {
    fn lose_next_responses(&self, n: u32) -> bool {
        // Applied, then answered with an error: the in-memory store has no
        // wire on which an answer could be lost, so the wrapper loses it.
        self.store.lose_next_puts(n);
        true
    }

    fn fail_next(&self, n: u32) -> bool {
        self.refuse.fetch_add(n, Ordering::SeqCst);
        true
    }
}

/// `s3`: the S3 server (shared, or a private moto this harness can pause),
/// reached directly or through the driver's `FaultProxy`.
struct ServerHarness {
    endpoint: String,
    bucket: String,
    region: String,
    keys: (String, String),
    upstream: SocketAddr,
    refuse: Arc<AtomicU32>,
    prefix: String,
    server: Option<Launched<servers::S3>>,
    /// Whether the client retries a failed request (the default
    /// configuration does, up to 3 times): a retry hides a lost answer from
    /// the holder, which then sees the retry's outcome instead of an unknown.
    client_retries: bool,
}

impl ServerHarness {
    /// On the test process's shared S3 server.
    fn shared() -> ServerHarness {
        let s = servers::s3().unwrap_or_else(|e| {
            panic!(
                "S3 test server unavailable: {e} (run `cargo xtask provision --backend s3` \
                 or set LEASE_TEST_S3_ENDPOINT)"
            )
        });
        Self::on(s)
    }

    /// On a private moto, which the harness can pause.
    fn private() -> ServerHarness {
        let s = servers::spawn_s3().unwrap_or_else(|e| {
            panic!("cannot start a private moto: {e} (run `cargo xtask provision --backend s3`)")
        });
        let mut h = Self::on(&s);
        h.server = Some(Launched::new(s, false));
        h
    }

    fn on(s: &servers::S3) -> ServerHarness {
        let hostport = s
            .endpoint
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/');
        let upstream = hostport
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| panic!("cannot resolve the S3 endpoint {}", s.endpoint));
        ServerHarness {
            endpoint: s.endpoint.clone(),
            bucket: s.bucket.clone(),
            region: s.region.clone(),
            keys: (s.access_key.clone(), s.secret_key.clone()),
            upstream,
            refuse: Arc::new(AtomicU32::new(0)),
            prefix: common::unique_prefix("fault-runs"),
            server: None,
            client_retries: true,
        }
    }

    fn connect(&self, endpoint: String) -> Result<Arc<dyn LeaseBackend>, Error> {
        let mut config = S3Config::new(self.bucket.clone())
            .endpoint(endpoint)
            .region(self.region.clone())
            .credentials(self.keys.0.clone(), self.keys.1.clone());
        // A holder gives up on a request well within its deadline (2/3 of
        // the TTL): a blackhole or a frozen server must not hold a renewal
        // past the point where it could still help.
        config.request_timeout = Duration::from_millis(700);
        config.retry_timeout = Duration::from_millis(1000);
        let inner = if self.client_retries {
            config.build()?
        } else {
            lease_s3::build_s3(config.builder().with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: 0,
                retry_timeout: config.retry_timeout,
            }))?
        };
        let store: Arc<dyn ObjectStore> = Arc::new(Refusing {
            inner,
            refuse: self.refuse.clone(),
        });
        let c: Arc<dyn LeaseBackend> = Arc::new(ObjectStoreBackend::new(store, &self.prefix)?);
        Ok(c)
    }
}

impl Harness for ServerHarness {
    fn name(&self) -> &'static str {
        "s3"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move { self.connect(self.endpoint.clone()) })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(d + Duration::from_millis(100)))
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }
}

impl FaultHooks for ServerHarness {
    fn fail_next(&self, n: u32) -> bool {
        self.refuse.fetch_add(n, Ordering::SeqCst);
        true
    }

    fn upstream(&self) -> Option<SocketAddr> {
        Some(self.upstream)
    }

    fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>>> {
        Some(Box::pin(
            async move { self.connect(format!("http://{addr}")) },
        ))
    }

    fn server(&self) -> Option<&dyn ServerControl> {
        self.server.as_ref().map(|s| s as &dyn ServerControl)
    }
}

/// Runs `plan` on `h` with [`faults::run_with_progress`], reports the
/// outcome under `module` in the conformance matrix, and panics on a failure.
async fn safe_run(module: &str, h: &dyn Harness, plan: FaultPlan) -> Report {
    let started = Instant::now();
    let result = faults::run_with_progress(h, &plan).await;
    eprintln!(
        "{module} {}: whole test {:.2?}",
        plan.status_name(),
        started.elapsed()
    );
    match faults::record_plan_status(module, &plan, result) {
        Ok(r) => r,
        Err(f) => panic!(
            "{module}: unsafe or empty history under {}:\n{f}",
            plan.status_name()
        ),
    }
}

/// Records `kind` as not applicable on `module`, after checking the driver
/// refuses it on `h` too (when given).
async fn not_applicable(module: &str, h: Option<&dyn Harness>, kind: FaultKind, reason: &str) {
    let p = plan(kind, RUN);
    if let Some(h) = h {
        let r = faults::run(h, &p).await.unwrap_or_else(|f| panic!("{f}"));
        assert!(
            r.not_applicable.is_some(),
            "{module}: {} ran: {r}",
            p.status_name()
        );
    }
    let backend = if module == "s3" { "s3" } else { "s3_memory" };
    let report = Report::inapplicable(backend, kind, reason);
    eprintln!("{report}");
    faults::record_plan_status(module, &p, Ok(report)).unwrap_or_else(|f| panic!("{f}"));
}

const NO_CLOCK: &str = "no backend clock to move: an object store has none, and expiry is judged \
                        on each taker's own monotonic clock (a stalled clock is a paused holder)";

// ---- s3_memory ----

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_no_faults() {
    let p = quiet_plan(MEMORY_RUN);
    let elections = p.elections;
    let r = safe_run("s3_memory", &MemoryHarness::new(), p).await;
    assert_eq!(r.check.unknown, 0, "{r}");
    if let Err(why) = faults::tests_macro::dropped_within_terms(&r, elections) {
        panic!("{why}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_delayed_releases() {
    let r = safe_run(
        "s3_memory",
        &MemoryHarness::new(),
        plan(FaultKind::DelayedReleases(TTL / 4), MEMORY_RUN),
    )
    .await;
    // Terms last one to four TTLs: a short run ends few of them.
    assert!(r.faults_injected >= 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_lost_responses() {
    let r = safe_run(
        "s3_memory",
        &MemoryHarness::new(),
        plan(FaultKind::LostResponses, MEMORY_RUN),
    )
    .await;
    assert!(r.faults_injected >= 3, "{r}");
    assert!(r.check.unknown >= 2, "few unknown outcomes: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_failed_requests() {
    let r = safe_run(
        "s3_memory",
        &MemoryHarness::new(),
        plan(FaultKind::FailedRequests, MEMORY_RUN),
    )
    .await;
    assert!(r.faults_injected >= 3, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_latency() {
    safe_run(
        "s3_memory",
        &MemoryHarness::new(),
        plan(FaultKind::Latency(Duration::from_millis(150)), MEMORY_RUN),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_paused_holders() {
    let r = safe_run(
        "s3_memory",
        &MemoryHarness::new(),
        plan(FaultKind::PausedHolders(TTL * 5 / 4), MEMORY_RUN),
    )
    .await;
    assert!(r.faults_injected >= 2, "few pauses: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_real_resource() {
    faults::real_resource_row(
        "s3_memory",
        &MemoryHarness::new(),
        plan(FaultKind::PausedHolders(TTL * 5 / 4), MEMORY_RUN),
        lease_testkit::resources::in_memory_store(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_inapplicable_kinds_say_why() {
    let h = MemoryHarness::new();
    let in_process = "in-process store: no connection to sever or blackhole, no server process";
    for (kind, reason) in [
        (FaultKind::Sever, in_process),
        (FaultKind::Blackhole(TTL), in_process),
        (FaultKind::ServerPause(TTL), in_process),
        (FaultKind::ServerRestart, in_process),
        (
            FaultKind::ClockJumps {
                forward: TTL / 4,
                backward: TTL,
            },
            NO_CLOCK,
        ),
        (
            FaultKind::ClockJumps {
                forward: TTL,
                backward: TTL / 2,
            },
            NO_CLOCK,
        ),
    ] {
        not_applicable("s3_memory", Some(&h), kind, reason).await;
    }
}

// ---- s3 (the S3 server, through a fault proxy) ----

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_no_faults() {
    let _turn = SERVER_TURN.lock().await;
    let p = quiet_plan(RUN);
    let elections = p.elections;
    let r = safe_run("s3", &ServerHarness::shared(), p).await;
    assert_eq!(r.check.unknown, 0, "{r}");
    if let Err(why) = faults::tests_macro::dropped_within_terms(&r, elections) {
        panic!("{why}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_delayed_releases() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &ServerHarness::shared(),
        plan(FaultKind::DelayedReleases(TTL / 4), RUN),
    )
    .await;
    assert!(r.faults_injected >= 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_lost_responses() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &ServerHarness::shared(),
        plan(FaultKind::LostResponses, RUN),
    )
    .await;
    assert!(r.faults_injected >= 3, "{r}");
    let proxy = r.proxy.expect("a proxied run");
    assert!(proxy.dropped_exchanges >= 3, "{r}");
}

/// The same faults with a client that never retries: every dropped answer
/// and cut request reaches the holder as an unknown outcome, so the
/// checker's unknown-outcome rules get exercised on the real server too.
/// Not a matrix row of its own (the rows test the default configuration).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_lost_answers_reach_a_client_that_does_not_retry() {
    let _turn = SERVER_TURN.lock().await;
    let mut h = ServerHarness::shared();
    h.client_retries = false;
    for kind in [FaultKind::LostResponses, FaultKind::Sever] {
        let p = plan(kind, RUN);
        let r = match faults::run(&h, &p).await {
            Ok(r) => r,
            Err(f) => panic!("s3 without client retries, {}:\n{f}", kind.name()),
        };
        eprintln!("{r} (no client retries)");
        assert!(r.not_applicable.is_none(), "{r}");
        assert!(r.check.grants >= 2, "too few grants: {r}");
        assert!(r.check.unknown >= 3, "few unknown outcomes: {r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_failed_requests() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &ServerHarness::shared(),
        plan(FaultKind::FailedRequests, RUN),
    )
    .await;
    assert!(r.faults_injected >= 3, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_latency() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &ServerHarness::shared(),
        plan(FaultKind::Latency(Duration::from_millis(60)), RUN),
    )
    .await;
    assert!(r.proxy.is_some(), "latency goes through the proxy: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_severed_connections() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run("s3", &ServerHarness::shared(), plan(FaultKind::Sever, RUN)).await;
    assert!(r.faults_injected >= 3, "{r}");
    // moto closes each connection after its answer: a sever must still
    // have cut some requests in flight, else this run proved nothing.
    let proxy = r.proxy.expect("a proxied run");
    assert!(proxy.severed >= 2, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_blackhole() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &ServerHarness::shared(),
        // Half a TTL of silence, about once per TTL: long enough that
        // renewals time out, short enough that grants keep changing hands.
        plan(FaultKind::Blackhole(TTL / 2), RUN + RUN / 4),
    )
    .await;
    assert!(r.faults_injected >= 2, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_paused_holders() {
    let _turn = SERVER_TURN.lock().await;
    let r = safe_run(
        "s3",
        &ServerHarness::shared(),
        plan(FaultKind::PausedHolders(TTL * 5 / 4), RUN),
    )
    .await;
    assert!(r.faults_injected >= 2, "few pauses: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_real_resource() {
    let _turn = SERVER_TURN.lock().await;
    faults::real_resource_row(
        "s3",
        &ServerHarness::shared(),
        plan(FaultKind::PausedHolders(TTL * 5 / 4), RUN),
        lease_testkit::resources::s3_store(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_pause() {
    // A private moto: freezing the shared one would stall other tests.
    let h = ServerHarness::private();
    let r = safe_run(
        "s3",
        &h,
        plan(FaultKind::ServerPause(Duration::from_millis(2500)), RUN),
    )
    .await;
    assert!(r.faults_injected >= 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_inapplicable_kinds_say_why() {
    let h = ServerHarness::shared();
    not_applicable(
        "s3",
        None,
        FaultKind::ServerRestart,
        "moto keeps its state in memory: a restart empties the bucket, losing every lease \
         record and fence counter (no durable backend to restart)",
    )
    .await;
    for kind in [
        FaultKind::ClockJumps {
            forward: TTL / 4,
            backward: TTL,
        },
        FaultKind::ClockJumps {
            forward: TTL,
            backward: TTL / 2,
        },
    ] {
        not_applicable("s3", Some(&h), kind, NO_CLOCK).await;
    }
}
