//! Distributed leases with fencing tokens on etcd.
//!
//! [`EtcdBackend`] implements the `lease-core` contract
//! ([`LeaseBackend`](lease_core::LeaseBackend)) on etcd's leases and
//! transactions; [`provider::EtcdProvider`] offers the same code through a
//! single-lease `Acquire / Renew / Read` interface, its acquire
//! answering `(granted, Status)` as Go leader-election code expects.
//!
//! * etcd is the time authority: a grant is an etcd lease with the TTL
//!   (rounded up to whole seconds, at least the server's minimum), and etcd
//!   deletes the key when it expires. etcd raises every TTL below
//!   ⌈1.5 × election timeout⌉ (2 s with the default 1 s election timeout);
//!   [`EtcdBackend::connect`] asks the server for a 1 s lease and reports
//!   what it really granted as the minimum in the capabilities, so grants
//!   state the TTL the server keeps.
//! * The fence is the key's create revision: cluster-wide monotonic, so it
//!   also orders grants of different keys ([`FenceScope::Global`](lease_core::FenceScope)).
//! * With [sessions](#sessions) (the default), acquire, a refused
//!   acquire and release cost 1 request each, and renew a keep-alive
//!   shared by the session's keys plus a watch progress request shared
//!   the same way on a one-member cluster (a verifying read on a larger
//!   one); read costs 2.
//!   Without them, acquire costs 2 round trips (a lease grant, then one
//!   transaction), renew 1 (a keep-alive and a verifying read, sent
//!   together) and release 2 (a guarded delete, then a revoke).
//! * The payload (at most 64 KiB) is stored with the holder in the key's value;
//!   a value this crate did not write is a [`CorruptRecord`](lease_core::Error::CorruptRecord),
//!   never a free key.
//! * Closing or dropping the client never revokes a held lease.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use lease_core::{Acquire, AcquireRequest, HolderId, LeaseBackend, LeaseKey, Renewal};
//! use lease_etcd::{EtcdBackend, EtcdConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! let config = EtcdConfig::new(["http://127.0.0.1:2379"]).key_prefix("myapp/leases/");
//! let etcd = EtcdBackend::connect(config).await?;
//!
//! let key = LeaseKey::new("cron/nightly-report")?;
//! let me = HolderId::random(); // keep it: retries must reuse it
//! let req = AcquireRequest::new(key, me).ttl(Duration::from_secs(10));
//! match etcd.try_acquire(req).await? {
//!     Acquire::Granted(grant) => {
//!         // Stamp every write with grant.fence(); stop when may_write() is false.
//!         println!("leader with fence {}", grant.fence());
//!         match etcd.renew(&grant, None).await? {
//!             Renewal::Renewed(g) => etcd.release(&g).await?,
//!             Renewal::Lost => println!("lost it: stop writing"),
//!         }
//!     }
//!     Acquire::Held(h) => println!("{} holds it (fence {})", h.holder, h.fence),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Sessions
//!
//! By default ([`EtcdConfig::sessions`]) the keys one client holds with the
//! same TTL share one etcd lease (a *session*, as etcd's own
//! `concurrency.Session`): an acquire is one transaction, a refused acquire
//! too, a release one guarded delete, and a renewal a keep-alive of the
//! session lease shared by every key of the session renewing at the same
//! time (or none, when another key kept the session alive a moment ago),
//! verified by the client's watch of its prefix on a one-member cluster (a
//! progress request per batch of renewals, no request per key) and by one
//! read per key on a larger one, where a member's watch may lag a write
//! another member acknowledged. Every promise stays per key: a
//! fence per grant, a renewal after a takeover or after an outside delete of
//! the key answers `Lost`, and a release deletes only its own key and never
//! revokes the session lease. A key bound to the session lease lives at
//! least a TTL from that lease's last answered keep-alive, so a grant's
//! deadline counts from the send of that keep-alive (or lease grant): inside
//! the call when the session was last kept alive more than a sixth of the
//! TTL ago (a keep-alive then goes out beside the transaction), before the
//! call otherwise. It never claims more than the session lease gives; it
//! may give the holder up to a sixth of the TTL less time to write.
//!
//! **A key nobody renews still goes one TTL after its last renewal.** The
//! session lease lives as long as any of its keys is renewed, so the client
//! itself deletes a key of it that nobody renewed for a TTL (a grant dropped
//! without a release, an acquire or renewal cancelled half-way), with a
//! delete that removes the key only while it is still bound to the session
//! lease. Until that delete is answered the key's grants cannot be renewed
//! and the session lease is not kept alive; an acquire of the key waits.
//! Every grant this client handed out had to stop writing before then, and
//! no other client's grant lives on this client's session lease: a holder
//! id held by several clients at once (as the holders of a shared phase
//! do) is kept on an etcd lease of its own, which each of them renews.
//!
//! The trade-off: **one session's loss ends all its keys** (if the session
//! lease expires or is revoked, etcd deletes every key bound to it, and each
//! key's next renewal answers `Lost`, which is what a `LeaseGroup` does
//! anyway). `EtcdConfig::sessions(false)` (or `?sessions=false`) gives every
//! key an etcd lease of its own instead, at one more request per acquire and
//! per release.
//!
//! # Clocks and restores
//!
//! * etcd counts lease TTLs on its members' monotonic clocks: stepping a
//!   member's wall clock changes no grant. A new leader renews every etcd
//!   lease to its full TTL, so a leader change makes grants last longer,
//!   never shorter.
//! * Restoring a snapshot (`etcdutl snapshot restore`) rewinds the store's
//!   revision to the snapshot's, and a fence is a create revision: grants
//!   after such a restore would get fences already handed out before it.
//!   Restore with `--bump-revision N --mark-compacted`, N above the number of
//!   revisions written since the snapshot was taken (one billion leaves room
//!   for most clusters), so every later fence is higher than every earlier
//!   one. Keys of grants held when the snapshot was taken come back with
//!   their etcd leases, renewed to a full TTL: their holders may be long
//!   gone, or still running on a newer grant elsewhere — break them
//!   (`lease break`) or wait one TTL before new holders start.
//!
//! # TLS
//!
//! With the `tls` feature (on by default), give `https://` endpoints and a [`TlsConfig`] with the CA and, for
//! `--client-cert-auth`, a client certificate and key (PEM). The crate installs
//! rustls' ring provider as the process default if no provider is installed
//! yet, so that TLS works in binaries that link several providers.

#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod admin;
mod backend;
mod config;
mod conn;
mod connect;
mod errors;
mod extras;
mod keepalive;
mod mirror;
mod operations;
mod reads;
mod record;
mod session;
mod session_leases;
mod sweep;
mod tls;
mod watch;

pub use backend::EtcdBackend;
pub use config::{EtcdConfig, TlsConfig};
pub use conn::MAX_TTL;
pub use extras::provider;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
