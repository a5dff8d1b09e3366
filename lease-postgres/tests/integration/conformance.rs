//! The shared lease contract, on a real PostgreSQL server.

use crate::common::harness::PostgresHarness;
use lease_conformance::conformance_tests;

conformance_tests!(postgres, async { PostgresHarness::start().await });
