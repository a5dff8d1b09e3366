//! `lease-bench`: what `cargo xtask bench` runs. Measures every backend side
//! by side in one run, on real servers started by `lease-testkit`:
//!
//! * acquire, renew, read and release — p50/p99 latency and the requests
//!   each sends (counted at a TCP proxy, cross-checked by a client or server
//!   counter) — beside a raw single conditional write and read from the same
//!   client on the same server;
//! * native peers: etcd's v3lock lock + unlock, NATS KV create + delete,
//!   PostgreSQL's session advisory lock + unlock, Redis' `SET NX PX` lock
//!   and Redisson's lock;
//! * failover: release → waiting acquirer granted, silent death → grant;
//! * shared leases, exclusive leases and permits (`lease-keeper`): acquire
//!   and release of each beside a plain keeper's, and an exclusive acquire
//!   waiting out a shared holder beside a plain waiter's handover;
//! * election: handover (a leader resigns → the next candidate's work
//!   starts) and observer lag (proclaim, resign, new leader → an observer
//!   on its own client reports it);
//! * scale: 1,000, 10,000 and 100,000 leases in one `LeaseGroup` on the
//!   fake, etcd, NATS and Redis.
//!
//! Writes `results.json`, `results.md` and `chart.png` under `target/bench/`
//! and prints the markdown. Nothing is asserted on time: targets are judged
//! as ratios and a miss is reported; the exit status is non-zero only when
//! something could not be measured.

mod alloc;
mod chart;
mod election;
mod failover;
mod floor;
mod ops;
mod peers;
mod readme;
mod report;
mod scale;
mod shared;
mod stats;
mod sys;
mod targets;

use std::path::PathBuf;
use std::time::Duration;

use report::{Report, Settings};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;
use targets::{Target, ALL};

const USAGE: &str =
    "usage: lease-bench [--quick] [--backend fake,etcd,etcd-own-leases,nats,s3,mongo,postgres,
                                        postgres-statement-cache,redis]
                   [--skip ops,peers,failover,shared,election,scale] [--iterations N]
                   [--elections N] [--leases N,N,...] [--scale-secs S] [--scale-ttl S]
                   [--out DIR]

  --quick        a short smoke run (fewer iterations, 1,000 leases for 8 s)
  --backend      backends to measure (default: all; etcd-own-leases is lease-etcd
                 with its sessions off, on the same etcd server; likewise
                 postgres-statement-cache, lease-postgres with its statement
                 cache on)
  --skip         sections to leave out
  --iterations   timed iterations per operation (default 400; quick 40)
  --elections    handovers per backend in the election run (default 16; quick 4)
  --leases       lease counts of the scale runs on the fake, etcd, NATS and
                 Redis (default 1000,10000,100000; quick 1000; etcd-own-leases too)
  --scale-secs   how long each scale run keeps its leases (default 20 s for
                 1,000, 30 s for 10,000, 45 s above; quick 8)
  --scale-ttl    the scale runs' TTL (default 10 s up to 10,000 leases, then
                 1 s per 1,000 leases, at most 60 s)
  --out          output directory (default <workspace>/target/bench)
  --no-readme    a full run (every backend, no --quick, no --skip) rewrites
                 the Latest results section of lease-bench/README.md; this
                 leaves it alone";

struct Args {
    quick: bool,
    backends: Vec<String>,
    skip: Vec<String>,
    iterations: Option<usize>,
    elections: Option<usize>,
    leases: Option<Vec<usize>>,
    scale_secs: Option<u64>,
    scale_ttl: Option<u64>,
    out: PathBuf,
    no_readme: bool,
}

impl Args {
    /// Whether this run measured everything, so its numbers may replace the
    /// README's: a quick or partial run must not overwrite a full one.
    fn is_full(&self) -> bool {
        !self.quick
            && self.skip.is_empty()
            && ALL.iter().all(|b| self.backends.iter().any(|x| x == b))
            && self.iterations.is_none()
            && self.elections.is_none()
            && self.leases.is_none()
            && self.scale_secs.is_none()
            && self.scale_ttl.is_none()
    }
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        quick: false,
        backends: ALL.iter().map(|s| s.to_string()).collect(),
        skip: vec![],
        iterations: None,
        elections: None,
        leases: None,
        scale_secs: None,
        scale_ttl: None,
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map_or_else(|| PathBuf::from("target"), |p| p.join("target"))
            .join("bench"),
        no_readme: false,
    };
    let mut it = std::env::args().skip(1);
    let list = |v: String| -> Vec<String> {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--quick" => a.quick = true,
            "--no-readme" => a.no_readme = true,
            "--backend" | "--backends" => {
                a.backends = list(value()?);
                if a.backends.iter().any(|b| b == "all") {
                    a.backends = ALL.iter().map(|s| s.to_string()).collect();
                }
                if let Some(b) = a.backends.iter().find(|b| !ALL.contains(&b.as_str())) {
                    return Err(format!("unknown backend {b:?} (known: {})", ALL.join(", ")));
                }
            }
            "--skip" => a.skip = list(value()?),
            "--iterations" => a.iterations = Some(num(value()?)? as usize),
            "--elections" => a.elections = Some(num(value()?)? as usize),
            "--leases" => {
                let counts = list(value()?)
                    .into_iter()
                    .map(|v| num(v.replace('_', "")).map(|n| n as usize))
                    .collect::<Result<Vec<_>, _>>()?;
                if counts.is_empty() || counts.contains(&0) {
                    return Err(format!("--leases needs counts above zero\n{USAGE}"));
                }
                a.leases = Some(counts);
            }
            "--scale-secs" => a.scale_secs = Some(num(value()?)?),
            "--scale-ttl" => a.scale_ttl = Some(num(value()?)?.max(1)),
            "--out" => a.out = PathBuf::from(value()?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(a)
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lease-bench: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(run(args));
    // Servers started by the harness are killed with this process.
    rt.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code);
}

async fn run(a: Args) -> i32 {
    let q = a.quick;
    let settings = Settings {
        quick: q,
        iterations: a.iterations.unwrap_or(if q { 40 } else { 400 }),
        counted_iterations: if q { 10 } else { 50 },
        failover_releases: if q { 3 } else { 12 },
        failover_deaths: if q { 1 } else { 3 },
        shared_iterations: if q { 8 } else { 16 },
        shared_counted_iterations: if q { 3 } else { 5 },
        shared_handovers: if q { 3 } else { 5 },
        election_iterations: a.elections.unwrap_or(if q { 4 } else { 16 }),
        scale_leases: a.leases.clone().unwrap_or_else(|| {
            if q {
                vec![1000]
            } else {
                vec![1000, 10_000, 100_000]
            }
        }),
        scale_window_s: a.scale_secs.or(if q { Some(8) } else { None }),
        scale_ttl_s: a.scale_ttl,
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    };
    let mut report = Report {
        machine: sys::machine(),
        settings: settings.clone(),
        servers: vec![],
        ops: vec![],
        peers: vec![],
        failover: vec![],
        shared: vec![],
        election: vec![],
        scale: vec![],
        targets: vec![],
        errors: vec![],
    };
    let skip = |s: &str| a.skip.iter().any(|x| x == s);
    // Keys and tables are named per run and per backend: two backends on
    // one server (etcd and etcd-own-leases) never meet each other's keys.
    let run = ops::run_id();
    // Other builds sharing the CPUs, sampled at every step.
    let builds = std::cell::Cell::new(report.machine.builds_seen);
    let say = |s: String| {
        builds.set(builds.get().max(sys::builds_running()));
        eprintln!("lease-bench: {s}");
    };

    let mut targets = Vec::new();
    for b in &a.backends {
        say(format!("starting {b}"));
        match Target::start(b).await {
            Ok(t) => {
                if let Some(v) = version(&t).await {
                    report.servers.push((b.clone(), v));
                }
                targets.push(t);
            }
            Err(e) => report.errors.push(format!("{b}: server unavailable: {e}")),
        }
    }

    if !skip("ops") {
        for t in &targets {
            say(format!("{}: operations", t.name()));
            match ops::measure_backend(
                t,
                &format!("{run}-{}", t.name()),
                settings.iterations,
                settings.counted_iterations,
            )
            .await
            {
                Ok(r) => report.ops.push(r),
                Err(e) => report
                    .errors
                    .push(format!("operations on {}: {e}", t.name())),
            }
        }
    }
    if !skip("peers") {
        for t in &targets {
            let r = match t.name() {
                "etcd" | "etcd-own-leases" => {
                    peers::etcd(
                        t,
                        &format!("{run}-{}", t.name()),
                        settings.iterations / 2,
                        settings.counted_iterations,
                    )
                    .await
                }
                "nats" => {
                    peers::nats(
                        t,
                        &format!("{run}-{}", t.name()),
                        settings.iterations / 2,
                        settings.counted_iterations,
                    )
                    .await
                }
                "postgres" | "postgres-statement-cache" => {
                    peers::postgres(
                        t,
                        &format!("{run}-{}", t.name()),
                        settings.iterations / 2,
                        settings.counted_iterations,
                    )
                    .await
                }
                "redis" => {
                    peers::redis(
                        t,
                        &format!("{run}-{}", t.name()),
                        settings.iterations / 2,
                        settings.counted_iterations,
                    )
                    .await
                }
                _ => continue,
            };
            say(format!("{}: native peer", t.name()));
            match r {
                Ok(p) => report.peers.push(p),
                Err(e) => report.errors.push(format!("peers on {}: {e}", t.name())),
            }
        }
    }
    if !skip("failover") {
        for t in &targets {
            say(format!("{}: failover", t.name()));
            match failover::measure(
                t,
                &format!("{run}-{}", t.name()),
                settings.failover_releases,
                settings.failover_deaths,
                Duration::from_secs(2),
            )
            .await
            {
                Ok(f) => report.failover.push(f),
                Err(e) => report.errors.push(format!("failover on {}: {e}", t.name())),
            }
        }
    }
    if !skip("shared") {
        for t in &targets {
            say(format!("{}: shared, exclusive and permit", t.name()));
            match shared::measure(
                t,
                &format!("{run}-{}", t.name()),
                settings.shared_iterations,
                settings.shared_counted_iterations,
                settings.shared_handovers,
            )
            .await
            {
                Ok(r) => report.shared.push(r),
                Err(e) => report
                    .errors
                    .push(format!("shared leases on {}: {e}", t.name())),
            }
        }
    }
    if !skip("election") {
        for t in &targets {
            say(format!("{}: election", t.name()));
            match election::measure(
                t,
                &format!("{run}-{}", t.name()),
                settings.election_iterations,
            )
            .await
            {
                Ok(e) => report.election.push(e),
                Err(e) => report.errors.push(format!("election on {}: {e}", t.name())),
            }
        }
    }
    if !skip("scale") {
        let mut counts = settings.scale_leases.clone();
        counts.sort_unstable();
        counts.dedup();
        // Count by count, so each backend's run follows runs of the same
        // size, and after the server has settled from the previous one.
        for &n in &counts {
            for t in targets.iter().filter(|t| {
                matches!(
                    t.name(),
                    "fake" | "etcd" | "etcd-own-leases" | "nats" | "redis"
                )
            }) {
                settle(t.server_pid()).await;
                say(format!("{}: scale, {n} leases", t.name()));
                let ttl = settings
                    .scale_ttl_s
                    .map_or_else(|| scale::ttl_for(n), Duration::from_secs);
                let window = settings
                    .scale_window_s
                    .map_or_else(|| scale::window_for(n), Duration::from_secs);
                match scale::measure(t, &format!("{run}-{}", t.name()), n, ttl, window).await {
                    Ok(s) => report.scale.push(s),
                    Err(e) => report
                        .errors
                        .push(format!("scale on {}, {n} leases: {e}", t.name())),
                }
            }
        }
    }

    report.machine.builds_seen = builds.get().max(sys::builds_running());
    report.machine.load_average_end = sys::load_average();
    report.judge();
    let md = report.markdown();
    let mut failed = !report.errors.is_empty();
    if let Err(e) = std::fs::create_dir_all(&a.out) {
        eprintln!("lease-bench: cannot create {}: {e}", a.out.display());
        return 1;
    }
    let json =
        serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    for (name, body) in [("results.json", json), ("results.md", md.clone())] {
        let p = a.out.join(name);
        if let Err(e) = std::fs::write(&p, body) {
            eprintln!("lease-bench: cannot write {}: {e}", p.display());
            failed = true;
        }
    }
    let png = a.out.join("chart.png");
    if let Err(e) = chart::draw(&report, &png) {
        eprintln!("lease-bench: {e}");
        failed = true;
    }
    if a.is_full() && !a.no_readme && report.errors.is_empty() {
        let readme = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md");
        match readme::update(&readme, &md) {
            Ok(()) => eprintln!("lease-bench: rewrote the results in {}", readme.display()),
            Err(e) => {
                eprintln!("lease-bench: {e}");
                failed = true;
            }
        }
    }
    println!("{md}");
    eprintln!(
        "lease-bench: wrote {}, {} and {}",
        a.out.join("results.md").display(),
        a.out.join("results.json").display(),
        png.display()
    );
    if failed {
        eprintln!("lease-bench: some measurements failed (see Errors above)");
        1
    } else {
        0
    }
}

/// Waits until the server (when it is a process here) has settled from the
/// previous run — its CPU below a tenth of a core over a second (expiring
/// leases, compaction) — for at most 20 s.
async fn settle(pid: Option<u32>) {
    let Some(pid) = pid else { return };
    for _ in 0..20 {
        let a = sys::cpu_of(pid);
        tokio::time::sleep(Duration::from_secs(1)).await;
        match (a, sys::cpu_of(pid)) {
            (Some(a), Some(b)) if b.saturating_sub(a) < Duration::from_millis(100) => return,
            (Some(_), Some(_)) => {}
            _ => return,
        }
    }
}

/// The server's version, where cheap to ask.
async fn version(t: &Target) -> Option<String> {
    match t {
        Target::Etcd { url, .. } => {
            let mut c = etcd_client::Client::connect([url.as_str()], None)
                .await
                .ok()?;
            let s = c.status().await.ok()?;
            Some(format!("etcd {}", s.version()))
        }
        Target::Nats { url, .. } => {
            let c = lease_nats::async_nats::connect(url.as_str()).await.ok()?;
            Some(format!("nats-server {}", c.server_info().version))
        }
        Target::S3 { server } => Some(format!("S3 from {}", server.source)),
        Target::Mongo { .. } => Some("SecantusDB (MongoDB wire protocol)".into()),
        Target::Postgres { url, .. } => {
            let c = targets::pg_session(url).await.ok()?;
            let row = c.query_one("SHOW server_version", &[]).await.ok()?;
            let v: String = row.try_get(0).ok()?;
            Some(format!("PostgreSQL {v}"))
        }
        Target::Redis { url, .. } => {
            let mut c = targets::redis_session(url).await.ok()?;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut c)
                .await
                .ok()?;
            // Valkey reports its own version beside the Redis one it
            // is compatible with.
            ["valkey_version:", "redis_version:"]
                .iter()
                .find_map(|field| {
                    let v = info.lines().find_map(|l| l.strip_prefix(field))?;
                    let name = if field.starts_with("valkey") {
                        "Valkey"
                    } else {
                        "Redis"
                    };
                    Some(format!("{name} {}", v.trim()))
                })
        }
        Target::Fake { .. } => Some("in-process".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole pipeline on the in-process fake: every section measures
    /// something, the report judges it, and the chart is drawn.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fake_end_to_end() {
        let t = Target::start("fake").await.unwrap();
        let run = ops::run_id();
        let o = ops::measure_backend(&t, &run, 20, 5).await.unwrap();
        assert_eq!(
            o.ops.len(),
            ops::LEASE_OPS,
            "no raw baseline on the fake: {o:?}"
        );
        assert!(o
            .ops
            .iter()
            .all(|r| r.latency.n == 20 && r.proxy_requests.is_none()));
        let f = failover::measure(&t, &run, 2, 1, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(f.release_to_grant.n, 2);
        assert!(f.death_to_grant.p50_us >= 0.9e6, "{f:?}");
        // No timing is asserted: only that the group kept its leases.
        let s = scale::measure(
            &t,
            &run,
            200,
            Duration::from_secs(5),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
        assert!(s.renewals >= 100, "{s:?}");
        assert_eq!((s.lost, s.failed_renewals), (0, 0), "{s:?}");
        let sh = shared::measure(&t, &run, 4, 2, 2).await.unwrap();
        assert_eq!(sh.exclusive_after_shared.n, 2, "{sh:?}");
        // Every handover and every change reported (no timing asserted).
        let e = election::measure(&t, &run, 2).await.unwrap();
        assert_eq!(e.handovers, 2, "{e:?}");
        assert_eq!((e.unreported, e.unexpected), (0, 0), "{e:?}");
        assert_eq!((e.lag_proclaim.n, e.lag_new_leader.n), (2, 2), "{e:?}");

        let mut report = Report {
            machine: sys::machine(),
            settings: Settings {
                quick: true,
                iterations: 20,
                counted_iterations: 5,
                failover_releases: 2,
                failover_deaths: 1,
                shared_iterations: 4,
                shared_counted_iterations: 2,
                shared_handovers: 2,
                election_iterations: 2,
                scale_leases: vec![200],
                scale_window_s: Some(1),
                scale_ttl_s: Some(5),
                build: "debug",
            },
            servers: vec![],
            ops: vec![o],
            peers: vec![],
            failover: vec![f],
            shared: vec![sh],
            election: vec![e],
            scale: vec![s],
            targets: vec![],
            errors: vec![],
        };
        report.judge();
        // The election's observer lag and the scale run's renew lag; only
        // the group keeping its leases is asserted (no timing).
        assert_eq!(report.targets.len(), 2, "{:?}", report.targets);
        assert!(
            report.targets[0].target.contains("election observer"),
            "{:?}",
            report.targets
        );
        assert!(report.targets[1].pass, "{:?}", report.targets);
        let md = report.markdown();
        assert!(
            md.contains("| fake | acquire |")
                && md.contains("## Scale")
                && md.contains("## Election")
                && md.contains("| fake | exclusive |")
                && md.contains("## Shared, exclusive and permit leases"),
            "{md}"
        );
        let png = std::env::temp_dir().join(format!("{run}.png"));
        chart::draw(&report, &png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        let _ = std::fs::remove_file(&png);
        assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000);
    }

    /// A report of these operations' results and nothing else.
    fn bare_report(ops: Vec<ops::BackendOps>) -> Report {
        Report {
            machine: sys::machine(),
            settings: Settings {
                quick: true,
                iterations: 0,
                counted_iterations: 0,
                failover_releases: 0,
                failover_deaths: 0,
                shared_iterations: 0,
                shared_counted_iterations: 0,
                shared_handovers: 0,
                election_iterations: 0,
                scale_leases: vec![],
                scale_window_s: None,
                scale_ttl_s: None,
                build: "debug",
            },
            servers: vec![],
            ops,
            peers: vec![],
            failover: vec![],
            shared: vec![],
            election: vec![],
            scale: vec![],
            targets: vec![],
            errors: vec![],
        }
    }

    /// A PostgreSQL column's backend, with one request per operation and
    /// each operation's p50 as given in µs.
    fn pg_ops(backend: &'static str, ops: &[(&'static str, u64)]) -> ops::BackendOps {
        ops::BackendOps {
            backend,
            raw_write: "",
            raw_read: "",
            counter: None,
            ops: ops
                .iter()
                .map(|&(op, us)| ops::OpResult {
                    op,
                    latency: stats::latency(&[Duration::from_micros(us)]),
                    proxy_requests: stats::count(&[1]),
                    counter_requests: None,
                })
                .collect(),
        }
    }

    /// The judged report's row for `target`: whether it passed, and what it
    /// measured.
    fn target_row(report: &Report, target: &str) -> Option<(bool, String)> {
        report
            .targets
            .iter()
            .find(|c| c.target == target)
            .map(|c| (c.pass, c.measured.clone()))
    }

    /// A request count over the target is reported as a miss.
    #[test]
    fn misses_are_reported() {
        let count = |n| stats::count(&[n, n, n]);
        let op = |name, n| ops::OpResult {
            op: name,
            latency: stats::Latency::default(),
            proxy_requests: count(n + 1),
            counter_requests: count(n),
        };
        let mut report = bare_report(vec![
            ops::BackendOps {
                backend: "etcd",
                raw_write: "",
                raw_read: "",
                counter: Some("server"),
                ops: vec![op("acquire", 2), op("release", 1)],
            },
            ops::BackendOps {
                backend: "nats",
                raw_write: "",
                raw_read: "",
                counter: Some("client"),
                ops: vec![op("acquire", 1), op("renew", 2)],
            },
        ]);
        report.judge();
        let verdicts: Vec<(bool, &str)> = report
            .targets
            .iter()
            .map(|c| (c.pass, c.target.as_str()))
            .collect();
        assert_eq!(
            verdicts,
            vec![
                (false, "etcd: acquire sends 1 request"),
                (true, "etcd: release sends 1 request"),
                (false, "nats: renew sends 1 request"),
                (true, "nats: acquire sends 1 request")
            ]
        );
        assert!(report.markdown().contains("**MISSED**"));
        // Nothing measured (every latency empty): the chart says so rather
        // than drawing axes over an empty range (which never returned).
        let png = std::env::temp_dir().join(format!("{}-empty.png", ops::run_id()));
        let (tx, rx) = std::sync::mpsc::channel();
        let p = png.clone();
        std::thread::spawn(move || tx.send(chart::draw(&report, &p)));
        let drawn = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the chart of an empty report is drawn");
        let _ = std::fs::remove_file(&png);
        drawn.unwrap();
    }

    /// A PostgreSQL operation's row shows what it adds to the raw
    /// statement, and, beside the default, the same operation prepared.
    #[test]
    fn postgres_rows_show_the_added_time_and_the_prepared_ratio() {
        let pg = |backend, renew| pg_ops(backend, &[("renew", renew), ("raw write", 166)]);
        let mut report = bare_report(vec![
            pg("postgres", 222),
            pg("postgres-statement-cache", 178),
        ]);
        report.judge();
        let row = |target: &str| target_row(&report, target);
        assert_eq!(
            row("postgres: renew p50 ≤ 1.3× the raw write p50"),
            Some((
                false,
                "1.34× (222 µs vs 166 µs: 56 µs more; prepared (postgres-statement-cache): 1.07×)"
                    .to_string()
            ))
        );
        assert_eq!(
            row("postgres-statement-cache: renew p50 ≤ 1.3× the raw write p50"),
            Some((true, "1.07× (178 µs vs 166 µs: 12 µs more)".to_string()))
        );
    }

    /// The default PostgreSQL read's row splits what the read adds between
    /// its SQL (its call timed on the raw read's session) and the crate's
    /// client path; the prepared column's call is not its own, so its row
    /// has no split.
    #[test]
    fn the_postgres_read_row_splits_the_sql_from_the_client_path() {
        let pg = |backend, read| {
            pg_ops(
                backend,
                &[("read", read), ("raw read", 100), (ops::READ_CALL, 112)],
            )
        };
        let mut report = bare_report(vec![
            pg("postgres", 115),
            pg("postgres-statement-cache", 90),
        ]);
        report.judge();
        let row = |target: &str| target_row(&report, target);
        assert_eq!(
            row("postgres: read p50 ≤ 1.1× the raw read p50"),
            Some((
                false,
                "1.15× (115 µs vs 100 µs: 15 µs more; its call sent on the raw read's session: \
                 1.12× (12 µs more), the rest in lease-postgres's client path (3.0 µs more); \
                 prepared (postgres-statement-cache): 0.90×)"
                    .to_string()
            ))
        );
        assert_eq!(
            row("postgres-statement-cache: read p50 ≤ 1.1× the raw read p50"),
            Some((true, "0.90× (90 µs vs 100 µs: 10 µs less)".to_string()))
        );
    }

    /// The shared section's row in the targets is informational: never a
    /// miss, shown as reported, its ratios to the plain lease's.
    #[test]
    fn shared_rows_are_reported_not_judged() {
        let op = |name, n: u64| ops::OpResult {
            op: name,
            latency: stats::latency(&[Duration::from_millis(n)]),
            proxy_requests: stats::count(&[n]),
            counter_requests: None,
        };
        let counts = [2, 2, 7, 2, 38, 2, 2, 2];
        let sh = shared::SharedResult {
            backend: "etcd",
            counter: None,
            permits: shared::PERMITS,
            ops: shared::OPS
                .iter()
                .zip(counts)
                .map(|(name, n)| op(name, n))
                .collect(),
            watch: true,
            exclusive_after_shared: shared::Handover {
                n: 1,
                p50_us: 2e4,
                p90_us: 2e4,
                max_us: 2e4,
            },
            plain_handover: shared::Handover {
                n: 1,
                p50_us: 1e3,
                p90_us: 1e3,
                max_us: 1e3,
            },
        };
        let mut report = Report {
            machine: sys::machine(),
            settings: Settings {
                quick: true,
                iterations: 0,
                counted_iterations: 0,
                failover_releases: 0,
                failover_deaths: 0,
                shared_iterations: 1,
                shared_counted_iterations: 1,
                shared_handovers: 1,
                election_iterations: 0,
                scale_leases: vec![],
                scale_window_s: None,
                scale_ttl_s: None,
                build: "debug",
            },
            servers: vec![],
            ops: vec![],
            peers: vec![],
            failover: vec![],
            shared: vec![sh],
            election: vec![],
            scale: vec![],
            targets: vec![],
            errors: vec![],
        };
        report.judge();
        assert_eq!(report.targets.len(), 1, "{:?}", report.targets);
        let c = &report.targets[0];
        assert!(c.informational && c.pass, "{c:?}");
        assert!(
            c.measured.contains("shared 9 (2.25×)")
                && c.measured.contains("exclusive 40 (10.00×)")
                && c.measured
                    .contains("(20.00× / 20.00× of the plain handover's"),
            "{c:?}"
        );
        let md = report.markdown();
        assert!(
            md.contains("(reported, no goal) |") && md.contains("| reported |"),
            "{md}"
        );
        assert!(!md.contains("MISSED") && !md.contains("| met |"), "{md}");
        assert!(
            md.contains("| etcd | exclusive | 38 ms |") && md.contains("| 19.00× · 19.00× |"),
            "{md}"
        );
        let json = serde_json::to_string(&report.targets).unwrap();
        assert!(json.contains("\"informational\":true"), "{json}");
    }
}
