//! Scale: N leases in one `LeaseGroup` (1,000, 10,000 and 100,000 by
//! default), kept for a window; the client's (and the server's) CPU time
//! per second of keeping them and per renewal, the refresh schedule as it
//! really ran, renewal round trips under that load, and resident memory per
//! lease (client and server, as the growth of each process's RSS).
//!
//! The TTL grows with the count past 10,000 ([`ttl_for`]): 100,000 leases
//! on a 10 s TTL would ask ~23,500 renewals a second of one machine, so the
//! run would measure the machine's saturation rather than the backend's
//! cost; at 60 s they ask ~3,900. Costs are compared per renewal and per
//! lease, which do not depend on the TTL.
//!
//! Renew lag: the group schedules each refresh uniformly in
//! [GROUP_REFRESH_MIN, GROUP_REFRESH_MAX] × TTL after the send instant of
//! the previous one, and the random draw is not observable. What is
//! observable exactly is each renewal's interval — from the previous
//! refresh's send instant (`Grant::sent_at`) to the moment the renewal is
//! handed to the backend — recorded by a wrapper around the backend. The
//! lag at quantile p is estimated as the interval's p-quantile minus the
//! schedule's own p-quantile (a constant lag shifts every quantile by
//! itself); "late" counts renewals that started after the latest instant
//! the schedule can choose, a lower bound that needs no estimate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{BoxFuture, Error, Grant, LeaseBackend, LeaseKey, LeaseLayer, Payload, Renewal};
use lease_keeper::{Keeper, GROUP_REFRESH_MAX, GROUP_REFRESH_MIN};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::alloc;
use crate::floor::{self, Floor};
use crate::stats::{self, Latency};
use crate::sys;
use crate::targets::{Raw, Target};

/// How long a NATS run's floor (see [`floor`]) paces its bare updates.
const FLOOR_WINDOW: Duration = Duration::from_secs(10);

/// Records every renewal's interval (× TTL) and round trip while on.
struct Timed {
    inner: Arc<dyn LeaseBackend>,
    on: AtomicBool,
    samples: Mutex<Vec<(f64, Duration, bool)>>,
}

impl LeaseLayer for Timed {
    fn inner(&self) -> &dyn LeaseBackend {
        &*self.inner
    }
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let start = Instant::now();
            let interval = start.saturating_duration_since(grant.sent_at());
            let r = self.inner.renew(grant, payload).await;
            if self.on.load(Ordering::Relaxed) {
                let ok = matches!(r, Ok(Renewal::Renewed(_)));
                let frac = interval.as_secs_f64() / grant.ttl().as_secs_f64();
                self.samples
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((frac, start.elapsed(), ok));
            }
            r
        })
    }
}

/// The TTL of a scale run of `n` leases: 10 s up to 10,000 leases, then
/// one second per thousand leases, at most 60 s.
pub fn ttl_for(n: usize) -> Duration {
    Duration::from_secs((n / 1000).clamp(10, 60) as u64)
}

/// How long a scale run of `n` leases keeps them (a full run).
pub fn window_for(n: usize) -> Duration {
    Duration::from_secs(match n {
        0..=1_000 => 20,
        1_001..=10_000 => 30,
        _ => 45,
    })
}

/// Hands freed heap back to the kernel (glibc keeps it otherwise), so one
/// run's RSS growth is not hidden by the previous run's freed memory.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Scale {
    pub backend: &'static str,
    pub leases: usize,
    pub ttl_s: f64,
    pub acquire_all_s: f64,
    pub window_s: f64,
    pub renewals: usize,
    pub failed_renewals: usize,
    /// Leases lost (the group abandoned) during the window.
    pub lost: usize,
    /// Renewal intervals as fractions of the TTL (schedule: 0.30–0.55).
    pub interval_p50: f64,
    pub interval_p99: f64,
    pub interval_max: f64,
    /// Estimated lag beyond the schedule, as a fraction of the TTL.
    pub lag_p50: f64,
    pub lag_p99: f64,
    /// Renewals started after the latest scheduled instant (a lower bound).
    pub late: usize,
    pub renew_rtt: Latency,
    /// Client CPU time per second of keeping (1.0 = one core busy).
    pub client_cpu_per_s: f64,
    pub client_cpu_per_renewal_us: f64,
    pub server_cpu_per_s: Option<f64>,
    pub server_cpu_per_renewal_us: Option<f64>,
    /// Requests the backend's own counter saw during the window, per
    /// renewal (etcd: every message the server received; NATS: the lease
    /// client's JetStream requests).
    pub requests_per_renewal: Option<f64>,
    /// Of those, the keep-alives (etcd).
    pub keep_alives_per_renewal: Option<f64>,
    /// Allocations the whole client process asked of the allocator during
    /// the window, per renewal (on the fake, its in-process store's too).
    pub allocations_per_renewal: f64,
    pub client_rss_mib: f64,
    /// Growth of the client's RSS from before the first acquire to the end
    /// of the window, per lease (the bench's own samples subtracted).
    pub client_rss_per_lease_bytes: f64,
    pub server_rss_mib: Option<f64>,
    /// Growth of the server's RSS over the same span, per lease.
    pub server_rss_per_lease_bytes: Option<f64>,
    /// Growth of the client's live heap (bytes allocated and not freed, as
    /// the bench's counting allocator sees them) over the same span, per
    /// lease: what the group and the backend client keep per lease, not
    /// hidden or inflated by memory an earlier run freed.
    pub client_heap_per_lease_bytes: f64,
    /// Leases acquired (all of them unless the run gave up).
    pub acquired: usize,
    /// Why the group gave up, if it did (a lease lost: the group then
    /// releases all the others).
    pub abandoned: Option<String>,
    /// Interval quantiles 0.00, 0.01, … 1.00 (for the chart).
    pub interval_cdf: Vec<f64>,
    /// NATS: the client library's bare conditional update paced at this
    /// run's renewal rate, measured after the group released its leases.
    pub floor: Option<Result<Floor, String>>,
}

pub async fn measure(
    t: &Target,
    run: &str,
    n: usize,
    ttl: Duration,
    window: Duration,
) -> Result<Scale, String> {
    let name = t.name();
    let client = t.connect(None, &format!("{run}/scale-{n}")).await?;
    // Room for every renewal the window can start (one per 0.3 TTL at
    // most), so the vector never reallocates while memory is measured.
    let expected = (window.as_secs_f64() / (GROUP_REFRESH_MIN * ttl.as_secs_f64()) + 2.0)
        .ceil()
        .min(64.0) as usize;
    let timed = Arc::new(Timed {
        inner: client.backend.clone(),
        on: AtomicBool::new(false),
        samples: Mutex::new(Vec::with_capacity(n.saturating_mul(expected))),
    });
    let keeper = Keeper::new(timed.clone());
    let group = keeper.group();
    let pid = t.server_pid();
    trim_heap();
    let rss0 = sys::rss(None).unwrap_or(0);
    let heap0 = alloc::live();
    let srss0 = pid.and_then(|p| sys::rss(Some(p)));

    let t_acq = Instant::now();
    let mut set = JoinSet::new();
    let mut acquired = 0usize;
    let mut first_err = None;
    for i in 0..n {
        while set.len() >= 64 {
            if let Some(r) = set.join_next().await {
                tally(r, &mut acquired, &mut first_err);
            }
        }
        let g = group.clone();
        let key = LeaseKey::new(format!("{run}/scale-{n}/{i:06}")).map_err(|e| e.to_string())?;
        set.spawn(async move { g.try_acquire(&key).ttl(ttl).await });
    }
    while let Some(r) = set.join_next().await {
        tally(r, &mut acquired, &mut first_err);
    }
    let acquire_all = t_acq.elapsed();
    if acquired != n {
        // Measured, not an error: the group could not take (or keep) this
        // many leases here, and the row says why.
        let why = loss(&group).or(first_err).unwrap_or_default();
        eprintln!("lease-bench: scale {name}: only {acquired} of {n} leases acquired: {why}");
        let _ = group.release_all().await;
        return Ok(Scale::gave_up(
            name,
            n,
            ttl,
            acquire_all,
            acquired,
            format!("only {acquired} of {n} leases acquired: {why}"),
        ));
    }
    eprintln!("lease-bench: scale {name}: {n} leases acquired in {acquire_all:.1?}; keeping them {window:?}");

    let counted = || async {
        match &client.counter {
            Some(c) => (c.get().await, crate::targets::etcd_keep_alives(c).await),
            None => (None, None),
        }
    };
    let (req0, ka0) = counted().await;
    timed.on.store(true, Ordering::Relaxed);
    let (cpu0, scpu0, w0) = (sys::cpu_self(), pid.and_then(sys::cpu_of), Instant::now());
    let calls0 = alloc::calls();
    tokio::time::sleep(window).await;
    let calls1 = alloc::calls();
    let (cpu1, scpu1, wall) = (sys::cpu_self(), pid.and_then(sys::cpu_of), w0.elapsed());
    timed.on.store(false, Ordering::Relaxed);
    let (req1, ka1) = counted().await;
    let rss1 = sys::rss(None).unwrap_or(0);
    let srss = pid.and_then(|p| sys::rss(Some(p)));
    let lost = match group.check() {
        Ok(()) => 0,
        Err(a) => a.lost.len(),
    };
    let abandoned = loss(&group);
    let heap1 = alloc::live();
    let samples = std::mem::take(&mut *timed.samples.lock().unwrap_or_else(|p| p.into_inner()));
    // The touched part of the samples' vector is the bench's, not the
    // group's.
    let own = (samples.len() * std::mem::size_of::<(f64, Duration, bool)>()) as u64;
    let t_rel = Instant::now();
    let _ = group.release_all().await;
    eprintln!(
        "lease-bench: scale {name}: released in {:.1?}",
        t_rel.elapsed()
    );

    let renewals = samples.len();
    let failed = samples.iter().filter(|s| !s.2).count();
    let secs = wall.as_secs_f64();
    let floor = match &client.raw {
        Raw::Nats { kv, .. } => {
            let rate = renewals as f64 / secs;
            let f = floor::nats(kv, &format!("{run}/scale-{n}"), rate, FLOOR_WINDOW).await;
            match &f {
                Ok(f) => eprintln!(
                    "lease-bench: scale {name}: bare KV updates at {rate:.0}/s: {:.1} µs each",
                    f.cpu_per_write_us
                ),
                Err(e) => eprintln!("lease-bench: scale {name}: bare KV updates: {e}"),
            }
            Some(f)
        }
        _ => None,
    };
    let iv = stats::sorted(samples.iter().map(|s| s.0).collect());
    let rtt: Vec<Duration> = samples.iter().map(|s| s.1).collect();
    let sched = |p: f64| GROUP_REFRESH_MIN + (GROUP_REFRESH_MAX - GROUP_REFRESH_MIN) * p;
    let q = |p: f64| stats::quantile(&iv, p);
    let cpu = cpu1.saturating_sub(cpu0).as_secs_f64();
    Ok(Scale {
        backend: name,
        leases: n,
        ttl_s: ttl.as_secs_f64(),
        acquire_all_s: acquire_all.as_secs_f64(),
        window_s: secs,
        renewals,
        failed_renewals: failed,
        lost,
        interval_p50: q(0.5),
        interval_p99: q(0.99),
        interval_max: iv.last().copied().unwrap_or(f64::NAN),
        lag_p50: (q(0.5) - sched(0.5)).max(0.0),
        lag_p99: (q(0.99) - sched(0.99)).max(0.0),
        late: iv.iter().filter(|&&x| x > GROUP_REFRESH_MAX).count(),
        renew_rtt: stats::latency(&rtt),
        client_cpu_per_s: cpu / secs,
        client_cpu_per_renewal_us: if renewals > 0 {
            cpu * 1e6 / renewals as f64
        } else {
            f64::NAN
        },
        server_cpu_per_s: match (scpu0, scpu1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a).as_secs_f64() / secs),
            _ => None,
        },
        server_cpu_per_renewal_us: match (scpu0, scpu1) {
            (Some(a), Some(b)) if renewals > 0 => {
                Some(b.saturating_sub(a).as_secs_f64() * 1e6 / renewals as f64)
            }
            _ => None,
        },
        requests_per_renewal: per_renewal(req0, req1, renewals),
        keep_alives_per_renewal: per_renewal(ka0, ka1, renewals),
        allocations_per_renewal: per_renewal(Some(calls0), Some(calls1), renewals)
            .unwrap_or(f64::NAN),
        client_rss_mib: rss1 as f64 / 1048576.0,
        client_rss_per_lease_bytes: rss1.saturating_sub(rss0).saturating_sub(own) as f64
            / n.max(1) as f64,
        client_heap_per_lease_bytes: heap1.saturating_sub(heap0).saturating_sub(own) as f64
            / n.max(1) as f64,
        server_rss_mib: srss.map(|b| b as f64 / 1048576.0),
        server_rss_per_lease_bytes: match (srss0, srss) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / n.max(1) as f64),
            _ => None,
        },
        interval_cdf: (0..=100).map(|i| q(f64::from(i) / 100.0)).collect(),
        acquired: n,
        abandoned,
        floor,
    })
}

/// A counter's growth over the window, per renewal.
fn per_renewal(before: Option<u64>, after: Option<u64>, renewals: usize) -> Option<f64> {
    match (before, after) {
        (Some(a), Some(b)) if renewals > 0 => Some(b.saturating_sub(a) as f64 / renewals as f64),
        _ => None,
    }
}

/// The group's losses, if it gave up: how many, and the first few.
fn loss(group: &lease_keeper::LeaseGroup) -> Option<String> {
    let a = group.check().err()?;
    let first: Vec<String> = a
        .lost
        .iter()
        .take(2)
        .map(|(k, r)| format!("{k}: {r}"))
        .collect();
    Some(format!(
        "the group gave up after {} lease(s) were lost ({})",
        a.lost.len(),
        first.join("; ")
    ))
}

impl Scale {
    /// A run that could not acquire (or keep, while acquiring) its leases.
    fn gave_up(
        backend: &'static str,
        n: usize,
        ttl: Duration,
        acquire_all: Duration,
        acquired: usize,
        why: String,
    ) -> Scale {
        Scale {
            backend,
            leases: n,
            ttl_s: ttl.as_secs_f64(),
            acquire_all_s: acquire_all.as_secs_f64(),
            window_s: 0.0,
            renewals: 0,
            failed_renewals: 0,
            lost: n.saturating_sub(acquired),
            interval_p50: f64::NAN,
            interval_p99: f64::NAN,
            interval_max: f64::NAN,
            lag_p50: f64::NAN,
            lag_p99: f64::NAN,
            late: 0,
            renew_rtt: Latency::default(),
            client_cpu_per_s: f64::NAN,
            client_cpu_per_renewal_us: f64::NAN,
            server_cpu_per_s: None,
            server_cpu_per_renewal_us: None,
            requests_per_renewal: None,
            keep_alives_per_renewal: None,
            allocations_per_renewal: f64::NAN,
            client_rss_mib: f64::NAN,
            client_rss_per_lease_bytes: f64::NAN,
            client_heap_per_lease_bytes: f64::NAN,
            server_rss_mib: None,
            server_rss_per_lease_bytes: None,
            interval_cdf: vec![],
            floor: None,
            acquired,
            abandoned: Some(why),
        }
    }
}

fn tally(
    r: Result<Result<lease_keeper::GroupLease, lease_keeper::AcquireError>, tokio::task::JoinError>,
    acquired: &mut usize,
    first_err: &mut Option<String>,
) {
    match r {
        Ok(Ok(_)) => *acquired += 1,
        Ok(Err(lease_keeper::AcquireError::Held { .. })) => {
            first_err.get_or_insert_with(|| "a key was held by someone else".into());
        }
        Ok(Err(e)) => {
            first_err.get_or_insert_with(|| e.to_string());
        }
        Err(e) => {
            first_err.get_or_insert_with(|| e.to_string());
        }
    }
}
