//! Side products of the crate that are not [`LeaseBackend`](lease_core::LeaseBackend)
//! implementations: the single-lease [`provider`] interface.

pub mod provider;
