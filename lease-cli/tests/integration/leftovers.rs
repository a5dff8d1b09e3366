//! Nothing started under a lease outlives it, on each backend's test
//! server: a command's background job, a daemon that left its group and
//! session (double fork and `setsid`), and one that ignores SIGTERM, under
//! `lease run` and `lease elect`, when the command exits, when the lease is
//! lost, and when `lease` is killed with SIGKILL.
//!
//! Each first holder's processes append timestamps to `a.log`; the next
//! holder's command writes the time it started. No stamp of the first may
//! come after it. Every writer stops by itself after about 2.5 s, so nothing
//! outlives a failed test for long.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::e2e::{dead, fresh, stamps, wait_for_file, Backend, Proc, EXIT_LOST};

/// A writer: its pid to `{who}.pid`, then a timestamp to `{who}.log`
/// every 20 ms or a little more, `n` times (110: about 2.5 s); with
/// `ignore_term`, SIGTERM does not stop it.
fn writer(dir: &Path, who: &str, n: u32, ignore_term: bool) -> String {
    format!(
        "{trap}echo $$ > {d}/{who}.pid; for i in $(seq {n}); do date +%s%N >> {d}/{who}.log; sleep 0.02; done",
        trap = if ignore_term { "trap '' TERM; " } else { "" },
        d = dir.display()
    )
}

/// A command that daemonises `script` (a fork whose parent exits, then a
/// new session: out of the command's group and session, and an orphan),
/// waits until it has written to `a.log`, and exits 0 — or, with `stay`,
/// keeps running.
fn daemonising(dir: &Path, script: &str, stay: bool) -> String {
    let file = dir.join("daemon.sh");
    std::fs::write(&file, script).expect("daemon script");
    format!(
        "(setsid sh {f} </dev/null >/dev/null 2>&1 &); while [ ! -s {log} ]; do sleep 0.02; done; {tail}",
        f = file.display(),
        log = dir.join("a.log").display(),
        tail = if stay {
            "while :; do sleep 0.05; done"
        } else {
            "exit 0"
        }
    )
}

/// `args` then `-- sh -c script`.
fn with_script<'a>(args: &[&'a str], script: &'a str) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend(["--", "sh", "-c", script]);
    v
}

/// Waits until `who.log` has a stamp; returns the writer's pid.
fn writing(dir: &Path, who: &str) -> u32 {
    let pid = wait_for_file(
        &dir.join(format!("{who}.pid")),
        Duration::from_secs(20),
        "writer",
    )
    .parse()
    .expect("pid");
    let end = Instant::now() + Duration::from_secs(20);
    while stamps(&dir.join(format!("{who}.log"))).is_empty() {
        assert!(Instant::now() < end, "the writer never wrote");
        std::thread::sleep(Duration::from_millis(10));
    }
    pid
}

/// The next holder on the key (`run` or `elect`): records when its command
/// started, and exits 0.
fn next_holder(b: &Backend, verb: &str, key: &str, dir: &Path) -> Proc {
    let script = format!("date +%s%N > {d}/b.start", d = dir.display());
    let args = with_script(
        &[verb, &b.url, key, "--ttl", "2s", "--wait", "30s"],
        &script,
    );
    b.spawn(&args, &dir.join("b.err"))
}

/// No stamp in `a.log` after the next holder's command started; returns
/// how long before that start the last one was (ms).
fn no_overlap(b: &Backend, dir: &Path, next: &mut Proc, what: &str) -> u128 {
    assert_eq!(
        next.wait_timeout(Duration::from_secs(40)),
        Some(0),
        "{}: {what}: the next holder: {}",
        b.name,
        next.stderr()
    );
    let started: u128 = std::fs::read_to_string(dir.join("b.start"))
        .unwrap_or_default()
        .trim()
        .parse()
        .expect("the next holder's start");
    // A writer that survived writes again within 20 ms.
    std::thread::sleep(Duration::from_millis(300));
    let last = stamps(&dir.join("a.log")).into_iter().max().unwrap_or(0);
    assert!(
        last < started,
        "{}: {what}: a process started under the first lease wrote {} ms after the next holder's command started",
        b.name,
        (last - started) / 1_000_000
    );
    (started - last) / 1_000_000
}

/// `sh -c 'writer & exit 0'`: the command exits at once and leaves a
/// background job writing. By default `lease` says so, keeps the lease
/// until the job exits, then releases and exits 0.
fn a_background_job_keeps_the_lease(b: &Backend, verb: &str) {
    let (key, dir) = fresh(&format!("bg-{verb}-{}", b.name));
    let script = format!("{} & exit 0", writer(&dir, "a", 110, false));
    let mut first = b.spawn(
        &with_script(&[verb, &b.url, &key, "--ttl", "2s"], &script),
        &dir.join("a.err"),
    );
    writing(&dir, "a");
    let mut next = next_holder(b, verb, &key, &dir);
    let gap = no_overlap(b, &dir, &mut next, "background job");
    assert_eq!(
        first.wait_timeout(Duration::from_secs(10)),
        Some(0),
        "{}: {}",
        b.name,
        first.stderr()
    );
    let err = first.stderr();
    assert!(
        err.contains("waiting for ") && err.contains(" it left running (pids "),
        "{}: {err}",
        b.name
    );
    eprintln!(
        "{} {verb}: background job: the next holder started {gap} ms after its last write",
        b.name
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn run_waits_for_a_background_job(b: &Backend) {
    a_background_job_keeps_the_lease(b, "run");
}

fn elect_waits_for_a_background_job(b: &Backend) {
    a_background_job_keeps_the_lease(b, "elect");
}

/// A daemon (double fork, `setsid`): out of the command's group and
/// session. With the default `--leftovers wait` the lease is kept until it
/// exits; with `--leftovers stop` it is stopped (SIGTERM; or, ignoring it,
/// SIGKILL after --grace) and the lease released at once.
fn a_daemon_keeps_or_loses_the_lease(b: &Backend, stop: bool, ignore_term: bool) {
    let (key, dir) = fresh(&format!(
        "daemon-{}-{}-{}",
        if stop { "stop" } else { "wait" },
        if ignore_term { "noterm" } else { "term" },
        b.name
    ));
    let script = daemonising(&dir, &writer(&dir, "a", 110, ignore_term), false);
    let mut args = vec!["run", &b.url, &key, "--ttl", "3s", "--grace", "0.5s"];
    if stop {
        args.extend(["--leftovers", "stop"]);
    }
    let mut first = b.spawn(&with_script(&args, &script), &dir.join("a.err"));
    let pid = writing(&dir, "a");
    let mut next = next_holder(b, "run", &key, &dir);
    let gap = no_overlap(b, &dir, &mut next, "daemon");
    assert_eq!(
        first.wait_timeout(Duration::from_secs(10)),
        Some(0),
        "{}: {}",
        b.name,
        first.stderr()
    );
    assert!(dead(pid), "{}: the daemon outlived `lease`", b.name);
    let err = first.stderr();
    if stop {
        assert!(
            err.contains("stopping ") && err.contains(" it left running (pids "),
            "{}: {err}",
            b.name
        );
        // Stopped, not waited for: well before it would have ended.
        let written = stamps(&dir.join("a.log"));
        assert!(written.len() < 100, "{}: {} stamps", b.name, written.len());
        if ignore_term {
            assert!(err.contains("sending SIGKILL"), "{}: {err}", b.name);
        }
    } else {
        assert!(
            err.contains("waiting for ") && err.contains(" it left running (pids "),
            "{}: {err}",
            b.name
        );
        assert!(stamps(&dir.join("a.log")).len() >= 100, "{}", b.name);
    }
    eprintln!(
        "{}: daemon (stop {stop}, ignores SIGTERM {ignore_term}): the next holder started {gap} ms after its last write",
        b.name
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn run_waits_for_a_daemon(b: &Backend) {
    a_daemon_keeps_or_loses_the_lease(b, false, false);
}

fn leftovers_stop_stops_a_daemon(b: &Backend) {
    a_daemon_keeps_or_loses_the_lease(b, true, false);
}

fn leftovers_stop_kills_a_daemon_ignoring_sigterm(b: &Backend) {
    a_daemon_keeps_or_loses_the_lease(b, true, true);
}

/// A lease broken while the command runs, with a daemon that ignores
/// SIGTERM: the daemon is killed with the command, and nothing started
/// under the lease writes once `lease` has exited 76.
fn a_lost_lease_kills_a_daemon_ignoring_sigterm(b: &Backend) {
    let (key, dir) = fresh(&format!("lost-daemon-{}", b.name));
    let script = daemonising(&dir, &writer(&dir, "a", 300, true), true);
    let mut first = b.spawn(
        &with_script(
            &["run", &b.url, &key, "--ttl", "3s", "--grace", "0.3s"],
            &script,
        ),
        &dir.join("a.err"),
    );
    let pid = writing(&dir, "a");
    let broke = b.output(&["break", &b.url, &key, "--reason", "e2e: lost with a daemon"]);
    let broke_at = Instant::now();
    assert!(
        broke.status.success(),
        "{}: {}",
        b.name,
        String::from_utf8_lossy(&broke.stderr)
    );
    let code = first.wait_timeout(Duration::from_secs(10));
    let ended = now_ns();
    let took = broke_at.elapsed();
    assert_eq!(code, Some(EXIT_LOST), "{}: {}", b.name, first.stderr());
    assert!(
        dead(pid),
        "{}: the daemon outlived the lost lease: {}",
        b.name,
        first.stderr()
    );
    std::thread::sleep(Duration::from_millis(200));
    let last = stamps(&dir.join("a.log")).into_iter().max().unwrap_or(0);
    assert!(
        last < ended,
        "{}: the daemon wrote after `lease` exited",
        b.name
    );
    // Found out at the next renewal (TTL/3), stopped within the grace.
    assert!(took < Duration::from_secs(3), "{}: {took:?}", b.name);
    eprintln!(
        "{}: lost lease with a daemon ignoring SIGTERM: all stopped {} ms after the break",
        b.name,
        took.as_millis()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Nanoseconds since the epoch, as `date +%s%N` prints them.
fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// `lease` killed with SIGKILL (or frozen with SIGSTOP) while a daemon it
/// was waiting for runs: its watchdog kills the daemon by the write
/// deadline (2/3 of the 3 s TTL after the last renewal), before the next
/// holder can start. A frozen `lease`, continued, exits 76.
fn the_watchdog_kills_a_daemon(b: &Backend, freeze: bool) {
    let how = if freeze { "stopped" } else { "killed" };
    let (key, dir) = fresh(&format!("{how}-daemon-{}", b.name));
    // Long enough that only a kill ends it in time.
    let script = daemonising(&dir, &writer(&dir, "a", 300, true), false);
    let mut first = b.spawn(
        &with_script(&["run", &b.url, &key, "--ttl", "3s"], &script),
        &dir.join("a.err"),
    );
    let pid = writing(&dir, "a");
    // The command has exited; `lease` waits for the daemon.
    std::thread::sleep(Duration::from_millis(300));
    let lease_pid = first.child.id() as i32;
    if freeze {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(lease_pid, libc::SIGSTOP) };
    } else {
        first.child.kill().expect("kill -9 lease");
        first.child.wait().expect("reap lease");
    }
    let hit = Instant::now();
    let mut next = next_holder(b, "run", &key, &dir);
    while !dead(pid) && hit.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let death = hit.elapsed();
    let gap = no_overlap(b, &dir, &mut next, how);
    if freeze {
        // SAFETY: as above.
        unsafe { libc::kill(lease_pid, libc::SIGCONT) };
        assert_eq!(
            first.wait_timeout(Duration::from_secs(10)),
            Some(EXIT_LOST),
            "{}: {}",
            b.name,
            first.stderr()
        );
    }
    assert!(dead(pid), "{}: the daemon outlived `lease` by 10 s", b.name);
    assert!(
        death <= Duration::from_millis(2300),
        "{}: the daemon died {death:?} after `lease` was {how}",
        b.name
    );
    eprintln!(
        "{}: `lease` {how}: the daemon died {} ms later, {gap} ms before the next holder started",
        b.name,
        death.as_millis()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn the_watchdog_kills_a_daemon_when_lease_is_killed(b: &Backend) {
    the_watchdog_kills_a_daemon(b, false);
}

fn the_watchdog_kills_a_daemon_when_lease_is_stopped(b: &Backend) {
    the_watchdog_kills_a_daemon(b, true);
}

/// The pid of `lease`'s watchdog (its child running `lease __watchdog`).
fn watchdog_of(lease: u32) -> u32 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok())
                });
            if parent == Some(lease) && cmdline.split(|b| *b == 0).any(|a| a == b"__watchdog") {
                return pid;
            }
        }
        assert!(Instant::now() < end, "no watchdog under {lease}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A daemon the watchdog never saw while `lease` lived: it is started
/// (double fork, `setsid`) while the watchdog is frozen, and `lease` is
/// killed with SIGKILL before the watchdog runs again, so the daemon went
/// to init from a session and group no process the watchdog knows led.
/// The watchdog still finds it, by the environment it inherited (this
/// term's LEASE_KEY, LEASE_FENCE and LEASE_HOLDER), and kills it.
fn the_watchdog_finds_a_daemon_it_never_saw(b: &Backend) {
    let (key, dir) = fresh(&format!("unseen-daemon-{}", b.name));
    let daemon = daemonising(&dir, &writer(&dir, "a", 300, true), false);
    let script = format!(
        "touch {d}/ready; while [ ! -f {d}/go ]; do sleep 0.02; done; {daemon}",
        d = dir.display()
    );
    let mut first = b.spawn(
        &with_script(&["run", &b.url, &key, "--ttl", "3s"], &script),
        &dir.join("a.err"),
    );
    wait_for_file_exists(&dir.join("ready"));
    let lease_pid = first.child.id();
    let watchdog = watchdog_of(lease_pid);
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(watchdog as i32, libc::SIGSTOP) };
    std::fs::write(dir.join("go"), "").expect("go");
    let pid = writing(&dir, "a");
    // The command has exited; `lease` waits for the daemon it inherited.
    std::thread::sleep(Duration::from_millis(200));
    first.child.kill().expect("kill -9 lease");
    first.child.wait().expect("reap lease");
    let killed = Instant::now();
    // SAFETY: as above.
    unsafe { libc::kill(watchdog as i32, libc::SIGCONT) };
    let mut next = next_holder(b, "run", &key, &dir);
    while !dead(pid) && killed.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let death = killed.elapsed();
    let gap = no_overlap(b, &dir, &mut next, "unseen daemon");
    assert!(
        dead(pid),
        "{}: the unseen daemon outlived `lease` by 10 s",
        b.name
    );
    assert!(
        death <= Duration::from_millis(2300),
        "{}: the unseen daemon died {death:?} after `lease` was killed",
        b.name
    );
    eprintln!(
        "{}: a daemon the watchdog never saw died {} ms after `lease` was killed, {gap} ms before the next holder started",
        b.name,
        death.as_millis()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn wait_for_file_exists(path: &Path) {
    let end = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(Instant::now() < end, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--leftovers` and its two values are in the help of `run` and `elect`;
/// a value that is neither is a usage error.
#[test]
fn leftovers_is_documented_and_checked() {
    use std::process::Command;
    for verb in ["run", "elect"] {
        let out = Command::new(crate::e2e::LEASE)
            .args([verb, "--help"])
            .output()
            .expect("run lease");
        let text = String::from_utf8_lossy(&out.stdout);
        for needle in ["--leftovers", "wait", "stop", "subreaper"] {
            assert!(
                verb == "elect" && needle == "subreaper" || text.contains(needle),
                "{verb} --help lacks {needle:?}"
            );
        }
    }
    let bad = Command::new(crate::e2e::LEASE)
        .args([
            "run",
            "etcd://127.0.0.1:1/x",
            "k",
            "--leftovers",
            "keep",
            "--",
            "true",
        ])
        .output()
        .expect("run lease");
    assert_eq!(bad.status.code(), Some(crate::e2e::EXIT_USAGE));
}

macro_rules! leftover_tests {
    ($($backend:ident),* $(,)?) => {$(
        mod $backend {
            leftover_tests!(@each $backend:
                run_waits_for_a_background_job,
                elect_waits_for_a_background_job,
                run_waits_for_a_daemon,
                leftovers_stop_stops_a_daemon,
                leftovers_stop_kills_a_daemon_ignoring_sigterm,
                a_lost_lease_kills_a_daemon_ignoring_sigterm,
                the_watchdog_kills_a_daemon_when_lease_is_killed,
                the_watchdog_kills_a_daemon_when_lease_is_stopped,
                the_watchdog_finds_a_daemon_it_never_saw,
            );
        }
    )*};
    (@each $backend:ident: $($test:ident),* $(,)?) => {$(
        #[test]
        fn $test() {
            if let Some(b) = crate::e2e::backend(stringify!($backend)) {
                super::$test(&b);
            }
        }
    )*};
}

#[cfg(feature = "etcd")]
leftover_tests!(etcd);
#[cfg(feature = "nats")]
leftover_tests!(nats);
#[cfg(feature = "s3")]
leftover_tests!(s3);
#[cfg(feature = "mongo")]
leftover_tests!(mongo);
#[cfg(feature = "postgres")]
leftover_tests!(postgres);
#[cfg(feature = "redis")]
leftover_tests!(redis);
