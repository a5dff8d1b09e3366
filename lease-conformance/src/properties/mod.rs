//! The contract as properties: plain async functions over a [`Harness`].
//!
//! Each property returns a [`Verdict`]; [`ALL`] lists them for
//! [`conformance_tests!`](crate::conformance_tests) and for the meta-tests
//! that prove each can fail.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, Capabilities, Grant, HolderId, LeaseBackend, LeaseKey, Payload,
    TimeAuthority,
};

use crate::{Failure, Harness, Verdict};

mod admin;
mod cancel;
mod election;
mod exclusion;
mod expiry;
mod fencing;
mod input;
mod keeper;
mod model;
mod outside;
mod release;
mod renew;
mod shared;
mod terms;
mod timing;
mod watch;

pub use admin::break_frees_the_key_and_keeps_fences_rising;
pub use cancel::cancelled_operations_leave_the_contract_intact;
pub use election::{
    election_has_one_leader_at_a_time, observers_see_every_change_in_order,
    resign_wakes_the_next_candidate, resigned_leaders_late_proclaim_is_refused,
    run_while_leader_stops_by_the_deadline,
};
pub use exclusion::{exactly_one_winner, refused_acquire_names_the_holder};
pub use expiry::{
    after_expiry_another_holder_acquires,
    an_abandoned_grant_expires_while_its_client_renews_another, renew_after_takeover_is_lost,
};
pub use fencing::{
    fences_increase, reacquire_extends_the_lease, reacquire_returns_same_fence,
    reacquire_with_a_shorter_ttl_keeps_the_term, renewing_an_earlier_grant_keeps_the_longer_term,
};
pub use input::{
    bad_input_changes_nothing, corrupt_record_is_an_error, ttl_follows_the_capability,
};
pub use keeper::{
    group_abandons_all_when_one_lease_is_lost, keeper_keeps_a_lease_for_many_ttls,
    keeper_reports_a_break_as_broken, keeper_self_fences_when_the_backend_is_unreachable,
    waiting_acquirer_gets_a_released_key, waiting_acquirer_gets_an_expired_key, Unreachable,
};
pub use model::model_interleavings;
pub use outside::outside_delete_keeps_fences_rising;
pub use release::{
    read_changes_nothing, release_frees_the_key, release_of_lost_grant_leaves_new_holder,
};
pub use renew::payload_round_trips_and_is_replaced_on_renew;
pub use shared::{
    a_shared_phase_lives_as_long_as_its_longest_holder, an_exclusive_waiter_is_not_starved,
    fences_rise_across_shared_and_exclusive_phases, permits_never_exceed_their_number,
    shared_and_exclusive_never_overlap,
};
pub use terms::{
    a_new_term_never_overlaps_the_last, two_tasks_on_one_keeper_never_both_hold_a_key, LateRelease,
    SlowRelease,
};
pub use timing::deadline_counts_from_the_send_instant;
pub use watch::a_watch_wakes_on_a_payload_change;

/// The future a property returns. Not `Send`: the runner drives it with
/// `block_on`, and the model property holds a proptest runner across awaits.
pub type PropFuture<'a> = Pin<Box<dyn Future<Output = Verdict> + 'a>>;

/// A property: a function of a harness.
pub type Property = for<'a> fn(&'a dyn Harness) -> PropFuture<'a>;

/// Every property, by name, in the order reports list them.
pub const ALL: &[(&str, Property)] = &[
    ("exactly_one_winner", exactly_one_winner),
    (
        "refused_acquire_names_the_holder",
        refused_acquire_names_the_holder,
    ),
    ("fences_increase", fences_increase),
    ("reacquire_returns_same_fence", reacquire_returns_same_fence),
    ("reacquire_extends_the_lease", reacquire_extends_the_lease),
    (
        "reacquire_with_a_shorter_ttl_keeps_the_term",
        reacquire_with_a_shorter_ttl_keeps_the_term,
    ),
    (
        "renewing_an_earlier_grant_keeps_the_longer_term",
        renewing_an_earlier_grant_keeps_the_longer_term,
    ),
    ("renew_after_takeover_is_lost", renew_after_takeover_is_lost),
    (
        "after_expiry_another_holder_acquires",
        after_expiry_another_holder_acquires,
    ),
    (
        "an_abandoned_grant_expires_while_its_client_renews_another",
        an_abandoned_grant_expires_while_its_client_renews_another,
    ),
    ("release_frees_the_key", release_frees_the_key),
    (
        "release_of_lost_grant_leaves_new_holder",
        release_of_lost_grant_leaves_new_holder,
    ),
    ("read_changes_nothing", read_changes_nothing),
    (
        "payload_round_trips_and_is_replaced_on_renew",
        payload_round_trips_and_is_replaced_on_renew,
    ),
    ("bad_input_changes_nothing", bad_input_changes_nothing),
    ("corrupt_record_is_an_error", corrupt_record_is_an_error),
    ("ttl_follows_the_capability", ttl_follows_the_capability),
    (
        "deadline_counts_from_the_send_instant",
        deadline_counts_from_the_send_instant,
    ),
    ("model_interleavings", model_interleavings),
    (
        "keeper_keeps_a_lease_for_many_ttls",
        keeper_keeps_a_lease_for_many_ttls,
    ),
    (
        "keeper_self_fences_when_the_backend_is_unreachable",
        keeper_self_fences_when_the_backend_is_unreachable,
    ),
    (
        "waiting_acquirer_gets_a_released_key",
        waiting_acquirer_gets_a_released_key,
    ),
    (
        "waiting_acquirer_gets_an_expired_key",
        waiting_acquirer_gets_an_expired_key,
    ),
    (
        "group_abandons_all_when_one_lease_is_lost",
        group_abandons_all_when_one_lease_is_lost,
    ),
    (
        "break_frees_the_key_and_keeps_fences_rising",
        break_frees_the_key_and_keeps_fences_rising,
    ),
    (
        "keeper_reports_a_break_as_broken",
        keeper_reports_a_break_as_broken,
    ),
    (
        "outside_delete_keeps_fences_rising",
        outside_delete_keeps_fences_rising,
    ),
    (
        "cancelled_operations_leave_the_contract_intact",
        cancelled_operations_leave_the_contract_intact,
    ),
    (
        "election_has_one_leader_at_a_time",
        election_has_one_leader_at_a_time,
    ),
    (
        "observers_see_every_change_in_order",
        observers_see_every_change_in_order,
    ),
    (
        "run_while_leader_stops_by_the_deadline",
        run_while_leader_stops_by_the_deadline,
    ),
    (
        "resigned_leaders_late_proclaim_is_refused",
        resigned_leaders_late_proclaim_is_refused,
    ),
    (
        "resign_wakes_the_next_candidate",
        resign_wakes_the_next_candidate,
    ),
    (
        "a_watch_wakes_on_a_payload_change",
        a_watch_wakes_on_a_payload_change,
    ),
    (
        "a_new_term_never_overlaps_the_last",
        a_new_term_never_overlaps_the_last,
    ),
    (
        "two_tasks_on_one_keeper_never_both_hold_a_key",
        two_tasks_on_one_keeper_never_both_hold_a_key,
    ),
    (
        "shared_and_exclusive_never_overlap",
        shared_and_exclusive_never_overlap,
    ),
    (
        "permits_never_exceed_their_number",
        permits_never_exceed_their_number,
    ),
    (
        "an_exclusive_waiter_is_not_starved",
        an_exclusive_waiter_is_not_starved,
    ),
    (
        "fences_rise_across_shared_and_exclusive_phases",
        fences_rise_across_shared_and_exclusive_phases,
    ),
    (
        "a_shared_phase_lives_as_long_as_its_longest_holder",
        a_shared_phase_lives_as_long_as_its_longest_holder,
    ),
];

/// A key no other property or process uses: `lc/<process id>/<name>/<n>`.
/// Real servers are shared by every test of a run, and by earlier runs.
pub fn key(name: &str) -> LeaseKey {
    static RUN: OnceLock<String> = OnceLock::new();
    static N: AtomicU64 = AtomicU64::new(0);
    let run = RUN.get_or_init(|| HolderId::random().as_str()[..12].to_string());
    let n = N.fetch_add(1, Ordering::Relaxed);
    // Names passed here are literals of this crate, valid key segments.
    LeaseKey::new(format!("lc/{run}/{name}/{n}"))
        .unwrap_or_else(|e| panic!("property key for {name:?}: {e}"))
}

/// The shortest TTL the backend accepts: expiry properties wait it out.
pub(crate) fn short_ttl(caps: &Capabilities) -> Duration {
    caps.ttl.min.max(caps.ttl.granularity)
}

/// A TTL nothing expires within while a property runs.
pub(crate) fn long_ttl(caps: &Capabilities) -> Duration {
    caps.ttl
        .effective(Duration::from_secs(60))
        .unwrap_or(caps.ttl.max)
}

/// `n` fresh clients of the store under test.
pub(crate) async fn clients(
    h: &dyn Harness,
    n: usize,
) -> Result<Vec<Arc<dyn LeaseBackend>>, Failure> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(h.client().await?);
    }
    Ok(out)
}

/// An acquire request with a TTL.
pub(crate) fn req(key: &LeaseKey, holder: &HolderId, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(key.clone(), holder.clone()).ttl(ttl)
}

/// Acquires and insists on a grant.
pub(crate) async fn grant(
    c: &dyn LeaseBackend,
    key: &LeaseKey,
    holder: &HolderId,
    ttl: Duration,
    why: &str,
) -> Result<Grant, Failure> {
    grant_req(c, req(key, holder, ttl), why).await
}

/// Sends `r` and insists on a grant.
pub(crate) async fn grant_req(
    c: &dyn LeaseBackend,
    r: AcquireRequest,
    why: &str,
) -> Result<Grant, Failure> {
    let key = r.key.clone();
    match c.try_acquire(r).await {
        Ok(Acquire::Granted(g)) => Ok(g),
        Ok(Acquire::Held(h)) => Err(Failure(format!(
            "{why}: expected a grant of {key}, but {} holds it with fence {}",
            h.holder, h.fence
        ))),
        Err(e) => Err(Failure(format!("{why}: acquire of {key} failed: {e}"))),
    }
}

/// Makes `taker` wait out `first`, a grant of another holder that is no
/// longer renewed, the way its backend demands and take the key: one refused
/// attempt (which starts the observation on local-observation backends),
/// `first`'s TTL of backend time, then a grant.
///
/// `last_sent` is the latest instant a request that may have started
/// `first`'s TTL on the server was sent: `first`'s own send instant, or for
/// a grant that was renewed, the instant its renewals were cut off. The
/// first attempt must be refused; a grant of it is a violation unless
/// [`may_follow_expiry`] says it was sent after `first` expired (the test
/// stalled for a whole TTL on a loaded machine), and that grant is then the
/// takeover.
///
/// Either way the new grant's fence must be above `first`'s.
///
/// The new grant has a long TTL, not `first`'s: properties go on to check
/// that the new holder still holds the key after other calls, and a grant
/// of the backend's shortest TTL (a second on some) can expire while those
/// calls stall on a loaded machine, which reads as the very disturbance
/// the property looks for.
pub(crate) async fn take_over(
    h: &dyn Harness,
    taker: &dyn LeaseBackend,
    key: &LeaseKey,
    holder: &HolderId,
    first: &Grant,
    last_sent: Instant,
) -> Result<Grant, Failure> {
    let caps = taker.capabilities();
    let ttl = long_ttl(&caps);
    let sent = Instant::now();
    let taken = match taker.try_acquire(req(key, holder, ttl)).await? {
        Acquire::Held(_) => {
            h.pass(first.ttl()).await;
            grant(
                taker,
                key,
                holder,
                ttl,
                "after the holder's TTL passed unrenewed",
            )
            .await?
        }
        Acquire::Granted(g)
            if may_follow_expiry(
                last_sent,
                first.ttl(),
                sent,
                h.real_clock(),
                caps.time_authority,
            ) =>
        {
            g
        }
        Acquire::Granted(g) => {
            return Err(Failure(format!(
                "a second holder was granted {key} (fence {}) while the first grant was live",
                g.fence()
            )))
        }
    };
    if taken.fence() <= first.fence() {
        return Err(Failure(format!(
            "the takeover of {key} got fence {}, not above the first holder's {}",
            taken.fence(),
            first.fence()
        )));
    }
    Ok(taken)
}

/// Whether a grant to another holder, of an attempt sent at `attempt_sent`,
/// may rightly follow the expiry of a grant of `ttl` whose TTL was last
/// started by a request sent at `last_sent`.
///
/// Only on a server's real clock ([`Harness::real_clock`]) and with expiry
/// judged by that clock: a simulated clock has not moved, and a backend that
/// judges expiry by its own observation has not observed the grant yet.
/// Even then only for an attempt sent a whole TTL after `last_sent`, which
/// the server handled after any TTL that request started had run out. An
/// attempt sent earlier may have been handled while the grant was live, and
/// is not excused.
fn may_follow_expiry(
    last_sent: Instant,
    ttl: Duration,
    attempt_sent: Instant,
    real_clock: bool,
    authority: TimeAuthority,
) -> bool {
    real_clock
        && authority == TimeAuthority::BackendClock
        && last_sent
            .checked_add(ttl)
            .is_some_and(|expired| attempt_sent >= expired)
}

/// A small payload naming its purpose.
pub(crate) fn payload(text: &str) -> Payload {
    Payload::new(text.as_bytes().to_vec()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use lease_core::TimeAuthority;

    use super::may_follow_expiry;

    const TTL: Duration = Duration::from_secs(3);

    #[test]
    fn a_grant_of_an_attempt_sent_within_the_ttl_is_never_excused() {
        let last = Instant::now();
        for sent in [last, last + TTL - Duration::from_millis(1)] {
            assert!(!may_follow_expiry(
                last,
                TTL,
                sent,
                true,
                TimeAuthority::BackendClock
            ));
        }
    }

    #[test]
    fn a_grant_of_an_attempt_sent_a_ttl_later_is_excused_on_a_real_server_clock_only() {
        let last = Instant::now();
        let sent = last + TTL;
        assert!(may_follow_expiry(
            last,
            TTL,
            sent,
            true,
            TimeAuthority::BackendClock
        ));
        assert!(!may_follow_expiry(
            last,
            TTL,
            sent,
            false,
            TimeAuthority::BackendClock
        ));
        assert!(!may_follow_expiry(
            last,
            TTL,
            sent,
            true,
            TimeAuthority::LocalObservation
        ));
    }
}
