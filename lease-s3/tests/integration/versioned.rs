//! A store that, like Google Cloud Storage through object_store, reports an
//! object version (the generation) and accepts a conditional update only with
//! that version: every operation must carry it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_core::{
    Acquire, AcquireRequest, BreakNote, HolderId, LeaseBackend, LeaseKey, LeaseState, Payload,
    Renewal,
};
use lease_s3::bucket_lease::BucketLease;
use lease_s3::ObjectStoreBackend;
use lease_testkit::stores::{Intercepted, Interceptor};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ObjectStore, PutMode, PutOptions, PutPayload, PutResult, Result,
    UpdateVersion,
};
use tokio::sync::Mutex;

/// GCS's rules for conditional writes in front of a store: `Update` needs
/// the generation and compares only it, as object_store's GCS client does.
struct GcsRules {
    gens: Mutex<Generations>,
}

/// The last generation handed out, and path → (generation, the inner
/// store's ETag of that generation).
type Generations = (u64, HashMap<Path, (u64, String)>);

#[async_trait]
impl Interceptor for GcsRules {
    async fn put(
        &self,
        inner: &dyn ObjectStore,
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
        let mut r = inner.put_opts(location, payload, opts).await?;
        g.0 += 1;
        let gen = g.0;
        let etag = r.e_tag.clone().unwrap_or_default();
        g.1.insert(location.clone(), (gen, etag));
        r.version = Some(gen.to_string());
        Ok(r)
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        options: GetOptions,
    ) -> Result<GetResult> {
        let g = self.gens.lock().await;
        let mut r = inner.get_opts(location, options).await?;
        r.meta.version = g.1.get(location).map(|(gen, _)| gen.to_string());
        Ok(r)
    }

    // Deletes pass through: generations of deleted objects are not
    // forgotten here, and a stale one can never match a later write's,
    // which is all a test needs.
}

/// InMemory behind GCS's rules.
fn gcs_like() -> Arc<dyn ObjectStore> {
    Arc::new(Intercepted {
        inner: Arc::new(InMemory::new()),
        hooks: GcsRules {
            gens: Mutex::new((1_000_000, HashMap::new())),
        },
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
