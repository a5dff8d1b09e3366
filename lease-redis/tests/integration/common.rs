//! The redis harness and helpers these tests share, from lease-testkit.

pub use lease_testkit::harness::redis::*;
