//! The administrative break: what `lease break` relies on.

use lease_core::{BreakNote, Error, HolderId, LeaseState, Renewal};

use super::{clients, grant, key, long_ttl, payload, req, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

fn note(reason: &str) -> BreakNote {
    BreakNote::new("lease-conformance", reason).with_at_unix_ms(1)
}

/// Breaking a held lease reports the grant it ended, frees the key at once
/// for a grant with a higher fence, turns the old holder's renew into
/// `Lost` and its release into a no-op; breaking a free key (or a corrupt
/// record) is fine too. `last_break` reads each break back (holder, fence,
/// note), and nothing for a key never broken. Backends without the
/// operation say `Unsupported`.
pub fn break_frees_the_key_and_keeps_fences_rising(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("break");
        let cs = clients(h, 2).await?;
        let ttl = long_ttl(&cs[0].capabilities());
        let (a, b) = (HolderId::random(), HolderId::random());
        let p = payload("to-be-broken");
        let g1 =
            super::grant_req(&*cs[0], req(&key, &a, ttl).payload(p.clone()), "free key").await?;
        let broken = match cs[1].break_lease(&key, &note("stuck holder")).await {
            Err(Error::Unsupported { .. }) => {
                cs[0].release(&g1).await?;
                return Ok(Outcome::NotApplicable(
                    "the backend has no administrative break".into(),
                ));
            }
            other => other?,
        };
        let prev = broken
            .previous
            .as_ref()
            .ok_or_else(|| Failure("break of a held key reported no previous holder".into()))?;
        ensure!(
            prev.holder == a && prev.fence == g1.fence() && prev.payload == p,
            "break reported {} / {} as the previous grant, not {a} / {}",
            prev.holder,
            prev.fence,
            g1.fence()
        );
        ensure!(!broken.audit.is_empty(), "break named no audit record");
        let last = cs[0].last_break(&key).await?.ok_or_else(|| {
            Failure(
                "last_break found no record of the break (it must read the audit record)".into(),
            )
        })?;
        ensure!(
            last.holder.as_ref() == Some(&a)
                && last.fence == Some(g1.fence())
                && last.note.reason == "stuck holder"
                && last.note.by == "lease-conformance",
            "last_break read {last:?}, not the break of {a} / {}",
            g1.fence()
        );
        let state = cs[1].read(&key).await?;
        ensure!(
            state == LeaseState::Free,
            "after a break the key reads {state:?}"
        );
        let g2 = grant(&*cs[1], &key, &b, ttl, "right after a break").await?;
        ensure!(
            g2.fence() > g1.fence(),
            "fence after a break {} is not above {}",
            g2.fence(),
            g1.fence()
        );
        match cs[0].renew(&g1, None).await? {
            Renewal::Lost => {}
            Renewal::Renewed(_) => {
                return Err(Failure("the broken holder could still renew".into()))
            }
        }
        cs[0].release(&g1).await?;
        let state = cs[0].read(&key).await?;
        ensure!(
            state.holding().map(|x| (&x.holder, x.fence)) == Some((&b, g2.fence())),
            "the broken holder's release disturbed the new holder: {state:?}"
        );
        cs[1].release(&g2).await?;
        // A free key, and a corrupt record where the harness can write one.
        let free = super::key("break-free");
        let r = cs[1].break_lease(&free, &note("nothing there")).await?;
        ensure!(
            r.previous.is_none(),
            "break of a free key reported {:?}",
            r.previous
        );
        let last = cs[0].last_break(&free).await?;
        ensure!(
            last.as_ref().is_some_and(|l| l.holder.is_none()
                && l.fence.is_none()
                && l.note.reason == "nothing there"),
            "last_break of a broken free key read {last:?}"
        );
        let never = super::key("break-never");
        let last = cs[0].last_break(&never).await?;
        ensure!(
            last.is_none(),
            "last_break of a key never broken read {last:?}"
        );
        let corrupt = super::key("break-corrupt");
        if let Some(write) = h.write_corrupt(&corrupt) {
            write.await?;
            let r = cs[1].break_lease(&corrupt, &note("corrupt record")).await?;
            ensure!(
                r.previous.is_none(),
                "break of a corrupt record reported {:?}",
                r.previous
            );
            let g = grant(
                &*cs[0],
                &corrupt,
                &a,
                ttl,
                "after breaking a corrupt record",
            )
            .await?;
            cs[0].release(&g).await?;
        }
        Ok(Outcome::Passed)
    })
}
