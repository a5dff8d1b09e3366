//! Fault runs on a real nats-server: contenders acquire, renew, write to a
//! fenced resource and release while faults are injected (through a proxy in
//! front of the server, or on the server process); every recorded history
//! must be safe: no overlapping write windows, fences in order, unknown
//! outcomes counted both ways. The tests are `lease_conformance::fault_tests!`,
//! the tuning `NatsHarness::FAULT_TUNING`.

lease_conformance::fault_tests!(harness: crate::common::NatsHarness);
