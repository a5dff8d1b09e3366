//! The run's results: JSON, a markdown table, and the performance targets
//! (requests per operation, cost against etcd's own v3lock, failover time,
//! renew lag at scale) judged as ratios (a miss is reported, never hidden).

use std::fmt::Write as _;

use serde::Serialize;

use crate::election::ElectionResult;
use crate::failover::Failover;
use crate::ops::{BackendOps, READ_CALL};
use crate::peers::Peer;
use crate::scale::Scale;
use crate::shared::{SharedResult, KINDS};
use crate::stats::{fmt_us, Count};
use crate::sys::Machine;
use crate::targets::{is_etcd, is_postgres};

#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    pub quick: bool,
    pub iterations: usize,
    pub counted_iterations: usize,
    pub failover_releases: usize,
    pub failover_deaths: usize,
    /// Timed iterations of shared, exclusive, permit and plain acquire +
    /// release, and counted ones.
    pub shared_iterations: usize,
    pub shared_counted_iterations: usize,
    /// Exclusive-after-shared (and plain) handovers per backend.
    pub shared_handovers: usize,
    pub election_iterations: usize,
    /// Lease counts of the scale runs.
    pub scale_leases: Vec<usize>,
    /// Every scale run's window when set (else it grows with the count).
    pub scale_window_s: Option<u64>,
    /// Every scale run's TTL when set (else it grows with the count).
    pub scale_ttl_s: Option<u64>,
    pub build: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub target: String,
    pub measured: String,
    /// Whether the goal was met; true on an informational row, which is
    /// never a miss.
    pub pass: bool,
    /// Reported beside the goals, with no goal of its own.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub informational: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub settings: Settings,
    pub servers: Vec<(String, String)>,
    pub ops: Vec<BackendOps>,
    pub peers: Vec<Peer>,
    pub failover: Vec<Failover>,
    pub shared: Vec<SharedResult>,
    pub election: Vec<ElectionResult>,
    pub scale: Vec<Scale>,
    pub targets: Vec<Check>,
    pub errors: Vec<String>,
}

fn cnt(c: &Option<Count>) -> String {
    match c {
        None => "—".into(),
        Some(c) if c.min == c.max => format!("{}", c.median),
        Some(c) => format!("{} ({}–{})", c.median, c.min, c.max),
    }
}

fn both(proxy: &Option<Count>, counter: &Option<Count>) -> String {
    match counter {
        Some(_) => format!("{} / {}", cnt(proxy), cnt(counter)),
        None => cnt(proxy),
    }
}

/// `850 B`, `12.3 kB`.
fn bytes(b: f64) -> String {
    if !b.is_finite() {
        "—".into()
    } else if b >= 1e4 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

/// A difference of latencies, `d` µs, as "… more" or "… less".
fn more_or_less(d: f64) -> String {
    if d >= 0.0 {
        format!("{} more", fmt_us(d))
    } else {
        format!("{} less", fmt_us(-d))
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "—".into()
    }
}

/// The informational targets row of one backend's shared leases: requests
/// and p50 of acquire + release beside the plain lease's, and the
/// exclusive-after-shared handover beside the plain one.
fn shared_summary(x: &SharedResult) -> String {
    let pair = |kind: &str| {
        let (a, r) = (format!("{kind} acquire"), format!("{kind} release"));
        let req = match (x.requests(&a), x.requests(&r)) {
            (Some(a), Some(r)) => Some(a.median.saturating_add(r.median)),
            _ => None,
        };
        let p50 = match (x.get(&a), x.get(&r)) {
            (Some(a), Some(r)) => a.latency.p50_us + r.latency.p50_us,
            _ => f64::NAN,
        };
        (req, p50)
    };
    let (plain_req, plain_p50) = pair("plain");
    let mut req = vec![format!(
        "plain {}",
        plain_req.map_or("—".into(), |n| n.to_string())
    )];
    let mut lat = vec![format!("plain {}", fmt_us(plain_p50))];
    for kind in &KINDS[1..] {
        let (n, p50) = pair(kind);
        req.push(match (n, plain_req) {
            (Some(n), Some(p)) => format!("{kind} {n} ({})", ratio(n as f64, p as f64)),
            _ => format!("{kind} —"),
        });
        lat.push(format!(
            "{kind} {} ({})",
            fmt_us(p50),
            ratio(p50, plain_p50)
        ));
    }
    let (e, p) = (&x.exclusive_after_shared, &x.plain_handover);
    format!(
        "requests (median): {}; p50 (acquire + release): {}; exclusive after shared p50 {} / p90 {} ({} / {} of the plain handover's {} / {})",
        req.join(", "),
        lat.join(", "),
        fmt_us(e.p50_us),
        fmt_us(e.p90_us),
        ratio(e.p50_us, p.p50_us),
        ratio(e.p90_us, p.p90_us),
        fmt_us(p.p50_us),
        fmt_us(p.p90_us)
    )
}

/// One row of the scale growth table: backend, cost, (count, cell).
type GrowthRow = (&'static str, &'static str, Vec<(usize, String)>);

impl Report {
    /// Per backend, each cost at each count, with its multiple of the
    /// smallest count's.
    fn scale_growth(&self) -> Vec<GrowthRow> {
        let mut rows = Vec::new();
        let mut backends: Vec<&'static str> = Vec::new();
        for x in &self.scale {
            if !backends.contains(&x.backend) {
                backends.push(x.backend);
            }
        }
        type Metric = fn(&Scale) -> Option<f64>;
        type Show = fn(f64) -> String;
        let metrics: [(&'static str, Metric, Show); 7] = [
            (
                "requests per renewal",
                |x| x.requests_per_renewal,
                |v| format!("{v:.3}"),
            ),
            (
                "client CPU per renewal",
                |x| Some(x.client_cpu_per_renewal_us),
                |v| format!("{v:.0} µs"),
            ),
            (
                "client allocations per renewal",
                |x| Some(x.allocations_per_renewal),
                |v| format!("{v:.0}"),
            ),
            (
                "server CPU per renewal",
                |x| x.server_cpu_per_renewal_us,
                |v| format!("{v:.0} µs"),
            ),
            (
                "client heap per lease",
                |x| Some(x.client_heap_per_lease_bytes),
                bytes,
            ),
            (
                "server memory per lease",
                |x| x.server_rss_per_lease_bytes,
                bytes,
            ),
            (
                "renew lag p99 (% TTL)",
                |x| Some(x.lag_p99 * 100.0),
                |v| format!("{v:.1}%"),
            ),
        ];
        for b in backends {
            // Runs whose group gave up released their leases early: their
            // costs are not a kept group's.
            let mut runs: Vec<&Scale> = self
                .scale
                .iter()
                .filter(|x| x.backend == b && x.abandoned.is_none())
                .collect();
            runs.sort_by_key(|x| x.leases);
            if runs.len() < 2 {
                continue;
            }
            for (name, get, show) in metrics {
                let base = runs
                    .first()
                    .and_then(|x| get(x))
                    .filter(|v| v.is_finite() && *v > 0.0);
                let cells: Vec<(usize, String)> = runs
                    .iter()
                    .filter_map(|x| {
                        let v = get(x).filter(|v| v.is_finite())?;
                        let rel = match base {
                            Some(b0) if !name.starts_with("renew lag") => {
                                format!(" ({:.2}×)", v / b0)
                            }
                            _ => String::new(),
                        };
                        Some((x.leases, format!("{}{rel}", show(v))))
                    })
                    .collect();
                if !cells.is_empty() {
                    rows.push((b, name, cells));
                }
            }
        }
        rows
    }

    /// Judges the performance targets (requests per operation, cost against
    /// v3lock, failover time, election observer lag, renew lag at scale) on
    /// what was measured.
    pub fn judge(&mut self) {
        let mut out = Vec::new();
        for b in &self.ops {
            if b.backend == "fake" {
                continue;
            }
            // Requests per operation each backend aims for. etcd: one each
            // way (a lease shared by a client's keys), a refused attempt one
            // request, and renew judged on latency below (its keep-alive and
            // its verification run side by side, so the count is reported,
            // the round trip is what matters).
            let mut aims: Vec<(&str, u64)> = match b.backend {
                "etcd" => vec![("acquire", 1), ("release", 1), ("refused try-acquire", 1)],
                // Every key on a lease of its own: a grant and a transaction.
                "etcd-own-leases" => vec![("acquire", 2)],
                "s3" => vec![("renew", 1), ("acquire", 2)],
                _ => vec![("renew", 1), ("acquire", 1)],
            };
            // One statement per operation, read included.
            if b.backend.starts_with("postgres") {
                aims.extend([("read", 1), ("release", 1)]);
            }
            // One script per operation, a refused attempt included.
            if b.backend == "redis" {
                aims.extend([("read", 1), ("release", 1), ("refused try-acquire", 1)]);
            }
            for (op, max) in aims {
                let Some(o) = b.get(op) else { continue };
                // The independent counter where it sees the operation (etcd's
                // own metrics are exact where HTTP/2 housekeeping inflates
                // the proxy's count), else the proxy.
                let judged = o.counter_requests.or(o.proxy_requests);
                if let Some(c) = judged {
                    let measured = match (o.proxy_requests, o.counter_requests) {
                        (Some(p), Some(x)) => format!(
                            "{} by {} (median; the proxy saw median {}, {}–{})",
                            x.median,
                            b.counter.unwrap_or("the client"),
                            p.median,
                            p.min,
                            p.max
                        ),
                        _ => format!("{} (median at the proxy, {}–{})", c.median, c.min, c.max),
                    };
                    out.push(Check {
                        target: format!(
                            "{}: {op} sends {} request{}",
                            b.backend,
                            if max == 1 { "1" } else { "at most 2" },
                            if max == 1 { "" } else { "s" }
                        ),
                        measured,
                        pass: c.median <= max,
                        informational: false,
                    });
                }
            }
            if is_etcd(b.backend) {
                if let (Some(r), Some(w)) = (b.get("renew"), b.get("raw write")) {
                    let x = r.latency.p50_us / w.latency.p50_us;
                    out.push(Check {
                        target: format!(
                            "{}: renew p50 ≤ 1.1× the raw single request (txn on mod revision) p50",
                            b.backend
                        ),
                        measured: format!(
                            "{} ({} vs {}; renew sends {} requests by {}, {} at the proxy)",
                            ratio(r.latency.p50_us, w.latency.p50_us),
                            fmt_us(r.latency.p50_us),
                            fmt_us(w.latency.p50_us),
                            r.counter_requests
                                .map_or("—".into(), |c| c.median.to_string()),
                            b.counter.unwrap_or("the server"),
                            r.proxy_requests
                                .map_or("—".into(), |c| c.median.to_string()),
                        ),
                        pass: x.is_finite() && x <= 1.1,
                        informational: false,
                    });
                }
            }
            if is_postgres(b.backend) {
                // Each operation is one statement; its cost beside the
                // smallest statement of its kind is what the statement
                // itself adds (its text, its plan, its answer).
                for (op, raw, bound) in [
                    ("acquire", "raw write", 1.3),
                    ("renew", "raw write", 1.3),
                    ("release", "raw write", 1.3),
                    ("read", "raw read", 1.1),
                ] {
                    let (Some(o), Some(w)) = (b.get(op), b.get(raw)) else {
                        continue;
                    };
                    let x = o.latency.p50_us / w.latency.p50_us;
                    // What the statement adds is near constant from run to
                    // run while the raw statement's own time moves, so the
                    // ratio moves with the raw time: both are shown, and
                    // beside the default the same operation prepared (the
                    // price of sending each call's text unprepared, which
                    // transaction-mode poolers need).
                    let prepared = self
                        .ops
                        .iter()
                        .filter(|p| {
                            b.backend == "postgres" && p.backend == "postgres-statement-cache"
                        })
                        .find_map(|p| Some((p.get(op)?, p.get(raw)?)))
                        .map(|(po, pw)| {
                            format!(
                                "; prepared (postgres-statement-cache): {}",
                                ratio(po.latency.p50_us, pw.latency.p50_us)
                            )
                        })
                        .unwrap_or_default();
                    // The read's call sent on the raw read's own session
                    // splits what the read adds: its SQL (the function and
                    // its wider answer) and the crate's client path (pool
                    // checkout, timeout, decoding).
                    let split = b
                        .get(READ_CALL)
                        .filter(|_| op == "read" && b.backend == "postgres")
                        .map(|c| {
                            format!(
                                "; its call sent on the raw read's session: {} ({}), the rest in lease-postgres's client path ({})",
                                ratio(c.latency.p50_us, w.latency.p50_us),
                                more_or_less(c.latency.p50_us - w.latency.p50_us),
                                more_or_less(o.latency.p50_us - c.latency.p50_us),
                            )
                        })
                        .unwrap_or_default();
                    out.push(Check {
                        target: format!("{}: {op} p50 ≤ {bound}× the {raw} p50", b.backend),
                        measured: format!(
                            "{} ({} vs {}: {}{split}{prepared})",
                            ratio(o.latency.p50_us, w.latency.p50_us),
                            fmt_us(o.latency.p50_us),
                            fmt_us(w.latency.p50_us),
                            more_or_less(o.latency.p50_us - w.latency.p50_us),
                        ),
                        pass: x.is_finite() && x <= bound,
                        informational: false,
                    });
                }
            }
        }
        for p in &self.peers {
            if !is_etcd(p.backend) {
                continue;
            }
            let ours = p.lease.latency.p50_us;
            let ours_req = p.lease.counter_requests.or(p.lease.proxy_requests);
            for (i, peer) in p.peers.iter().enumerate() {
                let r = ours / peer.latency.p50_us;
                match i {
                    0 => {
                        out.push(Check {
                            target: format!("{}: lease-etcd acquire + release ≤ 1.0× etcd v3lock lock + unlock on a shared lease (p50)", p.backend),
                            measured: format!(
                                "{} ({} vs {})",
                                ratio(ours, peer.latency.p50_us),
                                fmt_us(ours),
                                fmt_us(peer.latency.p50_us)
                            ),
                            pass: (r.is_finite() && r <= 1.0) || p.backend == "etcd-own-leases",
                            // Each key on a lease of its own costs a grant
                            // and a revoke more: shown, judged on the
                            // default only.
                            informational: p.backend == "etcd-own-leases",
                        });
                        let theirs = peer.counter_requests.or(peer.proxy_requests);
                        if let (Some(a), Some(b)) = (ours_req, theirs) {
                            out.push(Check {
                                target: format!("{}: lease-etcd acquire + release sends ≤ 1.0× the requests of v3lock lock + unlock on a shared lease", p.backend),
                                measured: format!(
                                    "{} ({} vs {} requests, median{})",
                                    ratio(a.median as f64, b.median as f64),
                                    a.median,
                                    b.median,
                                    if p.lease.counter_requests.is_some() {
                                        ", counted by etcd"
                                    } else {
                                        " at the proxy"
                                    }
                                ),
                                pass: (b.median > 0 && a.median <= b.median)
                                    || p.backend == "etcd-own-leases",
                                informational: p.backend == "etcd-own-leases",
                            });
                        }
                    }
                    1 => out.push(Check {
                        target: format!("{}: lease-etcd acquire + release ≤ 1.1× v3lock with its own lease (grant + lock + unlock + revoke), p50", p.backend),
                        measured: format!(
                            "{} ({} vs {})",
                            ratio(ours, peer.latency.p50_us),
                            fmt_us(ours),
                            fmt_us(peer.latency.p50_us)
                        ),
                        pass: r.is_finite() && r <= 1.1,
                        informational: false,
                    }),
                    // Further peers (the session lock) are shown in the
                    // peer table, not judged.
                    _ => {}
                }
            }
        }
        for f in &self.failover {
            if (is_etcd(f.backend)
                || f.backend.starts_with("postgres")
                || matches!(f.backend, "nats" | "redis"))
                && f.release_to_grant.n > 0
            {
                out.push(Check {
                    target: format!(
                        "{}: release → waiting acquirer granted ≤ 100 ms (every iteration)",
                        f.backend
                    ),
                    measured: format!(
                        "max {} (p50 {}, {} iterations)",
                        fmt_us(f.release_to_grant.max_us),
                        fmt_us(f.release_to_grant.p50_us),
                        f.release_to_grant.n
                    ),
                    pass: f.release_to_grant.max_us <= 100_000.0,
                    informational: false,
                });
            }
        }
        // Reported beside the goals, with none of their own.
        for x in &self.shared {
            if x.backend == "fake" {
                continue;
            }
            out.push(Check {
                target: format!(
                    "{}: shared, exclusive and permit (of {}) acquire + release, and exclusive after shared, beside a plain lease (reported, no goal)",
                    x.backend, x.permits
                ),
                measured: shared_summary(x),
                pass: true,
                informational: true,
            });
        }
        for e in &self.election {
            let worst = e.worst_lag_p99_us();
            let (bound_us, bound) = if e.watch {
                (100_000.0, "100 ms (watch)".to_string())
            } else {
                (
                    e.poll_interval_ms * 1e3,
                    format!(
                        "one poll interval, {} (polling)",
                        fmt_us(e.poll_interval_ms * 1e3)
                    ),
                )
            };
            let mut why = String::new();
            if e.unreported > 0 {
                why = format!("; {} changes never reported", e.unreported);
            } else if worst > bound_us {
                why = if e.watch
                    && e.lag_proclaim.p99_us > bound_us
                    && e.lag_new_leader.p99_us <= bound_us
                {
                    format!(
                        "; a new value is seen at the observer's next read ({} interval), the watch wakes on a new holder, a release or an expiry",
                        fmt_us(e.poll_interval_ms * 1e3)
                    )
                } else if !e.watch {
                    format!(
                        "; {} over: the observer reads again one interval after its previous read returned, so a change can wait the interval plus a read's round trip",
                        fmt_us(worst - bound_us)
                    )
                } else {
                    format!("; {} over the bound", fmt_us(worst - bound_us))
                };
            }
            out.push(Check {
                target: format!(
                    "{}: election observer reports a change (proclaim, no leader, new leader) within {bound} of it (p99)",
                    e.backend
                ),
                measured: format!(
                    "p99 proclaim {} · no leader {} · new leader {} (p50 {} · {} · {}; {} handovers){why}",
                    fmt_us(e.lag_proclaim.p99_us),
                    fmt_us(e.lag_no_leader.p99_us),
                    fmt_us(e.lag_new_leader.p99_us),
                    fmt_us(e.lag_proclaim.p50_us),
                    fmt_us(e.lag_no_leader.p50_us),
                    fmt_us(e.lag_new_leader.p50_us),
                    e.handovers
                ),
                pass: e.unreported == 0 && worst.is_finite() && worst <= bound_us,
                informational: false,
            });
        }
        for s in &self.scale {
            out.push(Check {
                target: format!(
                    "{}: {} leases in one LeaseGroup (TTL {} s), renew lag p99 < 10% of TTL",
                    s.backend, s.leases, s.ttl_s
                ),
                measured: match (&s.abandoned, s.window_s > 0.0) {
                    (Some(why), false) => format!("not kept: {why}"),
                    (why, _) => format!(
                        "{:.1}% (estimated; p50 {:.1}%; {} of {} renewals started after 0.55 TTL; {} failed; {} lost{})",
                        s.lag_p99 * 100.0,
                        s.lag_p50 * 100.0,
                        s.late,
                        s.renewals,
                        s.failed_renewals,
                        s.lost,
                        why.as_ref().map_or(String::new(), |w| format!(": {w}"))
                    ),
                },
                pass: s.lag_p99 < 0.10 && s.lost == 0 && s.renewals > 0 && s.abandoned.is_none(),
                informational: false,
            });
        }
        self.renewal_cost_targets(&mut out);
        self.targets = out;
    }

    /// What a renewal costs at 100,000 leases (the largest count measured,
    /// if that many): the keeper's own bookkeeping (the fake, which does no
    /// I/O) at most 10 µs of client CPU, etcd and NATS at most twice the
    /// fake's, and etcd's renewals sending keep-alives only. Smaller runs
    /// are not judged: a process's fixed costs weigh most in them.
    fn renewal_cost_targets(&self, out: &mut Vec<Check>) {
        const JUDGED_FROM: usize = 100_000;
        let kept = |b: &str| {
            self.scale
                .iter()
                .filter(|x| x.backend == b && x.abandoned.is_none() && x.renewals > 0)
                .filter(|x| x.leases >= JUDGED_FROM)
                .max_by_key(|x| x.leases)
        };
        let fake = kept("fake");
        if let Some(f) = fake {
            out.push(Check {
                target: format!(
                    "fake: client CPU per renewal at {} leases ≤ 10 µs (the keeper's own bookkeeping)",
                    f.leases
                ),
                measured: format!("{:.1} µs", f.client_cpu_per_renewal_us),
                pass: f.client_cpu_per_renewal_us <= 10.0,
                informational: false,
            });
        }
        for b in ["etcd", "nats"] {
            let (Some(x), Some(f)) = (kept(b), fake) else {
                continue;
            };
            let at_count = self
                .scale
                .iter()
                .find(|y| y.backend == "fake" && y.leases == x.leases && y.abandoned.is_none())
                .unwrap_or(f);
            // What a renewal sends beside the fake's bookkeeping: a request
            // per renewal (NATS) costs the client that request's path, and
            // its allocations the allocator's slow paths (glibc's malloc
            // sorts its free lists whenever the small caches run dry).
            let sent = x
                .requests_per_renewal
                .map(|r| format!("; {r:.3} requests per renewal"))
                .unwrap_or_default();
            let allocations = format!(
                "; {:.0} vs {:.0} allocations per renewal",
                x.allocations_per_renewal, at_count.allocations_per_renewal
            );
            // What the request alone costs at this rate, the floor under
            // any renewal that sends one.
            let floor = match &x.floor {
                Some(Ok(f)) => format!(
                    "; the client library's bare KV update alone, paced alike: {:.1} µs ({}) and {:.0} allocations each",
                    f.cpu_per_write_us,
                    ratio(f.cpu_per_write_us, at_count.client_cpu_per_renewal_us),
                    f.allocations_per_write
                ),
                Some(Err(e)) => format!("; the bare KV update could not be measured: {e}"),
                None => String::new(),
            };
            out.push(Check {
                target: format!(
                    "{b}: client CPU per renewal at {} leases ≤ 2× the fake's",
                    x.leases
                ),
                measured: format!(
                    "{} ({:.1} µs vs {:.1} µs{sent}{allocations}{floor})",
                    ratio(
                        x.client_cpu_per_renewal_us,
                        at_count.client_cpu_per_renewal_us
                    ),
                    x.client_cpu_per_renewal_us,
                    at_count.client_cpu_per_renewal_us
                ),
                pass: x.client_cpu_per_renewal_us <= 2.0 * at_count.client_cpu_per_renewal_us,
                informational: false,
            });
        }
        if let Some(x) = kept("etcd") {
            if let (Some(r), Some(k)) = (x.requests_per_renewal, x.keep_alives_per_renewal) {
                let other = (r - k).max(0.0);
                out.push(Check {
                    target: format!(
                        "etcd: renewals at {} leases send keep-alives only (no request per key)",
                        x.leases
                    ),
                    measured: format!(
                        "{r:.3} messages per renewal: {k:.3} keep-alives, {other:.3} others (the watch's progress requests, one per batch of renewals, where the mirror verifies them)"
                    ),
                    pass: other < 0.001,
                    informational: false,
                });
            }
        }
    }

    /// The shared, exclusive and permit section: acquire and release beside
    /// a plain keeper's, then the exclusive-after-shared handover.
    fn shared_markdown(&self, s: &mut String) {
        let st = &self.settings;
        let _ = writeln!(
            s,
            "\n## Shared, exclusive and permit leases\n\n`lease-keeper`'s `Keeper::acquire_shared`, `acquire_exclusive` and `acquire_permit` (of {} permits), each acquired and released beside a plain `Keeper::acquire`, interleaved, a key per kind: latency over {} iterations on a direct connection, requests over {} more on a second connection through a TCP proxy (at the proxy / by the cross-check counter, where the backend has one). A shared acquire takes a registration slot, reads the exclusive intent and joins the shared phase (the previous holder's, still live: a shared release leaves the phase to its TTL); an exclusive one, with no shared holder about, takes the intent, reads the 32 registration slots, takes the key and releases the intent; a permit takes one of the slots (all free) from a random one on. The proxy counts exchanges: reads sent at once on one connection (the exclusive acquire's 32, on etcd, NATS and Redis) are one burst there, each one at the cross-check counter. Ratios: p50 over the plain lease's p50 · requests (median; the cross-check counter's where there is one) over the plain lease's.\n",
            self.shared.first().map_or(0, |x| x.permits),
            st.shared_iterations,
            st.shared_counted_iterations
        );
        let _ = writeln!(
            s,
            "| backend | lease | acquire p50 | p99 | requests | ÷ plain | release p50 | p99 | requests | ÷ plain |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for x in &self.shared {
            for kind in KINDS {
                let mut cells = Vec::new();
                for step in ["acquire", "release"] {
                    let op = format!("{kind} {step}");
                    let plain = format!("plain {step}");
                    let Some(o) = x.get(&op) else {
                        cells.push("— | — | — | —".to_string());
                        continue;
                    };
                    let vs = if kind == "plain" {
                        String::new()
                    } else {
                        let p50 = x.get(&plain).map_or(f64::NAN, |p| p.latency.p50_us);
                        let req = match (x.requests(&op), x.requests(&plain)) {
                            (Some(a), Some(b)) => ratio(a.median as f64, b.median as f64),
                            _ => "—".into(),
                        };
                        format!("{} · {req}", ratio(o.latency.p50_us, p50))
                    };
                    cells.push(format!(
                        "{} | {} | {} | {vs}",
                        fmt_us(o.latency.p50_us),
                        fmt_us(o.latency.p99_us),
                        both(&o.proxy_requests, &o.counter_requests),
                    ));
                }
                let label = if kind == "permit" {
                    format!("permit (of {})", x.permits)
                } else {
                    kind.to_string()
                };
                let _ = writeln!(s, "| {} | {label} | {} |", x.backend, cells.join(" | "));
            }
        }
        let _ = writeln!(
            s,
            "\nExclusive after shared: a shared holder is in, an exclusive acquire waits on its own client (its intent taken, the holder's slot watched where the backend has a watch, else read again after each pause), the holder releases; from the release's answer to the exclusive acquire's return (the waiter reads the 32 slots, ends the shared phase, takes the key and releases its intent). Beside it, interleaved, a plain holder's release and a waiting `Keeper::acquire`, timed the same way (the failover section times from the release's sending instead); 0 when the waiter returned first. {} iterations each (p90: nearest rank, the maximum below 10).\n\n| backend | waiter wakes by | exclusive after shared p50 | p90 | plain handover p50 | p90 | ÷ plain (p50) | ÷ plain (p90) |\n|---|---|---|---|---|---|---|---|",
            st.shared_handovers
        );
        for x in &self.shared {
            let (e, p) = (&x.exclusive_after_shared, &x.plain_handover);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                x.backend,
                if x.watch { "watch" } else { "polling" },
                fmt_us(e.p50_us),
                fmt_us(e.p90_us),
                fmt_us(p.p50_us),
                fmt_us(p.p90_us),
                ratio(e.p50_us, p.p50_us),
                ratio(e.p90_us, p.p90_us)
            );
        }
    }

    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut s = String::new();
        let _ = writeln!(s, "# lease-bench results\n");
        let _ = writeln!(
            s,
            "{} · {} CPUs ({}) · {} GiB · Linux {} · load average at start {}, at the end {} · {} build{}\n",
            m.date_utc,
            m.cpus,
            m.cpu_model,
            m.memory_gib,
            m.kernel,
            m.load_average,
            m.load_average_end,
            self.settings.build,
            if self.settings.quick {
                " · **quick run**"
            } else {
                ""
            }
        );
        if m.builds_seen > 0 {
            let _ = writeln!(
                s,
                "**The machine was shared with concurrent builds while this ran** (up to {} `rustc` processes seen beside the bench, sampled at every step): absolute times and CPU shares are noisy; compare the ratios to the same run's baselines.\n",
                m.builds_seen
            );
        }
        if !self.servers.is_empty() {
            let list: Vec<String> = self
                .servers
                .iter()
                .map(|(b, v)| format!("{b}: {v}"))
                .collect();
            let _ = writeln!(s, "Servers: {}.\n", list.join("; "));
        }
        let _ = writeln!(s, "## Targets\n\n| target | measured | |\n|---|---|---|");
        for c in &self.targets {
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                c.target,
                c.measured,
                match (c.informational, c.pass) {
                    (true, _) => "reported",
                    (false, true) => "met",
                    (false, false) => "**MISSED**",
                }
            );
        }
        if !self.ops.is_empty() {
            let _ = writeln!(
                s,
                "\n## Operations\n\nLatency over {} iterations on a direct connection (acquire → a rival holder's refused try-acquire → renew → read → release → raw write → raw read → on PostgreSQL, the read's function called on the raw read's session, interleaved); requests counted over {} further iterations on a second connection through a TCP proxy (median, range in brackets when it varied). Ratio: p50 over the raw baseline's p50 (write for acquire/renew/release, read for read).\n",
                self.settings.iterations, self.settings.counted_iterations
            );
            let _ = writeln!(
                s,
                "| backend | operation | p50 | p99 | requests (proxy) | cross-check | p50 ÷ raw |\n|---|---|---|---|---|---|---|"
            );
            for b in &self.ops {
                let raw_w = b
                    .get("raw write")
                    .map(|o| o.latency.p50_us)
                    .unwrap_or(f64::NAN);
                let raw_r = b
                    .get("raw read")
                    .map(|o| o.latency.p50_us)
                    .unwrap_or(f64::NAN);
                for o in &b.ops {
                    let (label, r) = match o.op {
                        "raw write" => (format!("raw write: {}", b.raw_write), String::new()),
                        "raw read" => (format!("raw read: {}", b.raw_read), String::new()),
                        "read" | READ_CALL => (o.op.to_string(), ratio(o.latency.p50_us, raw_r)),
                        _ => (o.op.to_string(), ratio(o.latency.p50_us, raw_w)),
                    };
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {} | {} | {} |",
                        b.backend,
                        label,
                        fmt_us(o.latency.p50_us),
                        fmt_us(o.latency.p99_us),
                        cnt(&o.proxy_requests),
                        cnt(&o.counter_requests),
                        r
                    );
                }
            }
            let counters: Vec<String> = self
                .ops
                .iter()
                .filter_map(|b| b.counter.map(|c| format!("{}: {c}", b.backend)))
                .collect();
            if !counters.is_empty() {
                let _ = writeln!(s, "\nCross-check counters — {}.", counters.join("; "));
            }
        }
        if !self.peers.is_empty() {
            let _ = writeln!(
                s,
                "\n## Native peers (same server, same run, interleaved)\n\nRequests: at the proxy / by the cross-check counter.\n\n| ours | p50 | p99 | requests | peer | p50 | p99 | requests | ours ÷ peer (p50) |\n|---|---|---|---|---|---|---|---|---|"
            );
            for p in &self.peers {
                for peer in &p.peers {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        p.lease.what,
                        fmt_us(p.lease.latency.p50_us),
                        fmt_us(p.lease.latency.p99_us),
                        both(&p.lease.proxy_requests, &p.lease.counter_requests),
                        peer.what,
                        fmt_us(peer.latency.p50_us),
                        fmt_us(peer.latency.p99_us),
                        both(&peer.proxy_requests, &peer.counter_requests),
                        ratio(p.lease.latency.p50_us, peer.latency.p50_us)
                    );
                }
            }
        }
        if !self.failover.is_empty() {
            let _ = writeln!(
                s,
                "\n## Failover\n\nWaiter: `Keeper::acquire` on its own client. Release → grant counts from the holder sending its release; death → grant from the holder's last answer (it then stays silent).\n\n| backend | waiter wakes by | release → grant p50 | max | death → grant p50 (TTL {} s) | max | detection after TTL p50 |\n|---|---|---|---|---|---|---|",
                self.failover.first().map_or(0.0, |f| f.death_ttl_s)
            );
            for f in &self.failover {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    f.backend,
                    if f.watch { "watch" } else { "polling" },
                    fmt_us(f.release_to_grant.p50_us),
                    fmt_us(f.release_to_grant.max_us),
                    fmt_us(f.death_to_grant.p50_us),
                    fmt_us(f.death_to_grant.max_us),
                    fmt_us(f.detection.p50_us)
                );
            }
        }
        if !self.shared.is_empty() {
            self.shared_markdown(&mut s);
        }
        if !self.election.is_empty() {
            let _ = writeln!(
                s,
                "\n## Election\n\nTwo candidates (`lease-keeper` `Election`, each on its own client) take turns; an `Observer` on a third client follows the key (TTL {} s; observers read the key every tenth of the TTL and on every watch wake-up). Handover: from the leader's `resign()` call to the next candidate's work starting in `Leadership::run` (its campaign's return in brackets). Observer lag: from the instant the writer's change is stored (proclaim or resign returned, the new leader's campaign returned) to the observer's report (0 when the report came first). \"No leader\" is reported where the observer saw the key free between two leaders (a poll may see the next leader first).\n\n| backend | observer wakes by | handovers | handover p50 (campaign returns) | p99 | observer lag p50 / p99: proclaim | no leader (seen) | new leader | unreported |\n|---|---|---|---|---|---|---|---|---|",
                self.election.first().map_or(0.0, |e| e.ttl_s)
            );
            for e in &self.election {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} ({}) | {} | {} / {} | {} / {} ({}) | {} / {} | {} |",
                    e.backend,
                    if e.watch {
                        "watch".to_string()
                    } else {
                        format!("polling every {}", fmt_us(e.poll_interval_ms * 1e3))
                    },
                    e.handovers,
                    fmt_us(e.handover.p50_us),
                    fmt_us(e.handover_campaign.p50_us),
                    fmt_us(e.handover.p99_us),
                    fmt_us(e.lag_proclaim.p50_us),
                    fmt_us(e.lag_proclaim.p99_us),
                    fmt_us(e.lag_no_leader.p50_us),
                    fmt_us(e.lag_no_leader.p99_us),
                    e.lag_no_leader.n,
                    fmt_us(e.lag_new_leader.p50_us),
                    fmt_us(e.lag_new_leader.p99_us),
                    e.unreported
                );
            }
        }
        if !self.scale.is_empty() {
            let _ = writeln!(
                s,
                "\n## Scale (one LeaseGroup)\n\nEach run acquires its leases (64 at a time), keeps them for the window, then releases them. CPU: the client's own (`getrusage`; on the fake it includes the in-process store) and the server's (`/proc/<pid>/stat`), per second of keeping (100% = one core) and per renewal (per renewal, the process's fixed costs — its runtime, the fake's clock — weigh most in the smallest runs); beside it, the allocations the client process asked for over the window per renewal (the counting allocator's count: every allocation a renewal makes costs the allocator, and glibc's malloc, when its small per-thread caches run dry, sorts its free lists on the request path). A run whose group gave up (a lease lost: the group then releases all the others) says why in its target row; its costs cover a group that shrank, and the growth table leaves it out. Client memory per lease: growth of the live heap (a counting allocator: bytes allocated and not freed) from before the first acquire to the end of the window, divided by the leases, and the growth of the resident set (which memory an earlier run freed and the allocator kept can hide). Server memory per lease: growth of the server's resident set over the same span (it includes whatever the server keeps per write, such as history awaiting compaction). Requests per renewal: the backend's own counter over the window (etcd: every message the server received, the keep-alives among them in brackets; NATS: the lease client's JetStream requests).\n\n| backend | leases | TTL | acquire all | kept for | renewals/s (failed) | renew lag p99 / p50 (% TTL, est.) | interval p99 / max (× TTL; schedule 0.30–0.55) | started after 0.55 TTL | renew RTT p50 / p99 | requests per renewal | client CPU | server CPU | client memory per lease | server memory per lease | lost |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
            );
            for x in &self.scale {
                if let (Some(why), true) = (&x.abandoned, x.window_s <= 0.0) {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} s | {:.1} s (gave up) | — | not kept: {why} |||||||||||",
                        x.backend, x.leases, x.ttl_s, x.acquire_all_s
                    );
                    continue;
                }
                let _ = writeln!(
                    s,
                    "| {} | {} | {} s | {:.1} s | {:.0} s | {:.0} ({}) | {:.1}% / {:.1}% | {:.3} / {:.3} | {} | {} / {} | {} | {:.1}% of a core ({:.0} µs and {:.0} allocations per renewal) | {} | {} heap ({} RSS; RSS {:.0} MiB) | {} | {} |",
                    x.backend,
                    x.leases,
                    x.ttl_s,
                    x.acquire_all_s,
                    x.window_s,
                    x.renewals as f64 / x.window_s.max(1e-9),
                    x.failed_renewals,
                    x.lag_p99 * 100.0,
                    x.lag_p50 * 100.0,
                    x.interval_p99,
                    x.interval_max,
                    x.late,
                    fmt_us(x.renew_rtt.p50_us),
                    fmt_us(x.renew_rtt.p99_us),
                    match (x.requests_per_renewal, x.keep_alives_per_renewal) {
                        (Some(r), Some(k)) => format!("{r:.3} ({k:.3} keep-alives)"),
                        (Some(r), None) => format!("{r:.3}"),
                        _ => "—".into(),
                    },
                    x.client_cpu_per_s * 100.0,
                    x.client_cpu_per_renewal_us,
                    x.allocations_per_renewal,
                    match (x.server_cpu_per_s, x.server_cpu_per_renewal_us) {
                        (Some(c), Some(r)) => format!("{:.1}% of a core ({r:.0} µs per renewal)", c * 100.0),
                        (Some(c), None) => format!("{:.1}% of a core", c * 100.0),
                        _ => "—".into(),
                    },
                    bytes(x.client_heap_per_lease_bytes),
                    bytes(x.client_rss_per_lease_bytes),
                    x.client_rss_mib,
                    match (x.server_rss_per_lease_bytes, x.server_rss_mib) {
                        (Some(b), Some(m)) => format!("{} (RSS {m:.0} MiB)", bytes(b)),
                        _ => "—".into(),
                    },
                    x.lost
                );
            }
            for x in &self.scale {
                match &x.floor {
                    Some(Ok(f)) => {
                        let _ = writeln!(
                            s,
                            "\n{} at {} leases, the floor: the client library's bare conditional KV update (what a renewal sends, with no keeper and no lease record), paced at the run's {:.0} renewals/s in batches every 10 ms as the group starts them, after the group released its leases: {:.1} µs of client CPU and {:.0} allocations per update ({} updates, {} failed).",
                            x.backend, x.leases, f.rate_per_s, f.cpu_per_write_us, f.allocations_per_write, f.writes, f.failed
                        );
                    }
                    Some(Err(e)) => {
                        let _ = writeln!(
                            s,
                            "\n{} at {} leases, the floor: not measured: {e}",
                            x.backend, x.leases
                        );
                    }
                    None => {}
                }
            }
            let growth = self.scale_growth();
            if !growth.is_empty() {
                let _ = writeln!(
                    s,
                    "\nHow cost grows with the count (per renewal and per lease, so TTLs that differ between runs do not enter; × the smallest run of the same backend in brackets):\n"
                );
                let mut counts: Vec<usize> = self.scale.iter().map(|x| x.leases).collect();
                counts.sort_unstable();
                counts.dedup();
                let head: Vec<String> = counts.iter().map(|n| format!("{n} leases")).collect();
                let _ = writeln!(
                    s,
                    "| backend | cost | {} |\n|---|---|{}",
                    head.join(" | "),
                    "---|".repeat(counts.len())
                );
                for (backend, metric, cells) in growth {
                    let row: Vec<String> = counts
                        .iter()
                        .map(|n| {
                            cells
                                .iter()
                                .find(|c| c.0 == *n)
                                .map_or("—".into(), |c| c.1.clone())
                        })
                        .collect();
                    let _ = writeln!(s, "| {backend} | {metric} | {} |", row.join(" | "));
                }
            }
        }
        if !self.errors.is_empty() {
            let _ = writeln!(s, "\n## Errors\n");
            for e in &self.errors {
                let _ = writeln!(s, "- {e}");
            }
        }
        s
    }
}
