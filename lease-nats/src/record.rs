//! The bytes stored in a KV entry, and how a stored message is judged.
//!
//! A record is `lease-nats/1 ` + one line of JSON metadata + `\n` + the raw
//! payload. The payload stays raw (no base64) so a 64 KiB payload costs 64 KiB
//! on the wire; the magic prefix makes a foreign value (another program's
//! `kv put`) fail to parse instead of passing for a free key.

use std::borrow::Cow;
use std::time::Duration;

use async_nats::header::NATS_MESSAGE_TTL;
use async_nats::HeaderMap;
use bytes::Bytes;
use lease_core::{Error, Fence, HolderId, Holding, LeaseKey, Payload};
use serde::{Deserialize, Serialize};

/// Marks a value as one of ours, with the format version.
const MAGIC: &[u8] = b"lease-nats/1 ";

/// Header names the KV layer and nats-server put on tombstones and markers.
pub(crate) const KV_OPERATION: &str = "KV-Operation";
pub(crate) const MARKER_REASON: &str = "Nats-Marker-Reason";

#[derive(Serialize, Deserialize)]
struct Meta<'a> {
    /// Borrowed when written, and when read unless the JSON escapes it.
    #[serde(borrow)]
    holder: Cow<'a, str>,
    /// Absent on the message that created the grant: its own stream sequence
    /// is the fence, which is not known until the server has stored it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fence: Option<u64>,
    ttl_ms: u64,
}

/// A lease record as stored.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub(crate) holder: HolderId,
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    pub(crate) payload: Payload,
}

/// What the last message of a key's subject says.
#[derive(Debug)]
pub(crate) enum Slot {
    /// The subject has no message at all.
    Empty,
    /// A delete/purge tombstone or a server's expiry marker at `seq`: the key
    /// is free, and a create must expect `seq`.
    Tombstone { seq: u64 },
    /// A lease record at `seq` (the key's last subject sequence).
    Live { seq: u64, record: Record },
}

/// Serialises a record; `fence: None` means "this message's own sequence".
pub(crate) fn encode(
    holder: &HolderId,
    fence: Option<Fence>,
    ttl: Duration,
    payload: &[u8],
) -> Bytes {
    let meta = Meta {
        holder: Cow::Borrowed(holder.as_str()),
        fence: fence.map(Fence::get),
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
    };
    // One allocation per record, written on every renewal: the metadata
    // (the holder and two numbers) is serialised straight into it.
    let mut out = Vec::with_capacity(MAGIC.len() + holder.as_str().len() + 80 + payload.len());
    out.extend_from_slice(MAGIC);
    // Serialising a struct of strings and integers into a `Vec` cannot
    // fail; an empty header would then not parse on read, never pass.
    if serde_json::to_writer(&mut out, &meta).is_err() {
        out.truncate(MAGIC.len());
    }
    out.push(b'\n');
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// Judges one stored message of `key`'s subject.
///
/// # Errors
/// [`Error::CorruptRecord`] when it is neither a tombstone/marker nor one of
/// our records.
pub(crate) fn judge(
    key: &LeaseKey,
    seq: u64,
    headers: Option<&HeaderMap>,
    value: &[u8],
) -> Result<Slot, Error> {
    if let Some(h) = headers {
        if h.get(MARKER_REASON).is_some() {
            return Ok(Slot::Tombstone { seq });
        }
        if let Some(op) = h.get(KV_OPERATION) {
            match op.as_str() {
                "DEL" | "PURGE" => return Ok(Slot::Tombstone { seq }),
                "PUT" => {}
                other => {
                    return Err(Error::corrupt(
                        key,
                        format!("unknown KV operation {other:?} at revision {seq}"),
                    ))
                }
            }
        }
    }
    let record = decode(key, seq, value)?;
    Ok(Slot::Live { seq, record })
}

/// Parses a record stored at stream sequence `seq`.
pub(crate) fn decode(key: &LeaseKey, seq: u64, value: &[u8]) -> Result<Record, Error> {
    let corrupt = |why: String| Error::corrupt(key, format!("revision {seq}: {why}"));
    let rest = value.strip_prefix(MAGIC).ok_or_else(|| {
        corrupt(format!(
            "{} bytes without the lease-nats record header",
            value.len()
        ))
    })?;
    let nl = rest
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| corrupt("record header is not terminated".into()))?;
    let meta: Meta = serde_json::from_slice(&rest[..nl])
        .map_err(|e| corrupt(format!("record header does not parse: {e}")))?;
    let holder = HolderId::new(meta.holder.into_owned()).map_err(|e| corrupt(e.to_string()))?;
    let payload = Payload::new(rest[nl + 1..].to_vec()).map_err(|e| corrupt(e.to_string()))?;
    Ok(Record {
        holder,
        fence: Fence(meta.fence.unwrap_or(seq)),
        ttl: Duration::from_millis(meta.ttl_ms),
        payload,
    })
}

/// The TTL a stored message carries in its `Nats-TTL` header: `None` when it
/// has none ("never", absent) or one this client cannot read, which the
/// callers treat as "no TTL" — the safe side for a marker that must outlive it.
pub(crate) fn message_ttl(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(NATS_MESSAGE_TTL)?.as_str().trim();
    let (digits, unit) = match value.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => value.split_at(i),
        None => (value, "s"),
    };
    let n: u64 = digits.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

pub(crate) fn holding(r: Record) -> Holding {
    // The remaining time stays unknown: JetStream does not report a
    // message's remaining TTL, and computing it from the stored timestamp
    // would compare a remote clock with ours.
    Holding::new(r.holder, r.fence, r.ttl, r.payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LeaseKey {
        LeaseKey::new("k").unwrap()
    }

    #[test]
    fn round_trip_and_own_sequence_fence() {
        let h = HolderId::new("me").unwrap();
        let bytes = encode(&h, None, Duration::from_secs(3), b"a\nb\0");
        let r = decode(&key(), 42, &bytes).unwrap();
        assert_eq!(r.holder, h);
        assert_eq!(r.fence, Fence(42));
        assert_eq!(r.ttl, Duration::from_secs(3));
        assert_eq!(r.payload.as_bytes(), b"a\nb\0");
        let bytes = encode(&h, Some(Fence(7)), Duration::from_secs(3), b"");
        assert_eq!(decode(&key(), 42, &bytes).unwrap().fence, Fence(7));
    }

    #[test]
    fn holders_json_escapes_round_trip() {
        let h = HolderId::new(r#"a"b\c/"#).unwrap();
        let bytes = encode(&h, Some(Fence(9)), Duration::from_secs(1), b"p");
        let r = decode(&key(), 1, &bytes).unwrap();
        assert_eq!(r.holder, h);
        assert_eq!(r.payload.as_bytes(), b"p");
    }

    #[test]
    fn foreign_values_are_corrupt() {
        for v in [
            &b"not json"[..],
            b"",
            b"lease-nats/1 {}\n",
            b"lease-nats/1 {\"holder\":\"a\"",
        ] {
            assert!(matches!(
                decode(&key(), 1, v),
                Err(Error::CorruptRecord { .. })
            ));
        }
    }

    #[test]
    fn tombstones_and_markers_are_free() {
        let mut h = HeaderMap::new();
        h.insert(KV_OPERATION, "DEL");
        assert!(matches!(
            judge(&key(), 5, Some(&h), b""),
            Ok(Slot::Tombstone { seq: 5 })
        ));
        let mut h = HeaderMap::new();
        h.insert(MARKER_REASON, "MaxAge");
        assert!(matches!(
            judge(&key(), 6, Some(&h), b""),
            Ok(Slot::Tombstone { seq: 6 })
        ));
    }

    #[test]
    fn message_ttls_are_read_or_unknown() {
        let ttl = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(NATS_MESSAGE_TTL, v);
            message_ttl(&h)
        };
        assert_eq!(ttl("60"), Some(Duration::from_secs(60)));
        assert_eq!(ttl("30s"), Some(Duration::from_secs(30)));
        assert_eq!(ttl("2m"), Some(Duration::from_secs(120)));
        assert_eq!(ttl("1h"), Some(Duration::from_secs(3600)));
        for unknown in ["never", "", "1.5s", "99999999999999999999", "5d"] {
            assert_eq!(ttl(unknown), None, "{unknown:?}");
        }
        assert_eq!(message_ttl(&HeaderMap::new()), None);
    }
}
