//! Distributed leases with fencing tokens on PostgreSQL, judged on the
//! server's clock.
//!
//! [`PostgresBackend`] implements [`lease_core::LeaseBackend`] on one table
//! (one row per key, never deleted) and is held to the shared contract by
//! the `lease-conformance` suite. Acquire, renew and release are one SQL
//! statement each; read never writes; the server's `now()` judges every
//! deadline; waiting acquirers are woken by `LISTEN`/`NOTIFY`. See the
//! README (below, under *How it works*) for the statements, the table, the
//! behaviour behind PgBouncer, performance (the statement cache) and TLS.
//!
//! ```no_run
//! use std::time::Duration;
//! use lease_core::{Acquire, HolderId, LeaseBackend, LeaseKey};
//! use lease_postgres::{PostgresBackend, PostgresConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! let config = PostgresConfig::new("leases").default_ttl(Duration::from_secs(15));
//! let leases = PostgresBackend::connect("postgres://app@127.0.0.1/app", config).await?;
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
mod config;
mod connect;
mod errors;
mod function;
mod install;
mod notify;
mod operations;
mod record;
mod statement;
mod tls;
mod watch;

pub use backend::PostgresBackend;
pub use config::{PostgresConfig, TlsConfig, DEFAULT_REQUEST_TIMEOUT, MAX_TABLE_LEN};

/// The README's examples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
