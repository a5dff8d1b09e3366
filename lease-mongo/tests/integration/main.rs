//! The integration tests of `lease-mongo`, on a real MongoDB-compatible
//! server, in one test binary, so the client graph is linked once.
//!
//! One module per area; `conformance` is the shared suite and `faults` the
//! fault runs, which the conformance matrix reads. Select them with
//! `cargo test -p lease-mongo --test integration -- conformance:: faults::`.
//!
//! The tests share one process, so they share its server (started on first
//! use). Tests on the shared server use collections of their own; tests that
//! pause, kill or restart a server, or move its clock, start a private one.

mod common;

mod breaks;
mod conformance;
mod faults;
mod keyed;
mod malformed;
mod store_lock;
mod store_lock_lost_answers;
mod timeouts;
