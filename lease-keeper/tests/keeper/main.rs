//! The keeper's integration tests, on the fake: one binary, one module per
//! area.

mod common;

mod acquire;
mod election;
mod fake_wake;
mod group;
mod group_stop;
mod observability;
mod observer_bounds;
mod requests;
mod run;
mod schedule;
mod send_sync;
mod shared;
mod terms;
