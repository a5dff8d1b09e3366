//! Waiting acquire, drop, payloads, on the fake in real time.

use std::future::IntoFuture;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{key, ms, Rec};
use lease_core::{LeaseBackend, Payload};
use lease_fake::Fake;
use lease_keeper::{AcquireError, Backoff, Keeper, LossReason};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquirer_is_woken_by_the_release() {
    let rec = Rec::new(Fake::new());
    let (a, b) = (Keeper::new(rec.clone()), Keeper::new(rec.clone()));
    let k = key("acq/watch");
    let ttl = Duration::from_secs(30);
    let held = a.try_acquire(&k).ttl(ttl).await.unwrap();
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move { b.acquire(&k).ttl(ttl).wait(Duration::from_secs(20)).await })
    };
    tokio::time::sleep(ms(300)).await;
    let acquires_before = rec.acquires.load(Ordering::SeqCst);
    let released = Instant::now();
    held.release().await.unwrap();
    let got = waiter.await.unwrap().unwrap();
    let took = released.elapsed();
    assert!(
        took < ms(100),
        "the watcher took {took:?} to get the released key"
    );
    assert!(got.holder().is_term_of(b.holder()));
    // No polling while it waited: one attempt after the wake-up.
    assert_eq!(rec.acquires.load(Ordering::SeqCst) - acquires_before, 1);
}

/// A waited grant's write window counts from the attempt that won, sent
/// after the release, not from the wait's start or an earlier refused
/// attempt: counted from those, a leadership won after a long wait would
/// arrive with its deadline near or past. By watch and by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waited_grant_counts_from_the_attempt_that_won() {
    for no_watch in [false, true] {
        let rec = Rec::new(Fake::new());
        rec.no_watch.store(no_watch, Ordering::SeqCst);
        // No renewal succeeds: the window seen is the grant's own, not a
        // renewal's sent just after it.
        rec.hang.store(true, Ordering::SeqCst);
        let (a, b) = (Keeper::new(rec.clone()), Keeper::new(rec.clone()));
        let k = key("acq/counted-from");
        let ttl = Duration::from_secs(3);
        let held = a.try_acquire(&k).ttl(ttl).await.unwrap();
        let waiter = {
            let (b, k) = (b.clone(), k.clone());
            tokio::spawn(async move { b.acquire(&k).ttl(ttl).wait(Duration::from_secs(20)).await })
        };
        // Long enough that a window counted from the wait's start would
        // end within a few hundred milliseconds of the grant.
        tokio::time::sleep(ms(1500)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let got = waiter.await.unwrap().unwrap();
        assert!(
            got.refreshed_at() >= released,
            "no_watch={no_watch}: the grant counts from {:?} before the release",
            released - got.refreshed_at()
        );
        assert!(
            got.deadline() >= released + ttl / 2,
            "no_watch={no_watch}: the grant's window ends {:?} after the release",
            got.deadline().saturating_duration_since(released)
        );
        got.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_watch_the_acquirer_polls() {
    let rec = Rec::new(Fake::new());
    rec.no_watch.store(true, Ordering::SeqCst);
    let (a, b) = (
        Keeper::new(rec.clone()),
        Keeper::new(rec.clone()).with_backoff(
            Backoff::default()
                .first_pause(ms(20))
                .longest_pause(ms(200)),
        ),
    );
    let k = key("acq/poll");
    let ttl = Duration::from_secs(30);
    let held = a.try_acquire(&k).ttl(ttl).await.unwrap();
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move { b.acquire(&k).ttl(ttl).wait(Duration::from_secs(20)).await })
    };
    tokio::time::sleep(ms(1500)).await;
    let polls = rec.acquires.load(Ordering::SeqCst);
    // 20, 40, 80, 160, then every 200 ms (±20%): about 10 attempts in 1.5 s.
    assert!((5..=16).contains(&polls), "{polls} attempts in 1.5 s");
    let released = Instant::now();
    held.release().await.unwrap();
    let got = waiter.await.unwrap().unwrap();
    // Polls are at most 240 ms apart; a waiter that did not poll would wait
    // out the 30 s TTL. The margin is for a loaded machine.
    assert!(
        released.elapsed() < ms(1000),
        "took {:?}",
        released.elapsed()
    );
    assert!(got.holder().is_term_of(b.holder()));
    assert_eq!(
        rec.waits.load(Ordering::SeqCst),
        0,
        "watched a backend without a watch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquirer_gets_an_expired_key() {
    let fake = Fake::new();
    let rec = Rec::new(fake.clone());
    let b = Keeper::new(rec.clone());
    let k = key("acq/expiry");
    let other = lease_core::HolderId::random();
    let req = lease_core::AcquireRequest::new(k.clone(), other).ttl(Duration::from_secs(5));
    let g = fake.try_acquire(req).await.unwrap().granted().unwrap();
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            b.acquire(&k)
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(ms(200)).await;
    let t = Instant::now();
    fake.advance(Duration::from_secs(5));
    let got = waiter.await.unwrap().unwrap();
    assert!(t.elapsed() < ms(100), "took {:?}", t.elapsed());
    assert!(got.fence() > g.fence());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_times_out_naming_the_holder() {
    let rec = Rec::new(Fake::new());
    let (a, b) = (Keeper::new(rec.clone()), Keeper::new(rec.clone()));
    let k = key("acq/timeout");
    let held = a
        .try_acquire(&k)
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let t = Instant::now();
    match b
        .acquire(&k)
        .ttl(Duration::from_secs(30))
        .wait(ms(300))
        .await
    {
        Err(AcquireError::Timeout {
            key: tk,
            holder,
            waited,
        }) => {
            assert_eq!(tk, k);
            assert!(holder.as_ref().is_some_and(|h| h.is_term_of(a.holder())));
            assert!(
                waited >= ms(300) && t.elapsed() < ms(600),
                "waited {waited:?}"
            );
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    match b.try_acquire(&k).ttl(Duration::from_secs(30)).await {
        Err(AcquireError::Held { holder, fence, .. }) => {
            assert_eq!(&holder, held.holder());
            assert_eq!(fence, held.fence());
        }
        other => panic!("expected the key held by a, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_an_error_not_a_wait() {
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let k = key("acq/corrupt");
    fake.write_raw(&k, b"junk".to_vec());
    let t = Instant::now();
    let r = keeper
        .acquire(&k)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .await;
    assert!(
        matches!(
            r,
            Err(AcquireError::Backend(
                lease_core::Error::CorruptRecord { .. }
            ))
        ),
        "{r:?}"
    );
    assert!(t.elapsed() < ms(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_errors_during_a_wait_are_retried() {
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let k = key("acq/flaky");
    fake.fail_next(3);
    let lease = keeper
        .acquire(&k)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(lease.may_write());
    // A lost answer: the grant was applied; the retry gets the same fence back.
    let k2 = key("acq/lost-answer");
    fake.lose_next_responses(1);
    let lease2 = keeper
        .acquire(&k2)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(lease2.fence().get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_lease_releases_it_in_the_background() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let k = key("acq/drop");
    let lease = keeper
        .try_acquire(&k)
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let mut watch = lease.loss_watch();
    drop(lease);
    assert_eq!(watch.wait().await, LossReason::Released);
    for _ in 0..100 {
        if rec.fake.read(&k).await.unwrap().is_free() {
            return;
        }
        tokio::time::sleep(ms(5)).await;
    }
    panic!("a dropped lease was not released");
}

#[test]
fn dropping_a_lease_outside_the_runtime_does_not_block() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let k = key("acq/drop-outside");
    let lease = rt
        .block_on(
            keeper
                .try_acquire(&k)
                .ttl(Duration::from_secs(30))
                .into_future(),
        )
        .unwrap();
    drop(rt);
    let t = std::time::Instant::now();
    drop(lease);
    assert!(t.elapsed() < ms(50));
}

// Paused time: a short TTL on the real clock fails the test whenever a
// renewal is scheduled a few tens of milliseconds late.
#[tokio::test(start_paused = true)]
async fn a_new_payload_goes_out_with_the_next_renewal() {
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let k = key("acq/payload");
    let ttl = ms(300);
    let lease = keeper
        .try_acquire(&k)
        .ttl(ttl)
        .payload(Payload::new(b"one".to_vec()).unwrap())
        .await
        .unwrap();
    lease.set_payload(Payload::new(b"two".to_vec()).unwrap());
    let before = lease.renewals();
    while lease.renewals() < before + 2 {
        tokio::time::sleep(ms(20)).await;
    }
    let read = fake.read(&k).await.unwrap();
    assert_eq!(read.holding().unwrap().payload.as_bytes(), b"two");
    assert_eq!(lease.payload().as_bytes(), b"two");
    lease.release().await.unwrap();
    assert!(fake.read(&k).await.unwrap().is_free());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_stops_writes_before_it_is_sent() {
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let k = key("acq/release");
    let lease = keeper
        .try_acquire(&k)
        .ttl(Duration::from_secs(5))
        .await
        .unwrap();
    let watch = lease.loss_watch();
    fake.fail_next(1);
    assert!(lease.release().await.is_err());
    assert_eq!(watch.get(), Some(LossReason::Released));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_of_duration_max_means_forever() {
    let fake = Fake::new();
    let (a, b) = (
        Keeper::new(Arc::new(fake.clone())),
        Keeper::new(Arc::new(fake.clone())),
    );
    let k = key("acq/forever");
    let ttl = Duration::from_secs(30);
    let held = a.try_acquire(&k).ttl(ttl).await.unwrap();
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move { b.acquire(&k).ttl(ttl).wait(Duration::MAX).await })
    };
    tokio::time::sleep(ms(200)).await;
    assert!(!waiter.is_finished(), "a wait of Duration::MAX ended early");
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the release")
        .expect("the waiting task did not panic")
        .expect("granted");
    assert!(got.may_write());
    got.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_acquire_attempt_is_bounded_by_the_wait() {
    let rec = Rec::new(Fake::new());
    rec.hang_acquires.store(true, Ordering::SeqCst);
    let keeper = Keeper::new(rec.clone());
    let k = key("acq/hang");
    let t = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(5),
        keeper
            .acquire(&k)
            .ttl(Duration::from_secs(10))
            .wait(ms(300)),
    )
    .await
    .expect("the acquire returned once its wait was over");
    assert!(
        matches!(out, Err(AcquireError::Timeout { .. })),
        "expected a timeout, got {out:?}"
    );
    assert!(
        t.elapsed() >= ms(300),
        "gave up before the wait: {:?}",
        t.elapsed()
    );
}

/// A `release()` future dropped while its request is on the way (a
/// `select!` or a timeout around it) still releases: the request runs in a
/// task of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_release_still_releases() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let k = key("acq/dropped-release");
    let lease = keeper
        .try_acquire(&k)
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    rec.slow_releases_ms.store(200, Ordering::SeqCst);
    let cut = tokio::time::timeout(ms(20), lease.release()).await;
    assert!(cut.is_err(), "the release answered within 20 ms: {cut:?}");
    tokio::time::sleep(ms(500)).await;
    assert_eq!(
        rec.fake.read(&k).await.unwrap(),
        lease_core::LeaseState::Free,
        "the key is still held after its release future was dropped"
    );
}

/// A release that gets no answer ends after a TTL with an unknown outcome
/// instead of waiting for ever (the grant expires by itself by then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_release_is_bounded_by_the_ttl() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let k = key("acq/hanging-release");
    let ttl = ms(300);
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    rec.hang_releases.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), lease.release())
        .await
        .expect("release() returned within 5 s");
    assert!(
        matches!(r, Err(lease_core::Error::Unavailable { .. })),
        "{r:?}"
    );
    assert!(start.elapsed() < ttl + ms(200), "{:?}", start.elapsed());
}

#[tokio::test(start_paused = true)]
async fn duration_max_for_ttl_wait_and_poll_never_panics() {
    let endless = Backoff::default()
        .first_pause(Duration::MAX)
        .longest_pause(Duration::MAX);
    let rec = Rec::new(Fake::new());
    rec.no_watch.store(true, Ordering::SeqCst);
    let keeper = Keeper::new(rec.clone()).with_backoff(endless);
    let k = key("acq/max");

    // A TTL longer than the backend's maximum is refused, at once or waiting.
    for r in [
        keeper.try_acquire(&k).ttl(Duration::MAX).await,
        keeper
            .acquire(&k)
            .ttl(Duration::MAX)
            .wait(Duration::MAX)
            .await,
    ] {
        match r {
            Err(AcquireError::Backend(lease_core::Error::InvalidTtl { .. })) => {}
            other => panic!("expected InvalidTtl, got {other:?}"),
        }
    }
    let with_max_ttl = Keeper::new(rec.clone()).with_ttl(Duration::MAX);
    assert!(with_max_ttl.try_acquire(&k).await.is_err());

    // A TTL the backend grants, however long: renewals and the deadline are
    // decades away, and nothing overflows.
    let century = Duration::from_secs(100 * 365 * 86_400);
    let long = Fake::with_ttl_rule(lease_core::TtlRule::new(ms(1)..=century).rounded_to(ms(1)));
    let lease = Keeper::new(Arc::new(long))
        .try_acquire(&k)
        .ttl(century)
        .await
        .unwrap();
    assert!(lease.deadline() > Instant::now() + Duration::from_secs(50 * 365 * 86_400));
    assert_eq!(lease.deadline().into_std(), lease.grant().deadline());
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(lease.may_write());
    lease.release().await.unwrap();

    // No end to the wait, polling with the longest pause there is: free,
    // the key is taken at once; held, the wait goes on without a panic.
    let held = keeper
        .acquire(&k)
        .ttl(Duration::from_secs(600))
        .wait(Duration::MAX)
        .await
        .unwrap();
    let other = Keeper::new(rec.clone()).with_backoff(endless);
    let waiting = tokio::time::timeout(
        Duration::from_secs(3600),
        other.acquire(&k).wait(Duration::MAX),
    )
    .await;
    assert!(waiting.is_err(), "the endless wait ended: {waiting:?}");
    // A bounded wait with an endless pause still ends when the wait does.
    let t = Instant::now();
    match other.acquire(&k).wait(ms(500)).await {
        Err(AcquireError::Timeout { waited, .. }) => assert_eq!(waited, ms(500)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(t.elapsed(), ms(500));
    held.release().await.unwrap();
}

/// A grant that counts from before its call (it rests on an earlier request)
/// keeps that earlier instant in the kept lease: the keeper's own send
/// instant, taken later, must not stretch the deadline past the backend's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_counted_from_before_the_call_keeps_its_earlier_deadline() {
    let rec = Rec::new(Fake::new());
    rec.backdate_grants_ms.store(3_000, Ordering::SeqCst);
    let keeper = Keeper::new(rec.clone());
    let ttl = Duration::from_secs(30);
    let before = Instant::now();
    let lease = keeper
        .try_acquire(&key("acq/backdated"))
        .ttl(ttl)
        .await
        .unwrap();
    let latest = Instant::now() + ttl * 2 / 3 - ms(3_000);
    assert!(
        lease.deadline() <= latest,
        "the kept deadline is {:?} after the backend's",
        lease.deadline().saturating_duration_since(latest)
    );
    assert!(
        lease.deadline() >= before + ttl * 2 / 3 - ms(3_500),
        "the deadline moved further back than the grant"
    );
    assert!(lease.may_write());
    lease.release().await.unwrap();
}

/// An acquire, a try_acquire, a group's acquire and a campaign hold no
/// borrow of their keeper, group or election: each can be spawned, and
/// outlives the handle it came from.
#[tokio::test(start_paused = true)]
async fn acquires_and_campaigns_can_be_spawned_and_outlive_their_keeper() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let group = keeper.group();
    let election = keeper.election(&key("acq/spawned/elect"));
    let (a, b, c) = (
        key("acq/spawned/a"),
        key("acq/spawned/b"),
        key("acq/spawned/c"),
    );
    let held = Keeper::new(rec.clone()).try_acquire(&a).await.unwrap();
    let waiting = tokio::spawn(
        keeper
            .acquire(&a)
            .wait(Duration::from_secs(60))
            .into_future(),
    );
    let tried = tokio::spawn(keeper.try_acquire(&b).into_future());
    let grouped = tokio::spawn(group.acquire(&c).into_future());
    let campaign = tokio::spawn(election.campaign(Payload::empty()).into_future());
    let holder = keeper.holder().clone();
    drop((keeper, election));
    tokio::time::sleep(ms(100)).await;
    held.release().await.unwrap();
    let got = waiting.await.unwrap().unwrap();
    assert!(got.holder().is_term_of(&holder));
    assert!(tried.await.unwrap().unwrap().may_write());
    assert!(grouped.await.unwrap().unwrap().may_write());
    assert!(campaign.await.unwrap().unwrap().may_write());
    drop(group);
}

/// An acquire takes a key as a `&LeaseKey` or a string;
/// a string that is no key fails the acquire when it is awaited, with the
/// error a backend gives for it, and sends nothing.
#[tokio::test(start_paused = true)]
async fn acquires_take_strings_as_keys_and_report_a_bad_one_when_awaited() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let owned = String::from("acq/into/string");
    let k = key("acq/into/key");
    let mut leases = vec![
        keeper.acquire("acq/into/str").await.unwrap(),
        keeper.try_acquire(&owned).await.unwrap(),
        keeper
            .try_acquire(format!("{owned}-2").as_str())
            .await
            .unwrap(),
        keeper.acquire(&k).await.unwrap(),
    ];
    let keys: Vec<&str> = leases.iter().map(|l| l.key().as_str()).collect();
    assert_eq!(
        keys,
        [
            "acq/into/str",
            "acq/into/string",
            "acq/into/string-2",
            "acq/into/key"
        ]
    );
    if let Some(last) = leases.pop() {
        last.release().await.unwrap();
    }
    let again = keeper.acquire(&k).await.unwrap();
    assert_eq!(again.key(), &k);
    let group = keeper.group();
    let member = group.acquire("acq/into/group").await.unwrap();
    assert_eq!(member.key().as_str(), "acq/into/group");
    let tried = group.try_acquire("acq/into/group-2").await.unwrap();
    assert!(tried.may_write());
    let ran = keeper
        .run_exclusive("acq/into/exclusive", async { 7 })
        .await
        .unwrap();
    assert!(matches!(ran, lease_keeper::WorkEnded::Finished(7)));

    let sent = rec.acquires.load(Ordering::SeqCst);
    let bad = "";
    let is_invalid = |r: &Result<_, AcquireError>| {
        matches!(
            r,
            Err(AcquireError::Backend(lease_core::Error::InvalidKey { .. }))
        )
    };
    let set_up = keeper.acquire(bad).wait(Duration::from_secs(1));
    assert!(is_invalid(&set_up.await.map(drop)));
    assert!(is_invalid(&keeper.try_acquire(bad).await.map(drop)));
    assert!(is_invalid(&group.acquire(bad).await.map(drop)));
    assert!(is_invalid(&group.try_acquire(bad).await.map(drop)));
    assert!(is_invalid(
        &keeper.run_exclusive(bad, async {}).await.map(drop)
    ));
    assert_eq!(
        rec.acquires.load(Ordering::SeqCst),
        sent,
        "a bad key was sent"
    );
}
