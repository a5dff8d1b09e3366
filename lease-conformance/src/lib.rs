//! The lease contract as properties, run identically against every backend.
//!
//! # For a backend author
//!
//! To hold a `lease_core::LeaseBackend` implementation to the contract:
//!
//! 1. Implement [`Harness`] in your crate's tests: [`Harness::client`] gives
//!    a new client of one store (all clients of one harness share it),
//!    [`Harness::pass`] lets backend time pass (sleep on a real server), and
//!    the optional hooks ([`Harness::write_corrupt`],
//!    [`Harness::delete_outside`], [`Harness::set_latency`], …) unlock the
//!    properties that need them.
//! 2. Call [`conformance_tests!`] once. It expands to one named `#[test]`
//!    per property — `mybackend::exactly_one_winner`,
//!    `mybackend::fences_increase`, … — each building a harness with your
//!    async expression (`Err` means the server could not be had). A
//!    property that needs a capability or hook the backend lacks reports
//!    "not applicable" instead of passing silently.
//! 3. For safety under failure, return [`faults::FaultHooks`] from
//!    [`Harness::fault_hooks`] (the server's address for a TCP
//!    [`faults::FaultProxy`], a [`faults::ServerControl`] for the server
//!    process, …) and call [`fault_tests!`] for one test per fault kind.
//!    [`faults`] runs contenders that acquire, renew and write to a fenced
//!    resource while the fault is injected (lost responses, latency,
//!    severed connections, blackholes, paused holders, server pause and
//!    restart, clock jumps), beside election candidates that campaign and
//!    run work while leading; it records the history, and [`history`]
//!    checks it: no two holders' write windows overlap, fences never go
//!    backwards, no stale write is accepted, no two leaders' work overlaps
//!    and none outlives its grant.
//!
//! Starting the server is yours to do: the suite needs only clients. A
//! test whose server is missing fails, unless its backend is named in
//! [`SKIP_ENV`] (`LEASE_TEST_SKIP`); then it is reported as skipped,
//! loudly. When [`REPORT_ENV`] (`LEASE_REPORT_DIR`) names a directory,
//! every test writes its status to `<dir>/<backend>/<property>` (fault
//! runs to `<dir>/<backend>/fault_<kind>`), from which a matrix of
//! backend × property can be printed.
//!
//! The properties are plain async functions over `&dyn Harness`
//! ([`properties`]), so they can also be called directly; this crate's own
//! tests run them against deliberately broken backends to prove each one
//! can fail. [`FakeHarness`] runs the suite on the in-memory reference
//! backend, `lease-fake`.
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
//! In a backend crate's tests:
//!
//! ```ignore
//! lease_conformance::conformance_tests!(mybackend, async { MyHarness::start().await });
//! ```

#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod fake;
pub mod faults;
mod harness;
pub mod history;
mod hooks;
mod process;
pub mod properties;
mod runner;
mod verdict;

pub use fake::FakeHarness;
pub use harness::Harness;
pub use runner::{run, skip_allowed, Status, PROPERTY_TIMEOUT, REPORT_ENV, SKIP_ENV};
pub use verdict::{Failure, Outcome, Verdict};

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
