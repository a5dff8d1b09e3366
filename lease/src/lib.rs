#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod connect;
mod connection;
mod error;
#[cfg(feature = "nats")]
mod nats_tls;
mod scheme;
pub mod url;

pub use connect::{connect, Connect, DEFAULT_TIMEOUT};
pub use connection::Connection;
pub use error::ConnectError;
pub use url::{BackendKind, BackendUrl};

pub use lease_core::*;
pub use lease_keeper::*;

/// Typed records: serde-encoded payloads.
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use lease_keeper::typed;

/// etcd: lease grant plus transaction, fence = the key's create revision.
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use lease_etcd as etcd;

/// NATS JetStream KV with per-message TTLs, fence = stream sequence.
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use lease_nats as nats;

/// Object stores (S3 and friends) by conditional PUT.
#[cfg(feature = "s3")]
#[cfg_attr(docsrs, doc(cfg(feature = "s3")))]
pub use lease_s3 as s3;

/// MongoDB, judged on the server's clock.
#[cfg(feature = "mongo")]
#[cfg_attr(docsrs, doc(cfg(feature = "mongo")))]
pub use lease_mongo as mongo;

/// PostgreSQL: one row per key, judged on the server's clock, woken by `LISTEN`/`NOTIFY`.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use lease_postgres as postgres;

/// Redis 7 and Valkey: one script per operation, judged on the server's clock.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use lease_redis as redis;

/// The in-memory backend with an injectable clock and fault hooks.
#[cfg(feature = "fake")]
#[cfg_attr(docsrs, doc(cfg(feature = "fake")))]
pub use lease_fake as fake;

/// The workspace README's examples, compiled and run as doctests.
#[cfg(all(doctest, feature = "fake"))]
#[doc = include_str!("../../README.md")]
pub struct WorkspaceReadme;
