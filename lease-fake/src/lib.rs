//! An in-memory lease backend: the reference model of the `lease` contract,
//! and a test double for code that uses leases.
//!
//! [`Fake`] implements [`LeaseBackend`](lease_core::LeaseBackend) exactly as the real backends must
//! (the `lease-conformance` suite holds them all to the same properties),
//! with its own injectable clock as the backend's time authority: expiry
//! happens only when you [`advance`](Fake::advance) or [`set`](Fake::set) it,
//! so tests about expiry are instant and deterministic.
//!
//! Clones share one store, so many clients in one process contend for the same
//! keys. Hooks let tests inject the faults real backends have: a failed
//! request ([`fail_next`](Fake::fail_next)), a request applied whose answer is
//! lost ([`lose_next_responses`](Fake::lose_next_responses)), latency
//! ([`set_latency`](Fake::set_latency)), a forced expiry
//! ([`expire`](Fake::expire)) and a corrupt stored record
//! ([`write_raw`](Fake::write_raw)).
//!
//! ```
//! use std::time::Duration;
//! use lease_core::{Acquire, AcquireRequest, HolderId, LeaseBackend, LeaseKey};
//! use lease_fake::Fake;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! let fake = Fake::new();
//! let (a, b) = (fake.clone(), fake.clone()); // two clients, one store
//! let key = LeaseKey::new("leader")?;
//! let ttl = Duration::from_secs(10);
//!
//! let first = a.try_acquire(AcquireRequest::new(key.clone(), HolderId::random()).ttl(ttl)).await?;
//! let first = first.granted().expect("free key");
//! let req = AcquireRequest::new(key.clone(), HolderId::random()).ttl(ttl);
//! assert!(matches!(b.try_acquire(req.clone()).await?, Acquire::Held(_)));
//!
//! fake.advance(ttl); // the holder died: its TTL runs out on the backend clock
//! let second = b.try_acquire(req).await?.granted().expect("expired");
//! assert!(second.fence() > first.fence());
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod store;

pub use store::Fake;

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
