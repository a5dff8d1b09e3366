//! The integration tests of `lease-etcd`, on real etcd servers, in one test
//! binary, so the client graph is linked once.
//!
//! One module per area; `conformance` is the shared suite and `faults` the
//! fault runs, which the conformance matrix reads. Select them with
//! `cargo test -p lease-etcd --test integration -- conformance:: faults::`.
//! `sessions` runs both again with session leases on.
//!
//! The tests share one process, so they share its etcd server (started on
//! first use) and the rustls crypto provider the backend installs. Tests on
//! the shared server keep to key prefixes of their own; tests that stop,
//! pause or restart a server, or count the requests it receives, start a
//! private one.

mod common;

mod abandoned;
mod bad_input;
mod basics;
mod cluster;
mod conformance;
mod edges;
mod election;
mod faults;
mod reacquire;
mod requests;
mod scale;
mod sessions;
mod tls;
mod watched;
