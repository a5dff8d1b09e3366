//! The `lease` binary's tests, in one test binary: end to end on each
//! backend's test server (`e2e`, and `election` for `lease elect` and
//! `lease leader`, `shared` for `--shared`, `--exclusive` and
//! `--permits`), and TLS and credentials on servers started here
//! (`tls`).
//!
//! They share one process safely: each drives the binary as child
//! processes and sets no process-wide state (environment, signal handlers)
//! in the test process.

mod daily_use;
mod e2e;
mod election;
mod hoppers;
mod leftovers;
mod shared;
mod tls;
