//! The shared lease contract, on a real PostgreSQL server.

use crate::common::PostgresHarness;
use lease_conformance::conformance_tests;

conformance_tests!(postgres, async { PostgresHarness::shared().await });
