//! The grant operations: acquire, renew, release and read, each built on
//! conditional publishes (see the `conditional` module) and a leader read
//! when the hint this client holds turns out stale.

use std::time::Instant;

use async_nats::HeaderMap;
use lease_core::{
    Acquire, AcquireRequest, Error, Fence, Grant, LeaseKey, LeaseState, Payload, Renewal, Version,
    CONTENTION_ATTEMPTS,
};

use crate::backend::NatsBackend;
use crate::cache::Seen;
use crate::conditional::Put;
use crate::errors::{contended, rewound};
use crate::record::{self, holding, Record, Slot};

impl NatsBackend {
    pub(crate) async fn try_acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        let ttl = self.inner.capabilities.ttl.effective(req.ttl)?;
        self.check_payload(&req.payload)?;
        let sent = Instant::now();
        let fresh = record::encode(&req.holder, None, ttl, req.payload.as_bytes());
        // Start from what this client last saw: a free key is created at once
        // (expecting no message, or the tombstone seen), a held one is read
        // first. A wrong guess costs one more round trip.
        let mut expected = match self.inner.cache.last_seen().get(&req.key) {
            Some(Seen::Free(seq)) => Some(seq),
            Some(Seen::Held) => None,
            None => Some(0),
        };
        // A lost condition is another writer's win (another client, or the
        // server's expiry marker) or a stale hint from the cache: each costs
        // one of the attempts.
        for _ in 0..CONTENTION_ATTEMPTS {
            if let Some(e) = expected {
                let put = self
                    .put(&req.key, HeaderMap::new(), fresh.clone(), e, Some(ttl))
                    .await?;
                match put {
                    Put::Stored(seq) => {
                        self.inner
                            .cache
                            .remember(&req.key, seq, req.payload.clone(), ttl);
                        self.inner.cache.saw(&req.key, Seen::Held);
                        let grant =
                            Grant::new(req.key, req.holder, Fence(seq), ttl, sent, version(seq));
                        return Ok(Acquire::Granted(grant));
                    }
                    Put::Rewound { seq, floor } => {
                        // Not granted. Take the record back so the key is not
                        // blocked for a TTL by a grant nobody was given.
                        let removed = matches!(
                            self.purge_expecting(&req.key, seq, Some(ttl)).await,
                            Ok(Put::Stored(_) | Put::Rewound { .. })
                        );
                        return Err(rewound(&req.key, "acquire", seq, floor, !removed));
                    }
                    Put::WrongLastSequence => {}
                }
            }
            match self.slot(&req.key).await? {
                Slot::Empty => expected = Some(0),
                // Free, but a create must name the marker's sequence: async-nats'
                // own create would fall back to an update without TTL here.
                Slot::Tombstone { seq } => expected = Some(seq),
                Slot::Live { seq, record } if record.holder == req.holder => {
                    // Our own live grant (an earlier answer was lost): the same
                    // fence, extended from this request and with its payload,
                    // and never with a shorter TTL: a grant of this term whose
                    // answer did arrive counts its deadline, and its renewals,
                    // from its own TTL.
                    let ttl = ttl.max(record.ttl);
                    let body = record::encode(
                        &req.holder,
                        Some(record.fence),
                        ttl,
                        req.payload.as_bytes(),
                    );
                    match self
                        .put(&req.key, HeaderMap::new(), body, seq, Some(ttl))
                        .await?
                    {
                        Put::Stored(new_seq) => {
                            self.inner
                                .cache
                                .remember(&req.key, new_seq, req.payload.clone(), ttl);
                            let grant = Grant::new(
                                req.key,
                                req.holder,
                                record.fence,
                                ttl,
                                sent,
                                version(new_seq),
                            );
                            return Ok(Acquire::Granted(grant));
                        }
                        Put::Rewound { seq, floor } => {
                            return Err(rewound(&req.key, "acquire", seq, floor, true));
                        }
                        Put::WrongLastSequence => {}
                    }
                    expected = None;
                }
                Slot::Live { record, .. } => return Ok(Acquire::Held(holding(record))),
            }
        }
        Err(contended(&req.key, "acquire"))
    }

    pub(crate) async fn renew(
        &self,
        grant: &Grant,
        payload: Option<Payload>,
    ) -> Result<Renewal, Error> {
        if let Some(p) = &payload {
            self.check_payload(p)?;
        }
        let sent = Instant::now();
        let key = grant.key();
        let Some(mut expected) = parse_version(grant.version()) else {
            return Err(Error::Backend(
                format!(
                    "grant version {:?} was not made by lease-nats",
                    grant.version()
                )
                .into(),
            ));
        };
        // What the record at `expected` holds, when this client wrote it:
        // the payload to keep and the TTL not to write below. Otherwise the
        // record is read first: a grant of this term may have been
        // lengthened by a re-acquire (this client's or another's) since
        // `grant` was made, and that longer grant counts its deadline from
        // the longer TTL, so a renewal of `grant` must not write its own
        // shorter one.
        let mut on_top = self
            .inner
            .cache
            .written_at(key, expected)
            .map(|w| (payload.clone().unwrap_or(w.payload), w.ttl));
        for _ in 0..CONTENTION_ATTEMPTS {
            let (p, stored_ttl) = match on_top.take() {
                Some(known) => known,
                // Not written by this client: take the stored payload and TTL
                // (and the current sequence, in case a renew's answer was lost).
                None => match self.own_slot(grant).await? {
                    Some((seq, record)) => {
                        expected = seq;
                        (payload.clone().unwrap_or(record.payload), record.ttl)
                    }
                    None => {
                        self.inner.cache.forget(key);
                        return Ok(Renewal::Lost);
                    }
                },
            };
            // The renewed grant keeps its own TTL (its deadline counts from
            // it); the record keeps the longer of the two.
            let ttl = grant.ttl().max(stored_ttl);
            let body = record::encode(grant.holder(), Some(grant.fence()), ttl, p.as_bytes());
            match self
                .put(key, HeaderMap::new(), body, expected, Some(ttl))
                .await?
            {
                Put::Stored(seq) => {
                    self.inner.cache.remember(key, seq, p, ttl);
                    return Ok(Renewal::Renewed(grant.renewed(sent, version(seq))));
                }
                // The renewal was stored, but the stream is not the one the
                // grant was made in: the holder must stop by its deadline.
                Put::Rewound { seq, floor } => {
                    self.inner.cache.forget(key);
                    return Err(rewound(key, "renew", seq, floor, true));
                }
                Put::WrongLastSequence => {
                    // Lost, unless an earlier renew of ours was applied and
                    // only its answer lost, or a re-acquire of this term
                    // rewrote the record: then the key is still ours at a
                    // later sequence, with the payload and TTL stored there.
                    match self.own_slot(grant).await? {
                        Some((seq, record)) => {
                            expected = seq;
                            on_top = Some((payload.clone().unwrap_or(record.payload), record.ttl));
                        }
                        None => {
                            self.inner.cache.forget(key);
                            return Ok(Renewal::Lost);
                        }
                    }
                }
            }
        }
        Err(contended(key, "renew"))
    }

    /// The key's current record and sequence iff it is still `grant`'s.
    async fn own_slot(&self, grant: &Grant) -> Result<Option<(u64, Record)>, Error> {
        Ok(match self.slot(grant.key()).await? {
            Slot::Live { seq, record }
                if record.holder == *grant.holder() && record.fence == grant.fence() =>
            {
                Some((seq, record))
            }
            _ => None,
        })
    }

    pub(crate) async fn release(&self, grant: &Grant) -> Result<(), Error> {
        let key = grant.key();
        let Some(mut expected) = parse_version(grant.version()) else {
            return Err(Error::Backend(
                format!(
                    "grant version {:?} was not made by lease-nats",
                    grant.version()
                )
                .into(),
            ));
        };
        // The record's TTL as this client wrote it (acquire and renew send the
        // grant's TTL); a record found by a read may carry a longer one.
        let mut covers = grant.ttl();
        for _ in 0..CONTENTION_ATTEMPTS {
            match self.purge_expecting(key, expected, Some(covers)).await? {
                Put::Stored(_) => return Ok(()),
                Put::Rewound { seq, floor } => {
                    return Err(rewound(key, "release", seq, floor, true))
                }
                Put::WrongLastSequence => match self.own_slot(grant).await? {
                    // Still ours at a later sequence (a renew's answer was lost).
                    Some((seq, record)) => {
                        expected = seq;
                        covers = covers.max(record.ttl);
                    }
                    // Lost already: leave the new holder (or the free key) alone.
                    None => {
                        self.inner.cache.forget(key);
                        return Ok(());
                    }
                },
            }
        }
        Err(contended(key, "release"))
    }

    pub(crate) async fn read(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        Ok(match self.slot(key).await? {
            Slot::Empty | Slot::Tombstone { .. } => LeaseState::Free,
            Slot::Live { record, .. } => LeaseState::Held(holding(record)),
        })
    }

    fn check_payload(&self, payload: &Payload) -> Result<(), Error> {
        let max = self.inner.capabilities.max_payload;
        if payload.len() > max {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max,
            });
        }
        Ok(())
    }
}

fn version(seq: u64) -> Version {
    Version::new(seq.to_string())
}

fn parse_version(v: &Version) -> Option<u64> {
    v.as_str().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_round_trip() {
        assert_eq!(parse_version(&version(17)), Some(17));
        assert_eq!(parse_version(&Version::new("etag")), None);
    }
}
