//! Cancellation: a caller may drop any operation at any await point (a
//! `select!`, a timeout — the keeper bounds every renewal with one). What
//! was half-done must not leak into the answers of later operations, and
//! the contract must still hold for the grant the caller kept.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use lease_core::{Acquire, Error, Grant, HolderId, LeaseBackend, LeaseState, Renewal};

use super::{clients, grant, key, long_ttl, payload, req, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// Where each kind of operation is cut, in turn: early and late await
/// points, and moments in the middle of a round trip.
const CUTS: [Cut; 7] = [
    Cut::Polls(1),
    Cut::Polls(2),
    Cut::Polls(3),
    Cut::After(Duration::ZERO),
    Cut::After(Duration::from_micros(300)),
    Cut::After(Duration::from_millis(1)),
    Cut::After(Duration::from_millis(3)),
];

/// Every operation is dropped at each of several await points (after 1–3
/// polls, after 0–3 ms), and then renew, read, a stranger's acquire and the
/// holder's re-acquire — run to completion with the grant first obtained —
/// must each get their own, correct answers: the grant is still live and
/// renewable by (holder, fence), held by the holder with its fence, refused
/// to the stranger. Last, a cancelled release followed by a complete one
/// frees the key, and the next grant's fence is higher.
pub fn cancelled_operations_leave_the_contract_intact(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("cancel");
        let cs = clients(h, 2).await?;
        let (c, other) = (&*cs[0], &*cs[1]);
        let ttl = long_ttl(&c.capabilities());
        let (a, b) = (HolderId::random(), HolderId::random());
        let g = grant(c, &key, &a, ttl, "first acquire").await?;

        for round in 0..CUTS.len() * 4 {
            let op = round % 4;
            let cut = CUTS[round / 4];
            let what = match op {
                0 => {
                    let p = payload(&format!("round {round}"));
                    cut.run(c.renew(&g, Some(p))).await;
                    "renew"
                }
                1 => {
                    cut.run(c.read(&key)).await;
                    "read"
                }
                2 => {
                    cut.run(c.try_acquire(req(&key, &b, ttl))).await;
                    "a stranger's acquire"
                }
                _ => {
                    cut.run(c.try_acquire(req(&key, &a, ttl))).await;
                    "the holder's re-acquire"
                }
            };
            let after = format!("after a {what} cancelled {cut}");
            check_intact(c, other, &g, &b, ttl, &after).await?;
        }

        Cut::Polls(1).run(c.release(&g)).await;
        complete(|| c.release(&g), "release after a cancelled release").await?;
        let state = complete(|| other.read(&key), "read after release").await?;
        ensure!(
            state.is_free(),
            "after a cancelled and then a complete release the key reads {state:?}"
        );
        let next = grant(other, &key, &b, ttl, "after the release").await?;
        ensure!(
            next.fence() > g.fence(),
            "fence {} after the release is not above {}",
            next.fence(),
            g.fence()
        );
        other.release(&next).await?;
        Ok(Outcome::Passed)
    })
}

/// The grant `g` is live, renewable, read as held, refused to `b`, and
/// re-acquirable by its holder with the same fence.
async fn check_intact(
    c: &dyn LeaseBackend,
    other: &dyn LeaseBackend,
    g: &Grant,
    b: &HolderId,
    ttl: Duration,
    after: &str,
) -> Result<(), Failure> {
    match complete(|| c.renew(g, None), after).await? {
        Renewal::Renewed(r) => ensure!(
            r.fence() == g.fence(),
            "{after}: renew answered fence {} for a grant with fence {}",
            r.fence(),
            g.fence()
        ),
        Renewal::Lost => {
            return Err(Failure(format!(
                "{after}: renewing the live grant (fence {}) was Lost",
                g.fence()
            )))
        }
    }
    match complete(|| other.read(g.key()), after).await? {
        LeaseState::Held(h) => ensure!(
            h.holder == *g.holder() && h.fence == g.fence(),
            "{after}: read shows {} with fence {}, not the holder with fence {}",
            h.holder,
            h.fence,
            g.fence()
        ),
        free => {
            return Err(Failure(format!(
                "{after}: read shows {free:?} while the grant is live"
            )))
        }
    }
    match complete(|| other.try_acquire(req(g.key(), b, ttl)), after).await? {
        Acquire::Held(h) => ensure!(
            h.fence == g.fence(),
            "{after}: a refused acquire names fence {}, not {}",
            h.fence,
            g.fence()
        ),
        Acquire::Granted(x) => {
            return Err(Failure(format!(
                "{after}: a stranger was granted fence {} while fence {} is live",
                x.fence(),
                g.fence()
            )))
        }
    }
    match complete(|| c.try_acquire(req(g.key(), g.holder(), ttl)), after).await? {
        Acquire::Granted(x) => ensure!(
            x.fence() == g.fence(),
            "{after}: the holder's re-acquire got fence {}, not {}",
            x.fence(),
            g.fence()
        ),
        Acquire::Held(h) => {
            return Err(Failure(format!(
                "{after}: the holder's re-acquire was refused (held by {} with fence {})",
                h.holder, h.fence
            )))
        }
    }
    Ok(())
}

/// Runs `op` to completion; an unknown outcome (the backend's own retry
/// budget, a reconnect after the cancelled exchange) is retried twice.
async fn complete<T, F, Fut>(op: F, after: &str) -> Result<T, Failure>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut last = None;
    for _ in 0..3 {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_unknown_outcome() => last = Some(e),
            Err(e) => return Err(Failure(format!("{after}: {e}"))),
        }
    }
    Err(Failure(format!(
        "{after}: three attempts in a row had unknown outcomes: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}

/// Where an operation is dropped.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// After it was polled this many times (each poll after the first is an
    /// await point it resumed from).
    Polls(u32),
    /// After this long, whatever it was doing.
    After(Duration),
}

impl Cut {
    /// Drives `op` until the cut, then drops it; its outcome is not looked at
    /// (it may or may not have been applied).
    async fn run<T>(self, op: impl Future<Output = T>) {
        match self {
            Cut::Polls(n) => {
                let _ = (PollLimit {
                    inner: Box::pin(op),
                    left: n,
                })
                .await;
            }
            Cut::After(d) => {
                let _ = tokio::time::timeout(d, op).await;
            }
        }
    }
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cut::Polls(n) => write!(f, "after {n} poll(s)"),
            Cut::After(d) => write!(f, "after {d:?}"),
        }
    }
}

/// Polls `inner` at most `left` times; resolves to `None` (dropping it) when
/// woken once more after that.
struct PollLimit<'a, T> {
    inner: Pin<Box<dyn Future<Output = T> + 'a>>,
    left: u32,
}

impl<T> Future for PollLimit<'_, T> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        self.inner.as_mut().poll(cx).map(Some)
    }
}
