//! FencedStore on objects that lost their metadata, and on a store that
//! drops it: the fence a framed object carries in its bytes still holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use lease_core::Fence;
use lease_fence::{FencedError, FencedStore};

use crate::store::{Hooked, Hooks};
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
    let hooks = Arc::new(Hooks::default());
    hooks.drops_metadata.store(true, Ordering::SeqCst);
    let inner: Arc<dyn ObjectStore> = Arc::new(Hooked {
        inner: Arc::new(InMemory::new()),
        hooks,
    });
    let store = FencedStore::new(inner.clone());
    let p = path("drops-metadata");
    let newer = store.put(&p, "newer".into(), Fence(9)).await;
    let stale = store.put(&p, "stale".into(), Fence(1)).await;
    assert!(
        newer.is_err() || stale.is_err(),
        "a store without metadata accepted fence 9 then fence 1: {newer:?}, {stale:?}"
    );
}
