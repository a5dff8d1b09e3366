//! The shared lease contract, run against a real nats-server.
//!
//! The server is `LEASE_TEST_NATS_URL` when set, else the one
//! `lease_testkit::servers` provides (a native nats-server provisioned by
//! `cargo xtask provision --backend nats`).

use crate::common::{NatsHarness, OutsideDelete};
use lease_conformance::{conformance_tests, properties, Outcome};

conformance_tests!(nats, async { NatsHarness::shared().await });

/// The suite's `outside_delete_keeps_fences_rising` deletes by a KV delete
/// (a tombstone stays); here the key's messages are purged from the stream
/// instead, so nothing of the record stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_delete_by_a_stream_purge_keeps_fences_rising() {
    let h = NatsHarness::shared()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .deleting_by(OutsideDelete::StreamPurge);
    match properties::outside_delete_keeps_fences_rising(&h).await {
        Ok(Outcome::Passed) => {}
        other => panic!("{other:?}"),
    }
}
