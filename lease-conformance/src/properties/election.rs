//! Leader election (`lease-keeper`'s `Election`) on every backend: one
//! leader at a time among several candidates, observers that see every
//! change in order (including "no leader"), work that never outlives its
//! leadership, a lost leader that cannot advertise over its successor, and
//! a resign that hands over at once.
//!
//! Candidates and observers each get a client of their own, as separate
//! processes would. Faults at the client boundary use [`Unreachable`]. On a
//! harness whose time is virtual (the fake), the backend's clock is moved
//! with real time for the whole property, since the keeper's deadlines run
//! on real time.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{Capabilities, Fence, HolderId, LeaseBackend};
use lease_keeper::{Election, Leader, Leadership, WorkEnded};
use tokio::time::{sleep, timeout, Instant};

use super::keeper::{keeper_on, keeper_ttl, virtual_time, Unreachable};
use super::{clients, key, payload, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// Candidates in the one-leader-at-a-time property.
const CANDIDATES: usize = 4;

/// How long each leader's work runs in the one-leader-at-a-time property:
/// long enough for a second leader to show up inside it, far shorter than
/// the write deadline.
const WORK: Duration = Duration::from_millis(150);

/// How late after its write deadline a leader's work may be dropped. The
/// deadline is enforced by a timer: its task must be woken and scheduled and
/// must drop the work, on a machine whose two cores also run the servers
/// under test. The keeper's own self-fencing property allows the same.
const SCHEDULING_SLACK: Duration = Duration::from_millis(250);

/// The steps in which a virtual backend clock follows real time.
const TICK: Duration = Duration::from_millis(20);

/// The longest any single step is waited for: generous, since these
/// properties are about order and exclusion, not latency.
fn patience(ttl: Duration) -> Duration {
    Duration::from_secs(10) + ttl * 4
}

/// Runs `body`; where the harness's time is virtual, moves the backend's
/// clock with real time meanwhile (the backend slightly ahead, the harsher
/// side for a holder).
pub(super) async fn on_backend_time<F: Future>(h: &dyn Harness, body: F) -> F::Output {
    let virtual_clock = virtual_time(h).await;
    tokio::pin!(body);
    loop {
        tokio::select! {
            v = &mut body => return v,
            () = sleep(TICK), if virtual_clock => h.pass(TICK).await,
        }
    }
}

/// A candidate: an election on `key` through its own keeper over `client`.
fn candidate(client: Arc<dyn LeaseBackend>, key: &lease_core::LeaseKey, ttl: Duration) -> Election {
    keeper_on(client).election(key).with_ttl(ttl)
}

/// Campaigns with `value`, insisting on leadership within `limit`.
async fn lead(e: &Election, value: &str, limit: Duration) -> Result<Leadership, Failure> {
    match timeout(limit, e.campaign(payload(value)).wait(limit)).await {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(err)) => Err(Failure(format!(
            "{} campaigning on {} with {value:?}: {err}",
            e.keeper().holder(),
            e.key()
        ))),
        Err(_) => Err(Failure(format!(
            "{} did not become leader of {} within {limit:?}",
            e.keeper().holder(),
            e.key()
        ))),
    }
}

/// A leader as a report shows it: holder, fence and value (the properties'
/// own short texts).
fn show(l: Option<&Leader>) -> String {
    match l {
        None => "no leader".into(),
        Some(l) => format!(
            "{} (fence {}, value {:?})",
            l.holder,
            l.fence,
            String::from_utf8_lossy(l.value.as_bytes())
        ),
    }
}

/// Whether `l` is a term of the candidate whose keeper's holder id is
/// `holder`, with `fence` and `value`.
fn is(l: Option<&Leader>, holder: &HolderId, fence: Fence, value: &str) -> bool {
    l.is_some_and(|l| l.holder.is_term_of(holder) && l.fence == fence && l.value == payload(value))
}

/// One edge of a leader's work on the shared timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edge {
    Start,
    End,
}

/// One mark on the timeline: when, which candidate, its fence, which edge.
type Mark = (Instant, usize, Fence, Edge);

/// The shared timeline every leader's work writes its start and end to, in
/// one total order.
#[derive(Clone, Default)]
struct Timeline(Arc<Mutex<Vec<Mark>>>);

impl Timeline {
    fn mark(&self, who: usize, fence: Fence, edge: Edge) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        t.push((Instant::now(), who, fence, edge));
    }

    fn events(&self) -> Vec<Mark> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Work that marks its start, runs for `d` and marks its end when it
    /// finishes or is dropped.
    fn work(&self, who: usize, fence: Fence, d: Duration) -> impl Future<Output = ()> {
        let timeline = self.clone();
        async move {
            timeline.mark(who, fence, Edge::Start);
            let _end = EndMark {
                timeline: timeline.clone(),
                who,
                fence,
            };
            sleep(d).await;
        }
    }
}

/// Marks a work's end when dropped: finished or cut short alike.
struct EndMark {
    timeline: Timeline,
    who: usize,
    fence: Fence,
}

impl Drop for EndMark {
    fn drop(&mut self) {
        self.timeline.mark(self.who, self.fence, Edge::End);
    }
}

/// Records the instant a future is dropped (or finishes).
struct DropStamp(Arc<Mutex<Option<Instant>>>);

impl Drop for DropStamp {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
}

fn stamp_of(s: &Arc<Mutex<Option<Instant>>>) -> Option<Instant> {
    *s.lock().unwrap_or_else(|p| p.into_inner())
}

/// N candidates on separate clients campaign on one key at once; each
/// leader runs work through `Leadership::run` that marks its start and end
/// on one shared timeline, then resigns. Every candidate leads once, the
/// work intervals never overlap, and each new leader's fence is higher than
/// the last.
pub fn election_has_one_leader_at_a_time(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("election-one-leader");
        let cs = clients(h, CANDIDATES).await?;
        let ttl = keeper_ttl(&cs[0].capabilities());
        let limit = patience(ttl) + (WORK + Duration::from_secs(1)) * CANDIDATES as u32;
        let timeline = Timeline::default();
        let go = tokio::sync::Barrier::new(CANDIDATES);
        let elections: Vec<Election> = cs.iter().map(|c| candidate(c.clone(), &key, ttl)).collect();
        let turn = |i: usize| {
            let (e, timeline, go) = (&elections[i], &timeline, &go);
            async move {
                go.wait().await;
                let l = lead(e, &format!("candidate {i}"), limit).await?;
                let fence = l.fence();
                // What the grant left of its write window when the campaign
                // returned: an acquire answered late (a server starved of
                // CPU) leaves less than the work takes.
                let left = l.deadline().saturating_duration_since(Instant::now());
                let ended = l.run(timeline.work(i, fence, WORK)).await;
                let resigned = l.resign().await;
                Ok::<_, Failure>((fence, left, ended, resigned))
            }
        };
        let (r0, r1, r2, r3) = tokio::join!(turn(0), turn(1), turn(2), turn(3));
        let results = [r0, r1, r2, r3];

        // The timeline first: it shows an overlap even when a candidate
        // failed afterwards.
        let events = timeline.events();
        let mut open: Option<(usize, Fence)> = None;
        let mut last_fence: Option<Fence> = None;
        let mut led = [0usize; CANDIDATES];
        for (at, who, fence, edge) in &events {
            let when = at.saturating_duration_since(events[0].0).as_millis();
            match (edge, open) {
                (Edge::Start, Some((other, other_fence))) => {
                    return Err(Failure(format!(
                        "candidate {who} (fence {fence}) started its work at {when} ms while \
                         candidate {other} (fence {other_fence}) was still running its own: \
                         two leaders at once"
                    )))
                }
                (Edge::Start, None) => {
                    if let Some(prev) = last_fence {
                        ensure!(
                            *fence > prev,
                            "candidate {who} led with fence {fence} after a leader with fence {prev}"
                        );
                    }
                    if let Some(n) = led.get_mut(*who) {
                        *n += 1;
                    }
                    last_fence = Some(*fence);
                    open = Some((*who, *fence));
                }
                (Edge::End, Some((o, _))) if o == *who => open = None,
                (Edge::End, _) => {
                    return Err(Failure(format!(
                        "the timeline shows candidate {who}'s work ending at {when} ms while it was not running: {events:?}"
                    )))
                }
            }
        }
        for (i, r) in results.into_iter().enumerate() {
            let (fence, left, ended, resigned) = r?;
            // A leadership won with less than the work's length left ends
            // at its deadline unless a renewal lands first: dropping the
            // work there is the keeper keeping its promise, not a failure.
            let late_grant = matches!(ended, WorkEnded::DeadlinePassed) && left < WORK;
            if late_grant {
                eprintln!(
                    "candidate {i} (fence {fence}) won with {left:?} of its write window left \
                     (the acquire was answered late) and its work was dropped at the deadline"
                );
            }
            ensure!(
                matches!(ended, WorkEnded::Finished(())) || late_grant,
                "candidate {i}'s work (fence {fence}) ended as {ended:?}, not Finished: its \
                 leadership ended within {WORK:?} of winning, with {left:?} of its write \
                 window left when it won"
            );
            resigned.map_err(|e| Failure(format!("candidate {i} could not resign: {e}")))?;
        }
        ensure!(
            led.iter().all(|n| *n == 1),
            "not every candidate led exactly once: {led:?}"
        );
        Ok(Outcome::Passed)
    }))
}

/// Waits for the observer's next change, failing after `limit` with what
/// the observer last published and what a read shows now.
async fn next_change(
    obs: &mut lease_keeper::Observer,
    watcher: &Election,
    limit: Duration,
    after: &str,
) -> Result<Option<Leader>, Failure> {
    match timeout(limit, obs.changed()).await {
        Ok(change) => Ok(change),
        Err(_) => {
            let now = match watcher.leader().await {
                Ok(l) => show(l.as_ref()),
                Err(e) => format!("an error ({e})"),
            };
            Err(Failure(format!(
                "the observer reported no change within {limit:?} after {after} (its current() \
                 shows {}; leader() shows {now})",
                show(obs.current().as_ref())
            )))
        }
    }
}

/// An observer (not a candidate, on its own client) follows one election
/// through A leading with v1, A proclaiming v2, A resigning, B leading, and
/// B's leadership expiring (its renewals cut off): it reports exactly
/// A(v1), A(v2), no leader, B, no leader, in that order, and `leader()`
/// agrees at each step. Each step is waited for before the next change is
/// made, with generous bounds: this is about order, not latency.
pub fn observers_see_every_change_in_order(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("election-observe");
        let cs = clients(h, 3).await?;
        let ttl = keeper_ttl(&cs[0].capabilities());
        let limit = patience(ttl);
        let watcher = candidate(cs[0].clone(), &key, ttl);
        let a = candidate(cs[1].clone(), &key, ttl);
        let cut = Unreachable::new(cs[2].clone());
        let b = candidate(cut.clone(), &key, ttl);
        let mut obs = watcher.observe();
        let (ha, hb) = (a.keeper().holder().clone(), b.keeper().holder().clone());

        let la = lead(&a, "a1", limit).await?;
        let fa = la.fence();
        // "No leader" before the first leader is not a change to insist on
        // (nothing observed yet looks the same).
        let mut seen = next_change(&mut obs, &watcher, limit, "A became leader").await?;
        while seen.is_none() {
            seen = next_change(&mut obs, &watcher, limit, "A became leader").await?;
        }
        ensure!(
            is(seen.as_ref(), &ha, fa, "a1"),
            "after A became leader with \"a1\" (fence {fa}) the observer reported {}",
            show(seen.as_ref())
        );
        let now = watcher.leader().await?;
        ensure!(
            is(now.as_ref(), &ha, fa, "a1"),
            "leader() shows {} while A leads with \"a1\" (fence {fa})",
            show(now.as_ref())
        );

        la.proclaim(payload("a2"))
            .await
            .map_err(|e| Failure(format!("the leader's proclaim failed: {e}")))?;
        let seen = next_change(&mut obs, &watcher, limit, "A proclaimed \"a2\"").await?;
        ensure!(
            is(seen.as_ref(), &ha, fa, "a2"),
            "after A proclaimed \"a2\" the observer reported {}",
            show(seen.as_ref())
        );

        la.resign().await?;
        let seen = next_change(&mut obs, &watcher, limit, "A resigned").await?;
        ensure!(
            seen.is_none(),
            "after A resigned the observer reported {}, not \"no leader\"",
            show(seen.as_ref())
        );
        let now = watcher.leader().await?;
        ensure!(
            now.is_none(),
            "leader() shows {} after A resigned",
            show(now.as_ref())
        );

        let lb = lead(&b, "b1", limit).await?;
        let fb = lb.fence();
        ensure!(fb > fa, "B leads with fence {fb}, not above A's {fa}");
        let seen = next_change(&mut obs, &watcher, limit, "B became leader").await?;
        ensure!(
            is(seen.as_ref(), &hb, fb, "b1"),
            "after B became leader with \"b1\" (fence {fb}) the observer reported {}",
            show(seen.as_ref())
        );

        // B's renewals stop: its grant expires on the backend.
        cut.cut();
        let expiry = limit + ttl * 2;
        let seen = next_change(&mut obs, &watcher, expiry, "B's renewals were cut off").await;
        let now = watcher.leader().await;
        let current = obs.current();
        let watched = obs.watch().borrow().clone();
        cut.restore();
        drop(lb);
        let seen = seen?;
        ensure!(
            seen.is_none(),
            "after B's leadership expired the observer reported {}, not \"no leader\"",
            show(seen.as_ref())
        );
        let now = now?;
        ensure!(
            now.is_none(),
            "leader() shows {} after B's leadership expired",
            show(now.as_ref())
        );
        ensure!(
            current.is_none() && watched.is_none(),
            "after the last change the observer's current() shows {} and its watch {}",
            show(current.as_ref()),
            show(watched.as_ref())
        );
        Ok(Outcome::Passed)
    }))
}

/// A leader's client is cut off while `run(work)` is under way: the work is
/// dropped no later than the write deadline (plus 250 ms of scheduling slack) and
/// strictly before another candidate's work starts, and `run` reports
/// `DeadlinePassed` or `Lost`.
pub fn run_while_leader_stops_by_the_deadline(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("election-run-deadline");
        let cs = clients(h, 2).await?;
        let ttl = keeper_ttl(&cs[0].capabilities());
        let limit = patience(ttl);
        let cut = Unreachable::new(cs[0].clone());
        let a = candidate(cut.clone(), &key, ttl);
        let b = candidate(cs[1].clone(), &key, ttl);

        let la = lead(&a, "a", limit).await?;
        let a_dropped = Arc::new(Mutex::new(None));
        let a_work = {
            let stamp = DropStamp(a_dropped.clone());
            async move {
                let _stamp = stamp;
                std::future::pending::<()>().await
            }
        };
        let b_started = Arc::new(Mutex::new(None));
        let cut_at = Arc::new(Mutex::new(None));
        let scenario = async {
            // Let a renewal or two through first, then cut A off.
            sleep(ttl / 2).await;
            cut.cut();
            *cut_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            let lb = lead(&b, "b", limit + ttl * 2).await?;
            let started = b_started.clone();
            let ended = lb
                .run(async move {
                    *started.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                })
                .await;
            let _ = lb.resign().await;
            Ok::<_, Failure>(ended)
        };
        let (a_ended, b_ended) = tokio::join!(timeout(limit + ttl * 2, la.run(a_work)), scenario);
        let deadline = la.deadline();
        cut.restore();
        drop(la);

        let Some(cut_at) = stamp_of(&cut_at) else {
            return Err(Failure("the scenario ended before A was cut off".into()));
        };
        let Some(dropped) = stamp_of(&a_dropped) else {
            return Err(Failure("A's work was never dropped".into()));
        };
        let a_ended = a_ended.map_err(|_| {
            Failure(format!(
                "A's run did not end within {:?} of its client being cut off",
                limit + ttl * 2
            ))
        })?;
        ensure!(
            matches!(a_ended, WorkEnded::DeadlinePassed | WorkEnded::Lost(_)),
            "A's run ended as {a_ended:?}, not DeadlinePassed or Lost"
        );
        ensure!(
            dropped >= cut_at,
            "A's work was dropped {:?} before its client was cut off",
            cut_at - dropped
        );
        let fraction = a.keeper().timing().deadline_fraction();
        ensure!(
            deadline <= cut_at + ttl.mul_f64(fraction),
            "A's write deadline lies more than {fraction:.2} TTL after the cut: it moved without an answer"
        );
        ensure!(
            dropped <= deadline + SCHEDULING_SLACK,
            "A's work was dropped {:?} after its write deadline (allowed: {SCHEDULING_SLACK:?})",
            dropped - deadline
        );
        let b_ended = b_ended?;
        ensure!(
            matches!(b_ended, WorkEnded::Finished(())),
            "B's run ended as {b_ended:?}, not Finished"
        );
        let Some(b_started) = stamp_of(&b_started) else {
            return Err(Failure("B's work never started".into()));
        };
        ensure!(
            dropped < b_started,
            "B's work started {:?} before A's was dropped",
            dropped - b_started
        );
        Ok(Outcome::Passed)
    }))
}

/// Leader A loses its leadership (its client cut off past its write
/// deadline, B wins after the expiry); A's client is restored and A
/// proclaims a new value: refused, and `leader()` still shows B with B's
/// value.
pub fn resigned_leaders_late_proclaim_is_refused(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("election-late-proclaim");
        let cs = clients(h, 3).await?;
        let ttl = keeper_ttl(&cs[0].capabilities());
        let limit = patience(ttl);
        let cut = Unreachable::new(cs[0].clone());
        let a = candidate(cut.clone(), &key, ttl);
        let b = candidate(cs[1].clone(), &key, ttl);
        let watcher = candidate(cs[2].clone(), &key, ttl);
        let hb = b.keeper().holder().clone();

        let la = lead(&a, "a1", limit).await?;
        let now = watcher.leader().await?;
        ensure!(
            is(now.as_ref(), a.keeper().holder(), la.fence(), "a1"),
            "leader() shows {} while A leads with \"a1\"",
            show(now.as_ref())
        );
        cut.cut();
        let lost = timeout(limit, la.lost()).await;
        let lb = match lost {
            Ok(_) => lead(&b, "b1", limit + ttl * 2).await,
            Err(_) => Err(Failure(format!(
                "A did not lose its leadership within {limit:?} of being cut off"
            ))),
        };
        cut.restore();
        let lb = lb?;
        let fb = lb.fence();
        let late = timeout(limit, la.proclaim(payload("a-late"))).await;
        let now = watcher.leader().await;
        let still = lb.may_write();
        drop(la);
        let _ = lb.resign().await;
        match late {
            Err(_) => {
                return Err(Failure(format!(
                    "A's late proclaim got no answer within {limit:?}"
                )))
            }
            Ok(Ok(())) => {
                return Err(Failure(
                    "A's proclaim after losing its leadership to B was accepted".into(),
                ))
            }
            Ok(Err(_)) => {}
        }
        let now = now?;
        ensure!(
            is(now.as_ref(), &hb, fb, "b1"),
            "after A's refused late proclaim leader() shows {}, not B with \"b1\" (fence {fb})",
            show(now.as_ref())
        );
        ensure!(still, "B's leadership ended around A's late proclaim");
        Ok(Outcome::Passed)
    }))
}

/// The TTL the resign property uses: long, so a wake-up by expiry would be
/// far later than a wake-up by the release.
fn long_election_ttl(caps: &Capabilities) -> Duration {
    caps.ttl
        .effective(Duration::from_secs(30))
        .unwrap_or(caps.ttl.max)
}

/// How long B waits in its campaign before A resigns.
const PRE_RESIGN: Duration = Duration::from_millis(300);

/// With a long TTL, B waiting in `campaign` gets leadership soon after
/// leader A resigns — within half the TTL, so it was woken by the resign,
/// not by an expiry — with a higher fence, and not before A resigned.
pub fn resign_wakes_the_next_candidate(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("election-resign-wakes");
        let cs = clients(h, 2).await?;
        let ttl = long_election_ttl(&cs[0].capabilities());
        let bound = ttl / 2;
        let a = candidate(cs[0].clone(), &key, ttl);
        let b = candidate(cs[1].clone(), &key, ttl);
        let la = lead(&a, "a", patience(ttl)).await?;
        let fa = la.fence();
        let resigned_at = Arc::new(Mutex::new(None));
        let waiting = async {
            let r = timeout(bound + PRE_RESIGN, b.campaign(payload("b")).wait(ttl)).await;
            (r, Instant::now())
        };
        let handover = async {
            sleep(PRE_RESIGN).await;
            *resigned_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            la.resign().await
        };
        let ((won, won_at), resigned) = tokio::join!(waiting, handover);
        resigned.map_err(|e| Failure(format!("A could not resign: {e}")))?;
        let Some(resigned_at) = stamp_of(&resigned_at) else {
            return Err(Failure("A never resigned".into()));
        };
        let lb = match won {
            Err(_) => {
                return Err(Failure(format!(
                "B was not leader within half the TTL ({bound:?}) of A's resign: not woken by it"
            )))
            }
            Ok(Err(e)) => return Err(Failure(format!("B's campaign failed: {e}"))),
            Ok(Ok(l)) => l,
        };
        let fb = lb.fence();
        let _ = lb.resign().await;
        ensure!(
            won_at >= resigned_at,
            "B became leader {:?} before A resigned",
            resigned_at - won_at
        );
        let took = won_at - resigned_at;
        ensure!(
            took < bound,
            "B became leader {took:?} after A resigned: not within half the TTL ({bound:?}), so not woken by the resign"
        );
        ensure!(fb > fa, "B leads with fence {fb}, not above A's {fa}");
        eprintln!(
            "lease-conformance: {}: the next candidate led {} ms after the resign began (watch: {})",
            h.name(),
            took.as_millis(),
            cs[0].capabilities().watch
        );
        Ok(Outcome::Passed)
    }))
}
