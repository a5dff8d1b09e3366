//! End-to-end tests: the built `lease` binary against each backend's real
//! test server (started by lease-testkit's launchers, or given by the
//! `LEASE_TEST_*` environment variables).
//!
//! A backend whose server cannot be had fails its tests, unless it is named
//! in `LEASE_TEST_SKIP` (then the test says so loudly and returns).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) const LEASE: &str = env!("CARGO_BIN_EXE_lease");
pub(crate) const EXIT_USAGE: i32 = 2;
const EXIT_BACKEND: i32 = 69;
pub(crate) const EXIT_NOT_ACQUIRED: i32 = 75;
pub(crate) const EXIT_LOST: i32 = 76;

/// One backend as the CLI sees it: a URL and the environment it needs.
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) url: String,
    env: Vec<(String, String)>,
}

/// The backend's test server, or `None` when it is unavailable and may be
/// skipped; panics (failing the test) when it is unavailable otherwise.
pub(crate) fn backend(name: &'static str) -> Option<Backend> {
    use lease_testkit::servers;
    let got: Result<Backend, servers::Unavailable> = match name {
        "etcd" => servers::etcd().map(|s| etcd_at(name, s)),
        "nats" => servers::nats().map(|s| nats_at(name, s)),
        "mongo" => servers::mongo().map(|s| mongo_at(name, s)),
        "postgres" => servers::postgres().map(|s| postgres_at(name, &s.url)),
        "redis" => servers::redis().map(|s| redis_at(name, &s.url)),
        "s3" => servers::s3().map(|s| s3_at(name, s)),
        other => panic!("no such backend {other}"),
    };
    available(name, got)
}

/// A private server of the backend's, which a test may pause, and the
/// backend on it (`None` as for [`backend`]).
fn private(name: &'static str) -> Option<(Backend, Private)> {
    use lease_testkit::servers;
    let got = match name {
        "etcd" => servers::spawn_etcd(None).map(|s| (etcd_at(name, &s), Private::Etcd(s))),
        "nats" => servers::spawn_nats(None).map(|s| (nats_at(name, &s), Private::Nats(s))),
        "mongo" => servers::spawn_mongo(None).map(|s| (mongo_at(name, &s), Private::Mongo(s))),
        "postgres" => {
            servers::spawn_postgres(None).map(|s| (postgres_at(name, &s.url), Private::Postgres(s)))
        }
        "redis" => servers::spawn_redis(None).map(|s| (redis_at(name, &s.url), Private::Redis(s))),
        "s3" => servers::spawn_s3().map(|s| (s3_at(name, &s), Private::S3(s))),
        other => panic!("no such backend {other}"),
    };
    available(name, got)
}

/// A private test server, stopped on drop.
enum Private {
    Etcd(lease_testkit::servers::Etcd),
    Nats(lease_testkit::servers::Nats),
    Mongo(lease_testkit::servers::Mongo),
    S3(lease_testkit::servers::S3),
    Postgres(lease_testkit::servers::Postgres),
    Redis(lease_testkit::servers::Redis),
}

impl Private {
    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    fn pause(&self) {
        match self {
            Private::Etcd(s) => s.pause(),
            Private::Nats(s) => s.pause(),
            Private::Mongo(s) => s.pause(),
            Private::S3(s) => s.pause(),
            Private::Postgres(s) => s.pause(),
            Private::Redis(s) => s.pause(),
        }
        .expect("pause the server");
    }

    fn resume(&self) {
        match self {
            Private::Etcd(s) => s.resume(),
            Private::Nats(s) => s.resume(),
            Private::Mongo(s) => s.resume(),
            Private::S3(s) => s.resume(),
            Private::Postgres(s) => s.resume(),
            Private::Redis(s) => s.resume(),
        }
        .expect("resume the server");
    }
}

fn available<T>(name: &str, got: Result<T, lease_testkit::servers::Unavailable>) -> Option<T> {
    match got {
        Ok(b) => Some(b),
        Err(e) if lease_testkit::skip_allowed(name) => {
            eprintln!("SKIPPED ({name} in LEASE_TEST_SKIP): {e}");
            None
        }
        Err(e) => panic!(
            "{e} (run `cargo xtask provision`, or set LEASE_TEST_SKIP={name} to skip it explicitly)"
        ),
    }
}

fn etcd_at(name: &'static str, s: &lease_testkit::servers::Etcd) -> Backend {
    Backend {
        name,
        url: format!(
            "etcd://{}/lease-cli-e2e",
            s.endpoints
                .iter()
                .map(|e| e.trim_start_matches("http://").to_owned())
                .collect::<Vec<_>>()
                .join(",")
        ),
        env: vec![],
    }
}

fn nats_at(name: &'static str, s: &lease_testkit::servers::Nats) -> Backend {
    Backend {
        name,
        url: format!("{}/lease_cli_e2e?create=true", s.url.trim_end_matches('/')),
        env: vec![],
    }
}

fn postgres_at(name: &'static str, url: &str) -> Backend {
    // The server's own URL, with a table for these tests.
    let sep = if url.contains('?') { '&' } else { '?' };
    Backend {
        name,
        url: format!("{url}{sep}table=lease_cli_e2e"),
        env: vec![],
    }
}

fn redis_at(name: &'static str, url: &str) -> Backend {
    // The server's own URL, with a key prefix for these tests.
    let sep = if url.contains('?') { '&' } else { '?' };
    Backend {
        name,
        url: format!("{url}{sep}prefix=lease-cli-e2e:"),
        env: vec![],
    }
}

fn mongo_at(name: &'static str, s: &lease_testkit::servers::Mongo) -> Backend {
    // mongodb://host:port/?opts → mongodb://host:port/db?opts&collection=…
    let (base, query) = match s.uri.split_once('?') {
        Some((b, q)) => (b.to_owned(), format!("{q}&")),
        None => (s.uri.clone(), String::new()),
    };
    let authority = base
        .trim_start_matches("mongodb://")
        .split('/')
        .next()
        .unwrap_or("")
        .to_owned();
    Backend {
        name,
        url: format!("mongodb://{authority}/lease_cli_e2e?{query}collection=leases"),
        env: vec![],
    }
}

fn s3_at(name: &'static str, s: &lease_testkit::servers::S3) -> Backend {
    Backend {
        name,
        url: format!(
            "s3://{}/lease-cli-e2e?endpoint={}&region={}",
            s.bucket, s.endpoint, s.region
        ),
        env: vec![
            ("AWS_ACCESS_KEY_ID".into(), s.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY".into(), s.secret_key.clone()),
        ],
    }
}

/// A fresh key and scratch directory for one test.
pub(crate) fn fresh(test: &str) -> (String, PathBuf) {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let key = format!("e2e/{test}-{}-{nanos}-{n}", std::process::id());
    let dir = std::env::temp_dir().join(format!("lease-cli-{test}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    (key, dir)
}

impl Backend {
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(LEASE);
        c.args(args).stdin(Stdio::null());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    pub(crate) fn output(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run lease")
    }

    pub(crate) fn spawn(&self, args: &[&str], log: &Path) -> Proc {
        let err = std::fs::File::create(log).expect("log file");
        let child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("spawn lease");
        Proc {
            child,
            log: log.to_owned(),
        }
    }

    /// `lease status --json`, its exit code checked against the state it
    /// printed (0 held, 1 free).
    fn status_json(&self, key: &str) -> Value {
        let out = self.output(&["status", &self.url, key, "--json"]);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{}: status failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "status --json printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        let expected = if v["state"] == "held" { 0 } else { 1 };
        assert_eq!(out.status.code(), Some(expected), "{}: {v}", self.name);
        v
    }
}

/// A `lease` process, killed on drop.
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Proc {
    pub(crate) fn wait_timeout(&mut self, limit: Duration) -> Option<i32> {
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return Some(s.code().unwrap_or(-1));
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn wait_for_file(path: &Path, limit: Duration, what: &str) -> String {
    let end = Instant::now() + limit;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s.trim().to_owned();
            }
        }
        assert!(
            Instant::now() < end,
            "{what}: {} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sh(script: &str) -> String {
    script.to_owned()
}

/// Two `lease run` on one key: the first runs, a `--wait 0` attempt fails
/// with 75, the second waits and runs only after the first exited, with a
/// higher fence; both see LEASE_KEY, LEASE_FENCE and LEASE_HOLDER.
fn two_runs_take_turns(b: &Backend) {
    let (key, dir) = fresh(&format!("turns-{}", b.name));
    let log = dir.join("log");
    let go = dir.join("go");
    // Each run appends start/end lines; the first waits for `go`.
    let script = |who: &str, wait_go: bool| {
        sh(&format!(
            "echo \"{who} $LEASE_KEY $LEASE_FENCE $LEASE_HOLDER\" > {d}/{who}.env; echo {who}-start >> {log}; {wait} sleep 0.3; echo {who}-end >> {log}",
            d = dir.display(),
            log = log.display(),
            wait = if wait_go {
                format!("while [ ! -f {} ]; do sleep 0.05; done;", go.display())
            } else {
                String::new()
            }
        ))
    };
    let (sa, sb) = (script("a", true), script("b", false));
    let mut a = b.spawn(
        &[
            "run", &b.url, &key, "--ttl", "2s", "--holder", "alice", "--", "sh", "-c", &sa,
        ],
        &dir.join("a.err"),
    );
    let a_env = wait_for_file(&dir.join("a.env"), Duration::from_secs(20), "first run");
    let mut bproc = b.spawn(
        &[
            "run", &b.url, &key, "--ttl", "2s", "--wait", "30s", "--holder", "bob", "--", "sh",
            "-c", &sb,
        ],
        &dir.join("b.err"),
    );
    // A third, not waiting, is refused with 75 and one line on stderr.
    let c = b.output(&["run", &b.url, &key, "--wait", "0", "--", "true"]);
    let c_err = String::from_utf8_lossy(&c.stderr).to_string();
    assert_eq!(
        c.status.code(),
        Some(EXIT_NOT_ACQUIRED),
        "{}: {c_err}",
        b.name
    );
    assert_eq!(c_err.trim().lines().count(), 1, "{}: {c_err}", b.name);
    assert!(c_err.contains("alice"), "{}: {c_err}", b.name);
    // Bob must still be waiting while Alice holds the key.
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        !dir.join("b.env").exists(),
        "{}: bob ran while alice held the key",
        b.name
    );
    let released = Instant::now();
    std::fs::write(&go, "").expect("go");
    assert_eq!(
        a.wait_timeout(Duration::from_secs(20)),
        Some(0),
        "{}: {}",
        b.name,
        a.stderr()
    );
    assert_eq!(
        bproc.wait_timeout(Duration::from_secs(30)),
        Some(0),
        "{}: {}",
        b.name,
        bproc.stderr()
    );
    let took = released.elapsed();
    let lines = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        lines.lines().collect::<Vec<_>>(),
        ["a-start", "a-end", "b-start", "b-end"],
        "{}: the runs overlapped",
        b.name
    );
    let b_env = std::fs::read_to_string(dir.join("b.env")).unwrap_or_default();
    let parse = |s: &str| -> (String, u64, String) {
        let f: Vec<&str> = s.split_whitespace().collect();
        assert_eq!(f.len(), 4, "env line {s:?}");
        (
            f[1].to_owned(),
            f[2].parse().expect("fence"),
            f[3].to_owned(),
        )
    };
    let (ka, fa, ha) = parse(&a_env);
    let (kb, fb, hb) = parse(b_env.trim());
    // `--holder NAME` gives NAME:<random>, unique to the run.
    assert_eq!(ka, key);
    assert_eq!(kb, key);
    assert!(ha.starts_with("alice:"), "{}: holder {ha}", b.name);
    assert!(hb.starts_with("bob:"), "{}: holder {hb}", b.name);
    assert!(fb > fa, "{}: fence {fb} after {fa}", b.name);
    eprintln!(
        "{}: second run took over {} ms after the first was told to finish",
        b.name,
        took.as_millis()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lease break` from outside ends a running `lease run`: its command gets
/// SIGTERM within the lease's deadline, `lease run` exits 76, the break's
/// JSON names the broken holder and fence, and the next grant's fence is higher.
fn break_kills_the_command(b: &Backend) {
    let (key, dir) = fresh(&format!("break-{}", b.name));
    let ttl = Duration::from_secs(3);
    let script = format!(
        "trap 'echo term > {d}/term; exit 143' TERM; echo $LEASE_FENCE > {d}/fence; while :; do sleep 0.05; done",
        d = dir.display()
    );
    let mut victim = b.spawn(
        &[
            "run", &b.url, &key, "--ttl", "3s", "--grace", "0.5s", "--holder", "victim", "--",
            "sh", "-c", &script,
        ],
        &dir.join("victim.err"),
    );
    let fence: u64 = wait_for_file(&dir.join("fence"), Duration::from_secs(20), "victim")
        .parse()
        .expect("fence");
    let out = b.output(&[
        "break",
        &b.url,
        &key,
        "--reason",
        "e2e: holder is stuck",
        "--by",
        "e2e-test",
        "--json",
    ]);
    let broke_at = Instant::now();
    assert!(
        out.status.success(),
        "{}: break failed: {}",
        b.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("break --json");
    assert!(
        v["previous"]["holder"]
            .as_str()
            .is_some_and(|h| h.starts_with("victim:")),
        "{}: {v}",
        b.name
    );
    assert_eq!(v["previous"]["fence"], fence, "{}: {v}", b.name);
    assert!(
        v["audit"].as_str().is_some_and(|a| !a.is_empty()),
        "{}: {v}",
        b.name
    );
    // The holder finds out at its next renewal (TTL/3) and must stop
    // writing by its deadline (2/3 TTL after its last renewal): well within
    // one TTL, plus the grace the command does not need.
    let code = victim.wait_timeout(ttl + Duration::from_secs(3));
    let stopped = broke_at.elapsed();
    assert_eq!(code, Some(EXIT_LOST), "{}: {}", b.name, victim.stderr());
    assert!(
        dir.join("term").exists(),
        "{}: the command got no SIGTERM",
        b.name
    );
    assert!(
        stopped <= ttl,
        "{}: stopped {stopped:?} after the break",
        b.name
    );
    let err = victim.stderr();
    assert!(err.contains("lost lease"), "{}: {err}", b.name);
    assert!(
        err.contains("broken by e2e-test: e2e: holder is stuck"),
        "{}: the loss does not say who broke the lease and why: {err}",
        b.name
    );
    eprintln!(
        "{}: broken holder's command stopped {} ms after the break",
        b.name,
        stopped.as_millis()
    );
    // Free now, and the next grant's fence is higher.
    let st = b.status_json(&key);
    assert_eq!(st["state"], "free", "{}: {st}", b.name);
    let next = b.output(&[
        "run",
        &b.url,
        &key,
        "--wait",
        "0",
        "--",
        "sh",
        "-c",
        "echo $LEASE_FENCE",
    ]);
    assert!(
        next.status.success(),
        "{}: {}",
        b.name,
        String::from_utf8_lossy(&next.stderr)
    );
    let f2: u64 = String::from_utf8_lossy(&next.stdout)
        .trim()
        .parse()
        .expect("fence");
    assert!(
        f2 > fence,
        "{}: fence {f2} after a break of {fence}",
        b.name
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `status --json` on a free and a held key, and `watch --json` seeing
/// free → held → free.
fn status_and_watch_json(b: &Backend) {
    let (key, dir) = fresh(&format!("status-{}", b.name));
    let st = b.status_json(&key);
    assert_eq!(st["state"], "free", "{}: {st}", b.name);
    assert_eq!(st["key"], key.as_str());
    let mut watch = b.cmd(&[
        "watch",
        &b.url,
        &key,
        "--json",
        "--for",
        "20s",
        "--interval",
        "200ms",
    ]);
    let watch_out = std::fs::File::create(dir.join("watch.out")).expect("watch.out");
    let mut watch = Proc {
        child: watch
            .stdout(watch_out)
            .stderr(std::fs::File::create(dir.join("watch.err")).expect("watch.err"))
            .spawn()
            .expect("spawn watch"),
        log: dir.join("watch.err"),
    };
    wait_for_file(&dir.join("watch.out"), Duration::from_secs(20), "watch");
    let stop = dir.join("stop");
    let script = format!(
        "echo $LEASE_FENCE > {d}/fence; while [ ! -f {s} ]; do sleep 0.05; done",
        d = dir.display(),
        s = stop.display()
    );
    let mut holder = b.spawn(
        &[
            "run",
            &b.url,
            &key,
            "--ttl",
            "5s",
            "--holder",
            "h1",
            "--payload",
            "hello",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &dir.join("holder.err"),
    );
    let fence: u64 = wait_for_file(&dir.join("fence"), Duration::from_secs(20), "holder")
        .parse()
        .expect("fence");
    let st = b.status_json(&key);
    assert_eq!(st["state"], "held", "{}: {st}", b.name);
    assert!(
        st["holder"].as_str().is_some_and(|h| h.starts_with("h1:")),
        "{}: {st}",
        b.name
    );
    assert_eq!(st["fence"], fence, "{}: {st}", b.name);
    assert_eq!(st["payload_bytes"], 5, "{}: {st}", b.name);
    assert_eq!(st["ttl_ms"], 5000, "{}: {st}", b.name);
    match &st["remaining_ms"] {
        Value::Null => {}
        Value::Number(n) => assert!(n.as_u64().is_some_and(|r| r <= 5000), "{}: {st}", b.name),
        other => panic!("{}: remaining_ms {other}", b.name),
    }
    // What the backend promises, so an operator knows what the store offers.
    let caps = &st["capabilities"];
    for field in ["time_authority", "exclusion", "fence_scope"] {
        assert!(caps[field].is_string(), "{}: no {field} in {st}", b.name);
    }
    assert!(
        caps["ttl_min_ms"].as_u64().is_some_and(|m| m > 0),
        "{}: {st}",
        b.name
    );
    let expected_authority = if b.name == "s3" {
        "local_observation"
    } else {
        "backend_clock"
    };
    assert_eq!(
        caps["time_authority"], expected_authority,
        "{}: {st}",
        b.name
    );
    // The human form: the holding on one line, the backend's promises on the next.
    let human = b.output(&["status", &b.url, &key]);
    let text = String::from_utf8_lossy(&human.stdout);
    let lines: Vec<&str> = text.trim().lines().collect();
    assert!(
        lines.len() == 2 && lines[0].contains("h1") && lines[1].starts_with("backend: "),
        "{}: {text}",
        b.name
    );
    // Polling watchers (MongoDB, S3) need the key held for a poll or two.
    let end = Instant::now() + Duration::from_secs(15);
    while !std::fs::read_to_string(dir.join("watch.out"))
        .unwrap_or_default()
        .contains("\"held\"")
    {
        assert!(Instant::now() < end, "{}: watch never printed held", b.name);
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(&stop, "").expect("stop");
    assert_eq!(
        holder.wait_timeout(Duration::from_secs(20)),
        Some(0),
        "{}: {}",
        b.name,
        holder.stderr()
    );
    assert_eq!(b.status_json(&key)["state"], "free", "{}", b.name);
    // The watcher saw free → held (h1, fence) → free.
    let end = Instant::now() + Duration::from_secs(15);
    let states = loop {
        let text = std::fs::read_to_string(dir.join("watch.out")).unwrap_or_default();
        let states: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("watch line is JSON"))
            .collect();
        if states.len() >= 3 || Instant::now() > end {
            break states;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let summary: Vec<String> = states
        .iter()
        .map(|s| match s["state"].as_str() {
            // The holder id is h1:<random>; its name part is what matters.
            Some("held") => format!(
                "held:{}:{}",
                s["holder"]
                    .as_str()
                    .unwrap_or("")
                    .split(':')
                    .next()
                    .unwrap_or(""),
                s["fence"]
            ),
            other => other.unwrap_or("?").to_owned(),
        })
        .collect();
    assert_eq!(
        summary,
        [
            "free".to_owned(),
            format!("held:h1:{fence}"),
            "free".to_owned()
        ],
        "{}: watch printed {summary:?}; stderr: {}",
        b.name,
        watch.stderr()
    );
    let _ = watch.child.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad URLs, unknown schemes and bad keys: one line on stderr, exit code 2,
/// no server needed.
#[test]
fn bad_urls_are_usage_errors() {
    let cases: &[&[&str]] = &[
        &["status", "redis://127.0.0.1:6379/x", "k"],
        &["status", "ftp://h/x", "k", "--json"],
        &["status", "localhost:2379", "k"],
        &["status", "etcd://", "k"],
        &["status", "etcd://h:notaport/x", "k"],
        &["watch", "nats://h:4222/a/b", "k"],
        &["break", "s3:///x", "k", "--reason", "r"],
        &["break", "s3://b/x?bogus=1", "k", "--reason", "r"],
        &["status", "redis://h/a/b", "k"],
        &["status", "rediss://h?table=x", "k"],
        &["run", "zookeeper://h:2181/x", "k", "--", "true"],
        &["run", "etcd://127.0.0.1:1/x", "bad//key", "--", "true"],
        &["run", "etcd://127.0.0.1:1/x", "k"],
        &["break", "etcd://127.0.0.1:1/x", "k"],
        &["frobnicate"],
    ];
    for args in cases {
        let out = Command::new(LEASE)
            .args(*args)
            .stdin(Stdio::null())
            .output()
            .expect("run lease");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_USAGE), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err:?}");
        assert!(err.starts_with("lease: "), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = Command::new(LEASE)
        .args(["status", "zookeeper://h:2181/x", "k"])
        .output()
        .expect("run lease");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scheme"));
}

/// A backend that does not answer: one line, exit code 69, within the timeout.
#[test]
fn unreachable_backend_is_a_backend_error() {
    let started = Instant::now();
    let out = Command::new(LEASE)
        .args([
            "status",
            "etcd://127.0.0.1:9/x",
            "k",
            "--request-timeout",
            "2s",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run lease");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_BACKEND), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// `--help` documents the exit codes, the URL forms and examples.
#[test]
fn help_shows_urls_exit_codes_and_examples() {
    let out = Command::new(LEASE)
        .arg("--help")
        .output()
        .expect("run lease");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "etcd://",
        "nats://",
        "mongodb://",
        "postgres://",
        "redis://",
        "s3://",
        "75",
        "76",
        "69",
        "Examples:",
        "lease run",
    ] {
        assert!(text.contains(needle), "--help lacks {needle:?}");
    }
}

/// A frozen backend (its server stopped with SIGSTOP): no renewal
/// succeeds, so just before the lease's write deadline (2/3 TTL after the
/// last renewal was sent) the command gets SIGTERM and `lease run` exits 76
/// — without waiting for the backend to answer.
fn deadline_passing_on_a_frozen_backend_stops_the_command(b: &Backend, server: &Private) {
    let (key, dir) = fresh(&format!("frozen-{}", b.name));
    let script = format!(
        "trap 'echo term > {d}/term; exit 143' TERM; echo $LEASE_FENCE > {d}/fence; while :; do sleep 0.05; done",
        d = dir.display()
    );
    let mut run = b.spawn(
        &[
            "run",
            &b.url,
            &key,
            "--ttl",
            "3s",
            "--grace",
            "0.5s",
            "--request-timeout",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &dir.join("run.err"),
    );
    wait_for_file(&dir.join("fence"), Duration::from_secs(20), "run");
    server.pause();
    let frozen = Instant::now();
    wait_for_file(&dir.join("term"), Duration::from_secs(8), "SIGTERM");
    let stopped = frozen.elapsed();
    let code = run.wait_timeout(Duration::from_secs(8));
    server.resume();
    assert_eq!(code, Some(EXIT_LOST), "{}: {}", b.name, run.stderr());
    // The deadline is 2/3 of the 3 s TTL after the last successful renewal
    // was sent (before the freeze); the command must be stopped before the
    // TTL runs out on the server and someone else may take the key.
    assert!(
        stopped < Duration::from_secs(3),
        "{}: stopped {stopped:?} after the freeze",
        b.name
    );
    assert!(
        run.stderr().contains("deadline"),
        "{}: {}",
        b.name,
        run.stderr()
    );
    eprintln!(
        "frozen {}: command stopped {} ms after the freeze",
        b.name,
        stopped.as_millis()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A command that ignores SIGTERM on a frozen backend: SIGKILL must land
/// before the TTL runs out on the server (3 s after the last renewal was
/// sent, which was before the freeze), whatever the default grace period.
fn sigkill_lands_before_another_holder_can_be_granted(b: &Backend, server: &Private) {
    let (key, dir) = fresh(&format!("sigkill-{}", b.name));
    let script = format!(
        "trap '' TERM; echo $$ > {d}/pid; while :; do sleep 0.05; done",
        d = dir.display()
    );
    let mut run = b.spawn(
        &[
            "run",
            &b.url,
            &key,
            "--ttl",
            "3s",
            "--request-timeout",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &dir.join("run.err"),
    );
    let pid: u32 = wait_for_file(&dir.join("pid"), Duration::from_secs(20), "run")
        .parse()
        .expect("pid");
    server.pause();
    let frozen = Instant::now();
    while !dead(pid) && frozen.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let death = frozen.elapsed();
    let code = run.wait_timeout(Duration::from_secs(10));
    server.resume();
    assert!(
        dead(pid),
        "{}: the command ignoring SIGTERM outlived 10 s",
        b.name
    );
    assert_eq!(code, Some(EXIT_LOST), "{}: {}", b.name, run.stderr());
    assert!(
        death < Duration::from_secs(3),
        "{}: SIGKILL landed {death:?} after the freeze, past the 3 s TTL",
        b.name
    );
    eprintln!(
        "frozen {}, SIGTERM ignored: the command was killed {} ms after the freeze",
        b.name,
        death.as_millis()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
pub(crate) fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S …": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Timestamps (ns since the epoch) appended to `path`, one per line.
pub(crate) fn stamps(path: &Path) -> Vec<u128> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A command that writes its pid, then appends a timestamp every 20 ms.
fn stamping(dir: &Path, who: &str) -> String {
    format!(
        "echo $$ > {d}/{who}.pid; while :; do date +%s%N >> {d}/{who}.log; sleep 0.02; done",
        d = dir.display()
    )
}

/// What a test does to `lease` while its command runs.
#[derive(Clone, Copy, PartialEq)]
enum Hit {
    /// SIGKILL, once the command writes.
    Kill,
    /// SIGSTOP, once the command writes.
    Stop,
    /// SIGSTOP sent by the command itself as the first thing it does: the
    /// narrowest window, between the command's start and `lease`'s next step.
    StopAtStart,
}

/// `lease` killed with SIGKILL, or frozen with SIGSTOP, while its command
/// runs: nobody renews, and the command must be dead by the lease's write
/// deadline (2/3 of the 3 s TTL after the last renewal was sent), before a
/// second `lease run` on the key can start a second copy. The two copies'
/// logs never overlap.
fn lease_killed_or_stopped_never_outlives_its_lease(b: &Backend, hit: Hit) {
    let how = match hit {
        Hit::Kill => "killed",
        Hit::Stop => "stopped",
        Hit::StopAtStart => "stopped-at-start",
    };
    let freeze = hit != Hit::Kill;
    let (key, dir) = fresh(&format!("orphan-{how}-{}", b.name));
    let script = if hit == Hit::StopAtStart {
        format!("kill -STOP $PPID; {}", stamping(&dir, "a"))
    } else {
        stamping(&dir, "a")
    };
    let mut a = b.spawn(
        &[
            "run", &b.url, &key, "--ttl", "3s", "--", "sh", "-c", &script,
        ],
        &dir.join("a.err"),
    );
    let pid: u32 = wait_for_file(&dir.join("a.pid"), Duration::from_secs(20), "first run")
        .parse()
        .expect("pid");
    while stamps(&dir.join("a.log")).is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let lease_pid = a.child.id();
    let hit_at = Instant::now();
    if hit == Hit::Stop {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(lease_pid as i32, libc::SIGSTOP) };
    } else if hit == Hit::Kill {
        a.child.kill().expect("kill -9 lease");
        a.child.wait().expect("reap lease");
    }
    let mut second = b.spawn(
        &[
            "run",
            &b.url,
            &key,
            "--ttl",
            "3s",
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            &format!(
                "for i in $(seq 25); do date +%s%N >> {d}/b.log; sleep 0.02; done",
                d = dir.display()
            ),
        ],
        &dir.join("b.err"),
    );
    while !dead(pid) && hit_at.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let death = hit_at.elapsed();
    let code = second.wait_timeout(Duration::from_secs(40));
    if freeze {
        // SAFETY: as above.
        unsafe { libc::kill(lease_pid as i32, libc::SIGCONT) };
        let code_a = a.wait_timeout(Duration::from_secs(15));
        assert_eq!(code_a, Some(EXIT_LOST), "{}: {}", b.name, a.stderr());
    }
    assert!(
        dead(pid),
        "{}: the command outlived `lease` ({how}) by 10 s",
        b.name
    );
    assert_eq!(code, Some(0), "{}: second run: {}", b.name, second.stderr());
    let (la, lb) = (stamps(&dir.join("a.log")), stamps(&dir.join("b.log")));
    assert!(!lb.is_empty(), "{}: the second run wrote nothing", b.name);
    let (last_a, first_b) = (la.iter().max().copied(), lb.iter().min().copied());
    assert!(
        last_a < first_b,
        "{}: the copies overlapped: the first wrote until {last_a:?}, the second from {first_b:?}",
        b.name
    );
    // The write deadline is at most 2/3 × 3 s after the kill (the last
    // renewal was sent before it); the watchdog checks every 20 ms.
    assert!(
        death <= Duration::from_millis(2300),
        "{}: the command died {death:?} after `lease` was {how}",
        b.name
    );
    eprintln!(
        "{}: `lease` {how}: its command died {} ms later; the second copy started {} ms after the first stopped",
        b.name,
        death.as_millis(),
        (first_b.unwrap_or(0).saturating_sub(last_a.unwrap_or(0))) / 1_000_000
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--holder NAME` on two runs at once (two machines with one cron line):
/// each gets a holder id of its own, so the second is refused, not handed
/// the first one's grant.
fn one_holder_name_twice_is_still_exclusive(b: &Backend) {
    let (key, dir) = fresh(&format!("holder-{}", b.name));
    let go = dir.join("go");
    let mut first = b.spawn(
        &[
            "run",
            &b.url,
            &key,
            "--holder",
            "nightly",
            "--",
            "sh",
            "-c",
            &format!(
                "echo $LEASE_HOLDER > {d}/holder; while [ ! -f {g} ]; do sleep 0.05; done",
                d = dir.display(),
                g = go.display()
            ),
        ],
        &dir.join("first.err"),
    );
    let holder = wait_for_file(&dir.join("holder"), Duration::from_secs(20), "first run");
    assert!(
        holder.starts_with("nightly:"),
        "{}: holder {holder}",
        b.name
    );
    let second = b.output(&[
        "run", &b.url, &key, "--holder", "nightly", "--wait", "0", "--", "true",
    ]);
    std::fs::write(&go, "").expect("go");
    assert_eq!(
        second.status.code(),
        Some(EXIT_NOT_ACQUIRED),
        "{}: a second run with the same --holder was let in: {}",
        b.name,
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(
        first.wait_timeout(Duration::from_secs(20)),
        Some(0),
        "{}",
        first.stderr()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A shell script in `dir` that execs `lease run` on `key` with `command`
/// (a `sh -c` script).
fn lease_script(b: &Backend, dir: &Path, key: &str, ttl: &str, command: &str) -> PathBuf {
    let run = dir.join("run.sh");
    std::fs::write(
        &run,
        format!(
            "exec {LEASE} run '{url}' '{key}' --ttl {ttl} -- sh -c '{command}'\n",
            url = b.url
        ),
    )
    .expect("script");
    run
}

/// `shell` run by script(1) in a pseudo-terminal, with the backend's
/// environment; what is written to the returned pipe is typed into it.
fn in_terminal(b: &Backend, dir: &Path, shell: &str) -> (Proc, std::process::ChildStdin) {
    let mut c = Command::new("script");
    c.args(["-qec", shell, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("script.err")).expect("log"));
    for (k, v) in &b.env {
        c.env(k, v);
    }
    let mut p = Proc {
        child: c.spawn().expect("script(1) from util-linux"),
        log: dir.join("script.err"),
    };
    let typed = p.child.stdin.take().expect("stdin");
    (p, typed)
}

fn type_in(into: &mut std::process::ChildStdin, text: &[u8]) {
    use std::io::Write;
    into.write_all(text).expect("type");
    into.flush().expect("flush");
}

/// `lease run` in a terminal (here a pseudo-terminal made by script(1)),
/// with a command that reads it: the command's group is the terminal's
/// foreground, so it gets what is typed instead of stopping on SIGTTIN
/// while `lease` keeps renewing for ever.
fn a_command_reading_the_terminal_gets_its_input(b: &Backend) {
    let (key, dir) = fresh(&format!("tty-{}", b.name));
    let command = format!("read x; echo \"$x\" > {d}/got", d = dir.display());
    let run = lease_script(b, &dir, &key, "3s", &command);
    let (mut p, mut typed) = in_terminal(b, &dir, &format!("sh {}", run.display()));
    type_in(&mut typed, b"typed-in\n");
    let got = dir.join("got");
    let end = Instant::now() + Duration::from_secs(20);
    while !got.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let code = p.wait_timeout(Duration::from_secs(10));
    drop(typed);
    assert_eq!(
        std::fs::read_to_string(&got).unwrap_or_default().trim(),
        "typed-in",
        "{}: the command did not get the terminal's input (stopped by SIGTTIN?): {}",
        b.name,
        p.stderr()
    );
    assert_eq!(code, Some(0), "{}: {}", b.name, p.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The state letter of process `pid` (R, S, T, Z…).
fn state(pid: u32) -> char {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next())
        })
        .unwrap_or('?')
}

/// Job control in a terminal, under an interactive bash in a
/// pseudo-terminal: Ctrl-Z stops the command and `lease` (the shell gets
/// the terminal back and sees the job stopped); `fg` continues `lease`,
/// which hands the terminal back to the command, which then reads what is
/// typed.
fn ctrl_z_stops_the_job_and_fg_resumes_it(b: &Backend) {
    let (key, dir) = fresh(&format!("jobs-{}", b.name));
    let command = format!(
        "echo $$ > {d}/pid; read x; echo \"$x\" > {d}/got",
        d = dir.display()
    );
    let run = lease_script(b, &dir, &key, "10s", &command);
    let (mut p, mut typed) = in_terminal(b, &dir, "bash --norc --noprofile -i");
    let mut type_in = |text: &[u8]| type_in(&mut typed, text);
    type_in(format!("sh {}\n", run.display()).as_bytes());
    let pid: u32 = wait_for_file(&dir.join("pid"), Duration::from_secs(20), "command")
        .parse()
        .expect("pid");
    // `lease` is the command's parent (the script exec'd it).
    let lease_pid: u32 = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1).and_then(|p| p.parse().ok()))
        })
        .expect("parent pid");
    type_in(b"\x1a");
    let end = Instant::now() + Duration::from_secs(5);
    while !(state(pid) == 'T' && state(lease_pid) == 'T') && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        (state(pid), state(lease_pid)),
        ('T', 'T'),
        "{}: after Ctrl-Z the command and `lease` should both be stopped",
        b.name
    );
    type_in(b"fg\n");
    std::thread::sleep(Duration::from_millis(300));
    type_in(b"after-fg\n");
    let got = dir.join("got");
    let end = Instant::now() + Duration::from_secs(10);
    while !got.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let read = std::fs::read_to_string(&got).unwrap_or_default();
    let end = Instant::now() + Duration::from_secs(10);
    while !dead(lease_pid) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    type_in(b"exit\n");
    let code = p.wait_timeout(Duration::from_secs(10));
    assert_eq!(
        read.trim(),
        "after-fg",
        "{}: the resumed command did not read the terminal: {}",
        b.name,
        p.stderr()
    );
    assert!(
        dead(lease_pid),
        "{}: `lease` did not end after its command",
        b.name
    );
    assert_eq!(code, Some(0), "{}: {}", b.name, p.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C while `lease run` is still connecting to a backend that does not
/// answer (frozen) ends `lease` at once, not after --request-timeout.
fn ctrl_c_while_connecting_ends_lease_promptly(b: &Backend, server: &Private) {
    let (key, dir) = fresh(&format!("int-{}", b.name));
    server.pause();
    let mut run = b.spawn(
        &[
            "run",
            &b.url,
            &key,
            "--request-timeout",
            "30s",
            "--",
            "true",
        ],
        &dir.join("run.err"),
    );
    std::thread::sleep(Duration::from_millis(700));
    let sent = Instant::now();
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(run.child.id() as i32, libc::SIGINT) };
    let code = run.wait_timeout(Duration::from_secs(10));
    let took = sent.elapsed();
    server.resume();
    assert_eq!(code, Some(130), "{}: {}", b.name, run.stderr());
    assert!(
        took < Duration::from_secs(3),
        "{}: Ctrl-C took {took:?} to end `lease`",
        b.name
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The command ends while the backend is frozen: the release (and the
/// client's shutdown) are bounded by --request-timeout, so `lease` exits with the
/// command's status within a few seconds.
fn the_steps_after_the_command_are_bounded(b: &Backend, server: &Private) {
    let (key, dir) = fresh(&format!("after-{}", b.name));
    let mut run = b.spawn(
        &[
            "run",
            &b.url,
            &key,
            "--ttl",
            "30s",
            "--request-timeout",
            "1s",
            "--",
            "sh",
            "-c",
            &format!("touch {d}/started; sleep 1; exit 7", d = dir.display()),
        ],
        &dir.join("run.err"),
    );
    wait_for_file_exists(&dir.join("started"), Duration::from_secs(20));
    server.pause();
    let frozen = Instant::now();
    let code = run.wait_timeout(Duration::from_secs(20));
    let took = frozen.elapsed();
    server.resume();
    assert_eq!(code, Some(7), "{}: {}", b.name, run.stderr());
    assert!(
        took < Duration::from_secs(6),
        "{}: `lease` took {took:?} to end after its command, on a frozen backend",
        b.name
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn wait_for_file_exists(path: &Path, limit: Duration) {
    let end = Instant::now() + limit;
    while !path.exists() {
        assert!(Instant::now() < end, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A --grace that cannot fit before another holder may be granted the key
/// is refused before anything is acquired, with the arithmetic.
#[test]
fn a_grace_that_does_not_fit_the_ttl_is_refused() {
    let out = Command::new(LEASE)
        .args([
            "run",
            "etcd://127.0.0.1:1/x",
            "k",
            "--ttl",
            "10s",
            "--grace",
            "5s",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run lease");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{err}");
    assert!(err.contains("does not fit"), "{err}");
    assert!(err.contains("2.3s"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err:?}");
}

/// Negative durations get their own clear error (not clap's hint to pass
/// `-- -1`, which would make `-1` the command).
#[test]
fn negative_durations_are_usage_errors() {
    for flag in ["--ttl", "--wait", "--grace", "--request-timeout"] {
        let out = Command::new(LEASE)
            .args(["run", "etcd://127.0.0.1:1/x", "k", flag, "-1", "--", "true"])
            .stdin(Stdio::null())
            .output()
            .expect("run lease");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_USAGE), "{flag}: {err}");
        assert!(err.contains("negative"), "{flag}: {err}");
        assert!(!err.contains("-- -1"), "{flag}: {err}");
    }
}

/// flock's -n and -E, options from the environment, and a TTL below the
/// backend's minimum said on stderr.
fn flock_options_and_the_environment(b: &Backend) {
    let (key, dir) = fresh(&format!("flock-{}", b.name));
    let go = dir.join("go");
    let mut first = b.spawn(
        &[
            "run",
            &b.url,
            &key,
            "--ttl",
            "0",
            "--",
            "sh",
            "-c",
            &format!(
                "touch {d}/started; while [ ! -f {g} ]; do sleep 0.05; done",
                d = dir.display(),
                g = go.display()
            ),
        ],
        &dir.join("first.err"),
    );
    wait_for_file_exists(&dir.join("started"), Duration::from_secs(20));
    let nonblock = b.output(&["run", &b.url, &key, "-n", "--", "true"]);
    assert_eq!(
        nonblock.status.code(),
        Some(EXIT_NOT_ACQUIRED),
        "{}: -n: {}",
        b.name,
        String::from_utf8_lossy(&nonblock.stderr)
    );
    let custom = b.output(&["run", &b.url, &key, "-n", "-E", "3", "--", "true"]);
    assert_eq!(custom.status.code(), Some(3), "{}: -E 3", b.name);
    let from_env = b
        .cmd(&["run", &b.url, &key, "--", "true"])
        .env("LEASE_WAIT", "0")
        .env("LEASE_CONFLICT_EXIT_CODE", "4")
        .output()
        .expect("run lease");
    assert_eq!(from_env.status.code(), Some(4), "{}: LEASE_WAIT=0", b.name);
    std::fs::write(&go, "").expect("go");
    assert_eq!(
        first.wait_timeout(Duration::from_secs(20)),
        Some(0),
        "{}",
        first.stderr()
    );
    assert!(
        first
            .stderr()
            .contains("--ttl 0ms is below what the backend grants"),
        "{}: no note of the raised TTL: {}",
        b.name,
        first.stderr()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lease hold`: prints the grant once held, keeps it (status shows it
/// held, another run is refused), releases it on SIGTERM and exits 0; a
/// `lease break` ends a second hold with exit 76.
fn hold_keeps_the_lease_until_signalled(b: &Backend) {
    use std::io::BufRead;
    let (key, dir) = fresh(&format!("hold-{}", b.name));
    let mut held = b.spawn(
        &[
            "hold", &b.url, &key, "--ttl", "3s", "--holder", "ops", "--json",
        ],
        &dir.join("hold.err"),
    );
    let mut line = String::new();
    std::io::BufReader::new(held.child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("hold prints the grant");
    let grant: Value = serde_json::from_str(&line).expect("one JSON object");
    assert_eq!(grant["key"], key.as_str(), "{}: {grant}", b.name);
    assert!(
        grant["fence"].as_u64().is_some_and(|f| f > 0),
        "{}: {grant}",
        b.name
    );
    let st = b.status_json(&key);
    assert_eq!(st["state"], "held", "{}: {st}", b.name);
    assert_eq!(st["fence"], grant["fence"], "{}: {st}", b.name);
    // Held for longer than a TTL: it renews.
    std::thread::sleep(Duration::from_millis(3500));
    let refused = b.output(&["run", &b.url, &key, "-n", "--", "true"]);
    assert_eq!(refused.status.code(), Some(EXIT_NOT_ACQUIRED), "{}", b.name);
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(held.child.id() as i32, libc::SIGTERM) };
    assert_eq!(
        held.wait_timeout(Duration::from_secs(10)),
        Some(0),
        "{}: {}",
        b.name,
        held.stderr()
    );
    assert_eq!(b.status_json(&key)["state"], "free", "{}", b.name);

    let mut second = b.spawn(
        &["hold", &b.url, &key, "--ttl", "3s"],
        &dir.join("second.err"),
    );
    let mut fence = String::new();
    std::io::BufReader::new(second.child.stdout.take().expect("stdout"))
        .read_line(&mut fence)
        .expect("hold prints the fence");
    assert!(
        fence.trim().parse::<u64>().is_ok(),
        "{}: printed {fence:?}",
        b.name
    );
    let broke = b.output(&["break", &b.url, &key, "--reason", "e2e"]);
    assert!(
        broke.status.success(),
        "{}: {}",
        b.name,
        String::from_utf8_lossy(&broke.stderr)
    );
    assert_eq!(
        second.wait_timeout(Duration::from_secs(10)),
        Some(EXIT_LOST),
        "{}: {}",
        b.name,
        second.stderr()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One `#[test]` per function, each on the backend's shared test server.
macro_rules! on_shared {
    ($backend:ident: $($test:ident),* $(,)?) => {$(
        #[test]
        fn $test() {
            if let Some(b) = super::backend(stringify!($backend)) {
                super::$test(&b);
            }
        }
    )*};
}

/// One `#[test]` per function, each on a private server it may pause.
macro_rules! on_private {
    ($backend:ident: $($test:ident),* $(,)?) => {$(
        #[test]
        fn $test() {
            if let Some((b, server)) = super::private(stringify!($backend)) {
                super::$test(&b, &server);
            }
        }
    )*};
}

fn lease_killed_never_outlives_its_lease(b: &Backend) {
    lease_killed_or_stopped_never_outlives_its_lease(b, Hit::Kill);
}

fn lease_stopped_never_outlives_its_lease(b: &Backend) {
    lease_killed_or_stopped_never_outlives_its_lease(b, Hit::Stop);
}

fn lease_stopped_as_the_command_starts_never_outlives_it(b: &Backend) {
    lease_killed_or_stopped_never_outlives_its_lease(b, Hit::StopAtStart);
}

macro_rules! backend_tests {
    ($($name:ident),*) => {$(
        mod $name {
            on_shared!($name:
                two_runs_take_turns,
                break_kills_the_command,
                status_and_watch_json,
                flock_options_and_the_environment,
                hold_keeps_the_lease_until_signalled,
                one_holder_name_twice_is_still_exclusive,
                lease_killed_never_outlives_its_lease,
                lease_stopped_never_outlives_its_lease,
                lease_stopped_as_the_command_starts_never_outlives_it,
                a_command_reading_the_terminal_gets_its_input,
                ctrl_z_stops_the_job_and_fg_resumes_it,
            );
            on_private!($name:
                ctrl_c_while_connecting_ends_lease_promptly,
                the_steps_after_the_command_are_bounded,
                deadline_passing_on_a_frozen_backend_stops_the_command,
                sigkill_lands_before_another_holder_can_be_granted,
            );
        }
    )*};
}

#[cfg(feature = "etcd")]
backend_tests!(etcd);
#[cfg(feature = "nats")]
backend_tests!(nats);
#[cfg(feature = "s3")]
backend_tests!(s3);
#[cfg(feature = "mongo")]
backend_tests!(mongo);
#[cfg(feature = "postgres")]
backend_tests!(postgres);
#[cfg(feature = "redis")]
backend_tests!(redis);

/// Shell completions and the man page come from the same clap definition
/// as the options, so they list every subcommand.
#[test]
fn completions_and_man_page_are_generated() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(LEASE)
            .args(["completions", shell])
            .output()
            .expect("run lease");
        assert!(
            out.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        for sub in ["run", "hold", "status", "watch", "break"] {
            assert!(text.contains(sub), "{shell} completions lack {sub}");
        }
    }
    let man = Command::new(LEASE).arg("man").output().expect("run lease");
    assert!(man.status.success());
    let text = String::from_utf8_lossy(&man.stdout);
    assert!(text.contains(".TH lease"), "{text}");
    for sub in ["run", "hold", "status", "watch", "break"] {
        assert!(text.contains(sub), "the man page lacks {sub}");
    }
    let bad = Command::new(LEASE)
        .args(["completions", "nosuch"])
        .output()
        .expect("run lease");
    assert_eq!(bad.status.code(), Some(EXIT_USAGE));
}

/// `lease completions bash | head -1`, `lease man | head`: a reader that
/// goes away ends `lease` quietly, by SIGPIPE as other Unix tools, with no
/// panic and no error message.
#[test]
fn a_closed_pipe_ends_output_quietly() {
    use std::os::unix::process::ExitStatusExt;
    for args in [&["completions", "bash"][..], &["man"], &["--help"]] {
        let mut child = Command::new(LEASE)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run lease");
        // The reader is gone before `lease` writes anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait for lease");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?}",
            out.status
        );
    }
}

/// A `lease run` of `holder` on `key` whose command waits for the file
/// `stop` in `dir`; returns once it holds the key, with its fence.
fn hold_until_stopped(b: &Backend, key: &str, dir: &Path, holder: &str) -> (Proc, u64, PathBuf) {
    let stop = dir.join(format!("stop-{holder}"));
    let fence_file = dir.join(format!("fence-{holder}"));
    let script = format!(
        "echo $LEASE_FENCE > {f}; while [ ! -f {s} ]; do sleep 0.05; done",
        f = fence_file.display(),
        s = stop.display()
    );
    let proc = b.spawn(
        &[
            "run", &b.url, key, "--ttl", "5s", "--holder", holder, "--", "sh", "-c", &script,
        ],
        &dir.join(format!("{holder}.err")),
    );
    let fence = wait_for_file(&fence_file, Duration::from_secs(20), holder)
        .parse()
        .expect("fence");
    (proc, fence, stop)
}

/// `lease status` answers scripts by its exit code, 0 held and 1 free (as
/// grep: 2 stays a usage error), and `--quiet` prints nothing.
fn status_exit_code_and_quiet(b: &Backend) {
    let (key, dir) = fresh(&format!("status-code-{}", b.name));
    for quiet in [false, true] {
        let mut args = vec!["status", &b.url, &key];
        if quiet {
            args.push("--quiet");
        }
        let out = b.output(&args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}: free, quiet {quiet}",
            b.name
        );
        assert_eq!(out.stdout.is_empty(), quiet, "{}", b.name);
    }
    let (mut holder, _, stop) = hold_until_stopped(b, &key, &dir, "h1");
    for quiet in [false, true] {
        let mut args = vec!["status", &b.url, &key];
        if quiet {
            args.push("-q");
        }
        let out = b.output(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: held, quiet {quiet}",
            b.name
        );
        assert_eq!(out.stdout.is_empty(), quiet, "{}", b.name);
    }
    // A reader that goes away ends `watch` by SIGPIPE, quietly.
    let mut watch = b
        .cmd(&["watch", &b.url, &key, "--for", "20s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    drop(watch.stdout.take());
    let out = watch.wait_with_output().expect("wait for watch");
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{}", b.name);
    }
    assert!(
        out.stderr.is_empty(),
        "{}: {}",
        b.name,
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&stop, "").expect("stop");
    assert_eq!(
        holder.wait_timeout(Duration::from_secs(20)),
        Some(0),
        "{}",
        b.name
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lease break --if-fence N --if-holder H` ends only the grant it names:
/// a retried or stale break is refused (exit 1) and the live holder keeps
/// running.
fn break_guards_spare_another_grant(b: &Backend) {
    let (key, dir) = fresh(&format!("break-guard-{}", b.name));
    let (mut holder, fence, _stop) = hold_until_stopped(b, &key, &dir, "h1");
    let st = b.status_json(&key);
    let id = st["holder"].as_str().expect("holder").to_owned();
    let other_fence = (fence + 1).to_string();
    let fence = fence.to_string();
    let break_with = |guard: &[&str]| {
        let mut args = vec!["break", &b.url, &key, "--reason", "guard test"];
        args.extend_from_slice(guard);
        b.output(&args)
    };
    for guard in [
        &["--if-fence", other_fence.as_str()][..],
        &["--if-holder", "someone-else"],
        &["--if-fence", fence.as_str(), "--if-holder", "someone-else"],
    ] {
        let out = break_with(guard);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {guard:?}: {err}", b.name);
        assert!(err.contains("nothing was broken"), "{}: {err}", b.name);
        assert_eq!(b.status_json(&key)["fence"], st["fence"], "{}", b.name);
    }
    let out = break_with(&["--if-fence", &fence, "--if-holder", &id]);
    assert!(
        out.status.success(),
        "{}: {}",
        b.name,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        holder.wait_timeout(Duration::from_secs(20)),
        Some(EXIT_LOST),
        "{}: {}",
        b.name,
        holder.stderr()
    );
    // The same break again: that grant is gone, so nothing is broken.
    let out = break_with(&["--if-fence", &fence]);
    assert_eq!(out.status.code(), Some(1), "{}", b.name);
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "etcd")]
mod etcd_only {
    on_shared!(etcd: status_exit_code_and_quiet, break_guards_spare_another_grant);
}
