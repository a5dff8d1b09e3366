//! Shared and exclusive leases and permits on the fake: what a caller sees
//! at the edges (one attempt, bad input, leaving a phase to the others, a
//! plain lease beside shared holders).

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, LeaseBackend, LeaseKey, LeaseState};
use lease_fake::Fake;
use std::future::IntoFuture;

use lease_keeper::{AcquireError, Keeper, SHARED_HOLDER};

fn keeper(fake: &Fake) -> Keeper {
    Keeper::new(Arc::new(fake.clone())).with_ttl(Duration::from_secs(3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shared_attempt_times_out_while_an_exclusive_holder_is_in() {
    let fake = Fake::new();
    let x = keeper(&fake).acquire_exclusive("rw/a").await.unwrap();
    let err = keeper(&fake)
        .acquire_shared("rw/a")
        .wait(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AcquireError::Timeout { holder: Some(h), .. } if h == x.holder()),
        "{err:?}"
    );
    // The attempt backed out: its registration is gone.
    for i in 0..lease_keeper::MAX_SHARED {
        let slot = LeaseKey::new(format!("rw/a/shared-{i}")).unwrap();
        assert_eq!(fake.read(&slot).await.unwrap(), LeaseState::Free, "{slot}");
    }
    x.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_holder_leaving_leaves_the_phase_to_the_others() {
    let fake = Fake::new();
    let a = keeper(&fake).acquire_shared("rw/b").await.unwrap();
    let b = keeper(&fake).acquire_shared("rw/b").await.unwrap();
    assert_ne!(a.holder(), b.holder());
    assert_ne!(a.registration().key(), b.registration().key());
    a.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(b.may_write(), "{:?}", b.loss());
    match fake.read(&"rw/b".parse().unwrap()).await.unwrap() {
        LeaseState::Held(h) => {
            assert_eq!(h.holder.as_str(), SHARED_HOLDER);
            assert_eq!(h.fence, b.fence());
        }
        LeaseState::Free => panic!("the phase ended with a shared holder still in"),
    }
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lease_and_shared_holders_exclude_each_other() {
    let fake = Fake::new();
    let s = keeper(&fake).acquire_shared("rw/c").await.unwrap();
    let plain = keeper(&fake).try_acquire("rw/c").await.unwrap_err();
    assert!(
        matches!(&plain, AcquireError::Held { holder, .. } if holder.as_str() == SHARED_HOLDER),
        "{plain:?}"
    );
    s.release().await.unwrap();
    let x = keeper(&fake)
        .acquire_exclusive("rw/c")
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    let err = keeper(&fake)
        .acquire_shared("rw/c")
        .wait(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, AcquireError::Timeout { .. }), "{err:?}");
    x.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_registration_makes_the_shared_lease_unwritable() {
    let fake = Fake::new();
    let s = keeper(&fake).acquire_shared("rw/d").await.unwrap();
    // Code handed the plain view keeps the shared lease by both deadlines.
    let view: &lease_keeper::LeaseView = &s;
    assert!(view.deadline() <= s.registration().deadline());
    assert!(view.may_write());
    // An operator breaks this holder's registration.
    fake.break_lease(
        s.registration().key(),
        &lease_core::BreakNote::new("ops", "test"),
    )
    .await
    .unwrap();
    let mut loss = s.loss_watch();
    tokio::time::timeout(Duration::from_secs(5), loss.wait())
        .await
        .unwrap();
    assert!(!s.may_write());
    let view: &lease_keeper::LeaseView = &s;
    assert!(!view.may_write());
    let _ = s.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_permit_counts_and_keys_are_refused_before_anything_is_sent() {
    let fake = Fake::new();
    for n in [0, lease_keeper::MAX_PERMITS + 1] {
        let err = keeper(&fake).acquire_permit("p/a", n).await.unwrap_err();
        assert!(
            matches!(err, AcquireError::Backend(Error::InvalidKey { .. })),
            "{n}: {err:?}"
        );
    }
    let long = "k".repeat(250);
    let err = keeper(&fake)
        .acquire_shared(long.as_str())
        .await
        .unwrap_err();
    assert!(
        matches!(err, AcquireError::Backend(Error::InvalidKey { .. })),
        "{err:?}"
    );
    let err = keeper(&fake)
        .acquire_permit(long.as_str(), 3)
        .await
        .unwrap_err();
    assert!(
        matches!(err, AcquireError::Backend(Error::InvalidKey { .. })),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_permit_lets_the_next_holder_in_at_once() {
    let fake = Fake::new();
    let a = keeper(&fake).acquire_permit("p/b", 1).await.unwrap();
    let waiting = tokio::spawn(
        keeper(&fake)
            .acquire_permit("p/b", 1)
            .wait(Duration::from_secs(5))
            .into_future(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished());
    let fa = a.fence();
    a.release().await.unwrap();
    let b = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(b.fence() > fa);
    b.release().await.unwrap();
}

/// The fake, with every read of a shared registration answered this late:
/// the read that tells why a refused renewal lost its grant.
struct SlowRegistrationReads(Fake, Duration);

impl lease_core::LeaseLayer for SlowRegistrationReads {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.0
    }
    fn read<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> lease_core::BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(async move {
            if key.as_str().contains("/shared-") {
                tokio::time::sleep(self.1).await;
            }
            self.0.read(key).await
        })
    }
}

/// A registration lost before its deadline reports its loss on the shared
/// lease as the registration's own (broken, here, by whom), not as a
/// deadline that passed, even when the read telling why comes late: a
/// moment late, or after the registration's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_registration_says_why_on_the_shared_lease() {
    for late in [Duration::from_millis(200), Duration::from_millis(2500)] {
        registration_loss_reported_with_reads(late).await;
    }
}

async fn registration_loss_reported_with_reads(late: Duration) {
    let fake = Fake::new();
    let backend = Arc::new(SlowRegistrationReads(fake.clone(), late));
    let keeper = Keeper::new(backend).with_ttl(Duration::from_secs(3));
    let s = keeper.acquire_shared("rw/why").await.unwrap();
    fake.break_lease(
        s.registration().key(),
        &lease_core::BreakNote::new("ops", "maintenance"),
    )
    .await
    .unwrap();
    let mut loss = s.loss_watch();
    let reason = tokio::time::timeout(Duration::from_secs(5), loss.wait())
        .await
        .unwrap();
    assert!(
        matches!(reason, lease_keeper::LossReason::Broken { .. }),
        "the shared lease reports {reason:?} for a broken registration, its read {late:?} late"
    );
    assert!(!s.may_write());
    let _ = s.release().await;
}

/// The fake, with the first read of an exclusive intent failing and every
/// release of a shared registration answered at once as failed while it
/// lands 300 ms later: a release still on its way when its holder tries
/// again.
struct LateRegistrationRelease {
    fake: Fake,
    intent_reads_to_fail: std::sync::atomic::AtomicU32,
}

impl lease_core::LeaseLayer for LateRegistrationRelease {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn read<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> lease_core::BoxFuture<'a, Result<LeaseState, Error>> {
        use std::sync::atomic::Ordering;
        if key.as_str().ends_with("/exclusive")
            && self
                .intent_reads_to_fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Box::pin(async {
                Err(Error::Unavailable {
                    detail: "seeded: intent read lost".into(),
                    source: None,
                })
            });
        }
        self.fake.read(key)
    }
    fn release<'a>(
        &'a self,
        grant: &'a lease_core::Grant,
    ) -> lease_core::BoxFuture<'a, Result<(), Error>> {
        if !grant.key().as_str().contains("/shared-") {
            return self.fake.release(grant);
        }
        let (fake, grant) = (self.fake.clone(), grant.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = fake.release(&grant).await;
        });
        Box::pin(async {
            Err(Error::Unavailable {
                detail: "seeded: release answer lost".into(),
                source: None,
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_of_a_registration_never_lets_an_exclusive_holder_in() {
    let fake = Fake::new();
    let key: LeaseKey = "rw/late".parse().unwrap();
    // Every registration slot but the last is taken, so a shared holder that
    // tries again comes back to the same slot.
    let mut others = Vec::new();
    for i in 0..lease_keeper::MAX_SHARED - 1 {
        others.push(
            keeper(&fake)
                .try_acquire(format!("rw/late/shared-{i}").as_str())
                .await
                .unwrap(),
        );
    }
    let seeded = Arc::new(LateRegistrationRelease {
        fake: fake.clone(),
        intent_reads_to_fail: std::sync::atomic::AtomicU32::new(1),
    });
    let s = Keeper::new(seeded)
        .with_ttl(Duration::from_secs(3))
        .acquire_shared(&key)
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    // Let the late release land, free the other slots, and try exclusively.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for o in others {
        o.release().await.unwrap();
    }
    let x = keeper(&fake)
        .acquire_exclusive(&key)
        .wait(Duration::from_secs(1))
        .await;
    if let Ok(x) = &x {
        assert!(
            !s.may_write(),
            "an exclusive holder (fence {}) got in while a shared holder (fence {}) may still write",
            x.fence(),
            s.fence()
        );
    }
    assert!(matches!(x, Err(AcquireError::Timeout { .. })), "{x:?}");
    let _ = s.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_holder_out_of_its_phase_gives_its_registration_up_at_once() {
    let fake = Fake::new();
    let key: LeaseKey = "rw/broken".parse().unwrap();
    let s = keeper(&fake).acquire_shared(&key).await.unwrap();
    fake.break_lease(&key, &lease_core::BreakNote::new("ops", "test"))
        .await
        .unwrap();
    let mut loss = s.loss_watch();
    tokio::time::timeout(Duration::from_secs(3), loss.wait())
        .await
        .unwrap();
    assert!(!s.may_write());
    // Well within the registration's TTL of 3 s: it was released, not left
    // to expire.
    let x = keeper(&fake)
        .acquire_exclusive(&key)
        .wait(Duration::from_millis(1500))
        .await
        .unwrap();
    x.release().await.unwrap();
    let _ = s.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_holds_a_permit_and_shares_its_fate() {
    let fake = Fake::new();
    let group = keeper(&fake).group();
    let plain = group.acquire("p/g-leader").await.unwrap();
    let permit = group.acquire_permit("p/g", 1).await.unwrap();
    assert!(permit.key().as_str().starts_with("p/g/permit-"));
    let err = keeper(&fake)
        .acquire_permit("p/g", 1)
        .wait(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, AcquireError::Timeout { .. }), "{err:?}");
    // An operator breaks the permit: the group gives up, the leader too.
    fake.break_lease(permit.key(), &lease_core::BreakNote::new("ops", "test"))
        .await
        .unwrap();
    let abandoned = tokio::time::timeout(Duration::from_secs(5), group.abandoned())
        .await
        .unwrap();
    assert_eq!(abandoned.keys(), vec![permit.key()]);
    assert!(!plain.may_write());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_holds_a_shared_lease_as_its_phase_and_registration() {
    let fake = Fake::new();
    let group = keeper(&fake).group();
    let s = group.acquire_shared("rw/g").await.unwrap();
    assert_eq!(s.holder().as_str(), SHARED_HOLDER);
    assert_eq!(group.len(), 2, "the phase and the registration");
    let other = keeper(&fake).acquire_shared("rw/g").await.unwrap();
    assert_eq!(other.fence(), s.fence());
    // Held by the group: an exclusive holder waits.
    let err = keeper(&fake)
        .acquire_exclusive("rw/g")
        .wait(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, AcquireError::Timeout { .. }), "{err:?}");
    // The group keeps it for longer than a TTL.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(s.may_write(), "{:?}", s.loss());
    // A second shared hold of the key by the group is refused.
    let again = group
        .acquire_shared("rw/g")
        .wait(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(again, AcquireError::Held { .. }), "{again:?}");
    // Released: the registration goes too, the phase stays the other's.
    group.release(&s).await.unwrap();
    assert!(group.is_empty());
    assert!(other.may_write());
    other.release().await.unwrap();
    let x = keeper(&fake)
        .acquire_exclusive("rw/g")
        .wait(Duration::from_secs(2))
        .await
        .unwrap();
    x.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_gives_up_when_its_shared_registration_is_lost() {
    let fake = Fake::new();
    let group = keeper(&fake).group();
    let plain = group.acquire("rw/g2-leader").await.unwrap();
    let s = group.acquire_shared("rw/g2").await.unwrap();
    let registration = group
        .leases()
        .into_iter()
        .find(|l| l.key().as_str().starts_with("rw/g2/shared-"))
        .unwrap();
    fake.break_lease(
        registration.key(),
        &lease_core::BreakNote::new("ops", "test"),
    )
    .await
    .unwrap();
    let abandoned = tokio::time::timeout(Duration::from_secs(5), group.abandoned())
        .await
        .unwrap();
    assert_eq!(abandoned.keys(), vec![registration.key()]);
    assert!(!s.may_write());
    assert!(!plain.may_write());
    // The phase was not released for the others: a new shared holder joins
    // the same phase.
    let next = keeper(&fake).acquire_shared("rw/g2").await.unwrap();
    assert_eq!(next.fence(), s.fence());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_groups_shared_registration_ends_its_phase_member() {
    let fake = Fake::new();
    let group = keeper(&fake).group();
    let s = group.acquire_shared("rw/g3").await.unwrap();
    let registration = group
        .leases()
        .into_iter()
        .find(|l| l.key().as_str().starts_with("rw/g3/shared-"))
        .unwrap();
    group.release(&registration).await.unwrap();
    assert!(!s.may_write());
    assert!(!*s.writable().borrow());
    assert!(group.is_empty());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(group.check().is_ok(), "{:?}", group.check());
    let x = keeper(&fake)
        .acquire_exclusive("rw/g3")
        .wait(Duration::from_secs(2))
        .await
        .unwrap();
    x.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_holding_one_key_shared_in_one_group_get_one_hold() {
    let fake = Fake::new();
    let group = keeper(&fake).group();
    let (a, b) = tokio::join!(
        group
            .acquire_shared("rw/g4")
            .wait(Duration::from_secs(1))
            .into_future(),
        group
            .acquire_shared("rw/g4")
            .wait(Duration::from_secs(1))
            .into_future(),
    );
    let (held, refused): (Vec<_>, Vec<_>) = [a, b].into_iter().partition(Result::is_ok);
    assert_eq!(held.len(), 1, "{refused:?}");
    assert_eq!(group.len(), 2, "one phase and one registration");
    let held = held.into_iter().next().unwrap().unwrap();
    group.release(&held).await.unwrap();
    assert!(group.is_empty());
    let x = keeper(&fake)
        .acquire_exclusive("rw/g4")
        .wait(Duration::from_secs(2))
        .await
        .unwrap();
    x.release().await.unwrap();
}
