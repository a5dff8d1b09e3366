//! Acquire, a refused try-acquire (a rival holder meeting the fresh grant),
//! renew, read and release on one backend, beside the raw baseline, with latency measured on a direct connection and requests
//! counted on a second connection through a [`FaultProxy`].
//!
//! What the proxy counts ([`ProxyStats::requests`](lease_conformance::faults::ProxyStats)):
//! client → server bursts that start a new exchange — the first bytes a
//! client sends on a connection, or the first after the server last sent
//! bytes back. That is one per request/response round trip on HTTP/1 (S3),
//! the NATS protocol (a JetStream request: PUB, answered by a MSG) and the
//! MongoDB wire protocol (one OP_MSG each way); on etcd's gRPC over HTTP/2,
//! a message on an open stream (a keep-alive) counts as well, and so would
//! HTTP/2 housekeeping (window updates, pings) — hence the medians, and a
//! second counter where the backend has one.

use std::time::Duration;

use lease_conformance::faults::FaultProxy;
use lease_core::{Acquire, AcquireRequest, Grant, HolderId, LeaseBackend, LeaseKey, Renewal};
use serde::Serialize;

use crate::stats::{self, Count, Latency};
use crate::targets::{Client, Counter, Target};

pub const OPS: [&str; 8] = [
    "acquire",
    "refused try-acquire",
    "renew",
    "read",
    "release",
    "raw write",
    "raw read",
    READ_CALL,
];

/// PostgreSQL: the read's function called on the raw baseline's session.
pub const READ_CALL: &str = "read's call on the raw session";

/// Operations of the lease client (the rest of [`OPS`] are the raw baseline).
pub const LEASE_OPS: usize = 5;

#[derive(Clone, Debug, Serialize)]
pub struct OpResult {
    pub op: &'static str,
    pub latency: Latency,
    /// Requests at the proxy per operation (None on the fake).
    pub proxy_requests: Option<Count>,
    /// The second counter per operation, where there is one.
    pub counter_requests: Option<Count>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BackendOps {
    pub backend: &'static str,
    pub raw_write: &'static str,
    pub raw_read: &'static str,
    pub counter: Option<&'static str>,
    pub ops: Vec<OpResult>,
}

impl BackendOps {
    pub fn get(&self, op: &str) -> Option<&OpResult> {
        self.ops.iter().find(|o| o.op == op)
    }
}

/// Where a measured loop reads its counters.
pub struct Meter<'a> {
    pub proxy: Option<&'a FaultProxy>,
    pub counter: Option<&'a Counter>,
}

#[derive(Clone, Copy)]
pub struct Snap(Option<u64>, Option<u64>);

impl Meter<'_> {
    pub const NONE: Meter<'static> = Meter {
        proxy: None,
        counter: None,
    };

    pub async fn snap(&self) -> Snap {
        let p = self.proxy.map(|p| p.stats().requests);
        let c = match self.counter {
            Some(c) => c.get().await,
            None => None,
        };
        Snap(p, c)
    }
}

/// Samples of one operation.
#[derive(Default)]
pub struct Rec {
    pub lat: Vec<Duration>,
    pub proxy: Vec<u64>,
    pub counter: Vec<u64>,
}

impl Rec {
    pub fn push(&mut self, t: Duration, a: Snap, b: Snap) {
        self.lat.push(t);
        if let (Some(x), Some(y)) = (a.0, b.0) {
            self.proxy.push(y.saturating_sub(x));
        }
        if let (Some(x), Some(y)) = (a.1, b.1) {
            self.counter.push(y.saturating_sub(x));
        }
    }
}

/// Times `$e` into `$rec`, with counter snapshots around it when the meter has any.
#[macro_export]
macro_rules! measure {
    ($rec:expr, $meter:expr, $e:expr) => {{
        let s0 = $meter.snap().await;
        let t = ::std::time::Instant::now();
        let r = $e;
        let el = t.elapsed();
        let s1 = $meter.snap().await;
        $rec.push(el, s0, s1);
        r
    }};
}

struct Loop {
    recs: Vec<Rec>,
}

async fn run_loop(
    c: &mut Client,
    meter: &Meter<'_>,
    key: &LeaseKey,
    holder: &HolderId,
    iters: usize,
    record: bool,
    out: &mut Loop,
) -> Result<(), String> {
    let b = c.backend.clone();
    // A contender: its try-acquire meets the holder's fresh grant.
    let rival = HolderId::random();
    for _ in 0..iters {
        let mut scratch: Vec<Rec> = (0..OPS.len()).map(|_| Rec::default()).collect();
        let recs = if record { &mut out.recs } else { &mut scratch };
        // Every timed call follows an untimed one on its own connection, as
        // renew, read and release follow acquire. A session that idled
        // first pays for waking up (PostgreSQL: its server process, about
        // as much again as the raw write itself on a busy machine), which
        // would otherwise land on acquire and on the raw write alone.
        b.read(key)
            .await
            .map_err(|e| format!("warm-up read: {e}"))?;
        let req = AcquireRequest::new(key.clone(), holder.clone()).ttl(Duration::from_secs(30));
        let g: Grant = match measure!(recs[0], meter, b.try_acquire(req).await) {
            Ok(Acquire::Granted(g)) => g,
            Ok(Acquire::Held(h)) => return Err(format!("{key} unexpectedly held by {}", h.holder)),
            Err(e) => return Err(format!("acquire: {e}")),
        };
        let req = AcquireRequest::new(key.clone(), rival.clone()).ttl(Duration::from_secs(30));
        match measure!(recs[1], meter, b.try_acquire(req).await) {
            Ok(Acquire::Held(_)) => {}
            Ok(Acquire::Granted(_)) => {
                return Err(format!("{key}: a rival was granted a held lease"))
            }
            Err(e) => return Err(format!("refused try-acquire: {e}")),
        }
        let g = match measure!(recs[2], meter, b.renew(&g, None).await) {
            Ok(Renewal::Renewed(g)) => g,
            Ok(Renewal::Lost) => return Err("renew: lost a fresh grant".into()),
            Err(e) => return Err(format!("renew: {e}")),
        };
        measure!(recs[3], meter, b.read(key).await).map_err(|e| format!("read: {e}"))?;
        measure!(recs[4], meter, b.release(&g).await).map_err(|e| format!("release: {e}"))?;
        if c.raw.exists() {
            c.raw
                .read()
                .await
                .map_err(|e| format!("warm-up raw read: {e}"))?;
            measure!(recs[5], meter, c.raw.write().await).map_err(|e| format!("raw write: {e}"))?;
            measure!(recs[6], meter, c.raw.read().await).map_err(|e| format!("raw read: {e}"))?;
        }
        if c.raw.has_lease_read() {
            measure!(recs[7], meter, c.raw.lease_read(key.as_str()).await)
                .map_err(|e| format!("read's call on the raw session: {e}"))?;
        }
    }
    Ok(())
}

/// Measures one backend: `iters` timed iterations on a direct connection,
/// `count_iters` counted ones through a proxy (after warm-ups on both).
pub async fn measure_backend(
    t: &Target,
    run: &str,
    iters: usize,
    count_iters: usize,
) -> Result<BackendOps, String> {
    let name = t.name();
    let holder = HolderId::random();
    // Latency: a direct connection.
    let mut direct = t.connect(None, &format!("{run}/lat")).await?;
    direct
        .raw
        .setup()
        .await
        .map_err(|e| format!("{name}: raw setup: {e}"))?;
    let key = LeaseKey::new(format!("{run}/ops/lat")).map_err(|e| e.to_string())?;
    let mut lat = Loop {
        recs: (0..OPS.len()).map(|_| Rec::default()).collect(),
    };
    let warm = (iters / 10).clamp(5, 30);
    run_loop(
        &mut direct,
        &Meter::NONE,
        &key,
        &holder,
        warm,
        false,
        &mut lat,
    )
    .await
    .map_err(|e| format!("{name}: warm-up: {e}"))?;
    run_loop(
        &mut direct,
        &Meter::NONE,
        &key,
        &holder,
        iters,
        true,
        &mut lat,
    )
    .await
    .map_err(|e| format!("{name}: {e}"))?;

    // Requests: a second connection through the counting proxy.
    let mut counted = Loop {
        recs: (0..OPS.len()).map(|_| Rec::default()).collect(),
    };
    let mut counter_name = None;
    if let Some(upstream) = t.upstream() {
        let proxy = FaultProxy::start(upstream)
            .await
            .map_err(|e| format!("{name}: proxy: {e}"))?;
        let mut c = t.connect(Some(proxy.addr()), &format!("{run}/cnt")).await?;
        c.raw
            .setup()
            .await
            .map_err(|e| format!("{name}: raw setup: {e}"))?;
        let key = LeaseKey::new(format!("{run}/ops/cnt")).map_err(|e| e.to_string())?;
        let counter = c.counter.take();
        counter_name = counter.as_ref().map(Counter::what);
        let meter = Meter {
            proxy: Some(&proxy),
            counter: counter.as_ref(),
        };
        run_loop(&mut c, &meter, &key, &holder, 3, false, &mut counted)
            .await
            .map_err(|e| format!("{name}: counted warm-up: {e}"))?;
        run_loop(
            &mut c,
            &meter,
            &key,
            &holder,
            count_iters,
            true,
            &mut counted,
        )
        .await
        .map_err(|e| format!("{name}: counted: {e}"))?;
        if let Some(cn) = &counter {
            if !cn.counts_raw() {
                for rec in &mut counted.recs[LEASE_OPS..] {
                    rec.counter.clear();
                }
            }
        }
    }
    let (raw_write, raw_read) = direct.raw.describe();
    let ops = OPS
        .iter()
        .enumerate()
        .filter(|(i, _)| *i < LEASE_OPS || direct.raw.exists())
        .filter(|(_, op)| **op != READ_CALL || direct.raw.has_lease_read())
        .map(|(i, op)| OpResult {
            op,
            latency: stats::latency(&lat.recs[i].lat),
            proxy_requests: stats::count(&counted.recs[i].proxy),
            counter_requests: stats::count(&counted.recs[i].counter),
        })
        .collect();
    Ok(BackendOps {
        backend: name,
        raw_write,
        raw_read,
        counter: counter_name,
        ops,
    })
}

/// A run-unique prefix.
pub fn run_id() -> String {
    let h = HolderId::random();
    format!("bench-{}", &h.as_str()[..10])
}
