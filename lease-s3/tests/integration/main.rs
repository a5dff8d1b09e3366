//! The integration tests of `lease-s3`, on object_store's in-memory store and
//! on a real S3-compatible server, in one test binary, so the client graph is
//! linked once.
//!
//! One module per area; `conformance` is the shared suite (`s3_memory` and
//! `s3`) and `faults` the fault runs on both stores, which the conformance
//! matrix reads. Select them with
//! `cargo test -p lease-s3 --test integration -- conformance:: faults::`.
//! `hazards` holds the protocol's own fault scenarios (ignored
//! preconditions, lost answers, fresh contenders), which are not part of
//! the matrix.
//!
//! The tests share one process, so they share its S3 server (started on
//! first use); each uses a key prefix of its own, and tests that pause a
//! server start a private one. `tests/tls.rs` stays a binary of its own: it
//! checks the process's rustls crypto provider before and after the first
//! S3 client is built, which only a process where no other test ran first
//! can show.

mod common;

mod breaks;
mod bucket;
mod conformance;
mod faults;
mod hazards;
mod linearizability;
mod memory;
mod records;
mod versioned;
