//! The integration tests of `lease-postgres`, on a real PostgreSQL server,
//! in one test binary, so the client graph is linked once.
//!
//! One module per area; `conformance` is the shared suite and `faults` the
//! fault runs, which the conformance matrix reads. Select them with
//! `cargo test -p lease-postgres --test integration -- conformance:: faults::`.
//!
//! The tests share one process, so they share its server (started on first
//! use). Tests on the shared server use tables of their own; tests that
//! pause, kill or restart a server start a private one.

mod common;

mod breaks;
mod conformance;
mod faults;
mod functions;
mod late_writes;
mod malformed;
mod server;
mod statement_cache;
#[cfg(feature = "tls")]
mod tls;
mod watch;
