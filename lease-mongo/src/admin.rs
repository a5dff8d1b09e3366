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

use lease_core::{BreakNote, Broken, Error, Holding, LeaseKey, LeaseState};
use mongodb::bson::{doc, Bson, DateTime, Document};

use super::{binary, clock_fence, durable, fence_i64, MongoBackend};
use crate::errors::map;
use crate::record::{as_i64, field, well_formed, MAX_FENCE, MIN_TTL_MS, SCHEMA};

/// Attempts before a break gives up on a key that keeps changing under it.
const ATTEMPTS: usize = 4;

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
        let mut outcome = None;
        for _ in 0..ATTEMPTS {
            match self.read_key(key).await {
                Ok(LeaseState::Free) => {
                    outcome = Some((None, false));
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
                    } };
                    let r = self
                        .coll
                        .update_one(filter, update)
                        .await
                        .map_err(|e| map("break", e))?;
                    if r.matched_count == 1 {
                        outcome = Some((Some(h), false));
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
                        outcome = Some((None, true));
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let Some((previous, corrupt)) = outcome else {
            return Err(Error::Unavailable {
                detail: format!(
                    "lease-mongo: {key} kept changing during {ATTEMPTS} break attempts"
                ),
                source: None,
            });
        };
        let name = self.audit_collection();
        let audit = self
            .coll
            .client()
            .database(&self.config.database)
            .collection_with_options::<Document>(&name, durable(self.config.request_timeout));
        let inserted = audit
            .insert_one(audit_doc(key, note, previous.as_ref(), corrupt))
            .await
            .map_err(|e| {
                Error::Backend(
                    format!("lease key {key} was broken, but its audit record could not be written to {name}: {e}")
                        .into(),
                )
            })?;
        let id = match inserted.inserted_id {
            Bson::ObjectId(id) => id.to_hex(),
            other => other.to_string(),
        };
        Ok(Broken {
            previous,
            audit: format!("{}.{name} _id {id}", self.config.database),
        })
    }
}

fn audit_doc(
    key: &LeaseKey,
    note: &BreakNote,
    previous: Option<&Holding>,
    corrupt: bool,
) -> Document {
    let at = i64::try_from(note.at_unix_ms).unwrap_or(i64::MAX);
    let previous = match previous {
        Some(h) => Bson::Document(doc! {
            "holder": h.holder.as_str(),
            "fence": i64::try_from(h.fence.get()).unwrap_or(i64::MAX),
            "ttl_ms": i64::try_from(h.ttl.as_millis()).unwrap_or(i64::MAX),
            "payload_len": i64::try_from(h.payload.len()).unwrap_or(i64::MAX),
        }),
        None => Bson::Null,
    };
    doc! {
        "action": "break",
        "key": key.as_str(),
        "by": note.by.as_str(),
        "reason": note.reason.as_str(),
        "at_unix_ms": at,
        "at": DateTime::from_millis(at),
        "previous": previous,
        "replaced_corrupt_record": corrupt,
    }
}
