//! Side products that are not [`LeaseBackend`](lease_core::LeaseBackend)
//! implementations and are not checked by the conformance suite: the
//! writer/fsck [`store_lock`]. Re-exported at the crate root.

pub mod store_lock;
