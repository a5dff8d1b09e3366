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
//! | [`BY`], [`REASON`], [`AT_UNIX_MS`] | string, string, integer | the [`BreakNote`]: who broke it, why, and when (the breaker's wall clock, milliseconds since the Unix epoch) |
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
//!
//! # One record, one decoder
//!
//! [`AuditRecord`] is the record as Rust types. Every backend builds it with
//! [`AuditRecord::new`] and reads it back with one validating decoder, so a
//! record one backend accepts, every backend accepts:
//! `AuditRecord::from_json` (feature `json`) for the backends that store
//! JSON, or serde (feature `serde`) into another format (the MongoDB backend
//! stores BSON) followed by [`AuditRecord::verify`]. Without these features
//! the crate keeps no dependencies, and the type is still there to build and
//! check records.
//!
//! Decoding refuses a record whose [`ACTION`] is not [`ACTION_BREAK`], whose
//! [`KEY`] is not a lease key, a number that is negative, fractional or
//! missing, a [`PREVIOUS`] whose holder is not a holder id or whose fence is
//! 0, and a [`HEAD_BASE64`] that is not base64 or holds more than
//! [`REMOVED_HEAD_MAX`] bytes; [`AuditRecord::verify`] then refuses a record
//! of another backend's format or of another key. Decoding accepts fields it
//! does not know, a missing [`PREVIOUS`] or [`REMOVED`] (read as null), and
//! a missing [`REMOVED_CORRUPT_RECORD`] (read as whether [`REMOVED`] is
//! there), which records written before the schema was shared also spell
//! `replaced_corrupt_record` or `removed_corrupt_value`.

use crate::{BreakNote, Fence, HolderId, Holding, LastBreak, LeaseKey};

/// The record's format and version, `"<backend>-audit/1"`.
pub const FORMAT: &str = "format";
/// What the record is about; always [`ACTION_BREAK`].
pub const ACTION: &str = "action";
/// The value of [`ACTION`] in the record of a break.
pub const ACTION_BREAK: &str = "break";
/// The lease key that was broken.
pub const KEY: &str = "key";
/// Who broke it ([`BreakNote::by`]).
pub const BY: &str = "by";
/// Why ([`BreakNote::reason`]).
pub const REASON: &str = "reason";
/// When, by the breaker's clock
/// ([`BreakNote::at_unix_ms`]).
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

/// The audit record of one break, as Rust types (see the [module docs](self)
/// for the fields as stored).
///
/// With the feature `serde` it serializes to, and deserializes from, the
/// stored fields by name; deserializing validates each field (see the module
/// docs), and [`AuditRecord::verify`] then checks that the record is the one
/// asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "wire::Record", into = "wire::Record")
)]
pub struct AuditRecord {
    /// [`FORMAT`]: `"<backend>-audit/1"`; `None` in the MongoDB backend's
    /// records, which live in a collection of their own.
    pub format: Option<String>,
    /// [`KEY`]: the lease key that was broken.
    pub key: LeaseKey,
    /// [`BY`], [`REASON`] and [`AT_UNIX_MS`]: who broke it, why and when.
    pub note: BreakNote,
    /// [`PREVIOUS`]: the grant the break ended, if any.
    pub previous: Option<Previous>,
    /// [`REMOVED_CORRUPT_RECORD`]: whether the break removed or replaced a
    /// value that is not a lease record.
    pub removed_corrupt_record: bool,
    /// [`REMOVED`]: what that value held, bounded, when it was kept.
    pub removed: Option<Removed>,
    /// `seq`, a backend's own field ordering the breaks of one key (the NATS
    /// and MongoDB backends write it); `None` when the backend writes none.
    pub seq: Option<u64>,
}

/// The grant a break ended, as its audit record keeps it ([`PREVIOUS`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Previous {
    /// [`HOLDER`]: its holder id.
    pub holder: HolderId,
    /// [`FENCE`]: its fence.
    pub fence: Fence,
    /// [`TTL_MS`]: its TTL in milliseconds.
    pub ttl_ms: u64,
    /// [`PAYLOAD_LEN`]: the length of its payload in bytes.
    pub payload_len: u64,
}

impl Previous {
    /// What the record keeps of `holding`: everything but the payload's bytes.
    pub fn of(holding: &Holding) -> Self {
        Previous {
            holder: holding.holder.clone(),
            fence: holding.fence,
            ttl_ms: u64::try_from(holding.ttl.as_millis()).unwrap_or(u64::MAX),
            payload_len: u64::try_from(holding.payload.len()).unwrap_or(u64::MAX),
        }
    }
}

/// A value a break removed that was not a lease record, bounded ([`REMOVED`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Removed {
    /// [`LEN`]: its whole length in bytes.
    pub len: u64,
    /// Its first [`REMOVED_HEAD_MAX`] bytes, or all of it when shorter
    /// (stored as [`HEAD_BASE64`]).
    pub head: Vec<u8>,
    /// [`TRUNCATED`]: the store stated a larger size than the bytes it sent,
    /// so `head` comes from a part of the value only.
    pub truncated: bool,
}

impl Removed {
    /// What the record keeps of `value`, read whole.
    ///
    /// ```
    /// use lease_core::audit::{Removed, REMOVED_HEAD_MAX};
    ///
    /// let kept = Removed::of(&[7; 5000]);
    /// assert_eq!((kept.len, kept.head.len()), (5000, REMOVED_HEAD_MAX));
    /// ```
    pub fn of(value: &[u8]) -> Self {
        Removed::of_read(value, 0)
    }

    /// What the record keeps of a value of which `read` was received while
    /// the store stated `stated_len` bytes: its length is the larger of the
    /// two, and it is [`truncated`](Removed::truncated) when the store stated
    /// more than it sent.
    pub fn of_read(read: &[u8], stated_len: u64) -> Self {
        let read_len = u64::try_from(read.len()).unwrap_or(u64::MAX);
        Removed {
            len: stated_len.max(read_len),
            head: read.get(..REMOVED_HEAD_MAX).unwrap_or(read).to_vec(),
            truncated: stated_len > read_len,
        }
    }
}

impl AuditRecord {
    /// The record of a break of `key` by `note`, in the backend's `format`
    /// (`None`: the backend writes none), which ended `previous` (if any) or
    /// removed a value that is not a lease record (`removed`, if kept).
    pub fn new(
        format: Option<&str>,
        key: &LeaseKey,
        note: &BreakNote,
        previous: Option<&Holding>,
        removed: Option<Removed>,
    ) -> Self {
        AuditRecord {
            format: format.map(str::to_owned),
            key: key.clone(),
            note: note.clone(),
            previous: previous.map(Previous::of),
            removed_corrupt_record: removed.is_some(),
            removed,
            seq: None,
        }
    }

    /// The same record, with the backend's sequence number `seq`.
    pub fn with_seq(mut self, seq: u64) -> Self {
        self.seq = Some(seq);
        self
    }

    /// The record, if it is one of a break of `key` in the backend's
    /// `format` (`None`: a backend that writes none); otherwise what is wrong
    /// with it.
    pub fn verify(self, format: Option<&str>, key: &LeaseKey) -> Result<Self, String> {
        if self.format.as_deref() != format {
            return Err(format!(
                "format {}, not {}",
                shown(self.format.as_deref()),
                shown(format)
            ));
        }
        if self.key != *key {
            return Err(format!(
                "it records lease key {:?}, not {:?}",
                self.key.as_str(),
                key.as_str()
            ));
        }
        Ok(self)
    }

    /// The break this record tells of, as
    /// [`last_break`](crate::LeaseBackend::last_break) reports it.
    pub fn last_break(&self) -> LastBreak {
        let (holder, fence) = match &self.previous {
            Some(p) => (Some(p.holder.clone()), Some(p.fence)),
            None => (None, None),
        };
        LastBreak::new(holder, fence, self.note.clone())
    }
}

/// A format for an error message: quoted, or "none".
fn shown(format: Option<&str>) -> String {
    format.map_or_else(|| "none".to_owned(), |f| format!("{f:?}"))
}

#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
impl AuditRecord {
    /// The record as one line of JSON, as a backend stores it.
    ///
    /// ```
    /// use lease_core::audit::AuditRecord;
    /// use lease_core::{BreakNote, LeaseKey};
    ///
    /// let key = LeaseKey::new("jobs/nightly")?;
    /// let note = BreakNote::new("ops", "holder is stuck").with_at_unix_ms(1_700_000_000_000);
    /// let record = AuditRecord::new(Some("lease-etcd-audit/1"), &key, &note, None, None);
    /// let json = record.to_json();
    /// let bytes = json.as_bytes();
    ///
    /// let read = AuditRecord::from_json(bytes, "lease-etcd-audit/1", &key).unwrap();
    /// assert_eq!(read, record);
    /// assert_eq!(read.last_break().note, note);
    /// // Another backend's record, or another key's, is refused.
    /// assert!(AuditRecord::from_json(bytes, "lease-nats-audit/1", &key).is_err());
    /// let other = LeaseKey::new("jobs/hourly")?;
    /// assert!(AuditRecord::from_json(bytes, "lease-etcd-audit/1", &other).is_err());
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    pub fn to_json(&self) -> String {
        // Cannot fail: every field is a string, a number, a bool, null or an
        // object of those.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the JSON `bytes` of a record of a break of `key` in the
    /// backend's `format`, validating every field (see the
    /// [module docs](self)); otherwise says what is wrong with them.
    pub fn from_json(bytes: &[u8], format: &str, key: &LeaseKey) -> Result<Self, String> {
        serde_json::from_slice::<AuditRecord>(bytes)
            .map_err(|e| format!("not an audit record of a break: {e}"))?
            .verify(Some(format), key)
    }
}

/// The record as stored: the fields by name, in plain types.
#[cfg(feature = "serde")]
mod wire {
    use base64::engine::general_purpose::STANDARD as BASE64;
    use base64::Engine as _;
    use serde::{Deserialize, Serialize};

    use super::{AuditRecord, Previous, Removed, ACTION_BREAK, REMOVED_HEAD_MAX};
    use crate::{BreakNote, Fence, HolderId, LeaseKey};

    #[derive(Serialize, Deserialize)]
    pub(super) struct Record {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        format: Option<String>,
        action: String,
        key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        by: String,
        reason: String,
        at_unix_ms: u64,
        #[serde(default)]
        previous: Option<WirePrevious>,
        // Also read under the flag's earlier spellings, from records written
        // before the schema was shared.
        #[serde(
            default,
            alias = "replaced_corrupt_record",
            alias = "removed_corrupt_value"
        )]
        removed_corrupt_record: Option<bool>,
        #[serde(default)]
        removed: Option<WireRemoved>,
    }

    #[derive(Serialize, Deserialize)]
    struct WirePrevious {
        holder: String,
        fence: u64,
        ttl_ms: u64,
        payload_len: u64,
    }

    #[derive(Serialize, Deserialize)]
    struct WireRemoved {
        len: u64,
        head_base64: String,
        #[serde(default, skip_serializing_if = "is_false")]
        truncated: bool,
    }

    fn is_false(b: &bool) -> bool {
        !*b
    }

    impl From<AuditRecord> for Record {
        fn from(r: AuditRecord) -> Self {
            Record {
                format: r.format,
                action: ACTION_BREAK.to_owned(),
                key: r.key.as_str().to_owned(),
                seq: r.seq,
                by: r.note.by,
                reason: r.note.reason,
                at_unix_ms: r.note.at_unix_ms,
                previous: r.previous.map(|p| WirePrevious {
                    holder: p.holder.as_str().to_owned(),
                    fence: p.fence.get(),
                    ttl_ms: p.ttl_ms,
                    payload_len: p.payload_len,
                }),
                removed_corrupt_record: Some(r.removed_corrupt_record),
                removed: r.removed.map(|v| WireRemoved {
                    len: v.len,
                    head_base64: BASE64.encode(&v.head),
                    truncated: v.truncated,
                }),
            }
        }
    }

    impl TryFrom<Record> for AuditRecord {
        type Error = String;

        fn try_from(r: Record) -> Result<Self, String> {
            if r.action != ACTION_BREAK {
                return Err(format!("action {:?}, not {ACTION_BREAK:?}", r.action));
            }
            let key = LeaseKey::new(r.key.as_str())
                .map_err(|e| format!("key {:?} is not a lease key: {e}", r.key))?;
            let previous = match r.previous {
                None => None,
                Some(p) => {
                    let holder = HolderId::new(p.holder)
                        .map_err(|e| format!("previous.holder is not a holder id: {e}"))?;
                    if p.fence == 0 {
                        return Err("previous.fence is 0, not a fence".to_owned());
                    }
                    Some(Previous {
                        holder,
                        fence: Fence(p.fence),
                        ttl_ms: p.ttl_ms,
                        payload_len: p.payload_len,
                    })
                }
            };
            let removed = match r.removed {
                None => None,
                Some(v) => {
                    let head = BASE64
                        .decode(v.head_base64.as_bytes())
                        .map_err(|e| format!("removed.head_base64 is not base64: {e}"))?;
                    if head.len() > REMOVED_HEAD_MAX {
                        return Err(format!(
                            "removed.head_base64 holds {} bytes, more than {REMOVED_HEAD_MAX}",
                            head.len()
                        ));
                    }
                    Some(Removed {
                        len: v.len,
                        head,
                        truncated: v.truncated,
                    })
                }
            };
            Ok(AuditRecord {
                format: r.format,
                key,
                note: BreakNote::new(r.by, r.reason).with_at_unix_ms(r.at_unix_ms),
                previous,
                removed_corrupt_record: r.removed_corrupt_record.unwrap_or(removed.is_some()),
                removed,
                seq: r.seq,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key() -> LeaseKey {
        LeaseKey::new("jobs/a").unwrap()
    }

    fn note() -> BreakNote {
        BreakNote::new("op", "stuck").with_at_unix_ms(17)
    }

    fn holding() -> Holding {
        Holding::new(
            HolderId::new("h-1").unwrap(),
            Fence(9),
            Duration::from_secs(5),
            crate::Payload::new(b"abc".to_vec()).unwrap(),
        )
    }

    #[test]
    fn a_record_keeps_the_note_and_the_grant_it_ended() {
        let r = AuditRecord::new(Some("f/1"), &key(), &note(), Some(&holding()), None);
        let p = r.previous.clone().unwrap();
        assert_eq!((p.fence, p.ttl_ms, p.payload_len), (Fence(9), 5000, 3));
        assert!(!r.removed_corrupt_record);
        assert_eq!(
            r.last_break(),
            LastBreak::new(Some(HolderId::new("h-1").unwrap()), Some(Fence(9)), note())
        );
        let free = AuditRecord::new(None, &key(), &note(), None, Some(Removed::of(b"x")));
        assert!(free.removed_corrupt_record);
        assert_eq!(free.last_break(), LastBreak::new(None, None, note()));
        assert_eq!(free.with_seq(4).seq, Some(4));
    }

    #[test]
    fn removed_values_are_kept_bounded() {
        for len in [
            0,
            1,
            REMOVED_HEAD_MAX - 1,
            REMOVED_HEAD_MAX,
            REMOVED_HEAD_MAX + 1,
            70_000,
        ] {
            let value: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let r = Removed::of(&value);
            assert_eq!(r.len, len as u64);
            assert_eq!(r.head, value[..len.min(REMOVED_HEAD_MAX)], "len {len}");
            assert!(!r.truncated);
        }
        let r = Removed::of_read(b"abc", u64::MAX);
        assert_eq!(
            (r.len, r.head.as_slice(), r.truncated),
            (u64::MAX, &b"abc"[..], true)
        );
        // A store that understates the size: the bytes read count.
        let r = Removed::of_read(b"abcd", 1);
        assert_eq!((r.len, r.truncated), (4, false));
    }

    #[test]
    fn verify_refuses_another_format_or_key() {
        let r = AuditRecord::new(Some("f/1"), &key(), &note(), None, None);
        assert!(r.clone().verify(Some("f/1"), &key()).is_ok());
        assert!(r.clone().verify(Some("f/2"), &key()).is_err());
        assert!(r.clone().verify(None, &key()).is_err());
        let child = LeaseKey::new("jobs/a/b").unwrap();
        assert!(r.verify(Some("f/1"), &child).is_err());
        let none = AuditRecord::new(None, &key(), &note(), None, None);
        assert!(none.clone().verify(None, &key()).is_ok());
        assert!(none.verify(Some("f/1"), &key()).is_err());
    }

    #[cfg(feature = "json")]
    mod json {
        use super::*;

        /// The formats of the backends that store JSON.
        const FORMATS: [&str; 4] = [
            "lease-etcd-audit/1",
            "lease-nats-audit/1",
            "lease-s3-audit/1",
            "lease-postgres-audit/1",
        ];

        /// A good record in `format`, with `fields` after the ones every
        /// record needs (the fields a later one repeats are taken from it).
        fn body(format: &str, fields: &str) -> Vec<u8> {
            let mut v: serde_json::Value = serde_json::json!({
                "format": format, "action": "break", "key": "jobs/a",
                "by": "op", "reason": "stuck", "at_unix_ms": 17,
            });
            let extra: serde_json::Value =
                serde_json::from_str(&format!("{{{}}}", fields.trim_start_matches(','))).unwrap();
            for (name, value) in extra.as_object().unwrap() {
                v[name] = value.clone();
            }
            v.to_string().into_bytes()
        }

        /// A good record in `format` without `field`.
        fn without(format: &str, field: &str) -> Vec<u8> {
            let mut v: serde_json::Value = serde_json::from_slice(&body(format, "")).unwrap();
            v.as_object_mut().unwrap().remove(field);
            v.to_string().into_bytes()
        }

        #[test]
        fn records_read_back_as_written() {
            for format in FORMATS {
                let removed = Removed::of_read(&[0xff; 5000], u64::MAX);
                for r in [
                    AuditRecord::new(Some(format), &key(), &note(), Some(&holding()), None),
                    AuditRecord::new(Some(format), &key(), &note(), None, Some(removed.clone())),
                    AuditRecord::new(Some(format), &key(), &note(), None, None).with_seq(0),
                ] {
                    let bytes = r.to_json().into_bytes();
                    assert_eq!(
                        AuditRecord::from_json(&bytes, format, &key()),
                        Ok(r.clone())
                    );
                    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                    assert_eq!(v[ACTION], ACTION_BREAK);
                    assert_eq!(v[REMOVED_CORRUPT_RECORD], r.removed.is_some());
                }
            }
        }

        #[test]
        fn the_fields_are_stored_by_their_names() {
            let r = AuditRecord::new(
                Some("f/1"),
                &key(),
                &note(),
                Some(&holding()),
                Some(Removed::of_read(b"xy", 9)),
            )
            .with_seq(3);
            let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
            assert_eq!(
                v,
                serde_json::json!({
                    FORMAT: "f/1", ACTION: "break", KEY: "jobs/a", "seq": 3,
                    BY: "op", REASON: "stuck", AT_UNIX_MS: 17,
                    PREVIOUS: { HOLDER: "h-1", FENCE: 9, TTL_MS: 5000, PAYLOAD_LEN: 3 },
                    REMOVED_CORRUPT_RECORD: true,
                    REMOVED: { LEN: 9, HEAD_BASE64: "eHk=", TRUNCATED: true },
                })
            );
            // Optional fields are left out, not written as null.
            let plain = AuditRecord::new(None, &key(), &note(), None, Some(Removed::of(b"")));
            let v: serde_json::Value = serde_json::from_str(&plain.to_json()).unwrap();
            for absent in [FORMAT, "seq"] {
                assert!(v.get(absent).is_none(), "{v}");
            }
            assert!(v[REMOVED].get(TRUNCATED).is_none(), "{v}");
            assert!(v[PREVIOUS].is_null(), "{v}");
        }

        #[test]
        fn the_decoder_refuses_what_is_not_this_backends_record_of_this_key() {
            for format in FORMATS {
                let other = if format == FORMATS[0] {
                    FORMATS[1]
                } else {
                    FORMATS[0]
                };
                let next_version = format.replace("/1", "/2");
                let prev = r#""previous":{"holder":"h-1","fence":9,"ttl_ms":5000,"payload_len":0}"#;
                // Each differs from a good record (the first) in one way.
                assert!(AuditRecord::from_json(&body(format, prev), format, &key()).is_ok());
                let bad: Vec<(&str, Vec<u8>)> = vec![
                    ("empty", b"".to_vec()),
                    ("not JSON", b"not json".to_vec()),
                    ("not an object", b"[1,2]".to_vec()),
                    ("empty object", b"{}".to_vec()),
                    ("wrong format", body(other, "")),
                    ("wrong version", body(&next_version, "")),
                    ("format not text", body(format, r#""format":1"#)),
                    ("no format", without(format, FORMAT)),
                    ("wrong action", body(format, r#""action":"acquire""#)),
                    ("no action", without(format, ACTION)),
                    ("wrong key", body(format, r#""key":"jobs/b""#)),
                    ("a child's key", body(format, r#""key":"jobs/a/b""#)),
                    ("not a lease key", body(format, r#""key":"""#)),
                    ("no key", without(format, KEY)),
                    ("no by", without(format, BY)),
                    ("reason not text", body(format, r#""reason":3"#)),
                    ("no time", without(format, AT_UNIX_MS)),
                    ("negative time", body(format, r#""at_unix_ms":-1"#)),
                    ("fractional time", body(format, r#""at_unix_ms":1.5"#)),
                    ("time as text", body(format, r#""at_unix_ms":"1""#)),
                    (
                        "time too large",
                        body(format, r#""at_unix_ms":18446744073709551616"#),
                    ),
                    ("negative seq", body(format, r#""seq":-3"#)),
                    ("previous not an object", body(format, r#""previous":7"#)),
                    (
                        "empty holder",
                        body(
                            format,
                            r#""previous":{"holder":"","fence":3,"ttl_ms":1,"payload_len":0}"#,
                        ),
                    ),
                    (
                        "fence 0",
                        body(
                            format,
                            r#""previous":{"holder":"h","fence":0,"ttl_ms":1,"payload_len":0}"#,
                        ),
                    ),
                    (
                        "negative fence",
                        body(
                            format,
                            r#""previous":{"holder":"h","fence":-9,"ttl_ms":1,"payload_len":0}"#,
                        ),
                    ),
                    (
                        "no fence",
                        body(
                            format,
                            r#""previous":{"holder":"h","ttl_ms":1,"payload_len":0}"#,
                        ),
                    ),
                    (
                        "no ttl",
                        body(
                            format,
                            r#""previous":{"holder":"h","fence":9,"payload_len":0}"#,
                        ),
                    ),
                    (
                        "negative payload length",
                        body(
                            format,
                            r#""previous":{"holder":"h","fence":9,"ttl_ms":1,"payload_len":-1}"#,
                        ),
                    ),
                    (
                        "flag not a bool",
                        body(format, r#""removed_corrupt_record":"yes""#),
                    ),
                    (
                        "negative removed length",
                        body(format, r#""removed":{"len":-1,"head_base64":""}"#),
                    ),
                    (
                        "no removed length",
                        body(format, r#""removed":{"head_base64":""}"#),
                    ),
                    (
                        "head not base64",
                        body(format, r#""removed":{"len":1,"head_base64":"***"}"#),
                    ),
                ];
                for (why, bytes) in bad {
                    let got = AuditRecord::from_json(&bytes, format, &key());
                    assert!(got.is_err(), "{format}, {why}: {got:?}");
                }
                let long = "A".repeat((REMOVED_HEAD_MAX + 3) / 3 * 4);
                let too_long = body(
                    format,
                    &format!(r#""removed":{{"len":9000,"head_base64":"{long}"}}"#),
                );
                assert!(AuditRecord::from_json(&too_long, format, &key()).is_err());
            }
        }

        #[test]
        fn the_decoder_accepts_unknown_fields_and_older_records() {
            for format in FORMATS {
                let extra = body(
                    format,
                    r#""seq":12,"node":{"any":[1,"thing"]},"at":"2026-01-01",
                       "previous":{"holder":"h-1","fence":9,"ttl_ms":5000,"payload_len":0,"remaining_ms":3},
                       "removed_corrupt_record":false,"removed":null"#,
                );
                let r = AuditRecord::from_json(&extra, format, &key()).unwrap();
                assert_eq!(r.seq, Some(12));
                assert_eq!(r.last_break().fence, Some(Fence(9)));
                // Without the optional fields: nothing removed, no grant.
                let bare = AuditRecord::from_json(&body(format, ""), format, &key()).unwrap();
                assert_eq!(
                    (bare.previous, bare.removed, bare.removed_corrupt_record),
                    (None, None, false)
                );
                assert_eq!(bare.seq, None);
                // The flag's earlier spellings.
                for flag in ["replaced_corrupt_record", "removed_corrupt_value"] {
                    let old = body(format, &format!(r#""{flag}":true"#));
                    let r = AuditRecord::from_json(&old, format, &key()).unwrap();
                    assert!(r.removed_corrupt_record, "{flag}");
                }
            }
        }

        #[test]
        fn a_record_without_format_is_read_by_serde_and_verify() {
            let mut v: serde_json::Value = serde_json::from_slice(&without("x", FORMAT)).unwrap();
            v["seq"] = 4.into();
            let bytes = v.to_string().into_bytes();
            let r: AuditRecord = serde_json::from_slice(&bytes).unwrap();
            let r = r.verify(None, &key()).unwrap();
            assert_eq!((r.format, r.seq), (None, Some(4)));
            let r: AuditRecord = serde_json::from_slice(&bytes).unwrap();
            assert!(r.verify(Some(FORMATS[0]), &key()).is_err());
        }
    }
}
