//! The administrative break ([`LeaseBackend::break_lease`](lease_core::LeaseBackend::break_lease))
//! on MongoDB, and reading it back
//! ([`LeaseBackend::last_break`](lease_core::LeaseBackend::last_break)).
//!
//! Like a release, without the holder check: the live grant's document is
//! updated — matching its (holder, fence) as just read — to hold nobody,
//! keeping the fence counter, so the next acquire takes the key at once with
//! the next fence. A document that is not a lease record is replaced (only if
//! still exactly as read) by a released record; its fence is unknown, so the
//! new record carries the larger of the `fence` it names (if that is a valid
//! fence) and the server's clock floor that every grant's fence respects
//! (`$$NOW` in ms × 1000, see the crate docs) — so no later fence can fall
//! below an earlier one, whatever the breaker's own clock says. A free key
//! is stamped too (only if its document is still exactly as read), and a
//! key with no document at all gets a released record (fence: the clock
//! floor), so that every break leaves its stamp.
//!
//! The audit record is a document in the companion collection
//! `{collection}_audit` of the same database: lease documents are keyed by
//! `_id` in their own collection, so an audit record can never be read as
//! a lease.
//!
//! The break itself also stamps the lease document with a `last_break`
//! field (the note, the previous holding, the audit record's id and a
//! sequence number `seq`), in the same write that ends the grant. So when
//! the audit write fails — or the answer to the break is lost — a retry with
//! the same [`BreakNote`] recognises its own earlier break and only writes
//! the missing audit record (under the same id, so at most one exists),
//! instead of breaking the next holder, who may have acquired the key
//! meanwhile.
//!
//! Acquire, renew and release set only the lease fields, so the stamp stays
//! on the document until the next break replaces it: reading the last break
//! is one `find` of the stamp, even after the key was taken again. Only a
//! document without a stamp (deleted and re-created behind the library's
//! back, or broken by a version that did not stamp) is looked up in the
//! audit collection, newest first by `seq`: like a fence, the larger of one
//! above the previous stamp's and the server's clock floor, computed on the
//! server in the break's own write, so it only rises — also across a
//! deleted document. Audit records written before `seq` existed sort after
//! those with one, newest `_id` first.
//!
//! # The audit record
//!
//! One document per break, `_id` the id named in
//! [`Broken::audit`](lease_core::Broken::audit): `action: "break"`, `key`,
//! the note (`by`, `reason`, `at_unix_ms`, and `at` as a date), `previous`
//! (the ended grant's `holder`, `fence`, `ttl_ms` and `payload_len`, or
//! null), `seq`, `removed_corrupt_record`, and `removed`: when the break
//! replaced a document that was not a lease record, what was there,
//! bounded — `{ len, head_base64 }`, the byte length of that document as
//! BSON and its first [`audit::REMOVED_HEAD_MAX`] bytes in base64 (standard alphabet,
//! padded; the whole document when it is shorter: decode it and read it
//! with `bsondump` or any BSON library). These are the bytes of the very
//! document the replacing write was guarded on, as the server returned
//! them, not a later read; null when nothing corrupt was replaced (or the
//! break was stamped by a version that did not keep them). The stamp of
//! such a break carries the same `removed` (its head as binary), so a retry
//! that only writes the missing audit record still has it.

use lease_core::audit::{self, AuditRecord};
use lease_core::{
    BreakNote, Broken, Error, Fence, HolderId, Holding, LastBreak, LeaseKey, LeaseState, Payload,
    CONTENTION_ATTEMPTS,
};
use mongodb::bson::{doc, oid::ObjectId, Binary, Bson, DateTime, Document, RawDocumentBuf};
use mongodb::options::ReturnDocument;
use mongodb::Collection;
use std::time::Duration;

use crate::backend::MongoBackend;
use crate::connect::durable;
use crate::errors::{bounded, is_duplicate_key, map};
use crate::record::{
    as_i64, binary, clock_fence, fence_i64, field, int_in, well_formed, MAX_FENCE, MIN_TTL_MS,
    SCHEMA,
};

/// The lease document's record of the last break applied to it.
const LAST_BREAK: &str = "last_break";

/// The field of a stamp (and of its audit record) that orders breaks of a
/// key: it only rises (see the module docs).
const SEQ: &str = "seq";

/// The field of a stamp and of an audit record telling what a break
/// replaced (see the module docs).
const REMOVED: &str = audit::REMOVED;

/// How stamps and audit records written before the shared schema
/// ([`lease_core::audit`]) named [`audit::REMOVED_CORRUPT_RECORD`].
const LEGACY_CORRUPT_FLAG: &str = "replaced_corrupt_record";

/// What a break did: the previous grant, whether a corrupt record was
/// replaced (and what of it is kept), the id of its audit record and its
/// sequence number (`None`: the stamp was written by a version without
/// one).
struct Outcome {
    previous: Option<Holding>,
    corrupt: bool,
    removed: Option<Removed>,
    audit_id: ObjectId,
    seq: Option<i64>,
}

/// The bounded part of a document a break replaced: its length as BSON and
/// its first [`audit::REMOVED_HEAD_MAX`] bytes.
struct Removed {
    len: i64,
    head: Vec<u8>,
}

impl Removed {
    /// What to keep of the document whose BSON is `bson`.
    fn of(bson: &[u8]) -> Removed {
        Removed {
            len: i64::try_from(bson.len()).unwrap_or(i64::MAX),
            head: bson.get(..audit::REMOVED_HEAD_MAX).unwrap_or(bson).to_vec(),
        }
    }

    /// As the stamp keeps it: the head as binary.
    fn stamped(&self) -> Bson {
        Bson::Document(doc! { "len": self.len, "head": binary(&self.head) })
    }

    /// Read back from a stamp; `None` when absent or not in that shape (the
    /// audit record then says nothing of what was removed).
    fn from_stamp(b: Option<&Bson>) -> Option<Removed> {
        let Some(Bson::Document(r)) = b else {
            return None;
        };
        let len = r.get("len").and_then(as_i64).filter(|l| *l >= 0)?;
        match r.get("head") {
            Some(Bson::Binary(Binary { bytes, .. })) if bytes.len() <= audit::REMOVED_HEAD_MAX => {
                Some(Removed {
                    len,
                    head: bytes.clone(),
                })
            }
            _ => None,
        }
    }

    /// As the audit record keeps it.
    fn audited(&self) -> audit::Removed {
        let mut kept = audit::Removed::of(&self.head);
        kept.len = u64::try_from(self.len).unwrap_or_default();
        kept
    }
}

impl MongoBackend {
    /// The name of the collection holding break audit records, one per
    /// break; a break that replaced a corrupt or foreign document keeps its
    /// BSON length and first 4096 bytes there (`removed: { len,
    /// head_base64 }`, see the crate docs).
    pub fn audit_collection(&self) -> String {
        format!("{}_audit", self.coll.name())
    }

    /// The audit collection, used as durably as the lease collection.
    fn audit(&self) -> Collection<Document> {
        self.coll
            .client()
            .database(&self.config.database)
            .collection_with_options::<Document>(
                &self.audit_collection(),
                durable(self.config.request_timeout),
            )
    }

    /// [`LeaseBackend::break_lease`](lease_core::LeaseBackend::break_lease),
    /// within the request timeout.
    pub(crate) async fn break_key(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        bounded(
            "break",
            self.config.request_timeout,
            self.send_break(key, note),
        )
        .await
    }

    /// The break's requests (see the module docs), unbounded.
    async fn send_break(&self, key: &LeaseKey, note: &BreakNote) -> Result<Broken, Error> {
        let audit_id = ObjectId::new();
        let mut outcome = None;
        for _ in 0..CONTENTION_ATTEMPTS {
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
            match self.send_read(key).await {
                Ok(LeaseState::Free) => {
                    let stamped = match &raw {
                        // Stamped only if still exactly as read (and so still
                        // free): a key taken meanwhile is looked at again.
                        Some(found) => {
                            let unchanged = doc! {
                                field::ID: key.as_str(),
                                "$expr": { "$eq": [ "$$ROOT", { "$literal": found } ] },
                            };
                            let set = doc! { "$set": {
                                LAST_BREAK: stamp_expr(note, None, None, audit_id),
                            } };
                            self.coll
                                .find_one_and_update(unchanged, vec![set])
                                .return_document(ReturnDocument::After)
                                .await
                                .map_err(|e| map("break: stamping the free record", e))?
                        }
                        // No document: a released record carrying the stamp,
                        // only if there is still none (the filter matches no
                        // document; the upsert's insert meets any other one
                        // as a duplicate key).
                        None => {
                            let none = doc! { field::ID: key.as_str(), "$expr": false };
                            let created = self
                                .coll
                                .find_one_and_update(
                                    none,
                                    vec![released(key, 0, stamp_expr(note, None, None, audit_id))],
                                )
                                .upsert(true)
                                .return_document(ReturnDocument::After)
                                .await;
                            match created {
                                Ok(after) => after,
                                Err(e) if is_duplicate_key(&e) => None,
                                Err(e) => return Err(map("break: recording the free key", e)),
                            }
                        }
                    };
                    if let Some(after) = stamped {
                        outcome = Some(Outcome {
                            previous: None,
                            corrupt: false,
                            removed: None,
                            audit_id,
                            seq: stamped_seq(&after),
                        });
                        break;
                    }
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
                        field::PAYLOAD: { "$literal": binary(&[]) },
                        LAST_BREAK: stamp_expr(note, Some(&h), None, audit_id),
                    } };
                    let r = self
                        .coll
                        .find_one_and_update(filter, vec![update])
                        .return_document(ReturnDocument::After)
                        .await
                        .map_err(|e| map("break", e))?;
                    if let Some(after) = r {
                        outcome = Some(Outcome {
                            seq: stamped_seq(&after),
                            previous: Some(h),
                            corrupt: false,
                            removed: None,
                            audit_id,
                        });
                        break;
                    }
                }
                Err(Error::CorruptRecord { .. }) => {
                    // Read as the server's bytes: the audit record keeps (the
                    // head of) exactly what the replacing write is guarded on.
                    let found = self
                        .coll
                        .clone_with_type::<RawDocumentBuf>()
                        .find_one(doc! { field::ID: key.as_str() })
                        .await
                        .map_err(|e| map("break: reading the corrupt record", e))?;
                    let Some(found_raw) = found else { continue };
                    let removed = Removed::of(found_raw.as_bytes());
                    let found = found_raw
                        .to_document()
                        .map_err(|e| Error::Backend(Box::new(e)))?;
                    // The record's own fence when it still names one, and
                    // never below the server's clock floor that acquires use:
                    // the next grant is above both.
                    let fence = found
                        .get(field::FENCE)
                        .and_then(as_i64)
                        .filter(|f| (1..=MAX_FENCE).contains(f))
                        .unwrap_or(0);
                    let replacement =
                        released(key, fence, stamp_expr(note, None, Some(&removed), audit_id));
                    // Only if still exactly as read (compared as a whole, as a
                    // literal: no field of it is read as a query operator).
                    let unchanged = doc! {
                        field::ID: key.as_str(),
                        "$expr": { "$eq": [ "$$ROOT", { "$literal": found } ] },
                    };
                    let r = self
                        .coll
                        .find_one_and_update(unchanged, vec![replacement])
                        .return_document(ReturnDocument::After)
                        .await
                        .map_err(|e| map("break: replacing the corrupt record", e))?;
                    if let Some(after) = r {
                        outcome = Some(Outcome {
                            previous: None,
                            corrupt: true,
                            removed: Some(removed),
                            audit_id,
                            seq: stamped_seq(&after),
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
                    "lease-mongo: {key} kept changing during {CONTENTION_ATTEMPTS} break attempts"
                ),
                source: None,
            });
        };
        let name = self.audit_collection();
        let audit = self.audit();
        let inserted = match audit_doc(key, note, &outcome) {
            Ok(record) => audit.insert_one(record).await.map(|_| ()),
            Err(e) => Err(e.into()),
        };
        let written = match inserted {
            Ok(()) => Ok(()),
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
        Ok(Broken::new(
            outcome.previous,
            format!(
                "{}.{name} _id {}",
                self.config.database,
                outcome.audit_id.to_hex()
            ),
        ))
    }
}

fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The `last_break` stamp a break leaves in the lease document; `removed`:
/// what is kept of the corrupt record it replaces, if it replaces one.
fn stamp(
    note: &BreakNote,
    previous: Option<&Holding>,
    removed: Option<&Removed>,
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
    let mut s = doc! {
        "by": note.by.as_str(),
        "reason": note.reason.as_str(),
        "at_unix_ms": i64::try_from(note.at_unix_ms).unwrap_or(i64::MAX),
        "audit_id": audit_id,
        "previous": previous,
        audit::REMOVED_CORRUPT_RECORD: removed.is_some(),
    };
    if let Some(r) = removed {
        s.insert(REMOVED, r.stamped());
    }
    s
}

/// The stamp as an aggregation expression: every value of [`stamp`] as a
/// literal (so no text of the note is read as a field path or an
/// operator), and [`SEQ`] computed by the server from the document's
/// previous stamp and its clock.
fn stamp_expr(
    note: &BreakNote,
    previous: Option<&Holding>,
    removed: Option<&Removed>,
    audit_id: ObjectId,
) -> Document {
    let mut expr = Document::new();
    for (name, value) in stamp(note, previous, removed, audit_id) {
        expr.insert(name, doc! { "$literal": value });
    }
    expr.insert(SEQ, next_seq());
    expr
}

/// The sequence number of a new break: one above the previous stamp's (when
/// that is a sane integer) and at least the server's clock floor, as a new
/// grant's fence is — so it rises from break to break, also after the
/// document was deleted and re-created.
fn next_seq() -> Document {
    let path = format!("{LAST_BREAK}.{SEQ}");
    doc! { "$max": [
        { "$add": [
            { "$cond": [ int_in(&path, 1, MAX_FENCE), format!("${path}"), 0_i64 ] },
            1_i64,
        ] },
        clock_fence(),
    ] }
}

/// The `$replaceWith` stage writing a released record at `key` with the
/// break's stamp (an expression, see [`stamp_expr`]): its fence is the
/// larger of `fence` and the server's clock floor, so the next grant's is
/// above every earlier one.
fn released(key: &LeaseKey, fence: i64, stamp: Document) -> Document {
    doc! { "$replaceWith": {
        field::ID: key.as_str(),
        field::SCHEMA: SCHEMA,
        field::FENCE: { "$max": [ { "$literal": fence }, clock_fence() ] },
        field::HOLDER: Bson::Null,
        field::TTL_MS: MIN_TTL_MS,
        field::EXPIRES_MS: 0_i64,
        field::AT_MS: 0_i64,
        field::PAYLOAD: { "$literal": binary(&[]) },
        LAST_BREAK: stamp,
    } }
}

/// The sequence number the server gave the stamp in `after` (the lease
/// document as a break left it).
fn stamped_seq(after: &Document) -> Option<i64> {
    after
        .get_document(LAST_BREAK)
        .ok()
        .and_then(|s| s.get(SEQ))
        .and_then(as_i64)
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
    // Stamps written before the audit schema was shared spell the flag
    // `removed_corrupt_record`.
    let corrupt = s
        .get_bool(audit::REMOVED_CORRUPT_RECORD)
        .or_else(|_| s.get_bool(LEGACY_CORRUPT_FLAG))
        .ok()?;
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
            Some(
                Holding::new(holder, Fence(fence), Duration::from_millis(ttl), payload)
                    .with_remaining(remaining),
            )
        }
        Some(Bson::Null) => None,
        _ => return None,
    };
    Some(Outcome {
        previous,
        corrupt,
        // What the break replaced, as it kept it when it replaced it.
        removed: Removed::from_stamp(s.get(REMOVED)).filter(|_| corrupt),
        audit_id,
        // A stamp written before `seq` existed has none.
        seq: s.get(SEQ).and_then(as_i64),
    })
}

/// The audit record of a break (see the module docs): the shared record as
/// BSON, without a format, with the note's time also as a date (`at`) and
/// the stamp's `seq`.
fn audit_doc(
    key: &LeaseKey,
    note: &BreakNote,
    outcome: &Outcome,
) -> Result<Document, mongodb::bson::ser::Error> {
    // As stamps store it: BSON has no unsigned integers.
    let at = i64::try_from(note.at_unix_ms).unwrap_or(i64::MAX);
    let note = note.clone().with_at_unix_ms(at.unsigned_abs()); // `at` is never negative
    let removed = outcome.removed.as_ref().map(Removed::audited);
    let mut record = AuditRecord::new(None, key, &note, outcome.previous.as_ref(), removed);
    // A break stamped by a version that did not keep what it replaced.
    record.removed_corrupt_record = outcome.corrupt;
    if let Some(seq) = outcome.seq.and_then(|s| u64::try_from(s).ok()) {
        record = record.with_seq(seq);
    }
    let mut doc = mongodb::bson::to_document(&record)?;
    doc.insert("_id", outcome.audit_id);
    doc.insert("at", DateTime::from_millis(at));
    Ok(doc)
}

impl MongoBackend {
    /// The most recent break of `key` (see the module docs): its lease
    /// document's `last_break` stamp, in one `find`; only when the document
    /// has none (or is gone), the newest audit record of the key. Writes
    /// nothing.
    pub(crate) async fn read_last_break(&self, key: &LeaseKey) -> Result<Option<LastBreak>, Error> {
        bounded(
            "last_break",
            self.config.request_timeout,
            self.send_last_break(key),
        )
        .await
    }

    /// [`read_last_break`](Self::read_last_break)'s requests, unbounded.
    async fn send_last_break(&self, key: &LeaseKey) -> Result<Option<LastBreak>, Error> {
        let found = self
            .coll
            .find_one(doc! { field::ID: key.as_str() })
            .projection(doc! { LAST_BREAK: 1 })
            .await
            .map_err(|e| map("last_break: reading the lease document", e))?;
        if let Some(stamp) = found.as_ref().and_then(|d| d.get(LAST_BREAK)) {
            return match stamp {
                Bson::Document(s) => read_break(s).map(Some).map_err(|detail| {
                    Error::corrupt(key, format!("its `{LAST_BREAK}` stamp: {detail}"))
                }),
                other => Err(Error::corrupt(
                    key,
                    format!(
                        "its `{LAST_BREAK}` stamp is not a document: {}",
                        shown(other)
                    ),
                )),
            };
        }
        let newest = self
            .audit()
            .find_one(doc! { "key": key.as_str(), "action": "break" })
            .sort(doc! { SEQ: -1, "_id": -1 })
            .await
            .map_err(|e| map("last_break: reading the audit records", e))?;
        match newest {
            None => Ok(None),
            Some(record) => read_audit(key, &record).map(Some).map_err(|detail| {
                let id = match record.get("_id") {
                    Some(Bson::ObjectId(id)) => id.to_hex(),
                    Some(other) => other.to_string(),
                    None => "(none)".to_string(),
                };
                Error::corrupt(
                    key,
                    format!(
                        "its audit record {}.{} _id {id}: {detail}",
                        self.config.database,
                        self.audit_collection()
                    ),
                )
            }),
        }
    }
}

/// A break as the audit record `d` of `key` tells it, or what is wrong with
/// it: the shared record (without a format), whose `seq`, when present,
/// must be positive (records written before it existed have none), and
/// whose fence is one this backend gives.
fn read_audit(key: &LeaseKey, d: &Document) -> Result<LastBreak, String> {
    let record: AuditRecord = mongodb::bson::from_document(d.clone())
        .map_err(|e| format!("not an audit record of a break: {e}"))?;
    let record = record.verify(None, key)?;
    if record.seq == Some(0) {
        return Err(format!("`{SEQ}` is not a positive integer: 0"));
    }
    if let Some(p) = &record.previous {
        if p.fence.get() > MAX_FENCE.unsigned_abs() {
            return Err(format!("`previous.fence` is not a fence: {}", p.fence));
        }
    }
    Ok(record.last_break())
}

/// A break as a stamp tells it (`by`, `reason`, `at_unix_ms` and
/// `previous`, a holding or null), or what is wrong with it. Fields it does
/// not need are not looked at, except `seq`, which must be a positive
/// integer when present (stamps written before it existed have none).
fn read_break(d: &Document) -> Result<LastBreak, String> {
    let text = |name: &str| match d.get(name) {
        Some(Bson::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("`{name}` is not text: {}", shown(other))),
        None => Err(format!("`{name}` is missing")),
    };
    let by = text("by")?;
    let reason = text("reason")?;
    let at_unix_ms = match d.get("at_unix_ms") {
        Some(b) => as_i64(b)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| format!("`at_unix_ms` is not a non-negative integer: {}", shown(b)))?,
        None => return Err("`at_unix_ms` is missing".into()),
    };
    if let Some(seq) = d.get(SEQ) {
        if as_i64(seq).is_none_or(|s| s < 1) {
            return Err(format!("`{SEQ}` is not a positive integer: {}", shown(seq)));
        }
    }
    let (holder, fence) = match d.get("previous") {
        Some(Bson::Null) => (None, None),
        Some(Bson::Document(p)) => {
            let holder = match p.get("holder") {
                Some(Bson::String(h)) => HolderId::new(h.as_str())
                    .map_err(|e| format!("`previous.holder` is not a holder id: {e}"))?,
                Some(other) => {
                    return Err(format!("`previous.holder` is not text: {}", shown(other)))
                }
                None => return Err("`previous.holder` is missing".into()),
            };
            let fence = match p.get("fence") {
                Some(b) => as_i64(b)
                    .filter(|f| (1..=MAX_FENCE).contains(f))
                    .and_then(|f| u64::try_from(f).ok())
                    .ok_or_else(|| format!("`previous.fence` is not a fence: {}", shown(b)))?,
                None => return Err("`previous.fence` is missing".into()),
            };
            (Some(holder), Some(Fence(fence)))
        }
        Some(other) => {
            return Err(format!(
                "`previous` is neither a holding nor null: {}",
                shown(other)
            ))
        }
        None => return Err("`previous` is missing".into()),
    };
    Ok(LastBreak::new(
        holder,
        fence,
        BreakNote::new(by, reason).with_at_unix_ms(at_unix_ms),
    ))
}

/// A stored value for an error message, cut short when long.
fn shown(b: &Bson) -> String {
    const MAX: usize = 120;
    let text = b.to_string();
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::Payload;

    fn key() -> LeaseKey {
        LeaseKey::new("jobs/a").unwrap()
    }

    fn note() -> BreakNote {
        BreakNote::new("op", "stuck").with_at_unix_ms(17)
    }

    fn id() -> ObjectId {
        ObjectId::parse_str("65f0a1b2c3d4e5f601234567").unwrap()
    }

    /// Audit records exactly as breaks wrote them before the record was
    /// shared: a live grant's, and a corrupt document's.
    fn written_before() -> [Document; 2] {
        [
            doc! {
                "_id": id(), "action": "break", "key": "jobs/a", "by": "op", "reason": "stuck",
                "at_unix_ms": 17_i64, "at": DateTime::from_millis(17),
                "previous": { "holder": "h-1", "fence": 9_i64, "ttl_ms": 5000_i64, "payload_len": 3_i64 },
                "removed_corrupt_record": false, "removed": Bson::Null, "seq": 12_i64,
            },
            doc! {
                "_id": id(), "action": "break", "key": "jobs/a", "by": "op", "reason": "stuck",
                "at_unix_ms": 17_i64, "at": DateTime::from_millis(17), "previous": Bson::Null,
                "removed_corrupt_record": true,
                "removed": { "len": 4_i64, "head_base64": "anVuaw==" }, "seq": 13_i64,
            },
        ]
    }

    fn outcomes() -> [Outcome; 2] {
        let holder = HolderId::new("h-1").unwrap();
        let prev = Holding::new(
            holder,
            Fence(9),
            Duration::from_secs(5),
            Payload::new(b"abc".to_vec()).unwrap(),
        );
        [
            Outcome {
                previous: Some(prev),
                corrupt: false,
                removed: None,
                audit_id: id(),
                seq: Some(12),
            },
            Outcome {
                previous: None,
                corrupt: true,
                removed: Some(Removed::of(b"junk")),
                audit_id: id(),
                seq: Some(13),
            },
        ]
    }

    /// The same fields with the same values and types, in any order.
    fn same_fields(a: &Document, b: &Document) -> bool {
        a.len() == b.len() && a.iter().all(|(k, v)| b.get(k) == Some(v))
    }

    #[test]
    fn records_are_written_as_before() {
        for (outcome, before) in outcomes().iter().zip(written_before()) {
            let now = audit_doc(&key(), &note(), outcome).unwrap();
            assert!(same_fields(&now, &before), "{now} != {before}");
        }
        // No `seq` when the stamp has none.
        let mut outcome = outcomes().into_iter().next().unwrap();
        outcome.seq = None;
        assert!(audit_doc(&key(), &note(), &outcome)
            .unwrap()
            .get(SEQ)
            .is_none());
    }

    #[test]
    fn records_written_before_read_back_as_before() {
        let [held, junk] = written_before();
        let holder = HolderId::new("h-1").unwrap();
        assert_eq!(
            read_audit(&key(), &held),
            Ok(LastBreak::new(Some(holder), Some(Fence(9)), note()))
        );
        assert_eq!(
            read_audit(&key(), &junk),
            Ok(LastBreak::new(None, None, note()))
        );
        // The flag's spelling before the schema was shared, and no `seq`.
        let mut old = junk;
        old.remove("removed_corrupt_record");
        old.remove(SEQ);
        old.insert(LEGACY_CORRUPT_FLAG, true);
        assert_eq!(
            read_audit(&key(), &old),
            Ok(LastBreak::new(None, None, note()))
        );
    }

    #[test]
    fn malformed_records_are_refused() {
        let [held, _] = written_before();
        let edits: [(&str, Bson); 9] = [
            ("format", "lease-etcd-audit/1".into()),
            ("action", "acquire".into()),
            ("key", "jobs/b".into()),
            ("at_unix_ms", Bson::Int64(-1)),
            ("at_unix_ms", Bson::Double(17.0)),
            (SEQ, Bson::Int64(0)),
            (SEQ, Bson::Int64(-4)),
            (
                "previous",
                Bson::Document(
                    doc! { "holder": "h-1", "fence": 0_i64, "ttl_ms": 1_i64, "payload_len": 0_i64 },
                ),
            ),
            (
                "previous",
                Bson::Document(
                    doc! { "holder": "h-1", "fence": MAX_FENCE + 1, "ttl_ms": 1_i64, "payload_len": 0_i64 },
                ),
            ),
        ];
        for (field, value) in edits {
            let mut bad = held.clone();
            bad.insert(field, value);
            assert!(read_audit(&key(), &bad).is_err(), "{bad}");
        }
        for missing in ["by", "at_unix_ms", "action", "key"] {
            let mut bad = held.clone();
            bad.remove(missing);
            assert!(read_audit(&key(), &bad).is_err(), "{bad}");
        }
    }
}
