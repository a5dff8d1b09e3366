//! The whole suite on the in-memory fake: the reference backend must pass it,
//! with millisecond TTLs and with whole-second TTLs like etcd's and NATS'.

use std::time::Duration;

use lease_conformance::{conformance_tests, FakeHarness};
use lease_core::TtlRule;
use lease_fake::Fake;

conformance_tests!(fake, async { Ok::<_, String>(FakeHarness::new()) });

conformance_tests!(fake_whole_seconds, async {
    Ok::<_, String>(FakeHarness::with(Fake::with_ttl_rule(
        TtlRule::new(Duration::from_secs(1)..=Duration::from_secs(3600))
            .rounded_to(Duration::from_secs(1)),
    )))
});
