//! Shared by the integration tests: a fault-injecting wrapper around a real
//! store (in-memory or the S3 server), and how to reach the S3 server.
#![allow(dead_code)]

pub mod harness;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_core::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// Counts of requests that reached the wrapped store.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub get: u64,
    pub put: u64,
    pub delete: u64,
}

/// Wraps a real store: every request still goes to it, but the test can
/// delay requests, lose answers after they were applied, make the store
/// ignore preconditions, and count requests.
pub struct Faulty {
    pub inner: Arc<dyn ObjectStore>,
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

impl Faulty {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Faulty {
            inner,
            latency: Mutex::new(Duration::ZERO),
            drop_preconditions: AtomicBool::new(false),
            lose_next_puts: AtomicU32::new(0),
            conflict_after_next_puts: AtomicU32::new(0),
            fail_puts_containing: Mutex::new(None),
            gets: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            body_bytes: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn set_latency(&self, d: Duration) {
        *self.latency.lock().unwrap() = d;
    }

    /// Turn every conditional put into a plain overwrite, like a store that
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
        *self.fail_puts_containing.lock().unwrap() = part.map(str::to_owned);
    }

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
        let d = *self.latency.lock().unwrap();
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }
}

impl fmt::Debug for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

impl fmt::Display for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Faulty {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> Result<PutResult> {
        self.delay().await;
        self.puts.fetch_add(1, Ordering::SeqCst);
        if self.drop_preconditions.load(Ordering::SeqCst) {
            opts.mode = PutMode::Overwrite;
        }
        let refused = self
            .fail_puts_containing
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|part| location.as_ref().contains(part.as_str()));
        if refused {
            return Err(object_store::Error::PermissionDenied {
                path: location.to_string(),
                source: "injected: PUT refused".into(),
            });
        }
        let r = self.inner.put_opts(location, payload, opts).await;
        let spared =
            location.as_ref().contains(".lease-probe-") || location.as_ref().contains("/.audit/");
        let conflict = r.is_ok()
            && !spared
            && self
                .conflict_after_next_puts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if conflict {
            return Err(object_store::Error::Precondition {
                path: location.to_string(),
                source: "injected: applied, answered 5xx, retried into a precondition failure"
                    .into(),
            });
        }
        let lose = !spared
            && self
                .lose_next_puts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if lose {
            return Err(object_store::Error::Generic {
                store: "Faulty",
                source: format!("injected: the answer to PUT {location} was lost ({r:?})").into(),
            });
        }
        r
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.delay().await;
        self.gets.fetch_add(1, Ordering::SeqCst);
        let mut r = self.inner.get_opts(location, options).await?;
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

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
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

/// A prefix no other test process uses.
pub fn unique_prefix(name: &str) -> String {
    format!("lease-s3-tests/{name}/{}", lease_core::HolderId::random())
}

/// The S3 server of this test process (`LEASE_TEST_S3_ENDPOINT` with its
/// bucket and credentials, else moto started by `lease_testkit::servers`),
/// through the same client configuration users get.
pub fn s3_store() -> std::result::Result<Arc<dyn ObjectStore>, String> {
    let s = lease_testkit::servers::s3().map_err(|e| e.to_string())?;
    lease_s3::S3Config::new(s.bucket.clone())
        .endpoint(s.endpoint.clone())
        .region(s.region.clone())
        .credentials(s.access_key.clone(), s.secret_key.clone())
        .build()
        .map_err(|e| e.to_string())
}

/// Both stores every fault test runs on: in-memory, and the S3 server.
/// The S3 server is required: a missing server fails the test, loudly.
pub fn stores() -> Vec<(&'static str, Arc<dyn ObjectStore>)> {
    let memory = (
        "memory",
        Arc::new(object_store::memory::InMemory::new()) as Arc<dyn ObjectStore>,
    );
    if lease_conformance::skip_allowed("s3") {
        if let Err(e) = s3_store() {
            eprintln!("lease-s3: SKIPPED the S3 server half of this test (LEASE_TEST_SKIP): {e}");
            return vec![memory];
        }
    }
    let s3 = s3_store().unwrap_or_else(|e| panic!("S3 test server unavailable: {e} (run `cargo xtask provision --backend s3` or set LEASE_TEST_S3_ENDPOINT)"));
    vec![memory, ("s3", s3)]
}
