//! The shared conformance suite on a real etcd.

mod common;

use common::harness::EtcdHarness;
use lease_conformance::conformance_tests;

conformance_tests!(etcd, async { EtcdHarness::start().await });
