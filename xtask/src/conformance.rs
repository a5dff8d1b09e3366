//! The conformance run and its backend × property matrix.
//!
//! Each conformance test writes its status to
//! `target/conformance-report/<module>/<property>` (see `lease-conformance`'s
//! runner); the matrix is read from there, so it shows exactly what ran —
//! and a requested backend that did not run shows as a failure.
//!
//! The same run executes each backend's fault tests (`faults::run` under
//! every fault kind, see `lease-conformance/src/faults/mod.rs`), which write
//! `fault_<kind>` files beside the properties: the matrix shows them as a
//! second block of rows, and every backend must report every fault row
//! (pass, or n/a with a reason).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::{cargo, provision, step, workspace_root};

/// A backend of the suite: where its conformance tests live and which
/// server it needs.
struct Backend {
    name: &'static str,
    package: &'static str,
    test: &'static str,
    /// Its fault-run test targets (reporting `fault_<kind>` rows).
    fault_tests: &'static [&'static str],
    /// The modules (matrix columns) those fault runs report under; each
    /// must report every fault row.
    fault_modules: &'static [&'static str],
    /// Test modules (matrix columns) the backend's tests report under.
    modules: &'static [&'static str],
    server: Option<&'static str>,
}

const BACKENDS: &[Backend] = &[
    Backend {
        name: "fake",
        package: "lease-conformance",
        test: "fake",
        fault_tests: &["faults_fake"],
        fault_modules: &["fake"],
        modules: &["fake", "fake_whole_seconds"],
        server: None,
    },
    Backend {
        name: "etcd",
        package: "lease-etcd",
        test: "conformance",
        fault_tests: &["faults"],
        fault_modules: &["etcd"],
        modules: &["etcd"],
        server: Some("etcd"),
    },
    Backend {
        name: "nats",
        package: "lease-nats",
        test: "conformance",
        fault_tests: &["faults"],
        fault_modules: &["nats"],
        modules: &["nats"],
        server: Some("nats"),
    },
    Backend {
        name: "s3",
        package: "lease-s3",
        test: "conformance",
        fault_tests: &["faults", "fault_runs"],
        fault_modules: &["s3_memory", "s3"],
        modules: &["s3_memory", "s3"],
        server: Some("s3"),
    },
    Backend {
        name: "mongo",
        package: "lease-mongo",
        test: "conformance",
        fault_tests: &["faults"],
        fault_modules: &["mongo"],
        modules: &["mongo"],
        server: Some("mongo"),
    },
];

impl Backend {
    /// Present = its crate has a conformance test target.
    fn present(&self) -> bool {
        self.has_test(self.test)
    }

    /// Whether its crate has the test target `tests/<name>.rs`.
    fn has_test(&self, name: &str) -> bool {
        let dir = workspace_root().join(self.package).join("tests");
        dir.join(format!("{name}.rs")).is_file()
    }

    /// Whether it has fault-run targets (then it must report every fault row).
    fn has_fault_tests(&self) -> bool {
        self.fault_tests.iter().any(|t| self.has_test(t))
    }
}

/// This run's report directory: one per xtask process, so concurrent runs
/// (a developer's and an editor's, say) never read each other's results.
fn report_dir() -> PathBuf {
    workspace_root()
        .join("target")
        .join("conformance-report")
        .join(std::process::id().to_string())
}

/// What `cargo xtask conformance` was asked for.
struct Args {
    backends: Vec<&'static Backend>,
    /// `--soak SECS`: every fault run lasts this long (`LEASE_FAULT_SOAK`).
    soak: Option<String>,
}

/// The fault runs' soak variable (kept in one place with
/// `lease_conformance::faults::SOAK_ENV`, which has the same value).
const SOAK_ENV: &str = "LEASE_FAULT_SOAK";

fn parse_soak(v: &str) -> Result<String, String> {
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Ok(v.trim().to_string()),
        _ => Err(format!(
            "--soak needs a positive number of seconds, got {v:?}"
        )),
    }
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut names: Vec<String> = Vec::new();
    let mut soak = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let list = match arg.as_str() {
            "--backend" | "--backends" => it
                .next()
                .ok_or_else(|| format!("{arg} needs a value such as fake,etcd"))?
                .clone(),
            "--soak" => {
                let v = it
                    .next()
                    .ok_or("--soak needs a number of seconds, e.g. --soak 600")?;
                soak = Some(parse_soak(v)?);
                continue;
            }
            a => match (a.strip_prefix("--backend="), a.strip_prefix("--soak=")) {
                (Some(v), _) => v.to_string(),
                (_, Some(v)) => {
                    soak = Some(parse_soak(v)?);
                    continue;
                }
                _ => {
                    return Err(format!(
                        "unknown argument {a:?} (usage: cargo xtask conformance \
                         [--backend NAME,...] [--soak SECS])"
                    ))
                }
            },
        };
        names.extend(
            list.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
        );
    }
    let backends = if names.is_empty() {
        BACKENDS.iter().filter(|b| b.present()).collect()
    } else {
        names
            .iter()
            .map(|n| {
                BACKENDS.iter().find(|b| b.name == n).ok_or_else(|| {
                    format!("unknown backend {n:?} (known: fake, etcd, nats, s3, mongo)")
                })
            })
            .collect::<Result<_, _>>()?
    };
    Ok(Args { backends, soak })
}

/// Provisions each backend's server; returns the ones that could not be had.
fn provision_servers(backends: &[&Backend]) -> BTreeMap<&'static str, String> {
    let mut missing = BTreeMap::new();
    if let Err(e) = provision::ensure(&["protoc"]) {
        eprintln!("xtask: protoc: {e}");
    }
    for b in backends {
        if let Some(server) = b.server {
            if let Err(e) = provision::ensure(&[server]) {
                missing.insert(b.name, e);
            }
        }
    }
    missing
}

fn fresh_report_dir() -> Result<PathBuf, String> {
    let dir = report_dir();
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("clear {}: {e}", dir.display()))?;
    }
    fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// `cargo xtask conformance [--backend …] [--soak SECS]`: each backend's
/// conformance target and fault-run targets, in one `cargo test` per backend.
pub fn run(args: &[String]) -> Result<(), String> {
    let Args { backends, soak } = parse_args(args)?;
    if backends.is_empty() {
        return Err("no backend to test".into());
    }
    let missing = provision_servers(&backends);
    let dir = fresh_report_dir()?;
    let mut failures = Vec::new();
    for b in &backends {
        if missing.contains_key(b.name) {
            continue;
        }
        let mut cmd = cargo();
        cmd.args(["test", "-p", b.package, "--test", b.test]);
        for t in b.fault_tests {
            if b.has_test(t) {
                cmd.args(["--test", t]);
            }
        }
        cmd.arg("--no-fail-fast");
        test_env(&mut cmd, &dir);
        if let Some(secs) = &soak {
            cmd.env(SOAK_ENV, secs);
        }
        if let Err(e) = step(&format!("conformance {}", b.name), &mut cmd) {
            failures.push(e);
        }
    }
    finish(&backends, &missing, &dir, failures)
}

/// Builds of feature sets other than the defaults, each linted like the
/// default build (clippy `-D warnings`), so a feature that is never built
/// cannot rot: `(what, cargo clippy arguments)`.
const FEATURE_BUILDS: &[(&str, &[&str])] = &[
    (
        "lease-keeper with serde",
        &["-p", "lease-keeper", "--features", "serde", "--all-targets"],
    ),
    (
        "lease-etcd without tls",
        &["-p", "lease-etcd", "--no-default-features", "--all-targets"],
    ),
    (
        "lease-s3 without its S3 client",
        &["-p", "lease-s3", "--no-default-features", "--lib"],
    ),
    (
        "lease-cli without etcd (no protoc)",
        &[
            "-p",
            "lease-cli",
            "--no-default-features",
            "--features",
            "nats,s3,mongo",
            "--bins",
        ],
    ),
    (
        "lease-cli with etcd alone",
        &[
            "-p",
            "lease-cli",
            "--no-default-features",
            "--features",
            "etcd",
            "--bins",
        ],
    ),
    (
        "lease without features (no backend, no fake)",
        &["-p", "lease", "--no-default-features", "--all-targets"],
    ),
    (
        "lease with every feature",
        &["-p", "lease", "--all-features", "--all-targets"],
    ),
    (
        "lease-conformance with containers",
        &[
            "-p",
            "lease-conformance",
            "--features",
            "containers",
            "--lib",
        ],
    ),
];

/// `cargo xtask test [--no-lint]`: the README's test command. The format
/// check comes first (it needs no build and no server); `--no-lint` skips
/// it, clippy, the feature builds and rustdoc. Each step prints how long it
/// took.
pub fn test(args: &[String]) -> Result<(), String> {
    let lint = match args {
        [] => true,
        [flag] if flag == "--no-lint" => false,
        _ => {
            return Err(format!(
                "`cargo xtask test` takes only --no-lint, got {args:?}"
            ))
        }
    };
    let started = std::time::Instant::now();
    if lint {
        timed_step("fmt", cargo().args(["fmt", "--all", "--", "--check"]))?;
    }
    let backends: Vec<&Backend> = BACKENDS.iter().filter(|b| b.present()).collect();
    let provisioning = std::time::Instant::now();
    let missing = provision_servers(&backends);
    eprintln!(
        "xtask: provision: {:.1}s",
        provisioning.elapsed().as_secs_f64()
    );
    let env = provision::env_for_tests();
    if lint {
        timed_step(
            "clippy",
            cargo()
                .args([
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ])
                .envs(env.iter().map(|(k, v)| (k, v))),
        )?;
        for (what, features) in FEATURE_BUILDS {
            timed_step(
                &format!("clippy ({what})"),
                cargo()
                    .arg("clippy")
                    .args(*features)
                    .args(["--", "-D", "warnings"])
                    .envs(env.iter().map(|(k, v)| (k, v))),
            )?;
        }
        timed_step(
            "doc",
            cargo()
                .args(["doc", "--workspace", "--no-deps"])
                .env("RUSTDOCFLAGS", "-D warnings")
                .envs(env.iter().map(|(k, v)| (k, v))),
        )?;
    }
    let dir = fresh_report_dir()?;
    let mut failures = Vec::new();
    let mut serde = cargo();
    serde.args(["test", "-p", "lease-keeper", "--features", "serde"]);
    test_env(&mut serde, &dir);
    if let Err(e) = timed_step("tests (lease-keeper with serde)", &mut serde) {
        failures.push(e);
    }
    // On its own, so the workspace's features do not unify into it: the
    // errors for URLs of backends left out of the build.
    let mut facade = cargo();
    facade.args(["test", "-p", "lease"]);
    test_env(&mut facade, &dir);
    if let Err(e) = timed_step("tests (lease with the fake alone)", &mut facade) {
        failures.push(e);
    }
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--no-fail-fast"]);
    test_env(&mut cmd, &dir);
    if let Err(e) = timed_step("tests", &mut cmd) {
        failures.push(e);
    }
    eprintln!(
        "xtask: test: {:.1}s in all",
        started.elapsed().as_secs_f64()
    );
    finish(&backends, &missing, &dir, failures)
}

/// [`step`], then how long it took.
fn timed_step(name: &str, cmd: &mut std::process::Command) -> Result<(), String> {
    let start = std::time::Instant::now();
    let result = step(name, cmd);
    eprintln!(
        "xtask: {name}: {:.1}s{}",
        start.elapsed().as_secs_f64(),
        if result.is_ok() { "" } else { " (failed)" }
    );
    result
}

fn test_env(cmd: &mut std::process::Command, report: &Path) {
    cmd.envs(provision::env_for_tests());
    cmd.env(lease_report_env(), report);
}

/// Kept in one place with the runner's constant of the same value.
fn lease_report_env() -> &'static str {
    "LEASE_REPORT_DIR"
}

/// Prints the matrix and decides the exit: any failed property, any
/// requested backend that was skipped or did not report, any failed step.
fn finish(
    backends: &[&Backend],
    missing: &BTreeMap<&'static str, String>,
    dir: &Path,
    mut failures: Vec<String>,
) -> Result<(), String> {
    let mut columns: Vec<&str> = Vec::new();
    let mut rows: BTreeMap<String, BTreeMap<&str, String>> = BTreeMap::new();
    for b in backends {
        for m in b.modules {
            columns.push(m);
            if let Some(reason) = missing.get(b.name) {
                failures.push(format!("{m}: SKIPPED, server unavailable: {reason}"));
                continue;
            }
            let Ok(entries) = fs::read_dir(dir.join(m)) else {
                failures.push(format!(
                    "{m}: no property reported (did its tests build and run?)"
                ));
                continue;
            };
            for e in entries.flatten() {
                let property = e.file_name().to_string_lossy().into_owned();
                let line = fs::read_to_string(e.path()).unwrap_or_default();
                if line.starts_with("fail") || line.starts_with("skipped") {
                    failures.push(format!("{m}::{property}: {line}"));
                }
                rows.entry(property).or_default().insert(m, line);
            }
        }
    }
    // Every backend whose fault tests ran reports every fault row any
    // backend reported: a kind it cannot inject is "n/a" with a reason,
    // never a silent gap.
    for b in backends {
        if missing.contains_key(b.name) || !b.has_fault_tests() {
            continue;
        }
        for (row, cells) in rows.iter().filter(|(r, _)| is_fault_row(r)) {
            for m in b.fault_modules {
                if !cells.contains_key(m) {
                    failures.push(format!(
                        "{m}::{row}: not reported by its fault tests (did they run?)"
                    ));
                }
            }
        }
    }
    print_matrix(&columns, &rows, missing, backends);
    let (mut pass, mut fail, mut other) = (0, 0, 0);
    for cells in rows.values() {
        for line in cells.values() {
            match line.split(':').next().unwrap_or("") {
                "pass" => pass += 1,
                "fail" => fail += 1,
                _ => other += 1,
            }
        }
    }
    println!("\nconformance: {pass} passed, {fail} failed, {other} not applicable or skipped");
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("conformance failed:\n  {}", failures.join("\n  ")))
    }
}

/// The fault kinds in the order the matrix lists them (see
/// `lease_conformance::faults::FaultKind`); others follow alphabetically.
const FAULT_ORDER: &[&str] = &[
    "fault_none",
    "fault_lost_responses",
    "fault_failed_requests",
    "fault_latency",
    "fault_paused_holders",
    "fault_clock_jumps_small",
    "fault_clock_jumps_large",
    "fault_sever",
    "fault_blackhole",
    "fault_server_pause",
    "fault_server_restart",
];

fn is_fault_row(row: &str) -> bool {
    row.starts_with("fault_")
}

/// Property rows first (alphabetically), then the fault rows in
/// [`FAULT_ORDER`].
fn ordered_rows<'a>(
    rows: &'a BTreeMap<String, BTreeMap<&str, String>>,
) -> (Vec<&'a String>, Vec<&'a String>) {
    let properties = rows.keys().filter(|r| !is_fault_row(r)).collect();
    let mut faults: Vec<&String> = rows.keys().filter(|r| is_fault_row(r)).collect();
    faults.sort_by_key(|r| {
        (
            FAULT_ORDER
                .iter()
                .position(|k| k == r)
                .unwrap_or(FAULT_ORDER.len()),
            r.to_string(),
        )
    });
    (properties, faults)
}

fn print_matrix(
    columns: &[&str],
    rows: &BTreeMap<String, BTreeMap<&str, String>>,
    missing: &BTreeMap<&'static str, String>,
    backends: &[&Backend],
) {
    let width = rows.keys().map(String::len).max().unwrap_or(8).max(8);
    let mut header = format!("\n{:width$}", "property");
    let widths: Vec<usize> = columns.iter().map(|c| c.len().max(7)).collect();
    for (c, w) in columns.iter().zip(&widths) {
        header.push_str(&format!(" | {c:^w$}"));
    }
    println!("{header}");
    println!("{}", "-".repeat(header.len()));
    let (properties, faults) = ordered_rows(rows);
    let print_row = |property: &String| {
        let cells = &rows[property];
        let mut line = format!("{property:width$}");
        for (c, w) in columns.iter().zip(&widths) {
            let cell = match cells.get(c).map(|l| l.split(':').next().unwrap_or("")) {
                Some("pass") => "pass",
                Some("fail") => "FAIL",
                Some("n/a") => "n/a",
                Some("skipped") => "SKIPPED",
                _ => "-",
            };
            line.push_str(&format!(" | {cell:^w$}"));
        }
        println!("{line}");
    };
    properties.into_iter().for_each(print_row);
    if !faults.is_empty() {
        let title = format!("{:width$}", "faults (faults::run, one row per kind)");
        println!("{}", "-".repeat(header.len()));
        println!("{title}");
        println!("{}", "-".repeat(header.len()));
        faults.into_iter().for_each(print_row);
    }
    for b in backends {
        if let Some(reason) = missing.get(b.name) {
            println!("{}: SKIPPED, server unavailable: {reason}", b.name);
        }
    }
    for (property, cells) in rows {
        for (c, line) in cells {
            if !line.starts_with("pass") {
                println!("{c}::{property}: {line}");
            }
        }
    }
}
