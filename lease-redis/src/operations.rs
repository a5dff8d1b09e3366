//! The grant operations: acquire, renew, release and read, one script each
//! (see `scripts`).

use std::time::Instant;

use lease_core::{
    Acquire, AcquireRequest, Error, Fence, Grant, HolderId, LeaseKey, LeaseState, Payload, Renewal,
    Version,
};

use crate::backend::RedisBackend;
use crate::record::{millis, unexpected, Answer, Keys, TTL_RULE};

impl RedisBackend {
    pub(crate) fn keys(&self, key: &LeaseKey) -> Keys {
        Keys::of(&self.inner.config, key)
    }

    pub(crate) async fn try_acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        let ttl = TTL_RULE.effective(req.ttl)?;
        // A release of ours that may still land would end the term this
        // acquire hands back (see `unsettled`): end it now.
        if let Some(fence) = self.inner.unsettled.pending(&req.key, &req.holder) {
            self.release_term(&req.key, &req.holder, fence).await?;
        }
        let keys = self.keys(&req.key);
        let ttl_ms = millis(ttl).to_string();
        let sent_at = Instant::now();
        let v = self
            .inner
            .client
            .eval(
                &self.inner.scripts.acquire,
                &[keys.lease.as_bytes(), keys.counter.as_bytes()],
                &[
                    req.holder.as_str().as_bytes(),
                    ttl_ms.as_bytes(),
                    req.payload.as_bytes(),
                    self.inner.channel.as_bytes(),
                    req.key.as_str().as_bytes(),
                ],
            )
            .await?;
        let answer = Answer::of(&req.key, &v)?;
        match answer.outcome {
            "granted" => {
                let h = answer.holding(&req.key, 0)?;
                Ok(Acquire::Granted(Grant::new(
                    req.key.clone(),
                    h.holder,
                    h.fence,
                    h.ttl,
                    sent_at,
                    version(h.fence),
                )))
            }
            "held" => Ok(Acquire::Held(answer.holding(&req.key, 0)?)),
            other => Err(unexpected("acquire", other)),
        }
    }

    pub(crate) async fn renew(
        &self,
        grant: &Grant,
        payload: Option<Payload>,
    ) -> Result<Renewal, Error> {
        let keys = self.keys(grant.key());
        let fence = grant.fence().get().to_string();
        let (replace, bytes): (&[u8], &[u8]) = match &payload {
            Some(p) => (b"1", p.as_bytes()),
            None => (b"0", b""),
        };
        let sent_at = Instant::now();
        let v = self
            .inner
            .client
            .eval(
                &self.inner.scripts.renew,
                &[keys.lease.as_bytes(), keys.counter.as_bytes()],
                &[
                    grant.holder().as_str().as_bytes(),
                    fence.as_bytes(),
                    replace,
                    bytes,
                    self.inner.channel.as_bytes(),
                    grant.key().as_str().as_bytes(),
                ],
            )
            .await?;
        match Answer::of(grant.key(), &v)?.outcome {
            "renewed" => Ok(Renewal::Renewed(
                grant.renewed(sent_at, version(grant.fence())),
            )),
            "lost" => Ok(Renewal::Lost),
            other => Err(unexpected("renew", other)),
        }
    }

    pub(crate) async fn release(&self, grant: &Grant) -> Result<(), Error> {
        self.release_term(grant.key(), grant.holder(), grant.fence())
            .await
    }

    /// Releases the term (`holder`, `fence`) of `key`; unsettled until
    /// answered (see `unsettled`).
    async fn release_term(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        fence: Fence,
    ) -> Result<(), Error> {
        let unsettled = &self.inner.unsettled;
        unsettled.begin(key, holder, fence);
        let keys = self.keys(key);
        let fence_text = fence.get().to_string();
        let answer = self
            .inner
            .client
            .eval(
                &self.inner.scripts.release,
                &[keys.lease.as_bytes(), keys.counter.as_bytes()],
                &[
                    holder.as_str().as_bytes(),
                    fence_text.as_bytes(),
                    self.inner.channel.as_bytes(),
                    key.as_str().as_bytes(),
                ],
            )
            .await;
        // Anything but an unknown outcome is an answer: it ran, or nothing
        // ran.
        if !matches!(&answer, Err(e) if e.is_unknown_outcome()) {
            unsettled.settle(key, holder, fence);
        }
        match Answer::of(key, &answer?)?.outcome {
            "released" | "other" => Ok(()),
            other => Err(unexpected("release", other)),
        }
    }

    pub(crate) async fn read(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        let keys = self.keys(key);
        let v = self
            .inner
            .client
            .eval(
                &self.inner.scripts.read,
                &[keys.lease.as_bytes(), keys.counter.as_bytes()],
                &[],
            )
            .await?;
        let answer = Answer::of(key, &v)?;
        match answer.outcome {
            "free" => Ok(LeaseState::Free),
            "held" => Ok(LeaseState::Held(answer.holding(key, 0)?)),
            other => Err(unexpected("read", other)),
        }
    }
}

fn version(fence: Fence) -> Version {
    Version::new(fence.get().to_string())
}
