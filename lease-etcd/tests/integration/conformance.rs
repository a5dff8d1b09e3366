//! The shared conformance suite on a real etcd.

use crate::common::EtcdHarness;
use lease_conformance::conformance_tests;

conformance_tests!(etcd, async { EtcdHarness::shared().await });
