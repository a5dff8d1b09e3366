//! Distributed leases with fencing tokens on NATS JetStream KV.
//!
//! `lease-nats` implements the [`lease_core::LeaseBackend`] contract on a
//! JetStream key-value bucket, using the per-message TTLs of nats-server ≥ 2.11
//! so that the **server** is the time authority: a grant's message carries a
//! `Nats-TTL`, and when the holder stops renewing, the server removes it and
//! writes a delete marker that every watcher sees.
//!
//! * The **fence** is the stream sequence of the message that created the grant:
//!   it rises across release, expiry, takeover and server restarts, and orders
//!   grants of every key of the bucket
//!   ([`FenceScope::Global`](lease_core::FenceScope::Global)).
//! * **Acquire**, **renew** and **release** are each one conditional JetStream
//!   publish (`Nats-Expected-Last-Subject-Sequence`), so a stale holder can never
//!   overwrite a newer one; renew and acquire also set `Nats-TTL` (async-nats'
//!   KV `update` cannot).
//! * TTLs are whole seconds, at least 1 s. Servers older than 2.11 are refused
//!   at connection with an error naming the version needed.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use lease_core::{Acquire, HolderId, LeaseBackend, LeaseKey, Renewal};
//! use lease_nats::{NatsBackend, NatsConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! let config = NatsConfig::new("leases").default_ttl(Duration::from_secs(10));
//! let backend = NatsBackend::connect("nats://127.0.0.1:4222", config).await?;
//! let key = LeaseKey::new("cron/nightly-report")?;
//! let me = HolderId::random();
//!
//! match backend.try_acquire(backend.request(key, me)).await? {
//!     Acquire::Granted(grant) => {
//!         // Stamp every write with the fence; stop writing when may_write() turns false.
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
//! # Storage layout
//!
//! The bucket must exist, or be created by [`NatsBackend::connect`] when
//! [`NatsConfig::create_bucket`] asks for it, with history 1, file storage,
//! message TTLs allowed and subject delete markers ([`NatsConfig::marker_ttl`]).
//! A bucket kept in memory is refused: its sequence, the fence counter, would
//! start again at 1 with the server. Each key's value is a small record
//! (`lease-nats/1` header line with holder, fence and TTL, then the payload
//! bytes); a value in any other shape is reported as
//! [`Error::CorruptRecord`](lease_core::Error::CorruptRecord), never as free.
//! A release leaves a purge marker with a TTL (at least the released grant's),
//! so released keys do not pile up.
//! One message without TTL, the anchor on the key [`ANCHOR_KEY`], keeps the
//! stream from ever being empty: nats-server has, in several versions, lost an
//! empty stream's last sequence on restart. And a running client refuses a
//! fence at or below a stream sequence it has already seen (a restored or
//! recreated bucket).
//!
//! # Clocks and restores
//!
//! * nats-server judges message TTLs — a grant's expiry — on its wall clock.
//!   Let it slew (chrony, ntpd), not step: a step forward by `s` expires every
//!   grant `s` early, and a holder keeps writing until its write deadline,
//!   2/3 of the TTL after its renewal was sent, so a forward step must stay
//!   below a third of the TTL. A step back only lengthens grants. (The fault
//!   runs cannot step a test nats-server's clock: Go reads the clock through
//!   the vDSO, out of reach of libfaketime; the same rule is shown on the
//!   MongoDB backend, whose server clock they do step.)
//! * Restoring the bucket's stream from a backup (`nats stream restore`)
//!   rewinds its sequence, which is the fence counter. A client running
//!   through the restore refuses the lower fences; one started after it
//!   cannot tell. Before any holder starts again, move the stream's sequence
//!   past every fence handed out before the restore, e.g. by purging the
//!   stream up to a sequence above the highest fence issued
//!   (`nats stream purge KV_<bucket> --seq N`: the next write gets sequence
//!   N), which also frees every key.

#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod admin;
mod backend;
mod cache;
mod conditional;
mod config;
mod connect;
mod errors;
mod operations;
mod record;
mod watch;

pub use async_nats;
pub use backend::NatsBackend;
pub use config::NatsConfig;
pub use connect::{check_server_version, ANCHOR_KEY, MIN_SERVER_VERSION};

/// The README's example, compiled as a doc test so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
