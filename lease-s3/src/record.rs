//! The lease record as stored in the object: one JSON header line, a newline,
//! then the payload bytes verbatim.
//!
//! The payload is kept out of the JSON so a 64 KiB payload costs 64 KiB, not
//! the 3–4× a JSON byte array would. serde_json never emits a raw newline, so
//! the first `\n` always ends the header.

use std::time::Duration;

use lease_core::{Error, Fence, HolderId, Holding, LeaseKey, Payload};
use serde::{Deserialize, Serialize};

/// Marks an object as ours; anything else at a lease key is a corrupt record.
const FORMAT: &str = "lease-s3/1";

/// Whether the record names a holder or only keeps the fence counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// `holder` holds the lease (unless observers judge it expired).
    Held,
    /// Released: the key is free; the record survives only to keep the fence
    /// from going backwards (object_store has no conditional delete either).
    Released,
}

#[derive(Serialize, Deserialize)]
struct Header {
    lease: String,
    state: State,
    holder: String,
    fence: u64,
    ttl_ms: u64,
    /// Fresh on every write. ETags are content hashes on S3: without it, two
    /// writes of the same content would share an ETag, and a renewal that
    /// changed nothing would look to observers like no renewal at all.
    nonce: String,
}

/// A decoded lease record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub state: State,
    pub holder: String,
    pub fence: u64,
    pub ttl_ms: u64,
    pub nonce: String,
    pub payload: Vec<u8>,
}

impl Record {
    /// The object body.
    pub fn encode(&self) -> Vec<u8> {
        let header = Header {
            lease: FORMAT.to_owned(),
            state: self.state,
            holder: self.holder.clone(),
            fence: self.fence,
            ttl_ms: self.ttl_ms,
            nonce: self.nonce.clone(),
        };
        // Serialising a struct of strings and integers cannot fail; should a
        // future field make it fail, an empty header is refused by `decode`
        // on every reader rather than silently accepted.
        let mut out = serde_json::to_vec(&header).unwrap_or_default();
        out.push(b'\n');
        out.extend_from_slice(&self.payload);
        out
    }

    /// Parses an object body; `Err` says why it is not one of our records.
    pub fn decode(bytes: &[u8]) -> Result<Record, String> {
        let split = bytes
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| format!("{} bytes without a lease header line", bytes.len()))?;
        let header: Header = serde_json::from_slice(&bytes[..split])
            .map_err(|e| format!("the header line is not a lease header: {e}"))?;
        if header.lease != FORMAT {
            return Err(format!(
                "unknown record format {:?} (expected {FORMAT:?})",
                header.lease
            ));
        }
        if header.state == State::Held && lease_core::HolderId::new(&*header.holder).is_err() {
            return Err(format!("invalid holder id {:?}", header.holder));
        }
        if header.fence == 0 {
            return Err("fence 0 (fences start at 1)".into());
        }
        if header.fence == u64::MAX {
            return Err("fence u64::MAX: no higher fence exists for a next grant".into());
        }
        if header.ttl_ms == 0 {
            return Err("TTL of zero".into());
        }
        Ok(Record {
            state: header.state,
            holder: header.holder,
            fence: header.fence,
            ttl_ms: header.ttl_ms,
            nonce: header.nonce,
            payload: bytes[split + 1..].to_vec(),
        })
    }
}

/// The holding a held record of `key` describes; an invalid holder id or
/// payload makes it corrupt.
pub(crate) fn holding(key: &LeaseKey, r: Record) -> Result<Holding, Error> {
    let holder = HolderId::new(r.holder)
        .map_err(|e| Error::corrupt(key, format!("invalid holder id in the record: {e}")))?;
    Ok(Holding::new(
        holder,
        Fence(r.fence),
        Duration::from_millis(r.ttl_ms),
        Payload::new(r.payload).map_err(|e| Error::corrupt(key, format!("stored payload: {e}")))?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(payload: &[u8]) -> Record {
        Record {
            state: State::Held,
            holder: "worker-1".into(),
            fence: 7,
            ttl_ms: 3000,
            nonce: "n1".into(),
            payload: payload.to_vec(),
        }
    }

    #[test]
    fn round_trips_any_payload() {
        for p in [&b""[..], b"x", b"line\nbreaks\n\n", &[0u8, 255, 10, 13][..]] {
            let r = sample(p);
            assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn refuses_foreign_bytes() {
        for bad in [
            &b""[..],
            b"not json",
            b"not json\n",
            b"{}\n",
            br#"{"lease":"other/1","state":"held","holder":"a","fence":1,"ttl_ms":1,"nonce":"n"}
"#,
            br#"{"lease":"lease-s3/1","state":"held","holder":"a b","fence":1,"ttl_ms":1,"nonce":"n"}
"#,
            br#"{"lease":"lease-s3/1","state":"held","holder":"a","fence":0,"ttl_ms":1,"nonce":"n"}
"#,
            br#"{"lease":"lease-s3/1","state":"held","holder":"a","fence":18446744073709551615,"ttl_ms":1,"nonce":"n"}
"#,
        ] {
            assert!(Record::decode(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
