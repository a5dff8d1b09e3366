//! Contract point 2: fences strictly increase; a lost answer is taken back.

use std::time::{Duration, Instant};

use lease_core::{Acquire, Grant, HolderId, LeaseBackend, LeaseKey, Renewal};

use super::{clients, grant, key, long_ttl, payload, short_ttl, take_over, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// Fences strictly increase across release, expiry and takeover, whoever
/// acquires, including the first holder coming back.
pub fn fences_increase(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("fences");
        let cs = clients(h, 3).await?;
        let caps = cs[0].capabilities();
        let ttl = short_ttl(&caps);
        let (a, b, c) = (HolderId::random(), HolderId::random(), HolderId::random());

        let g1 = grant(&*cs[0], &key, &a, ttl, "first acquire").await?;
        cs[0].release(&g1).await?;
        let g2 = grant(&*cs[1], &key, &b, ttl, "after release").await?;
        ensure!(
            g2.fence() > g1.fence(),
            "fence after release {} is not above {}",
            g2.fence(),
            g1.fence()
        );

        let g3 = take_over(h, &*cs[2], &key, &c, &g2, g2.sent_at()).await?;
        ensure!(
            g3.fence() > g2.fence(),
            "fence after expiry/takeover {} is not above {}",
            g3.fence(),
            g2.fence()
        );

        cs[2].release(&g3).await?;
        let g4 = grant(&*cs[0], &key, &a, ttl, "first holder again").await?;
        ensure!(
            g4.fence() > g3.fence(),
            "fence of a returning holder {} is not above {}",
            g4.fence(),
            g3.fence()
        );
        cs[0].release(&g4).await?;
        Ok(Outcome::Passed)
    })
}

/// A holder that acquires again while its grant is live (its earlier answer
/// was lost) gets the same grant and fence back, and nobody else gets in.
pub fn reacquire_returns_same_fence(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("reacquire");
        let cs = clients(h, 2).await?;
        let ttl = long_ttl(&cs[0].capabilities());
        let (a, b) = (HolderId::random(), HolderId::random());
        let g1 = grant(&*cs[0], &key, &a, ttl, "first acquire").await?;
        // A different client object with the same holder id: a restarted
        // process or a retry on a fresh connection.
        let g2 = grant(&*cs[1], &key, &a, ttl, "re-acquire by the same holder").await?;
        ensure!(
            g2.fence() == g1.fence(),
            "re-acquire by the holder returned fence {} instead of {}",
            g2.fence(),
            g1.fence()
        );
        if let Acquire::Granted(g) = cs[1].try_acquire(super::req(&key, &b, ttl)).await? {
            return Err(Failure(format!(
                "a stranger was granted {key} (fence {}) after a re-acquire",
                g.fence()
            )));
        }
        match cs[0].renew(&g2, None).await? {
            lease_core::Renewal::Renewed(_) => {}
            lease_core::Renewal::Lost => {
                return Err(Failure("the re-acquired grant could not be renewed".into()))
            }
        }
        cs[0].release(&g2).await?;
        Ok(Outcome::Passed)
    })
}

/// A re-acquire extends the lease from its own request: the backend must keep
/// the grant at least until the deadline the re-acquired grant reports.
pub fn reacquire_extends_the_lease(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("reacquire-extends");
        let cs = clients(h, 2).await?;
        let caps = cs[0].capabilities();
        let ttl = caps
            .ttl
            .effective(short_ttl(&caps).max(Duration::from_secs(4)))
            .unwrap_or(caps.ttl.max);
        let a = HolderId::random();
        let g1 = grant(&*cs[0], &key, &a, ttl, "first acquire").await?;
        h.pass(ttl / 2).await;
        let g2 = grant(&*cs[0], &key, &a, ttl, "re-acquire at half the TTL").await?;
        ensure!(
            g2.fence() == g1.fence(),
            "re-acquire changed the fence {} → {}",
            g1.fence(),
            g2.fence()
        );
        // Past the first grant's expiry, before the second's deadline.
        h.pass(ttl.mul_f64(0.6)).await;
        let state = cs[1].read(&key).await?;
        match state.holding() {
            Some(held) if held.holder == a && held.fence == g1.fence() => {}
            other => {
                return Err(Failure(format!(
                    "after a re-acquire at TTL/2, the lease was gone at 1.1×TTL ({other:?}): re-acquire must extend the lease"
                )))
            }
        }
        cs[0].release(&g2).await?;
        Ok(Outcome::Passed)
    })
}

/// A re-acquire of one's own live grant with a shorter TTL hands back the
/// same term and never ends it sooner: the first grant of that term (whose
/// answer may have arrived after all) counts its deadline from its own TTL,
/// so the key must not go to another holder before that deadline, and the
/// re-acquire reports an effective TTL that lasts at least as long.
pub fn reacquire_with_a_shorter_ttl_keeps_the_term(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("reacquire-shorter");
        let cs = clients(h, 2).await?;
        let caps = cs[0].capabilities();
        let short = short_ttl(&caps);
        // Waiting out the short TTL takes the harness's slack on top (a
        // second or more on some servers): the first grant's deadline, 2/3
        // of the long TTL, must still lie ahead when the stranger asks.
        let long = caps.ttl.effective(short * 6).unwrap_or(caps.ttl.max);
        let (a, b) = (HolderId::random(), HolderId::random());
        let g1 = grant(&*cs[0], &key, &a, long, "first acquire").await?;
        let g2 = grant(&*cs[1], &key, &a, short, "re-acquire with a shorter TTL").await?;
        ensure!(
            g2.fence() == g1.fence(),
            "re-acquire changed the fence {} → {}",
            g1.fence(),
            g2.fence()
        );
        // The stranger's first refusal starts its observation where the
        // backend has no clock of its own.
        if let Acquire::Granted(g) = cs[1].try_acquire(super::req(&key, &b, short)).await? {
            return Err(Failure(format!(
                "a stranger was granted {key} (fence {}) right after a re-acquire",
                g.fence()
            )));
        }
        h.pass(short).await;
        let asked = std::time::Instant::now();
        let deadline = g1.deadline();
        match cs[1].try_acquire(super::req(&key, &b, short)).await? {
            Acquire::Held(_) => {}
            Acquire::Granted(g) if asked < deadline => {
                return Err(Failure(format!(
                    "a stranger was granted {key} (fence {}) once the re-acquire's {short:?} passed, {:?} before the deadline of the first grant ({long:?} TTL): two writers",
                    g.fence(),
                    deadline - asked
                )))
            }
            Acquire::Granted(_) => {
                return Err(Failure(format!(
                    "waiting out {short:?} took past the first grant's deadline ({:?} late): the property could not judge",
                    asked - deadline
                )))
            }
        }
        // The live grant's remaining TTL, counted from the re-acquire's send.
        let remaining = g1
            .ttl()
            .saturating_sub(g2.sent_at().saturating_duration_since(g1.sent_at()));
        ensure!(
            g2.ttl() >= remaining,
            "the re-acquire reports a TTL of {:?}, shorter than the {remaining:?} the live grant of that term still had",
            g2.ttl()
        );
        match cs[0].renew(&g1, None).await? {
            lease_core::Renewal::Renewed(_) => {}
            lease_core::Renewal::Lost => {
                return Err(Failure(
                    "the first grant of the term could not be renewed after the re-acquire".into(),
                ))
            }
        }
        cs[0].release(&g1).await?;
        Ok(Outcome::Passed)
    })
}

/// Renewing an earlier grant of a term keeps the term as long as its
/// longest grant: a holder whose re-acquire with a longer TTL answered (and
/// whose earlier, shorter grant is still being renewed, by a keeper that
/// has not yet switched, or because the re-acquire's answer came late)
/// holds a grant that may write until its own deadline, so no renewal of
/// the shorter grant, with or without a payload, may cut the key's life to
/// the shorter TTL; nor may a re-acquire with the shorter TTL afterwards.
pub fn renewing_an_earlier_grant_keeps_the_longer_term(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("renew-earlier");
        let cs = clients(h, 2).await?;
        let caps = cs[0].capabilities();
        let short = short_ttl(&caps);
        // Two waits of the short TTL, each with the harness's slack on top,
        // must end well before the long grant's deadline.
        let long = caps
            .ttl
            .effective((short * 10).max(Duration::from_secs(10)))
            .unwrap_or(caps.ttl.max);
        if long < short * 4 {
            return Ok(Outcome::NotApplicable(format!(
                "the backend's TTLs span {:?}..={:?}: no TTL outlasts two waits of the shortest",
                caps.ttl.min, caps.ttl.max
            )));
        }
        let (a, b) = (HolderId::random(), HolderId::random());
        let g1 = grant(&*cs[0], &key, &a, short, "first acquire").await?;
        let g2 = grant(&*cs[1], &key, &a, long, "re-acquire with a longer TTL").await?;
        ensure!(
            g2.fence() == g1.fence(),
            "re-acquire changed the fence {} → {}",
            g1.fence(),
            g2.fence()
        );
        // The earlier grant renews, once keeping the payload and once
        // replacing it (a record rewritten with its payload is rewritten
        // with a TTL too).
        let r1 = match cs[0].renew(&g1, None).await? {
            Renewal::Renewed(r) => r,
            Renewal::Lost => {
                return Err(Failure(
                    "the first grant of the term could not be renewed after a re-acquire".into(),
                ))
            }
        };
        match cs[0]
            .renew(&r1, Some(payload("renewed by the earlier grant")))
            .await?
        {
            Renewal::Renewed(_) => {}
            Renewal::Lost => {
                return Err(Failure(
                    "the first grant of the term could not be renewed with a payload".into(),
                ))
            }
        }
        outlasts(
            h,
            &*cs[1],
            &key,
            &b,
            short,
            &[&g2],
            "renewals of the earlier grant",
        )
        .await?;

        // A re-acquire with the short TTL after those renewals is still a
        // re-acquire of the live term: it must not shorten it either.
        let g3 = grant(
            &*cs[0],
            &key,
            &a,
            short,
            "re-acquire with the short TTL after the renewals",
        )
        .await?;
        ensure!(
            g3.fence() == g1.fence(),
            "re-acquire after the renewals changed the fence {} → {}",
            g1.fence(),
            g3.fence()
        );
        let remaining = g2
            .ttl()
            .saturating_sub(g3.sent_at().saturating_duration_since(g2.sent_at()));
        ensure!(
            g3.ttl() >= remaining,
            "the re-acquire after the renewals reports a TTL of {:?}, shorter than the {remaining:?} the long grant of that term still had",
            g3.ttl()
        );
        outlasts(
            h,
            &*cs[1],
            &key,
            &b,
            short,
            &[&g2, &g3],
            "a re-acquire with the short TTL after the renewals",
        )
        .await?;
        cs[0].release(&g3).await?;
        Ok(Outcome::Passed)
    })
}

/// A stranger `b` is refused the key before and after `short` of backend
/// time passes (its first refusal starts its observation where the backend
/// has no clock of its own) while any of `live` may still write.
async fn outlasts(
    h: &dyn Harness,
    stranger: &dyn LeaseBackend,
    key: &LeaseKey,
    b: &HolderId,
    short: Duration,
    live: &[&Grant],
    after: &str,
) -> Result<(), Failure> {
    if let Acquire::Granted(g) = stranger.try_acquire(super::req(key, b, short)).await? {
        return Err(Failure(format!(
            "a stranger was granted {key} (fence {}) right after {after}",
            g.fence()
        )));
    }
    h.pass(short).await;
    let asked = Instant::now();
    let deadline = live.iter().map(|g| g.deadline()).max().unwrap_or(asked);
    match stranger.try_acquire(super::req(key, b, short)).await? {
        Acquire::Held(_) => Ok(()),
        Acquire::Granted(g) if asked < deadline => Err(Failure(format!(
            "a stranger was granted {key} (fence {}) once {short:?} passed after {after}, {:?} before the deadline of the term's longer grant: two writers",
            g.fence(),
            deadline - asked
        ))),
        Acquire::Granted(_) => Err(Failure(format!(
            "waiting out {short:?} after {after} took past the longer grant's deadline ({:?} late): the property could not judge",
            asked - deadline
        ))),
    }
}
