//! The contract's grant operations on MongoDB — acquire, renew, release and
//! read — each bounded by the request timeout, and the update pipelines that
//! decide them on the server.

use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, Error, Fence, Grant, HolderId, Holding, LeaseKey, LeaseState, Payload,
    Renewal, Version, CONTENTION_ATTEMPTS,
};
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;

use crate::backend::{MongoBackend, CAPABILITIES};
use crate::errors::{bounded, is_duplicate_key, map};
use crate::record::{
    as_i64, binary, clock_fence, fence_i64, field, inserting, now_ms, schema_filter, var,
    well_formed, Record, MAX_FENCE, SCHEMA,
};

impl MongoBackend {
    /// [`LeaseBackend::try_acquire`](lease_core::LeaseBackend::try_acquire):
    /// one `findAndModify`, within the request timeout.
    pub(crate) async fn acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        bounded(
            "acquire",
            self.config.request_timeout,
            self.send_acquire(req),
        )
        .await
    }

    /// [`LeaseBackend::renew`](lease_core::LeaseBackend::renew), within the
    /// request timeout.
    pub(crate) async fn renew_grant(
        &self,
        grant: &Grant,
        payload: Option<Payload>,
    ) -> Result<Renewal, Error> {
        bounded(
            "renew",
            self.config.request_timeout,
            self.send_renew(grant, payload),
        )
        .await
    }

    /// [`LeaseBackend::release`](lease_core::LeaseBackend::release), within
    /// the request timeout.
    pub(crate) async fn release_grant(&self, grant: &Grant) -> Result<(), Error> {
        bounded(
            "release",
            self.config.request_timeout,
            self.send_release(grant),
        )
        .await
    }

    /// [`LeaseBackend::read`](lease_core::LeaseBackend::read), within the
    /// request timeout.
    pub(crate) async fn read_key(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        bounded("read", self.config.request_timeout, self.send_read(key)).await
    }

    async fn send_acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        // Taken before anything is sent: the grant's deadline counts from here.
        let sent = Instant::now();
        let ttl = CAPABILITIES.ttl.effective(req.ttl)?;
        let ttl_ms = millis(ttl);
        let filter = schema_filter(&req.key);
        let pipeline = acquire_pipeline(&req.holder, ttl_ms, &req.payload);
        let mut lost_race = false;
        for _ in 0..CONTENTION_ATTEMPTS {
            let answer = self
                .coll
                .find_one_and_update(filter.clone(), pipeline.clone())
                .upsert(true)
                .return_document(ReturnDocument::After)
                .await;
            match answer {
                Ok(Some(doc)) => return judge_acquire(req, sent, &doc),
                // An upsert asking for the new document always gets one from
                // MongoDB; SecantusDB answers null now and then when upserts
                // race. Whether ours was applied is unknown, and re-running it
                // is safe either way (the same holder gets the same grant back).
                Ok(None) => lost_race = true,
                // Two upserts of a new key raced and the other inserted first
                // (contention, not failure): the next attempt sees its document.
                // A second duplicate key in a row means the document at the key
                // does not match our schema filter: look at it to say why.
                Err(e) if is_duplicate_key(&e) && !lost_race => lost_race = true,
                Err(e) if is_duplicate_key(&e) => {
                    match self
                        .coll
                        .find_one(doc! { field::ID: req.key.as_str() })
                        .await
                    {
                        Ok(Some(doc)) => {
                            Record::parse(&req.key, &doc)?;
                        }
                        Ok(None) => {}
                        Err(e) => return Err(map("acquire: reading the contended key", e)),
                    }
                }
                Err(e) => return Err(map("acquire", e)),
            }
        }
        Err(Error::Unavailable {
            detail: format!(
                "lease-mongo: acquire of {} kept losing upsert races; something deletes lease documents",
                req.key
            ),
            source: None,
        })
    }

    async fn send_renew(&self, grant: &Grant, payload: Option<Payload>) -> Result<Renewal, Error> {
        let sent = Instant::now();
        // The pipeline checks that the document is a well-formed record and
        // leaves it untouched otherwise.
        let filter = doc! {
            field::ID: grant.key().as_str(),
            field::HOLDER: grant.holder().as_str(),
            field::FENCE: fence_i64(grant.fence())?,
        };
        let answer = self
            .coll
            .find_one_and_update(filter, renew_pipeline(payload.as_ref()))
            .return_document(ReturnDocument::After)
            .await
            .map_err(|e| map("renew", e))?;
        let Some(doc) = answer else {
            // Released, taken over (a new fence or a new holder) — or the
            // document is no longer a lease record at all, which the contract
            // reports as corrupt rather than as a quiet loss. Only this rare
            // path pays a second request; if it fails, the grant is still
            // known to be gone.
            return match self
                .coll
                .find_one(doc! { field::ID: grant.key().as_str() })
                .await
            {
                Ok(Some(d)) => Record::parse(grant.key(), &d).map(|_| Renewal::Lost),
                _ => Ok(Renewal::Lost),
            };
        };
        let rec = Record::parse(grant.key(), &doc)?;
        match rec.live_holder(rec.at_ms) {
            Some(h) if h == grant.holder() && rec.fence() == grant.fence() => {
                Ok(Renewal::Renewed(grant.renewed(sent, version(rec.fence()))))
            }
            // Expired on the server's clock before this renew arrived.
            _ => Ok(Renewal::Lost),
        }
    }

    async fn send_release(&self, grant: &Grant) -> Result<(), Error> {
        // Matching (holder, fence) touches only this grant: a new holder has a
        // new fence (or is someone else), so releasing a lost grant is a no-op.
        // The document stays, keeping the fence counter.
        // A malformed record is never touched, even one naming (holder, fence).
        let filter = doc! {
            field::ID: grant.key().as_str(),
            field::HOLDER: grant.holder().as_str(),
            field::FENCE: fence_i64(grant.fence())?,
            "$expr": well_formed(),
        };
        let update = doc! { "$set": { field::HOLDER: Bson::Null, field::PAYLOAD: binary(&[]) } };
        self.coll
            .update_one(filter, update)
            .await
            .map_err(|e| map("release", e))?;
        Ok(())
    }

    /// The read's one request, unbounded: a break reads within its own bound.
    pub(crate) async fn send_read(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        // An aggregation, not a find: it returns the server's clock beside the
        // document in the same round trip, and it cannot write.
        let pipeline = vec![
            doc! { "$match": { field::ID: key.as_str() } },
            doc! { "$addFields": { NOW: now_ms() } },
        ];
        let mut cursor = self
            .coll
            .aggregate(pipeline)
            .await
            .map_err(|e| map("read", e))?;
        if !cursor.advance().await.map_err(|e| map("read", e))? {
            return Ok(LeaseState::Free);
        }
        let doc: Document = cursor
            .deserialize_current()
            .map_err(|e| map("read: decoding the document", e))?;
        let rec = Record::parse(key, &doc)?;
        let now = match doc.get(NOW).and_then(as_i64) {
            Some(now) => now,
            None => {
                return Err(Error::Backend(
                    "lease-mongo: the server did not evaluate $$NOW in a read".into(),
                ))
            }
        };
        Ok(match rec.live_holder(now) {
            Some(h) => LeaseState::Held(
                Holding::new(h.clone(), rec.fence(), rec.ttl, rec.payload.clone())
                    .with_remaining(Some(rec.remaining(now))),
            ),
            None => LeaseState::Free,
        })
    }
}

/// Reads the after-image of an acquire: ours, someone else's, or corrupt.
fn judge_acquire(req: AcquireRequest, sent: Instant, doc: &Document) -> Result<Acquire, Error> {
    let rec = Record::parse(&req.key, doc)?;
    // `at_ms` is this very update's `$$NOW`: the pipeline always stamps a
    // well-formed document, so liveness is judged on the server's clock.
    match rec.live_holder(rec.at_ms) {
        Some(h) if *h == req.holder => {
            let fence = rec.fence();
            // The record's TTL: a re-acquire of our live grant may have kept
            // a longer one than requested.
            Ok(Acquire::Granted(Grant::new(
                req.key,
                req.holder,
                fence,
                rec.ttl,
                sent,
                version(fence),
            )))
        }
        Some(h) => Ok(Acquire::Held(
            Holding::new(h.clone(), rec.fence(), rec.ttl, rec.payload.clone())
                .with_remaining(Some(rec.remaining(rec.at_ms))),
        )),
        None => Err(Error::Backend(
            format!(
                "lease-mongo: the server left {} free after an acquire that should have taken it",
                req.key
            )
            .into(),
        )),
    }
}

/// Temporary fields of the update pipelines (removed before the write lands).
const NOW: &str = "_lease_now";
const FRESH: &str = "_lease_fresh";
const OK: &str = "_lease_ok";
const OURS: &str = "_lease_ours";
const NEW: &str = "_lease_new";
const GRANT: &str = "_lease_grant";
const LIVE: &str = "_lease_live";
const NEXT: &str = "_lease_next";
const WRITE: &str = "_lease_write";
const TTL: &str = "_lease_ttl";

/// `{$cond: [flag, then, $field]}`: set `field` to `then` where `flag` holds,
/// otherwise keep it as it is.
fn set_if(flag: &str, then: impl Into<Bson>, keep: &str) -> Document {
    doc! { "$cond": [ var(flag), then.into(), var(keep) ] }
}

/// The acquire update: one `findAndModify`, judged entirely on the server.
///
/// Takes the key when the document is new, released, expired, or already
/// ours; a new grant raises the fence in the same write. A document that
/// is not a well-formed record is left exactly as it is (the caller then
/// reports it as corrupt). `at_ms` is stamped with this update's `$$NOW` so
/// that the caller can judge the returned document on the server's clock.
fn acquire_pipeline(holder: &HolderId, ttl_ms: i64, payload: &Payload) -> Vec<Document> {
    let me = doc! { "$literal": holder.as_str() };
    vec![
        doc! { "$set": {
            NOW: now_ms(),
            // The upsert's filter seeds no field but `_id`: a document with
            // neither schema marker is the one being inserted.
            FRESH: inserting(),
            OK: well_formed(),
        } },
        doc! { "$set": {
            // Computed only on a record whose fence is known to be an integer.
            NEXT: { "$cond": [
                { "$or": [ var(OK), var(FRESH) ] },
                next_fence(),
                Bson::Null,
            ] },
            OURS: { "$and": [
                var(OK),
                { "$eq": [ var(field::HOLDER), me.clone() ] },
                { "$gt": [ var(field::EXPIRES_MS), var(NOW) ] },
            ] },
        } },
        doc! { "$set": {
            NEW: { "$and": [
                { "$not": [ var(OURS) ] },
                { "$or": [
                    var(FRESH),
                    { "$and": [
                        var(OK),
                        { "$or": [
                            { "$eq": [ { "$type": var(field::HOLDER) }, "null" ] },
                            { "$lte": [ var(field::EXPIRES_MS), var(NOW) ] },
                        ] },
                    ] },
                ] },
                { "$lte": [ var(NEXT), MAX_FENCE ] },
            ] },
        } },
        doc! { "$set": {
            GRANT: { "$or": [ var(OURS), var(NEW) ] },
            WRITE: { "$or": [ var(OK), var(FRESH) ] },
            // Our own live grant keeps the longer of its TTL and this
            // request's: a grant of that term whose answer did arrive counts
            // its deadline, and its renewals, from its own TTL.
            TTL: { "$cond": [ var(OURS), { "$max": [ ttl_ms, var(field::TTL_MS) ] }, ttl_ms ] },
        } },
        doc! { "$set": {
            // Written on every record this acquire writes (a legacy record
            // gains it; its `v` stays for the versions that still read it).
            field::SCHEMA: set_if(WRITE, SCHEMA, field::SCHEMA),
            // The fence rises in the same write that grants; a re-acquire
            // of our own live grant keeps it.
            field::FENCE: set_if(NEW, var(NEXT), field::FENCE),
            field::HOLDER: set_if(GRANT, me, field::HOLDER),
            field::TTL_MS: set_if(GRANT, var(TTL), field::TTL_MS),
            // Extended from this request even when it was already ours: the
            // grant's deadline is counted from this request's send instant.
            // Our own live grant never moves earlier, as in a renewal.
            field::EXPIRES_MS: set_if(
                GRANT,
                doc! { "$cond": [
                    var(OURS),
                    { "$max": [ var(field::EXPIRES_MS), { "$add": [ var(NOW), var(TTL) ] } ] },
                    { "$add": [ var(NOW), var(TTL) ] },
                ] },
                field::EXPIRES_MS,
            ),
            field::PAYLOAD: set_if(GRANT, doc! { "$literal": binary(payload.as_bytes()) }, field::PAYLOAD),
            field::AT_MS: set_if(WRITE, var(NOW), field::AT_MS),
        } },
        doc! { "$unset": [ NOW, FRESH, OK, OURS, NEW, GRANT, NEXT, WRITE, TTL ] },
    ]
}

/// The fence of a new grant: one above the record's, and at least the
/// server's clock in milliseconds × [`FENCES_PER_MS`](crate::record::FENCES_PER_MS).
///
/// The clock term is what keeps fences rising when the record is gone or
/// rewound behind this library's back (a `deleteOne`, a `deleteMany`
/// cleanup, a dropped collection, a `mongorestore` of an older dump): every
/// fence handed out at server time `t` ms is below `(t + 1) × 1000` as long
/// as fewer than 1000 grants of one key fall in one millisecond (each is a
/// majority, journaled write), so a grant on a new or rewound document at a
/// later millisecond is above all of them. It assumes the server's clock
/// does not step back, and moves on by a millisecond between the last grant
/// before such an outside change and the first grant after it.
fn next_fence() -> Document {
    doc! { "$max": [
        { "$add": [ { "$ifNull": [ var(field::FENCE), 0_i64 ] }, 1_i64 ] },
        clock_fence(),
    ] }
}

/// The renew update, applied only to the document still naming (holder,
/// fence) — the filter — and extending it only while live on `$$NOW`.
/// `at_ms` is stamped even when expired, so the caller can tell the two apart.
fn renew_pipeline(payload: Option<&Payload>) -> Vec<Document> {
    let mut set = doc! {
        // Never earlier than stored: `$$NOW` is bound when the write starts,
        // and a write applied late (a lock wait) may land after a later one.
        field::EXPIRES_MS: set_if(
            LIVE,
            doc! { "$max": [ var(field::EXPIRES_MS), { "$add": [ var(NOW), var(field::TTL_MS) ] } ] },
            field::EXPIRES_MS,
        ),
        field::AT_MS: set_if(OK, var(NOW), field::AT_MS),
    };
    if let Some(p) = payload {
        set.insert(
            field::PAYLOAD,
            set_if(
                LIVE,
                doc! { "$literal": binary(p.as_bytes()) },
                field::PAYLOAD,
            ),
        );
    }
    vec![
        doc! { "$set": { NOW: now_ms(), OK: well_formed() } },
        doc! { "$set": { LIVE: { "$and": [ var(OK), { "$gt": [ var(field::EXPIRES_MS), var(NOW) ] } ] } } },
        doc! { "$set": set },
        doc! { "$unset": [ NOW, OK, LIVE ] },
    ]
}

/// Whole milliseconds of an effective TTL (at most a day, so it fits).
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn version(fence: Fence) -> Version {
    Version::new(fence.get().to_string())
}
