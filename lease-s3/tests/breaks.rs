//! The administrative break under faults, on the in-memory store and on the
//! S3 server: an audit record that cannot be written, a break whose answer is
//! lost or retried into a conflict with itself, and the fence after breaking
//! a corrupt record.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Faulty;
use lease_core::{
    Acquire, AcquireRequest, BreakNote, Error, Grant, HolderId, LeaseBackend, LeaseKey, LeaseState,
};
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

fn note() -> BreakNote {
    BreakNote {
        by: "ops".into(),
        reason: "stuck".into(),
        at_unix_ms: 1,
    }
}

async fn take(c: &ObjectStoreBackend, k: &LeaseKey) -> Grant {
    match c
        .try_acquire(
            AcquireRequest::new(k.clone(), HolderId::random()).ttl(Duration::from_secs(60)),
        )
        .await
        .unwrap()
    {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => panic!("held by {h:?}"),
    }
}

/// An error that says "not applied" must mean the live grant is untouched,
/// so that retrying cannot break a later, healthy holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_that_reports_not_applied_left_the_holder_alone() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("break-audit");
        let c = client(&faulty, &prefix);
        let k = key("job");
        let g = take(&c, &k).await;
        faulty.fail_puts_containing(Some("/.audit/"));
        let e = c.break_lease(&k, &note()).await.unwrap_err();
        faulty.fail_puts_containing(None);
        eprintln!("{name}: {e}");
        if !e.is_unknown_outcome() {
            match c.read(&k).await.unwrap() {
                LeaseState::Held(h) => assert_eq!(h.fence, g.fence(), "{name}"),
                LeaseState::Free => panic!(
                    "{name}: the break answered {e:?} (not applied) but the grant was broken"
                ),
            }
        }
    }
}

/// object_store retries a write answered 5xx; the retry then fails its
/// precondition against the break's own write. The break must still report
/// the grant it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_recognises_its_own_write_after_a_retry_or_a_lost_answer() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("break-retry");
        let c = client(&faulty, &prefix);
        for lose in [false, true] {
            let k = key(if lose { "lost" } else { "retried" });
            let g = take(&c, &k).await;
            if lose {
                faulty.lose_next_puts(1);
            } else {
                faulty.conflict_after_next_puts(1);
            }
            let broken = c
                .break_lease(&k, &note())
                .await
                .unwrap_or_else(|e| panic!("{name} (lost answer: {lose}): {e}"));
            let previous = broken.previous.unwrap_or_else(|| {
                panic!("{name} (lost answer: {lose}): the break ended a live grant but says none was held")
            });
            assert_eq!(
                (previous.holder, previous.fence),
                (g.holder().clone(), g.fence()),
                "{name}"
            );
            assert_eq!(c.read(&k).await.unwrap(), LeaseState::Free, "{name}");
            let next = take(&c, &k).await;
            assert!(next.fence() > g.fence(), "{name}");
        }
    }
}

/// Breaking a corrupt record must not let the next fence fall below earlier
/// ones, whatever fence the damaged header or the break's clock names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_a_corrupt_record_keeps_fences_rising() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("break-corrupt");
        let c = client(&faulty, &prefix);
        for body in [&b"{\"fence\":1,\"junk\":true}\nxx"[..], b"not json"] {
            let k = key("job");
            let mut last = take(&c, &k).await;
            for _ in 0..2 {
                c.release(&last).await.unwrap();
                last = take(&c, &k).await;
            }
            let path = Path::parse(format!("{prefix}/{}", k.as_str())).unwrap();
            faulty
                .inner
                .put(&path, PutPayload::from(body.to_vec()))
                .await
                .unwrap();
            assert!(matches!(c.read(&k).await, Err(Error::CorruptRecord { .. })));
            let broken = c.break_lease(&k, &note()).await.unwrap();
            assert!(broken.previous.is_none(), "{name}");
            let next = take(&c, &k).await;
            assert!(
                next.fence() > last.fence(),
                "{name}: fence {} after breaking {:?} is not above {}",
                next.fence(),
                String::from_utf8_lossy(body),
                last.fence()
            );
            c.release(&next).await.unwrap();
        }
    }
}
