//! Side products that are not [`LeaseBackend`](lease_core::LeaseBackend)
//! implementations and are not checked by the conformance suite: the
//! one-lease-per-prefix [`bucket_lease`], on the same conditional-write
//! protocol. Re-exported at the crate root.

pub mod bucket_lease;
