//! The lease contract as properties, run identically against every backend.
//!
//! Every backend crate plugs in the same way: implement [`Harness`] (how to
//! make clients of one store, how to let time pass, optional hooks) and call
//! [`conformance_tests!`] once. That expands to one named `#[test]` per
//! property — `etcd::exactly_one_winner`, `nats::fences_increase`, … — so
//! every backend is held to the same contract, by the same code, on a real
//! server. Properties that need a capability or hook the backend lacks
//! report "not applicable" instead of passing silently.
//!
//! The properties are plain async functions over `&dyn Harness`
//! ([`properties`]), so backend authors can also call them directly, and the
//! meta-tests in this crate run them against deliberately broken backends to
//! prove each one can fail.
//!
//! [`servers`] finds or starts the real servers (an endpoint from the
//! environment, a native binary provisioned by `cargo xtask provision`);
//! a server that cannot be had fails the test unless its backend is named in
//! `LEASE_TEST_SKIP`, and then it is reported as skipped, loudly.
//!
//! Safety under failure is checked apart from the properties: [`faults`]
//! runs contenders that acquire, renew and write to a fenced resource while
//! one fault is injected (lost responses, latency, severed connections,
//! blackholes, paused holders, server pause and restart, clock jumps on the
//! fake), records the history, and [`history`] checks it — no two holders'
//! write windows overlap, fences never go backwards, no stale write is
//! accepted. [`fault_tests!`] gives a backend one test per fault kind, as
//! [`conformance_tests!`] gives it one per property.
//!
//! # Example
//!
//! ```
//! use lease_conformance::{properties, FakeHarness, Outcome};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let harness = FakeHarness::new();
//! let verdict = properties::exactly_one_winner(&harness).await;
//! assert_eq!(verdict, Ok(Outcome::Passed));
//! # }
//! ```
//!
//! In a backend crate's `tests/conformance.rs`:
//!
//! ```ignore
//! lease_conformance::conformance_tests!(etcd, async { EtcdHarness::start().await });
//! ```

#![deny(missing_docs)]

mod fake;
pub mod faults;
mod harness;
pub mod history;
pub mod properties;
mod runner;
pub mod servers;
mod verdict;

pub use fake::FakeHarness;
pub use harness::Harness;
pub use runner::{run, skip_allowed, Status, PROPERTY_TIMEOUT, REPORT_ENV, SKIP_ENV};
pub use verdict::{Failure, Outcome, Verdict};
