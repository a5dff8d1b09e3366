//! Distributed leases with fencing tokens on S3-compatible object stores —
//! and on any [`object_store`] store with conditional puts (GCS, Azure,
//! [`InMemory`](object_store::memory::InMemory)).
//!
//! Two surfaces on one protocol:
//!
//! * [`ObjectStoreBackend`] implements the keyed [`lease_core::LeaseBackend`]
//!   contract on `{prefix}/{key}` objects, checked by `lease-conformance`.
//! * [`bucket_lease`]: a single-object bucket lease with a stable instance
//!   id ([`BucketLease`](bucket_lease::BucketLease), one lease per prefix on
//!   `{prefix}/LEASE`, with [`BucketLeaseWatch`](bucket_lease::BucketLeaseWatch)
//!   and `write_deadline`), on the same conditional-write protocol.
//!
//! # How it works
//!
//! Every change is a conditional PUT: `If-None-Match: *` to create,
//! `If-Match: <etag>` to replace. The record carries holder, fence, TTL and a
//! fresh nonce (so every write has a new ETag even where ETags are content
//! hashes). Objects are never deleted: release writes a "released" record, so
//! the fence only ever grows — takeovers and re-acquisitions after a release
//! increment it.
//!
//! Object stores have no clock a client may trust, so no timestamp is ever
//! read from the store. A foreign lease counts as expired only after the
//! taker has seen **the same version** of its object for a whole TTL on its
//! own monotonic clock ([`TimeAuthority::LocalObservation`](lease_core::TimeAuthority));
//! a holder stops writing 2/3 of a TTL after sending its last successful
//! renewal, so the two windows cannot overlap unless a holder stalls past its
//! deadline without checking it ([`Exclusion::ObservedExpiry`](lease_core::Exclusion)):
//! fence your writes.
//!
//! A lease object deleted behind the library's back (a lifecycle rule,
//! `aws s3 rm`) is recognised by the key's marker at `{prefix}/.used/{key}`,
//! written before the lease object is first created: the key is granted only
//! after the taker has seen it missing for a whole TTL, with a fence of at
//! least the wall clock in microseconds, so fences keep rising across the
//! deletion while clocks stay roughly synchronised. A new key's first fence
//! is therefore a large number, not 1. Do not delete lease objects or
//! markers of keys that may be held, and keep lifecycle rules off the lease
//! prefix (the README's "Operating the bucket" says why).
//!
//! A store that ignores preconditions would grant the lease twice. Before its
//! first write each client checks that a create over an existing object and
//! an update with a wrong ETag both fail, and refuses with
//! [`Error::PreconditionsIgnored`](lease_core::Error) otherwise.
//!
//! # Which stores exclude
//!
//! That check sends one request at a time. It cannot tell whether the
//! store's check-and-store is atomic under concurrency, so exclusion rests
//! on the store being linearizable for conditional writes:
//!
//! * known to be: AWS S3 (conditional writes since 2024, strongly
//!   consistent), Google Cloud Storage (generation preconditions), Azure
//!   Blob Storage (ETag conditions), object_store's `InMemory`;
//! * known not to be: moto's own conditional PUT (two winners were seen in
//!   a few of several hundred racing rounds; serve it one request at a
//!   time), some S3-compatible gateways and servers (s3s-fs and s3rver
//!   ignore conditions under concurrency or entirely), and multi-site or
//!   asynchronously replicated setups, where two sites can each accept a
//!   conditional write;
//! * anything else: ask its vendor whether `If-None-Match: *` and
//!   `If-Match` are evaluated atomically with the write, across every node
//!   that accepts writes for the bucket.
//!
//! [`Capabilities::exclusion`](lease_core::Capabilities) and
//! [`BucketLease::exclusion`](bucket_lease::BucketLease::exclusion) report
//! [`Exclusion::ObservedExpiry`](lease_core::Exclusion) on every store, the
//! weakest level lease-core names; on a store of the second kind even that
//! does not hold.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use lease_core::{Acquire, AcquireRequest, HolderId, LeaseBackend, LeaseKey, Renewal};
//! use lease_s3::{ObjectStoreBackend, S3Config};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! let store = S3Config::new("my-bucket")
//!     .endpoint("http://127.0.0.1:9000")
//!     .credentials("access", "secret")
//!     .build()?;
//! let leases = ObjectStoreBackend::new(store, "leases")?;
//! let me = HolderId::random();
//! let req = AcquireRequest::new(LeaseKey::new("cron/nightly")?, me).ttl(Duration::from_secs(15));
//! match leases.try_acquire(req).await? {
//!     Acquire::Granted(grant) => {
//!         println!("leader, fence {}", grant.fence());
//!         if let Renewal::Renewed(g) = leases.renew(&grant, None).await? {
//!             leases.release(&g).await?;
//!         }
//!     }
//!     // A fresh client must watch a silent holder's lease for a TTL before
//!     // taking it over: poll again.
//!     Acquire::Held(h) => println!("{} holds it", h.holder),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The one-lease-per-prefix API over the same store:
//!
//! ```
//! use std::sync::Arc;
//! use lease_s3::bucket_lease::{BucketLease, BucketLeaseError, BucketLeaseWatch};
//! use object_store::memory::InMemory;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BucketLeaseError> {
//! let store = Arc::new(InMemory::new());
//! let lease = BucketLease::acquire(store.clone(), "jobs/compactor", 10).await?;
//! assert!(lease.may_write());
//! let mut watch = BucketLeaseWatch::new();
//! match BucketLease::acquire_as(store, "jobs/compactor", 10, "other", &mut watch).await {
//!     Err(BucketLeaseError::ForeignActive { holder, .. }) => assert_eq!(holder, lease.instance_id()),
//!     other => panic!("{other:?}"),
//! }
//! lease.renew().await?;
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod admin;
mod backend;
mod cache;
mod conditional;
#[cfg(feature = "s3")]
mod config;
mod connect;
mod errors;
mod extras;
mod operations;
mod record;

pub use backend::ObjectStoreBackend;
pub use conditional::RECORD_MISSING_HOLDER;
#[cfg(feature = "s3")]
#[cfg_attr(docsrs, doc(cfg(feature = "s3")))]
pub use config::{build_s3, S3Config};
pub use extras::bucket_lease;

/// The object_store version this crate is built against, so callers build
/// stores of the same version.
pub use object_store;

/// The README's examples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
