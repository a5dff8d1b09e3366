//! Every way a lease ends or leaves a group (the scheduler skips a lease
//! once it is stopped), checked on the scheduler's side (no renewal after it left; no lease stuck without
//! renewals while the group holds on) and on the user's (may_write, loss,
//! release, shared phase and registration).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{key, ms};
use lease_core::{
    BoxFuture, Error, Fence, Grant, LeaseBackend, LeaseKey, LeaseLayer, LeaseState, Payload,
    Renewal,
};
use lease_fake::Fake;
use lease_keeper::{GroupLease, Keeper, LeaseGroup, LossReason};
use tokio::time::{sleep, timeout, Instant};

/// The fake, recording every renewal's (key, fence), with switches: renewals
/// of one term (key and fence) fail with a transport error; reads of one key
/// panic.
struct Probe {
    fake: Fake,
    /// Each renewal sent, in order: key, fence and its place in the
    /// sequence [`Probe::mark`] reads (paused time gives a renewal sent
    /// just before a release the same instant as the release's return).
    renewed: Mutex<Vec<(LeaseKey, Fence, u64)>>,
    sent: AtomicU64,
    fail_term: Mutex<Option<(LeaseKey, Fence)>>,
    panic_reads: Mutex<Option<LeaseKey>>,
    reads: AtomicU64,
    armed: AtomicBool,
}

impl Probe {
    fn new(fake: Fake) -> Arc<Self> {
        Arc::new(Probe {
            fake,
            renewed: Mutex::default(),
            sent: AtomicU64::new(0),
            fail_term: Mutex::default(),
            panic_reads: Mutex::default(),
            reads: AtomicU64::new(0),
            armed: AtomicBool::new(false),
        })
    }

    /// The place in the sequence the next renewal sent will take.
    fn mark(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    fn renewals_of(&self, k: &LeaseKey, fence: Fence) -> Vec<u64> {
        self.renewed
            .lock()
            .unwrap()
            .iter()
            .filter(|(kk, f, _)| kk == k && *f == fence)
            .map(|(_, _, t)| *t)
            .collect()
    }
}

impl LeaseLayer for Probe {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            self.renewed.lock().unwrap().push((
                grant.key().clone(),
                grant.fence(),
                self.sent.fetch_add(1, Ordering::SeqCst),
            ));
            let failing = self.fail_term.lock().unwrap().as_ref()
                == Some(&(grant.key().clone(), grant.fence()));
            if failing {
                return Err(Error::Unavailable {
                    detail: "probe: renewal of this term fails".into(),
                    source: None,
                });
            }
            self.fake.renew(grant, payload).await
        })
    }
    fn read<'a>(&'a self, k: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(async move {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let boom = self.armed.load(Ordering::SeqCst)
                && self.panic_reads.lock().unwrap().as_ref() == Some(k);
            if boom {
                panic!("probe: a backend bug in read");
            }
            self.fake.read(k).await
        })
    }
}

/// The TTL of every lease here.
const TTL: Duration = Duration::from_secs(3);

/// A fake behind a [`Probe`], and a group on a keeper over the probe.
fn probed() -> (Fake, Arc<Probe>, LeaseGroup) {
    let fake = Fake::new();
    let probe = Probe::new(fake.clone());
    let group = Keeper::new(probe.clone()).group();
    (fake, probe, group)
}

/// The registration of the shared hold whose phase is `phase`: the
/// group's other member.
fn registration_of(group: &LeaseGroup, phase: &GroupLease) -> GroupLease {
    group
        .leases()
        .into_iter()
        .find(|l| l.key() != phase.key())
        .expect("the registration is a member")
}

/// A renewal refused (`Lost`) whose follow-up read panics: the lease is
/// stopped (no write may start) but its loss reason never arrives. The
/// panic is an unknown outcome like any panic in a renewal: the group must
/// still give that lease up by its deadline, naming it — not drop it from
/// the timetable and keep it as a member that nothing renews, with
/// `check()` Ok and `abandoned()` never resolving.
#[tokio::test(start_paused = true)]
async fn a_lost_renewal_whose_read_panics_still_gives_the_group_up() {
    let (fake, probe, group) = probed();
    let ttl = TTL;
    let fine = group
        .try_acquire(&key("gstop/fine"))
        .ttl(ttl)
        .await
        .unwrap();
    let boom_key = key("gstop/boom");
    let boom = group.try_acquire(&boom_key).ttl(ttl).await.unwrap();
    *probe.panic_reads.lock().unwrap() = Some(boom_key.clone());
    probe.armed.store(true, Ordering::SeqCst);
    // Gone on the backend: its next renewal is refused, and the read that
    // would say why panics.
    assert!(fake.expire(&boom_key));
    let abandoned = timeout(ttl * 2, group.abandoned()).await;
    let state = (
        group.check(),
        group.len(),
        boom.may_write(),
        boom.loss(),
        probe.renewals_of(&boom_key, boom.fence()).len(),
    );
    let abandoned = abandoned.unwrap_or_else(|_| {
        panic!(
            "the group never gave up a lease it no longer renews \
             (check, len, may_write, loss, renewals of it) = {state:?}"
        )
    });
    assert_eq!(abandoned.keys(), vec![boom.key()]);
    assert!(!fine.may_write() && !boom.may_write());
}

/// A key the group held is taken again by the group (the first term was
/// broken or expired on the backend, and an acquire of the group waiting
/// for the key got it): the first term left the group's map. The scheduler
/// must not renew it any more, and it must never give the group up for it.
#[tokio::test(start_paused = true)]
async fn a_term_replaced_in_the_group_is_not_renewed_again() {
    let (fake, probe, group) = probed();
    let ttl = TTL;
    let k = key("gstop/replaced");
    let first = group.try_acquire(&k).ttl(ttl).await.unwrap();
    // Broken behind the group's back; the group takes the key again.
    assert!(fake.expire(&k));
    let second = group.try_acquire(&k).ttl(ttl).await.unwrap();
    assert!(second.fence() > first.fence());
    let joined = probe.mark();
    sleep(ttl * 2).await;
    let late: Vec<_> = probe
        .renewals_of(&k, first.fence())
        .into_iter()
        .filter(|t| *t >= joined)
        .collect();
    assert!(
        late.is_empty(),
        "the first term, no longer a member, was renewed {} times after the second joined",
        late.len()
    );
    group.check().expect("the group holds on");
    assert!(second.may_write());
    assert!(probe.renewals_of(&k, second.fence()).len() >= 2);
    group.release_all().await.unwrap();
}

/// As above, with the first term's renewals failing (transport errors) up
/// to its deadline when the second term joins: the group must not give up,
/// naming the key it still holds and releasing the healthy second term,
/// because of a term that left its map.
#[tokio::test(start_paused = true)]
async fn a_replaced_term_retrying_to_its_deadline_does_not_abandon_the_group() {
    let (fake, probe, group) = probed();
    let ttl = TTL;
    let k = key("gstop/retrying");
    let t0 = Instant::now();
    let first = group.try_acquire(&k).ttl(ttl).await.unwrap();
    let other = group
        .try_acquire(&key("gstop/other"))
        .ttl(ttl)
        .await
        .unwrap();
    *probe.fail_term.lock().unwrap() = Some((k.clone(), first.fence()));
    let deadline = first.deadline();
    // Its last retry is due at its deadline by now.
    tokio::time::sleep_until(deadline - ms(2)).await;
    assert!(deadline > t0);
    group.check().expect("nothing lost yet");
    assert!(fake.expire(&k));
    let second = group.try_acquire(&k).ttl(ttl).await.unwrap();
    sleep(ms(100)).await;
    let check = group.check();
    assert!(
        check.is_ok(),
        "the group gave up for a term that had left it: {check:?} (second may_write {}, loss {:?})",
        second.may_write(),
        second.loss()
    );
    assert!(second.may_write() && other.may_write());
    group.release_all().await.unwrap();
}

/// Releasing a member (alone, all at once, or by dropping the group) stops
/// it and then records `Released`: may_write false, writable() false, loss Released, no LeaseAbandoned, the key free
/// on the backend, and no renewal sent after the release returned.
#[tokio::test(start_paused = true)]
async fn leaving_the_group_is_a_plain_release() {
    let (fake, probe, group) = probed();
    let ttl = TTL;
    let (a, b, c) = (key("gstop/a"), key("gstop/b"), key("gstop/c"));
    let la = group.try_acquire(&a).ttl(ttl).await.unwrap();
    let lb = group.try_acquire(&b).ttl(ttl).await.unwrap();
    let mut wa = la.writable();
    assert!(*wa.borrow_and_update());
    sleep(ms(1200)).await;
    group.release(&la).await.unwrap();
    let released_a = probe.mark();
    assert!(!la.may_write());
    assert!(!*wa.borrow_and_update());
    assert_eq!(la.loss(), Some(LossReason::Released));
    assert!(fake.read(&a).await.unwrap().is_free());
    assert!(lb.may_write());
    // Released again: a no-op.
    group.release(&la).await.unwrap();
    let lc = group.try_acquire(&c).ttl(ttl).await.unwrap();
    group.release_all().await.expect("no abandonment");
    let released_all = probe.mark();
    for l in [&lb, &lc] {
        assert!(!l.may_write());
        assert_eq!(l.loss(), Some(LossReason::Released));
        assert!(fake.read(l.key()).await.unwrap().is_free());
    }
    // Still usable: a lease taken later is renewed.
    let la2 = group.try_acquire(&a).ttl(ttl).await.unwrap();
    sleep(ttl * 2).await;
    group.check().expect("the group holds on");
    assert!(la2.may_write());
    assert!(probe
        .renewals_of(&a, la.fence())
        .iter()
        .all(|t| *t < released_a));
    assert!(probe
        .renewals_of(&b, lb.fence())
        .iter()
        .all(|t| *t < released_all));
    assert!(probe.renewals_of(&c, lc.fence()).is_empty());
    assert!(probe.renewals_of(&a, la2.fence()).len() >= 2);
    drop(group);
    sleep(ms(100)).await;
    assert!(!la2.may_write());
    assert_eq!(la2.loss(), Some(LossReason::Released));
    assert!(fake.read(&a).await.unwrap().is_free());
}

/// A shared hold in a group is two members: releasing the phase's lease
/// takes the registration with it (and the reverse); both stop, the
/// registration is released on the backend, the phase stays with the other
/// holder, and neither is renewed afterwards.
#[tokio::test(start_paused = true)]
async fn releasing_a_shared_hold_stops_phase_and_registration() {
    let fake = Fake::new();
    let probe = Probe::new(fake.clone());
    let backend: Arc<dyn LeaseBackend> = probe.clone();
    let keeper = Keeper::new(backend.clone());
    let other = Keeper::new(backend.clone());
    let ttl = Duration::from_secs(3);
    let k = key("gstop/layout");
    for release_registration in [false, true] {
        let group = keeper.group();
        let phase = group.acquire_shared(&k).ttl(ttl).await.unwrap();
        let theirs = other.acquire_shared(&k).ttl(ttl).await.unwrap();
        assert_eq!(group.len(), 2);
        let registration = registration_of(&group, &phase);
        sleep(ms(1500)).await;
        let target = if release_registration {
            &registration
        } else {
            &phase
        };
        group.release(target).await.unwrap();
        let left = probe.mark();
        let phase_renewals = phase.renewals();
        assert!(group.is_empty(), "both left ({release_registration})");
        for l in [&phase, &registration] {
            assert!(!l.may_write());
            assert_eq!(l.loss(), Some(LossReason::Released));
        }
        assert!(fake.read(registration.key()).await.unwrap().is_free());
        sleep(ttl * 2).await;
        assert!(theirs.may_write(), "the other holder keeps the phase");
        assert!(fake.read(&k).await.unwrap().holding().is_some());
        // The phase's grant is the other holder's too (it renews it): the
        // group's own count of the phase's renewals tells ours.
        assert_eq!(
            phase.renewals(),
            phase_renewals,
            "the phase renewed after it left"
        );
        assert!(
            probe
                .renewals_of(registration.key(), registration.fence())
                .iter()
                .all(|t| *t < left),
            "the registration renewed after it left"
        );
        group.check().expect("no abandonment");
        theirs.release().await.unwrap();
    }
}

/// The group holds `key` shared (phase + registration); the phase is broken
/// behind its back and a plain acquire of the group takes `key` anew. The
/// overwritten phase's registration must leave with it: otherwise it is
/// renewed on and on although its shared hold is gone, and `release` of
/// the (phase) handle the user got from `acquire_shared` finds nothing to
/// do, so it is never released while the group lives.
#[tokio::test(start_paused = true)]
async fn a_phase_replaced_in_the_group_takes_its_registration_with_it() {
    let (fake, probe, group) = probed();
    let ttl = TTL;
    let k = key("gstop/phase-replaced");
    let phase = group.acquire_shared(&k).ttl(ttl).await.unwrap();
    let registration = registration_of(&group, &phase);
    assert_eq!(group.len(), 2);
    // The phase is gone on the backend; the group takes the key again.
    assert!(fake.expire(&k));
    let plain = group.try_acquire(&k).ttl(ttl).await.unwrap();
    assert!(plain.fence() > phase.fence());
    assert!(!phase.may_write());
    // The user gives the shared hold back through the handle it got.
    group.release(&phase).await.unwrap();
    let released = probe.mark();
    sleep(ttl * 2).await;
    let late = probe
        .renewals_of(registration.key(), registration.fence())
        .into_iter()
        .filter(|t| *t >= released)
        .count();
    assert!(
        group.leases().iter().all(|l| l.key() != registration.key()) && late == 0,
        "the replaced phase's registration is still a member ({} members) and was \
         renewed {late} times after its shared hold was released (loss {:?}, may_write {})",
        group.len(),
        registration.loss(),
        registration.may_write()
    );
    assert!(plain.may_write());
    group.release_all().await.unwrap();
}

/// The fake, with the phase's renewals parked on a gate and then panicking,
/// and a release of the registration that opens that gate first.
struct PanicGate {
    fake: Fake,
    phase: Mutex<Option<LeaseKey>>,
    parked: AtomicBool,
    gate: tokio::sync::Notify,
}

impl LeaseLayer for PanicGate {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            if self.phase.lock().unwrap().as_ref() == Some(grant.key()) {
                self.parked.store(true, Ordering::SeqCst);
                self.gate.notified().await;
                panic!("gate: a backend bug in the phase's renewal");
            }
            self.fake.renew(grant, payload).await
        })
    }
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            if self.parked.load(Ordering::SeqCst) {
                // The registration's release: the phase's renewal panics
                // while the phase is out of the group, not yet released.
                self.gate.notify_one();
                sleep(ms(5)).await;
            }
            self.fake.release(grant).await
        })
    }
}

/// A panic in a renewal of a lease that is leaving the group (taken out of
/// its map and stopped, its release not yet recorded) is not a refused
/// renewal whose read panicked. Taking one for the other would mark a lease
/// its holder released `Expired` (an unexpected loss, warned and counted),
/// and for a plain lease on a multi-threaded runtime make `release` see a
/// grant "gone on the backend" and send no release at all.
#[tokio::test(start_paused = true)]
async fn a_panicking_renewal_of_a_leaving_phase_does_not_make_it_lost() {
    let gate = Arc::new(PanicGate {
        fake: Fake::new(),
        phase: Mutex::default(),
        parked: AtomicBool::new(false),
        gate: tokio::sync::Notify::new(),
    });
    let keeper = Keeper::new(gate.clone());
    let group = keeper.group();
    let ttl = Duration::from_secs(3);
    let k = key("gstop/leaving-phase");
    let phase = group.acquire_shared(&k).ttl(ttl).await.unwrap();
    let registration = registration_of(&group, &phase);
    *gate.phase.lock().unwrap() = Some(k.clone());
    let t0 = Instant::now();
    while !gate.parked.load(Ordering::SeqCst) {
        assert!(t0.elapsed() < ttl, "the phase was never renewed");
        sleep(ms(10)).await;
    }
    group.release(&registration).await.unwrap();
    assert_eq!(registration.loss(), Some(LossReason::Released));
    assert_eq!(
        phase.loss(),
        Some(LossReason::Released),
        "the phase its holder released is reported lost"
    );
    group.check().expect("no abandonment");
}
