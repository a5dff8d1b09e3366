//! The suite's own tests, in one binary: the whole suite on the fake
//! (`conformance`), fault runs on the fake (`faults`), the TCP fault proxy
//! (`fault_proxy`), and the proofs that the properties and the history
//! checker can fail (`meta`, `abandon_meta` for abandoned grants, `history_meta`, `election_meta` for the
//! election properties, `watch_meta` for the watch, `terms_meta` for the
//! terms and `shared_meta` for shared leases and permits; `seeded` is the
//! harness those wrap a seeded defect in).
//!
//! Nothing here sets process-wide state (environment, signal handlers), so
//! the modules share one process.

mod abandon_meta;
mod conformance;
mod election_meta;
mod fault_proxy;
mod faults;
mod history_meta;
mod meta;
mod seeded;
mod shared_meta;
mod terms_meta;
mod watch_meta;
