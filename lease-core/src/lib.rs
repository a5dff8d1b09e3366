//! The contract for distributed leases with fencing tokens.
//!
//! `lease-core` defines the types, the holder-side timing and the
//! [`LeaseBackend`] trait that every backend of the `lease` workspace
//! (`lease-etcd`, `lease-nats`, `lease-s3`, `lease-mongo`, `lease-postgres`, and the in-memory
//! `lease-fake`) implements, and that the `lease-conformance` suite checks on
//! real servers. It has no dependencies by default. The feature `serde`
//! adds serde to [`LeaseKey`], [`HolderId`] and [`Fence`] (keys and ids as
//! strings, validated on the way in) and to the break's [`AuditRecord`];
//! `json` adds the audit record's JSON codec.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use lease_core::{Acquire, AcquireRequest, HolderId, LeaseBackend, LeaseKey, Renewal};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! let backend = lease_fake::Fake::new(); // or an etcd, NATS, S3, MongoDB or PostgreSQL client
//! let key = LeaseKey::new("cron/nightly-report")?;
//! let me = HolderId::random();
//!
//! let req = AcquireRequest::new(key.clone(), me.clone()).ttl(Duration::from_secs(10));
//! match backend.try_acquire(req).await? {
//!     Acquire::Granted(grant) => {
//!         // Stamp every write with the fence; stop writing when may_write() turns false.
//!         assert!(grant.may_write());
//!         println!("leader with fence {}", grant.fence());
//!         match backend.renew(&grant, None).await? {
//!             Renewal::Renewed(g) => backend.release(&g).await?,
//!             Renewal::Lost => println!("lost it: stop"),
//!         }
//!     }
//!     Acquire::Held(h) => println!("{} holds it (fence {})", h.holder, h.fence),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # The contract (normative for every backend)
//!
//! 1. **Mutual exclusion.** At any instant of the backend's time at most one
//!    live grant exists per key. Under N concurrent acquirers exactly one wins.
//! 2. **Fencing.** Every grant carries a [`Fence`] strictly greater than every
//!    earlier grant's fence for that key — across release, expiry, takeover,
//!    deletion of the record by the library, and restart of a durable backend.
//!    Re-acquiring by the holder of a still-live grant (its earlier answer was
//!    lost) returns that same grant and fence, and never shortens it: the
//!    key lives at least as long as the live grant's TTL promised (a
//!    shorter requested TTL gives way to the live grant's).
//! 3. **Renew** succeeds iff (holder, fence) is still the live grant. Loss is an
//!    outcome ([`Renewal::Lost`]), never an error. An error means the truth is
//!    unknown ([`Error::Unavailable`]); the holder must then act as if it may be
//!    lost once its deadline passes.
//! 4. **Read** never mutates. **Release** touches only the caller's own live
//!    grant; releasing a lost grant is an `Ok` no-op that leaves the new holder
//!    alone.
//! 5. **Time authority** is the backend (etcd lease TTL, NATS message TTL,
//!    MongoDB `$$NOW`). Where the service has no usable clock (object stores), a
//!    foreign lease may be taken over only after the taker saw it unchanged for
//!    at least one TTL on its own monotonic clock
//!    ([`TimeAuthority::LocalObservation`]). A remote timestamp is never
//!    compared with the local clock.
//! 6. **Holder-side fence.** Each [`Grant`] knows the local monotonic instant at
//!    which the request that established or last renewed it was *sent*;
//!    `deadline = sent + safe fraction of TTL` (default 2/3, see [`Timing`]);
//!    `may_write()` is false after it and after loss. Default renew interval
//!    TTL/3, jittered.
//! 7. **TTL** is rounded up to the backend's granularity, 0 counts as the
//!    minimum, and the effective TTL is reported in the grant ([`TtlRule`]).
//! 8. **Payload**: opaque bytes stored with the grant, returned by read,
//!    replaceable on renew; at most [`MAX_PAYLOAD_LEN`] bytes, larger payloads
//!    are refused with [`Error::PayloadTooLarge`].
//! 9. **Capabilities** are described per backend ([`Capabilities`]: time
//!    authority, TTL granularity, watch support, exclusion strength, fence
//!    scope) so callers and the conformance suite branch on them instead of on
//!    backend names.
//! 10. **Bad input** gets a clear error and changes nothing: invalid keys, TTLs
//!     out of range, oversize payloads, a record in the store that does not
//!     parse ([`Error::CorruptRecord`], never treated as free). No panics in
//!     library code.
//! 11. **A term is a grant, end to end.** Everything a holder does — renew,
//!     release, break, its writes at the resource — carries the identity of
//!     the term that was granted, and can never touch a later term, even of
//!     the same process: a holder id names one term ([`HolderId::term`] draws
//!     one per acquire from a longer-lived name), so a late release of term 1
//!     leaves term 2 alone, and term 2's fence is strictly above term 1's.
//!     Two tasks that share one keeper never both hold one key.
//! 12. **Nothing outlives the lease it ran under.** No work and no process
//!     started under a lease runs after the lease is released, resigned or
//!     past its write deadline.
//!
//! # Why these rules
//!
//! A lease alone cannot stop a holder that was paused (GC, swap, a stopped VM)
//! past its expiry from writing: only the resource can, by rejecting writes
//! whose fence is lower than one it has already seen. The holder-side deadline
//! narrows the window in which that can happen; the fence closes it.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod audit;
mod backend;
mod capabilities;
mod error;
mod fence;
mod grant;
mod holder;
mod key;
mod layer;
mod payload;
#[cfg(feature = "serde")]
mod serde_impls;
mod timing;
#[cfg(feature = "url")]
#[cfg_attr(docsrs, doc(cfg(feature = "url")))]
pub mod url;

pub use audit::AuditRecord;
pub use backend::{BoxFuture, BreakNote, Broken, LastBreak, LeaseBackend, CONTENTION_ATTEMPTS};
pub use capabilities::{Capabilities, Exclusion, FenceScope, TimeAuthority, TtlRule};
pub use error::{BoxError, Error, ErrorChain, Result};
pub use fence::Fence;
pub use grant::{
    Acquire, AcquireRequest, Grant, Holding, LeaseState, Renewal, Version, DEFAULT_TTL,
};
pub use holder::{HolderId, MAX_HOLDER_LEN};
pub use key::{LeaseKey, MAX_KEY_LEN};
pub use layer::LeaseLayer;
pub use payload::{Payload, MAX_PAYLOAD_LEN};
pub use timing::Timing;

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
