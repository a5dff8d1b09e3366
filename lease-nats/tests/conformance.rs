//! The shared lease contract, run against a real nats-server.
//!
//! The server is `LEASE_TEST_NATS_URL` when set, else the one
//! `lease_conformance::servers` provides (a native nats-server provisioned by
//! `cargo xtask provision --backend nats`).

mod support;

use lease_conformance::conformance_tests;
use support::harness::NatsHarness;

conformance_tests!(nats, async { NatsHarness::start().await });
