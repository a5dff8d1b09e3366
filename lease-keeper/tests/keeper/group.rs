//! LeaseGroup on the fake: shared expiry, the refresh callback, scoped use,
//! and 10,000 leases kept alive (correctness, not throughput).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{key, ms, Rec};
use lease_core::{LeaseBackend, Payload};
use lease_fake::Fake;
use lease_keeper::{AcquireError, Keeper, LeaseGroup, LossReason};
use tokio::time::{sleep, Instant};

/// A TTL nothing expires within while a test runs.
const TTL: Duration = Duration::from_secs(30);

/// Moves the fake's backend clock along with tokio's (paused) clock, so
/// leases that are not refreshed really expire.
fn drive_backend_clock(fake: &Fake, step: Duration) -> tokio::task::JoinHandle<()> {
    let fake = fake.clone();
    tokio::spawn(async move {
        let mut last = Instant::now();
        loop {
            sleep(step).await;
            let now = Instant::now();
            fake.advance(now - last);
            last = now;
        }
    })
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_leases_in_one_group_keep_renewing() {
    let fake = Fake::new();
    let rec = Rec::new(fake.clone());
    let keeper = Keeper::new(rec.clone());
    let group = keeper.group();
    let ttl = Duration::from_secs(10);
    let n = 10_000;
    let keys: Vec<_> = (0..n).map(|i| key(&format!("g10k/{i}"))).collect();
    let clock = drive_backend_clock(&fake, ms(50));
    let t0 = Instant::now();
    for k in &keys {
        let _ = group.try_acquire(k).ttl(ttl).await.unwrap();
    }
    let wall = std::time::Instant::now();
    sleep(ttl * 10).await;
    group.check().expect("no lease of the group may be lost");
    assert_eq!(group.len(), n);
    let mut min = u64::MAX;
    for l in group.leases() {
        assert!(l.may_write(), "{} may not write", l.key());
        min = min.min(l.renewals());
    }
    // 10 TTLs at one refresh per 0.3–0.55 TTL: at least 18 each.
    assert!(
        min >= 18,
        "a lease was refreshed only {min} times in 10 TTLs"
    );
    for k in keys.iter().step_by(997) {
        let s = fake.read(k).await.unwrap();
        assert!(s
            .holding()
            .is_some_and(|h| h.holder.is_term_of(keeper.holder())));
    }
    let renewals = rec.renew_count.load(Ordering::Relaxed);
    eprintln!(
        "10,000 leases: {renewals} refreshes over {:?} of virtual time in {:?} of wall time",
        Instant::now() - t0,
        wall.elapsed()
    );
    group.release_all().await.unwrap();
    clock.abort();
    assert!(fake.read(&keys[0]).await.unwrap().is_free());
    assert!(fake.read(&keys[n - 1]).await.unwrap().is_free());
}

#[tokio::test(start_paused = true)]
async fn refreshes_of_different_leases_are_not_serialised() {
    let fake = Fake::new();
    // Every request takes a tenth of the TTL (the schedule leaves 0.117 TTL
    // between the latest refresh and the deadline): serial refreshes of 50
    // leases would need 5 TTLs per round.
    let ttl = Duration::from_secs(10);
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let group = keeper.group();
    let clock = drive_backend_clock(&fake, ms(50));
    for i in 0..50 {
        let _ = group
            .try_acquire(&key(&format!("gpar/{i}")))
            .ttl(ttl)
            .await
            .unwrap();
    }
    fake.set_latency(Duration::from_secs(1));
    sleep(ttl * 10).await;
    group
        .check()
        .expect("slow but concurrent refreshes keep every lease");
    assert!(group.leases().iter().all(|l| l.renewals() >= 15));
    assert_eq!(group.len(), 50);
    clock.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_lease_releases_the_others_and_names_it() {
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let group = keeper.group();
    let ttl = ms(600);
    let keys: Vec<_> = (0..4).map(|i| key(&format!("gloss/{i}"))).collect();
    let mut leases = vec![];
    for k in &keys {
        leases.push(group.try_acquire(k).ttl(ttl).await.unwrap());
    }
    // Another holder takes keys[2] over after it expired on the backend.
    assert!(fake.expire(&keys[2]));
    let thief = Keeper::new(Arc::new(fake.clone()));
    let stolen = thief.try_acquire(&keys[2]).ttl(ttl).await.unwrap();
    let t = Instant::now();
    let abandoned = tokio::time::timeout(ttl, group.abandoned())
        .await
        .expect("the group noticed");
    assert!(t.elapsed() < ttl);
    assert_eq!(abandoned.keys(), vec![&keys[2]]);
    assert_eq!(
        abandoned.lost[0].1,
        LossReason::TakenOver {
            by: stolen.holder().clone(),
            fence: stolen.fence()
        }
    );
    assert!(abandoned.to_string().contains(keys[2].as_str()));
    for (i, (k, l)) in keys.iter().zip(&leases).enumerate() {
        assert!(!l.may_write());
        if i != 2 {
            assert_eq!(l.loss(), Some(LossReason::Abandoned));
            assert!(
                fake.read(k).await.unwrap().is_free(),
                "{k} was not released"
            );
        }
    }
    assert!(stolen.may_write());
    assert_eq!(
        fake.read(&keys[2]).await.unwrap().holding().unwrap().fence,
        stolen.fence()
    );
    assert_eq!(group.check(), Err(abandoned.clone()));
    assert!(group.is_empty());
    assert!(matches!(
        group.try_acquire(&key("gloss/new")).ttl(ttl).await,
        Err(AcquireError::GroupAbandoned(_))
    ));
    assert_eq!(group.release_all().await, Err(abandoned));
}

// Paused time: a short TTL on the real clock fails the test whenever a
// renewal is scheduled a few tens of milliseconds late.
#[tokio::test(start_paused = true)]
async fn the_refresh_callback_supplies_each_new_payload() {
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let calls = Arc::new(AtomicU64::new(0));
    let group = {
        let calls = calls.clone();
        LeaseGroup::with_refresh(keeper, move |l| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            Some(Payload::new(format!("{}#{n}", l.key()).into_bytes()).unwrap())
        })
    };
    let ttl = ms(400);
    let (a, b) = (key("gcb/a"), key("gcb/b"));
    let la = group.try_acquire(&a).ttl(ttl).await.unwrap();
    let lb = group.try_acquire(&b).ttl(ttl).await.unwrap();
    while la.renewals() < 3 || lb.renewals() < 3 {
        sleep(ms(20)).await;
    }
    for (k, l) in [(&a, &la), (&b, &lb)] {
        let stored = fake
            .read(k)
            .await
            .unwrap()
            .holding()
            .unwrap()
            .payload
            .clone();
        let text = String::from_utf8(stored.into_bytes()).unwrap();
        assert!(text.starts_with(&format!("{k}#")), "{k} stored {text:?}");
        assert_eq!(l.payload().as_bytes(), text.as_bytes());
    }
    assert!(calls.load(Ordering::SeqCst) >= 6);
    group.release_all().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_releases_everything_on_exit_or_stops_on_loss() {
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let ttl = ms(600);

    let group = keeper.group();
    let (a, b) = (key("gscope/a"), key("gscope/b"));
    let la = group.try_acquire(&a).ttl(ttl).await.unwrap();
    let _ = group.acquire(&b).ttl(ttl).wait(ms(100)).await.unwrap();
    let out = group
        .scope(async {
            sleep(ttl * 2).await;
            la.may_write()
        })
        .await;
    assert_eq!(out, Ok(true), "the leases held through the scope");
    assert!(fake.read(&a).await.unwrap().is_free());
    assert!(fake.read(&b).await.unwrap().is_free());

    let group = keeper.group();
    let _ = group.try_acquire(&a).ttl(ttl).await.unwrap();
    let _ = group.try_acquire(&b).ttl(ttl).await.unwrap();
    let f = fake.clone();
    let a2 = a.clone();
    let out = group
        .scope(async move {
            f.expire(&a2);
            sleep(Duration::from_secs(30)).await;
        })
        .await;
    let err = out.expect_err("the scope ends when a lease is lost");
    assert_eq!(err.keys(), vec![&a]);
    assert!(fake.read(&b).await.unwrap().is_free());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_group_releases_its_leases() {
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let group = keeper.group();
    let k = key("gdrop/a");
    let l = group
        .try_acquire(&k)
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    // A key the group holds is refused to a second acquire.
    assert!(matches!(
        group.try_acquire(&k).ttl(Duration::from_secs(30)).await,
        Err(AcquireError::Held { .. })
    ));
    assert_eq!(group.len(), 1);
    drop(group);
    assert_eq!(l.lost().await, LossReason::Released);
    for _ in 0..100 {
        if fake.read(&k).await.unwrap().is_free() {
            return;
        }
        sleep(ms(5)).await;
    }
    panic!("a dropped group did not release its lease");
}

#[tokio::test(start_paused = true)]
async fn a_group_serves_leases_taken_after_a_release() {
    let fake = Fake::new();
    let rec = Rec::new(fake.clone());
    let keeper = Keeper::new(rec.clone());
    let group = keeper.group();
    let ttl = Duration::from_secs(3);
    let clock = drive_backend_clock(&fake, ms(50));
    let (a, b) = (key("gagain/a"), key("gagain/b"));
    let la = group.try_acquire(&a).ttl(ttl).await.unwrap();
    let _ = group.try_acquire(&b).ttl(ttl).await.unwrap();
    sleep(ttl).await;
    group.release(&la).await.unwrap();
    assert_eq!(la.loss(), Some(LossReason::Released));
    assert!(fake.read(&a).await.unwrap().is_free());
    // Taken again at once: refreshed on its own schedule only.
    let la2 = group.try_acquire(&a).ttl(ttl).await.unwrap();
    let from = Instant::now();
    sleep(ttl * 10).await;
    let n = rec.renew_times(&a).iter().filter(|t| **t > from).count();
    assert!(
        (18..=34).contains(&n),
        "{n} refreshes of the re-taken key in 10 TTLs"
    );
    assert!(la2.may_write());
    // After release_all the group still keeps what it takes next.
    group.release_all().await.unwrap();
    assert!(group.is_empty());
    let lc = group.try_acquire(&key("gagain/c")).ttl(ttl).await.unwrap();
    sleep(ttl * 5).await;
    assert!(
        lc.may_write() && lc.renewals() >= 9,
        "{} refreshes",
        lc.renewals()
    );
    group.check().unwrap();
    clock.abort();
}

/// A group of two leases whose releases hang (a backend that stopped
/// answering them): `a` is lost on the backend, the group must stop the
/// scope's work by `a`'s deadline, without waiting for `b`'s release.
async fn group_with_hanging_releases(
    name: &str,
    ttl: Duration,
) -> (Arc<Rec>, LeaseGroup, lease_keeper::GroupLease) {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let group = keeper.group();
    let la = group
        .try_acquire(&key(&format!("{name}/a")))
        .ttl(ttl)
        .await
        .unwrap();
    let _ = group
        .try_acquire(&key(&format!("{name}/b")))
        .ttl(ttl)
        .await
        .unwrap();
    rec.hang_releases
        .store(true, std::sync::atomic::Ordering::SeqCst);
    (rec, group, la)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_drops_work_by_the_lost_lease_deadline_even_if_releases_hang() {
    let ttl = ms(600);
    let (rec, group, la) = group_with_hanging_releases("gscope-hang", ttl).await;
    let writes = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let w = writes.clone();
    rec.fake.expire(la.key());
    let out = group
        .scope(async move {
            loop {
                w.lock().unwrap().push(Instant::now());
                sleep(ms(5)).await;
            }
        })
        .await;
    let err = out.expect_err("the scope ends when a lease is lost");
    assert_eq!(err.keys(), vec![la.key()]);
    let last = *writes.lock().unwrap().last().unwrap();
    assert!(
        last <= la.deadline(),
        "work ran {:?} past the lost lease's deadline",
        last - la.deadline()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_is_an_error_when_work_ends_just_after_a_loss() {
    let ttl = ms(600);
    let (rec, group, la) = group_with_hanging_releases("gscope-late", ttl).await;
    let mut lost = la.loss_watch();
    rec.fake.expire(la.key());
    let out = group
        .scope(async move {
            lost.wait().await;
            "finished"
        })
        .await;
    let err = out.expect_err("a lease was lost while the work ran");
    assert_eq!(err.keys(), vec![la.key()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_is_abandoning_refuses_new_members() {
    let ttl = ms(600);
    let (rec, group, la) = group_with_hanging_releases("gadd-race", ttl).await;
    rec.fake.expire(la.key());
    la.lost().await;
    // The loss is known and the group is giving its other lease back (the
    // release hangs); an acquire now must not join the dying group.
    sleep(ms(20)).await;
    match group.try_acquire(&key("gadd-race/c")).ttl(ttl).await {
        Err(AcquireError::GroupAbandoned(a)) => assert_eq!(a.keys(), vec![la.key()]),
        Ok(lc) => panic!(
            "a group that is abandoning took a new member (fence {}, loss {:?})",
            lc.fence(),
            lc.loss()
        ),
        other => panic!("unexpected {other:?}"),
    }
}

// Paused time: a short TTL on the real clock fails the test whenever a
// renewal is scheduled a few tens of milliseconds late.
#[tokio::test(start_paused = true)]
async fn concurrent_acquires_of_one_key_get_one_grant_and_one_refusal() {
    let fake = Fake::new();
    fake.set_latency(ms(20));
    let keeper = Keeper::new(Arc::new(fake.clone()));
    let group = keeper.group();
    let ttl = ms(300);
    let k = key("gdup/a");
    let (l1, l2) = tokio::join!(
        group.try_acquire(&k).ttl(ttl),
        group.try_acquire(&k).ttl(ttl)
    );
    let (won, refused) = match (l1, l2) {
        (Ok(l), Err(e)) | (Err(e), Ok(l)) => (l, e),
        other => panic!("expected one grant and one refusal: {other:?}"),
    };
    match refused {
        AcquireError::Held { holder, fence, .. } => {
            assert_eq!(&holder, won.holder());
            assert_eq!(fence, won.fence());
        }
        e => panic!("expected the group's own term to be named: {e}"),
    }
    assert_eq!(group.len(), 1);
    // A key the group holds is refused again, and the lease goes on.
    assert!(matches!(
        group.try_acquire(&k).ttl(ttl).await,
        Err(AcquireError::Held { .. })
    ));
    sleep(ttl * 3).await;
    assert!(won.may_write() && won.renewals() > 0, "{:?}", won.loss());
    // Once it left the group, the key is taken again with a higher fence.
    group.release(&won).await.unwrap();
    let again = group.try_acquire(&k).ttl(ttl).await.unwrap();
    assert!(again.fence() > won.fence());
    group.release_all().await.unwrap();
}

/// A group's `release()` or `release_all()` future dropped while the
/// requests are on the way (a `select!` or a timeout around it) still
/// releases: the requests run in tasks of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_group_release_still_releases() {
    let rec = Rec::new(Fake::new());
    let group = Keeper::new(rec.clone()).group();
    let ttl = Duration::from_secs(30);
    let (a, b, c) = (
        key("gdropped-release/a"),
        key("gdropped-release/b"),
        key("gdropped-release/c"),
    );
    let la = group.try_acquire(&a).ttl(ttl).await.unwrap();
    let _ = group.try_acquire(&b).ttl(ttl).await.unwrap();
    let _ = group.try_acquire(&c).ttl(ttl).await.unwrap();
    rec.slow_releases_ms
        .store(200, std::sync::atomic::Ordering::SeqCst);
    let cut = tokio::time::timeout(ms(20), group.release(&la)).await;
    assert!(cut.is_err(), "the release answered within 20 ms: {cut:?}");
    assert!(!la.may_write());
    let cut = tokio::time::timeout(ms(20), group.release_all()).await;
    assert!(cut.is_err(), "release_all answered within 20 ms: {cut:?}");
    sleep(ms(500)).await;
    for k in [&a, &b, &c] {
        assert!(
            rec.fake.read(k).await.unwrap().is_free(),
            "{k} is still held after its release future was dropped"
        );
    }
    assert!(group.is_empty());
}

/// Releases that get no answer end after a TTL with an unknown outcome
/// instead of waiting for ever (the grants expire by themselves by then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_group_releases_are_bounded_by_the_ttl() {
    let ttl = ms(300);
    let (rec, group, la) = group_with_hanging_releases("gunanswered-release", ttl).await;
    let _ = rec;
    let start = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), group.release(&la))
        .await
        .expect("release() returned within 5 s");
    assert!(
        matches!(r, Err(lease_core::Error::Unavailable { .. })),
        "{r:?}"
    );
    assert!(start.elapsed() < ttl + ms(200), "{:?}", start.elapsed());
    let start = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), group.release_all())
        .await
        .expect("release_all() returned within 5 s");
    assert_eq!(r, Ok(()));
    assert!(start.elapsed() < ttl + ms(200), "{:?}", start.elapsed());
}

/// On a loss, `scope` drops its work the moment the loss is known, not once
/// the other leases' releases (which hang here) have finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_drops_its_work_at_once_on_loss_while_releases_hang() {
    struct Dropped(Arc<std::sync::Mutex<Option<Instant>>>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(Instant::now());
        }
    }
    let ttl = ms(600);
    let (rec, group, la) = group_with_hanging_releases("gscope-at-once", ttl).await;
    let dropped = Arc::new(std::sync::Mutex::new(None));
    let guard = Dropped(dropped.clone());
    let lost_at = {
        let la = la.clone();
        tokio::spawn(async move {
            la.lost().await;
            Instant::now()
        })
    };
    rec.fake.expire(la.key());
    let out = group
        .scope(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        })
        .await;
    let returned = Instant::now();
    assert_eq!(out.expect_err("a lease was lost").keys(), vec![la.key()]);
    let lost_at = lost_at.await.unwrap();
    let dropped = dropped.lock().unwrap().expect("the work was dropped");
    assert!(
        dropped <= lost_at + ms(50),
        "the work was dropped {:?} after the loss was known",
        dropped.saturating_duration_since(lost_at)
    );
    // The releases hang, bounded by the TTL: scope returns only after them.
    assert!(
        returned >= dropped + ms(200),
        "scope returned {:?} after dropping the work; the hanging releases were not waited for",
        returned.saturating_duration_since(dropped)
    );
}

/// A group's `try_acquire` is one attempt that is refused at once when
/// someone else holds the key. With turns, it waits (here: for ever) behind
/// a waiting `acquire` of the same key in the same group, which holds the
/// key's turn for as long as the other holder keeps the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_try_acquire_is_not_stuck_behind_a_waiting_acquire() {
    let rec = Rec::new(Fake::new());
    let (a, b) = (Keeper::new(rec.clone()), Keeper::new(rec.clone()));
    let k = key("review/group-turn");
    let held = b.try_acquire(&k).ttl(TTL).await.unwrap();
    let group = a.group();
    let waiting = {
        let (group, k) = (group.clone(), k.clone());
        tokio::spawn(async move { group.acquire(&k).ttl(TTL).await.map(|l| l.fence()) })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let tried = tokio::time::timeout(Duration::from_secs(2), group.try_acquire(&k).ttl(TTL)).await;
    waiting.abort();
    drop(held);
    match tried {
        Ok(Err(AcquireError::Held { .. })) => {}
        Ok(other) => panic!("expected Held at once, got {:?}", other.map(|l| l.fence())),
        Err(_) => panic!("group.try_acquire was still waiting for the key's turn after 2 s"),
    }
}

/// Two tasks sharing one group never both hold one key: the second
/// acquire of a key the group holds is refused, naming the group's own term,
/// and the first task's lease is untouched by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_acquire_of_a_key_the_group_holds_is_refused() {
    let rec = Rec::new(Fake::new());
    let group = Keeper::new(rec.clone()).group();
    let k = key("review/group-reentrant");
    let task1 = group.try_acquire(&k).ttl(TTL).await.unwrap();
    match group.try_acquire(&k).ttl(TTL).await {
        Err(AcquireError::Held { holder, fence, .. }) => {
            assert_eq!(&holder, task1.holder());
            assert_eq!(fence, task1.fence());
        }
        other => panic!(
            "a second task got the group's key: {:?}",
            other.map(|l| l.fence())
        ),
    }
    assert!(task1.may_write());
    group.release(&task1).await.unwrap();
}

/// Dropping a group's last handle releases its members even while an
/// acquire of that group waits (for ever) for a held key; the acquire then
/// ends with the group abandoned instead of keeping the group alive.
#[tokio::test(start_paused = true)]
async fn dropping_the_group_releases_its_members_despite_a_pending_acquire() {
    let fake = Fake::new();
    let backend: Arc<dyn LeaseBackend> = Arc::new(fake.clone());
    let group = Keeper::new(backend.clone()).group();
    let other = Keeper::new(backend.clone());
    let (a, b) = (key("group/drop-a"), key("group/drop-b"));
    let _a = group.acquire(&a).await.expect("a");
    let held_b = other.acquire(&b).await.expect("b");
    let pending = tokio::spawn(std::future::IntoFuture::into_future(group.acquire(&b)));
    sleep(ms(50)).await;
    drop(_a);
    drop(group);
    sleep(ms(200)).await;
    let third = Keeper::new(backend.clone());
    let taken = third.try_acquire(&a).await;
    assert!(
        taken.is_ok(),
        "the dropped group still holds its member: {:?}",
        taken.err()
    );
    held_b.release().await.expect("release b");
    let ended = tokio::time::timeout(Duration::from_secs(60), pending)
        .await
        .expect("the pending acquire ended")
        .expect("joined");
    assert!(
        matches!(ended, Err(AcquireError::GroupAbandoned(_))),
        "{ended:?}"
    );
    // Its grant of b was given back: b is free again.
    sleep(ms(200)).await;
    assert!(third.try_acquire(&b).await.is_ok(), "b stayed held");
}

/// Renews like the fake, but panics in every renewal of the key `boom`.
struct PanicsOnBoom {
    fake: Fake,
}

impl lease_core::LeaseLayer for PanicsOnBoom {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn renew<'a>(
        &'a self,
        grant: &'a lease_core::Grant,
        payload: Option<Payload>,
    ) -> lease_core::BoxFuture<'a, Result<lease_core::Renewal, lease_core::Error>> {
        Box::pin(async move {
            if grant.key().as_str() == "gboom/boom" {
                panic!("a backend bug");
            }
            self.fake.renew(grant, payload).await
        })
    }
}

/// A backend that panics in one lease's renewal leaves the group's other
/// leases renewed, and the group gives up, naming that lease, once its
/// deadline passed: the panic is an unknown outcome, not the end of the
/// group's scheduler (and with it of every lease's renewals, unreported).
#[tokio::test(start_paused = true)]
async fn a_backend_panicking_in_one_renewal_is_an_unknown_outcome() {
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(PanicsOnBoom { fake: fake.clone() }));
    let group = keeper.group();
    let ttl = Duration::from_secs(3);
    let fine = group
        .try_acquire(&key("gboom/fine"))
        .ttl(ttl)
        .await
        .unwrap();
    let boom = group
        .try_acquire(&key("gboom/boom"))
        .ttl(ttl)
        .await
        .unwrap();
    let abandoned = tokio::time::timeout(ttl * 2, group.abandoned())
        .await
        .expect("the group gave up on the lease whose renewals panic");
    assert_eq!(abandoned.keys(), vec![boom.key()]);
    assert_eq!(abandoned.lost[0].1, LossReason::DeadlinePassed);
    assert!(fine.renewals() >= 1, "the other lease was not renewed");
    assert!(!fine.may_write() && !boom.may_write());
}
