//! FencedStore on objects that lost their metadata, and on a store that
//! drops it: the fence a framed object carries in its bytes still holds.

use std::sync::Arc;

use lease_core::Fence;
use lease_fence::{FencedError, FencedStore};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

fn path(name: &str) -> Path {
    Path::from(format!(
        "lease-fence-review/{name}/{}",
        lease_core::HolderId::random()
    ))
}

/// An object FencedStore wrote at fence 9 whose metadata was lost (copied
/// with its metadata replaced, restored from a backup by a tool that keeps
/// bytes only, or a store or proxy that silently drops user metadata) still
/// says `lease-fence/1 9 <nonce>` in its bytes. FencedStore reads it as an
/// unframed, never-fenced object: a stale write at fence 1 is accepted over
/// it, and `get` hands the frame back as the caller's data.
#[tokio::test]
async fn a_framed_object_that_lost_its_metadata_still_refuses_a_stale_write() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let store = FencedStore::new(inner.clone());
    let p = path("lost-metadata");
    store.put(&p, "newer".into(), Fence(9)).await.expect("put");
    // The same bytes, without the attributes.
    let raw = inner
        .get(&p)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    inner.put(&p, raw.clone().into()).await.expect("copy");

    let read = store.get(&p).await;
    let stale = store.put(&p, "stale".into(), Fence(1)).await;
    assert!(
        matches!(
            stale,
            Err(FencedError::Stale(_)) | Err(FencedError::CorruptFrame { .. })
        ),
        "a write at fence 1 over an object framed at fence 9 gave {stale:?} (and get gave {read:?}, the frame as data)"
    );
}

/// A store that silently drops user metadata (attributes) on put: the
/// documentation requires metadata support, but FencedStore never checks
/// for it. Every write is then unfenced and a stale write is accepted, with
/// no error, although FencedStore wrote the newer object itself.
#[tokio::test]
async fn a_store_that_drops_metadata_is_detected_not_silently_unfenced() {
    let inner: Arc<dyn ObjectStore> = Arc::new(DropsMetadata(InMemory::new()));
    let store = FencedStore::new(inner.clone());
    let p = path("drops-metadata");
    let newer = store.put(&p, "newer".into(), Fence(9)).await;
    let stale = store.put(&p, "stale".into(), Fence(1)).await;
    assert!(
        newer.is_err() || stale.is_err(),
        "a store without metadata accepted fence 9 then fence 1: {newer:?}, {stale:?}"
    );
}

mod drops {
    use async_trait::async_trait;
    use futures_core::stream::BoxStream;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{
        CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
        PutMultipartOptions, PutOptions, PutPayload, PutResult,
    };

    /// InMemory, but put ignores the attributes, as a store without user
    /// metadata does.
    #[derive(Debug)]
    pub struct DropsMetadata(pub InMemory);

    impl std::fmt::Display for DropsMetadata {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "DropsMetadata")
        }
    }

    #[async_trait]
    impl ObjectStore for DropsMetadata {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            let opts = PutOptions {
                mode: opts.mode,
                ..PutOptions::default()
            };
            self.0.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.0.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            self.0.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.0.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.0.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.0.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }
}

use drops::DropsMetadata;
