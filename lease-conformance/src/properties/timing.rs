//! Contract point 6: the holder-side deadline counts from the send instant.

use std::time::{Duration, Instant};

use lease_core::{HolderId, Renewal};

use super::{clients, grant, key, long_ttl, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// Injected latency when the harness supports it.
const LATENCY: Duration = Duration::from_millis(200);

/// A grant's send instant lies no later than the call's end (within the
/// call, or before it when the grant rests on an earlier request), a fresh
/// grant leaves time to write, its deadline is the send instant plus the
/// safe fraction of the TTL, and — where latency can be injected — the send
/// instant is taken before the slow request, not after its answer.
pub fn deadline_counts_from_the_send_instant(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("deadline");
        let cs = clients(h, 1).await?;
        let c = &*cs[0];
        let ttl = long_ttl(&c.capabilities());
        let a = HolderId::random();

        let t0 = Instant::now();
        let g = grant(c, &key, &a, ttl, "free key").await?;
        let t1 = Instant::now();
        ensure!(
            g.sent_at() <= t1,
            "sent_at lies after the acquire call's answer"
        );
        // A grant may rest on a request sent before the call, but not on one
        // older than a TTL: whatever it set up has run out.
        ensure!(
            t0.checked_sub(g.ttl())
                .is_none_or(|oldest| g.sent_at() > oldest),
            "sent_at lies more than a TTL before the acquire call"
        );
        ensure!(
            g.deadline() == g.timing().deadline(g.sent_at(), g.ttl()),
            "deadline is not sent_at + fraction × TTL"
        );
        ensure!(
            g.may_write(),
            "a fresh grant with a {ttl:?} TTL may not write (a grant counted from before the call must still leave time to write)"
        );
        ensure!(
            g.deadline() <= t1 + ttl,
            "deadline lies beyond a full TTL after the answer"
        );

        if !h.set_latency(LATENCY) {
            c.release(&g).await?;
            return Ok(Outcome::NotApplicable(
                "the harness cannot inject latency; only the basic send-instant checks ran".into(),
            ));
        }
        let r0 = Instant::now();
        let renewed = c.renew(&g, None).await;
        let k0 = Instant::now();
        let reacquired = grant(c, &key, &a, ttl, "re-acquire").await;
        h.set_latency(Duration::ZERO);
        let g2 = match renewed? {
            Renewal::Renewed(g2) => g2,
            Renewal::Lost => return Err(Failure("renew of a live grant was Lost".into())),
        };
        ensure!(
            g2.sent_at() < r0 + LATENCY / 2,
            "renew's send instant is {:?} after the call began, but the request was sent at once and took {LATENCY:?}: the deadline must count from the send",
            g2.sent_at() - r0
        );
        let g3 = reacquired?;
        ensure!(
            g3.sent_at() < k0 + LATENCY / 2,
            "acquire's send instant is {:?} after the call began, but the request took {LATENCY:?}: the deadline must count from the send",
            g3.sent_at() - k0
        );
        c.release(&g3).await?;
        Ok(Outcome::Passed)
    })
}
