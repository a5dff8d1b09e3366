//! Renewal schedules and jitter bounds, exact on tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{key, ms, Rec};
use lease_core::{LeaseBackend, Timing};
use lease_fake::Fake;
use lease_keeper::{Keeper, LossReason, GROUP_REFRESH_MAX, GROUP_REFRESH_MIN};
use tokio::time::{sleep, Instant};

/// Tokio's timer rounds sleeps up to the next millisecond.
const TICK: Duration = Duration::from_millis(1);

fn intervals(times: &[Instant]) -> Vec<Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn single_lease_renews_within_the_timing_jitter_bounds() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let ttl = Duration::from_secs(3);
    let k = key("sched/single");
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    let acquired = Instant::now();
    sleep(ttl * 200).await;
    assert!(lease.may_write(), "lost: {:?}", lease.loss());
    let times = rec.renew_times(&k);
    assert!(
        times.len() >= 500,
        "only {} renewals in 200 TTLs",
        times.len()
    );

    let t = Timing::default();
    let lo = t.renew_interval(ttl).mul_f64(1.0 - t.jitter());
    let hi = t.renew_interval(ttl).mul_f64(1.0 + t.jitter());
    let mut all = vec![times[0] - acquired];
    all.extend(intervals(&times));
    for (i, d) in all.iter().enumerate() {
        assert!(
            *d >= lo && *d <= hi + TICK,
            "interval {i} is {d:?}, outside [{lo:?}, {hi:?}]"
        );
    }
    // The jitter is really applied: the intervals spread over the window.
    let (min, max) = (all.iter().min().unwrap(), all.iter().max().unwrap());
    let width = hi - lo;
    assert!(
        *min < lo + width / 10 && *max > hi - width / 10,
        "intervals only span {min:?}..{max:?}"
    );
    // The deadline counts from the last renewal's send instant.
    assert_eq!(
        lease.deadline(),
        *times.last().unwrap() + ttl.mul_f64(t.deadline_fraction())
    );
    assert_eq!(lease.renewals(), times.len() as u64);
}

#[tokio::test(start_paused = true)]
async fn custom_timing_is_followed() {
    let rec = Rec::new(Fake::new());
    let timing = Timing::new(0.5, 0.2, 0.25).unwrap();
    let keeper = Keeper::new(rec.clone()).with_timing(timing);
    let ttl = Duration::from_secs(10);
    let k = key("sched/custom");
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    assert_eq!(lease.grant().timing(), timing);
    sleep(ttl * 50).await;
    let all = intervals(&rec.renew_times(&k));
    assert!(all.len() > 200);
    for d in all {
        assert!(
            d >= ms(1500) && d <= ms(2500) + TICK,
            "interval {d:?} outside [1.5 s, 2.5 s]"
        );
    }
    assert!(lease.may_write());
}

#[tokio::test(start_paused = true)]
async fn group_refreshes_between_0_3_and_0_55_ttl_after_the_last_refresh() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let group = keeper.group();
    let ttl = Duration::from_secs(4);
    let keys: Vec<_> = (0..20).map(|i| key(&format!("sched/group/{i}"))).collect();
    let mut starts = vec![];
    for k in &keys {
        let _ = group.try_acquire(k).ttl(ttl).await.unwrap();
        starts.push(Instant::now());
    }
    sleep(ttl * 100).await;
    group.check().unwrap();
    let lo = ttl.mul_f64(GROUP_REFRESH_MIN);
    let hi = ttl.mul_f64(GROUP_REFRESH_MAX);
    let (mut min, mut max) = (Duration::MAX, Duration::ZERO);
    for (k, start) in keys.iter().zip(starts) {
        let times = rec.renew_times(k);
        assert!(
            times.len() >= 180,
            "{k}: only {} refreshes in 100 TTLs",
            times.len()
        );
        let mut all = vec![times[0] - start];
        all.extend(intervals(&times));
        for (i, d) in all.iter().enumerate() {
            assert!(
                *d >= lo && *d <= hi + TICK,
                "{k}: refresh {i} after {d:?}, outside [{lo:?}, {hi:?}]"
            );
            min = min.min(*d);
            max = max.max(*d);
        }
        let l = group.get(k).unwrap();
        assert!(l.may_write());
        assert_eq!(l.refreshed_at(), *times.last().unwrap());
    }
    let width = hi - lo;
    assert!(
        min < lo + width / 20 && max > hi - width / 20,
        "refreshes only span {min:?}..{max:?}"
    );
}

/// A group's refreshes due close together start together (one wake-up of
/// the scheduler for many), each still within its own refresh window.
#[tokio::test(start_paused = true)]
async fn a_groups_refreshes_due_together_start_together() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let group = keeper.group();
    let ttl = Duration::from_secs(4);
    let keys: Vec<_> = (0..400).map(|i| key(&format!("sched/batch/{i}"))).collect();
    let start = Instant::now();
    for k in &keys {
        let _ = group.try_acquire(k).ttl(ttl).await.unwrap();
    }
    assert_eq!(
        Instant::now(),
        start,
        "acquires took time on the paused clock"
    );
    sleep(ttl.mul_f64(GROUP_REFRESH_MAX) + ms(50)).await;
    group.check().unwrap();
    let lo = ttl.mul_f64(GROUP_REFRESH_MIN);
    let hi = ttl.mul_f64(GROUP_REFRESH_MAX);
    let mut firsts: Vec<Instant> = keys
        .iter()
        .map(|k| *rec.renew_times(k).first().expect("refreshed once"))
        .collect();
    for t in &firsts {
        let after = *t - start;
        assert!(
            after >= lo && after <= hi + TICK,
            "refreshed after {after:?}"
        );
    }
    firsts.sort();
    firsts.dedup();
    // 400 refreshes drawn over a 1 s window: one wake-up each would be
    // about 330 distinct millisecond instants; 10 ms batches are at most
    // about 100, and the ones due at the window's very start wait for it.
    assert!(
        firsts.len() <= 130,
        "{} distinct start instants for {} refreshes",
        firsts.len(),
        keys.len()
    );
}

#[tokio::test(start_paused = true)]
async fn unanswered_renewals_end_writes_exactly_at_the_deadline() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let ttl = Duration::from_secs(3);
    let k = key("sched/hang");
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    sleep(ttl * 3).await;
    rec.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let deadline = lease.deadline();
    let last = *rec
        .renew_times(&k)
        .iter()
        .rev()
        .find(|t| **t < deadline - ttl / 2)
        .unwrap();
    assert_eq!(deadline, last + ttl * 2 / 3);
    tokio::time::sleep_until(deadline - TICK).await;
    assert!(
        lease.may_write(),
        "may_write turned false before the deadline"
    );
    assert_eq!(lease.loss(), None);
    let reason = lease.lost().await;
    assert_eq!(reason, LossReason::DeadlinePassed);
    assert!(
        Instant::now() <= deadline + TICK,
        "loss noticed {:?} after the deadline",
        Instant::now() - deadline
    );
    assert!(!lease.may_write());
    // A renewal was attempted (and hung) in between.
    assert!(rec.renew_times(&k).iter().any(|t| *t > last));
}

#[tokio::test(start_paused = true)]
async fn failed_renewals_are_retried_before_the_deadline() {
    let fake = Fake::new();
    let rec = Rec::new(fake.clone());
    let keeper = Keeper::new(rec.clone());
    let ttl = Duration::from_secs(3);
    let k = key("sched/retry");
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    for _ in 0..10 {
        sleep(ttl).await;
        fake.fail_next(3);
    }
    sleep(ttl).await;
    assert!(
        lease.may_write(),
        "lost after transient failures: {:?}",
        lease.loss()
    );
    // And a backend that only fails loses it at the deadline.
    fake.fail_next(u32::MAX);
    assert_eq!(lease.lost().await, LossReason::DeadlinePassed);
    fake.fail_next(0);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_answered_lost_names_the_new_holder() {
    let fake = Fake::new();
    let rec = Rec::new(fake.clone());
    let keeper = Keeper::new(rec.clone());
    let ttl = Duration::from_secs(3);
    let k = key("sched/taken");
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    assert!(fake.expire(&k));
    let thief = Keeper::new(Arc::new(fake.clone()));
    let stolen = thief.try_acquire(&k).ttl(ttl).await.unwrap();
    let reason = lease.lost().await;
    assert_eq!(
        reason,
        LossReason::TakenOver {
            by: stolen.holder().clone(),
            fence: stolen.fence()
        }
    );
    assert!(!lease.may_write());
    assert!(stolen.fence() > lease.fence());
    // Releasing the lost lease leaves the thief alone.
    lease.release().await.unwrap();
    assert!(stolen.may_write());
    let held = fake.read(&k).await.unwrap();
    assert_eq!(held.holding().map(|h| h.fence), Some(stolen.fence()));

    let k2 = key("sched/expired");
    let lease = keeper.try_acquire(&k2).ttl(ttl).await.unwrap();
    assert!(fake.expire(&k2));
    assert_eq!(lease.lost().await, LossReason::Expired);
}

#[tokio::test(start_paused = true)]
async fn a_refused_renewal_stops_writes_before_the_loss_is_classified() {
    let fake = Fake::new();
    let rec = Rec::new(fake.clone());
    rec.hang_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let keeper = Keeper::new(rec.clone());
    let ttl = Duration::from_secs(3);
    let k = key("sched/stop-first");
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    assert!(fake.expire(&k));
    // The next renewal is refused; the read that would say why never answers.
    let refused = *rec.renew_times(&k).last().unwrap_or(&Instant::now());
    while rec.reads.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        sleep(ms(10)).await;
    }
    assert!(Instant::now() < refused + ttl);
    assert!(
        !lease.may_write(),
        "may_write() stayed true after a refused renewal"
    );
    // The classification gives up after a TTL: the loss is reported as an expiry.
    assert_eq!(lease.lost().await, LossReason::Expired);
}

/// `writable()` turns false exactly at the deadline when renewals go
/// unanswered, and agrees with `may_write()` and the grant's deadline
/// throughout.
#[tokio::test(start_paused = true)]
async fn writable_turns_false_at_the_deadline_of_unanswered_renewals() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone());
    let ttl = Duration::from_secs(3);
    let k = key("sched/writable-deadline");
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    let mut writable = lease.writable();
    assert!(*writable.borrow_and_update());
    rec.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let deadline = lease.deadline();
    assert_eq!(deadline.into_std(), lease.grant().deadline());
    writable.changed().await.unwrap();
    assert!(!*writable.borrow_and_update());
    assert_eq!(
        Instant::now(),
        deadline,
        "writable turned false off the deadline"
    );
    assert!(!lease.may_write());
    // …and stays false.
    sleep(ttl).await;
    assert!(!*writable.borrow());
    assert!(!writable.has_changed().unwrap_or(false));
}

/// `writable()` turns false on loss, for a lease and for a group's lease,
/// and a receiver taken after the fact starts false.
#[tokio::test(start_paused = true)]
async fn writable_turns_false_on_loss() {
    let fake = Fake::new();
    let rec = Rec::new(fake.clone());
    let keeper = Keeper::new(rec.clone());
    let ttl = Duration::from_secs(3);
    let k = key("sched/writable-loss");
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    let mut writable = lease.writable();
    sleep(ttl).await;
    assert!(
        *writable.borrow_and_update(),
        "renewed leases stay writable"
    );
    fake.expire(&k);
    writable.changed().await.unwrap();
    assert!(!*writable.borrow());
    assert_eq!(lease.lost().await, LossReason::Expired);
    assert!(!*lease.writable().borrow());

    let group = keeper.group();
    let g = key("sched/writable-group");
    let member = group.try_acquire(&g).ttl(ttl).await.unwrap();
    let mut writable = member.writable();
    sleep(ttl).await;
    assert!(*writable.borrow_and_update());
    fake.expire(&g);
    writable.changed().await.unwrap();
    assert!(!*writable.borrow());
    assert!(!member.may_write());
}
