//! Contract points 7 and 10: TTL rules, bad input and corrupt records.

use std::time::Duration;

use lease_core::{Acquire, Error, HolderId, LeaseKey, LeaseState, Payload, MAX_PAYLOAD_LEN};

use super::{clients, key, long_ttl, req, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// Invalid keys, holder ids, TTLs and payloads get their own errors, and the
/// store is unchanged afterwards.
pub fn bad_input_changes_nothing(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("bad-input");
        let cs = clients(h, 1).await?;
        let c = &*cs[0];
        let caps = c.capabilities();
        let a = HolderId::random();

        for bad in ["", "a//b", "/a", "a b", "a..b", "ключ"] {
            ensure!(
                matches!(LeaseKey::new(bad), Err(Error::InvalidKey { .. })),
                "key {bad:?} was not refused as InvalidKey"
            );
        }
        ensure!(
            matches!(HolderId::new("has space"), Err(Error::InvalidHolder { .. })),
            "holder id with a space was not refused"
        );
        ensure!(
            matches!(
                Payload::new(vec![0; MAX_PAYLOAD_LEN + 1]),
                Err(Error::PayloadTooLarge { .. })
            ),
            "an oversize payload was not refused"
        );
        // TTL above the backend's maximum.
        let too_long = caps.ttl.max + caps.ttl.granularity.max(Duration::from_millis(1));
        match c.try_acquire(req(&key, &a, too_long)).await {
            Err(Error::InvalidTtl { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "TTL {too_long:?} over the maximum gave {other:?}, not InvalidTtl"
                )))
            }
        }
        // Payload over the backend's own limit, where it is below the global one.
        if caps.max_payload < MAX_PAYLOAD_LEN {
            let p = Payload::new(vec![7; caps.max_payload + 1])?;
            match c
                .try_acquire(req(&key, &a, long_ttl(&caps)).payload(p))
                .await
            {
                Err(Error::PayloadTooLarge { .. }) => {}
                other => {
                    return Err(Failure(format!(
                        "payload over the backend's limit gave {other:?}"
                    )))
                }
            }
        }
        let state = c.read(&key).await?;
        ensure!(
            state == LeaseState::Free,
            "refused requests left the key as {state:?}"
        );
        // And the key still works.
        let g = super::grant(c, &key, &a, long_ttl(&caps), "after refused requests").await?;
        c.release(&g).await?;
        Ok(Outcome::Passed)
    })
}

/// A record at a lease key that is not a lease record is reported as
/// corrupt by read and acquire — never taken for a free key — and stays.
pub fn corrupt_record_is_an_error(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("corrupt");
        let Some(write) = h.write_corrupt(&key) else {
            return Ok(Outcome::NotApplicable(
                "the harness cannot write a raw record".into(),
            ));
        };
        write.await?;
        let cs = clients(h, 1).await?;
        let c = &*cs[0];
        let ttl = long_ttl(&c.capabilities());
        match c.read(&key).await {
            Err(Error::CorruptRecord { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "read of a corrupt record gave {other:?}, not CorruptRecord"
                )))
            }
        }
        match c.try_acquire(req(&key, &HolderId::random(), ttl)).await {
            Err(Error::CorruptRecord { .. }) => {}
            Ok(Acquire::Granted(g)) => {
                return Err(Failure(format!(
                    "a corrupt record was treated as free: granted fence {}",
                    g.fence()
                )))
            }
            other => {
                return Err(Failure(format!(
                    "acquire over a corrupt record gave {other:?}, not CorruptRecord"
                )))
            }
        }
        match c.read(&key).await {
            Err(Error::CorruptRecord { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "the corrupt record did not stay: read gave {other:?}"
                )))
            }
        }
        Ok(Outcome::Passed)
    })
}

/// TTL 0 counts as the minimum, others round up to the granularity, and the
/// grant reports the effective TTL.
pub fn ttl_follows_the_capability(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let cs = clients(h, 1).await?;
        let c = &*cs[0];
        let rule = c.capabilities().ttl;
        let a = HolderId::random();
        let mut asked = vec![Duration::ZERO, rule.min, rule.min + rule.granularity / 2];
        if rule.granularity > Duration::from_millis(1) {
            asked.push(rule.min + rule.granularity + Duration::from_millis(1));
        }
        for (i, ttl) in asked.into_iter().enumerate() {
            let key = key(&format!("ttl-{i}"));
            let want = rule.effective(ttl)?;
            let g = super::grant(c, &key, &a, ttl, "free key").await?;
            ensure!(
                g.ttl() == want,
                "asked for {ttl:?}: grant reports {:?}, the rule says {want:?} ({rule:?})",
                g.ttl()
            );
            ensure!(
                g.ttl() >= rule.min && g.ttl() >= ttl,
                "effective TTL {:?} is below what was asked ({ttl:?})",
                g.ttl()
            );
            if let Some(held) = c.read(&key).await?.holding() {
                ensure!(
                    held.ttl == want,
                    "read reports TTL {:?}, granted {want:?}",
                    held.ttl
                );
            }
            c.release(&g).await?;
        }
        Ok(Outcome::Passed)
    })
}
