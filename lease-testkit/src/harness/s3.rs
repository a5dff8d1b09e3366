//! Object stores: a fault-injecting wrapper around a real store
//! ([`Faulty`]), the conformance harness on one store ([`ObjectHarness`]),
//! the fault-run harnesses ([`MemoryFaultHarness`] on `InMemory`,
//! [`S3FaultHarness`] on the S3 server), and how to reach the S3 server.
//!
//! Expiry is judged by each client's own clock, so `pass` really sleeps.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures_core::stream::BoxStream;
use lease_conformance::faults::{FaultHooks, Launched, ServerControl};
use lease_conformance::Harness;
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_s3::{ObjectStoreBackend, S3Config};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    BackoffConfig, GetOptions, GetResult, GetResultPayload, ObjectStore, ObjectStoreExt, PutMode,
    PutOptions, PutPayload, PutResult, Result, RetryConfig,
};

pub use super::or_panic;
use super::socket_addr;
use crate::servers;
use crate::stores::{Intercepted, Interceptor};

/// How long after a TTL a taker has certainly seen a record unchanged for
/// a TTL on its own clock: the request that starts the observation.
const OBSERVATION_SLACK: Duration = Duration::from_millis(100);

/// Counts of requests that reached the wrapped store.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// GETs (and HEADs).
    pub get: u64,
    /// PUTs.
    pub put: u64,
    /// Delete requests.
    pub delete: u64,
}

/// What a [`Faulty`] store does to its requests: delay them, lose answers
/// after they were applied, ignore preconditions, and count them.
#[derive(Debug, Default)]
pub struct Faults {
    latency: Mutex<Duration>,
    drop_preconditions: AtomicBool,
    lose_next_puts: AtomicU32,
    conflict_after_next_puts: AtomicU32,
    fail_puts_containing: Mutex<Option<String>>,
    gets: AtomicU64,
    puts: AtomicU64,
    deletes: AtomicU64,
    /// Bytes of GET bodies the client pulled out of the store.
    body_bytes: Arc<AtomicU64>,
}

/// A real store behind [`Faults`]: every request still goes to it, but the
/// test can delay requests, lose answers after they were applied, make the
/// store ignore preconditions, and count requests.
pub type Faulty = Intercepted<Faults>;

impl Intercepted<Faults> {
    /// `inner` with no fault on yet.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Faulty> {
        Arc::new(Intercepted {
            inner,
            hooks: Faults::default(),
        })
    }
}

/// A lock whose holder cannot leave it inconsistent (plain values).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Faults {
    /// Delays every request by `d` from now on.
    pub fn set_latency(&self, d: Duration) {
        *lock(&self.latency) = d;
    }

    /// Turns every conditional put into a plain overwrite, like a store that
    /// ignores `If-None-Match` / `If-Match`.
    pub fn drop_preconditions(&self, on: bool) {
        self.drop_preconditions.store(on, Ordering::SeqCst);
    }

    /// The next `n` PUTs are applied, then their answers are lost.
    /// Scratch objects of the precondition probe and break audit records are
    /// never affected.
    pub fn lose_next_puts(&self, n: u32) {
        self.lose_next_puts.store(n, Ordering::SeqCst);
    }

    /// The next `n` PUTs are applied, then answered with a precondition
    /// failure: what object_store reports when a write was applied, its
    /// answer was a 5xx, and its retry found the object already changed.
    /// Scratch objects of the precondition probe and break audit records are
    /// never affected.
    pub fn conflict_after_next_puts(&self, n: u32) {
        self.conflict_after_next_puts.store(n, Ordering::SeqCst);
    }

    /// PUTs to paths containing `part` fail before reaching the store.
    pub fn fail_puts_containing(&self, part: Option<&str>) {
        *lock(&self.fail_puts_containing) = part.map(str::to_owned);
    }

    /// The requests that reached the store so far.
    pub fn counts(&self) -> Counts {
        Counts {
            get: self.gets.load(Ordering::SeqCst),
            put: self.puts.load(Ordering::SeqCst),
            delete: self.deletes.load(Ordering::SeqCst),
        }
    }

    /// Bytes of GET bodies read so far (not counting bodies dropped unread).
    pub fn body_bytes_read(&self) -> u64 {
        self.body_bytes.load(Ordering::SeqCst)
    }

    async fn delay(&self) {
        let d = *lock(&self.latency);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }
}

/// Whether a fault on puts spares `location`: the precondition probe's
/// scratch objects and break audit records are not lease records.
fn spared(location: &Path) -> bool {
    location.as_ref().contains(".lease-probe-") || location.as_ref().contains("/.audit/")
}

/// One pending fault taken, when any is left.
fn take_one(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl Interceptor for Faults {
    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> Result<PutResult> {
        self.delay().await;
        self.puts.fetch_add(1, Ordering::SeqCst);
        if self.drop_preconditions.load(Ordering::SeqCst) {
            opts.mode = PutMode::Overwrite;
        }
        let refused = lock(&self.fail_puts_containing)
            .as_ref()
            .is_some_and(|part| location.as_ref().contains(part.as_str()));
        if refused {
            return Err(object_store::Error::PermissionDenied {
                path: location.to_string(),
                source: "injected: PUT refused".into(),
            });
        }
        let r = inner.put_opts(location, payload, opts).await;
        let spared = spared(location);
        if r.is_ok() && !spared && take_one(&self.conflict_after_next_puts) {
            return Err(object_store::Error::Precondition {
                path: location.to_string(),
                source: "injected: applied, answered 5xx, retried into a precondition failure"
                    .into(),
            });
        }
        if !spared && take_one(&self.lose_next_puts) {
            return Err(object_store::Error::Generic {
                store: "Faulty",
                source: format!("injected: the answer to PUT {location} was lost ({r:?})").into(),
            });
        }
        r
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        options: GetOptions,
    ) -> Result<GetResult> {
        self.delay().await;
        self.gets.fetch_add(1, Ordering::SeqCst);
        let mut r = inner.get_opts(location, options).await?;
        // Irrefutable unless object_store's `fs` feature adds `File`.
        #[allow(irrefutable_let_patterns)]
        if let GetResultPayload::Stream(s) = r.payload {
            r.payload = GetResultPayload::Stream(Box::pin(Counted {
                inner: s,
                bytes: self.body_bytes.clone(),
            }));
        }
        Ok(r)
    }

    fn delete(
        &self,
        inner: &dyn ObjectStore,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        inner.delete_stream(locations)
    }
}

/// A body stream that counts the bytes pulled through it.
struct Counted<T> {
    inner: BoxStream<'static, Result<T>>,
    bytes: Arc<AtomicU64>,
}

impl<T: AsRef<[u8]>> futures_core::Stream for Counted<T> {
    type Item = Result<T>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let p = self.inner.as_mut().poll_next(cx);
        if let std::task::Poll::Ready(Some(Ok(b))) = &p {
            self.bytes
                .fetch_add(b.as_ref().len() as u64, Ordering::SeqCst);
        }
        p
    }
}

/// Refuses a store's next requests before they are sent (the store never
/// sees them): the fault runs' failed requests.
#[derive(Debug, Default)]
pub struct Refusals {
    refuse: Arc<AtomicU32>,
}

impl Refusals {
    /// The next `n` requests (besides the precondition probe's puts) fail.
    pub fn fail_next(&self, n: u32) {
        self.refuse.fetch_add(n, Ordering::SeqCst);
    }

    /// `inner` behind these refusals.
    pub fn wrap(&self, inner: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
        Arc::new(Intercepted {
            inner,
            hooks: Refusals {
                refuse: self.refuse.clone(),
            },
        })
    }

    fn refused(&self, what: &str, location: &Path) -> Option<object_store::Error> {
        take_one(&self.refuse).then(|| object_store::Error::Generic {
            store: "Refusing",
            source: format!("injected: {what} {location} failed before it was sent").into(),
        })
    }
}

#[async_trait]
impl Interceptor for Refusals {
    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        if !location.as_ref().contains(".lease-probe-") {
            if let Some(e) = self.refused("PUT", location) {
                return Err(e);
            }
        }
        inner.put_opts(location, payload, opts).await
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        options: GetOptions,
    ) -> Result<GetResult> {
        if let Some(e) = self.refused("GET", location) {
            return Err(e);
        }
        inner.get_opts(location, options).await
    }
}

/// A prefix no other test process uses.
pub fn unique_prefix(name: &str) -> String {
    format!("lease-s3-tests/{name}/{}", lease_core::HolderId::random())
}

fn unavailable(e: impl std::fmt::Display) -> String {
    format!(
        "S3 test server unavailable: {e} (run `cargo xtask provision --backend s3` or set LEASE_TEST_S3_ENDPOINT)"
    )
}

/// The S3 server of this test process (`LEASE_TEST_S3_ENDPOINT` with its
/// bucket and credentials, else moto started by [`servers::s3`]),
/// through the same client configuration users get.
pub fn s3_store() -> std::result::Result<Arc<dyn ObjectStore>, String> {
    let s = servers::s3().map_err(|e| e.to_string())?;
    S3Config::new(s.bucket.clone())
        .endpoint(s.endpoint.clone())
        .region(s.region.clone())
        .credentials(s.access_key.clone(), s.secret_key.clone())
        .build()
        .map_err(|e| e.to_string())
}

/// Both stores every fault test runs on: in-memory, and the S3 server.
/// The S3 server is required: a missing server fails the test, loudly,
/// unless `LEASE_TEST_SKIP` names `s3`.
pub fn stores() -> Vec<(&'static str, Arc<dyn ObjectStore>)> {
    let memory = ("memory", Arc::new(InMemory::new()) as Arc<dyn ObjectStore>);
    if lease_conformance::skip_allowed("s3") {
        if let Err(e) = s3_store() {
            eprintln!("SKIPPED the S3 server half of this test (LEASE_TEST_SKIP): {e}");
            return vec![memory];
        }
    }
    let s3 = s3_store().unwrap_or_else(|e| panic!("{}", unavailable(e)));
    vec![memory, ("s3", s3)]
}

/// The conformance harness: clients of one store (in-memory or the S3
/// server) under a prefix of their own, behind a [`Faulty`] for latency.
pub struct ObjectHarness {
    name: &'static str,
    store: Arc<Faulty>,
    prefix: String,
    model_cases: u32,
}

impl ObjectHarness {
    fn new(name: &'static str, store: Arc<dyn ObjectStore>, model_cases: u32) -> Self {
        ObjectHarness {
            name,
            store: Faulty::new(store),
            prefix: unique_prefix("conformance"),
            model_cases,
        }
    }

    /// On a fresh in-memory store (`s3-memory`).
    pub fn memory() -> std::result::Result<Self, String> {
        Ok(Self::new("s3-memory", Arc::new(InMemory::new()), 48))
    }

    /// On the test process's S3 server (`s3`).
    pub fn s3() -> std::result::Result<Self, String> {
        // Each model case is a few dozen requests on a server that serves one
        // request at a time: fewer cases keep the property within minutes.
        Ok(Self::new("s3", s3_store()?, 12))
    }

    fn path(&self, key: &LeaseKey) -> std::result::Result<Path, Error> {
        Path::parse(format!("{}/{}", self.prefix, key.as_str()))
            .map_err(|e| Error::Backend(e.into()))
    }
}

impl Harness for ObjectHarness {
    fn name(&self) -> &'static str {
        self.name
    }

    fn client(&self) -> BoxFuture<'_, std::result::Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let store: Arc<dyn ObjectStore> = self.store.clone();
            let c: Arc<dyn LeaseBackend> = Arc::new(ObjectStoreBackend::new(store, &self.prefix)?);
            Ok(c)
        })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(d + OBSERVATION_SLACK))
    }

    fn write_corrupt<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> Option<BoxFuture<'a, std::result::Result<(), Error>>> {
        Some(Box::pin(async move {
            self.store
                .inner
                .put(&self.path(key)?, PutPayload::from_static(b"not json"))
                .await
                .map_err(|e| Error::Backend(e.into()))?;
            Ok(())
        }))
    }

    fn delete_outside<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> Option<BoxFuture<'a, std::result::Result<(), Error>>> {
        // As an operator would: a plain DELETE of the lease object.
        Some(Box::pin(async move {
            self.store
                .inner
                .delete(&self.path(key)?)
                .await
                .map_err(|e| Error::Backend(e.into()))
        }))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        self.store.set_latency(latency);
        true
    }

    fn model_cases(&self) -> u32 {
        self.model_cases
    }
}

/// The fault runs' `s3_memory`: one `InMemory` store behind a [`Faulty`]
/// (latency, lost answers) and [`Refusals`] (failed requests); each
/// contender gets its own client.
pub struct MemoryFaultHarness {
    store: Arc<Faulty>,
    refusals: Refusals,
    prefix: String,
}

impl MemoryFaultHarness {
    /// On a fresh in-memory store.
    pub fn new() -> MemoryFaultHarness {
        MemoryFaultHarness {
            store: Faulty::new(Arc::new(InMemory::new())),
            refusals: Refusals::default(),
            prefix: unique_prefix("fault-runs"),
        }
    }
}

impl Default for MemoryFaultHarness {
    fn default() -> Self {
        MemoryFaultHarness::new()
    }
}

impl Harness for MemoryFaultHarness {
    fn name(&self) -> &'static str {
        "s3_memory"
    }

    fn client(&self) -> BoxFuture<'_, std::result::Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let store = self.refusals.wrap(self.store.clone());
            let c: Arc<dyn LeaseBackend> = Arc::new(ObjectStoreBackend::new(store, &self.prefix)?);
            Ok(c)
        })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(d + OBSERVATION_SLACK))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        self.store.set_latency(latency);
        true
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }
}

impl FaultHooks for MemoryFaultHarness {
    fn lose_next_responses(&self, n: u32) -> bool {
        // Applied, then answered with an error: the in-memory store has no
        // wire on which an answer could be lost, so the wrapper loses it.
        self.store.lose_next_puts(n);
        true
    }

    fn fail_next(&self, n: u32) -> bool {
        self.refusals.fail_next(n);
        true
    }
}

/// The fault runs' `s3`: the S3 server (shared, or a private moto this
/// harness can pause), reached directly or through the driver's
/// `FaultProxy`, with [`Refusals`] for failed requests.
pub struct S3FaultHarness {
    endpoint: String,
    bucket: String,
    region: String,
    keys: (String, String),
    upstream: SocketAddr,
    refusals: Refusals,
    prefix: String,
    server: Option<Launched<servers::S3>>,
    /// Whether the client retries a failed request (the default
    /// configuration does, up to 3 times): a retry hides a lost answer from
    /// the holder, which then sees the retry's outcome instead of an
    /// unknown.
    pub client_retries: bool,
    /// How long the client waits for one answer (700 ms by default: 2/3 of
    /// the TTL's deadline, so that a blackhole or a frozen server cannot
    /// hold a renewal past the point where it could still help). Its
    /// retries give up 300 ms after that. A run that must see no unknown
    /// outcome on a loaded machine waits longer: a late answer is still an
    /// answer.
    pub request_timeout: Duration,
}

impl S3FaultHarness {
    /// On the test process's shared S3 server.
    pub fn shared() -> std::result::Result<S3FaultHarness, String> {
        Self::on(servers::s3().map_err(unavailable)?)
    }

    /// On a private moto, which the harness can pause.
    pub fn private() -> std::result::Result<S3FaultHarness, String> {
        let s = servers::spawn_s3().map_err(|e| {
            format!("cannot start a private moto: {e} (run `cargo xtask provision --backend s3`)")
        })?;
        let mut h = Self::on(&s)?;
        h.server = Some(Launched::new(s, false));
        Ok(h)
    }

    fn on(s: &servers::S3) -> std::result::Result<S3FaultHarness, String> {
        Ok(S3FaultHarness {
            endpoint: s.endpoint.clone(),
            bucket: s.bucket.clone(),
            region: s.region.clone(),
            keys: (s.access_key.clone(), s.secret_key.clone()),
            upstream: socket_addr(&s.endpoint)?,
            refusals: Refusals::default(),
            prefix: unique_prefix("fault-runs"),
            server: None,
            client_retries: true,
            request_timeout: Duration::from_millis(700),
        })
    }

    fn connect(&self, endpoint: String) -> std::result::Result<Arc<dyn LeaseBackend>, Error> {
        let mut config = S3Config::new(self.bucket.clone())
            .endpoint(endpoint)
            .region(self.region.clone())
            .credentials(self.keys.0.clone(), self.keys.1.clone());
        config.request_timeout = self.request_timeout;
        config.retry_timeout = self.request_timeout + Duration::from_millis(300);
        let inner = if self.client_retries {
            config.build()?
        } else {
            lease_s3::build_s3(config.builder().with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: 0,
                retry_timeout: config.retry_timeout,
            }))?
        };
        let store = self.refusals.wrap(inner);
        let c: Arc<dyn LeaseBackend> = Arc::new(ObjectStoreBackend::new(store, &self.prefix)?);
        Ok(c)
    }
}

impl Harness for S3FaultHarness {
    fn name(&self) -> &'static str {
        "s3"
    }

    fn client(&self) -> BoxFuture<'_, std::result::Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move { self.connect(self.endpoint.clone()) })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(d + OBSERVATION_SLACK))
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }
}

impl FaultHooks for S3FaultHarness {
    fn fail_next(&self, n: u32) -> bool {
        self.refusals.fail_next(n);
        true
    }

    fn upstream(&self) -> Option<SocketAddr> {
        Some(self.upstream)
    }

    fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<BoxFuture<'_, std::result::Result<Arc<dyn LeaseBackend>, Error>>> {
        Some(Box::pin(
            async move { self.connect(format!("http://{addr}")) },
        ))
    }

    fn server(&self) -> Option<&dyn ServerControl> {
        self.server.as_ref().map(|s| s as &dyn ServerControl)
    }
}
