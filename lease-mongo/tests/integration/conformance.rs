//! The shared lease contract, on a real MongoDB-compatible server.

use crate::common::MongoHarness;
use lease_conformance::conformance_tests;

conformance_tests!(mongo, async { MongoHarness::shared().await });
