//! Contract point 4: release touches only our own grant; read never mutates.

use lease_core::{Acquire, HolderId, LeaseState, Renewal};

use super::{clients, grant, key, long_ttl, payload, req, short_ttl, take_over, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// After a release the key reads free and the next acquirer gets it at once.
pub fn release_frees_the_key(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("release");
        let cs = clients(h, 2).await?;
        let ttl = long_ttl(&cs[0].capabilities());
        let (a, b) = (HolderId::random(), HolderId::random());
        let g1 = grant(&*cs[0], &key, &a, ttl, "first acquire").await?;
        cs[0].release(&g1).await?;
        let state = cs[1].read(&key).await?;
        ensure!(
            state == LeaseState::Free,
            "after release a read shows {state:?}"
        );
        let g2 = grant(&*cs[1], &key, &b, ttl, "right after a release").await?;
        ensure!(
            g2.fence() > g1.fence(),
            "fence {} after release is not above {}",
            g2.fence(),
            g1.fence()
        );
        // Releasing twice is harmless.
        cs[0].release(&g1).await?;
        cs[1].release(&g2).await?;
        cs[1].release(&g2).await?;
        Ok(Outcome::Passed)
    })
}

/// Releasing a grant that was already taken over is an `Ok` no-op: the new
/// holder keeps its grant, its fence and its ability to renew.
pub fn release_of_lost_grant_leaves_new_holder(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("release-lost");
        let cs = clients(h, 3).await?;
        let ttl = short_ttl(&cs[0].capabilities());
        let (a, b, c) = (HolderId::random(), HolderId::random(), HolderId::random());
        let g1 = grant(&*cs[0], &key, &a, ttl, "first acquire").await?;
        let g2 = take_over(h, &*cs[1], &key, &b, &g1, g1.sent_at()).await?;
        cs[0]
            .release(&g1)
            .await
            .map_err(|e| Failure(format!("release of a lost grant must be Ok, got: {e}")))?;
        let state = cs[2].read(&key).await?;
        ensure!(
            state.holding().map(|x| (&x.holder, x.fence)) == Some((&b, g2.fence())),
            "release of a lost grant disturbed the new holder: read shows {state:?}"
        );
        if let Acquire::Granted(g) = cs[2].try_acquire(req(&key, &c, ttl)).await? {
            return Err(Failure(format!(
                "after a stale release a third holder was granted fence {} while {b} holds {}",
                g.fence(),
                g2.fence()
            )));
        }
        match cs[1].renew(&g2, None).await? {
            Renewal::Renewed(_) => {}
            Renewal::Lost => {
                return Err(Failure(
                    "the new holder lost its grant to a stale release".into(),
                ))
            }
        }
        Ok(Outcome::Passed)
    })
}

/// Reads never mutate: repeated reads agree, the holder can still renew,
/// others are still refused, and reading a free key leaves it free.
pub fn read_changes_nothing(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("read");
        let free = super::key("read-free");
        let cs = clients(h, 2).await?;
        let ttl = long_ttl(&cs[0].capabilities());
        let (a, b) = (HolderId::random(), HolderId::random());
        for _ in 0..3 {
            let s = cs[1].read(&free).await?;
            ensure!(s == LeaseState::Free, "a never-used key reads {s:?}");
        }
        let p = payload("read-me");
        let g =
            super::grant_req(&*cs[0], req(&key, &a, ttl).payload(p.clone()), "free key").await?;
        let mut seen = Vec::new();
        for c in &cs {
            for _ in 0..3 {
                let s = c.read(&key).await?;
                let held = s
                    .holding()
                    .ok_or_else(|| Failure(format!("a read of held {key} says free")))?;
                seen.push((held.holder.clone(), held.fence, held.payload.clone()));
            }
        }
        ensure!(
            seen.iter().all(|x| *x == (a.clone(), g.fence(), p.clone())),
            "reads disagree or differ from the grant: {seen:?}"
        );
        if let Acquire::Granted(g2) = cs[1].try_acquire(req(&key, &b, ttl)).await? {
            return Err(Failure(format!(
                "after reads a stranger was granted fence {}",
                g2.fence()
            )));
        }
        match cs[0].renew(&g, None).await? {
            Renewal::Renewed(r) => ensure!(r.fence() == g.fence(), "renew changed the fence"),
            Renewal::Lost => return Err(Failure("the holder lost its grant after reads".into())),
        }
        cs[0].release(&g).await?;
        // A key that was read while free is still acquirable.
        let g3 = grant(&*cs[1], &free, &b, ttl, "a key that was only read").await?;
        cs[1].release(&g3).await?;
        Ok(Outcome::Passed)
    })
}
