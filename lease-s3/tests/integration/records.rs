//! What the library does with objects at lease paths that it did not write
//! or cannot trust, on the in-memory store and on the S3 server.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::Faulty;
use lease_core::{AcquireRequest, BreakNote, Error, HolderId, LeaseBackend, LeaseKey, LeaseState};
use lease_s3::ObjectStoreBackend;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

fn key(name: &str) -> LeaseKey {
    LeaseKey::new(name).unwrap()
}

fn client(store: &Arc<Faulty>, prefix: &str) -> ObjectStoreBackend {
    let s: Arc<dyn ObjectStore> = store.clone();
    ObjectStoreBackend::new(s, prefix).unwrap()
}

/// A data object that happens to sit at a lease path (an empty or
/// overlapping prefix): refused by its size before its body is read, and left
/// exactly as it was by read, acquire and break.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_object_is_refused_unread_and_left_alone() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("oversize");
        let k = key("data/part-0");
        let path = Path::parse(format!("{prefix}/{}", k.as_str())).unwrap();
        // A valid-looking header line, then 5 MiB: only the size gives it away.
        let mut body = br#"{"lease":"lease-s3/1","state":"held","holder":"a","fence":1,"ttl_ms":1000,"nonce":"n"}"#.to_vec();
        body.push(b'\n');
        body.resize(body.len() + 5 * 1024 * 1024, b'x');
        faulty
            .inner
            .put(&path, PutPayload::from(body.clone()))
            .await
            .unwrap();
        let before = faulty.inner.head(&path).await.unwrap();

        let c = client(&faulty, &prefix);
        let read = c.read(&k).await;
        assert!(
            matches!(read, Err(Error::CorruptRecord { .. })),
            "{name}: read gave {read:?}"
        );
        let acq = c
            .try_acquire(
                AcquireRequest::new(k.clone(), HolderId::random()).ttl(Duration::from_secs(5)),
            )
            .await;
        assert!(
            matches!(acq, Err(Error::CorruptRecord { .. })),
            "{name}: acquire gave {acq:?}"
        );
        let note = BreakNote::new("test", "oversize").with_at_unix_ms(1);
        let brk = c.break_lease(&k, &note).await;
        assert!(
            matches!(brk, Err(Error::CorruptRecord { .. })),
            "{name}: break gave {brk:?}"
        );
        if let Err(e) = &read {
            eprintln!("{name}: {e}");
        }
        let read_bytes = faulty.body_bytes_read();
        assert!(
            read_bytes <= 128 * 1024,
            "{name}: {read_bytes} body bytes were read to refuse a 5 MiB object"
        );
        let after = faulty.inner.head(&path).await.unwrap();
        assert_eq!(
            (after.e_tag, after.size),
            (before.e_tag, before.size),
            "{name}: the object was changed"
        );
        let now = faulty
            .inner
            .get(&path)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(
            now.as_ref() == body.as_slice(),
            "{name}: the object's bytes changed"
        );
    }
}

/// A prefix wiped by an operator (lease objects and markers alike): the key
/// looks new, and its next fence is still above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_even_after_the_whole_prefix_is_deleted() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("wiped");
        let k = key("cron/nightly");
        let ttl = Duration::from_secs(30);
        let c = client(&faulty, &prefix);
        let mut last = 0;
        for _ in 0..3 {
            let g = c
                .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
                .await
                .unwrap()
                .granted()
                .unwrap();
            assert!(g.fence().get() > last, "{name}");
            last = g.fence().get();
            c.release(&g).await.unwrap();
        }
        // `aws s3 rm --recursive s3://bucket/{prefix}`
        let all: Vec<Path> = {
            use futures_core::Stream;
            let mut list = faulty.inner.list(Some(&Path::from(prefix.as_str())));
            let mut out = Vec::new();
            while let Some(m) =
                std::future::poll_fn(|cx| std::pin::Pin::new(&mut list).poll_next(cx)).await
            {
                out.push(m.unwrap().location);
            }
            out
        };
        assert!(!all.is_empty(), "{name}");
        eprintln!("{name}: deleting {all:?}; last fence {last}");
        for p in &all {
            faulty.inner.delete(p).await.unwrap();
        }
        let fresh = client(&faulty, &prefix);
        let g = fresh
            .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()).ttl(ttl))
            .await
            .unwrap()
            .granted()
            .unwrap_or_else(|| panic!("{name}: a wiped key looks new"));
        assert!(
            g.fence().get() > last,
            "{name}: fence {} after the prefix was wiped is not above {last}",
            g.fence()
        );
        fresh.release(&g).await.unwrap();
    }
}

/// Read agrees with acquire about a record deleted outside the library: held
/// (by the missing record, with the fence of the grant the key's marker
/// names) until watched missing for a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_record_reads_as_held_until_watched_for_a_ttl() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("deleted-read");
        let k = key("job");
        let ttl = Duration::from_secs(1);
        let a = HolderId::random();
        let holder = client(&faulty, &prefix);
        let g = holder
            .try_acquire(AcquireRequest::new(k.clone(), a.clone()).ttl(ttl))
            .await
            .unwrap()
            .granted()
            .unwrap();
        let path = Path::parse(format!("{prefix}/{}", k.as_str())).unwrap();
        faulty.inner.delete(&path).await.unwrap();
        let other = client(&faulty, &prefix);
        match other.read(&k).await.unwrap() {
            LeaseState::Held(h) => assert_eq!(
                (h.holder.as_str(), h.fence),
                (lease_s3::RECORD_MISSING_HOLDER, g.fence()),
                "{name}: last created by {a}"
            ),
            LeaseState::Free => panic!("{name}: a deleted live record read as free at once"),
        }
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        assert_eq!(other.read(&k).await.unwrap(), LeaseState::Free, "{name}");
    }
}

/// A record whose fence is already the largest there is cannot be followed
/// by a higher one: refused, and left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_at_the_largest_fence_is_refused() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("max-fence");
        let k = key("job");
        let path = Path::parse(format!("{prefix}/{}", k.as_str())).unwrap();
        let body = format!(
            "{{\"lease\":\"lease-s3/1\",\"state\":\"released\",\"holder\":\"x\",\"fence\":{},\"ttl_ms\":1000,\"nonce\":\"n\"}}\n",
            u64::MAX
        );
        faulty
            .inner
            .put(&path, PutPayload::from(body.clone().into_bytes()))
            .await
            .unwrap();
        let c = client(&faulty, &prefix);
        let r = c
            .try_acquire(
                AcquireRequest::new(k.clone(), HolderId::random()).ttl(Duration::from_secs(5)),
            )
            .await;
        assert!(
            matches!(r, Err(Error::CorruptRecord { .. })),
            "{name}: acquire over fence u64::MAX gave {r:?}"
        );
        let now = faulty
            .inner
            .get(&path)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(
            now.as_ref() == body.as_bytes(),
            "{name}: the record changed"
        );
    }
}
