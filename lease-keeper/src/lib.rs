//! Keeping leases: background renewal with self-fencing, waiting acquire,
//! loss notification and [`LeaseGroup`], on any [`LeaseBackend`](lease_core::LeaseBackend).
//!
//! `lease-core` says what one request does; this crate keeps a lease alive
//! between requests:
//!
//! * [`Keeper`] acquires on one backend as one holder: [`Keeper::try_acquire`]
//!   at once, [`Keeper::acquire`] waiting — woken by the backend's watch where
//!   [`Capabilities::watch`](lease_core::Capabilities::watch) says it has one,
//!   polling with jittered backoff otherwise, and re-verifying every wake-up
//!   with an acquire attempt.
//! * [`Lease`] renews itself on a tokio task at the jittered renew interval of
//!   its [`Timing`](lease_core::Timing) (default TTL/3 ± 10%).
//!   [`may_write()`](LeaseView::may_write) turns false at the deadline counted from
//!   the send instant of the last successful renewal (default 2/3 TTL) even if
//!   the backend never answers, and on loss; [`lost()`](LeaseView::lost) resolves
//!   with the [`LossReason`]; [`set_payload`](LeaseView::set_payload) goes out with
//!   the next renewal; [`release()`](Lease::release) gives it up; a drop never
//!   blocks (best-effort release in the background, expiry is the backstop).
//!   What a lease knows about itself is its [`LeaseView`], the same for a
//!   [`Lease`] and a [`GroupLease`] (both dereference to it);
//!   [`writable()`](LeaseView::writable) is `may_write()` as a
//!   `tokio::sync::watch`, for readiness probes.
//! * [`LeaseGroup`]: many leases refreshed together that share one fate —
//!   one scheduler refreshes them 0.3–0.55 TTL after their last refresh,
//!   concurrently, an optional callback supplying each new payload; losing
//!   one releases the others and reports [`LeaseAbandoned`] naming the lost
//!   keys.
//! * [`Election`]: leader election on one key. [`campaign`](Election::campaign)
//!   waits to lead and returns a [`Leadership`] (the kept lease, with its
//!   fence); [`Leadership::proclaim`] replaces the advertised value,
//!   [`Leadership::resign`] hands over at once, [`Leadership::run`] runs work
//!   only while leading and drops it by the write deadline;
//!   [`Election::observe`] reports every change of leader, "no leader"
//!   included.
//! * With the `serde` feature, `typed` encodes records as payloads.
//!
//! Every acquire, renewal failure, loss and release is a `tracing` span or
//! event carrying key, holder and fence — never the payload.
//!
//! # Why a crate of its own
//!
//! `lease-core` stays dependency-free and runtime-agnostic: every backend and
//! every user pays for it. Keeping a lease needs a runtime to renew on (tokio)
//! and somewhere to report (tracing). A separate crate keeps both out of the
//! core and out of the backends; a user who drives renewals by hand never
//! compiles them.
//!
//! # Clocks
//!
//! Deadlines and schedules are on tokio's clock ([`tokio::time::Instant`]), so
//! tests can run them on a paused clock. The deadline is counted from an
//! instant taken just before the request was handed to the backend, and the
//! kept [`Grant`](lease_core::Grant) carries that same instant: a lease's
//! deadline is its grant's [`deadline()`](lease_core::Grant::deadline),
//! computed once, by [`Timing::deadline`](lease_core::Timing::deadline).
//!
//! # Example
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use lease_core::LeaseKey;
//! use lease_keeper::Keeper;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let keeper = Keeper::new(Arc::new(lease_fake::Fake::new())); // or etcd, NATS, S3, MongoDB, PostgreSQL
//! let key = LeaseKey::new("jobs/compactor")?;
//! let lease = keeper
//!     .acquire(&key)
//!     .ttl(Duration::from_secs(10))
//!     .wait(Duration::from_secs(60))
//!     .await?;
//! while lease.may_write() {
//!     // write, stamped with lease.fence()
//!     # break;
//! }
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod acquire;
mod clock;
mod election;
mod error;
mod group;
mod instrument;
mod keeper;
mod key;
mod lease;
mod loss;
pub mod metrics;
mod renew;
pub mod semaphore;
pub mod shared;
mod slots;
mod state;
mod timetable;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod typed;
mod view;
mod work;

pub use acquire::{AcquireFuture, Acquiring, Backoff, TryAcquiring};
pub use election::{Campaign, Election, Leader, Leadership, Observer, ProclaimError, Resigner};
pub use error::{AcquireError, LeaseAbandoned};
pub use group::{
    GroupLease, GroupPermitSide, GroupSharedSide, LeaseGroup, RefreshFn, GROUP_REFRESH_MAX,
    GROUP_REFRESH_MIN,
};
pub use instrument::InstrumentedBackend;
pub use keeper::Keeper;
pub use key::IntoLeaseKey;
pub use lease::Lease;
pub use loss::LossReason;
pub use semaphore::{PermitSide, MAX_PERMITS};
pub use shared::{ExclusiveSide, SharedLease, SharedSide, MAX_SHARED, SHARED_HOLDER};
pub use state::LossWatch;
pub use view::LeaseView;
pub use work::WorkEnded;

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
