//! The value stored at a lease key: who holds it, for how long, and the payload;
//! what a grant remembers of it (its [`Handle`]); and what callers are told
//! of it (a [`Holding`], a [`LeaseState`]).
//!
//! The fence is not in the value: it is the key's create revision, which etcd
//! assigns and nobody can write.

use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use etcd_client::{KeyValue, TxnOpResponse, TxnResponse};
use lease_core::{
    AcquireRequest, Error, Fence, Grant, HolderId, Holding, LeaseKey, LeaseState, Payload, Version,
};
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

/// The state a read of `key` shows: free when there is no key-value, else
/// the holding the record describes (the remaining time left out: etcd
/// reports it per lease, not per key). A value this crate did not write is
/// [`Error::CorruptRecord`].
pub(crate) fn state(key: &LeaseKey, kv: Option<&KeyValue>) -> Result<LeaseState, Error> {
    match kv {
        None => Ok(LeaseState::Free),
        Some(kv) => {
            let s = decode(key, kv)?;
            Ok(LeaseState::Held(Holding::new(
                s.holder, s.fence, s.ttl, s.payload,
            )))
        }
    }
}

/// A holding as reported to callers. etcd may enforce a longer minimum TTL
/// than we asked for (about 1.5 × its election timeout, 2 s by default), so
/// the remaining time is capped at the grant's TTL: callers see the TTL they
/// were promised, never more.
pub(crate) fn holding(stored: Stored, remaining: Duration) -> Holding {
    Holding::new(stored.holder, stored.fence, stored.ttl, stored.payload)
        .with_remaining(Some(remaining.min(stored.ttl)))
}

/// What a grant's [`Version`] carries: the etcd lease its key is bound to,
/// the revision of our last write to the key, the TTL in the record that
/// write left, and whether that lease is a session lease (shared with other
/// keys), as `"<lease>:<mod revision>:<ttl ms>"` or
/// `"<lease>:<mod revision>:<ttl ms>:s"`. A version that does not parse (or
/// `Version::default()`) gives zeros, which match no key: renew and release
/// then find the key's lease themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Handle {
    pub lease: i64,
    pub mod_revision: i64,
    /// The TTL in the record at `mod_revision` (zero: not known). A
    /// renewal's write keeps it when longer than the grant's own: a
    /// re-acquire of the term may have lengthened it.
    pub ttl: Duration,
    pub session: bool,
}

impl Handle {
    pub(crate) fn of(v: &Version) -> Handle {
        let mut parts = v.as_str().split(':');
        let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let (lease, mod_revision, ttl_ms) = (next(), next(), next());
        Handle {
            lease,
            mod_revision,
            ttl: Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0)),
            session: v.as_str().ends_with(":s"),
        }
    }

    pub(crate) fn version(self) -> Version {
        let tag = if self.session { ":s" } else { "" };
        Version::new(format!(
            "{}:{}:{}{tag}",
            self.lease,
            self.mod_revision,
            self.ttl.as_millis()
        ))
    }

    /// The handle of a record as read.
    pub(crate) fn read(stored: &Stored) -> Handle {
        Handle {
            lease: stored.lease,
            mod_revision: stored.mod_revision,
            ttl: stored.ttl,
            session: stored.session,
        }
    }

    /// The grant `req` receives: `fence` for `ttl` counted from `sent`,
    /// carrying this handle.
    pub(crate) fn grant(
        self,
        req: &AcquireRequest,
        fence: Fence,
        ttl: Duration,
        sent: Instant,
    ) -> Grant {
        Grant::new(
            req.key.clone(),
            req.holder.clone(),
            fence,
            ttl,
            sent,
            self.version(),
        )
    }
}

/// A grant's fence as the etcd create revision it stands for. A fence
/// beyond etcd's range (a grant not made by etcd) becomes `i64::MAX`, which
/// no key's revision equals.
pub(crate) fn revision(fence: Fence) -> i64 {
    i64::try_from(fence.get()).unwrap_or(i64::MAX)
}

/// The key-value a transaction's get found, if any.
pub(crate) fn first_kv(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
        _ => None,
    })
}
