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

use lease_testkit::{workspace_root, FAULT_ROWS, FAULT_ROW_PREFIX, REPORT_ENV, SOAK_ENV};

use crate::{cargo, provision, step};

/// A backend of the suite: where its conformance and fault tests live and
/// which server it needs.
struct Backend {
    name: &'static str,
    package: &'static str,
    /// Where its tests may live, newest layout first: the first layout
    /// whose first binary exists is the one run.
    layouts: &'static [Layout],
    /// The modules (matrix columns) its fault runs report under; each must
    /// report every fault row.
    fault_modules: &'static [&'static str],
    /// Test modules (matrix columns) the backend's tests report under.
    modules: &'static [&'static str],
    server: Option<&'static str>,
}

/// One way a backend's tests are laid out: the test binaries of one
/// `cargo test` and the test-name filters given to them.
struct Layout {
    /// Test binaries (`tests/<name>.rs` or `tests/<name>/main.rs`): the
    /// first holds the conformance tests and must exist; the others are
    /// run when they exist.
    binaries: &'static [&'static str],
    /// Test-name filters after `--` (a test runs when its path contains
    /// one); empty: every test of the binaries.
    filters: &'static [&'static str],
    /// The binaries or filters of this layout that run the fault tests.
    faults: &'static [&'static str],
}

/// The backends' tests are moving to one binary per crate,
/// `tests/integration/main.rs` with `conformance` and `faults` modules;
/// until a crate has it, its older targets are run.
const BACKENDS: &[Backend] = &[
    Backend {
        name: "fake",
        package: "lease-conformance",
        layouts: &[Layout {
            binaries: &["suite"],
            filters: &["conformance::", "faults::"],
            faults: &["faults::"],
        }],
        fault_modules: &["fake"],
        modules: &["fake", "fake_whole_seconds"],
        server: None,
    },
    Backend {
        name: "etcd",
        package: "lease-etcd",
        layouts: &[Layout {
            binaries: &["integration"],
            filters: &[
                "conformance::",
                "faults::",
                "sessions::suite::",
                "sessions::fault_runs::",
            ],
            faults: &["faults::", "sessions::fault_runs::"],
        }],
        // Without sessions (`etcd`: every key on an etcd lease of its own)
        // and with them (`etcd_sessions`: lease-etcd's default, one etcd
        // lease shared by a client's keys of one TTL).
        fault_modules: &["etcd", "etcd_sessions"],
        modules: &["etcd", "etcd_sessions"],
        server: Some("etcd"),
    },
    Backend {
        name: "nats",
        package: "lease-nats",
        layouts: &[INTEGRATION],
        fault_modules: &["nats"],
        modules: &["nats"],
        server: Some("nats"),
    },
    Backend {
        name: "s3",
        package: "lease-s3",
        layouts: &[INTEGRATION],
        fault_modules: &["s3_memory", "s3"],
        modules: &["s3_memory", "s3"],
        server: Some("s3"),
    },
    Backend {
        name: "mongo",
        package: "lease-mongo",
        layouts: &[INTEGRATION],
        fault_modules: &["mongo"],
        modules: &["mongo"],
        server: Some("mongo"),
    },
    Backend {
        name: "postgres",
        package: "lease-postgres",
        layouts: &[Layout {
            binaries: &["integration"],
            filters: &[
                "conformance::",
                "faults::",
                "statement_cache::suite::",
                "statement_cache::fault_runs::",
            ],
            faults: &["faults::", "statement_cache::fault_runs::"],
        }],
        // With the statement cache (prepared statements) and without.
        fault_modules: &["postgres", "postgres_statement_cache"],
        modules: &["postgres", "postgres_statement_cache"],
        server: Some("postgres"),
    },
    Backend {
        name: "redis",
        package: "lease-redis",
        layouts: &[INTEGRATION],
        fault_modules: &["redis"],
        modules: &["redis"],
        server: Some("redis"),
    },
];

/// One integration binary with a `conformance` and a `faults` module.
const INTEGRATION: Layout = Layout {
    binaries: &["integration"],
    filters: &["conformance::", "faults::"],
    faults: &["faults::"],
};

impl Backend {
    /// Present = its crate has the conformance binary of one of its layouts.
    fn present(&self) -> bool {
        self.layout().is_some()
    }

    /// The layout its crate has: the first whose conformance binary exists.
    fn layout(&self) -> Option<&'static Layout> {
        self.layouts.iter().find(|l| {
            l.binaries
                .first()
                .is_some_and(|binary| self.has_test(binary))
        })
    }

    /// Whether its crate has the test target `tests/<name>.rs` or
    /// `tests/<name>/main.rs`.
    fn has_test(&self, name: &str) -> bool {
        let dir = workspace_root().join(self.package).join("tests");
        dir.join(format!("{name}.rs")).is_file() || dir.join(name).join("main.rs").is_file()
    }

    /// Whether it has fault tests (then it must report every fault row).
    fn has_fault_tests(&self) -> bool {
        self.layout().is_some_and(|l| {
            l.faults
                .iter()
                .any(|f| l.filters.contains(f) || self.has_test(f))
        })
    }

    /// `cargo test -p <package> --test …` for its conformance and fault
    /// tests, with the layout's filters.
    fn test_args(&self) -> Vec<&'static str> {
        let mut args = vec!["test", "-p", self.package];
        let Some(layout) = self.layout() else {
            return args;
        };
        for binary in layout.binaries {
            if self.has_test(binary) {
                args.extend(["--test", binary]);
            }
        }
        args.push("--no-fail-fast");
        if !layout.filters.is_empty() {
            args.push("--");
            args.extend(layout.filters);
        }
        args
    }
}

/// The names `--backend` accepts, for its error message.
fn known_backends() -> String {
    BACKENDS
        .iter()
        .map(|b| b.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// This run's report directory: one per xtask process, so concurrent runs
/// (a developer's and an editor's, say) never read each other's results.
fn report_dir() -> PathBuf {
    lease_testkit::report_root().join(std::process::id().to_string())
}

/// What `cargo xtask conformance` or `cargo xtask test` was asked for.
struct Args {
    backends: Vec<&'static Backend>,
    /// Whether `--backend` named them (else: every backend present).
    chosen: bool,
    /// `--soak SECS`: every fault run lasts this long (`LEASE_FAULT_SOAK`).
    soak: Option<String>,
    /// Not `--no-lint`.
    lint: bool,
}

fn parse_soak(v: &str) -> Result<String, String> {
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Ok(v.trim().to_string()),
        _ => Err(format!(
            "--soak needs a positive number of seconds, got {v:?}"
        )),
    }
}

/// The arguments of `cargo xtask conformance` (`--backend`, `--soak`) or,
/// when `test`, of `cargo xtask test` (`--backend`, `--no-lint`).
fn parse_args(args: &[String], test: bool) -> Result<Args, String> {
    let usage = if test {
        "cargo xtask test [--no-lint] [--backend NAME,...]"
    } else {
        "cargo xtask conformance [--backend NAME,...] [--soak SECS]"
    };
    let mut names: Vec<String> = Vec::new();
    let mut soak = None;
    let mut lint = true;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let list = match arg.as_str() {
            "--backend" | "--backends" => it
                .next()
                .ok_or_else(|| format!("{arg} needs a value such as fake,etcd"))?
                .clone(),
            "--soak" if !test => {
                let v = it
                    .next()
                    .ok_or("--soak needs a number of seconds, e.g. --soak 600")?;
                soak = Some(parse_soak(v)?);
                continue;
            }
            "--no-lint" if test => {
                lint = false;
                continue;
            }
            a => match (
                a.strip_prefix("--backend=")
                    .or_else(|| a.strip_prefix("--backends=")),
                a.strip_prefix("--soak=").filter(|_| !test),
            ) {
                (Some(v), _) => v.to_string(),
                (_, Some(v)) => {
                    soak = Some(parse_soak(v)?);
                    continue;
                }
                _ => return Err(format!("unknown argument {a:?} (usage: {usage})")),
            },
        };
        names.extend(
            list.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
        );
    }
    let chosen = !names.is_empty();
    let backends = if names.is_empty() {
        BACKENDS.iter().filter(|b| b.present()).collect()
    } else {
        names
            .iter()
            .map(|n| {
                BACKENDS
                    .iter()
                    .find(|b| b.name == n)
                    .ok_or_else(|| format!("unknown backend {n:?} (known: {})", known_backends()))
            })
            .collect::<Result<_, _>>()?
    };
    Ok(Args {
        backends,
        chosen,
        soak,
        lint,
    })
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
/// conformance and fault tests, in one `cargo test` per backend.
pub fn run(args: &[String]) -> Result<(), String> {
    let started = std::time::Instant::now();
    let Args { backends, soak, .. } = parse_args(args, false)?;
    if backends.is_empty() {
        return Err("no backend to test".into());
    }
    let provisioning = std::time::Instant::now();
    let missing = provision_servers(&backends);
    eprintln!(
        "xtask: provision: {:.1}s",
        provisioning.elapsed().as_secs_f64()
    );
    let dir = fresh_report_dir()?;
    let mut failures = Vec::new();
    for b in &backends {
        if missing.contains_key(b.name) {
            continue;
        }
        let mut cmd = cargo();
        cmd.args(b.test_args());
        test_env(&mut cmd, &dir);
        if let Some(secs) = &soak {
            cmd.env(SOAK_ENV, secs);
        }
        if let Err(e) = timed_step(&format!("conformance {}", b.name), &mut cmd) {
            failures.push(e);
        }
    }
    eprintln!(
        "xtask: conformance: {:.1}s in all",
        started.elapsed().as_secs_f64()
    );
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
        "lease-postgres without tls",
        &[
            "-p",
            "lease-postgres",
            "--no-default-features",
            "--all-targets",
        ],
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
            "nats,s3,mongo,postgres,redis",
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
        "lease-fence without features (the in-memory rule alone)",
        &["-p", "lease-fence", "--no-default-features", "--lib"],
    ),
    (
        "lease-fence with object-store alone",
        &["-p", "lease-fence", "--features", "object-store", "--lib"],
    ),
    (
        "lease-fence with http alone",
        &["-p", "lease-fence", "--features", "http", "--lib"],
    ),
    (
        "lease-fence with postgres alone",
        &["-p", "lease-fence", "--features", "postgres", "--lib"],
    ),
    (
        "lease-fence with sqlx alone",
        &["-p", "lease-fence", "--features", "sqlx", "--lib"],
    ),
    (
        "lease-fence with every feature",
        &["-p", "lease-fence", "--all-features", "--all-targets"],
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
        "lease-testkit with containers",
        &[
            "-p",
            "lease-testkit",
            "--features",
            "containers",
            "--all-targets",
        ],
    ),
];

/// `cargo xtask test [--no-lint] [--backend …]`: the README's test
/// command. The format check comes first (it needs no build and no server);
/// `--no-lint` skips it, clippy, the feature builds and rustdoc.
/// `--backend` provisions, tests and shows in the matrix only the backends
/// named: the crates of the other server backends are left out of the
/// test run (the suite's own crate, with the fake, always runs). Each step
/// prints how long it took.
pub fn test(args: &[String]) -> Result<(), String> {
    let Args {
        backends,
        chosen,
        lint,
        ..
    } = parse_args(args, true)?;
    let excluded: Vec<&str> = if chosen {
        BACKENDS
            .iter()
            .filter(|b| b.server.is_some() && !backends.iter().any(|c| c.name == b.name))
            .map(|b| b.package)
            .collect()
    } else {
        Vec::new()
    };
    let started = std::time::Instant::now();
    if lint {
        timed_step("fmt", cargo().args(["fmt", "--all", "--", "--check"]))?;
        let checking = std::time::Instant::now();
        crate::public_docs::check()?;
        crate::circles::check()?;
        eprintln!(
            "xtask: public docs and import circles: {:.1}s",
            checking.elapsed().as_secs_f64()
        );
    }
    let provisioning = std::time::Instant::now();
    let missing = provision_servers(&backends);
    eprintln!(
        "xtask: provision: {:.1}s",
        provisioning.elapsed().as_secs_f64()
    );
    let env = provision::env_for_tests();
    let mut lints = Vec::new();
    if lint {
        let mut clippy = cargo();
        clippy
            .args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])
            .envs(env.iter().map(|(k, v)| (k, v)));
        lints.push(("clippy".to_string(), clippy));
        for (what, features) in FEATURE_BUILDS {
            let mut c = cargo();
            c.arg("clippy")
                .args(*features)
                .args(["--", "-D", "warnings"])
                .envs(env.iter().map(|(k, v)| (k, v)));
            lints.push((format!("clippy ({what})"), c));
        }
        let mut doc = cargo();
        doc.args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings")
            .envs(env.iter().map(|(k, v)| (k, v)));
        lints.push(("doc".to_string(), doc));
    }
    let dir = fresh_report_dir()?;
    let mut failures = Vec::new();
    let selection = |label: &str, args: &[&str]| crate::parallel::Selection {
        label: label.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
    };
    let mut workspace = vec!["--workspace"];
    for package in &excluded {
        workspace.extend(["--exclude", package]);
    }
    let mut selections = vec![
        selection("", &workspace),
        selection(
            "lease-keeper (serde)",
            &["-p", "lease-keeper", "--features", "serde"],
        ),
        // On its own, so the workspace's features do not unify into it: the
        // errors for URLs of backends left out of the build.
        selection("lease (the fake alone)", &["-p", "lease"]),
    ];
    // Its tests need every resource feature, which the workspace run does
    // not turn on (they would be skipped there), and the S3 and PostgreSQL
    // servers.
    if ["s3", "postgres"]
        .iter()
        .all(|s| backends.iter().any(|b| b.name == *s))
    {
        selections.push(selection(
            "lease-fence (every feature)",
            &["-p", "lease-fence", "--all-features"],
        ));
    } else {
        eprintln!("xtask: lease-fence's resource tests need the s3 and postgres backends: not run");
    }
    let jobs = test_jobs()?;
    let mut envs = provision::env_for_tests();
    envs.push((REPORT_ENV.to_string(), dir.display().to_string()));
    let testing = std::time::Instant::now();
    let built = crate::parallel::build(&selections, &envs)?;
    // The lints use the CPU the real-server suites leave idle while they
    // wait on TTLs: they run beside the tests rather than before them (the
    // suites must stand a loaded machine anyway: production machines are).
    let linting = std::thread::spawn(move || run_lints(lints));
    match crate::parallel::run(built, &envs, jobs) {
        Ok(failed) if failed.is_empty() => {}
        Ok(failed) => failures.push(format!("tests failed: {}", failed.join(", "))),
        Err(e) => failures.push(e),
    }
    eprintln!("xtask: tests: {:.1}s", testing.elapsed().as_secs_f64());
    match linting.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => failures.push(e),
        Err(_) => failures.push("the lint thread panicked".into()),
    }
    eprintln!(
        "xtask: test: {:.1}s in all",
        started.elapsed().as_secs_f64()
    );
    finish(&backends, &missing, &dir, failures)
}

/// Runs the lint steps one after another, each one's output printed whole
/// when it ends (so it does not interleave with the tests'), with its time;
/// an error names every step that failed.
fn run_lints(lints: Vec<(String, std::process::Command)>) -> Result<(), String> {
    use std::io::Write as _;
    let mut failed = Vec::new();
    for (name, cmd) in lints {
        let mut cmd = niced(&cmd);
        let start = std::time::Instant::now();
        let out = cmd.output();
        let took = start.elapsed().as_secs_f64();
        let mut stderr = std::io::stderr().lock();
        match out {
            Ok(out) => {
                let _ = stderr.write_all(&out.stdout);
                let _ = stderr.write_all(&out.stderr);
                let ok = out.status.success();
                let _ = writeln!(
                    stderr,
                    "xtask: {name}: {took:.1}s{}",
                    if ok { "" } else { " (failed)" }
                );
                if !ok {
                    failed.push(name);
                }
            }
            Err(e) => {
                let _ = writeln!(stderr, "xtask: {name}: could not run {cmd:?}: {e}");
                failed.push(name);
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("lint failed: {}", failed.join(", ")))
    }
}

/// `cmd` under `nice -n 10`, where `nice` exists: the lints take the CPU
/// the tests leave idle, and the tests' timing does not wait on them.
fn niced(cmd: &std::process::Command) -> std::process::Command {
    let has_nice = std::process::Command::new("nice")
        .arg("true")
        .status()
        .is_ok_and(|s| s.success());
    let mut out = if has_nice {
        let mut n = std::process::Command::new("nice");
        n.args(["-n", "10"]).arg(cmd.get_program());
        n
    } else {
        std::process::Command::new(cmd.get_program())
    };
    out.args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => out.env(k, v),
            None => out.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        out.current_dir(dir);
    }
    out
}

/// How many test binaries run at once: `$LEASE_TEST_JOBS`, by default 3
/// (the real-server suites mostly wait on TTLs, not on the CPU).
fn test_jobs() -> Result<usize, String> {
    match std::env::var("LEASE_TEST_JOBS") {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("LEASE_TEST_JOBS must be a positive number, not {v:?}")),
        Err(_) => Ok(3),
    }
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
    cmd.env(REPORT_ENV, report);
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

fn is_fault_row(row: &str) -> bool {
    row.starts_with(FAULT_ROW_PREFIX)
}

/// Property rows first (alphabetically), then the fault rows in the
/// suite's order ([`FAULT_ROWS`]); others follow alphabetically.
fn ordered_rows<'a>(
    rows: &'a BTreeMap<String, BTreeMap<&str, String>>,
) -> (Vec<&'a String>, Vec<&'a String>) {
    let properties = rows.keys().filter(|r| !is_fault_row(r)).collect();
    let mut faults: Vec<&String> = rows.keys().filter(|r| is_fault_row(r)).collect();
    faults.sort_by_key(|r| {
        let kind = r.strip_prefix(FAULT_ROW_PREFIX).unwrap_or(r);
        (
            FAULT_ROWS
                .iter()
                .position(|k| *k == kind)
                .unwrap_or(FAULT_ROWS.len()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_server_is_one_the_testkit_provisions() {
        for b in BACKENDS {
            if let Some(server) = b.server {
                assert!(
                    lease_testkit::SERVER_BACKENDS.contains(&server),
                    "{}: {server} is not provisioned by lease-testkit",
                    b.name
                );
            }
        }
    }

    #[test]
    fn every_layout_names_a_conformance_binary_and_its_fault_tests() {
        for b in BACKENDS {
            for l in b.layouts {
                assert!(!l.binaries.is_empty(), "{}", b.name);
                for f in l.faults {
                    assert!(
                        l.filters.contains(f) || l.binaries.contains(f),
                        "{}: {f} is neither a filter nor a binary of its layout",
                        b.name
                    );
                }
            }
        }
    }

    #[test]
    fn the_backends_present_here_use_their_newest_layout() {
        for b in BACKENDS {
            let newest = b.layouts.first().and_then(|l| l.binaries.first());
            assert!(
                newest.is_some_and(|binary| b.has_test(binary)),
                "{}: no tests/{newest:?}",
                b.name
            );
        }
    }
}
