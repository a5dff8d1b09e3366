//! The one-lease-per-prefix `BucketLease` surface, on the in-memory store and
//! the S3 server.

use crate::common;

use std::time::Duration;

use lease_core::Exclusion;
use lease_s3::bucket_lease::{BucketLease, BucketLeaseError, BucketLeaseWatch};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_surface_behaves_as_documented() {
    for (name, store) in common::stores() {
        let prefix = common::unique_prefix("bucket");

        // TTL 0 counts as 1; renew every TTL/3; the deadline is 2/3 TTL from
        // the send instant of the acquiring request.
        let before = tokio::time::Instant::now();
        let lease = BucketLease::acquire(store.clone(), &prefix, 0)
            .await
            .unwrap();
        let after = tokio::time::Instant::now();
        assert_eq!(lease.ttl_s(), 1, "{name}");
        assert_eq!(lease.renew_interval(), Duration::from_secs(1) / 3, "{name}");
        assert_eq!(lease.exclusion(), Exclusion::ObservedExpiry, "{name}");
        // A new key starts from the wall clock in microseconds (so that
        // fences keep rising should its records ever be deleted).
        let wall_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        assert!(
            lease.fence() <= wall_us && lease.fence() + 60_000_000 > wall_us,
            "{name}: fence {} against the clock {wall_us}",
            lease.fence()
        );
        let window = Duration::from_secs(1).mul_f64(2.0 / 3.0);
        let d = lease.write_deadline().unwrap();
        assert!(d >= before + window && d <= after + window, "{name}");
        assert!(lease.may_write(), "{name}");
        // Unrenewed, the deadline passes and may_write turns false.
        tokio::time::sleep(window + Duration::from_millis(50)).await;
        assert!(
            lease.write_deadline().is_none() && !lease.may_write(),
            "{name}"
        );
        // The holder itself, having watched its own write for a TTL, gives it
        // up instead of renewing what others may already have taken.
        tokio::time::sleep(Duration::from_millis(400)).await;
        match lease.renew().await {
            Err(BucketLeaseError::Lost) => {}
            other => panic!("{name}: renew after a whole TTL unrenewed gave {other:?}"),
        }
        assert!(lease.is_lost(), "{name}");
        // Lost never comes back.
        assert!(
            matches!(lease.renew().await, Err(BucketLeaseError::Lost)),
            "{name}"
        );
        lease.release().await.unwrap();

        // Renewing on schedule keeps the lease and moves the deadline.
        let prefix = common::unique_prefix("bucket-renew");
        let lease = BucketLease::acquire_as(
            store.clone(),
            &prefix,
            3,
            "me",
            &mut BucketLeaseWatch::new(),
        )
        .await
        .unwrap();
        assert_eq!(lease.instance_id(), "me");
        for _ in 0..4 {
            tokio::time::sleep(lease.renew_interval()).await;
            let d0 = lease.write_deadline().unwrap();
            lease.renew().await.unwrap();
            assert!(lease.write_deadline().unwrap() > d0, "{name}");
        }
        let fence = lease.fence();
        lease.release().await.unwrap();

        // Release keeps the fence counter: the next holder gets a higher one,
        // at once (a released record is free).
        let next = BucketLease::acquire_as(
            store.clone(),
            &prefix,
            3,
            "next",
            &mut BucketLeaseWatch::new(),
        )
        .await
        .unwrap();
        assert_eq!(next.fence(), fence + 1, "{name}");
        next.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_leaves_another_instances_lease_alone() {
    for (name, store) in common::stores() {
        let prefix = common::unique_prefix("bucket-release");
        let a =
            BucketLease::acquire_as(store.clone(), &prefix, 1, "a", &mut BucketLeaseWatch::new())
                .await
                .unwrap();
        let mut watch = BucketLeaseWatch::new();
        let b = loop {
            match BucketLease::acquire_as(store.clone(), &prefix, 1, "b", &mut watch).await {
                Ok(b) => break b,
                Err(BucketLeaseError::ForeignActive { holder, .. }) => assert_eq!(holder, "a"),
                Err(e) => panic!("{name}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // `a` never learnt it lost; its release must not free b's lease.
        assert!(!a.is_lost());
        a.release().await.unwrap();
        b.renew().await.unwrap();
        match BucketLease::acquire_as(store.clone(), &prefix, 1, "c", &mut BucketLeaseWatch::new())
            .await
        {
            Err(BucketLeaseError::ForeignActive { holder, fence }) => {
                assert_eq!((holder.as_str(), fence), ("b", b.fence()), "{name}")
            }
            other => panic!("{name}: after a's stale release: {other:?}"),
        }
        b.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_object_at_lease_is_never_taken_for_free() {
    for (name, store) in common::stores() {
        let prefix = common::unique_prefix("bucket-corrupt");
        let path = Path::parse(format!("{prefix}/LEASE")).unwrap();
        store
            .put(&path, PutPayload::from_static(b"somebody else's file"))
            .await
            .unwrap();
        match BucketLease::acquire(store.clone(), &prefix, 5).await {
            Err(BucketLeaseError::Store(lease_core::Error::CorruptRecord { .. })) => {}
            other => panic!("{name}: acquire over a foreign object gave {other:?}"),
        }
        let bytes = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&bytes[..], b"somebody else's file", "{name}: it must stay");
    }
}

/// `LEASE` deleted behind the library's back while held: the holder loses it
/// at its next renewal, a contender waits a TTL of seeing it missing, and the
/// next fence is above the deleted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_object_is_not_free_at_once() {
    for (name, store) in common::stores() {
        let prefix = common::unique_prefix("bucket-deleted");
        let a =
            BucketLease::acquire_as(store.clone(), &prefix, 1, "a", &mut BucketLeaseWatch::new())
                .await
                .unwrap();
        let path = Path::parse(format!("{prefix}/LEASE")).unwrap();
        store.delete(&path).await.unwrap();
        let mut watch = BucketLeaseWatch::new();
        match BucketLease::acquire_as(store.clone(), &prefix, 1, "b", &mut watch).await {
            Err(BucketLeaseError::ForeignActive { holder, fence }) => {
                // Who holds it is not known once its record is gone.
                assert_eq!(
                    (holder.as_str(), fence),
                    (lease_s3::RECORD_MISSING_HOLDER, a.fence()),
                    "{name}"
                )
            }
            other => panic!("{name}: acquire over a deleted live LEASE gave {other:?}"),
        }
        assert!(
            matches!(a.renew().await, Err(BucketLeaseError::Lost)),
            "{name}"
        );
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let b = BucketLease::acquire_as(store.clone(), &prefix, 1, "b", &mut watch)
            .await
            .unwrap_or_else(|e| panic!("{name}: a TTL later: {e}"));
        assert!(b.fence() > a.fence(), "{name}");
        b.release().await.unwrap();
    }
}
