//! The watch: what [`LeaseBackend::wait_for_change`](lease_core::LeaseBackend::wait_for_change)
//! must wake for beyond a new holder, a release or an expiry.

use std::time::{Duration, Instant};

use lease_core::{HolderId, LeaseState, Payload, Renewal};
use tokio::sync::oneshot;

use super::{clients, key, long_ttl, payload, req, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// How soon after the renewal that stores a new payload returns a waiter
/// must have seen it. Well above what a server-side watch takes (a few
/// milliseconds), well below the once-a-second re-check a watch may fall
/// back on, which would make an election observer see a proclaimed value
/// up to a second late.
const BOUND: Duration = Duration::from_millis(500);

/// Time the waiter gets to start watching before the holder writes, and
/// between the holder's writes.
const SETTLE: Duration = Duration::from_millis(100);

/// A waiter that saw a grant with one payload is woken when its holder
/// renews it with another (an election leader proclaiming a new value):
/// within 500 ms of that renewal's answer, a read after the wake shows the
/// new payload. Renewals that keep the payload (none given, or the same one)
/// come first; the waiter may wake for them (spurious wakes are allowed: it
/// re-reads and waits again) but need not. A wait begun after the change,
/// with the old state as `seen`, resolves at once.
///
/// Applies where [`Capabilities::watch`](lease_core::Capabilities::watch) is
/// true; backends without a watch poll, and their waiters see a change at
/// their next poll.
pub fn a_watch_wakes_on_a_payload_change(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("watch-payload");
        let cs = clients(h, 2).await?;
        let caps = cs[0].capabilities();
        if !caps.watch {
            return Ok(Outcome::NotApplicable(
                "no watch: waiters poll, so no wake is owed on a payload change".into(),
            ));
        }
        let ttl = long_ttl(&caps);
        let holder = HolderId::random();
        let (v1, v2) = (payload("proclaimed-first"), payload("proclaimed-second"));
        let g = super::grant_req(
            &*cs[0],
            req(&key, &holder, ttl).payload(v1.clone()),
            "free key",
        )
        .await?;
        let seen = cs[1].read(&key).await?;
        ensure!(
            shows(&seen, &holder, &v1),
            "a read after the acquire with payload {} returned {}",
            text(&v1),
            describe(&seen)
        );

        // The writer sends the instant its payload-changing renewal returned;
        // the waiter gives up BOUND after it (at once if the writer failed).
        let (renewed_tx, renewed_rx) = oneshot::channel::<Instant>();
        let give_up = async {
            if let Ok(at) = renewed_rx.await {
                tokio::time::sleep_until((at + BOUND).into()).await;
            }
        };
        let watcher = async {
            loop {
                cs[1].wait_for_change(&key, &seen).await?;
                let now = cs[1].read(&key).await?;
                if shows(&now, &holder, &v2) {
                    return Ok::<_, Failure>(Instant::now());
                }
                ensure!(
                    shows(&now, &holder, &v1),
                    "while the holder only renewed, a read returned {}",
                    describe(&now)
                );
            }
        };
        let waiter = async {
            tokio::select! {
                woke = watcher => Some(woke),
                () = give_up => None,
            }
        };
        let writer = async {
            tokio::time::sleep(SETTLE).await;
            let g = renewed(cs[0].renew(&g, None).await?, "without a payload")?;
            let g = renewed(
                cs[0].renew(&g, Some(v1.clone())).await?,
                "with the same payload",
            )?;
            tokio::time::sleep(SETTLE).await;
            let sent = Instant::now();
            let g = renewed(
                cs[0].renew(&g, Some(v2.clone())).await?,
                "with a new payload",
            )?;
            let at = Instant::now();
            let _ = renewed_tx.send(at);
            Ok::<_, Failure>((g, sent, at))
        };
        let (woke, wrote) = tokio::join!(waiter, writer);
        let (g, sent_at, renewed_at) = wrote?;
        let woke_at = match woke {
            Some(woke) => woke?,
            None => {
                let now = cs[1].read(&key).await?;
                return Err(Failure(format!(
                    "a waiter that saw payload {} was not woken within {BOUND:?} of a \
                     renewal storing {} (a read now returns {})",
                    text(&v1),
                    text(&v2),
                    describe(&now)
                )));
            }
        };
        let took = woke_at.saturating_duration_since(renewed_at);
        ensure!(
            took <= BOUND,
            "the waiter saw the new payload {took:?} after the renewal returned (bound {BOUND:?})"
        );
        eprintln!(
            "lease-conformance: {}: a watcher saw a renewal's new payload {:.1} ms after the renewal \
             was sent, {:.1} ms after it returned",
            h.name(),
            woke_at.saturating_duration_since(sent_at).as_secs_f64() * 1000.0,
            took.as_secs_f64() * 1000.0
        );
        // A change counts from `seen`, not from the call: a wait begun after
        // the new payload was stored resolves at once.
        let late = tokio::time::timeout(BOUND, cs[1].wait_for_change(&key, &seen)).await;
        ensure!(
            matches!(late, Ok(Ok(()))),
            "a wait begun after the payload changed from the one seen did not resolve within \
             {BOUND:?}: {late:?}"
        );
        cs[0].release(&g).await?;
        Ok(Outcome::Passed)
    })
}

/// Whether `state` shows `holder` holding the key with `payload`.
fn shows(state: &LeaseState, holder: &HolderId, payload: &Payload) -> bool {
    state
        .holding()
        .is_some_and(|h| &h.holder == holder && &h.payload == payload)
}

/// A payload as the text the property stored in it.
fn text(p: &Payload) -> String {
    format!("{:?}", String::from_utf8_lossy(p.as_bytes()))
}

/// A state, its payload as text.
fn describe(state: &LeaseState) -> String {
    match state.holding() {
        None => "the key free".into(),
        Some(h) => format!(
            "{} holding fence {} with payload {}",
            h.holder,
            h.fence,
            text(&h.payload)
        ),
    }
}

/// The renewed grant, or a failure naming the renewal.
fn renewed(r: Renewal, what: &str) -> Result<lease_core::Grant, Failure> {
    match r {
        Renewal::Renewed(g) => Ok(g),
        Renewal::Lost => Err(Failure(format!(
            "a renewal {what} of a live grant was Lost"
        ))),
    }
}
