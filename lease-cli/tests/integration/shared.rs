//! `lease run --shared`, `--exclusive` and `--permits N` (flock -s, flock -x,
//! `consul lock -n`), and what `lease status` shows of them: the commands'
//! overlap is seen by the commands themselves, through files they make
//! and wait for.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::e2e::{
    backend, fresh, wait_for_file, Backend, Proc, EXIT_LOST, EXIT_NOT_ACQUIRED, EXIT_USAGE, LEASE,
};

/// `lease run URL KEY <flags> --ttl 5s -- sh -c SCRIPT`, stderr to
/// `dir/<name>.err`.
fn run(b: &Backend, key: &str, dir: &Path, name: &str, flags: &[&str], script: &str) -> Proc {
    let mut args = vec!["run", &b.url, key, "--ttl", "5s"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    b.spawn(&args, &dir.join(format!("{name}.err")))
}

/// Waits until `path` exists; false after `limit`.
fn appears(path: &Path, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A script that says it is in (`in`), waits for `go`, then writes its
/// LEASE_KEY, LEASE_FENCE and LEASE_HOLDER into `out`.
fn in_until_go(dir: &Path, me: &str) -> String {
    let d = dir.display();
    format!(
        "touch {d}/{me}-in; while [ ! -e {d}/go ]; do sleep 0.05; done; \
         echo \"$LEASE_KEY $LEASE_FENCE $LEASE_HOLDER\" > {d}/{me}-out"
    )
}

fn ended(b: &Backend, p: &mut Proc, what: &str) {
    assert_eq!(
        p.wait_timeout(Duration::from_secs(30)),
        Some(0),
        "{}: {what}: {}",
        b.name,
        p.stderr()
    );
}

/// `key fence holder` as a command wrote them.
fn env_of(dir: &Path, me: &str) -> (String, u64, String) {
    let line = wait_for_file(&dir.join(format!("{me}-out")), Duration::from_secs(5), me);
    let mut parts = line.split(' ');
    let key = parts.next().unwrap_or_default().to_owned();
    let fence = parts
        .next()
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("no fence in {line:?}"));
    let holder = parts.next().unwrap_or_default().to_owned();
    (key, fence, holder)
}

fn status_json(b: &Backend, args: &[&str]) -> (Option<i32>, Value) {
    let out = b.output(args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{}: status --json printed no JSON ({e}): {} {}",
            b.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

/// Two `--shared` runs hold the key at once (each command waits for the
/// other to be in), with one fence and holder ids of their own, and
/// `status` shows the key held by `(shared)` with both registrations.
fn two_shared_runs_overlap_and_status_shows_them(b: &Backend) {
    let (key, dir) = fresh(&format!("shared-{}", b.name));
    let mut a = run(b, &key, &dir, "a", &["--shared"], &in_until_go(&dir, "a"));
    let mut c = run(b, &key, &dir, "c", &["--shared"], &in_until_go(&dir, "c"));
    for (me, p) in [("a", &a), ("c", &c)] {
        assert!(
            appears(&dir.join(format!("{me}-in")), Duration::from_secs(20)),
            "{}: {me} did not get in beside the other: {}",
            b.name,
            p.stderr()
        );
    }
    let (code, st) = status_json(b, &["status", &b.url, &key, "--json"]);
    assert_eq!(code, Some(0), "{}: {st}", b.name);
    assert_eq!(st["holder"], "(shared)", "{}: {st}", b.name);
    let holders: Vec<String> = st["shared"]["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no shared holders: {st}", b.name))
        .iter()
        .map(|h| h["holder"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(holders.len(), 2, "{}: {st}", b.name);
    assert!(
        st["shared"]["exclusive_intent"].is_null(),
        "{}: {st}",
        b.name
    );
    let text = b.output(&["status", &b.url, &key]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("shared by 2 holders"), "{}: {text}", b.name);
    std::fs::write(dir.join("go"), "").expect("go");
    ended(b, &mut a, "a");
    ended(b, &mut c, "c");
    let (ka, fa, ha) = env_of(&dir, "a");
    let (kc, fc, hc) = env_of(&dir, "c");
    assert_eq!((ka.as_str(), kc.as_str()), (key.as_str(), key.as_str()));
    assert_eq!(fa, fc, "{}: one shared phase, one fence", b.name);
    assert_ne!(ha, hc, "{}", b.name);
    for h in [&ha, &hc] {
        assert!(holders.contains(h), "{}: {h} not in {holders:?}", b.name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An `--exclusive` run does not start while a `--shared` one runs, shuts
/// new shared runs out meanwhile, and starts once the shared one ends, with
/// a higher fence.
fn exclusive_waits_for_shared_and_shuts_new_ones_out(b: &Backend) {
    let (key, dir) = fresh(&format!("exclusive-{}", b.name));
    let mut s = run(b, &key, &dir, "s", &["--shared"], &in_until_go(&dir, "s"));
    assert!(
        appears(&dir.join("s-in"), Duration::from_secs(20)),
        "{}: {}",
        b.name,
        s.stderr()
    );
    let d = dir.display();
    let x_script = format!(
        "if [ -e {d}/s-out ]; then w=after; else w=before; fi; \
         echo \"$LEASE_KEY $LEASE_FENCE $w\" > {d}/x-out"
    );
    let mut x = run(b, &key, &dir, "x", &["--exclusive"], &x_script);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !dir.join("x-out").exists() && x.child.try_wait().expect("try_wait").is_none(),
        "{}: the exclusive run did not wait for the shared one: {}",
        b.name,
        x.stderr()
    );
    let late = b.output(&["run", &b.url, &key, "--shared", "--wait", "0", "--", "true"]);
    assert_eq!(
        late.status.code(),
        Some(EXIT_NOT_ACQUIRED),
        "{}: a new shared run got in beside a waiting exclusive one: {}",
        b.name,
        String::from_utf8_lossy(&late.stderr)
    );
    let (_, st) = status_json(b, &["status", &b.url, &key, "--json"]);
    assert!(
        st["shared"]["exclusive_intent"]["holder"].is_string(),
        "{}: {st}",
        b.name
    );
    std::fs::write(dir.join("go"), "").expect("go");
    ended(b, &mut s, "shared");
    ended(b, &mut x, "exclusive");
    let (_, shared_fence, _) = env_of(&dir, "s");
    let (xk, xf, when) = env_of(&dir, "x");
    assert_eq!(xk, key, "{}", b.name);
    assert_eq!(when, "after", "{}", b.name);
    assert!(xf > shared_fence, "{}: {xf} <= {shared_fence}", b.name);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--permits 2`: of three runs, two are in at once and the third waits
/// until one leaves; never three. Each command's LEASE_KEY is its permit.
fn two_permits_let_two_of_three_in(b: &Backend) {
    let (key, dir) = fresh(&format!("permits-{}", b.name));
    let d = dir.display();
    let script = |me: &str| {
        format!(
            "mkdir {d}/busy-{me}; ls -d {d}/busy-* | wc -l >> {d}/counts; \
             while [ ! -e {d}/go ]; do sleep 0.05; done; rmdir {d}/busy-{me}; \
             echo \"$LEASE_KEY $LEASE_FENCE $LEASE_HOLDER\" > {d}/{me}-out"
        )
    };
    let mut runs: Vec<Proc> = ["p1", "p2", "p3"]
        .iter()
        .map(|me| run(b, &key, &dir, me, &["--permits", "2"], &script(me)))
        .collect();
    let busy = || {
        std::fs::read_dir(&dir)
            .map(|r| {
                r.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with("busy-"))
                    .count()
            })
            .unwrap_or(0)
    };
    let end = Instant::now() + Duration::from_secs(20);
    while busy() < 2 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(busy(), 2, "{}: two permits, two in", b.name);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(busy(), 2, "{}: a third got in on two permits", b.name);
    let (code, st) = status_json(b, &["status", &b.url, &key, "--permits", "2", "--json"]);
    assert_eq!(code, Some(0), "{}: {st}", b.name);
    assert_eq!(st["permits"]["held"], 2, "{}: {st}", b.name);
    assert_eq!(st["permits"]["free"], 0, "{}: {st}", b.name);
    std::fs::write(dir.join("go"), "").expect("go");
    for (i, p) in runs.iter_mut().enumerate() {
        ended(b, p, &format!("p{}", i + 1));
    }
    let counts = std::fs::read_to_string(dir.join("counts")).expect("counts");
    let counts: Vec<u32> = counts
        .lines()
        .map(|l| l.trim().parse().expect("a count"))
        .collect();
    assert_eq!(counts.len(), 3, "{}: {counts:?}", b.name);
    assert!(counts.iter().all(|&n| n <= 2), "{}: {counts:?}", b.name);
    for me in ["p1", "p2", "p3"] {
        let (k, _, _) = env_of(&dir, me);
        assert!(
            k == format!("{key}/permit-0") || k == format!("{key}/permit-1"),
            "{}: {k}",
            b.name
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A shared run whose own registration is broken is stopped (exit 76),
/// though the phase it shares with another shared run lives on; the other
/// run keeps running.
fn a_shared_run_is_stopped_when_its_registration_is_lost(b: &Backend) {
    let (key, dir) = fresh(&format!("shared-loss-{}", b.name));
    let d = dir.display();
    let mut a = run(
        b,
        &key,
        &dir,
        "a",
        &["--shared", "--holder", "alice"],
        &format!("touch {d}/a-in; exec sleep 60"),
    );
    let mut c = run(
        b,
        &key,
        &dir,
        "c",
        &["--shared", "--holder", "carol"],
        &in_until_go(&dir, "c"),
    );
    for (me, p) in [("a", &a), ("c", &c)] {
        assert!(
            appears(&dir.join(format!("{me}-in")), Duration::from_secs(20)),
            "{}: {me}: {}",
            b.name,
            p.stderr()
        );
    }
    let (_, st) = status_json(b, &["status", &b.url, &key, "--json"]);
    let holders = st["shared"]["holders"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(holders.len(), 2, "{}: {st}", b.name);
    // alice's registration, found by her holder name.
    let slot = holders
        .iter()
        .find(|h| {
            h["holder"]
                .as_str()
                .is_some_and(|id| id.starts_with("alice:"))
        })
        .and_then(|h| h["key"].as_str())
        .unwrap_or_else(|| panic!("{}: no registration of alice: {st}", b.name))
        .to_owned();
    let out = b.output(&["break", &b.url, &slot, "--reason", "registration loss test"]);
    assert!(
        out.status.success(),
        "{}: {}",
        b.name,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        a.wait_timeout(Duration::from_secs(20)),
        Some(EXIT_LOST),
        "{}: {}",
        b.name,
        a.stderr()
    );
    assert!(
        c.child.try_wait().expect("try_wait").is_none(),
        "{}: the other shared run ended too: {}",
        b.name,
        c.stderr()
    );
    std::fs::write(dir.join("go"), "").expect("go");
    ended(b, &mut c, "c");
    let _ = std::fs::remove_dir_all(&dir);
}

/// --shared, --exclusive and --permits exclude one another, and --permits
/// takes 1 to 1024: usage errors, found before any connection.
#[test]
fn conflicting_modes_and_bad_permits_are_usage_errors() {
    let cases: [&[&str]; 7] = [
        &[
            "run",
            "etcd://127.0.0.1:1/x",
            "k",
            "--shared",
            "--exclusive",
            "--",
            "true",
        ],
        &[
            "run",
            "etcd://127.0.0.1:1/x",
            "k",
            "--shared",
            "--permits",
            "2",
            "--",
            "true",
        ],
        &[
            "run",
            "etcd://127.0.0.1:1/x",
            "k",
            "-x",
            "--permits",
            "2",
            "--",
            "true",
        ],
        &[
            "run",
            "etcd://127.0.0.1:1/x",
            "k",
            "--permits",
            "0",
            "--",
            "true",
        ],
        &[
            "run",
            "etcd://127.0.0.1:1/x",
            "k",
            "--permits",
            "1025",
            "--",
            "true",
        ],
        &["status", "etcd://127.0.0.1:1/x", "k", "--permits", "0"],
        &["status", "etcd://127.0.0.1:1/x", "k", "--permits", "-1"],
    ];
    for args in cases {
        let out = Command::new(LEASE)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run lease");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_USAGE), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        let said = if args.contains(&"0") || args.contains(&"1025") || args.contains(&"-1") {
            "--permits"
        } else {
            "cannot be used with"
        };
        assert!(err.contains(said), "{args:?}: {err}");
    }
    // And the modes are there, each alone.
    let out = Command::new(LEASE)
        .args(["run", "--help"])
        .output()
        .expect("run lease");
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in ["-s, --shared", "-x, --exclusive", "--permits <N>"] {
        assert!(help.contains(needle), "run --help lacks {needle:?}");
    }
}

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

macro_rules! shared_tests {
    ($($name:ident),*) => {$(
        mod $name {
            on_shared!($name:
                two_shared_runs_overlap_and_status_shows_them,
                exclusive_waits_for_shared_and_shuts_new_ones_out,
                two_permits_let_two_of_three_in,
                a_shared_run_is_stopped_when_its_registration_is_lost,
            );
        }
    )*};
}

#[cfg(feature = "etcd")]
shared_tests!(etcd);
#[cfg(feature = "nats")]
shared_tests!(nats);
#[cfg(feature = "postgres")]
shared_tests!(postgres);
#[cfg(feature = "redis")]
shared_tests!(redis);
