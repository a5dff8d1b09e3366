//! The run's results: JSON, a markdown table, and the performance targets
//! (requests per operation, cost against etcd's own v3lock, failover time,
//! renew lag at scale) judged as ratios (a miss is reported, never hidden).

use std::fmt::Write as _;

use serde::Serialize;

use crate::failover::Failover;
use crate::ops::BackendOps;
use crate::peers::Peer;
use crate::scale::Scale;
use crate::stats::{fmt_us, Count};
use crate::sys::Machine;

#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    pub quick: bool,
    pub iterations: usize,
    pub counted_iterations: usize,
    pub failover_releases: usize,
    pub failover_deaths: usize,
    pub scale_leases: usize,
    pub scale_window_s: u64,
    pub build: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub target: String,
    pub measured: String,
    pub pass: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub settings: Settings,
    pub servers: Vec<(String, String)>,
    pub ops: Vec<BackendOps>,
    pub peers: Vec<Peer>,
    pub failover: Vec<Failover>,
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

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "—".into()
    }
}

impl Report {
    /// Judges the performance targets (requests per operation, cost against
    /// v3lock, failover time, renew lag at scale) on what was measured.
    pub fn judge(&mut self) {
        let mut out = Vec::new();
        for b in &self.ops {
            if b.backend == "fake" {
                continue;
            }
            let mut aims = vec![
                ("renew", 1),
                (
                    "acquire",
                    if matches!(b.backend, "nats" | "mongo" | "postgres") {
                        1
                    } else {
                        2
                    },
                ),
            ];
            // One statement per operation, read included.
            if b.backend == "postgres" {
                aims.extend([("read", 1), ("release", 1)]);
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
                    });
                }
            }
        }
        for p in &self.peers {
            if p.backend != "etcd" {
                continue;
            }
            let ours = p.lease.latency.p50_us;
            for (i, peer) in p.peers.iter().enumerate() {
                let r = ours / peer.latency.p50_us;
                out.push(Check {
                    target: if i == 0 {
                        "lease-etcd acquire + release ≤ 1.1× etcd v3lock lock + unlock (p50)".into()
                    } else {
                        "lease-etcd acquire + release ≤ 1.1× v3lock with its own lease (grant + lock + unlock + revoke), p50".into()
                    },
                    measured: format!(
                        "{:.2}× ({} vs {})",
                        r,
                        fmt_us(ours),
                        fmt_us(peer.latency.p50_us)
                    ),
                    pass: r <= 1.1,
                });
            }
        }
        for f in &self.failover {
            if matches!(f.backend, "etcd" | "nats" | "postgres") && f.release_to_grant.n > 0 {
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
                });
            }
        }
        for s in &self.scale {
            out.push(Check {
                target: format!(
                    "{}: {} leases in one LeaseGroup, renew lag p99 < 10% of TTL{}",
                    s.backend,
                    s.leases,
                    if s.leases < 10_000 {
                        " (quick run: fewer than 10,000)"
                    } else {
                        ""
                    }
                ),
                measured: format!(
                    "{:.1}% (estimated; p50 {:.1}%; {} renewals started after 0.55 TTL; {} lost)",
                    s.lag_p99 * 100.0,
                    s.lag_p50 * 100.0,
                    s.late,
                    s.lost
                ),
                pass: s.lag_p99 < 0.10 && s.lost == 0,
            });
        }
        self.targets = out;
    }

    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut s = String::new();
        let _ = writeln!(s, "# lease-bench results\n");
        let _ = writeln!(
            s,
            "{} · {} CPUs ({}) · {} GiB · Linux {} · load average at start {} · {} build{}\n",
            m.date_utc,
            m.cpus,
            m.cpu_model,
            m.memory_gib,
            m.kernel,
            m.load_average,
            self.settings.build,
            if self.settings.quick {
                " · **quick run**"
            } else {
                ""
            }
        );
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
                if c.pass { "met" } else { "**MISSED**" }
            );
        }
        if !self.ops.is_empty() {
            let _ = writeln!(
                s,
                "\n## Operations\n\nLatency over {} iterations on a direct connection (acquire → renew → read → release → raw write → raw read, interleaved); requests counted over {} further iterations on a second connection through a TCP proxy (median, range in brackets when it varied). Ratio: p50 over the raw baseline's p50 (write for acquire/renew/release, read for read).\n",
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
                        "read" => (o.op.to_string(), ratio(o.latency.p50_us, raw_r)),
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
        if !self.scale.is_empty() {
            let _ = writeln!(
                s,
                "\n## Scale (one LeaseGroup)\n\n| backend | leases | TTL | acquire all | kept for | renewals (failed) | interval p50 / p99 / max (× TTL; schedule 0.30–0.55) | renew lag p50 / p99 (% TTL, est.) | started after 0.55 TTL | renew RTT p50 / p99 | client CPU | server CPU | client RSS (per lease) | server RSS | lost |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
            );
            for x in &self.scale {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} s | {:.1} s | {:.0} s | {} ({}) | {:.3} / {:.3} / {:.3} | {:.1}% / {:.1}% | {} | {} / {} | {:.1}% of a core ({:.0} µs per renewal) | {} | {:.0} MiB ({:.0} B) | {} | {} |",
                    x.backend,
                    x.leases,
                    x.ttl_s,
                    x.acquire_all_s,
                    x.window_s,
                    x.renewals,
                    x.failed_renewals,
                    x.interval_p50,
                    x.interval_p99,
                    x.interval_max,
                    x.lag_p50 * 100.0,
                    x.lag_p99 * 100.0,
                    x.late,
                    fmt_us(x.renew_rtt.p50_us),
                    fmt_us(x.renew_rtt.p99_us),
                    x.client_cpu_per_s * 100.0,
                    x.client_cpu_per_renewal_us,
                    x.server_cpu_per_s
                        .map_or("—".into(), |c| format!("{:.1}% of a core", c * 100.0)),
                    x.client_rss_mib,
                    x.client_rss_per_lease_bytes,
                    x.server_rss_mib.map_or("—".into(), |m| format!("{m:.0} MiB")),
                    x.lost
                );
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
