//! The value stored at a lease key: who holds it, for how long, and the payload.
//!
//! The fence is not in the value: it is the key's create revision, which etcd
//! assigns and nobody can write.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use etcd_client::KeyValue;
use lease_core::{Error, Fence, HolderId, LeaseKey, Payload};
use serde::{Deserialize, Serialize};

/// Marks values written by this crate, so that foreign JSON at a lease key is
/// recognised as foreign instead of being read as a lease.
const FORMAT: &str = "lease-etcd/1";

#[derive(Serialize, Deserialize)]
struct Wire {
    format: String,
    holder: String,
    ttl_ms: u64,
    /// Base64: payloads are arbitrary bytes, JSON strings are not.
    payload: String,
    /// Whether the key is bound to a session lease, which other keys may
    /// share: then neither a release nor a break of this key may revoke it.
    /// Absent (false) in records of keys with an etcd lease of their own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    session: bool,
}

/// A parsed lease record together with what etcd says about its key.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub holder: HolderId,
    pub ttl: Duration,
    pub payload: Payload,
    /// The key's create revision: the fence of this grant.
    pub fence: Fence,
    /// The etcd lease the key is bound to.
    pub lease: i64,
    /// The revision of the last write to the key: guards overwrites.
    pub mod_revision: i64,
    /// Whether the etcd lease is a session lease, shared with other keys.
    pub session: bool,
}

/// The bytes to store for a grant; `session` when the key is bound to a
/// session lease.
pub(crate) fn encode(
    holder: &HolderId,
    ttl: Duration,
    payload: &Payload,
    session: bool,
) -> Vec<u8> {
    let wire = Wire {
        format: FORMAT.to_string(),
        holder: holder.as_str().to_string(),
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        payload: BASE64.encode(payload.as_bytes()),
        session,
    };
    // Serializing a struct of strings and integers cannot fail; fall back to an
    // empty value (which `decode` rejects) rather than panic.
    serde_json::to_vec(&wire).unwrap_or_default()
}

/// Parses the key-value etcd returned for `key`. Anything this crate would not
/// have written is [`Error::CorruptRecord`], never "free".
pub(crate) fn decode(key: &LeaseKey, kv: &KeyValue) -> Result<Stored, Error> {
    let wire: Wire = serde_json::from_slice(kv.value()).map_err(|e| {
        Error::corrupt(
            key,
            format!(
                "{} bytes that are not a lease-etcd record ({e})",
                kv.value().len()
            ),
        )
    })?;
    if wire.format != FORMAT {
        return Err(Error::corrupt(
            key,
            format!("record format {:?}, expected {FORMAT:?}", wire.format),
        ));
    }
    if kv.lease() == 0 {
        // Every record this crate writes is bound to an etcd lease; one that is
        // not would never expire, so someone else wrote it.
        return Err(Error::corrupt(
            key,
            "the key is not bound to an etcd lease, so lease-etcd did not write it",
        ));
    }
    let holder = HolderId::new(wire.holder)
        .map_err(|e| Error::corrupt(key, format!("invalid holder id in record: {e}")))?;
    let payload = BASE64
        .decode(wire.payload.as_bytes())
        .map_err(|e| Error::corrupt(key, format!("payload is not base64: {e}")))
        .and_then(|bytes| {
            Payload::new(bytes).map_err(|e| Error::corrupt(key, format!("payload: {e}")))
        })?;
    let fence = u64::try_from(kv.create_revision())
        .map_err(|_| Error::corrupt(key, "negative create revision"))?;
    Ok(Stored {
        holder,
        ttl: Duration::from_millis(wire.ttl_ms),
        payload,
        fence: Fence(fence),
        lease: kv.lease(),
        mod_revision: kv.mod_revision(),
        session: wire.session,
    })
}
