//! Proof the history checker can fail: hand-made histories, each with one
//! violation, must be reported with that violation's kind; a clean history
//! and the "unknown counts as both" cases must pass.

use std::time::{Duration, Instant};

use lease_conformance::history::{
    check, flagged_ops, CheckOptions, CheckReport, FencedResource, History, Op, OpKind, OpOutcome,
    RealResource, RecordingBackend, ViolationKind, WriteFuture,
};
use lease_core::Fence;

const KEY: &str = "jobs/leader";

/// Builds histories on a millisecond timeline.
struct Timeline {
    t0: Instant,
    history: History,
}

impl Timeline {
    fn new() -> Timeline {
        Timeline {
            t0: Instant::now(),
            history: History::new(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn op(&self, kind: OpKind, holder: &str, from: u64, to: u64, outcome: OpOutcome) -> Op {
        Op::new(kind, holder, KEY, self.at(from), self.at(to), outcome)
    }

    /// A granted acquire (or successful renew) during [from, to], sent at
    /// `from`, writable for `window` ms after that.
    fn grant(&self, kind: OpKind, holder: &str, from: u64, to: u64, fence: u64, window: u64) {
        let op = self
            .op(kind, holder, from, to, OpOutcome::Ok)
            .fence(fence)
            .window(self.at(from), self.at(from + window));
        self.history.push(op);
    }

    fn acquire(&self, holder: &str, from: u64, to: u64, fence: u64) {
        self.grant(OpKind::Acquire, holder, from, to, fence, 200);
    }

    fn renew(&self, holder: &str, from: u64, to: u64, fence: u64) {
        self.grant(OpKind::Renew, holder, from, to, fence, 200);
    }

    fn refused(&self, holder: &str, from: u64, to: u64, by: &str, fence: u64) {
        let op = self
            .op(OpKind::Acquire, holder, from, to, OpOutcome::Refused)
            .observed(by, fence);
        self.history.push(op);
    }

    fn unknown_acquire(&self, holder: &str, from: u64, to: u64) {
        let op = self
            .op(OpKind::Acquire, holder, from, to, OpOutcome::Unknown)
            .detail("response lost");
        self.history.push(op);
    }

    fn release(&self, holder: &str, from: u64, to: u64, fence: u64) {
        let op = self
            .op(OpKind::Release, holder, from, to, OpOutcome::Ok)
            .fence(fence);
        self.history.push(op);
    }

    fn read_free(&self, holder: &str, from: u64, to: u64) {
        self.history
            .push(self.op(OpKind::Read, holder, from, to, OpOutcome::Ok));
    }

    fn check(&self) -> CheckReport {
        check(&self.history.ops(), &CheckOptions::default())
    }
}

fn assert_fails_with(report: &CheckReport, kind: ViolationKind) {
    assert!(
        report.found(kind),
        "expected a {kind:?} violation, got: {:?}",
        report.violations
    );
    // The message names the key and the operations involved.
    let v = report.violations.iter().find(|v| v.kind == kind).unwrap();
    assert_eq!(v.key, KEY);
    assert!(!v.detail.is_empty());
    eprintln!("{v}");
}

#[tokio::test]
async fn a_clean_history_passes() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.refused("b", 10, 12, "a", 1);
    let w = FencedResource::new(t.history.clone());
    w.write_as("a", KEY, Fence(1), t.at(50)).await;
    t.renew("a", 100, 102, 1);
    w.write_as("a", KEY, Fence(1), t.at(150)).await;
    t.release("a", 250, 252, 1);
    t.acquire("b", 260, 262, 2);
    w.write_as("b", KEY, Fence(2), t.at(270)).await;
    t.refused("a", 300, 302, "b", 2);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
    assert_eq!(r.grants, 2);
    assert_eq!(r.writes_accepted, 3);
}

#[test]
fn overlapping_windows_fail() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1); // writable until 200
    t.acquire("b", 100, 102, 2); // granted while a may still write
    assert_fails_with(&t.check(), ViolationKind::Overlap);
}

#[test]
fn a_violation_lists_every_operation_on_its_key_and_the_keys_under_it() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.acquire("b", 100, 102, 2);
    let slot = Op::new(
        OpKind::Acquire,
        "c",
        format!("{KEY}/shared-0"),
        t.at(5),
        t.at(6),
        OpOutcome::Ok,
    )
    .fence(3);
    t.history.push(slot);
    let other = Op::new(
        OpKind::Read,
        "d",
        "jobs/leaderboard",
        t.at(7),
        t.at(8),
        OpOutcome::Ok,
    );
    t.history.push(other);
    let report = t.check();
    let lines = flagged_ops(&t.history.ops(), &report);
    assert_eq!(
        lines[0],
        format!("operations on {KEY:?} and the keys under it:")
    );
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert!(lines[1].contains("by a") && lines[1].contains("[0.0ms, 2.0ms]"));
    assert!(
        lines[1].contains("sent at 0.0ms deadline 200.0ms"),
        "{}",
        lines[1]
    );
    assert!(lines[2].contains("by b") && lines[2].contains("[100.0ms, 102.0ms]"));
    assert!(
        lines[3].contains("shared-0"),
        "a key under it: {}",
        lines[3]
    );
    // A safe history lists nothing.
    let clean = Timeline::new();
    clean.acquire("a", 0, 2, 1);
    assert!(flagged_ops(&clean.history.ops(), &clean.check()).is_empty());
}

#[test]
fn renew_extends_the_window_into_an_overlap() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.acquire("b", 250, 252, 2); // after a's first deadline: fine so far
    t.renew("a", 150, 160, 1); // but a's renewal kept it writable until 350
    assert_fails_with(&t.check(), ViolationKind::Overlap);
}

#[test]
fn another_holder_seen_inside_a_window_fails() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    // c is refused in b's name while a may still write: b holds it too.
    t.refused("c", 50, 52, "b", 2);
    let op = Op::new(
        OpKind::Acquire,
        "b",
        KEY,
        t.at(40),
        t.at(45),
        OpOutcome::Unknown,
    );
    t.history.push(op);
    assert_fails_with(&t.check(), ViolationKind::Overlap);
}

#[test]
fn a_grant_answered_after_its_deadline_opens_no_window() {
    // a's answer arrived after its deadline (a frozen holder): it may not
    // write, so b's grant meanwhile is no overlap...
    let t = Timeline::new();
    t.acquire("b", 0, 2, 2);
    let late = t
        .op(OpKind::Acquire, "a", 0, 300, OpOutcome::Ok)
        .fence(1)
        .window(t.at(1), t.at(200));
    t.history.push(late);
    let r = t.check();
    assert!(!r.found(ViolationKind::Overlap), "{}", r.summary());
    // ...and its grant, though never writable, is one a holder was told
    // of: seeing it is no ghost.
    t.refused("c", 310, 312, "a", 1);
    let r = t.check();
    assert_eq!(r.grants, 2);
    assert!(!r.found(ViolationKind::UnexplainedGrant), "{}", r.summary());
}

#[test]
fn a_renew_answered_lost_ends_the_window() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1); // writable until 200...
    let lost = t.op(OpKind::Renew, "a", 60, 62, OpOutcome::Lost).fence(1);
    t.history.push(lost); // ...but told at 62 it is lost: a stops there.
    t.acquire("b", 100, 102, 2);
    let r = t.check();
    assert!(!r.found(ViolationKind::Overlap), "{}", r.summary());
    // Had b taken it before a learned of the loss, that overlaps.
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.acquire("b", 40, 42, 2);
    let lost = t.op(OpKind::Renew, "a", 60, 62, OpOutcome::Lost).fence(1);
    t.history.push(lost);
    assert_fails_with(&t.check(), ViolationKind::Overlap);
}

#[test]
fn a_key_seen_free_inside_a_window_fails() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.read_free("b", 50, 52);
    assert_fails_with(&t.check(), ViolationKind::EarlyExpiry);
}

#[test]
fn released_key_seen_free_passes() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.release("a", 40, 42, 1);
    t.read_free("b", 50, 52);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
}

/// A release whose outcome is unknown may land at any later instant: the
/// grant its holder then acquires again (the release had not landed yet, so
/// the backend hands the live grant back) may be freed under it, and opens
/// no window — the key seen free, or taken by another holder, after that is
/// no violation. Such re-acquires are counted.
#[test]
fn a_grant_acquired_again_after_an_unknown_release_opens_no_window() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    let release = t
        .op(OpKind::Release, "a", 40, 140, OpOutcome::Unknown)
        .fence(1)
        .detail("timed out");
    t.history.push(release);
    t.acquire("a", 150, 152, 1); // the same grant: the release had not landed
    t.read_free("b", 160, 162); // now it has
    t.acquire("b", 170, 172, 2);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
    assert_eq!(r.reacquired_after_unknown_release, 1);
}

/// A release that failed (a known outcome: nothing changed) leaves the
/// grant live: acquired again, it has its window, and a key seen free in
/// it fails.
#[test]
fn a_grant_acquired_again_after_a_failed_release_keeps_its_window() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    let release = t
        .op(OpKind::Release, "a", 40, 42, OpOutcome::Failed)
        .fence(1)
        .detail("bad input");
    t.history.push(release);
    t.acquire("a", 50, 52, 1);
    t.read_free("b", 60, 62);
    let r = t.check();
    assert_fails_with(&r, ViolationKind::EarlyExpiry);
    assert_eq!(r.reacquired_after_unknown_release, 0);
}

/// An unknown release excuses nothing but its own grant: the holder's next
/// term (a new holder id, a new fence) has its window, and another
/// holder granted inside it overlaps.
#[test]
fn the_term_after_an_unknown_release_overlapping_another_fails() {
    let t = Timeline::new();
    t.acquire("a-t0", 0, 2, 1);
    let release = t
        .op(OpKind::Release, "a-t0", 40, 140, OpOutcome::Unknown)
        .fence(1);
    t.history.push(release);
    t.acquire("a-t1", 150, 152, 2);
    t.acquire("b", 200, 202, 3);
    assert_fails_with(&t.check(), ViolationKind::Overlap);
}

#[test]
fn a_fence_going_backwards_fails() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 5);
    t.release("a", 50, 52, 5);
    t.acquire("b", 200, 202, 3); // lower than a fence already handed out
    assert_fails_with(&t.check(), ViolationKind::FenceRegression);
}

#[test]
fn a_fence_regression_seen_by_a_refusal_fails() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 5);
    t.release("a", 50, 52, 5);
    t.acquire("b", 300, 302, 6);
    t.release("b", 310, 312, 6);
    // The backend then names an old grant: its fence went backwards.
    t.refused("c", 400, 402, "a", 5);
    assert_fails_with(&t.check(), ViolationKind::FenceRegression);
}

#[test]
fn one_fence_for_two_holders_fails() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 2);
    t.release("a", 50, 52, 2);
    t.acquire("b", 300, 302, 2);
    assert_fails_with(&t.check(), ViolationKind::FenceReused);
}

#[test]
fn concurrent_acquires_with_any_fences_pass() {
    // Neither completed before the other started: their order is unknown.
    let t = Timeline::new();
    t.acquire("a", 0, 10, 2);
    t.release("a", 11, 12, 2);
    t.acquire("b", 5, 20, 1);
    t.release("b", 21, 22, 1);
    let r = t.check();
    assert!(!r.found(ViolationKind::FenceRegression), "{}", r.summary());
}

#[test]
fn a_double_grant_after_an_unknown_acquire_fails() {
    let t = Timeline::new();
    // a's first acquire was applied (fence 7) but its answer was lost...
    t.unknown_acquire("a", 0, 5);
    // ...its retry got a second grant instead of the same one...
    t.acquire("a", 10, 12, 8);
    // ...while the first still lived on the backend.
    t.refused("b", 50, 52, "a", 7);
    let r = t.check();
    assert_fails_with(&r, ViolationKind::DoubleGrant);
}

#[test]
fn two_windows_of_one_holder_fail_as_a_double_grant() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.acquire("a", 50, 52, 2);
    assert_fails_with(&t.check(), ViolationKind::DoubleGrant);
}

#[test]
fn an_unknown_acquire_counts_as_applied_and_as_not_applied() {
    // Applied: b is refused in the name of a grant a never heard of.
    let t = Timeline::new();
    t.unknown_acquire("a", 0, 5);
    t.refused("b", 20, 22, "a", 1);
    // The retry gets the same grant back.
    t.acquire("a", 30, 32, 1);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
    assert_eq!(r.unknown, 1);
    assert_eq!((r.retried_unknown_acquires, r.retries_granted), (1, 1));

    // Not applied: the retry gets a fresh grant, and nothing else is seen.
    let t = Timeline::new();
    t.unknown_acquire("a", 0, 5);
    t.acquire("a", 30, 32, 1);
    t.refused("b", 40, 42, "a", 1);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());

    // Not applied, and another holder won meanwhile: a clean refusal.
    let t = Timeline::new();
    t.unknown_acquire("a", 0, 5);
    t.acquire("b", 6, 8, 1);
    t.refused("a", 30, 32, "b", 1);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
}

#[test]
fn an_old_unknown_acquire_does_not_make_a_later_ghost_a_double_grant() {
    let t = Timeline::new();
    // First round: unknown, not applied; the retry gets fence 1; released.
    t.unknown_acquire("a", 0, 5);
    t.acquire("a", 10, 12, 1);
    t.release("a", 50, 52, 1);
    // Second round: unknown, applied as fence 2 (a never learns of it), seen by b.
    t.unknown_acquire("a", 100, 105);
    t.refused("b", 110, 112, "a", 2);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
}

#[test]
fn a_grant_nobody_asked_for_fails() {
    let t = Timeline::new();
    t.refused("b", 20, 22, "ghost", 4);
    assert_fails_with(&t.check(), ViolationKind::UnexplainedGrant);
}

#[test]
fn a_retry_refused_by_its_own_grant_fails() {
    let t = Timeline::new();
    t.unknown_acquire("a", 0, 5);
    t.refused("a", 10, 12, "a", 3);
    assert_fails_with(&t.check(), ViolationKind::RefusedBySelf);
}

#[test]
fn sent_at_after_the_answer_fails() {
    let t = Timeline::new();
    let op = t
        .op(OpKind::Acquire, "a", 10, 12, OpOutcome::Ok)
        .fence(1)
        .window(t.at(15), t.at(215));
    t.history.push(op);
    assert_fails_with(&t.check(), ViolationKind::SentAtAfterAnswer);
}

/// A grant resting on a request sent before its call (a key bound to a
/// shared etcd session lease last kept alive earlier) counts from that send:
/// a shorter window, which is allowed.
#[test]
fn sent_at_before_the_call_passes() {
    let t = Timeline::new();
    let op = t
        .op(OpKind::Acquire, "a", 10, 12, OpOutcome::Ok)
        .fence(1)
        .window(t.at(5), t.at(205));
    t.history.push(op);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
}

#[tokio::test]
async fn an_unfenced_resource_accepting_a_stale_write_fails() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.release("a", 90, 92, 1);
    t.acquire("b", 100, 102, 2);
    let plain = FencedResource::unfenced(t.history.clone());
    plain.write_as("b", KEY, Fence(2), t.at(110)).await;
    // a checked may_write() at 50, froze, and its write lands now.
    assert!(plain.write_as("a", KEY, Fence(1), t.at(50)).await);
    assert_fails_with(&t.check(), ViolationKind::StaleWriteAccepted);
}

/// A real resource that accepts every write, as one that forgot its check.
#[derive(Debug)]
struct AcceptsAll;

impl RealResource for AcceptsAll {
    fn write<'a>(&'a self, _: &'a str, _: &'a str, _: Fence) -> WriteFuture<'a> {
        Box::pin(async { Ok(true) })
    }
}

/// A real resource that checks with lease-fence's rule.
#[derive(Debug, Default)]
struct Checks(lease_fence::Fences);

impl RealResource for Checks {
    fn write<'a>(&'a self, key: &'a str, _: &'a str, fence: Fence) -> WriteFuture<'a> {
        Box::pin(async move { Ok(self.0.check(key, fence).is_ok()) })
    }
}

#[tokio::test]
async fn a_real_resource_is_judged_by_what_it_accepted() {
    for (resource, safe) in [
        (
            std::sync::Arc::new(AcceptsAll) as std::sync::Arc<dyn RealResource>,
            false,
        ),
        (std::sync::Arc::new(Checks::default()), true),
    ] {
        let t = Timeline::new();
        t.acquire("a", 0, 2, 1);
        t.release("a", 90, 92, 1);
        t.acquire("b", 100, 102, 2);
        let real = FencedResource::real(t.history.clone(), resource.clone());
        assert!(real.write_as("b", KEY, Fence(2), t.at(110)).await);
        assert_eq!(
            real.write_as("a", KEY, Fence(1), t.at(50)).await,
            !safe,
            "{resource:?}"
        );
        if safe {
            let r = t.check();
            assert!(r.is_safe(), "{}", r.summary());
            assert_eq!((r.writes_accepted, r.writes_rejected), (1, 1));
        } else {
            assert_fails_with(&t.check(), ViolationKind::StaleWriteAccepted);
        }
    }
}

#[tokio::test]
async fn a_fenced_resource_rejects_the_stale_write() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.release("a", 90, 92, 1);
    t.acquire("b", 100, 102, 2);
    let fenced = FencedResource::new(t.history.clone());
    assert!(fenced.write_as("b", KEY, Fence(2), t.at(110)).await);
    assert!(!fenced.write_as("a", KEY, Fence(1), t.at(50)).await);
    assert_eq!(fenced.rejected(), 1);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
    assert_eq!((r.writes_accepted, r.writes_rejected), (1, 1));
}

#[test]
fn overlaps_are_counted_not_failed_when_clock_jumps_allow_them() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.acquire("b", 100, 102, 2);
    let opts = CheckOptions {
        exclusive_windows: false,
        ..CheckOptions::default()
    };
    let r = check(&t.history.ops(), &opts);
    assert!(r.is_safe(), "{}", r.summary());
    assert_eq!(r.tolerated_overlaps, 1);
}

/// A forward clock jump ends a grant under its holder's feet; when that
/// holder's name is shared across terms (a shared phase's), the next term's
/// grant is seen inside the old term's window. With jumps allowed that is a
/// tolerated overlap like any other, and without them still two grants.
#[test]
fn a_holders_next_grant_seen_inside_its_last_window_is_tolerated_only_when_clock_jumps_allow_it() {
    let t = Timeline::new();
    t.acquire("(shared)", 0, 2, 1);
    t.acquire("(shared)", 100, 102, 2);
    t.refused("c", 110, 112, "(shared)", 2);
    let opts = CheckOptions {
        exclusive_windows: false,
        ..CheckOptions::default()
    };
    let r = check(&t.history.ops(), &opts);
    assert!(r.is_safe(), "{}", r.summary());
    assert_eq!(r.tolerated_overlaps, 2, "{}", r.summary());
    assert_fails_with(&t.check(), ViolationKind::DoubleGrant);
}

/// A term's holder name is its own: no clock jump can give it a second
/// grant, so one seen (or renewed into) inside its window stays a violation
/// even where jumps excuse other overlaps.
#[test]
fn one_terms_second_grant_fails_even_when_clock_jumps_allow_overlaps() {
    let jumps = CheckOptions {
        exclusive_windows: false,
        ..CheckOptions::default()
    };
    // A renewal that came back with another fence, seen by another holder.
    let t = Timeline::new();
    t.acquire("c1-t0", 0, 2, 1);
    t.renew("c1-t0", 50, 52, 3);
    t.refused("b", 100, 102, "c1-t0", 3);
    assert_fails_with(&check(&t.history.ops(), &jumps), ViolationKind::DoubleGrant);
    // An acquire with unknown outcome landing beside its retry's grant.
    let t = Timeline::new();
    t.unknown_acquire("c1-t0", 0, 300);
    t.acquire("c1-t0", 10, 12, 1);
    t.refused("b", 100, 102, "c1-t0", 2);
    assert_fails_with(&check(&t.history.ops(), &jumps), ViolationKind::DoubleGrant);
}

/// The shared phases' acquire with unknown outcome may land after a jump
/// ended the phase another reader was told of, and start the next phase:
/// under jumps, counted like any overlap.
#[test]
fn a_late_shared_acquire_after_a_jump_is_tolerated_only_when_clock_jumps_allow_it() {
    let t = Timeline::new();
    t.unknown_acquire("(shared)", 0, 300);
    t.acquire("(shared)", 10, 12, 1);
    t.refused("c", 100, 102, "(shared)", 2);
    let jumps = CheckOptions {
        exclusive_windows: false,
        ..CheckOptions::default()
    };
    let r = check(&t.history.ops(), &jumps);
    assert!(r.is_safe(), "{}", r.summary());
    assert!(r.tolerated_overlaps >= 1, "{}", r.summary());
    assert_fails_with(&t.check(), ViolationKind::DoubleGrant);
}

/// A renewal answered after its holder's deadline leaves a gap where the
/// holder could not write: the key seen free there is no early expiry (a
/// renewal that reached the server late may revive an expired grant), but
/// seen free once the answer reopened the window, it still is.
#[test]
fn a_renewal_answered_after_the_deadline_leaves_a_gap_in_the_window() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.renew("a", 150, 260, 1);
    t.read_free("b", 220, 230);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
    t.read_free("b", 270, 280);
    assert_fails_with(&t.check(), ViolationKind::EarlyExpiry);
}

/// The gap a late renewal leaves excuses only a key seen *free*. A renewal
/// of fence 1 that succeeds after fence 2 was granted is a contract breach
/// wherever it took effect: before b's grant, a's grant was live over b's;
/// after it, a grant older than b's was renewed (a falling fence). Both
/// histories stay overlaps.
#[test]
fn another_holders_term_inside_the_gap_of_a_late_renewal_still_fails() {
    // b takes the key and leaves it inside a's gap.
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1); // writable until 200
    t.renew("a", 150, 345, 1); // sent at 150 (writable until 350), answered at 345
    t.acquire("b", 305, 307, 2);
    t.release("b", 320, 322, 2);
    let r = t.check();
    assert!(
        !r.is_safe(),
        "fence 1 renewed after fence 2 was granted passed unflagged"
    );
    // b's grant (its answer lost) seen by c inside a's gap.
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.renew("a", 150, 345, 1);
    t.unknown_acquire("b", 300, 400);
    t.refused("c", 310, 312, "b", 2);
    let r = t.check();
    assert!(
        !r.is_safe(),
        "b seen holding fence 2 before a's renewal of fence 1 succeeded passed unflagged"
    );
}

/// A keeper accepts a renewal whose answer is ready when its task runs,
/// even a little after the deadline (`timeout_at` polls the call before its
/// timer), and its work runs on under the re-armed timer. Outside its
/// windows only for the gap (1 ms, well within the work slack), the work
/// stays within its grant's window.
#[test]
fn work_across_a_renewal_answered_just_after_the_deadline_stays_within_its_windows() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1); // writable until 200
    t.renew("a", 100, 201, 1); // answered 1 ms after that: writable until 300
    t.renew("a", 250, 252, 1); // until 450
    t.renew("a", 400, 402, 1); // until 600
    t.history
        .push(t.op(OpKind::Work, "a", 50, 560, OpOutcome::Ok).fence(1));
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
}

#[test]
fn each_history_records_the_real_backend_calls() {
    // The recording helpers on a real (fake) backend: instants, outcomes, fences.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use lease_core::{AcquireRequest, HolderId, LeaseKey};
        let fake = lease_fake::Fake::new();
        let h = History::new();
        let key = LeaseKey::new(KEY).unwrap();
        let (a, b) = (HolderId::new("a").unwrap(), HolderId::new("b").unwrap());
        let ttl = Duration::from_secs(1);
        let to = Duration::from_secs(1);
        let g = h
            .acquire(&fake, AcquireRequest::new(key.clone(), a).ttl(ttl), to)
            .await
            .unwrap()
            .granted()
            .unwrap();
        h.acquire(&fake, AcquireRequest::new(key.clone(), b).ttl(ttl), to)
            .await
            .unwrap();
        fake.lose_next_responses(1);
        assert!(h.renew(&fake, &g, to).await.is_err());
        h.release(&fake, &g, to).await.unwrap();
        h.read(&fake, "observer", &key, to).await.unwrap();
        let ops = h.ops();
        let kinds: Vec<_> = ops.iter().map(|o| (o.kind, o.outcome)).collect();
        assert_eq!(
            kinds,
            vec![
                (OpKind::Acquire, OpOutcome::Ok),
                (OpKind::Acquire, OpOutcome::Refused),
                (OpKind::Renew, OpOutcome::Unknown),
                (OpKind::Release, OpOutcome::Ok),
                (OpKind::Read, OpOutcome::Ok),
            ]
        );
        assert_eq!(ops[0].fence, Some(g.fence()));
        assert_eq!(ops[0].deadline, Some(g.deadline()));
        assert_eq!(ops[1].observed, Some(("a".to_string(), g.fence())));
        assert!(ops.iter().all(|o| o.invoked <= o.completed));
        let r = check(&ops, &CheckOptions::default());
        assert!(r.is_safe(), "{}", r.summary());
    });
}

/// A call its caller dropped before the answer (a resigning keeper's
/// renewal) is judged as an unknown outcome but counted apart from the
/// unknown outcomes a backend made, so a run without faults can still
/// require none of the latter.
#[tokio::test]
async fn calls_dropped_by_their_caller_are_counted_apart() {
    let t = Timeline::new();
    t.acquire("a", 0, 2, 1);
    t.unknown_acquire("b", 10, 12);
    let fake = lease_fake::Fake::new();
    fake.set_latency(Duration::from_secs(5));
    let backend = RecordingBackend::new(
        std::sync::Arc::new(fake),
        t.history.clone(),
        Duration::from_secs(10),
    );
    let key = lease_core::LeaseKey::new(KEY).unwrap();
    let req = lease_core::AcquireRequest::new(key, lease_core::HolderId::random());
    // The caller gives up long before the slow answer.
    let call = lease_core::LeaseBackend::try_acquire(&backend, req);
    assert!(tokio::time::timeout(Duration::from_millis(20), call)
        .await
        .is_err());
    let r = t.check();
    assert_eq!((r.unknown, r.dropped), (1, 1), "{}", r.summary());
    assert!(r.is_safe(), "{}", r.summary());
}

#[test]
fn a_backends_placeholder_holder_is_no_grant_but_keeps_the_fence_order() {
    // S3 names `<record-missing>` with the highest fence it knows while a
    // key's record is missing but the key is not yet provably free: not a
    // grant of anyone, and the fence a real grant had.
    let t = Timeline::new();
    t.acquire("a", 0, 2, 5);
    t.release("a", 100, 102, 5);
    t.refused("b", 110, 112, "<record-missing>", 5);
    t.acquire("b", 400, 402, 6);
    let r = t.check();
    assert!(r.is_safe(), "{}", r.summary());
    // A holder's own id is held to the rules of grants all the same.
    t.refused("c", 500, 502, "ghost", 6);
    assert_fails_with(&t.check(), ViolationKind::FenceReused);
    // A holder whose own id looks like a placeholder is a holder all the
    // same: one fence granted to it and to another is caught.
    let t = Timeline::new();
    t.acquire("<a>", 0, 2, 5);
    t.release("<a>", 100, 102, 5);
    t.acquire("b", 200, 202, 5);
    assert_fails_with(&t.check(), ViolationKind::FenceReused);
    // And a placeholder to the fence order.
    let t = Timeline::new();
    t.acquire("a", 0, 2, 5);
    t.refused("b", 110, 112, "<record-missing>", 4);
    assert_fails_with(&t.check(), ViolationKind::FenceRegression);
}
