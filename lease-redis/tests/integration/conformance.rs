//! The shared lease contract, on a real Redis server.

use crate::common::RedisHarness;
use lease_conformance::conformance_tests;

conformance_tests!(redis, async { RedisHarness::shared().await });
