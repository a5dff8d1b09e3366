//! Shared leases, exclusive leases and permits (`Keeper::acquire_shared`,
//! `acquire_exclusive`, `acquire_permit`) beside a plain `Keeper::acquire`,
//! on one backend, in one run:
//!
//! * **acquire and release** of each, interleaved iteration by iteration:
//!   latency on a direct connection, requests counted on a second
//!   connection through a [`FaultProxy`] (as [`ops`](crate::ops) counts;
//!   reads sent at once on one connection — the exclusive acquire's 32
//!   slot reads — are one exchange there, each one at a cross-check
//!   counter).
//!   Each kind has a key of its own, reused across iterations: the
//!   exclusive key never sees a shared holder, the permits (4) are all free
//!   at each acquire, and a shared acquire after the first joins the phase
//!   the previous holder left (a shared release never ends the phase — it
//!   is the other holders' — so it lives on until its TTL, as on a key
//!   read often);
//! * **exclusive after shared**: a shared holder is in, an exclusive
//!   acquire waits (its intent taken, watching the holder's slot where the
//!   backend has a watch), the holder releases; from the release's answer
//!   to the exclusive acquire's return. Beside it, measured the same way
//!   and interleaved, a plain holder's release to a waiting
//!   `Keeper::acquire`'s return — the [failover](crate::failover) handover,
//!   but from the release's answer rather than its sending, so the two
//!   start at the same instant (0 when the waiter returned first).

use std::time::{Duration, Instant};

use lease_conformance::faults::FaultProxy;
use lease_core::{LeaseBackend, LeaseKey};
use lease_keeper::Keeper;
use serde::Serialize;

use crate::measure;
use crate::ops::{Meter, OpResult, Rec};
use crate::stats::{self, Count};
use crate::targets::{Counter, Target};

/// The lease kinds, in the order of [`OPS`] (acquire, release each).
pub const KINDS: [&str; 4] = ["plain", "shared", "exclusive", "permit"];

pub const OPS: [&str; 8] = [
    "plain acquire",
    "plain release",
    "shared acquire",
    "shared release",
    "exclusive acquire",
    "exclusive release",
    "permit acquire",
    "permit release",
];

/// The permits of the semaphore measured.
pub const PERMITS: u32 = 4;

const TTL: Duration = Duration::from_secs(30);
/// The most any one acquire may wait (each should get in at once, or
/// within one handover).
const WAIT: Duration = Duration::from_secs(20);

/// A handover's times over a few iterations, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Handover {
    pub n: usize,
    pub p50_us: f64,
    pub p90_us: f64,
    pub max_us: f64,
}

fn handover(samples: &[Duration]) -> Handover {
    let us = stats::sorted(samples.iter().map(|d| d.as_secs_f64() * 1e6).collect());
    match us.last() {
        None => Handover::default(),
        Some(&max_us) => Handover {
            n: us.len(),
            p50_us: stats::quantile(&us, 0.50),
            p90_us: stats::quantile(&us, 0.90),
            max_us,
        },
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct SharedResult {
    pub backend: &'static str,
    /// The cross-check counter, where the backend has one.
    pub counter: Option<&'static str>,
    pub permits: u32,
    /// [`OPS`], each as [`ops`](crate::ops) reports an operation.
    pub ops: Vec<OpResult>,
    /// Whether waiters are woken by the backend's watch (else they poll).
    pub watch: bool,
    /// Shared holder's release answered → waiting exclusive acquire returned.
    pub exclusive_after_shared: Handover,
    /// Plain holder's release answered → waiting plain acquire returned.
    pub plain_handover: Handover,
}

impl SharedResult {
    pub fn get(&self, op: &str) -> Option<&OpResult> {
        self.ops.iter().find(|o| o.op == op)
    }

    /// What judges a request count: the independent counter where it saw
    /// the operation, else the proxy.
    pub fn requests(&self, op: &str) -> Option<Count> {
        self.get(op)
            .and_then(|o| o.counter_requests.or(o.proxy_requests))
    }
}

/// The four keys of one connection's loop.
struct Keys([LeaseKey; 4]);

impl Keys {
    fn new(run: &str, conn: &str) -> Result<Keys, String> {
        let key = |kind: &str| {
            LeaseKey::new(format!("{run}/sh/{conn}/{kind}")).map_err(|e| e.to_string())
        };
        Ok(Keys([
            key(KINDS[0])?,
            key(KINDS[1])?,
            key(KINDS[2])?,
            key(KINDS[3])?,
        ]))
    }
}

/// `iters` iterations of plain, shared, exclusive and permit acquire +
/// release on `keeper`, recorded into `recs` when `record`.
async fn run_loop(
    keeper: &Keeper,
    meter: &Meter<'_>,
    keys: &Keys,
    iters: usize,
    record: bool,
    recs: &mut [Rec],
) -> Result<(), String> {
    let b = keeper.backend().clone();
    let [plain, shared, exclusive, permit] = &keys.0;
    for _ in 0..iters {
        let mut scratch: Vec<Rec> = (0..OPS.len()).map(|_| Rec::default()).collect();
        let recs: &mut [Rec] = if record { recs } else { &mut scratch };
        // As in `ops`: the first timed call follows an untimed one on its
        // connection (a PostgreSQL session that idled pays to wake up).
        b.read(plain)
            .await
            .map_err(|e| format!("warm-up read: {e}"))?;
        let l = measure!(
            recs[0],
            meter,
            keeper.acquire(plain).ttl(TTL).wait(WAIT).await
        )
        .map_err(|e| format!("plain acquire: {e}"))?;
        measure!(recs[1], meter, l.release().await).map_err(|e| format!("plain release: {e}"))?;
        let l = measure!(
            recs[2],
            meter,
            keeper.acquire_shared(shared).ttl(TTL).wait(WAIT).await
        )
        .map_err(|e| format!("shared acquire: {e}"))?;
        measure!(recs[3], meter, l.release().await).map_err(|e| format!("shared release: {e}"))?;
        let l = measure!(
            recs[4],
            meter,
            keeper
                .acquire_exclusive(exclusive)
                .ttl(TTL)
                .wait(WAIT)
                .await
        )
        .map_err(|e| format!("exclusive acquire: {e}"))?;
        measure!(recs[5], meter, l.release().await)
            .map_err(|e| format!("exclusive release: {e}"))?;
        let l = measure!(
            recs[6],
            meter,
            keeper
                .acquire_permit(permit, PERMITS)
                .ttl(TTL)
                .wait(WAIT)
                .await
        )
        .map_err(|e| format!("permit acquire: {e}"))?;
        measure!(recs[7], meter, l.release().await).map_err(|e| format!("permit release: {e}"))?;
    }
    Ok(())
}

/// Measures one backend: `iters` timed iterations on a direct connection,
/// `count_iters` counted ones through a proxy, `handovers` handovers of
/// each kind.
pub async fn measure(
    t: &Target,
    run: &str,
    iters: usize,
    count_iters: usize,
    handovers: usize,
) -> Result<SharedResult, String> {
    let name = t.name();
    let rec = || -> Vec<Rec> { (0..OPS.len()).map(|_| Rec::default()).collect() };

    // Latency: a direct connection.
    let direct = t.connect(None, &format!("{run}/sh")).await?;
    let keeper = Keeper::new(direct.backend.clone());
    let keys = Keys::new(run, "lat")?;
    let mut lat = rec();
    run_loop(&keeper, &Meter::NONE, &keys, 1, false, &mut lat)
        .await
        .map_err(|e| format!("{name}: warm-up: {e}"))?;
    run_loop(&keeper, &Meter::NONE, &keys, iters, true, &mut lat)
        .await
        .map_err(|e| format!("{name}: {e}"))?;

    // Requests: a second connection through the counting proxy.
    let mut counted = rec();
    let mut counter_name = None;
    if let Some(upstream) = t.upstream() {
        let proxy = FaultProxy::start(upstream)
            .await
            .map_err(|e| format!("{name}: proxy: {e}"))?;
        let mut c = t.connect(Some(proxy.addr()), &format!("{run}/sh")).await?;
        let counter = c.counter.take();
        counter_name = counter.as_ref().map(Counter::what);
        let meter = Meter {
            proxy: Some(&proxy),
            counter: counter.as_ref(),
        };
        let keeper = Keeper::new(c.backend.clone());
        let keys = Keys::new(run, "cnt")?;
        run_loop(&keeper, &meter, &keys, 1, false, &mut counted)
            .await
            .map_err(|e| format!("{name}: counted warm-up: {e}"))?;
        run_loop(&keeper, &meter, &keys, count_iters, true, &mut counted)
            .await
            .map_err(|e| format!("{name}: counted: {e}"))?;
    }

    // Handovers: the holder and the waiter on clients of their own.
    let holding = Keeper::new(direct.backend.clone());
    let waiting = Keeper::new(t.connect(None, &format!("{run}/sh")).await?.backend);
    let watch = direct.backend.capabilities().watch;
    let (mut after_shared, mut plain) = (Vec::new(), Vec::new());
    for i in 0..handovers {
        // Let the waiter settle into its wait; spread the release over a
        // polling waiter's pauses.
        let settle = Duration::from_millis(200 + (i as u64 * 173) % 350);
        let key = LeaseKey::new(format!("{run}/sh/handover-{i}")).map_err(|e| e.to_string())?;
        let holder = holding
            .acquire_shared(&key)
            .ttl(TTL)
            .wait(WAIT)
            .await
            .map_err(|e| format!("{name}: shared holder: {e}"))?;
        let (w, k) = (waiting.clone(), key.clone());
        let waiter = tokio::spawn(async move {
            let r = w.acquire_exclusive(&k).ttl(TTL).wait(WAIT).await;
            (Instant::now(), r)
        });
        tokio::time::sleep(settle).await;
        if waiter.is_finished() {
            return Err(format!(
                "{name}: {key}: an exclusive acquire returned while a shared holder held"
            ));
        }
        holder
            .release()
            .await
            .map_err(|e| format!("{name}: shared release: {e}"))?;
        let t0 = Instant::now();
        let (t1, r) = waiter.await.map_err(|e| e.to_string())?;
        let lease = r.map_err(|e| format!("{name}: exclusive after shared: {e}"))?;
        after_shared.push(t1.saturating_duration_since(t0));
        let _ = lease.release().await;

        let key =
            LeaseKey::new(format!("{run}/sh/plain-handover-{i}")).map_err(|e| e.to_string())?;
        let holder = holding
            .acquire(&key)
            .ttl(TTL)
            .wait(WAIT)
            .await
            .map_err(|e| format!("{name}: plain holder: {e}"))?;
        let (w, k) = (waiting.clone(), key.clone());
        let waiter = tokio::spawn(async move {
            let r = w.acquire(&k).ttl(TTL).wait(WAIT).await;
            (Instant::now(), r)
        });
        tokio::time::sleep(settle).await;
        if waiter.is_finished() {
            return Err(format!(
                "{name}: {key}: a plain acquire returned while another holder held"
            ));
        }
        holder
            .release()
            .await
            .map_err(|e| format!("{name}: plain release: {e}"))?;
        let t0 = Instant::now();
        let (t1, r) = waiter.await.map_err(|e| e.to_string())?;
        let lease = r.map_err(|e| format!("{name}: plain waiter: {e}"))?;
        plain.push(t1.saturating_duration_since(t0));
        let _ = lease.release().await;
    }

    let ops = OPS
        .iter()
        .enumerate()
        .map(|(i, op)| OpResult {
            op,
            latency: stats::latency(&lat[i].lat),
            proxy_requests: stats::count(&counted[i].proxy),
            counter_requests: stats::count(&counted[i].counter),
        })
        .collect();
    Ok(SharedResult {
        backend: name,
        counter: counter_name,
        permits: PERMITS,
        ops,
        watch,
        exclusive_after_shared: handover(&after_shared),
        plain_handover: handover(&plain),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the fake: every operation measured, every handover made, and an
    /// exclusive waiter never granted while the shared holder holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fake_measures_every_kind() {
        let t = Target::start("fake").await.unwrap();
        let r = measure(&t, &crate::ops::run_id(), 4, 2, 2).await.unwrap();
        assert_eq!(r.ops.len(), OPS.len());
        assert!(
            r.ops
                .iter()
                .all(|o| o.latency.n == 4 && o.proxy_requests.is_none()),
            "{r:?}"
        );
        assert_eq!(
            (r.exclusive_after_shared.n, r.plain_handover.n),
            (2, 2),
            "{r:?}"
        );
        assert!(r.watch);
        let h = handover(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map(Duration::from_millis));
        assert_eq!((h.p50_us, h.p90_us, h.max_us), (5e3, 9e3, 10e3));
    }
}
