//! Faults the object-store protocol must survive, each on the in-memory store
//! and on the S3 server: a store that ignores preconditions, an acquire whose
//! answer is lost, a silent holder and a fresh contender, and the request
//! cost of each operation.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::Faulty;
use lease_core::{
    Acquire, AcquireRequest, Error, HolderId, LeaseBackend, LeaseKey, LeaseState, Renewal,
};
use lease_s3::bucket_lease::{BucketLease, BucketLeaseError, BucketLeaseWatch};
use lease_s3::ObjectStoreBackend;
use object_store::{ObjectStore, ObjectStoreExt};

fn key(name: &str) -> LeaseKey {
    LeaseKey::new(name).unwrap()
}

fn req(k: &LeaseKey, h: &HolderId, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(k.clone(), h.clone()).ttl(ttl)
}

fn client(store: &Arc<Faulty>, prefix: &str) -> ObjectStoreBackend {
    let s: Arc<dyn ObjectStore> = store.clone();
    ObjectStoreBackend::new(s, prefix).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_ignores_preconditions_is_refused() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("no-preconditions");
        faulty.drop_preconditions(true);

        let c = client(&faulty, &prefix);
        let k = key("job");
        match c
            .try_acquire(req(&k, &HolderId::random(), Duration::from_secs(10)))
            .await
        {
            Err(Error::PreconditionsIgnored { detail }) => {
                eprintln!("{name}: refused as expected: {detail}")
            }
            other => panic!("{name}: acquire on a store ignoring preconditions gave {other:?}"),
        }
        // Nothing was granted: the key is still free.
        assert_eq!(c.read(&k).await.unwrap(), LeaseState::Free, "{name}");

        let dyn_store: Arc<dyn ObjectStore> = faulty.clone();
        match BucketLease::acquire(dyn_store.clone(), &prefix, 10).await {
            Err(BucketLeaseError::PreconditionsIgnored { .. }) => {}
            other => panic!("{name}: BucketLease on a store ignoring preconditions gave {other:?}"),
        }

        // The same wrapper honouring preconditions grants: the refusal above
        // came from the probe's finding, not from the wrapper itself.
        faulty.drop_preconditions(false);
        let c = client(&faulty, &prefix);
        assert!(matches!(
            c.try_acquire(req(&k, &HolderId::random(), Duration::from_secs(10)))
                .await
                .unwrap(),
            Acquire::Granted(_)
        ));
        BucketLease::acquire(dyn_store, &prefix, 10)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_answer_is_taken_back_at_once_with_the_same_fence() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let dyn_store: Arc<dyn ObjectStore> = faulty.clone();
        let prefix = common::unique_prefix("lost-answer");

        // Take and release once, so the lost attempt's fence is the first
        // one plus one.
        let first = BucketLease::acquire(dyn_store.clone(), &prefix, 30)
            .await
            .unwrap();
        let second_fence = first.fence() + 1;
        first.release().await.unwrap();

        let mut watch = BucketLeaseWatch::new();
        faulty.lose_next_puts(1);
        match BucketLease::acquire_as(dyn_store.clone(), &prefix, 30, "instance-1", &mut watch)
            .await
        {
            Err(BucketLeaseError::Store(e)) => assert!(e.is_unknown_outcome(), "{name}: {e}"),
            other => panic!("{name}: a lost answer must be a store error, got {other:?}"),
        }
        let t = Instant::now();
        let lease =
            BucketLease::acquire_as(dyn_store.clone(), &prefix, 30, "instance-1", &mut watch)
                .await
                .unwrap_or_else(|e| panic!("{name}: retry with the same id failed: {e}"));
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{name}: taking back our own lease must not wait out a TTL"
        );
        assert_eq!(
            lease.fence(),
            second_fence,
            "{name}: the retry must keep the landed write's fence"
        );
        // A stranger is still kept out.
        match BucketLease::acquire_as(
            dyn_store.clone(),
            &prefix,
            30,
            "instance-2",
            &mut BucketLeaseWatch::new(),
        )
        .await
        {
            Err(BucketLeaseError::ForeignActive { holder, fence }) => {
                assert_eq!(
                    (holder.as_str(), fence),
                    ("instance-1", second_fence),
                    "{name}"
                )
            }
            other => panic!("{name}: stranger after take-back: {other:?}"),
        }
        lease.renew().await.unwrap();
        lease.release().await.unwrap();

        // The keyed contract, same fault: a fresh client (a restarted process).
        let k = key("lost");
        let a = HolderId::random();
        let c = client(&faulty, &prefix);
        // A new key: first the key's marker, then the lease object; both
        // answers are lost (the first is recognised by its nonce at once).
        faulty.lose_next_puts(2);
        let e = c
            .try_acquire(req(&k, &a, Duration::from_secs(30)))
            .await
            .unwrap_err();
        assert!(e.is_unknown_outcome(), "{name}: {e}");
        let c2 = client(&faulty, &prefix);
        let t = Instant::now();
        let g = match c2
            .try_acquire(req(&k, &a, Duration::from_secs(30)))
            .await
            .unwrap()
        {
            Acquire::Granted(g) => g,
            Acquire::Held(h) => panic!("{name}: own landed write refused: {h:?}"),
        };
        assert!(t.elapsed() < Duration::from_secs(5), "{name}");
        assert_eq!(
            c2.read(&k).await.unwrap(),
            LeaseState::Held(lease_core::Holding::new(
                a.clone(),
                g.fence(),
                Duration::from_secs(30),
                lease_core::Payload::default()
            )),
            "{name}"
        );
        c2.release(&g).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_renew_answer_is_retried_safely() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let dyn_store: Arc<dyn ObjectStore> = faulty.clone();
        let prefix = common::unique_prefix("lost-renew");
        let lease = BucketLease::acquire(dyn_store, &prefix, 30).await.unwrap();
        let before = lease.write_deadline().unwrap();
        faulty.lose_next_puts(1);
        match lease.renew().await {
            Err(BucketLeaseError::Store(e)) => assert!(e.is_unknown_outcome(), "{name}: {e}"),
            other => panic!("{name}: lost renewal answer gave {other:?}"),
        }
        // The deadline still counts from the last renewal we know succeeded.
        assert_eq!(lease.write_deadline(), Some(before), "{name}");
        assert!(!lease.is_lost(), "{name}");
        // The retry finds our own landed write and renews on top of it.
        lease.renew().await.unwrap();
        assert!(lease.write_deadline().unwrap() > before, "{name}");

        // Keyed: renewing with the grant from before the lost answer.
        let c = client(&faulty, &prefix);
        let k = key("lost-renew");
        let g = c
            .try_acquire(req(&k, &HolderId::random(), Duration::from_secs(30)))
            .await
            .unwrap()
            .granted()
            .unwrap();
        faulty.lose_next_puts(1);
        assert!(c.renew(&g, None).await.unwrap_err().is_unknown_outcome());
        match c.renew(&g, None).await.unwrap() {
            Renewal::Renewed(g2) => {
                assert_eq!(g2.fence(), g.fence());
                c.release(&g2).await.unwrap();
            }
            Renewal::Lost => panic!("{name}: a live grant was lost after a lost renew answer"),
        }
        assert_eq!(c.read(&k).await.unwrap(), LeaseState::Free, "{name}");
        lease.release().await.unwrap();
    }
}

/// Polls `acquire_as` with one watch until granted; returns the grant and
/// how long after the first (refused) attempt it came.
async fn contend(
    store: Arc<dyn ObjectStore>,
    prefix: &str,
    ttl_s: u64,
    id: &str,
) -> (BucketLease, Duration, u32) {
    let mut watch = BucketLeaseWatch::new();
    let start = Instant::now();
    let mut refusals = 0;
    loop {
        match BucketLease::acquire_as(store.clone(), prefix, ttl_s, id, &mut watch).await {
            Ok(l) => return (l, start.elapsed(), refusals),
            Err(BucketLeaseError::ForeignActive { .. }) => refusals += 1,
            Err(e) => panic!("contender: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_contender_waits_one_ttl_of_its_own_observation() {
    const TTL: u64 = 2;
    let ttl = Duration::from_secs(TTL);
    for (name, store) in common::stores() {
        let prefix = common::unique_prefix("takeover");
        let holder = BucketLease::acquire(store.clone(), &prefix, TTL)
            .await
            .unwrap();
        // The holder goes silent, and its lease is already older than a TTL
        // when the contender first looks: the contender still waits a whole
        // TTL of its own observation, since it compares no clocks but its own.
        tokio::time::sleep(ttl + Duration::from_millis(500)).await;
        assert!(
            !holder.may_write(),
            "{name}: a silent holder must stop writing"
        );
        let (taker, waited, refusals) = contend(store.clone(), &prefix, TTL, "taker").await;
        assert!(
            waited >= ttl,
            "{name}: took a silent lease after {waited:?} of observation, before one TTL"
        );
        assert!(
            waited < ttl + Duration::from_secs(2),
            "{name}: took {waited:?} to take over an abandoned lease"
        );
        assert!(refusals >= 2, "{name}: {refusals}");
        assert_eq!(
            taker.fence(),
            holder.fence() + 1,
            "{name}: takeover increments the fence"
        );
        match holder.renew().await {
            Err(BucketLeaseError::Lost) => {}
            other => panic!("{name}: renew after takeover gave {other:?}"),
        }
        assert!(
            holder.is_lost() && holder.write_deadline().is_none(),
            "{name}"
        );
        // Releasing the lost lease leaves the taker alone.
        holder.release().await.unwrap();
        taker.renew().await.unwrap();
        match BucketLease::acquire_as(
            store.clone(),
            &prefix,
            TTL,
            "third",
            &mut BucketLeaseWatch::new(),
        )
        .await
        {
            Err(BucketLeaseError::ForeignActive { holder, fence }) => {
                assert_eq!((holder.as_str(), fence), ("taker", taker.fence()), "{name}")
            }
            other => panic!("{name}: after a stale release: {other:?}"),
        }

        // A holder that keeps renewing is never taken over: each renewal is a
        // new version, which restarts every observer's wait.
        let mut watch = BucketLeaseWatch::new();
        for _ in 0..((3 * TTL * 1000) / 300) {
            taker.renew().await.unwrap();
            match BucketLease::acquire_as(store.clone(), &prefix, TTL, "fourth", &mut watch).await {
                Err(BucketLeaseError::ForeignActive { .. }) => {}
                other => panic!("{name}: a renewing holder was taken over: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert!(taker.may_write(), "{name}");
        taker.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_takeover_waits_one_ttl_of_the_takers_observation() {
    let ttl = Duration::from_secs(1);
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("keyed-takeover");
        let (a, b) = (client(&faulty, &prefix), client(&faulty, &prefix));
        let k = key("k");
        let g = a
            .try_acquire(req(&k, &HolderId::random(), ttl))
            .await
            .unwrap()
            .granted()
            .unwrap();
        tokio::time::sleep(ttl * 2).await;
        let bh = HolderId::random();
        let start = Instant::now();
        let mut refusals = 0;
        let g2 = loop {
            match b.try_acquire(req(&k, &bh, ttl)).await.unwrap() {
                Acquire::Granted(g2) => break g2,
                Acquire::Held(h) => {
                    assert_eq!(h.fence, g.fence());
                    assert_eq!(h.remaining, None, "no remote clock to report");
                    refusals += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let waited = start.elapsed();
        assert!(waited >= ttl, "{name}: taken after {waited:?}");
        assert!(refusals >= 2, "{name}");
        assert_eq!(g2.fence().get(), g.fence().get() + 1, "{name}");
        assert_eq!(a.renew(&g, None).await.unwrap(), Renewal::Lost, "{name}");
        b.release(&g2).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_counts_and_latency_per_operation() {
    const N: u32 = 20;
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("counts");
        let c = client(&faulty, &prefix);
        let ttl = Duration::from_secs(60);
        let a = HolderId::random();

        let measure = |before: common::Counts, after: common::Counts| common::Counts {
            get: after.get - before.get,
            put: after.put - before.put,
            delete: after.delete - before.delete,
        };

        let before = faulty.counts();
        let g = c
            .try_acquire(req(&key("first"), &a, ttl))
            .await
            .unwrap()
            .granted()
            .unwrap();
        let first = measure(before, faulty.counts());
        c.release(&g).await.unwrap();

        let mut per_op = Vec::new();
        let mut times: Vec<(&str, Vec<Duration>)> = vec![
            ("acquire", vec![]),
            ("renew", vec![]),
            ("read", vec![]),
            ("release", vec![]),
        ];
        for i in 0..N {
            let k = key(&format!("k{i}"));
            let b0 = faulty.counts();
            let t = Instant::now();
            let g = c
                .try_acquire(req(&k, &a, ttl))
                .await
                .unwrap()
                .granted()
                .unwrap();
            times[0].1.push(t.elapsed());
            let b1 = faulty.counts();
            let t = Instant::now();
            let g = match c.renew(&g, None).await.unwrap() {
                Renewal::Renewed(g) => g,
                Renewal::Lost => panic!("lost"),
            };
            times[1].1.push(t.elapsed());
            let b2 = faulty.counts();
            let t = Instant::now();
            c.read(&k).await.unwrap();
            times[2].1.push(t.elapsed());
            let b3 = faulty.counts();
            let t = Instant::now();
            c.release(&g).await.unwrap();
            times[3].1.push(t.elapsed());
            let b4 = faulty.counts();
            // Again, over the released record.
            let g = c
                .try_acquire(req(&k, &a, ttl))
                .await
                .unwrap()
                .granted()
                .unwrap();
            let b5 = faulty.counts();
            c.release(&g).await.unwrap();
            per_op.push([
                measure(b0, b1),
                measure(b1, b2),
                measure(b2, b3),
                measure(b3, b4),
                measure(b4, b5),
            ]);
        }
        let b0 = faulty.counts();
        let other = client(&faulty, &prefix);
        let held = key("held");
        let g = c
            .try_acquire(req(&held, &a, ttl))
            .await
            .unwrap()
            .granted()
            .unwrap();
        let b1 = faulty.counts();
        let refused = other
            .try_acquire(req(&held, &HolderId::random(), ttl))
            .await
            .unwrap();
        assert!(matches!(refused, Acquire::Held(_)));
        let refused_cost = measure(b1, faulty.counts());
        let _ = b0;
        c.release(&g).await.unwrap();

        let one = |get, put| common::Counts {
            get,
            put,
            delete: 0,
        };
        for ops in &per_op {
            // A key never used: its marker, then the lease object.
            assert_eq!(ops[0], one(1, 2), "{name}: acquire of a new key");
            assert_eq!(ops[4], one(1, 1), "{name}: acquire of a released key");
            assert_eq!(ops[1], one(0, 1), "{name}: renew");
            assert_eq!(ops[2], one(1, 0), "{name}: read");
            assert_eq!(ops[3], one(0, 1), "{name}: release");
        }
        assert_eq!(refused_cost, one(1, 0), "{name}: refused acquire");
        assert_eq!(
            first,
            common::Counts {
                get: 1,
                put: 5,
                delete: 1
            },
            "{name}: first acquire of a client (with the precondition probe)"
        );
        eprintln!("{name}: requests — first acquire of a client {first:?}; acquire 1 GET + 1 PUT (a new key: + 1 PUT of its marker); renew 1 PUT; read 1 GET; release 1 PUT; refused acquire 1 GET");
        for (op, mut ts) in times {
            ts.sort();
            let p50 = ts[ts.len() / 2];
            let p99 = ts[(ts.len() * 99 / 100).min(ts.len() - 1)];
            eprintln!("{name}: {op}: p50 {p50:?}, max-ish p99 {p99:?} over {N}");
        }
    }
}

/// A renewal that carries no payload keeps the payload that is stored when
/// it writes, not the one it read first: a renewal with a new payload (a
/// leader's proclaim) that lands between the two must not be undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_without_payload_keeps_a_payload_written_meanwhile() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let c = Arc::new(client(&faulty, &common::unique_prefix("keep-payload")));
        let k = key("keep-payload");
        let h = HolderId::random();
        let v1 = lease_core::Payload::new("v1").unwrap();
        let v2 = lease_core::Payload::new("v2").unwrap();
        let g = c
            .try_acquire(req(&k, &h, Duration::from_secs(30)).payload(v1.clone()))
            .await
            .unwrap()
            .granted()
            .unwrap();
        // Every request takes 100 ms. The renewal with v2 lands first; the
        // payload-less one, sent 50 ms later on the same grant, writes the
        // payload this client last wrote (v1), conflicts, re-reads and
        // writes again: that second write must carry v2.
        faulty.set_latency(Duration::from_millis(100));
        let with_v2 = {
            let (c, g, v2) = (c.clone(), g.clone(), v2.clone());
            tokio::spawn(async move { c.renew(&g, Some(v2)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let plain = c.renew(&g, None).await.unwrap();
        assert!(matches!(plain, Renewal::Renewed(_)), "{name}: {plain:?}");
        let with_v2 = with_v2.await.unwrap().unwrap();
        assert!(
            matches!(with_v2, Renewal::Renewed(_)),
            "{name}: {with_v2:?}"
        );
        faulty.set_latency(Duration::ZERO);
        match c.read(&k).await.unwrap() {
            LeaseState::Held(held) => assert_eq!(held.payload, v2, "{name}: v2 was undone"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// A reader told of a grant whose create is still in flight (the key's
/// marker is written, the lease object not yet) sees that grant's payload,
/// not an empty one: an election observer would otherwise report the new
/// leader twice, first without its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_in_flight_is_reported_with_its_payload() {
    for (name, store) in common::stores() {
        let faulty = Faulty::new(store);
        let prefix = common::unique_prefix("create-payload");
        let taker = Arc::new(client(&faulty, &prefix));
        let reader = client(&faulty, &prefix);
        let h = HolderId::random();
        // The taker's first acquire probes the store; later ones do not.
        let warm = taker
            .try_acquire(req(&key("warm-up"), &h, Duration::from_secs(30)))
            .await
            .unwrap()
            .granted()
            .unwrap();
        taker.release(&warm).await.unwrap();
        let k = key("fresh");
        let v = lease_core::Payload::new("10.0.0.7:8080").unwrap();
        // Every request takes 100 ms: the taker's GET lands at 100 ms, its
        // marker at 200 ms, its lease object at 300 ms; the reader's GET,
        // sent at 150 ms, lands in between.
        faulty.set_latency(Duration::from_millis(100));
        let taking = {
            let (taker, k, h, v) = (taker.clone(), k.clone(), h.clone(), v.clone());
            tokio::spawn(async move {
                taker
                    .try_acquire(req(&k, &h, Duration::from_secs(30)).payload(v))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
        let seen = reader.read(&k).await.unwrap();
        let granted = taking.await.unwrap().unwrap().granted().unwrap();
        faulty.set_latency(Duration::ZERO);
        match seen {
            LeaseState::Held(held) => {
                assert_eq!(held.holder, h, "{name}");
                assert_eq!(held.fence, granted.fence(), "{name}");
                assert_eq!(
                    held.payload, v,
                    "{name}: the create in flight lost its payload"
                );
            }
            other => panic!("{name}: the reader did not read inside the create: {other:?}"),
        }
        taker.release(&granted).await.unwrap();
    }
}

/// After an outside delete of a released record, a contender still waits a
/// TTL of its own observation, but what it is told says what is known: the
/// record was removed and the key is being observed. Never that the holder
/// who released long ago holds it, with its old fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_an_outside_delete_names_no_finished_holder() {
    for (name, store) in common::stores() {
        let prefix = common::unique_prefix("removed-refusal");
        let first = ObjectStoreBackend::new(store.clone(), &prefix).unwrap();
        let later = ObjectStoreBackend::new(store.clone(), &prefix).unwrap();
        let k = key("job");
        let gone = HolderId::random();
        let ttl = Duration::from_secs(30);
        let g = first
            .try_acquire(req(&k, &gone, ttl))
            .await
            .unwrap()
            .granted()
            .unwrap();
        first.release(&g).await.unwrap();
        // An operator's DELETE of the (released) lease object.
        let path = object_store::path::Path::parse(format!("{prefix}/{}", k.as_str())).unwrap();
        store.delete(&path).await.unwrap();

        let told = match later
            .try_acquire(req(&k, &HolderId::random(), ttl))
            .await
            .unwrap()
        {
            Acquire::Held(h) => h,
            Acquire::Granted(g) => panic!(
                "{name}: granted fence {} at once over a removed record",
                g.fence()
            ),
        };
        assert_ne!(
            told.holder, gone,
            "{name}: the refusal names the holder that released long ago (fence {})",
            told.fence
        );
        assert_eq!(
            told.holder.as_str(),
            lease_s3::RECORD_MISSING_HOLDER,
            "{name}"
        );
        assert!(told.fence >= g.fence(), "{name}: {told:?}");
        match later.read(&k).await.unwrap() {
            LeaseState::Held(h) => assert_eq!(h.holder, told.holder, "{name}: read"),
            other => panic!("{name}: read {other:?} while waiting to observe the key"),
        }
        // A second look says the same.
        match later
            .try_acquire(req(&k, &HolderId::random(), ttl))
            .await
            .unwrap()
        {
            Acquire::Held(h) => assert_eq!(h.holder, told.holder, "{name}: second look"),
            Acquire::Granted(_) => panic!("{name}: granted within the TTL"),
        }
    }
}
