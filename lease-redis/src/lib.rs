//! Distributed leases with fencing tokens on Redis 7 and Valkey, judged on
//! the server's clock.
//!
//! [`RedisBackend`] implements [`lease_core::LeaseBackend`] with one
//! server-side script per operation (one round trip, atomic on the
//! server): the lease is a key with the server's own expiry (`PX`), its
//! fence comes from a counter kept beside it that neither a release, an
//! expiry nor a deletion of the lease key resets, and waiting acquirers are
//! woken by the scripts' `PUBLISH`. See the README (below, under *How it
//! works*) for the keys, the scripts, what each persistence setting does to
//! fences, and TLS.
//!
//! ```no_run
//! use std::time::Duration;
//! use lease_core::{Acquire, HolderId, LeaseBackend, LeaseKey};
//! use lease_redis::{RedisBackend, RedisConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! let config = RedisConfig::new("app:lease:").default_ttl(Duration::from_secs(15));
//! let leases = RedisBackend::connect("redis://127.0.0.1:6379/0", config).await?;
//! let me = HolderId::random();
//! if let Acquire::Granted(grant) = leases.try_acquire(leases.request(LeaseKey::new("jobs/a")?, me)).await? {
//!     println!("leader with fence {}", grant.fence());
//!     leases.release(&grant).await?;
//! }
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod admin;
mod backend;
mod client;
mod config;
mod connect;
mod errors;
mod notify;
mod operations;
mod persistence;
mod record;
mod scripts;
mod tls;
mod unsettled;
mod watch;

pub use backend::RedisBackend;
pub use config::{
    RedisConfig, TlsConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT,
    MAX_PREFIX_LEN,
};
pub use persistence::Persistence;

/// The README's examples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
