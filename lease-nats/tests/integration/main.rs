//! The integration tests of `lease-nats`, on real nats-servers, in one test
//! binary, so the client graph is linked once.
//!
//! One module per area; `conformance` is the shared suite and `faults` the
//! fault runs, which the conformance matrix reads. Select them with
//! `cargo test -p lease-nats --test integration -- conformance:: faults::`.
//!
//! The tests share one process, so they share its nats-server (started on
//! first use). Tests on the shared server use buckets or keys of their own;
//! tests that kill, pause, restart or cluster a server, or need one
//! configured differently, start a private one.

mod common;

mod cluster;
mod conformance;
mod faults;
mod nats;
mod sequence;
