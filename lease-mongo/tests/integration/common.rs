//! The mongo harness and helpers these tests share, from lease-testkit.

pub use lease_testkit::harness::mongo::*;
