//! The fake's fault hooks: its clock and its failure hooks.

use std::time::Duration;

use super::FaultHooks;
use crate::FakeHarness;

impl FaultHooks for FakeHarness {
    fn advance_clock(&self, by: Duration) -> bool {
        self.fake.advance(by);
        true
    }

    fn jump_clock(&self, by: Duration, forward: bool) -> bool {
        let now = self.fake.now();
        self.fake.set(if forward {
            now.saturating_add(by)
        } else {
            now.saturating_sub(by)
        });
        true
    }

    fn lose_next_responses(&self, n: u32) -> bool {
        self.fake.lose_next_responses(n);
        true
    }

    fn fail_next(&self, n: u32) -> bool {
        self.fake.fail_next(n);
        true
    }
}
