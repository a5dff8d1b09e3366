//! The integration tests of `lease-redis`, on a real Redis server, in one
//! test binary, so the client graph is linked once.
//!
//! One module per area; `conformance` is the shared suite and `faults` the
//! fault runs, which the conformance matrix reads. Select them with
//! `cargo test -p lease-redis --test integration -- conformance:: faults::`.
//!
//! The tests share one process, so they share its server (started on first
//! use). Tests on the shared server use key prefixes of their own; tests
//! that pause, kill, restart or reconfigure a server start a private one.

mod common;

mod breaks;
mod conformance;
mod faults;
mod fences;
mod malformed;
mod server;
#[cfg(feature = "tls")]
mod tls;
mod watch;
