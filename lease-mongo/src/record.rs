//! The stored lease document and its parsing.
//!
//! One document per key, `_id` = the key. It is never deleted by this library:
//! release only clears the holder, so `fence` — the last fence handed out for
//! the key — survives release and expiry and never goes backwards.
//!
//! ```text
//! { _id: "<key>", v: 1,
//!   fence: <i64>,          // last fence issued; the live grant's fence when held
//!   holder: "<id>" | null, // null once released
//!   ttl_ms: <i64>,         // TTL the grant was taken or last renewed with
//!   expires_ms: <i64>,     // server time (ms since the epoch, from $$NOW) of expiry
//!   at_ms: <i64>,          // server time of the last acquire/renew on this document
//!   payload: <binary> }
//! ```
//!
//! Times are numbers of milliseconds taken from `$$NOW` on the server, never
//! from a client's clock.

use std::time::Duration;

use lease_core::{Fence, HolderId, LeaseKey, Payload};
use mongodb::bson::{Bson, Document};

/// Field names, shared by the queries and the parser.
pub(crate) mod field {
    pub const ID: &str = "_id";
    pub const SCHEMA: &str = "v";
    pub const FENCE: &str = "fence";
    pub const HOLDER: &str = "holder";
    pub const TTL_MS: &str = "ttl_ms";
    pub const EXPIRES_MS: &str = "expires_ms";
    pub const AT_MS: &str = "at_ms";
    pub const PAYLOAD: &str = "payload";
}

/// The schema marker: queries match only documents carrying it, so a foreign
/// document at a lease key is never modified.
pub(crate) const SCHEMA_VERSION: i32 = 1;

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
    /// Parses `doc`, or explains why it is not a lease record.
    pub(crate) fn parse(key: &LeaseKey, doc: &Document) -> Result<Record, lease_core::Error> {
        let bad = |detail: String| lease_core::Error::corrupt(key, detail);
        match doc.get(field::SCHEMA) {
            Some(v) if as_i64(v) == Some(i64::from(SCHEMA_VERSION)) => {}
            Some(v) => return Err(bad(format!("unknown schema marker `v: {v}`"))),
            None => {
                return Err(bad(
                    "a document without the lease schema marker `v` (not written by lease-mongo)"
                        .into(),
                ))
            }
        }
        let int = |name: &str| -> Result<i64, lease_core::Error> {
            match doc.get(name) {
                Some(b) => as_i64(b).ok_or_else(|| bad(format!("`{name}` is not an integer: {b}"))),
                None => Err(bad(format!("`{name}` is missing"))),
            }
        };
        let fence = int(field::FENCE)?;
        let fence = u64::try_from(fence)
            .ok()
            .filter(|f| *f > 0)
            .ok_or_else(|| bad(format!("`fence` {fence} is not positive")))?;
        let ttl_ms = int(field::TTL_MS)?;
        let ttl = u64::try_from(ttl_ms)
            .map(Duration::from_millis)
            .map_err(|_| bad(format!("`ttl_ms` {ttl_ms} is negative")))?;
        let expires_ms = int(field::EXPIRES_MS)?;
        let at_ms = int(field::AT_MS)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{doc, spec::BinarySubtype, Binary};

    fn key() -> LeaseKey {
        LeaseKey::new("k").unwrap()
    }

    fn good() -> Document {
        doc! {
            "_id": "k", "v": 1, "fence": 7_i64, "holder": "me", "ttl_ms": 1500_i64,
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
    fn anything_else_is_corrupt() {
        // (field, replacement); None removes the field.
        let broken: [(&str, Option<Bson>); 11] = [
            ("v", None),
            ("v", Some(Bson::Int32(2))),
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
