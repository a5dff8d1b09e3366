//! The contract's grant operations on an object store — acquire, renew,
//! release and read — on the conditional-write protocol
//! ([`ConditionalStore`](crate::conditional::ConditionalStore)), folding
//! what each observed into the client's per-key memory.

use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, Error, Fence, Grant, LeaseKey, LeaseState, Payload, Renewal, Version,
};
use object_store::path::Path;

use crate::backend::{ObjectStoreBackend, TTL_RULE};
use crate::conditional::{self, Acquired, Claim, Missing, RenewPayload, Renewed, Target};
use crate::record::{holding, State};

impl ObjectStoreBackend {
    pub(crate) fn path(&self, key: &LeaseKey) -> Result<Path, Error> {
        let joined = if self.inner.prefix.as_ref().is_empty() {
            key.as_str().to_owned()
        } else {
            format!("{}/{}", self.inner.prefix.as_ref(), key.as_str())
        };
        Path::parse(&joined).map_err(|_| Error::InvalidKey {
            key: key.as_str().to_owned(),
            reason: "not a valid object path under this prefix",
        })
    }

    /// The key's marker, `{prefix}/.used/{key}`: lease keys never have a
    /// segment starting with `.`, so no lease object lives there.
    pub(crate) fn marker(&self, key: &LeaseKey) -> Result<Path, Error> {
        let joined = if self.inner.prefix.as_ref().is_empty() {
            format!(".used/{}", key.as_str())
        } else {
            format!("{}/.used/{}", self.inner.prefix.as_ref(), key.as_str())
        };
        Path::parse(&joined).map_err(|_| Error::InvalidKey {
            key: key.as_str().to_owned(),
            reason: "not a valid object path under this prefix",
        })
    }

    /// [`LeaseBackend::try_acquire`](lease_core::LeaseBackend::try_acquire).
    pub(crate) async fn acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        let sent = Instant::now();
        let ttl = TTL_RULE.effective(req.ttl)?;
        let path = self.path(&req.key)?;
        let marker = self.marker(&req.key)?;
        let mut obs = self.inner.keys.observation(&req.key);
        let payload = req.payload.as_bytes().to_vec();
        let result = self
            .inner
            .conditional
            .acquire(
                &Target {
                    path: &path,
                    marker: &marker,
                    name: req.key.as_str(),
                },
                req.holder.as_str(),
                ttl,
                payload.clone(),
                &mut obs,
            )
            .await;
        self.inner.keys.merge(&req.key, obs);
        match result? {
            Acquired::Granted { fence, etag, ttl } => {
                self.inner
                    .keys
                    .remember_write(&req.key, &etag, payload, ttl);
                Ok(Acquire::Granted(Grant::new(
                    req.key,
                    req.holder,
                    Fence(fence),
                    ttl,
                    sent,
                    Version::new(etag),
                )))
            }
            Acquired::Held(r) => Ok(Acquire::Held(holding(&req.key, r)?)),
        }
    }

    /// [`LeaseBackend::renew`](lease_core::LeaseBackend::renew).
    pub(crate) async fn renew_grant(
        &self,
        grant: &Grant,
        payload: Option<Payload>,
    ) -> Result<Renewal, Error> {
        let sent = Instant::now();
        let path = self.path(grant.key())?;
        let etag = grant.version().as_str();
        // The payload and TTL at `etag` if this client wrote it: the renewal
        // then goes without a read.
        let cached = self.inner.keys.cached_write(grant.key(), etag);
        let stored_ttl = cached.as_ref().map(|(_, ttl)| *ttl);
        let payload = match payload {
            Some(p) => RenewPayload::Replace(p.into_bytes()),
            None => RenewPayload::Keep {
                last_written: cached.map(|(p, _)| p),
            },
        };
        let mut obs = self.inner.keys.observation(grant.key());
        let result = self
            .inner
            .conditional
            .renew(
                &Target {
                    path: &path,
                    marker: &path,
                    name: grant.key().as_str(),
                },
                &claim(grant),
                etag,
                stored_ttl,
                payload,
                &mut obs,
            )
            .await;
        self.inner.keys.merge(grant.key(), obs);
        match result? {
            // The grant keeps its own TTL: its deadline counts from it, even
            // where the record kept a longer one of this term.
            Renewed::Renewed { etag, payload, ttl } => {
                self.inner
                    .keys
                    .remember_write(grant.key(), &etag, payload, ttl);
                Ok(Renewal::Renewed(grant.renewed(sent, Version::new(etag))))
            }
            Renewed::Lost => {
                // No renewal of this grant follows: its payload is not needed.
                self.inner.keys.forget_write(grant.key());
                Ok(Renewal::Lost)
            }
        }
    }

    /// [`LeaseBackend::release`](lease_core::LeaseBackend::release).
    pub(crate) async fn release_grant(&self, grant: &Grant) -> Result<(), Error> {
        let path = self.path(grant.key())?;
        let mut obs = self.inner.keys.observation(grant.key());
        let result = self
            .inner
            .conditional
            .release(
                &Target {
                    path: &path,
                    marker: &path,
                    name: grant.key().as_str(),
                },
                &claim(grant),
                grant.version().as_str(),
                &mut obs,
            )
            .await;
        if result.is_ok() {
            // Released, or found lost: nothing of ours is left to renew,
            // and the key is free or someone else's. Forgetting it only
            // means a later acquire of it starts observing afresh.
            self.inner.keys.forget(grant.key());
        } else {
            self.inner.keys.merge(grant.key(), obs);
        }
        result
    }

    /// [`LeaseBackend::read`](lease_core::LeaseBackend::read).
    pub(crate) async fn read_key(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        let path = self.path(key)?;
        // A second GET only when a create in flight landed meanwhile.
        let mut found = None;
        for _ in 0..2 {
            found = self.inner.conditional.get(&path, key.as_str()).await?;
            if found.is_some() {
                break;
            }
            // Missing: a key never used is free; one whose record was
            // deleted outside the library is held until watched for a TTL.
            let missing_at = tokio::time::Instant::now();
            let marker = self.marker(key)?;
            let mut obs = self.inner.keys.observation(key);
            let result = self
                .inner
                .conditional
                .read_missing(
                    &Target {
                        path: &path,
                        marker: &marker,
                        name: key.as_str(),
                    },
                    &mut obs,
                    missing_at,
                )
                .await;
            self.inner.keys.merge(key, obs);
            match result? {
                Missing::Free => return Ok(LeaseState::Free),
                Missing::Held(r) => return Ok(LeaseState::Held(holding(key, r)?)),
                Missing::Appeared => continue,
            }
        }
        let Some(s) = found else {
            // It appeared, then went again: whatever it is, it is not
            // settled; the caller reads again.
            return Err(Error::Unavailable {
                detail: format!("{key}: the lease object appeared and went while it was read"),
                source: None,
            });
        };
        // Reading changes nothing in the store; it only advances this
        // client's own observation of the key.
        let mut obs = self.inner.keys.observation(key);
        conditional::note_record(&mut obs, &s);
        let expired = conditional::expired(
            &obs,
            &s.etag,
            Duration::from_millis(s.record.ttl_ms),
            tokio::time::Instant::now(),
        );
        self.inner.keys.merge(key, obs);
        if s.record.state == State::Released || expired {
            return Ok(LeaseState::Free);
        }
        Ok(LeaseState::Held(holding(key, s.record)?))
    }
}

fn claim(grant: &Grant) -> Claim<'_> {
    Claim {
        holder: grant.holder().as_str(),
        fence: grant.fence().get(),
        ttl: grant.ttl(),
    }
}
