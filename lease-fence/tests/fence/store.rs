//! FencedStore on object_store's InMemory and on the S3 test server: the same
//! checks on both.

use std::sync::Arc;

use lease_core::Fence;
use lease_fence::{FencedError, FencedStore, FENCE_ATTRIBUTE};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{Attribute, Attributes, ObjectStore, ObjectStoreExt, PutOptions};

/// Both stores: in memory, and the S3 server (required: a missing server
/// fails the test unless `LEASE_TEST_SKIP` names s3, and then says so).
fn stores() -> Vec<(&'static str, Arc<dyn ObjectStore>)> {
    let mut stores: Vec<(&'static str, Arc<dyn ObjectStore>)> =
        vec![("memory", Arc::new(InMemory::new()))];
    match s3() {
        Ok(s3) => stores.push(("s3", s3)),
        Err(e) if lease_conformance::skip_allowed("s3") => {
            eprintln!("lease-fence: SKIPPED the S3 half of this test (LEASE_TEST_SKIP): {e}");
        }
        Err(e) => panic!(
            "S3 test server unavailable: {e} (run `cargo xtask provision --backend s3` or set LEASE_TEST_S3_ENDPOINT)"
        ),
    }
    stores
}

fn s3() -> Result<Arc<dyn ObjectStore>, String> {
    let s = lease_testkit::servers::s3().map_err(|e| e.to_string())?;
    lease_s3::S3Config::new(s.bucket.clone())
        .endpoint(s.endpoint.clone())
        .region(s.region.clone())
        .credentials(s.access_key.clone(), s.secret_key.clone())
        .build()
        .map_err(|e| e.to_string())
}

fn path(name: &str) -> Path {
    Path::from(format!(
        "lease-fence-tests/{name}/{}",
        lease_core::HolderId::random()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_fence_never_overwrites_a_higher_one() {
    for (name, inner) in stores() {
        let store = FencedStore::new(inner);
        let p = path("basics");
        assert_eq!(
            store.get(&p).await.expect("get").map(|o| o.fence),
            None,
            "{name}"
        );
        store
            .put(&p, "five".into(), Fence(5))
            .await
            .expect("create");
        store
            .put(&p, "five again".into(), Fence(5))
            .await
            .expect("same fence");
        match store.put(&p, "four".into(), Fence(4)).await {
            Err(FencedError::Stale(s)) => {
                assert_eq!((s.offered, s.seen), (Fence(4), Fence(5)), "{name}");
                assert_eq!(s.resource, p.to_string(), "{name}");
            }
            other => panic!("{name}: a lower fence must be refused, got {other:?}"),
        }
        let object = store.get(&p).await.expect("get").expect("exists");
        assert_eq!(
            (&object.bytes[..], object.fence),
            (&b"five again"[..], Some(Fence(5))),
            "{name}"
        );
        store
            .put(&p, "seven".into(), Fence(7))
            .await
            .expect("higher fence");
        assert_eq!(
            store.fence(&p).await.expect("fence"),
            Some(Fence(7)),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_keeps_the_fence_so_a_stale_writer_cannot_recreate() {
    for (name, inner) in stores() {
        let store = FencedStore::new(inner);
        let p = path("tombstone");
        store.put(&p, "v".into(), Fence(3)).await.expect("create");
        assert!(
            matches!(store.delete(&p, Fence(2)).await, Err(FencedError::Stale(_))),
            "{name}: a stale delete is refused"
        );
        store.delete(&p, Fence(7)).await.expect("delete");
        assert_eq!(store.get(&p).await.expect("get"), None, "{name}: deleted");
        assert_eq!(
            store.fence(&p).await.expect("fence"),
            Some(Fence(7)),
            "{name}"
        );
        assert!(
            matches!(
                store.put(&p, "stale".into(), Fence(6)).await,
                Err(FencedError::Stale(_))
            ),
            "{name}: a stale writer cannot re-create it"
        );
        store
            .put(&p, "back".into(), Fence(8))
            .await
            .expect("re-create");
        let object = store.get(&p).await.expect("get").expect("exists again");
        assert_eq!(
            (&object.bytes[..], object.fence),
            (&b"back"[..], Some(Fence(8))),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfenced_object_is_overwritten_and_a_malformed_fence_left_untouched() {
    for (name, inner) in stores() {
        let store = FencedStore::new(inner.clone());
        let p = path("unfenced");
        inner.put(&p, "plain".into()).await.expect("plain put");
        store
            .put(&p, "fenced".into(), Fence(1))
            .await
            .expect("unfenced counts as no fence");
        assert_eq!(
            store.fence(&p).await.expect("fence"),
            Some(Fence(1)),
            "{name}"
        );

        let bad = path("malformed");
        let attributes =
            Attributes::from_iter([(Attribute::Metadata(FENCE_ATTRIBUTE.into()), "not-a-number")]);
        let options = PutOptions {
            attributes,
            ..PutOptions::default()
        };
        inner
            .put_opts(&bad, "precious".into(), options)
            .await
            .expect("seed a bad object");
        let before = inner.head(&bad).await.expect("head");
        match store.put(&bad, "overwrite".into(), Fence(9)).await {
            Err(FencedError::Corrupt { value, .. }) => assert_eq!(value, "not-a-number", "{name}"),
            other => panic!("{name}: a malformed fence must be an error, got {other:?}"),
        }
        assert!(
            matches!(store.get(&bad).await, Err(FencedError::Corrupt { .. })),
            "{name}"
        );
        let after = inner.head(&bad).await.expect("head");
        assert_eq!(
            before.e_tag, after.e_tag,
            "{name}: the object was not rewritten"
        );
        let bytes = inner
            .get(&bad)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(&bytes[..], b"precious", "{name}: byte-identical");
    }
}

/// Writers at many fences at once: the object ends at the highest fence that
/// was written, every write that was refused was below a fence already
/// written — what a sequential check would leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_end_at_the_highest_fence_written() {
    for (name, inner) in stores() {
        let store = Arc::new(FencedStore::new(inner));
        let p = path("concurrent");
        let fences: Vec<u64> = (0..16u64).map(|i| (i * 7) % 16 + 1).collect();
        let tasks: Vec<_> = fences
            .iter()
            .map(|&f| {
                let (store, p) = (store.clone(), p.clone());
                tokio::spawn(
                    async move { (f, store.put(&p, f.to_string().into(), Fence(f)).await) },
                )
            })
            .collect();
        let mut written = Vec::new();
        for t in tasks {
            let (f, result) = t.await.expect("task");
            match result {
                Ok(_) => written.push(f),
                Err(FencedError::Stale(s)) => {
                    assert!(s.seen > s.offered, "{name}: {s}");
                }
                Err(FencedError::Contention { .. }) => {}
                Err(e) => panic!("{name}: fence {f}: {e:?}"),
            }
        }
        let top = written.iter().copied().max().expect("some write went in");
        let object = store.get(&p).await.expect("get").expect("exists");
        assert_eq!(
            object.fence,
            Some(Fence(top)),
            "{name}: written {written:?}"
        );
        assert_eq!(&object.bytes[..], top.to_string().as_bytes(), "{name}");
    }
}
