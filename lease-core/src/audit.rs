//! The audit record a [`break_lease`](crate::LeaseBackend::break_lease)
//! leaves, as every backend of the workspace writes it.
//!
//! A break is an operator's decision to end someone else's grant, so it
//! leaves a record outside the lease key space saying who did it, why, and
//! what it ended. Each backend stores the record in its own way (an etcd key,
//! a NATS KV entry, an object, a MongoDB document: see each backend's docs
//! for where), but the fields and their names are the same everywhere, so
//! one tool can read the audit trail of any backend. This module names them.
//!
//! # Fields
//!
//! | field | type | meaning |
//! | --- | --- | --- |
//! | [`FORMAT`] | string | `"<backend>-audit/1"`, e.g. `lease-etcd-audit/1` (the MongoDB backend, whose records live in a collection of their own, writes none) |
//! | [`ACTION`] | string | always [`ACTION_BREAK`] |
//! | [`KEY`] | string | the lease key that was broken |
//! | [`BY`], [`REASON`], [`AT_UNIX_MS`] | string, string, integer | the [`BreakNote`](crate::BreakNote): who broke it, why, and when (the breaker's wall clock, milliseconds since the Unix epoch) |
//! | [`PREVIOUS`] | object or null | the grant the break ended, null when the key was free or held something that is not a lease record |
//! | [`PREVIOUS`]`.`[`HOLDER`] | string | its holder id |
//! | [`PREVIOUS`]`.`[`FENCE`] | integer | its fence |
//! | [`PREVIOUS`]`.`[`TTL_MS`] | integer | its TTL in milliseconds |
//! | [`PREVIOUS`]`.`[`PAYLOAD_LEN`] | integer | the length of its payload in bytes (the payload itself is not kept) |
//! | [`REMOVED_CORRUPT_RECORD`] | bool | whether the break removed (or replaced) a value at the key that is not a lease record: corrupt, or written by someone else |
//! | [`REMOVED`] | object or null | what such a value held, bounded; null when [`REMOVED_CORRUPT_RECORD`] is false |
//! | [`REMOVED`]`.`[`LEN`] | integer | its whole length in bytes |
//! | [`REMOVED`]`.`[`HEAD_BASE64`] | string | its first [`REMOVED_HEAD_MAX`] bytes (all of it when shorter), standard base64 with padding |
//! | [`REMOVED`]`.`[`TRUNCATED`] | bool, optional | present and true only when the store stated a larger size than it sent |
//!
//! Backends add fields of their own where they need them (the NATS and
//! MongoDB backends record a `seq` that orders the breaks of one key; the
//! MongoDB backend adds `at` as a date). Readers ignore fields they do not
//! know, so records may gain fields; a backend's
//! [`last_break`](crate::LeaseBackend::last_break) reads only the note and
//! `previous`, never the bytes in [`REMOVED`].

/// The record's format and version, `"<backend>-audit/1"`.
pub const FORMAT: &str = "format";
/// What the record is about; always [`ACTION_BREAK`].
pub const ACTION: &str = "action";
/// The value of [`ACTION`] in the record of a break.
pub const ACTION_BREAK: &str = "break";
/// The lease key that was broken.
pub const KEY: &str = "key";
/// Who broke it ([`BreakNote::by`](crate::BreakNote::by)).
pub const BY: &str = "by";
/// Why ([`BreakNote::reason`](crate::BreakNote::reason)).
pub const REASON: &str = "reason";
/// When, by the breaker's clock
/// ([`BreakNote::at_unix_ms`](crate::BreakNote::at_unix_ms)).
pub const AT_UNIX_MS: &str = "at_unix_ms";
/// The grant the break ended (an object), or null.
pub const PREVIOUS: &str = "previous";
/// In [`PREVIOUS`]: the holder id.
pub const HOLDER: &str = "holder";
/// In [`PREVIOUS`]: the fence.
pub const FENCE: &str = "fence";
/// In [`PREVIOUS`]: the TTL in milliseconds.
pub const TTL_MS: &str = "ttl_ms";
/// In [`PREVIOUS`]: the payload's length in bytes.
pub const PAYLOAD_LEN: &str = "payload_len";
/// Whether the break removed or replaced a value that is not a lease record.
pub const REMOVED_CORRUPT_RECORD: &str = "removed_corrupt_record";
/// What that value held, bounded (an object), or null.
pub const REMOVED: &str = "removed";
/// In [`REMOVED`]: the value's whole length in bytes.
pub const LEN: &str = "len";
/// In [`REMOVED`]: its first [`REMOVED_HEAD_MAX`] bytes, standard base64.
pub const HEAD_BASE64: &str = "head_base64";
/// In [`REMOVED`], optional: true when the store stated a larger size than
/// the bytes it sent.
pub const TRUNCATED: &str = "truncated";
/// How many bytes of a removed value [`HEAD_BASE64`] keeps at most.
pub const REMOVED_HEAD_MAX: usize = 4096;
