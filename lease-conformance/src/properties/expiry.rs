//! Contract points 3 and 5: expiry on the backend's (or observer's) time,
//! and loss as an outcome.

use lease_core::{Acquire, HolderId, LeaseBackend, Renewal};

use super::{clients, grant, key, req, short_ttl, take_over, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// A grant left unrenewed for its TTL lets another holder in, with a higher
/// fence, and the old holder's renew then reports `Lost`.
pub fn after_expiry_another_holder_acquires(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("expiry");
        let cs = clients(h, 2).await?;
        let ttl = short_ttl(&cs[0].capabilities());
        let (a, b) = (HolderId::random(), HolderId::random());
        let g1 = grant(&*cs[0], &key, &a, ttl, "first acquire").await?;
        let g2 = take_over(h, &*cs[1], &key, &b, &g1, g1.sent_at()).await?;
        ensure!(
            g2.fence() > g1.fence(),
            "fence after expiry {} is not above {}",
            g2.fence(),
            g1.fence()
        );
        let held = cs[0].read(&key).await?;
        ensure!(
            held.holding().map(|x| (&x.holder, x.fence)) == Some((&b, g2.fence())),
            "after the takeover a read shows {held:?}, not {b} with fence {}",
            g2.fence()
        );
        cs[1].release(&g2).await?;
        Ok(Outcome::Passed)
    })
}

/// Renewing a grant that was taken over (or released) is `Ok(Lost)` — an
/// outcome, not an error — and does not disturb the new holder.
pub fn renew_after_takeover_is_lost(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("renew-lost");
        let cs = clients(h, 2).await?;
        let ttl = short_ttl(&cs[0].capabilities());
        let (a, b) = (HolderId::random(), HolderId::random());
        let g1 = grant(&*cs[0], &key, &a, ttl, "first acquire").await?;
        let g2 = take_over(h, &*cs[1], &key, &b, &g1, g1.sent_at()).await?;
        match cs[0].renew(&g1, None).await {
            Ok(Renewal::Lost) => {}
            Ok(Renewal::Renewed(g)) => {
                return Err(Failure(format!(
                    "renew of a taken-over grant succeeded (fence {}) while {b} holds fence {}",
                    g.fence(),
                    g2.fence()
                )))
            }
            Err(e) => {
                return Err(Failure(format!(
                    "renew of a taken-over grant must be Ok(Lost), got error: {e}"
                )))
            }
        }
        match cs[1].renew(&g2, None).await? {
            Renewal::Renewed(_) => {}
            Renewal::Lost => {
                return Err(Failure(
                    "the new holder lost its grant after the old holder's renew".into(),
                ))
            }
        }
        // Once released, the holder's own grant is lost too.
        cs[1].release(&g2).await?;
        match cs[1].renew(&g2, None).await {
            Ok(Renewal::Lost) => {}
            other => {
                return Err(Failure(format!(
                    "renew after release must be Ok(Lost), got {other:?}"
                )))
            }
        }
        Ok(Outcome::Passed)
    })
}

/// A grant nobody renews lets another holder in once its TTL has passed,
/// even while its own client keeps renewing another key of the same TTL:
/// a backend that keeps a client's keys on one server-side lease (etcd's
/// sessions) must still let an abandoned one go one TTL after its last
/// renewal. The kept key is renewed every quarter of the TTL throughout,
/// and must stay its holder's.
pub fn an_abandoned_grant_expires_while_its_client_renews_another(
    h: &dyn Harness,
) -> PropFuture<'_> {
    Box::pin(async move {
        let (kept, dropped) = (key("abandon-kept"), key("abandon-dropped"));
        let cs = clients(h, 2).await?;
        let (c, stranger) = (&*cs[0], &*cs[1]);
        let caps = c.capabilities();
        let ttl = caps.ttl.effective(short_ttl(&caps) * 4)?;
        let (a, b, other) = (HolderId::random(), HolderId::random(), HolderId::random());
        let mut g = grant(c, &kept, &a, ttl, "the kept key").await?;
        let abandoned = grant(c, &dropped, &b, ttl, "the abandoned key").await?;
        let fence = abandoned.fence();
        drop(abandoned);
        if let Acquire::Granted(x) = stranger.try_acquire(req(&dropped, &other, ttl)).await? {
            return Err(Failure(format!(
                "a stranger was granted {dropped} (fence {}) right after it was acquired",
                x.fence()
            )));
        }
        // Five quarters of the TTL, the kept key renewed after each.
        for _ in 0..5 {
            h.pass(ttl / 4).await;
            g = match c.renew(&g, None).await? {
                Renewal::Renewed(n) => n,
                Renewal::Lost => {
                    return Err(Failure(format!(
                        "{kept}, renewed every quarter of its TTL, was lost"
                    )))
                }
            };
        }
        let taken = grant(
            stranger,
            &dropped,
            &other,
            ttl,
            "more than a TTL after the abandoned grant, while its client renewed another key",
        )
        .await?;
        ensure!(
            taken.fence() > fence,
            "fence after the abandoned grant {} is not above {fence}",
            taken.fence()
        );
        stranger.release(&taken).await?;
        c.release(&g).await?;
        Ok(Outcome::Passed)
    })
}
