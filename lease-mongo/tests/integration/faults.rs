//! Fault runs on a real MongoDB-compatible server: contenders acquire, renew,
//! write to a fenced resource and release while faults are injected; every
//! recorded history must be safe (no overlapping write windows, fences in
//! order, unknown outcomes counted both ways). The tests are
//! `lease_conformance::fault_tests!`, the tuning `MongoHarness::FAULT_TUNING`.

lease_conformance::fault_tests!(harness: crate::common::MongoHarness);
