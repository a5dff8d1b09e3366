//! The administrative break ([`LeaseBackend::break_lease`](lease_core::LeaseBackend::break_lease))
//! on MongoDB.
//!
//! Like a release, without the holder check: the live grant's document is
//! updated — matching its (holder, fence) as just read — to hold nobody,
//! keeping the fence counter, so the next acquire takes the key at once with
//! the next fence. A document that is not a lease record is replaced (only if
//! still exactly as read) by a released record; its fence is unknown, so the
//! new record carries the larger of the `fence` it names (if that is a valid
//! fence) and the server's clock floor that every grant's fence respects
//! (`$$NOW` in ms × 1000, see the crate docs) — so no later fence can fall
//! below an earlier one, whatever the breaker's own clock says.
//!
//! The audit record is a document in the companion collection
//! `{collection}_audit` of the same database: lease documents are keyed by
//! `_id` in their own collection, so an audit record can never be read as
//! a lease.
//!
//! The break itself also stamps the lease document with a `last_break`
//! field (the note, the previous holding and the audit record's id), in the
//! same write that ends the grant. So when the audit write fails — or the
//! answer to the break is lost — a retry with the same [`BreakNote`]
//! recognises its own earlier break and only writes the missing audit
//! record (under the same id, so at most one exists), instead of breaking
//! the next holder, who may have acquired the key meanwhile.

use lease_core::{
    BreakNote, Broken, Error, Fence, HolderId, Holding, LeaseKey, LeaseState, Payload,
};
use mongodb::bson::{doc, oid::ObjectId, Binary, Bson, DateTime, Document};
use std::time::Duration;

use super::{binary, clock_fence, durable, fence_i64, MongoBackend};
use crate::errors::{is_duplicate_key, map};
use crate::record::{as_i64, field, well_formed, MAX_FENCE, MIN_TTL_MS, SCHEMA};

/// Attempts before a break gives up on a key that keeps changing under it.
const ATTEMPTS: usize = 4;

/// The lease document's record of the last break applied to it.
const LAST_BREAK: &str = "last_break";

/// What a break did: the previous grant, whether a corrupt record was
/// replaced, and the id of its audit record.
struct Outcome {
    previous: Option<Holding>,
    corrupt: bool,
    audit_id: ObjectId,
}

impl MongoBackend {
    /// The name of the collection holding break audit records.
    pub fn audit_collection(&self) -> String {
        format!("{}_audit", self.coll.name())
    }

    pub(super) async fn break_key(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        let audit_id = ObjectId::new();
        let mut outcome = None;
        for _ in 0..ATTEMPTS {
            // A retry of a break that was already applied (its answer, or its
            // audit record, was lost): finish that one, break nobody else.
            let raw = self
                .coll
                .find_one(doc! { field::ID: key.as_str() })
                .await
                .map_err(|e| map("break: reading the record", e))?;
            if let Some(done) = raw.as_ref().and_then(|d| earlier_break(d, note)) {
                outcome = Some(done);
                break;
            }
            match self.read_key(key).await {
                Ok(LeaseState::Free) => {
                    outcome = Some(Outcome {
                        previous: None,
                        corrupt: false,
                        audit_id,
                    });
                    break;
                }
                Ok(LeaseState::Held(h)) => {
                    let filter = doc! {
                        field::ID: key.as_str(),
                        field::HOLDER: h.holder.as_str(),
                        field::FENCE: fence_i64(h.fence)?,
                        "$expr": well_formed(),
                    };
                    let update = doc! { "$set": {
                        field::HOLDER: Bson::Null,
                        field::PAYLOAD: binary(&[]),
                        LAST_BREAK: stamp(note, Some(&h), false, audit_id),
                    } };
                    let r = self
                        .coll
                        .update_one(filter, update)
                        .await
                        .map_err(|e| map("break", e))?;
                    if r.matched_count == 1 {
                        outcome = Some(Outcome {
                            previous: Some(h),
                            corrupt: false,
                            audit_id,
                        });
                        break;
                    }
                }
                Err(Error::CorruptRecord { .. }) => {
                    let found = self
                        .coll
                        .find_one(doc! { field::ID: key.as_str() })
                        .await
                        .map_err(|e| map("break: reading the corrupt record", e))?;
                    let Some(found) = found else { continue };
                    // The record's own fence when it still names one, and
                    // never below the server's clock floor that acquires use:
                    // the next grant is above both.
                    let fence = found
                        .get(field::FENCE)
                        .and_then(as_i64)
                        .filter(|f| (1..=MAX_FENCE).contains(f))
                        .unwrap_or(0);
                    let released = doc! { "$replaceWith": {
                        field::ID: key.as_str(),
                        field::SCHEMA: SCHEMA,
                        field::FENCE: { "$max": [ { "$literal": fence }, clock_fence() ] },
                        field::HOLDER: Bson::Null,
                        field::TTL_MS: MIN_TTL_MS,
                        field::EXPIRES_MS: 0_i64,
                        field::AT_MS: 0_i64,
                        field::PAYLOAD: { "$literal": binary(&[]) },
                        LAST_BREAK: { "$literal": stamp(note, None, true, audit_id) },
                    } };
                    // Only if still exactly as read (compared as a whole, as a
                    // literal: no field of it is read as a query operator).
                    let unchanged = doc! {
                        field::ID: key.as_str(),
                        "$expr": { "$eq": [ "$$ROOT", { "$literal": found } ] },
                    };
                    let r = self
                        .coll
                        .update_one(unchanged, vec![released])
                        .await
                        .map_err(|e| map("break: replacing the corrupt record", e))?;
                    if r.matched_count == 1 {
                        outcome = Some(Outcome {
                            previous: None,
                            corrupt: true,
                            audit_id,
                        });
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let Some(outcome) = outcome else {
            return Err(Error::Unavailable {
                detail: format!(
                    "lease-mongo: {key} kept changing during {ATTEMPTS} break attempts"
                ),
                source: None,
            });
        };
        let name = self.audit_collection();
        let timeout = self.config.request_timeout;
        let audit = self
            .coll
            .client()
            .database(&self.config.database)
            .collection_with_options::<Document>(&name, durable(timeout));
        let record = audit_doc(key, note, &outcome);
        let written = match audit.insert_one(record).await {
            Ok(_) => Ok(()),
            // Written by an earlier attempt of this same break.
            Err(e) if is_duplicate_key(&e) => {
                match audit.find_one(doc! { "_id": outcome.audit_id }).await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err(e),
                    Err(e2) => Err(e2),
                }
            }
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            let what = match &outcome.previous {
                Some(h) => format!("it ended the grant of {} with fence {}", h.holder, h.fence),
                None if outcome.corrupt => "it replaced a corrupt record".to_string(),
                None => "the key was already free".to_string(),
            };
            return Err(Error::unavailable(
                format!(
                    "lease-mongo: the break of {key} WAS applied ({what}), but its audit record could not be written to {}.{name}; the lease document keeps it in its `{LAST_BREAK}` field. Retry the break with the same note to write the audit record: the retry breaks no one else",
                    self.config.database
                ),
                e,
            ));
        }
        Ok(Broken {
            previous: outcome.previous,
            audit: format!(
                "{}.{name} _id {}",
                self.config.database,
                outcome.audit_id.to_hex()
            ),
        })
    }
}

fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The `last_break` stamp a break leaves in the lease document.
fn stamp(
    note: &BreakNote,
    previous: Option<&Holding>,
    corrupt: bool,
    audit_id: ObjectId,
) -> Document {
    let previous = match previous {
        Some(h) => Bson::Document(doc! {
            "holder": h.holder.as_str(),
            "fence": i64::try_from(h.fence.get()).unwrap_or(i64::MAX),
            "ttl_ms": millis_i64(h.ttl),
            "remaining_ms": h.remaining.map(millis_i64),
            "payload": binary(h.payload.as_bytes()),
        }),
        None => Bson::Null,
    };
    doc! {
        "by": note.by.as_str(),
        "reason": note.reason.as_str(),
        "at_unix_ms": i64::try_from(note.at_unix_ms).unwrap_or(i64::MAX),
        "audit_id": audit_id,
        "previous": previous,
        "replaced_corrupt_record": corrupt,
    }
}

/// The outcome of an earlier break with this very note, as stamped in the
/// lease document `d`, if that is the last break applied to it.
fn earlier_break(d: &Document, note: &BreakNote) -> Option<Outcome> {
    let s = d.get_document(LAST_BREAK).ok()?;
    let at = i64::try_from(note.at_unix_ms).unwrap_or(i64::MAX);
    let same = s.get_str("by").ok() == Some(note.by.as_str())
        && s.get_str("reason").ok() == Some(note.reason.as_str())
        && s.get("at_unix_ms").and_then(as_i64) == Some(at);
    if !same {
        return None;
    }
    let audit_id = s.get_object_id("audit_id").ok()?;
    let corrupt = s.get_bool("replaced_corrupt_record").ok()?;
    let previous = match s.get("previous") {
        Some(Bson::Document(p)) => {
            let holder = HolderId::new(p.get_str("holder").ok()?).ok()?;
            let fence = u64::try_from(p.get("fence").and_then(as_i64)?).ok()?;
            let ttl = u64::try_from(p.get("ttl_ms").and_then(as_i64)?).ok()?;
            let remaining = p
                .get("remaining_ms")
                .and_then(as_i64)
                .and_then(|r| u64::try_from(r).ok())
                .map(Duration::from_millis);
            let payload = match p.get("payload") {
                Some(Bson::Binary(Binary { bytes, .. })) => Payload::new(bytes.clone()).ok()?,
                _ => return None,
            };
            Some(Holding {
                holder,
                fence: Fence(fence),
                remaining,
                ttl: Duration::from_millis(ttl),
                payload,
            })
        }
        Some(Bson::Null) => None,
        _ => return None,
    };
    Some(Outcome {
        previous,
        corrupt,
        audit_id,
    })
}

fn audit_doc(key: &LeaseKey, note: &BreakNote, outcome: &Outcome) -> Document {
    let at = i64::try_from(note.at_unix_ms).unwrap_or(i64::MAX);
    let previous = match &outcome.previous {
        Some(h) => Bson::Document(doc! {
            "holder": h.holder.as_str(),
            "fence": i64::try_from(h.fence.get()).unwrap_or(i64::MAX),
            "ttl_ms": millis_i64(h.ttl),
            "payload_len": i64::try_from(h.payload.len()).unwrap_or(i64::MAX),
        }),
        None => Bson::Null,
    };
    doc! {
        "_id": outcome.audit_id,
        "action": "break",
        "key": key.as_str(),
        "by": note.by.as_str(),
        "reason": note.reason.as_str(),
        "at_unix_ms": at,
        "at": DateTime::from_millis(at),
        "previous": previous,
        "replaced_corrupt_record": outcome.corrupt,
    }
}
