//! One grant, one term: a term's late release, a second task on the same
//! keeper, and a grant left on the backend under the keeper's holder id can
//! never give two holders the key, nor repeat a fence.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use crate::common::{key, ms, Rec};
use lease_core::{Acquire, AcquireRequest, LeaseBackend};
use lease_fake::Fake;
use lease_keeper::{AcquireError, Keeper, WorkEnded};

const TTL: Duration = Duration::from_secs(30);

/// Dropping a lease releases it in the background; acquiring the key again
/// at once must not get the same grant back (the late release would then
/// free the new term while it may still write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_of_a_dropped_term_leaves_the_next_term_alone() {
    let rec = Rec::new(Fake::new());
    rec.slow_releases_ms.store(300, Ordering::SeqCst);
    let (a, b) = (Keeper::new(rec.clone()), Keeper::new(rec.clone()));
    let k = key("terms/late-release");
    let first = a.try_acquire(&k).ttl(TTL).await.unwrap();
    let first_fence = first.fence();
    drop(first);
    // The next term waits for the first term's release rather than taking
    // its grant over.
    let second = a
        .acquire(&k)
        .ttl(TTL)
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        second.fence() > first_fence,
        "the second term's fence {} must be above the first's {first_fence}",
        second.fence()
    );
    // Let the first term's release land, then another keeper tries the key.
    tokio::time::sleep(ms(600)).await;
    assert!(second.may_write());
    let other = b.try_acquire(&k).ttl(TTL).await;
    assert!(
        matches!(other, Err(AcquireError::Held { .. })),
        "another keeper was granted the key while the second term may write: {other:?}"
    );
    second.release().await.unwrap();
}

/// The same on a current-thread runtime, through elections: campaign, drop
/// the leadership, campaign again at once.
#[tokio::test(flavor = "current_thread")]
async fn a_recampaign_after_a_drop_gets_a_new_term_with_a_higher_fence() {
    let rec = Rec::new(Fake::new());
    let (a, b) = (Keeper::new(rec.clone()), Keeper::new(rec.clone()));
    let k = key("terms/recampaign");
    let election = a.election(&k).with_ttl(TTL);
    let first = election
        .campaign(lease_core::Payload::empty())
        .await
        .unwrap();
    let first_fence = first.fence();
    drop(first);
    let second = election
        .campaign(lease_core::Payload::empty())
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(second.fence() > first_fence);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(second.may_write());
    assert!(
        b.try_acquire(&k).ttl(TTL).await.is_err(),
        "another keeper was granted the key while the second term may write"
    );
    second.resign().await.unwrap();
}

/// A keeper is cheap to clone and shared by tasks: two of them never hold
/// one key at once. A second `try_acquire` is refused, naming the first
/// term; a second `acquire` waits for the first term's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_sharing_a_keeper_do_not_both_hold_a_key() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let k = key("terms/two-tasks");
    let first = keeper.try_acquire(&k).ttl(TTL).await.unwrap();
    let refused = keeper.clone().try_acquire(&k).ttl(TTL).await;
    match refused {
        Err(AcquireError::Held { holder, fence, .. }) => {
            assert_eq!(&holder, first.holder());
            assert_eq!(fence, first.fence());
        }
        other => panic!("a second task on the same keeper got the held key: {other:?}"),
    }
    let waiter = {
        let (keeper, k) = (keeper.clone(), k.clone());
        tokio::spawn(async move {
            keeper
                .acquire(&k)
                .ttl(TTL)
                .wait(Duration::from_secs(5))
                .await
        })
    };
    tokio::time::sleep(ms(200)).await;
    assert!(!waiter.is_finished(), "the second task did not wait");
    let (first_fence, first_holder) = (first.fence(), first.holder().clone());
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(second.fence() > first_fence);
    assert_ne!(second.holder(), &first_holder);
    second.release().await.unwrap();
}

/// A grant on the backend under the keeper's own holder id (a record a
/// crashed server brought back, or an acquire of an earlier process with the
/// same id) is not handed to a new acquire as its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_left_under_the_keepers_holder_id_is_not_adopted() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let k = key("terms/resurrected");
    let left = match rec
        .try_acquire(AcquireRequest::new(k.clone(), keeper.holder().clone()).ttl(TTL))
        .await
        .unwrap()
    {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => panic!("the key was held: {h:?}"),
    };
    let got = keeper.try_acquire(&k).ttl(TTL).await;
    assert!(
        matches!(got, Err(AcquireError::Held { fence, .. }) if fence == left.fence()),
        "a new acquire adopted a grant it did not make: {got:?}"
    );
}

/// A term's holder id names the keeper's holder it belongs to, and every
/// term has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_term_has_its_own_holder_id_derived_from_the_keepers() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let (k1, k2) = (key("terms/ids-1"), key("terms/ids-2"));
    let a = keeper.try_acquire(&k1).ttl(TTL).await.unwrap();
    let b = keeper.try_acquire(&k2).ttl(TTL).await.unwrap();
    assert_ne!(a.holder(), b.holder());
    assert!(a.holder().is_term_of(keeper.holder()));
    assert!(b.holder().is_term_of(keeper.holder()));
    assert!(!a.holder().is_term_of(Keeper::new(rec.clone()).holder()));
}

/// An acquire whose answer was lost leaves no grant that keeps everyone
/// else out for its TTL: the keeper settles it (adopts and releases it),
/// since no later call shares its term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_with_an_unknown_outcome_leaves_no_grant_behind() {
    let rec = Rec::new(Fake::new());
    let (a, b) = (Keeper::new(rec.clone()), Keeper::new(rec.clone()));
    let k = key("terms/lost-answer");
    // The backend grants the key, and the answer is lost.
    rec.fake.lose_next_responses(1);
    let attempt = a.try_acquire(&k).ttl(TTL).await;
    assert!(
        matches!(attempt, Err(AcquireError::Backend(ref e)) if e.is_unknown_outcome()),
        "{attempt:?}"
    );
    let got = b.acquire(&k).ttl(TTL).wait(Duration::from_secs(3)).await;
    assert!(
        got.is_ok(),
        "the dropped acquire's grant kept another keeper out for its TTL: {got:?}"
    );
}

/// A resign from another task releases only after `run` has dropped the
/// work, even when the work sits in a long poll on another thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_releases_only_after_the_work_is_dropped() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let k = key("terms/resign-waits");
    let leadership = keeper
        .election(&k)
        .with_ttl(TTL)
        .campaign(lease_core::Payload::empty())
        .await
        .unwrap();
    let resigner = leadership.resigner();
    let dropped = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let runner = {
        let (dropped, started) = (dropped.clone(), started.clone());
        tokio::spawn(async move {
            struct OnDrop(Arc<AtomicBool>);
            impl Drop for OnDrop {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
            let guard = OnDrop(dropped);
            let work = poll_fn(move |_| {
                let _keep = &guard;
                started.notify_one();
                // A long poll: the work blocks its thread for a while.
                std::thread::sleep(ms(400));
                Poll::<()>::Pending
            });
            leadership.run(work).await
        })
    };
    started.notified().await;
    resigner.resign().await.unwrap();
    assert!(
        dropped.load(Ordering::SeqCst),
        "the release was sent while the work still ran"
    );
    assert!(matches!(runner.await.unwrap(), WorkEnded::Resigned));
}

/// The settle task re-acquires with the abandoned term's id: when the
/// attempt never reached the backend, that *takes the free key* (a new
/// grant, a new fence), which is then held until the settle's release lands
/// — for a whole TTL if that release is lost. A caller that retries at once
/// after an `Unavailable` (as it is told to) is refused by its own keeper's
/// settle task, though nobody held the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_an_attempt_that_never_landed_is_not_refused_by_the_settle() {
    let rec = Rec::new(Fake::new());
    rec.slow_releases_ms
        .store(500, std::sync::atomic::Ordering::SeqCst);
    let a = Keeper::new(rec.clone());
    let k = key("review/settle-takes-a-free-key");
    rec.fake.fail_next(1);
    let first = a.try_acquire(&k).ttl(TTL).await;
    assert!(
        matches!(&first, Err(AcquireError::Backend(e)) if e.is_unknown_outcome()),
        "{:?}",
        first.map(|l| l.fence())
    );
    // The failed attempt was never applied: the key is free. Retry.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = a.try_acquire(&k).ttl(TTL).await;
    match second {
        Ok(l) => assert_eq!(l.fence().get(), 1, "the settle spent a fence on a free key"),
        Err(e) => panic!("the retry was refused though nobody held the key: {e}"),
    }
}

/// The same root cause seen by everyone else: a campaign cancelled while its
/// attempt had not reached the backend makes the settle task take the free
/// election key, so readers and observers see a leader — this keeper's term,
/// a new fence, and an empty value instead of the advertised one — though
/// no candidate leads.
#[tokio::test(flavor = "current_thread")]
async fn a_cancelled_campaign_does_not_show_a_phantom_leader() {
    let rec = Rec::new(Fake::new());
    rec.slow_releases_ms
        .store(500, std::sync::atomic::Ordering::SeqCst);
    let a = Keeper::new(rec.clone());
    let election = a.election(&key("review/phantom-leader")).with_ttl(TTL);
    rec.hang_acquires
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let value = lease_core::Payload::new("10.0.0.7:8080").unwrap();
    let campaign = tokio::time::timeout(Duration::from_millis(100), election.campaign(value)).await;
    assert!(campaign.is_err(), "the campaign was cut off");
    // The attempt never reached the backend; let the settle task run.
    rec.hang_acquires
        .store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let leader = election.leader().await.unwrap();
    assert!(
        leader.is_none(),
        "a phantom leader after a cancelled campaign: {leader:?}"
    );
}

/// `HolderId::term` keeps only the first 111 bytes of a long holder id, so
/// two holders whose names differ only after that draw term ids that name
/// neither apart: `is_term_of` (what the conformance properties, the bench
/// and operators reading `lease status` rely on to tell who leads) takes one
/// holder's term for the other's. A CLI default holder
/// (`user@host:pid:random`) on a long host name loses exactly the part that
/// tells processes apart.
#[test]
fn term_ids_of_two_long_holders_are_told_apart() {
    let name =
        |tail: &str| lease_core::HolderId::new(format!("{}{tail}", "h".repeat(111))).unwrap();
    let (a, b) = (name(":pid-1:aaaaaaaa"), name(":pid-2:bbbbbbbb"));
    assert_ne!(a, b);
    let t = a.term();
    assert!(t.is_term_of(&a));
    assert!(
        !t.is_term_of(&b),
        "{t} is taken for a term of another holder"
    );
}
