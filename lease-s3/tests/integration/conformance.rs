//! The lease contract, checked by `lease-conformance` on object_store's
//! in-memory store (`s3_memory`, no server) and on a real S3-compatible
//! server (`s3`).

use lease_conformance::conformance_tests;

use crate::common::ObjectHarness;

conformance_tests!(s3_memory, async { ObjectHarness::memory() });
conformance_tests!(s3, async { ObjectHarness::s3() });
