//! Fault runs on a real PostgreSQL server: contenders acquire, renew,
//! write to a fenced resource and release while faults are injected; every
//! recorded history must be safe (no overlapping write windows, fences in
//! order, unknown outcomes counted both ways). The tests are
//! `lease_conformance::fault_tests!`, the tuning
//! `PostgresHarness::FAULT_TUNING` (its real resource is a table in the same
//! PostgreSQL, each write admitted by lease-fence's PgFences).

lease_conformance::fault_tests!(harness: crate::common::PostgresHarness);
