//! The grant operations: acquire, renew, release and read, one statement
//! each (see `record` for the statements).

use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, Error, Fence, Grant, LeaseKey, LeaseState, Payload, Renewal, Version,
    CONTENTION_ATTEMPTS,
};
use tokio_postgres::types::Type;

use crate::backend::PostgresBackend;
use crate::record::{millis, Answer, TTL_RULE};

impl PostgresBackend {
    pub(crate) async fn try_acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        let ttl = TTL_RULE.effective(req.ttl)?;
        for _ in 0..CONTENTION_ATTEMPTS {
            if let Some(answer) = self.acquire_once(&req, ttl).await? {
                return Ok(answer);
            }
        }
        Err(Error::Unavailable {
            detail: format!(
                "lease-postgres: acquire of {}: the row kept changing under concurrent \
                 acquires; retry",
                req.key
            ),
            source: None,
        })
    }

    pub(crate) async fn renew(
        &self,
        grant: &Grant,
        payload: Option<Payload>,
    ) -> Result<Renewal, Error> {
        let fence = i64::try_from(grant.fence().get()).unwrap_or(i64::MAX);
        let sent_at = Instant::now();
        let key = grant.key().as_str();
        let holder = grant.holder().as_str();
        let rows = match payload.map(Payload::into_bytes) {
            Some(payload) => {
                self.run(
                    "renew",
                    &self.inner.sql.renew,
                    &[
                        (&key, Type::TEXT),
                        (&holder, Type::TEXT),
                        (&fence, Type::INT8),
                        (&payload, Type::BYTEA),
                    ],
                )
                .await?
            }
            None => {
                self.run(
                    "renew",
                    &self.inner.sql.extend,
                    &[
                        (&key, Type::TEXT),
                        (&holder, Type::TEXT),
                        (&fence, Type::INT8),
                    ],
                )
                .await?
            }
        };
        let Some(row) = rows.first() else {
            return Ok(Renewal::Lost);
        };
        let answer = Answer::from_row(grant.key(), row)?;
        // A malformed row is an error even when it is not ours.
        answer.state(grant.key())?;
        if answer.outcome == "renewed" {
            Ok(Renewal::Renewed(
                grant.renewed(sent_at, version(grant.fence())),
            ))
        } else {
            Ok(Renewal::Lost)
        }
    }

    pub(crate) async fn release(&self, grant: &Grant) -> Result<(), Error> {
        let fence = i64::try_from(grant.fence().get()).unwrap_or(i64::MAX);
        let rows = self
            .run(
                "release",
                &self.inner.sql.release,
                &[
                    (&grant.key().as_str(), Type::TEXT),
                    (&grant.holder().as_str(), Type::TEXT),
                    (&fence, Type::INT8),
                ],
            )
            .await?;
        if let Some(row) = rows.first() {
            let answer = Answer::from_row(grant.key(), row)?;
            if answer.outcome != "released" {
                answer.state(grant.key())?;
            }
        }
        Ok(())
    }

    pub(crate) async fn read(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        let rows = self
            .run("read", &self.inner.sql.read, &[(&key.as_str(), Type::TEXT)])
            .await?;
        match rows.first() {
            None => Ok(LeaseState::Free),
            Some(row) => Answer::from_row(key, row)?.state(key),
        }
    }

    async fn acquire_once(
        &self,
        req: &AcquireRequest,
        ttl: Duration,
    ) -> Result<Option<Acquire>, Error> {
        let ttl_ms = millis(ttl);
        let payload = req.payload.as_bytes().to_vec();
        let sent_at = Instant::now();
        let rows = self
            .run(
                "acquire",
                &self.inner.sql.acquire,
                &[
                    (&req.key.as_str(), Type::TEXT),
                    (&req.holder.as_str(), Type::TEXT),
                    (&ttl_ms, Type::INT8),
                    (&payload, Type::BYTEA),
                ],
            )
            .await?;
        let Some(row) = rows.first() else {
            // A row inserted by a concurrent acquire after this statement's
            // snapshot: it refused to take it, but cannot see it. Run again.
            return Ok(None);
        };
        let answer = Answer::from_row(&req.key, row)?;
        let state = answer.state(&req.key)?;
        match (answer.outcome.as_str(), state) {
            ("granted", LeaseState::Held(h)) => Ok(Some(Acquire::Granted(Grant::new(
                req.key.clone(),
                h.holder,
                h.fence,
                h.ttl,
                sent_at,
                version(h.fence),
            )))),
            ("held", LeaseState::Held(h)) => Ok(Some(Acquire::Held(h))),
            // Free in this statement's snapshot but refused: a concurrent
            // change; run again.
            _ => Ok(None),
        }
    }
}

fn version(fence: Fence) -> Version {
    Version::new(fence.get().to_string())
}
