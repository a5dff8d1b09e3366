//! Running one property as a `#[test]`: the server, the verdict, the report.

use std::future::Future;
use std::time::Duration;

use crate::properties::Property;
use crate::{Harness, Outcome};

/// Longest a single property may run before it counts as failed (a hung
/// request on a real server must not hang CI).
pub const PROPERTY_TIMEOUT: Duration = Duration::from_secs(180);

/// Environment variable: comma-separated backend names whose unavailable
/// server is a skip (reported loudly) instead of a failure.
pub const SKIP_ENV: &str = "LEASE_TEST_SKIP";

/// Environment variable: a directory where each test writes its status
/// (`<dir>/<backend>/<property>`), for `cargo xtask conformance`'s matrix.
pub const REPORT_ENV: &str = "LEASE_REPORT_DIR";

/// How one property ended on one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// It held.
    Pass,
    /// It did not apply (a missing capability or hook), with the reason.
    NotApplicable(String),
    /// The server could not be had and the backend is in [`SKIP_ENV`].
    Skipped(String),
    /// It was violated, or the server could not be had.
    Fail(String),
}

impl Status {
    /// The line written to the report file.
    pub fn report_line(&self) -> String {
        match self {
            Status::Pass => "pass".into(),
            Status::NotApplicable(r) => format!("n/a: {r}"),
            Status::Skipped(r) => format!("skipped: {r}"),
            Status::Fail(r) => format!("fail: {r}"),
        }
    }
}

/// Whether [`SKIP_ENV`] names `backend` (or `all`): only then may a test
/// whose server cannot be had report it skipped instead of failing.
pub fn skip_allowed(backend: &str) -> bool {
    std::env::var(SKIP_ENV)
        .map(|v| {
            v.split(',')
                .any(|b| b.trim() == backend || b.trim() == "all")
        })
        .unwrap_or(false)
}

/// Runs `property` against the harness `make` builds, on a fresh tokio
/// runtime; writes the report line; panics (failing the test) on a violation
/// or on an unavailable server that may not be skipped.
///
/// This is what [`conformance_tests!`](crate::conformance_tests) expands to.
pub fn run<H, M>(backend: &str, property: &str, make: M, run_property: Property)
where
    H: Harness,
    M: Future<Output = Result<H, String>>,
{
    let status = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Err(e) => Status::Fail(format!("could not start a tokio runtime: {e}")),
        Ok(rt) => rt.block_on(async {
            let harness = match make.await {
                Ok(h) => h,
                Err(reason) if skip_allowed(backend) => return Status::Skipped(reason),
                Err(reason) => {
                    return Status::Fail(format!(
                        "{backend} server unavailable: {reason} (run `cargo xtask provision`, or set {SKIP_ENV}={backend} to skip it explicitly)"
                    ))
                }
            };
            match tokio::time::timeout(PROPERTY_TIMEOUT, run_property(&harness)).await {
                Err(_) => Status::Fail(format!("did not finish within {PROPERTY_TIMEOUT:?}")),
                Ok(Ok(Outcome::Passed)) => Status::Pass,
                Ok(Ok(Outcome::NotApplicable(r))) => Status::NotApplicable(r),
                Ok(Err(f)) => Status::Fail(f.0),
            }
        }),
    };
    write_report(backend, property, &status);
    match status {
        Status::Pass => {}
        Status::NotApplicable(r) => {
            eprintln!("lease-conformance: {backend}::{property} not applicable: {r}")
        }
        Status::Skipped(r) => {
            eprintln!("lease-conformance: SKIPPED {backend}::{property}: server unavailable: {r}")
        }
        Status::Fail(r) => panic!("{backend}::{property} violated the lease contract: {r}"),
    }
}

fn write_report(backend: &str, property: &str, status: &Status) {
    let Ok(dir) = std::env::var(REPORT_ENV) else {
        return;
    };
    let dir = std::path::Path::new(&dir).join(backend);
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join(property), status.report_line()));
    if let Err(e) = written {
        eprintln!("lease-conformance: could not write the report for {backend}::{property}: {e}");
    }
}

/// Expands to one `#[test]` per property of the suite, in a module named
/// `$backend`, each building its harness with the async expression `$make`
/// (which yields `Result<impl Harness, String>`, `Err` meaning the server is
/// unavailable).
///
/// ```ignore
/// lease_conformance::conformance_tests!(etcd, async { EtcdHarness::start().await });
/// // → etcd::exactly_one_winner, etcd::fences_increase, …
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ident, $make:expr) => {
        $crate::__conformance_tests!($backend, $make;
            exactly_one_winner,
            refused_acquire_names_the_holder,
            fences_increase,
            reacquire_returns_same_fence,
            reacquire_extends_the_lease,
            reacquire_with_a_shorter_ttl_keeps_the_term,
            renewing_an_earlier_grant_keeps_the_longer_term,
            renew_after_takeover_is_lost,
            after_expiry_another_holder_acquires,
            an_abandoned_grant_expires_while_its_client_renews_another,
            release_frees_the_key,
            release_of_lost_grant_leaves_new_holder,
            read_changes_nothing,
            payload_round_trips_and_is_replaced_on_renew,
            bad_input_changes_nothing,
            corrupt_record_is_an_error,
            ttl_follows_the_capability,
            deadline_counts_from_the_send_instant,
            model_interleavings,
            keeper_keeps_a_lease_for_many_ttls,
            keeper_self_fences_when_the_backend_is_unreachable,
            waiting_acquirer_gets_a_released_key,
            waiting_acquirer_gets_an_expired_key,
            group_abandons_all_when_one_lease_is_lost,
            break_frees_the_key_and_keeps_fences_rising,
            keeper_reports_a_break_as_broken,
            outside_delete_keeps_fences_rising,
            cancelled_operations_leave_the_contract_intact,
            election_has_one_leader_at_a_time,
            observers_see_every_change_in_order,
            run_while_leader_stops_by_the_deadline,
            resigned_leaders_late_proclaim_is_refused,
            resign_wakes_the_next_candidate,
            a_watch_wakes_on_a_payload_change,
            a_new_term_never_overlaps_the_last,
            two_tasks_on_one_keeper_never_both_hold_a_key,
            shared_and_exclusive_never_overlap,
            permits_never_exceed_their_number,
            an_exclusive_waiter_is_not_starved,
            fences_rise_across_shared_and_exclusive_phases,
            a_shared_phase_lives_as_long_as_its_longest_holder
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($backend:ident, $make:expr; $($property:ident),* $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $property() {
                    $crate::run(
                        stringify!($backend),
                        stringify!($property),
                        $make,
                        $crate::properties::$property,
                    );
                }
            )*
        }
    };
}
