//! The fault-run driver: contenders, an injector, a clock, a history.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, Error, Grant, HolderId, LeaseBackend, LeaseKey, LeaseLayer,
    Payload, Renewal, Timing,
};

use super::{FaultHooks, FaultKind, FaultPlan, FaultProxy, Report, Rng};
use lease_keeper::{Backoff, Keeper, Lease, LeaseView, SharedLease};

use crate::history::{
    check, flagged_ops, CheckOptions, FencedResource, History, Op, OpKind, OpOutcome,
    RecordingBackend,
};
use crate::properties::{LateRelease, SlowRelease};
use crate::{Failure, Harness};

/// How the fault reaches the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing to inject, or only in the holders themselves.
    Plain,
    /// Through the harness's [`FaultHooks`].
    Hooks,
    /// Through `Harness::set_latency`.
    HarnessLatency,
    /// Through a [`FaultProxy`] in front of the server.
    Proxy(SocketAddr),
    /// On the server process.
    Server,
}

fn mode(h: &dyn Harness, hooks: Option<&dyn FaultHooks>, kind: FaultKind) -> Result<Mode, String> {
    let proxy = hooks.and_then(|k| k.upstream());
    let via_proxy = |what: &str| {
        proxy.map(Mode::Proxy).ok_or_else(|| {
            format!("{what} needs fault hooks for a proxy (FaultHooks::upstream and client_via)")
        })
    };
    match kind {
        FaultKind::None | FaultKind::PausedHolders(_) | FaultKind::DelayedReleases(_) => {
            Ok(Mode::Plain)
        }
        FaultKind::LostResponses => {
            if hooks.is_some_and(|k| k.lose_next_responses(0)) {
                Ok(Mode::Hooks)
            } else {
                via_proxy("losing responses")
            }
        }
        FaultKind::FailedRequests => {
            if hooks.is_some_and(|k| k.fail_next(0)) {
                Ok(Mode::Hooks)
            } else {
                Err("failing requests needs FaultHooks::fail_next".into())
            }
        }
        FaultKind::Latency(_) => {
            if h.set_latency(Duration::ZERO) {
                Ok(Mode::HarnessLatency)
            } else {
                via_proxy("latency")
            }
        }
        FaultKind::ClockJumps { .. } => {
            if hooks.is_some_and(|k| k.jump_clock(Duration::ZERO, true)) {
                Ok(Mode::Hooks)
            } else {
                Err(
                    "clock jumps need a backend clock the test controls (FaultHooks::jump_clock)"
                        .into(),
                )
            }
        }
        FaultKind::Sever => via_proxy("severing connections"),
        FaultKind::Blackhole(_) => via_proxy("a blackhole"),
        FaultKind::ServerPause(_) => match hooks.and_then(|k| k.server()) {
            Some(_) => Ok(Mode::Server),
            None => Err("pausing the server needs FaultHooks::server".into()),
        },
        FaultKind::ServerRestart => match hooks.and_then(|k| k.server()) {
            Some(s) if s.durable() => Ok(Mode::Server),
            Some(_) => Err("the server is not durable: a restart loses every lease".into()),
            None => Err("restarting the server needs FaultHooks::server".into()),
        },
    }
}

/// Runs `plan` on `harness` and checks the history: `Ok` with the report
/// when it is safe (or the fault is not applicable — see
/// the `not_applicable` field of [`Report`]), `Err` naming every violation otherwise.
pub async fn run(harness: &dyn Harness, plan: &FaultPlan) -> Result<Report, Failure> {
    run_unchecked(harness, plan).await?.into_result()
}

/// Like [`run`], but returns the report whatever the checker found (for
/// tests that expect violations); `Err` only when the run could not be set up.
pub async fn run_unchecked(harness: &dyn Harness, plan: &FaultPlan) -> Result<Report, Failure> {
    let started = Instant::now();
    let backend = harness.name();
    let hooks = harness.fault_hooks();
    let mode = match mode(harness, hooks, plan.kind) {
        Ok(m) => m,
        Err(reason) => return Ok(Report::inapplicable(backend, plan.kind, reason)),
    };
    let injected = Arc::new(AtomicU64::new(0));

    let proxy = match mode {
        Mode::Proxy(upstream) => Some(
            FaultProxy::start(upstream)
                .await
                .map_err(|e| Failure(format!("cannot start the fault proxy: {e}")))?,
        ),
        _ => None,
    };
    let pause = match plan.kind {
        FaultKind::PausedHolders(d) => Some(d),
        _ => None,
    };
    let mut rng = Rng::new(plan.seed);
    let mut clients: Vec<Arc<dyn LeaseBackend>> = Vec::new();
    for _ in 0..plan.contenders.max(1) + plan.elections + plan.shared + plan.permits {
        let client = match (&proxy, hooks) {
            (Some(p), Some(k)) => match k.client_via(p.addr()) {
                Some(make) => make.await?,
                None => {
                    return Ok(Report::inapplicable(
                        backend,
                        plan.kind,
                        "the harness gives an upstream but no client_via",
                    ))
                }
            },
            _ => harness.client().await?,
        };
        let client: Arc<dyn LeaseBackend> = match pause {
            Some(d) => Arc::new(Pausing {
                inner: client,
                pause: d,
                chance: 0.03,
                rng: Mutex::new(Rng::new(rng.next_u64())),
                injected: injected.clone(),
            }),
            None => client,
        };
        clients.push(client);
    }
    let ttl = clients[0].capabilities().ttl.effective(plan.ttl)?;
    let exclusive_windows = match plan.kind {
        FaultKind::ClockJumps { forward, .. } => {
            forward <= ttl.mul_f64(1.0 - Timing::default().deadline_fraction())
        }
        _ => true,
    };

    let history = History::new();
    let resource = Arc::new(match (&plan.real_resource, plan.fenced_resource) {
        (Some(real), _) => FencedResource::real(history.clone(), real.clone()),
        (None, true) => FencedResource::new(history.clone()),
        (None, false) => FencedResource::unfenced(history.clone()),
    });
    let run_id = HolderId::random().as_str()[..10].to_string();
    let mut keys = Vec::new();
    for j in 0..plan.keys.max(1) {
        keys.push(LeaseKey::new(format!(
            "faults/{}/{run_id}/k{j}",
            plan.kind.name()
        ))?);
    }
    let end = Instant::now() + plan.duration;
    let cx = Arc::new(RunCtx {
        history: history.clone(),
        resource,
        ttl,
        op_timeout: plan.op_timeout.unwrap_or(ttl + pause.unwrap_or_default()),
        end,
        keys,
        pause,
        delayed_releases: match plan.kind {
            FaultKind::DelayedReleases(d) => Some(d),
            _ => None,
        },
        injected: injected.clone(),
    });

    let mut set = tokio::task::JoinSet::new();
    let permit_holders = clients.split_off(clients.len() - plan.permits);
    let shared_holders = clients.split_off(clients.len() - plan.shared);
    let candidates = clients.split_off(plan.contenders.max(1));
    let election_key = LeaseKey::new(format!("faults/{}/{run_id}/election", plan.kind.name()))?;
    for (i, client) in candidates.into_iter().enumerate() {
        let holder = HolderId::new(format!("e{i}-{run_id}")).unwrap_or_else(|_| HolderId::random());
        set.spawn(candidate(
            holder,
            client,
            cx.clone(),
            election_key.clone(),
            Rng::new(rng.next_u64()),
        ));
    }
    let rw_key = LeaseKey::new(format!("faults/{}/{run_id}/rw", plan.kind.name()))?;
    for (i, client) in shared_holders.into_iter().enumerate() {
        let holder = HolderId::new(format!("s{i}-{run_id}")).unwrap_or_else(|_| HolderId::random());
        set.spawn(slot_holder(
            holder,
            client,
            cx.clone(),
            rw_key.clone(),
            Side::SharedOrExclusive,
            Rng::new(rng.next_u64()),
        ));
    }
    let permit_key = LeaseKey::new(format!("faults/{}/{run_id}/permits", plan.kind.name()))?;
    for (i, client) in permit_holders.into_iter().enumerate() {
        let holder = HolderId::new(format!("p{i}-{run_id}")).unwrap_or_else(|_| HolderId::random());
        set.spawn(slot_holder(
            holder,
            client,
            cx.clone(),
            permit_key.clone(),
            Side::Permit(2),
            Rng::new(rng.next_u64()),
        ));
    }
    for (i, client) in clients.into_iter().enumerate() {
        set.spawn(contender(
            format!("c{i}-{run_id}"),
            client,
            cx.clone(),
            Rng::new(rng.next_u64()),
        ));
    }

    let done = AtomicBool::new(false);
    let ticker = async {
        // A backend clock that only moves when told follows real time.
        if !hooks.is_some_and(|k| k.advance_clock(Duration::ZERO)) {
            return;
        }
        let mut last = Instant::now();
        while !done.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let now = Instant::now();
            if let Some(k) = hooks {
                k.advance_clock(now - last);
            }
            last = now;
        }
    };
    let injector = inject(
        harness,
        hooks,
        proxy.as_ref(),
        plan.kind,
        ttl,
        end,
        Rng::new(rng.next_u64()),
        &injected,
    );
    let waiter = async {
        let mut panics = Vec::new();
        while let Some(r) = set.join_next().await {
            if let Err(e) = r {
                panics.push(e.to_string());
            }
        }
        done.store(true, Ordering::Relaxed);
        panics
    };
    let ((), injector_errors, panics) = tokio::join!(ticker, injector, waiter);
    if mode == Mode::HarnessLatency {
        harness.set_latency(Duration::ZERO);
    }
    if !panics.is_empty() {
        return Err(Failure(format!("contender tasks panicked: {panics:?}")));
    }
    if !injector_errors.is_empty() {
        return Err(Failure(format!(
            "the fault could not be injected: {}",
            injector_errors.join("; ")
        )));
    }

    let opts = CheckOptions {
        exclusive_windows,
        ..CheckOptions::for_ttl(ttl)
    };
    let ops = history.ops();
    let check = check(&ops, &opts);
    // A violation seen once on a loaded machine is read from these lines.
    for line in flagged_ops(&ops, &check) {
        eprintln!("{line}");
    }
    Ok(Report {
        backend,
        kind: plan.kind,
        not_applicable: None,
        ttl,
        elapsed: started.elapsed(),
        faults_injected: injected.load(Ordering::Relaxed),
        counts: history.counts().into_iter().collect(),
        check,
        exclusive_windows,
        proxy: proxy.as_ref().map(|p| p.stats()),
    })
}

struct RunCtx {
    history: History,
    resource: Arc<FencedResource>,
    ttl: Duration,
    op_timeout: Duration,
    end: Instant,
    keys: Vec<LeaseKey>,
    pause: Option<Duration>,
    /// How long the candidates' and contenders' releases take to reach
    /// the backend ([`FaultKind::DelayedReleases`]).
    delayed_releases: Option<Duration>,
    injected: Arc<AtomicU64>,
}

impl RunCtx {
    /// A paused holder: with some chance, the holder's task freezes.
    async fn maybe_freeze(&self, rng: &mut Rng, chance: f64) {
        if let Some(d) = self.pause {
            if rng.chance(chance) {
                self.injected.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(d).await;
            }
        }
    }
}

/// One holder: acquire, write while `may_write()`, renew, sometimes
/// release; an acquire with unknown outcome is retried under the same
/// holder id.
///
/// Each term (from the acquire that is granted to the grant's end: a
/// release, a loss, or its deadline after renewals with unknown outcome)
/// has a holder id of its own, `{name}-t{n}`, as a keeper gives each term
/// its own: a release whose outcome is unknown may still reach the backend
/// later, and a re-acquire under the same id would get the same grant back
/// (the contract's answer to a holder whose grant is live) only for the late
/// release to free the key under it. Acquires are retried under the term's
/// id until one is granted (the retry of an acquire with unknown outcome
/// must be able to take back a grant whose answer was lost).
///
/// Under [`FaultKind::DelayedReleases`] every release but the last times
/// out at once (outcome unknown) and reaches the backend that long later.
async fn contender(name: String, client: Arc<dyn LeaseBackend>, cx: Arc<RunCtx>, mut rng: Rng) {
    let t = cx.ttl;
    let h = &cx.history;
    let c = &*client;
    let late: Option<Arc<dyn LeaseBackend>> = cx
        .delayed_releases
        .map(|d| -> Arc<dyn LeaseBackend> { LateRelease::new(client.clone(), d) });
    let term_id =
        |n: u64| HolderId::new(format!("{name}-t{n}")).unwrap_or_else(|_| HolderId::random());
    let mut term = 0u64;
    let mut holder = term_id(term);
    // Whether the current term was granted: the next acquire is a new term.
    let mut granted = false;
    let mut grant: Option<Grant> = None;
    let mut renew_at = Instant::now();
    let mut terms_left = 0usize;
    let mut polls = 0u64;
    while Instant::now() < cx.end {
        let Some(g) = grant.take() else {
            if granted {
                granted = false;
                term += 1;
                holder = term_id(term);
            }
            let key = cx.keys[rng.below(cx.keys.len())].clone();
            polls += 1;
            if polls.is_multiple_of(3) {
                let _ = h.read(c, holder.as_str(), &key, cx.op_timeout).await;
            }
            let req = AcquireRequest::new(key, holder.clone()).ttl(t);
            match h.acquire(c, req, cx.op_timeout).await {
                Ok(Acquire::Granted(g)) => {
                    renew_at =
                        g.sent_at() + g.timing().jittered_renew_interval(g.ttl(), rng.unit());
                    terms_left = 1 + rng.below(4);
                    granted = true;
                    grant = Some(g);
                }
                // The retry (same holder id) comes soon.
                Err(e) if e.is_unknown_outcome() => {
                    tokio::time::sleep(rng.around(t, 0.01, 0.05)).await
                }
                Ok(Acquire::Held(_)) | Err(_) => {
                    tokio::time::sleep(rng.around(t, 0.05, 0.15)).await
                }
            }
            continue;
        };
        cx.maybe_freeze(&mut rng, 0.02).await;
        let checked = Instant::now();
        if g.may_write() {
            // The race no lease closes: frozen between the check and the write.
            cx.maybe_freeze(&mut rng, 0.02).await;
            cx.resource.write(&g, checked).await;
        }
        if Instant::now() >= renew_at || !g.may_write() {
            if terms_left == 0 && g.may_write() {
                let via = match &late {
                    Some(l) => {
                        cx.injected.fetch_add(1, Ordering::Relaxed);
                        &**l
                    }
                    None => c,
                };
                let _ = h.release(via, &g, cx.op_timeout).await;
                tokio::time::sleep(rng.around(t, 0.2, 0.5)).await;
                continue;
            }
            match h.renew(c, &g, cx.op_timeout).await {
                Ok(Renewal::Renewed(g2)) => {
                    renew_at =
                        g2.sent_at() + g2.timing().jittered_renew_interval(g2.ttl(), rng.unit());
                    terms_left = terms_left.saturating_sub(1);
                    grant = Some(g2);
                }
                Ok(Renewal::Lost) => {}
                Err(_) => {
                    // Unknown: keep writing until the deadline, then act as
                    // lost (the next acquire is the retry).
                    if g.may_write() {
                        renew_at = Instant::now() + t / 20;
                        grant = Some(g);
                    }
                }
            }
        } else {
            grant = Some(g);
        }
        if grant.is_some() {
            tokio::time::sleep(rng.around(t, 0.04, 0.08)).await;
        }
    }
    if let Some(g) = grant {
        let _ = h.release(c, &g, cx.op_timeout).await;
    }
}

/// An election candidate: campaigns through a keeper whose every call is
/// recorded, runs work while leading (writing to the resource while it may)
/// for one to four TTLs, resigns, and campaigns again until the run ends.
/// Each work interval is recorded as an [`OpKind::Work`] operation.
async fn candidate(
    holder: HolderId,
    client: Arc<dyn LeaseBackend>,
    cx: Arc<RunCtx>,
    key: LeaseKey,
    mut rng: Rng,
) {
    let t = cx.ttl;
    let recorded: Arc<dyn LeaseBackend> = Arc::new(RecordingBackend::new(
        client,
        cx.history.clone(),
        cx.op_timeout,
    ));
    // A delayed release is recorded when it reaches the backend.
    let recorded: Arc<dyn LeaseBackend> = match cx.delayed_releases {
        Some(d) => SlowRelease::new(recorded, d),
        None => recorded,
    };
    let keeper = Keeper::new(recorded)
        .with_holder(holder)
        .with_backoff(Backoff::default().first_pause(t / 20).longest_pause(t / 2));
    let election = keeper.election(&key).with_ttl(t);
    while Instant::now() < cx.end {
        // The wait reaches past the end of the run: a campaign cut off at
        // the end would drop its acquire in flight (an unknown outcome in a
        // run without faults). At the end the leader resigns, so a waiting
        // campaign is granted soon after, and its work ends at once.
        let left = cx.end.saturating_duration_since(Instant::now()) + cx.op_timeout;
        let leadership = match election.campaign(Payload::empty()).wait(left).await {
            Ok(l) => l,
            Err(_) => {
                tokio::time::sleep(rng.around(t, 0.05, 0.15)).await;
                continue;
            }
        };
        // Under delayed releases, short terms: every dropped leadership is
        // one chance for a late release to meet the next term.
        let term = if cx.delayed_releases.is_some() {
            rng.around(t, 0.3, 1.0)
        } else {
            rng.around(t, 1.0, 4.0)
        };
        let mut pace = Rng::new(rng.next_u64());
        let mark = WorkMark {
            history: cx.history.clone(),
            holder: leadership.holder().to_string(),
            key: key.to_string(),
            fence: leadership.fence().0,
            started: None,
        };
        let (cx2, l) = (cx.clone(), &leadership);
        let work = async move {
            let mut mark = mark;
            let began = Instant::now();
            mark.started = Some(began);
            while began.elapsed() < term && Instant::now() < cx2.end {
                let checked = Instant::now();
                if l.may_write() {
                    cx2.resource.write(&l.grant(), checked).await;
                }
                tokio::time::sleep(pace.around(cx2.ttl, 0.04, 0.08)).await;
            }
        };
        let _ = leadership.run(work).await;
        if cx.delayed_releases.is_some() && Instant::now() < cx.end {
            // Dropped: its release goes out in the background, and is on
            // its way while this keeper campaigns again at once.
            cx.injected.fetch_add(1, Ordering::Relaxed);
            drop(leadership);
            continue;
        }
        let _ = tokio::time::timeout(cx.op_timeout, leadership.resign()).await;
        tokio::time::sleep(rng.around(t, 0.1, 0.3)).await;
    }
}

/// What a [`slot_holder`] takes.
#[derive(Clone, Copy)]
enum Side {
    /// The key shared, or one time in three exclusively.
    SharedOrExclusive,
    /// One of this many permits.
    Permit(u32),
}

/// A lease a [`slot_holder`] holds: a shared one, or a plain one (an
/// exclusive lease or a permit).
enum SlotLease {
    Shared(SharedLease),
    Plain(Lease),
}

impl SlotLease {
    fn view(&self) -> &LeaseView {
        match self {
            SlotLease::Shared(l) => l,
            SlotLease::Plain(l) => l,
        }
    }

    fn may_write(&self) -> bool {
        match self {
            SlotLease::Shared(l) => l.may_write(),
            SlotLease::Plain(l) => l.may_write(),
        }
    }

    /// Who the history knows the grant by: the shared holder id for a
    /// shared phase (whose grant its holders share), else the term.
    fn holder(&self) -> String {
        match self {
            SlotLease::Shared(_) => lease_keeper::SHARED_HOLDER.to_string(),
            SlotLease::Plain(l) => l.holder().to_string(),
        }
    }

    async fn release(self) -> Result<(), Error> {
        match self {
            SlotLease::Shared(l) => l.release().await,
            SlotLease::Plain(l) => l.release().await,
        }
    }
}

/// A holder of shared and exclusive leases or of permits: through a keeper
/// whose every call is recorded, it takes `key` as `side` says, runs work
/// (writing to the resource while it may) for a quarter to one TTL, leaves,
/// and comes back until the run ends. Each work interval is recorded as an
/// [`OpKind::Work`] operation under the grant it ran under: a shared
/// phase's (shared holders' work may overlap: one grant), an exclusive
/// grant's or a permit's slot grant's (which may overlap no other work on
/// its key).
async fn slot_holder(
    holder: HolderId,
    client: Arc<dyn LeaseBackend>,
    cx: Arc<RunCtx>,
    key: LeaseKey,
    side: Side,
    mut rng: Rng,
) {
    let t = cx.ttl;
    let recorded: Arc<dyn LeaseBackend> = Arc::new(RecordingBackend::new(
        client,
        cx.history.clone(),
        cx.op_timeout,
    ));
    let keeper = Keeper::new(recorded)
        .with_holder(holder)
        .with_ttl(t)
        .with_backoff(Backoff::default().first_pause(t / 20).longest_pause(t / 2));
    while Instant::now() < cx.end {
        let left = cx.end.saturating_duration_since(Instant::now()) + cx.op_timeout;
        let taken = match side {
            Side::SharedOrExclusive if rng.chance(1.0 / 3.0) => keeper
                .acquire_exclusive(&key)
                .wait(left)
                .await
                .map(SlotLease::Plain),
            Side::SharedOrExclusive => keeper
                .acquire_shared(&key)
                .wait(left)
                .await
                .map(SlotLease::Shared),
            Side::Permit(n) => keeper
                .acquire_permit(&key, n)
                .wait(left)
                .await
                .map(SlotLease::Plain),
        };
        let lease = match taken {
            Ok(l) => l,
            Err(_) => {
                tokio::time::sleep(rng.around(t, 0.05, 0.15)).await;
                continue;
            }
        };
        let term = rng.around(t, 0.25, 1.0);
        let mut pace = Rng::new(rng.next_u64());
        let mut mark = WorkMark {
            history: cx.history.clone(),
            holder: lease.holder(),
            key: lease.view().key().to_string(),
            fence: lease.view().fence().0,
            started: None,
        };
        let began = Instant::now();
        // A grant answered after its deadline (a paused holder) is never
        // written under: no work starts.
        if lease.may_write() {
            mark.started = Some(began);
        }
        // The work ends when the lease stops being writable (its deadline
        // or a loss), as a leader's work under `Leadership::run` does: not
        // at the next look between writes.
        let mut writable = lease.view().writable();
        let work = async {
            while began.elapsed() < term && Instant::now() < cx.end {
                let checked = Instant::now();
                if lease.may_write() {
                    cx.resource.write(&lease.view().grant(), checked).await;
                }
                tokio::time::sleep(pace.around(t, 0.04, 0.08)).await;
            }
        };
        tokio::select! {
            () = work => {}
            _ = writable.wait_for(|w| !*w) => {}
        }
        drop(mark);
        let _ = tokio::time::timeout(cx.op_timeout, lease.release()).await;
        tokio::time::sleep(rng.around(t, 0.1, 0.3)).await;
    }
}

/// Records a leader's work as an [`OpKind::Work`] operation when the work
/// returns or is dropped — if it ever started.
struct WorkMark {
    history: History,
    holder: String,
    key: String,
    fence: u64,
    started: Option<Instant>,
}

impl Drop for WorkMark {
    fn drop(&mut self) {
        if let Some(started) = self.started {
            self.history.push(
                Op::new(
                    OpKind::Work,
                    self.holder.clone(),
                    self.key.clone(),
                    started,
                    Instant::now(),
                    OpOutcome::Ok,
                )
                .fence(self.fence),
            );
        }
    }
}

/// Sleeps `d` unless `end` comes first; returns whether `end` is still ahead.
async fn nap(d: Duration, end: Instant) -> bool {
    let now = Instant::now();
    if now + d >= end {
        tokio::time::sleep(end.saturating_duration_since(now)).await;
        return false;
    }
    tokio::time::sleep(d).await;
    true
}

/// Applies the fault until `end`, then heals it. Returns the errors of
/// injections that failed (a run whose fault was not injected proves nothing).
#[allow(clippy::too_many_arguments)]
async fn inject(
    harness: &dyn Harness,
    hooks: Option<&dyn FaultHooks>,
    proxy: Option<&FaultProxy>,
    kind: FaultKind,
    ttl: Duration,
    end: Instant,
    mut rng: Rng,
    injected: &AtomicU64,
) -> Vec<String> {
    let mut errors = Vec::new();
    let count = || {
        injected.fetch_add(1, Ordering::Relaxed);
    };
    match kind {
        // Injected in the holders themselves.
        FaultKind::None | FaultKind::PausedHolders(_) | FaultKind::DelayedReleases(_) => {}
        FaultKind::Latency(d) => {
            match proxy {
                Some(p) => p.set_latency(d),
                None => {
                    harness.set_latency(d);
                }
            }
            count();
            nap(end.saturating_duration_since(Instant::now()), end).await;
            match proxy {
                Some(p) => p.set_latency(Duration::ZERO),
                None => {
                    harness.set_latency(Duration::ZERO);
                }
            }
        }
        FaultKind::LostResponses => {
            while nap(rng.around(ttl, 0.15, 0.35), end).await {
                match (proxy, hooks) {
                    (Some(p), _) => p.drop_responses(1),
                    (None, Some(k)) => {
                        k.lose_next_responses(1);
                    }
                    (None, None) => {}
                }
                count();
            }
            if let Some(p) = proxy {
                p.drop_responses(0);
            }
        }
        FaultKind::FailedRequests => {
            while nap(rng.around(ttl, 0.15, 0.35), end).await {
                if let Some(k) = hooks {
                    k.fail_next(1 + rng.below(2) as u32);
                }
                count();
            }
        }
        FaultKind::ClockJumps { forward, backward } => {
            let Some(k) = hooks else { return errors };
            let mut ahead = true;
            while nap(rng.around(ttl, 0.4, 0.9), end).await {
                k.jump_clock(if ahead { forward } else { backward }, ahead);
                ahead = !ahead;
                count();
            }
        }
        FaultKind::Sever => {
            if let Some(p) = proxy {
                while nap(rng.around(ttl, 0.3, 0.7), end).await {
                    // Wait (a little) for the next request to leave, then
                    // cut: a sever at a random instant almost always finds
                    // only idle connections (etcd, NATS, Mongo keep theirs
                    // open between requests), which the client re-opens
                    // without any operation seeing an unknown outcome. Woken
                    // as the request is forwarded, the sever lands before a
                    // loopback server answers, so the client sees its
                    // connection close mid-request; the server may or may
                    // not have applied it. A request that leaves, not "some
                    // connection awaits an answer": on etcd and Mongo 1-5
                    // connections await an answer at any instant (long-lived
                    // streams and server-held polls, presumably), so that
                    // wait returns at once; one run each measured 2 unknown
                    // outcomes on etcd that way against 11 this way.
                    // This subsumes waiting for a live connection on servers
                    // that close each one after its answer (moto speaks
                    // HTTP/1.0). No request within the wait: sever anyway
                    // (idle connections still go).
                    let give_up = (ttl / 4).min(end.saturating_duration_since(Instant::now()));
                    let _ = tokio::time::timeout(give_up, p.request_forwarded()).await;
                    p.sever();
                    count();
                }
            }
        }
        FaultKind::Blackhole(d) => {
            if let Some(p) = proxy {
                while nap(rng.around(ttl, 0.5, 1.5), end).await {
                    p.blackhole(true);
                    count();
                    tokio::time::sleep(d).await;
                    p.blackhole(false);
                }
                p.heal();
            }
        }
        FaultKind::ServerPause(d) => {
            let Some(s) = hooks.and_then(|k| k.server()) else {
                return errors;
            };
            while nap(rng.around(ttl, 1.0, 2.0), end).await {
                if let Err(e) = s.pause() {
                    errors.push(format!("pause: {e}"));
                    break;
                }
                // Thaws the server even if this run is dropped mid-pause
                // (a timeout around it): a frozen shared server would break
                // every later test.
                let guard = Thaw(s);
                count();
                tokio::time::sleep(d).await;
                std::mem::forget(guard);
                if let Err(e) = s.resume() {
                    errors.push(format!("resume: {e}"));
                    break;
                }
            }
        }
        FaultKind::ServerRestart => {
            let Some(s) = hooks.and_then(|k| k.server()) else {
                return errors;
            };
            while nap(rng.around(ttl, 1.5, 3.0), end).await {
                if let Err(e) = s.kill() {
                    errors.push(format!("kill: {e}"));
                    break;
                }
                count();
                tokio::time::sleep(ttl / 10).await;
                let restarted = match tokio::runtime::Handle::current().runtime_flavor() {
                    tokio::runtime::RuntimeFlavor::MultiThread => {
                        tokio::task::block_in_place(|| s.restart())
                    }
                    _ => s.restart(),
                };
                if let Err(e) = restarted {
                    errors.push(format!("restart: {e}"));
                    break;
                }
            }
        }
    }
    errors
}

/// Resumes a paused server when dropped.
struct Thaw<'a>(&'a dyn super::ServerControl);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        let _ = self.0.resume();
    }
}

/// A client whose holder task sometimes freezes after the backend answered
/// and before the answer is acted on (a GC pause, a stopped VM): the answer
/// arrives `pause` late.
struct Pausing {
    inner: Arc<dyn LeaseBackend>,
    pause: Duration,
    chance: f64,
    rng: Mutex<Rng>,
    injected: Arc<AtomicU64>,
}

impl Pausing {
    async fn maybe_pause(&self) {
        let freeze = self
            .rng
            .lock()
            .map(|mut r| r.chance(self.chance))
            .unwrap_or(false);
        if freeze {
            self.injected.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(self.pause).await;
        }
    }
}

impl LeaseLayer for Pausing {
    fn inner(&self) -> &dyn LeaseBackend {
        &*self.inner
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            let r = self.inner.try_acquire(req).await;
            self.maybe_pause().await;
            r
        })
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let r = self.inner.renew(grant, payload).await;
            self.maybe_pause().await;
            r
        })
    }
}
