//! Distributed leases with fencing tokens on MongoDB, judged on the server's
//! clock.
//!
//! Two things live here:
//!
//! * [`MongoBackend`]: the keyed lease of the `lease` workspace, implementing
//!   [`lease_core::LeaseBackend`] and held to the shared contract by the
//!   `lease-conformance` suite.
//! * [`store_lock`]: a second, separate product — a writer/fsck store lock
//!   ([`StoreLeases`](store_lock::StoreLeases)): many shared *writer* leases
//!   against one exclusive *fsck* lease, with an insert-then-check handshake
//!   and the layout generation a writer observes. It is not a
//!   [`lease_core::LeaseBackend`] and the conformance suite does not check it.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use lease_core::{Acquire, HolderId, LeaseBackend, LeaseKey, Renewal};
//! use lease_mongo::{MongoBackend, MongoConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_core::Error> {
//! let config = MongoConfig::new("myapp").collection("leases").default_ttl(Duration::from_secs(15));
//! let leases = MongoBackend::connect("mongodb://127.0.0.1:27017", config).await?;
//! let me = HolderId::random(); // keep one per process and reuse it on retries
//!
//! match leases.try_acquire(leases.request(LeaseKey::new("cron/nightly")?, me)).await? {
//!     Acquire::Granted(grant) => {
//!         // Stamp every write with the fence; stop writing once may_write() is false.
//!         println!("leader with fence {}", grant.fence());
//!         if let Renewal::Renewed(grant) = leases.renew(&grant, None).await? {
//!             leases.release(&grant).await?;
//!         }
//!     }
//!     Acquire::Held(h) => println!("{} leads (fence {})", h.holder, h.fence),
//! }
//! // Before the runtime ends: the driver's clean-up of a dropped client
//! // could otherwise race the runtime's teardown (see `shutdown`).
//! leases.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # How the keyed lease works
//!
//! One document per key in the collection (`_id` = the key), never deleted
//! by this crate. Every operation is one request:
//!
//! | operation | request | decided on the server by |
//! |---|---|---|
//! | acquire | `findAndModify` with an update pipeline, `upsert` | take if new, released, expired (`expires_ms ≤ $$NOW`) or ours, and only a well-formed record; a new grant raises `fence` in the same write |
//! | renew | `findAndModify`, filter (key, holder, fence), pipeline | extend from `$$NOW` only while still live; when it no longer matches, one `find` tells a loss from a corrupt record |
//! | release | `update` with filter (key, holder, fence, well formed) | clear the holder; the document and its fence counter stay |
//! | read | `aggregate` (`$match` + `$$NOW`) | never writes; remaining time from `$$NOW` |
//! | last break | `find` of the document's `last_break` stamp | never writes; the audit records only when the document has no stamp |
//!
//! * **A refused acquire still writes**: it stamps `at_ms` with this
//!   request's `$$NOW` so that the answer (and the holder's remaining time)
//!   is judged on the server's clock within the same round trip. Waiters that
//!   poll often can poll with `read` (which never writes) and acquire when
//!   it shows the key free.
//! * **Time authority** is the server's `$$NOW`, turned into milliseconds
//!   (`$toLong`) inside the pipeline; no client clock is ever compared with
//!   it. Liveness is decided inside update pipelines and read back from the
//!   returned document, never in a query filter.
//! * **Fences** never go backwards. A new grant's fence is the larger of
//!   one above the `fence` field of the key's document (which release only
//!   marks free) and the server's clock: `$$NOW` in milliseconds × 1000
//!   (about 1.8 × 10^15 today; below 2^53 until the year 2255). So a grant
//!   on a document that was deleted or rewound behind this library's back is
//!   still above every earlier fence of the key: fewer than 1000 grants of
//!   one key fit in a millisecond, each being a majority, journaled write.
//!   That rests on the server's clock: it must not be stepped back (nor a
//!   failover land on a primary whose clock is behind) by more than the time
//!   since the key's last grant, and it must have moved on by a millisecond
//!   between the last grant before such an outside change and the first one
//!   after it. A fence is no longer "one more than the last" — compare
//!   fences, never count with them.
//!
//!   What operators must not do, even so: delete or rewrite the documents of
//!   **live** leases (`deleteOne`, a `deleteMany` cleanup, a restore with
//!   `mongorestore --drop`) — the key is free at once, and the holder whose
//!   document vanished keeps writing until its deadline: only fenced writes
//!   stop it. Never put a TTL index on the collection (it deletes documents
//!   on a schedule; [`MongoBackend::new`] refuses a collection that has
//!   one), and do not restore a dump while the server's clock is set back.
//!   To end a lease, use [`break_lease`](lease_core::LeaseBackend::break_lease)
//!   (`lease break`), which keeps the fence and leaves an audit record.
//! * **Clock steps.** `$$NOW` judges expiry, so the server's clock must slew
//!   (chrony, ntpd), not step: a step forward by `s` expires every grant `s`
//!   early, and a holder keeps writing until its write deadline, 2/3 of the
//!   TTL after its renewal was sent — so a forward step must stay below a
//!   third of the TTL. A step back only lengthens grants (and lowers the
//!   clock floor of fences, see above). The fault runs step a test server's
//!   clock: steps of TTL/4 keep every write window exclusive; steps of a
//!   whole TTL let grants overlap, and only the fenced resource refuses the
//!   stale writes.
//! * **Restores.** `mongorestore` of an older dump rewinds the `fence` fields
//!   it writes back; the clock floor keeps the next grants above every
//!   earlier fence as long as the clock has not been set back. Restored
//!   documents of grants that were live when the dump was taken read as held
//!   again until their TTL (counted from their `at_ms`) runs out: break them
//!   or wait one TTL before new holders start.
//! * **Break** stamps the lease document with `last_break` (the note, the
//!   previous holding, the audit record's id) in the same write that ends
//!   the grant, then writes the audit record to `{collection}_audit`. If
//!   that write fails, the error is [`lease_core::Error::Unavailable`] and
//!   says the break was applied; retry with the *same*
//!   [`BreakNote`](lease_core::BreakNote): the retry recognises its own
//!   break and only writes the missing audit record — it never ends the
//!   next holder's grant. A new note is a new break. A free key is
//!   stamped too, and a key without a document gets a released record
//!   carrying the stamp.
//! * **Audit records** (one per break, `_id` as named in
//!   [`Broken::audit`](lease_core::Broken::audit)) hold `action: "break"`,
//!   `key`, the note (`by`, `reason`, `at_unix_ms`, `at`), `previous` (the
//!   ended grant's holder, fence, TTL and payload length, or null), `seq`,
//!   `removed_corrupt_record` and `removed`. When the break replaced a
//!   document that was not a lease record (corrupt or foreign), `removed`
//!   keeps what was there, bounded: `{ len, head_base64 }`, the length of
//!   that document as BSON and its first 4096 bytes in base64 (standard,
//!   padded — all of it when shorter; decode it and read it with `bsondump`
//!   or any BSON library), in the schema every backend shares
//!   ([`lease_core::audit`]). These are the bytes of the
//!   very document the replacing write was guarded on, as the server sent
//!   them; the break's stamp keeps them too, so a retry that only writes a
//!   missing audit record still records them. `removed` is null when
//!   nothing corrupt was replaced; `last_break` does not read it.
//! * **Last break**: [`last_break`](lease_core::LeaseBackend::last_break)
//!   reads the stamp back (holder, fence, note), one `find`. Acquire, renew
//!   and release leave the stamp alone, so it still names the last break
//!   after the key was taken again. A document without one (deleted and
//!   re-created behind the library's back, or broken by an earlier version)
//!   is answered from the key's audit records, newest first by their `seq`,
//!   which only rises (like a fence: one above the previous stamp's, at
//!   least the server's clock × 1000). A malformed stamp or audit record is
//!   [`lease_core::Error::CorruptRecord`] and is left as it is. (A version
//!   before this one did not stamp breaks of free keys: on a document it
//!   stamped earlier, such a later break is not seen.)
//! * **Durability**: the collection is used with write concern
//!   `{w: "majority", j: true}`, read concern `majority` and the primary
//!   only, whatever the connection string says. A grant acknowledged before
//!   its journal write could be lost in a crash, and the restarted server
//!   would hand the same fence out again (SecantusDB, the test server, loses
//!   every `w: 1` write on `kill -9`; with `j: true` none).
//! * **Contention**: two upserts of a new key race on the unique `_id`; the
//!   loser's duplicate-key error (E11000, reported as a command error inside
//!   `findAndModify`) means someone else won. The acquire then runs once more
//!   against the winner's document and reports it as
//!   [`Acquire::Held`](lease_core::Acquire::Held) — never an error.
//! * **Corrupt records**: queries match only documents carrying the schema
//!   marker `lease_schema: "lease-mongo/keyed-lease/2"` (or, on a record
//!   written by an earlier version, `v: 1` — accepted only when every lease
//!   field is well formed, since `v` is a common field name). Acquire, renew,
//!   release and read share one definition of a well-formed record (types
//!   and ranges of every field, a valid holder id, the payload limit): the
//!   pipelines leave anything else byte-identical and the caller gets
//!   [`lease_core::Error::CorruptRecord`], never a free key. Only
//!   [`break_lease`](lease_core::LeaseBackend::break_lease) replaces it.
//!   Records this version writes are refused as corrupt by earlier versions
//!   (they never take them over): upgrade every client of a collection.
//! * **Errors**: transport failures, timeouts and server state changes
//!   (step-down, shutdown) are [`lease_core::Error::Unavailable`] — the
//!   request may have been applied; retry with the same holder id, which gets
//!   the same grant back. Other refusals are [`lease_core::Error::Backend`].
//! * **Bounded time**: every operation ends within
//!   [`MongoConfig::request_timeout`] (default 5 s), which is also the
//!   server's `wtimeout` for the majority write concern; past it the outcome
//!   is unknown ([`lease_core::Error::Unavailable`]). [`MongoBackend::connect`]
//!   fails at once, with the driver's reason (say, a refused connection),
//!   when no host of the URI can be reached. A [`Client`](mongodb::Client)
//!   you build yourself for [`MongoBackend::new`] keeps its own
//!   `serverSelectionTimeoutMS` (30 s unless set): set it at or below the
//!   request timeout to get the driver's reason rather than a timeout.
//!
//! Capabilities: [`BackendClock`](lease_core::TimeAuthority::BackendClock),
//! TTLs in whole milliseconds from 1 s to 1 day,
//! [`Atomic`](lease_core::Exclusion::Atomic) exclusion,
//! [`PerKey`](lease_core::FenceScope::PerKey) fences, no watch (change streams
//! need a replica set; waiting acquirers poll), payloads up to
//! [`lease_core::MAX_PAYLOAD_LEN`].
//!
//! Needs MongoDB 4.4 or later (update pipelines, `$$NOW`, `$binarySize`); tested against
//! SecantusDB, a wire-compatible server, and on MongoDB 6.0+ when
//! `LEASE_TEST_MONGODB_URI` points at one.
//!
//! # The writer/fsck protocol
//!
//! ```no_run
//! use lease_mongo::store_lock::{StoreLeases, StoreLockTiming};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lease_mongo::store_lock::StoreLeaseError> {
//! let store = StoreLeases::connect("mongodb://127.0.0.1:27017", "store", StoreLockTiming::default()).await?;
//!
//! // A writer: registered, then checked against fsck.
//! let writer = store.acquire_writer("ingest@host-a").await?;
//! let layout = writer.generation(); // changes whenever an fsck ran
//! writer.refresh_heartbeat(false).await?; // at least every refresh_interval
//! writer.release().await?;
//!
//! // fsck: installs the singleton, then waits for registered writers to leave.
//! let fsck = store.acquire_fsck("fsck@host-b", false).await?;
//! fsck.release().await?;
//! # let _ = layout;
//! # Ok(())
//! # }
//! ```
//!
//! `force` on [`StoreLeases::acquire_fsck`](store_lock::StoreLeases::acquire_fsck) and
//! [`StoreLeases::clear_stale_lock`](store_lock::StoreLeases::clear_stale_lock) are administrative assertions that an
//! owner is dead. **Using them against a still-running owner can corrupt the
//! store; `clear_stale_lock` has no fencing.** See [`StoreLeases`](store_lock::StoreLeases).

#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod admin;
mod backend;
mod config;
mod connect;
mod errors;
mod extras;
mod operations;
mod record;

pub use backend::MongoBackend;
pub use config::{MongoConfig, DEFAULT_REQUEST_TIMEOUT};
pub use extras::store_lock;
/// The MongoDB driver this crate is built on, for [`MongoBackend::new`]'s
/// client and [`MongoBackend::connect_with_options`]' options.
pub use mongodb;

/// The README's examples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
