//! The administrative break ([`LeaseBackend::break_lease`](lease_core::LeaseBackend::break_lease))
//! on object stores.
//!
//! Like a release, without the holder check: the lease object is overwritten,
//! conditionally on the ETag just read, by a "released" record that keeps
//! the fence, so the next acquire takes the key at once with the next fence.
//! An object that is not a lease record (corrupt or foreign) is replaced the
//! same way; its fence is unknown, so the released record carries the fence
//! its header names if one can be read, and otherwise the break's wall-clock
//! milliseconds — far above any counter this crate reaches by incrementing —
//! so that no later fence can fall below an earlier one.
//!
//! The audit record is the object `{prefix}/.audit/{key}/{fence}-{at_unix_ms}`
//! (a JSON document). Lease keys never have a segment starting with `.`, so
//! no lease object can live under `{prefix}/.audit/`.

use lease_core::{BreakNote, Broken, Error, Holding, LeaseKey};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutOptions, PutPayload};
use serde_json::json;

use super::{holding, ObjectStoreBackend};
use crate::core::{put_error, read_body, store_error, update_mode, version_tag};
use crate::record::{Record, State};

/// Conditional writes one break makes before it gives up on a key that keeps
/// changing under it.
const MAX_WRITES: u32 = 3;

impl ObjectStoreBackend {
    /// The object path of the audit record of a break of `key`.
    pub fn audit_path(&self, key: &LeaseKey, fence: u64, at_unix_ms: u64) -> Result<Path, Error> {
        let name = format!(".audit/{}/{fence}-{at_unix_ms}", key.as_str());
        let joined = if self.inner.prefix.as_ref().is_empty() {
            name
        } else {
            format!("{}/{name}", self.inner.prefix.as_ref())
        };
        Path::parse(&joined).map_err(|_| Error::InvalidKey {
            key: key.as_str().to_owned(),
            reason: "no valid audit object path under this prefix",
        })
    }

    pub(super) async fn break_key(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        let path = self.path(key)?;
        let store = &self.inner.core.store;
        let mut outcome = None;
        for _ in 0..MAX_WRITES {
            let res = match store.get(&path).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => {
                    outcome = Some((0, None, false));
                    break;
                }
                Err(e) => return Err(store_error("GET", &path, e)),
            };
            let etag = version_tag(res.meta.e_tag.as_deref(), res.meta.version.as_deref()).ok_or_else(|| {
                Error::Backend(
                    format!("GET {path}: the store returned no ETag, so a conditional break is impossible")
                        .into(),
                )
            })?;
            let body = read_body(&path, key.as_str(), res).await?;
            let bytes = body.as_ref();
            let (released, previous, corrupt) = match Record::decode(bytes) {
                Ok(r) if r.state == State::Released => {
                    outcome = Some((r.fence, None, false));
                    break;
                }
                Ok(r) => {
                    let previous: Holding = holding(key, r.clone())?;
                    let released = Record {
                        state: State::Released,
                        payload: Vec::new(),
                        nonce: lease_core::HolderId::random().as_str().to_owned(),
                        ..r
                    };
                    (released, Some(previous), false)
                }
                Err(_) => {
                    let fence = header_fence(bytes).unwrap_or(note.at_unix_ms.max(1));
                    let released = Record {
                        state: State::Released,
                        holder: "lease-break".into(),
                        fence,
                        ttl_ms: 1000,
                        nonce: lease_core::HolderId::random().as_str().to_owned(),
                        payload: Vec::new(),
                    };
                    (released, None, true)
                }
            };
            // The store must honour the condition, or this could overwrite a
            // grant taken after the read.
            self.inner.core.ensure_probed().await?;
            let opts = PutOptions::from(update_mode(&etag));
            match store
                .put_opts(&path, PutPayload::from(released.encode()), opts)
                .await
            {
                Ok(_) => {
                    outcome = Some((released.fence, previous, corrupt));
                    break;
                }
                // Renewed, released or taken since the read: look again.
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::AlreadyExists { .. }
                    | object_store::Error::NotFound { .. },
                ) => {}
                Err(e) => return Err(put_error(&path, e)),
            }
        }
        let Some((fence, previous, corrupt)) = outcome else {
            return Err(Error::Unavailable {
                detail: format!(
                    "{key}: the lease object changed under {MAX_WRITES} conditional writes in a row"
                ),
                source: None,
            });
        };
        let audit = self.audit_path(key, fence, note.at_unix_ms)?;
        let body = audit_body(key, note, previous.as_ref(), corrupt);
        store
            .put(&audit, PutPayload::from(body))
            .await
            .map_err(|e| {
                Error::Backend(
                    format!("lease key {key} was broken, but its audit record {audit} could not be written: {e}")
                        .into(),
                )
            })?;
        Ok(Broken {
            previous,
            audit: audit.to_string(),
        })
    }
}

/// The `fence` a damaged record's header line still names, if any.
fn header_fence(bytes: &[u8]) -> Option<u64> {
    let line = bytes.split(|&b| b == b'\n').next()?;
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    v.get("fence")?.as_u64().filter(|f| *f > 0)
}

fn audit_body(
    key: &LeaseKey,
    note: &BreakNote,
    previous: Option<&Holding>,
    corrupt: bool,
) -> Vec<u8> {
    json!({
        "format": "lease-s3-audit/1",
        "action": "break",
        "key": key.as_str(),
        "by": note.by,
        "reason": note.reason,
        "at_unix_ms": note.at_unix_ms,
        "previous": previous.map(|h| json!({
            "holder": h.holder.as_str(),
            "fence": h.fence.get(),
            "ttl_ms": u64::try_from(h.ttl.as_millis()).unwrap_or(u64::MAX),
            "payload_len": h.payload.len(),
        })),
        "replaced_corrupt_record": corrupt,
    })
    .to_string()
    .into_bytes()
}
