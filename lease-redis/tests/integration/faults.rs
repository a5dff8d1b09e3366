//! Fault runs on a real Redis server: contenders acquire, renew, write to
//! a fenced resource and release while faults are injected; every
//! recorded history must be safe (no overlapping write windows, fences in
//! order, unknown outcomes counted both ways). The tests are
//! `lease_conformance::fault_tests!`, the tuning `RedisHarness::FAULT_TUNING`
//! (the private server keeps an append-only file synced on every write, so
//! a restart keeps every grant; it runs under libfaketime, so its wall
//! clock, which `PX` expiry runs on, is stepped).

lease_conformance::fault_tests!(harness: crate::common::RedisHarness);
