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
/// The first attempt must be refused while `first` is certainly live: a
/// server started its TTL no earlier than `first`'s request was sent. Only
/// on a server's real clock ([`Harness::real_clock`]) can an attempt sent
/// after that (the test stalled for a whole TTL on a loaded machine) rightly
/// be granted, and that grant is then the takeover. A simulated clock has
/// not moved, and a backend that judges expiry by its own observation has
/// not observed `first` yet: a grant there is always a violation.
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
) -> Result<Grant, Failure> {
    let ttl = long_ttl(&taker.capabilities());
    let live_until = first
        .sent_at()
        .checked_add(first.ttl())
        .filter(|_| h.real_clock())
        .filter(|_| taker.capabilities().time_authority == TimeAuthority::BackendClock);
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
        Acquire::Granted(g) if live_until.is_some_and(|end| sent >= end) => g,
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

/// A small payload naming its purpose.
pub(crate) fn payload(text: &str) -> Payload {
    Payload::new(text.as_bytes().to_vec()).unwrap_or_default()
}
