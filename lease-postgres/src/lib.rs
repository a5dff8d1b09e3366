//! Distributed leases with fencing tokens on PostgreSQL, judged on the
//! server's clock.
#![deny(missing_docs)]

mod admin;
mod backend;
mod config;
mod errors;
mod notify;
mod record;

pub use backend::PostgresBackend;
pub use config::{PostgresConfig, TlsConfig, DEFAULT_REQUEST_TIMEOUT, MAX_TABLE_LEN};
