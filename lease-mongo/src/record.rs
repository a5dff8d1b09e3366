//! The stored lease document, and the one definition of a well-formed one.
//!
//! One document per key, `_id` = the key. It is never deleted by this library:
//! release only clears the holder, so `fence` — the last fence handed out for
//! the key — survives release and expiry and never goes backwards.
//!
//! ```text
//! { _id: "<key>",
//!   lease_schema: "lease-mongo/keyed-lease/2",
//!   fence: <i64>,          // last fence issued (≥ $$NOW ms × 1000 at its grant)
//!   holder: "<id>" | null, // null once released
//!   ttl_ms: <i64>,         // TTL the grant was taken or last renewed with
//!   expires_ms: <i64>,     // server time (ms since the epoch, from $$NOW) of expiry
//!   at_ms: <i64>,          // server time of the last acquire/renew on this document
//!   payload: <binary> }
//! ```
//!
//! Times are numbers of milliseconds taken from `$$NOW` on the server, never
//! from a client's clock.
//!
//! Earlier versions marked records with `v: 1` instead of `lease_schema`.
//! Such a record is still read, renewed, released and taken over — but only
//! when every lease field is well formed: `v` is a common field name, so a
//! document with `v: 1` and nothing else is another program's, never a free
//! key. The first acquire that writes such a record adds `lease_schema`.
//!
//! [`well_formed`] (the server-side condition used by every update pipeline
//! and filter) and [`Record::parse`] (the client-side decoder) are built from
//! the same limits below and must agree field by field.

use std::time::Duration;

use lease_core::{Error, Fence, HolderId, LeaseKey, Payload, MAX_HOLDER_LEN, MAX_PAYLOAD_LEN};
use mongodb::bson::{doc, spec::BinarySubtype, Binary, Bson, Document};

/// Field names, shared by the queries and the parser.
pub(crate) mod field {
    pub const ID: &str = "_id";
    pub const SCHEMA: &str = "lease_schema";
    pub const LEGACY_SCHEMA: &str = "v";
    pub const FENCE: &str = "fence";
    pub const HOLDER: &str = "holder";
    pub const TTL_MS: &str = "ttl_ms";
    pub const EXPIRES_MS: &str = "expires_ms";
    pub const AT_MS: &str = "at_ms";
    pub const PAYLOAD: &str = "payload";
}

/// The schema marker of the records this version writes: a value no other
/// program plausibly stores under that name.
pub(crate) const SCHEMA: &str = "lease-mongo/keyed-lease/2";

/// The marker of earlier versions' records (`v: 1`), still accepted on a
/// record that is well formed in every other field.
pub(crate) const LEGACY_SCHEMA: i32 = 1;

/// Largest fence a record may carry (2^62). Fences grow by one per grant
/// from at most 1000 × the server's clock in milliseconds (about 1.8 × 10^15
/// today), so this is never reached; it keeps `fence + 1` far from overflow.
pub(crate) const MAX_FENCE: i64 = 1 << 62;

/// Largest server time (ms) a record may carry in `expires_ms` and `at_ms`
/// (2^53 ms: the year 287,000); keeps `$$NOW + ttl_ms` far from overflow.
pub(crate) const MAX_TIME_MS: i64 = 1 << 53;

/// TTLs a record may carry, in milliseconds: the backend's accepted range.
pub(crate) const MIN_TTL_MS: i64 = 1_000;
pub(crate) const MAX_TTL_MS: i64 = 24 * 3600 * 1000;

/// A character a holder id may not contain (see [`HolderId`]): anything but
/// printable ASCII without spaces. A character class with no anchors, so
/// regex engines agree (a `$` anchor also matches before a final newline).
const HOLDER_FORBIDDEN: &str = "[^!-~]";

/// `$name`: the value of field (or pipeline variable) `name`.
pub(crate) fn var(name: &str) -> String {
    format!("${name}")
}

fn type_of(name: &str) -> Document {
    doc! { "$type": var(name) }
}

fn is_int(name: &str) -> Document {
    doc! { "$in": [ type_of(name), ["int", "long"] ] }
}

/// `name` is an integer in `lo..=hi`. `$cond` rather than `$and`, so the
/// range is only compared on an integer.
pub(crate) fn int_in(name: &str, lo: i64, hi: i64) -> Document {
    doc! { "$cond": [
        is_int(name),
        { "$and": [ { "$gte": [ var(name), lo ] }, { "$lte": [ var(name), hi ] } ] },
        false,
    ] }
}

/// The server-side definition of a well-formed lease record, as an
/// aggregation expression over the current document: the schema marker, and
/// every field with the type and range [`Record::parse`] accepts.
///
/// No time is compared here (it is also used in `$expr` filters, where the
/// test server mishandles `$$NOW`).
pub(crate) fn well_formed() -> Document {
    let holder_ok = doc! { "$cond": [
        { "$eq": [ type_of(field::HOLDER), "string" ] },
        { "$and": [
            { "$gte": [ { "$strLenBytes": var(field::HOLDER) }, 1 ] },
            { "$lte": [ { "$strLenBytes": var(field::HOLDER) }, MAX_HOLDER_LEN as i64 ] },
            { "$not": [ { "$regexMatch": { "input": var(field::HOLDER), "regex": HOLDER_FORBIDDEN } } ] },
        ] },
        { "$eq": [ type_of(field::HOLDER), "null" ] },
    ] };
    let payload_ok = doc! { "$cond": [
        { "$eq": [ type_of(field::PAYLOAD), "binData" ] },
        { "$lte": [ { "$binarySize": var(field::PAYLOAD) }, MAX_PAYLOAD_LEN as i64 ] },
        false,
    ] };
    doc! { "$and": [
        schema_ok(),
        int_in(field::FENCE, 1, MAX_FENCE),
        holder_ok,
        int_in(field::TTL_MS, MIN_TTL_MS, MAX_TTL_MS),
        int_in(field::EXPIRES_MS, 0, MAX_TIME_MS),
        int_in(field::AT_MS, 0, MAX_TIME_MS),
        payload_ok,
    ] }
}

/// The schema marker: ours, or the legacy `v: 1` as an integer without ours.
fn schema_ok() -> Document {
    doc! { "$or": [
        { "$eq": [ var(field::SCHEMA), SCHEMA ] },
        { "$and": [
            { "$eq": [ type_of(field::SCHEMA), "missing" ] },
            int_in(field::LEGACY_SCHEMA, i64::from(LEGACY_SCHEMA), i64::from(LEGACY_SCHEMA)),
        ] },
    ] }
}

/// The query filter of a document at `key` that may be a lease record: it
/// carries our marker, or the legacy one (the pipeline then checks the rest).
///
/// An upsert with this filter inserts `{_id}` alone (MongoDB seeds an
/// upsert only from equality conditions outside `$or`): inside the update
/// pipeline, a document with neither marker is the one being inserted.
pub(crate) fn schema_filter(key: &LeaseKey) -> Document {
    doc! {
        field::ID: key.as_str(),
        "$or": [
            { field::SCHEMA: SCHEMA },
            { field::LEGACY_SCHEMA: LEGACY_SCHEMA, field::SCHEMA: { "$exists": false } },
        ],
    }
}

/// Inside an upsert's pipeline with [`schema_filter`]: the document is the
/// one being inserted (no stored document carries neither marker and
/// matches the filter).
pub(crate) fn inserting() -> Document {
    doc! { "$and": [
        { "$eq": [ type_of(field::SCHEMA), "missing" ] },
        { "$eq": [ type_of(field::LEGACY_SCHEMA), "missing" ] },
    ] }
}

/// A parsed lease document.
#[derive(Debug)]
pub(crate) struct Record {
    pub fence: u64,
    pub holder: Option<HolderId>,
    pub ttl: Duration,
    pub expires_ms: i64,
    pub at_ms: i64,
    pub payload: Payload,
}

impl Record {
    /// Parses `doc`, or explains why it is not a lease record. Accepts
    /// exactly what [`well_formed`] accepts.
    pub(crate) fn parse(key: &LeaseKey, doc: &Document) -> Result<Record, lease_core::Error> {
        let bad = |detail: String| lease_core::Error::corrupt(key, detail);
        match (doc.get(field::SCHEMA), doc.get(field::LEGACY_SCHEMA)) {
            (Some(Bson::String(s)), _) if s == SCHEMA => {}
            (Some(other), _) => {
                return Err(bad(format!(
                    "unknown schema marker `{}: {other}`",
                    field::SCHEMA
                )))
            }
            (None, Some(v)) if as_i64(v) == Some(i64::from(LEGACY_SCHEMA)) => {}
            (None, Some(v)) => return Err(bad(format!("unknown schema marker `v: {v}`"))),
            (None, None) => {
                return Err(bad(format!(
                    "a document without the lease schema marker `{}` (not written by lease-mongo)",
                    field::SCHEMA
                )))
            }
        }
        let int = |name: &str, lo: i64, hi: i64| -> Result<i64, lease_core::Error> {
            match doc.get(name) {
                Some(b) => match as_i64(b) {
                    Some(v) if (lo..=hi).contains(&v) => Ok(v),
                    Some(v) => Err(bad(format!("`{name}` {v} is outside {lo}..={hi}"))),
                    None => Err(bad(format!("`{name}` is not an integer: {b}"))),
                },
                None => Err(bad(format!("`{name}` is missing"))),
            }
        };
        let fence = int(field::FENCE, 1, MAX_FENCE)?;
        let fence = u64::try_from(fence).map_err(|_| bad(format!("`fence` {fence}")))?;
        let ttl_ms = int(field::TTL_MS, MIN_TTL_MS, MAX_TTL_MS)?;
        let ttl = Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0));
        let expires_ms = int(field::EXPIRES_MS, 0, MAX_TIME_MS)?;
        let at_ms = int(field::AT_MS, 0, MAX_TIME_MS)?;
        let holder = match doc.get(field::HOLDER) {
            Some(Bson::Null) => None,
            Some(Bson::String(s)) => Some(
                HolderId::new(s.as_str())
                    .map_err(|e| bad(format!("`holder` is not a holder id: {e}")))?,
            ),
            Some(other) => {
                return Err(bad(format!(
                    "`holder` is neither a string nor null: {other}"
                )))
            }
            None => return Err(bad("`holder` is missing".into())),
        };
        let payload = match doc.get(field::PAYLOAD) {
            Some(Bson::Binary(b)) => Payload::new(b.bytes.clone())
                .map_err(|e| bad(format!("`payload` is not a valid payload: {e}")))?,
            Some(other) => {
                return Err(bad(format!(
                    "`payload` is not binary: {}",
                    other.element_type() as u8
                )))
            }
            None => return Err(bad("`payload` is missing".into())),
        };
        Ok(Record {
            fence,
            holder,
            ttl,
            expires_ms,
            at_ms,
            payload,
        })
    }

    /// The live holder at server time `now_ms`, if any.
    pub(crate) fn live_holder(&self, now_ms: i64) -> Option<&HolderId> {
        match &self.holder {
            Some(h) if self.expires_ms > now_ms => Some(h),
            _ => None,
        }
    }

    /// The fence as the contract's type.
    pub(crate) fn fence(&self) -> Fence {
        Fence(self.fence)
    }

    /// Remaining time at server time `now_ms` (zero once expired).
    pub(crate) fn remaining(&self, now_ms: i64) -> Duration {
        let left = self.expires_ms.saturating_sub(now_ms);
        Duration::from_millis(u64::try_from(left).unwrap_or(0))
    }
}

/// An integer field, whichever width the server chose to store it in.
pub(crate) fn as_i64(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int64(v) => Some(*v),
        Bson::Int32(v) => Some(i64::from(*v)),
        _ => None,
    }
}

/// The server's clock as milliseconds since the epoch.
///
/// Every time comparison in this crate is on these numbers, computed inside
/// the pipeline, never on dates: it is correct on MongoDB, and it sidesteps a
/// bug of SecantusDB (the wire-compatible test server), whose comparisons of
/// dates against `$$NOW` inside `$expr` match nothing. For the same reason no
/// query *filter* mentions the time: liveness is decided inside the update
/// pipeline and read back from the returned document.
pub(crate) fn now_ms() -> Document {
    doc! { "$toLong": "$$NOW" }
}

/// How many fences fit in one millisecond of the server's clock.
pub(crate) const FENCES_PER_MS: i64 = 1000;

/// `$$NOW` in milliseconds × [`FENCES_PER_MS`]: a floor no earlier grant's
/// fence reached.
pub(crate) fn clock_fence() -> Document {
    doc! { "$multiply": [ now_ms(), FENCES_PER_MS ] }
}

/// A payload as the record stores it.
pub(crate) fn binary(bytes: &[u8]) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes: bytes.to_vec(),
    }
}

/// A fence as the record stores it.
pub(crate) fn fence_i64(f: Fence) -> Result<i64, Error> {
    i64::try_from(f.get()).map_err(|_| {
        Error::Backend(format!("lease-mongo: fence {f} does not fit the stored integer").into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{doc, spec::BinarySubtype, Binary};

    fn key() -> LeaseKey {
        LeaseKey::new("k").unwrap()
    }

    fn good() -> Document {
        doc! {
            "_id": "k", "lease_schema": SCHEMA, "fence": 7_i64, "holder": "me", "ttl_ms": 1500_i64,
            "expires_ms": 10_000_i64, "at_ms": 9_000_i64,
            "payload": Binary { subtype: BinarySubtype::Generic, bytes: b"p".to_vec() },
        }
    }

    #[test]
    fn parses_a_record() {
        let r = Record::parse(&key(), &good()).unwrap();
        assert_eq!(r.fence(), Fence(7));
        assert_eq!(r.ttl, Duration::from_millis(1500));
        assert_eq!(r.live_holder(9_999).map(HolderId::as_str), Some("me"));
        assert_eq!(r.live_holder(10_000), None, "expired at expires_ms");
        assert_eq!(r.remaining(9_000), Duration::from_secs(1));
        assert_eq!(r.remaining(11_000), Duration::ZERO);
        assert_eq!(r.payload.as_bytes(), b"p");
        let mut released = good();
        released.insert("holder", Bson::Null);
        assert!(Record::parse(&key(), &released)
            .unwrap()
            .live_holder(0)
            .is_none());
        let mut narrow = good();
        narrow.insert("fence", 7_i32);
        assert_eq!(Record::parse(&key(), &narrow).unwrap().fence(), Fence(7));
    }

    #[test]
    fn legacy_marker_only_on_a_well_formed_record() {
        let mut legacy = good();
        legacy.remove("lease_schema");
        legacy.insert("v", 1_i32);
        assert_eq!(Record::parse(&key(), &legacy).unwrap().fence(), Fence(7));
        legacy.insert("v", 1.0_f64);
        assert!(Record::parse(&key(), &legacy).is_err(), "v as a double");
        let bare = doc! { "_id": "k", "v": 1 };
        assert!(
            Record::parse(&key(), &bare).is_err(),
            "v: 1 and nothing else"
        );
    }

    #[test]
    fn anything_else_is_corrupt() {
        // (field, replacement); None removes the field.
        let broken: [(&str, Option<Bson>); 15] = [
            ("lease_schema", None),
            (
                "lease_schema",
                Some(Bson::String("lease-mongo/keyed-lease/3".into())),
            ),
            ("lease_schema", Some(Bson::Int32(1))),
            ("fence", Some(Bson::Int64(-3))),
            ("fence", Some(Bson::Int64(MAX_FENCE + 1))),
            ("ttl_ms", Some(Bson::Int64(999))),
            ("fence", Some(Bson::String("7".into()))),
            ("fence", Some(Bson::Int64(0))),
            ("holder", Some(Bson::Int32(5))),
            ("holder", Some(Bson::String("has space".into()))),
            ("holder", None),
            ("ttl_ms", Some(Bson::Int64(-1))),
            ("expires_ms", Some(Bson::Double(1.5))),
            ("at_ms", None),
            ("payload", Some(Bson::String("text".into()))),
        ];
        for (i, (field, value)) in broken.into_iter().enumerate() {
            let mut d = good();
            match value {
                Some(v) => d.insert(field, v),
                None => d.remove(field),
            };
            match Record::parse(&key(), &d) {
                Err(lease_core::Error::CorruptRecord { key, detail }) => {
                    assert_eq!(key, "k");
                    assert!(!detail.is_empty());
                }
                other => panic!("case {i}: {other:?}"),
            }
        }
    }
}
