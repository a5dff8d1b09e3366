//! A store that, like Google Cloud Storage through object_store, reports an
//! object version (the generation) and accepts a conditional update only with
//! that version: every operation must carry it.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_core::stream::BoxStream;
use lease_core::{
    Acquire, AcquireRequest, BreakNote, HolderId, LeaseBackend, LeaseKey, LeaseState, Payload,
    Renewal,
};
use lease_s3::bucket_lease::BucketLease;
use lease_s3::ObjectStoreBackend;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UpdateVersion,
};
use tokio::sync::Mutex;

/// InMemory behind GCS's rules for conditional writes: `Update` needs the
/// generation and compares only it, as object_store's GCS client does.
struct GcsLike {
    inner: InMemory,
    gens: Mutex<Generations>,
}

/// The last generation handed out, and path → (generation, the inner
/// store's ETag of that generation).
type Generations = (u64, HashMap<Path, (u64, String)>);

impl fmt::Debug for GcsLike {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GcsLike")
    }
}
impl fmt::Display for GcsLike {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GcsLike")
    }
}

#[async_trait]
impl ObjectStore for GcsLike {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> Result<PutResult> {
        let mut g = self.gens.lock().await;
        if let PutMode::Update(v) = &opts.mode {
            // object_store's GCS client, before sending anything.
            let Some(want) = v.version.clone() else {
                return Err(object_store::Error::Generic {
                    store: "GCS",
                    source: "Version required for conditional update".into(),
                });
            };
            match g.1.get(location) {
                Some((gen, etag)) if gen.to_string() == want => {
                    opts.mode = PutMode::Update(UpdateVersion {
                        e_tag: Some(etag.clone()),
                        version: None,
                    })
                }
                _ => {
                    return Err(object_store::Error::Precondition {
                        path: location.to_string(),
                        source: format!("generation does not match {want}").into(),
                    })
                }
            }
        }
        let mut r = self.inner.put_opts(location, payload, opts).await?;
        g.0 += 1;
        let gen = g.0;
        let etag = r.e_tag.clone().unwrap_or_default();
        g.1.insert(location.clone(), (gen, etag));
        r.version = Some(gen.to_string());
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let g = self.gens.lock().await;
        let mut r = self.inner.get_opts(location, options).await?;
        r.meta.version = g.1.get(location).map(|(gen, _)| gen.to_string());
        Ok(r)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        // Generations of deleted objects are not forgotten here: a stale one
        // can never match a later write's, which is all a test needs.
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

fn gcs_like() -> Arc<dyn ObjectStore> {
    Arc::new(GcsLike {
        inner: InMemory::new(),
        gens: Mutex::new((1_000_000, HashMap::new())),
    })
}

#[tokio::test]
async fn every_operation_works_on_a_store_that_needs_the_object_version() {
    let store = gcs_like();
    let c = ObjectStoreBackend::new(store.clone(), "leases").unwrap();
    let k = LeaseKey::new("gcs/job").unwrap();
    let ttl = Duration::from_secs(30);
    let a = HolderId::random();
    let first = match c
        .try_acquire(AcquireRequest::new(k.clone(), a.clone()).ttl(ttl))
        .await
        .unwrap()
    {
        Acquire::Granted(g) => g,
        other => panic!("first acquire: {other:?}"),
    };
    // Re-acquire by the holder (an Update of its own record).
    let g = c
        .try_acquire(AcquireRequest::new(k.clone(), a.clone()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(g.fence(), first.fence());
    let g = match c.renew(&g, None).await.unwrap() {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("renew lost"),
    };
    let g = match c
        .renew(&g, Some(Payload::new(b"p".to_vec()).unwrap()))
        .await
        .unwrap()
    {
        Renewal::Renewed(g) => g,
        Renewal::Lost => panic!("renew with payload lost"),
    };
    c.release(&g).await.unwrap();
    assert_eq!(c.read(&k).await.unwrap(), LeaseState::Free);
    let g2 = c
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert!(g2.fence() > g.fence());
    let note = BreakNote::new("test", "versioned store").with_at_unix_ms(1);
    let broken = c.break_lease(&k, &note).await.unwrap();
    assert!(broken.previous.is_some());
    assert_eq!(c.read(&k).await.unwrap(), LeaseState::Free);

    let lease = BucketLease::acquire(store.clone(), "bucket", 30)
        .await
        .unwrap();
    lease.renew().await.unwrap();
    lease.release().await.unwrap();
}
