//! Leader election: handover time and observer lag, per backend.
//!
//! Two candidates, each a `lease-keeper` `Keeper` on a client of its own,
//! take turns leading one key; an [`Observer`](lease_keeper::Observer) on a
//! third client follows it. Each iteration:
//!
//! 1. the candidate that does not lead starts campaigning (it waits);
//! 2. the leader proclaims a new value — **observer lag (proclaim)**: from
//!    the proclaim's return (the new value is stored) to the observer
//!    reporting it;
//! 3. the leader resigns — **handover**: from the resign call to the waiting
//!    candidate's work starting (a `Leadership::run` whose work records its
//!    first poll; the campaign's return is recorded too); **observer lag
//!    (no leader)**: from the resign's return to the observer reporting no
//!    leader, where it does (a watch sees the release; a poll may see the
//!    new leader first); **observer lag (new leader)**: from the new
//!    leader's campaign returning to the observer reporting it.
//!
//! A lag is measured from the instant the writer knows its change is
//! stored; an observer that hears of it first (a watch event overtaking
//! the write's answer) counts as 0. Waits between the steps vary, so the
//! changes fall at every phase of a polling observer's interval.

use std::time::{Duration, Instant};

use lease_core::{HolderId, LeaseKey, Payload};
use lease_keeper::{Election, Keeper, Leader, Leadership};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::stats::{self, Latency};
use crate::targets::Target;

/// The campaigns' TTL: observers on backends without a watch poll every
/// tenth of it (the default), here 500 ms.
pub const TTL: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Serialize)]
pub struct ElectionResult {
    pub backend: &'static str,
    /// Whether the backend serves a watch (`capabilities().watch`).
    pub watch: bool,
    pub ttl_s: f64,
    /// The observers' poll interval (the election's default for the TTL).
    pub poll_interval_ms: f64,
    pub handovers: usize,
    /// Resign called → the next leader's work starts.
    pub handover: Latency,
    /// Resign called → the next candidate's campaign returns.
    pub handover_campaign: Latency,
    pub lag_proclaim: Latency,
    pub lag_no_leader: Latency,
    pub lag_new_leader: Latency,
    /// Changes the observer did not report within the wait (never expected).
    pub unreported: usize,
    /// Observed changes that matched no change made (never expected).
    pub unexpected: usize,
}

impl ElectionResult {
    /// The largest p99 of the three lags (NaN when none was measured).
    pub fn worst_lag_p99_us(&self) -> f64 {
        [
            &self.lag_proclaim,
            &self.lag_no_leader,
            &self.lag_new_leader,
        ]
        .iter()
        .filter(|l| l.n > 0)
        .map(|l| l.p99_us)
        .fold(f64::NAN, f64::max)
    }
}

/// What the observer reported, and when.
type Seen = (Instant, Option<Leader>);

/// What an observed change is to the change awaited.
enum Fits {
    /// The one awaited.
    Awaited,
    /// Expected on the way (no leader, between a resign and the next leader).
    OnTheWay,
    /// Not expected at all.
    Unexpected,
}

/// Takes observed changes until one is the awaited one, counting the
/// unexpected ones; `None` when it did not come within `wait`.
async fn wait_for(
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    wait: Duration,
    unexpected: &mut usize,
    mut fits: impl FnMut(Instant, &Option<Leader>) -> Fits,
) -> Option<Instant> {
    let end = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(end, rx.recv()).await {
            Ok(Some((at, change))) => match fits(at, &change) {
                Fits::Awaited => return Some(at),
                Fits::OnTheWay => {}
                Fits::Unexpected => *unexpected += 1,
            },
            Ok(None) | Err(_) => return None,
        }
    }
}

fn awaited(yes: bool) -> Fits {
    if yes {
        Fits::Awaited
    } else {
        Fits::Unexpected
    }
}

fn payload(s: String) -> Result<Payload, String> {
    Payload::new(s.into_bytes()).map_err(|e| e.to_string())
}

fn is_leader(change: &Option<Leader>, holder: &HolderId, fence_of: &Leadership) -> bool {
    matches!(change, Some(l) if l.holder.is_term_of(holder) && l.fence == fence_of.fence())
}

/// A campaign run in a task of its own: when it wins, its work records
/// the instant it starts. Gives (campaign returned, work started, leadership).
async fn campaign(
    election: Election,
    value: Payload,
    wait: Duration,
) -> Result<(Instant, Instant, Leadership), String> {
    let leadership = election
        .campaign(value)
        .wait(wait)
        .await
        .map_err(|e| format!("campaign: {e}"))?;
    let won = Instant::now();
    let started = leadership
        .run(async { Instant::now() })
        .await
        .finished()
        .ok_or("the new leader's work did not run")?;
    Ok((won, started, leadership))
}

pub async fn measure(t: &Target, run: &str, iterations: usize) -> Result<ElectionResult, String> {
    let name = t.name();
    let prefix = format!("{run}/elect");
    let key = LeaseKey::new(format!("{prefix}/leader")).map_err(|e| e.to_string())?;
    let mut candidates = Vec::new();
    for _ in 0..2 {
        let c = t.connect(None, &prefix).await?;
        candidates.push(Keeper::new(c.backend.clone()).election(&key).with_ttl(TTL));
    }
    let observing = t.connect(None, &prefix).await?;
    let watch = observing.backend.capabilities().watch;
    let eo = Keeper::new(observing.backend.clone())
        .election(&key)
        .with_ttl(TTL);
    let poll = eo.poll_interval();
    let mut observer = eo.observe();
    let (tx, mut rx) = mpsc::unbounded_channel::<Seen>();
    let follow = tokio::spawn(async move {
        loop {
            let change = observer.changed().await;
            if tx.send((Instant::now(), change)).is_err() {
                break;
            }
        }
    });
    // Generous bounds: a miss shows as a long lag, not as a failure.
    let observe_wait = poll * 4 + Duration::from_secs(5);
    let campaign_wait = TTL * 4 + Duration::from_secs(10);
    // An observer's first report is the state it starts from (no leader
    // here): taken before the first campaign, so it is not counted as an
    // unexpected report of that campaign.
    match tokio::time::timeout(observe_wait, rx.recv()).await {
        Ok(Some((_, None))) => {}
        Ok(Some((_, Some(l)))) => {
            return Err(format!("{name}: a fresh key already has a leader: {l:?}"))
        }
        Ok(None) | Err(_) => return Err(format!("{name}: the observer never read the key")),
    }

    let (mut lead, mut wait_side) = (0usize, 1usize);
    let first = candidates[lead]
        .campaign(payload(format!("{name} leader 0"))?)
        .wait(campaign_wait)
        .await
        .map_err(|e| format!("{name}: first campaign: {e}"))?;
    let mut unexpected = 0usize;
    let mut unreported = 0usize;
    let holder = |i: usize| candidates[i].keeper().holder().clone();
    if wait_for(&mut rx, observe_wait, &mut unexpected, |_, c| {
        awaited(is_leader(c, &holder(lead), &first))
    })
    .await
    .is_none()
    {
        unreported += 1;
    }
    let mut leader = first;
    let (mut handover, mut handover_campaign) = (Vec::new(), Vec::new());
    let (mut lag_p, mut lag_none, mut lag_new) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..iterations {
        let waiting = tokio::spawn(campaign(
            candidates[wait_side].clone(),
            payload(format!("{name} leader {}", i + 1))?,
            campaign_wait,
        ));
        // Let the candidate settle into its wait; vary the phase.
        tokio::time::sleep(Duration::from_millis(200 + (i as u64 * 211) % 500)).await;

        let value = format!("{name} proclaimed {i}");
        leader
            .proclaim(payload(value.clone())?)
            .await
            .map_err(|e| format!("{name}: proclaim: {e}"))?;
        let stored = Instant::now();
        let me = holder(lead);
        match wait_for(&mut rx, observe_wait, &mut unexpected, |_, c| {
            awaited(
                matches!(c, Some(l) if l.holder.is_term_of(&me) && l.value.as_bytes() == value.as_bytes()),
            )
        })
        .await
        {
            Some(at) => lag_p.push(at.saturating_duration_since(stored)),
            None => unreported += 1,
        }
        tokio::time::sleep(Duration::from_millis(100 + (i as u64 * 137) % 400)).await;

        let t0 = Instant::now();
        leader
            .resign()
            .await
            .map_err(|e| format!("{name}: resign: {e}"))?;
        let released = Instant::now();
        let (won, started, next) = waiting
            .await
            .map_err(|e| format!("{name}: campaign task: {e}"))?
            .map_err(|e| format!("{name}: after a resign: {e}"))?;
        handover.push(started.saturating_duration_since(t0));
        handover_campaign.push(won.saturating_duration_since(t0));
        let next_holder = holder(wait_side);
        let mut no_leader = None;
        match wait_for(&mut rx, observe_wait, &mut unexpected, |at, c| {
            if c.is_none() && no_leader.is_none() {
                no_leader = Some(at);
                return Fits::OnTheWay;
            }
            awaited(is_leader(c, &next_holder, &next))
        })
        .await
        {
            Some(at) => lag_new.push(at.saturating_duration_since(won)),
            None => unreported += 1,
        }
        if let Some(at) = no_leader {
            lag_none.push(at.saturating_duration_since(released));
        }
        leader = next;
        std::mem::swap(&mut lead, &mut wait_side);
    }
    let _ = leader.resign().await;
    follow.abort();
    Ok(ElectionResult {
        backend: name,
        watch,
        ttl_s: TTL.as_secs_f64(),
        poll_interval_ms: poll.as_secs_f64() * 1e3,
        handovers: handover.len(),
        handover: stats::latency(&handover),
        handover_campaign: stats::latency(&handover_campaign),
        lag_proclaim: stats::latency(&lag_p),
        lag_no_leader: stats::latency(&lag_none),
        lag_new_leader: stats::latency(&lag_new),
        unreported,
        unexpected,
    })
}
