//! The shared lease contract, on a real MongoDB-compatible server.

mod common;

use common::MongoHarness;
use lease_conformance::conformance_tests;

conformance_tests!(mongo, async { MongoHarness::start().await });
