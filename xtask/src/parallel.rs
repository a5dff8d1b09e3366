//! The workspace's test binaries, built once and run several at a time.
//!
//! The real-server suites spend most of their time waiting on TTLs, not on
//! the CPU: one `cargo test --workspace` runs them one binary after another
//! and leaves a 2-core machine mostly idle. Here every test binary (and the
//! doctests, as one more job) runs as its own job, up to `jobs` at once,
//! each with what `cargo test` gives it (its package's directory and
//! `CARGO_*` variables). A job's output is printed whole when it ends, so
//! runs never interleave, and every job's time is printed.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::cargo;

/// One test binary to run.
#[derive(Debug, Clone)]
struct Job {
    /// `package/target` (e.g. `lease-etcd/integration`).
    name: String,
    /// What to run.
    program: PathBuf,
    /// Its arguments.
    args: Vec<String>,
    /// The package's directory (`cargo test` runs binaries there).
    dir: PathBuf,
    /// The package's name.
    package: String,
}

/// One `cargo test` selection: its arguments after `test` (packages,
/// features), and a label for its jobs (empty for the workspace run).
#[derive(Debug, Clone)]
pub struct Selection {
    /// Shown before the names of its jobs, e.g. `lease-fence (every feature)`.
    pub label: String,
    /// The arguments after `cargo test`.
    pub args: Vec<String>,
}

/// The jobs of a test run, built and ready: [`build`] makes them, [`run`]
/// runs them.
#[derive(Debug)]
pub struct Built {
    queue: VecDeque<Job>,
}

/// Builds the test targets of every selection (one after another: each
/// build uses both cores): their binaries, longest first, then each
/// selection's doctests as one more job each. A binary two selections share
/// is one job.
///
/// # Errors
/// When a build fails or its output cannot be read.
pub fn build(selections: &[Selection], envs: &[(String, String)]) -> Result<Built, String> {
    let built = Instant::now();
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut docs = Vec::new();
    for sel in selections {
        let mut build = cargo();
        build
            .arg("test")
            .args(&sel.args)
            .args(["--no-run", "--message-format=json-render-diagnostics"]);
        build.envs(envs.iter().map(|(k, v)| (k, v)));
        eprintln!("xtask: tests: building: {build:?}");
        let out = build
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("tests: could not run {build:?}: {e}"))?;
        if !out.status.success() {
            return Err(format!("tests: the build failed ({})", out.status));
        }
        for mut job in jobs_from(&out.stdout)? {
            if queue.iter().any(|j| j.program == job.program) {
                continue;
            }
            if !sel.label.is_empty() {
                job.name = format!("{} {}", sel.label, job.name);
            }
            queue.push_back(job);
        }
        let mut doc = cargo();
        doc.arg("test").args(&sel.args).arg("--doc");
        docs.push(Job {
            name: if sel.label.is_empty() {
                "doctests".into()
            } else {
                format!("{} doctests", sel.label)
            },
            program: PathBuf::from(doc.get_program()),
            args: doc
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            dir: lease_testkit::workspace_root(),
            package: String::new(),
        });
    }
    eprintln!(
        "xtask: tests: built {} test binaries in {:.1}s",
        queue.len(),
        built.elapsed().as_secs_f64()
    );
    // The longest first (by name: the real-server suites), so the run does
    // not end on one long job alone.
    queue.make_contiguous().sort_by_key(weight);
    queue.extend(docs);
    Ok(Built { queue })
}

/// Runs the built jobs, `jobs` at a time, with `envs` set. Returns the
/// names of the jobs that failed.
///
/// # Errors
/// When a worker thread panicked.
pub fn run(built: Built, envs: &[(String, String)], jobs: usize) -> Result<Vec<String>, String> {
    eprintln!(
        "xtask: tests: running {} jobs, {jobs} at a time",
        built.queue.len()
    );
    let queue = Arc::new(Mutex::new(built.queue));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let print = Arc::new(Mutex::new(()));
    let workers: Vec<_> = (0..jobs.max(1))
        .map(|_| {
            let (queue, failed, print) = (queue.clone(), failed.clone(), print.clone());
            let envs = envs.to_vec();
            std::thread::spawn(move || loop {
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                let Some(job) = next else { return };
                let started = Instant::now();
                let result = run_job(&job, &envs);
                let took = started.elapsed().as_secs_f64();
                let _turn = print.lock().unwrap_or_else(|p| p.into_inner());
                match result {
                    Ok(out) => {
                        print_output(&out);
                        let ok = out.status.success();
                        eprintln!(
                            "xtask: tests: {}: {took:.1}s{}",
                            job.name,
                            if ok { "" } else { " (failed)" }
                        );
                        if !ok {
                            failed
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(job.name.clone());
                        }
                    }
                    Err(e) => {
                        eprintln!("xtask: tests: {}: could not run: {e}", job.name);
                        failed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(job.name.clone());
                    }
                }
            })
        })
        .collect();
    for w in workers {
        if w.join().is_err() {
            return Err("tests: a worker thread panicked".into());
        }
    }
    let failed = failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(failed)
}

/// The order jobs start in: the suites that wait longest first.
fn weight(job: &Job) -> u8 {
    const LONG: [&str; 9] = [
        "lease-s3/",
        "lease-cli/",
        "lease-etcd/",
        "lease-conformance/",
        "lease-postgres/",
        "lease-nats/",
        "lease-redis/",
        "lease-mongo/",
        "lease-fence/",
    ];
    LONG.iter()
        .position(|p| job.name.contains(p) && !job.name.ends_with("/lib"))
        .map_or(u8::MAX, |i| i as u8)
}

fn run_job(job: &Job, envs: &[(String, String)]) -> std::io::Result<Output> {
    let mut cmd = Command::new(&job.program);
    cmd.args(&job.args)
        .current_dir(&job.dir)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    if !job.package.is_empty() {
        cmd.env("CARGO_MANIFEST_DIR", &job.dir)
            .env("CARGO_PKG_NAME", &job.package);
    }
    cmd.output()
}

fn print_output(out: &Output) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&out.stdout);
    let _ = stdout.flush();
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(&out.stderr);
    let _ = stderr.flush();
}

/// The test binaries in `cargo test --no-run --message-format=json` output.
fn jobs_from(stdout: &[u8]) -> Result<VecDeque<Job>, String> {
    let mut jobs = VecDeque::new();
    for line in stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_slice(line)
            .map_err(|e| format!("tests: unreadable cargo output line: {e}"))?;
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let (Some(exe), Some(manifest), Some(target)) = (
            v["executable"].as_str(),
            v["manifest_path"].as_str(),
            v["target"]["name"].as_str(),
        ) else {
            continue;
        };
        let dir = Path::new(manifest)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let package = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let kind = v["target"]["kind"][0].as_str().unwrap_or("");
        let label = if kind == "lib" { "lib" } else { target };
        jobs.push_back(Job {
            name: format!("{package}/{label}"),
            program: PathBuf::from(exe),
            args: Vec::new(),
            dir,
            package,
        });
    }
    Ok(jobs)
}
