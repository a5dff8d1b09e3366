//! FencedStore on object_store's InMemory and on the S3 test server: the same
//! checks on both; and on LocalFileSystem, which it does not support.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lease_core::Fence;
use lease_fence::{FencedError, FencedStore, FENCE_ATTRIBUTE, NONCE_ATTRIBUTE};
use lease_testkit::harness::s3::stores;
use lease_testkit::stores::{Intercepted, Interceptor};
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ObjectStore, ObjectStoreExt, PutOptions, PutPayload, PutResult,
};

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
                // A put refused under contention may have been applied:
                // the write was overwritten by a higher fence.
                Err(FencedError::OutcomeUnknown { seen, .. }) => {
                    assert!(seen >= Some(Fence(f)), "{name}: fence {f}, seen {seen:?}");
                }
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

type Hook = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a [`Hooked`] store does around its next put, each at most once,
/// and whether it drops every put's metadata.
#[derive(Default)]
pub(crate) struct Hooks {
    /// Runs before the next put reaches the store: the writer is paused
    /// between its read and its conditional put.
    before_put: Mutex<Option<Hook>>,
    /// Runs after the next put was applied; that put is then answered with
    /// a precondition failure, as object_store's retry of an applied write
    /// (after a 5xx or a 409) is.
    applied_then_refused: Mutex<Option<Hook>>,
    puts: AtomicUsize,
    /// Puts ignore their attributes, as a store without user metadata does.
    pub(crate) drops_metadata: AtomicBool,
}

impl Hooks {
    fn take(slot: &Mutex<Option<Hook>>) -> Option<Hook> {
        slot.lock().unwrap().take()
    }
}

/// An object store that runs [`Hooks`] around its puts.
pub(crate) type Hooked = Intercepted<Arc<Hooks>>;

#[async_trait]
impl Interceptor for Hooks {
    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        if let Some(hook) = Hooks::take(&self.before_put) {
            hook.await;
        }
        let opts = if self.drops_metadata.load(Ordering::SeqCst) {
            PutOptions {
                mode: opts.mode,
                ..PutOptions::default()
            }
        } else {
            opts
        };
        let r = inner.put_opts(location, payload, opts).await?;
        if let Some(hook) = Hooks::take(&self.applied_then_refused) {
            hook.await;
            return Err(object_store::Error::Precondition {
                path: location.to_string(),
                source: "injected: applied, answered 5xx, retried into a precondition failure"
                    .into(),
            });
        }
        Ok(r)
    }
}

fn hooked(inner: &Arc<dyn ObjectStore>) -> (FencedStore<Hooked>, Arc<Hooks>) {
    let hooks = Arc::new(Hooks::default());
    let store = FencedStore::new(Hooked {
        inner: inner.clone(),
        hooks: hooks.clone(),
    });
    (store, hooks)
}

/// A stale writer A reads the object, pauses before its conditional put,
/// and a newer writer B leaves the object with the same bytes as before —
/// a tombstone after a tombstone, or the same payload at a higher fence.
/// On S3 the ETag is a hash of the bytes, so A's If-Match would still
/// match: A's write must be refused all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_write_paused_before_its_put_never_lands_after_a_newer_write() {
    for (name, inner) in stores() {
        let b = Arc::new(FencedStore::new(inner.clone()));

        // A tombstone at 5, then B deletes again at 6 while A is paused.
        let p = path("same-tombstone");
        b.put(&p, "old".into(), Fence(5)).await.expect("put");
        b.delete(&p, Fence(5)).await.expect("delete at 5");
        let (a, hooks) = hooked(&inner);
        let (b2, p2) = (b.clone(), p.clone());
        *hooks.before_put.lock().unwrap() = Some(Box::pin(async move {
            b2.delete(&p2, Fence(6)).await.expect("B deletes at 6");
        }));
        let late = a.put(&p, "A's stale bytes".into(), Fence(5)).await;
        assert!(
            matches!(
                late,
                Err(FencedError::Stale(_)) | Err(FencedError::OutcomeUnknown { .. })
            ),
            "{name}: A's write at 5 after B's delete at 6 must be refused, got {late:?}"
        );
        assert_eq!(b.get(&p).await.expect("get"), None, "{name}: still deleted");
        assert_eq!(b.fence(&p).await.expect("fence"), Some(Fence(6)), "{name}");

        // The same bytes at 5, then B rewrites them at 6 while A is paused.
        let p = path("same-bytes");
        b.put(&p, "same".into(), Fence(5)).await.expect("put");
        let (a, hooks) = hooked(&inner);
        let (b2, p2) = (b.clone(), p.clone());
        *hooks.before_put.lock().unwrap() = Some(Box::pin(async move {
            b2.put(&p2, "same".into(), Fence(6))
                .await
                .expect("B writes at 6");
        }));
        let late = a.put(&p, "A's stale bytes".into(), Fence(5)).await;
        assert!(
            matches!(
                late,
                Err(FencedError::Stale(_)) | Err(FencedError::OutcomeUnknown { .. })
            ),
            "{name}: A's write at 5 after B's write at 6 must be refused, got {late:?}"
        );
        let object = b.get(&p).await.expect("get").expect("exists");
        assert_eq!(
            (&object.bytes[..], object.fence),
            (&b"same"[..], Some(Fence(6))),
            "{name}: B's write stands"
        );
    }
}

/// object_store retries a conditional put after a 5xx or a 409; when the
/// first attempt was applied, the retry is refused. The write happened: it
/// is a success, and is not written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_write_answered_with_a_refusal_is_recognised_as_written() {
    for (name, inner) in stores() {
        for existing in [false, true] {
            let p = path("applied-refused");
            if existing {
                FencedStore::new(inner.clone())
                    .put(&p, "before".into(), Fence(3))
                    .await
                    .expect("put");
            }
            let (a, hooks) = hooked(&inner);
            *hooks.applied_then_refused.lock().unwrap() = Some(Box::pin(async {}));
            let done = a.put(&p, "mine".into(), Fence(5)).await;
            assert!(done.is_ok(), "{name}/{existing}: {done:?}");
            assert_eq!(
                hooks.puts.load(Ordering::SeqCst),
                1,
                "{name}/{existing}: recognised by its nonce, not written again"
            );
            let object = a.get(&p).await.expect("get").expect("exists");
            assert_eq!(
                (&object.bytes[..], object.fence),
                (&b"mine"[..], Some(Fence(5))),
                "{name}/{existing}"
            );
        }
    }
}

/// The same, but a newer writer overwrote the applied write before the
/// refusal came back: the write was applied, so "stale, nothing written"
/// would be a lie; its outcome is reported as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_write_overwritten_before_its_refusal_is_not_reported_as_unwritten() {
    for (name, inner) in stores() {
        let p = path("applied-overwritten");
        let b = Arc::new(FencedStore::new(inner.clone()));
        b.put(&p, "before".into(), Fence(3)).await.expect("put");
        let (a, hooks) = hooked(&inner);
        let (b2, p2) = (b.clone(), p.clone());
        *hooks.applied_then_refused.lock().unwrap() = Some(Box::pin(async move {
            b2.put(&p2, "B".into(), Fence(6)).await.expect("B writes");
        }));
        match a.put(&p, "A".into(), Fence(5)).await {
            Err(FencedError::OutcomeUnknown { seen, location }) => {
                assert_eq!(seen, Some(Fence(6)), "{name}");
                assert_eq!(location, p.to_string(), "{name}");
            }
            other => panic!("{name}: expected an unknown outcome, got {other:?}"),
        }
    }
}

/// Every write stores different bytes (a frame with a fresh nonce), which
/// reads strip; an object in the unframed format (written before it, or
/// outside the wrapper) is read as its bytes and replaced by a framed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_framed_unframed_objects_still_read() {
    for (name, inner) in stores() {
        let store = FencedStore::new(inner.clone());
        let p = path("framed");
        let first = store.put(&p, "same".into(), Fence(1)).await.expect("put");
        let second = store.put(&p, "same".into(), Fence(1)).await.expect("put");
        assert_ne!(first.e_tag, second.e_tag, "{name}: same bytes, new ETag");
        let raw = inner
            .get(&p)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert!(raw.starts_with(b"lease-fence/1 1 "), "{name}: {raw:?}");
        assert!(raw.ends_with(b"\nsame"), "{name}: {raw:?}");
        let object = store.get(&p).await.expect("get").expect("exists");
        assert_eq!(&object.bytes[..], b"same", "{name}");

        // The unframed format: a fence attribute and the bytes as they are.
        let old = path("unframed");
        let attributes =
            Attributes::from_iter([(Attribute::Metadata(FENCE_ATTRIBUTE.into()), "4")]);
        let options = PutOptions {
            attributes,
            ..PutOptions::default()
        };
        inner
            .put_opts(&old, "old format".into(), options)
            .await
            .expect("seed");
        let object = store.get(&old).await.expect("get").expect("exists");
        assert_eq!(
            (&object.bytes[..], object.fence),
            (&b"old format"[..], Some(Fence(4))),
            "{name}"
        );
        assert!(matches!(
            store.put(&old, "stale".into(), Fence(3)).await,
            Err(FencedError::Stale(_))
        ));
        store.put(&old, "new".into(), Fence(4)).await.expect("put");
        let object = store.get(&old).await.expect("get").expect("exists");
        assert_eq!(&object.bytes[..], b"new", "{name}");
    }
}

/// An object that says it is framed but whose bytes do not begin with its
/// frame is an error, and a write leaves it byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_frame_is_an_error() {
    for (name, inner) in stores() {
        let store = FencedStore::new(inner.clone());
        let p = path("damaged");
        let attributes = Attributes::from_iter([
            (Attribute::Metadata(FENCE_ATTRIBUTE.into()), "2"),
            (Attribute::Metadata(NONCE_ATTRIBUTE.into()), "abc"),
        ]);
        let options = PutOptions {
            attributes,
            ..PutOptions::default()
        };
        inner
            .put_opts(&p, "lease-fence/1 2 xyz\nprecious".into(), options)
            .await
            .expect("seed");
        assert!(
            matches!(store.get(&p).await, Err(FencedError::CorruptFrame { .. })),
            "{name}"
        );
        assert!(
            matches!(
                store.put(&p, "stale".into(), Fence(1)).await,
                Err(FencedError::Stale(_))
            ),
            "{name}"
        );
    }
}

/// object_store's LocalFileSystem refuses conditional updates and
/// attributes: a fenced write there fails, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_file_system_is_not_supported_and_writes_nothing() {
    let dir = std::env::temp_dir().join(format!(
        "lease-fence-local-{}",
        lease_core::HolderId::random()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let local = object_store::local::LocalFileSystem::new_with_prefix(&dir).expect("local");
    let store = FencedStore::new(local);
    let p = Path::from("reports/daily.json");
    match store.put(&p, "data".into(), Fence(1)).await {
        Err(FencedError::Store(object_store::Error::NotImplemented { .. })) => {}
        other => panic!("LocalFileSystem refuses fenced writes, got {other:?}"),
    }
    assert_eq!(store.get(&p).await.expect("get"), None, "nothing written");
    assert!(
        matches!(
            store.delete(&p, Fence(1)).await,
            Err(FencedError::Store(
                object_store::Error::NotImplemented { .. }
            ))
        ),
        "delete too"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
