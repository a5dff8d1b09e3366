//! Daily use of `lease` as users of flock(1), `etcdctl lock`, `consul lock`
//! and ShedLock expect it: skipping a held key and a minimum hold for cron
//! singletons, a wait that says what it waits for, `--timeout` that cannot
//! be mistaken, output to a closed pipe, a binary upgraded under a waiting
//! run, and the man pages.

use std::io::BufRead;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::e2e::{
    backend, fresh, wait_for_file, Backend, Proc, EXIT_NOT_ACQUIRED, EXIT_USAGE, LEASE,
};

/// `lease hold` on `key` as `holder`, once it holds the key.
fn hold(b: &Backend, key: &str, dir: &Path, holder: &str) -> Proc {
    let mut held = b.spawn(
        &["hold", &b.url, key, "--ttl", "5s", "--holder", holder],
        &dir.join(format!("{holder}.err")),
    );
    let mut fence = String::new();
    std::io::BufReader::new(held.child.stdout.take().expect("stdout"))
        .read_line(&mut fence)
        .expect("hold prints the fence");
    assert!(fence.trim().parse::<u64>().is_ok(), "{}: {fence:?}", b.name);
    held
}

/// Ends a `lease hold` by SIGTERM: it releases the key and exits 0.
fn let_go(b: &Backend, held: &mut Proc) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(held.child.id() as i32, libc::SIGTERM) };
    assert_eq!(
        held.wait_timeout(Duration::from_secs(10)),
        Some(0),
        "{}: {}",
        b.name,
        held.stderr()
    );
}

/// Whether `key` is held (`lease status -q`: 0 held, 1 free).
fn is_held(b: &Backend, key: &str) -> bool {
    let out = b.output(&["status", &b.url, key, "-q"]);
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!(
            "{}: status failed: {}",
            b.name,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Waits until the file `log` contains `needle`; false after `limit`.
fn log_says(log: &Path, needle: &str, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if std::fs::read_to_string(log).is_ok_and(|s| s.contains(needle)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// `lease hold` and `lease break` whose reader went away end quietly, by
/// SIGPIPE, as the other commands do (no panic); `hold` gives the lease
/// back first.
fn hold_and_break_end_quietly_on_a_closed_stdout(b: &Backend) {
    let (key, _dir) = fresh(&format!("closed-out-{}", b.name));
    let cases: [&[&str]; 3] = [
        &["hold", &b.url, &key, "--ttl", "5s"],
        &["break", &b.url, &key, "--reason", "closed pipe"],
        &["break", &b.url, &key, "--reason", "closed pipe", "--json"],
    ];
    for args in cases {
        let mut child = b
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lease");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait for lease");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.is_empty(), "{}: {args:?}: {err}", b.name);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{}: {args:?}: {:?}",
            b.name,
            out.status
        );
        assert!(!is_held(b, &key), "{}: {args:?} left the key held", b.name);
    }
}

/// A cron singleton: `--skip-if-held` (flock's -n) skips a held key with
/// exit 75 and one line naming the holder (none with -q; -E 0 counts the
/// skip as success), and `--hold-at-least` keeps the key after a quick
/// command until that long after it was taken, so a later run skips.
fn skip_if_held_and_hold_at_least(b: &Backend) {
    let (key, dir) = fresh(&format!("cron-{}", b.name));
    let ran = dir.join("ran-a");
    let script = format!("echo $LEASE_FENCE > {}", ran.display());
    let mut a = b.spawn(
        &[
            "run",
            &b.url,
            &key,
            "--skip-if-held",
            "--hold-at-least",
            "4s",
            "--holder",
            "alice",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &dir.join("a.err"),
    );
    wait_for_file(&ran, Duration::from_secs(20), "first run");
    let ran_at = Instant::now();
    let ran_b = dir.join("ran-b");
    let touch = ran_b.display().to_string();
    let out = b.output(&["run", &b.url, &key, "--skip-if-held", "--", "touch", &touch]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(EXIT_NOT_ACQUIRED),
        "{}: {err}",
        b.name
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{}: {err}", b.name);
    assert!(
        err.contains("alice") && err.contains("skipped"),
        "{}: {err}",
        b.name
    );
    let out = b.output(&["run", &b.url, &key, "-n", "-q", "--", "touch", &touch]);
    assert_eq!(out.status.code(), Some(EXIT_NOT_ACQUIRED), "{}", b.name);
    assert!(out.stderr.is_empty(), "{}: {:?}", b.name, out.stderr);
    let out = b.output(&[
        "run", &b.url, &key, "-n", "-q", "-E", "0", "--", "touch", &touch,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", b.name);
    assert!(!ran_b.exists(), "{}: a skipped run ran its command", b.name);
    // Still held, well after its command ended.
    std::thread::sleep(Duration::from_secs(2).saturating_sub(ran_at.elapsed()));
    assert!(
        a.child.try_wait().expect("try_wait").is_none(),
        "{}: {}",
        b.name,
        a.stderr()
    );
    assert!(is_held(b, &key), "{}", b.name);
    assert_eq!(
        a.wait_timeout(Duration::from_secs(15)),
        Some(0),
        "{}: {}",
        b.name,
        a.stderr()
    );
    assert!(
        ran_at.elapsed() >= Duration::from_millis(3000),
        "{}: released after {:?}",
        b.name,
        ran_at.elapsed()
    );
    assert!(!is_held(b, &key), "{}: not released", b.name);
    assert!(a.stderr().is_empty(), "{}: {}", b.name, a.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run that has to wait says once on stderr who holds the key (as flock
/// --verbose), -q keeps it quiet, and -w bounds the wait as flock -w does.
fn a_wait_names_the_holder_once(b: &Backend) {
    let (key, dir) = fresh(&format!("wait-note-{}", b.name));
    let mut held = hold(b, &key, &dir, "alice");
    let mut loud = b.spawn(&["run", &b.url, &key, "--", "true"], &dir.join("loud.err"));
    let mut quiet = b.spawn(
        &["run", &b.url, &key, "-q", "--", "true"],
        &dir.join("quiet.err"),
    );
    assert!(
        log_says(&loud.log, "waiting", Duration::from_secs(10)),
        "{}: {}",
        b.name,
        loud.stderr()
    );
    let bounded = b.output(&["run", &b.url, &key, "-w", "1s", "--", "true"]);
    assert_eq!(bounded.status.code(), Some(EXIT_NOT_ACQUIRED), "{}", b.name);
    let_go(b, &mut held);
    for p in [&mut loud, &mut quiet] {
        assert_eq!(
            p.wait_timeout(Duration::from_secs(20)),
            Some(0),
            "{}: {}",
            b.name,
            p.stderr()
        );
    }
    let note = loud.stderr();
    assert_eq!(note.trim_end().lines().count(), 1, "{}: {note}", b.name);
    assert!(
        note.contains("alice") && note.contains(&key),
        "{}: {note}",
        b.name
    );
    assert!(quiet.stderr().is_empty(), "{}: {}", b.name, quiet.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A waiting `lease run` whose binary is replaced (an upgrade) takes its
/// grant later and still starts its watchdog and the command.
fn an_upgraded_binary_still_starts_its_watchdog(b: &Backend) {
    let (key, dir) = fresh(&format!("upgrade-{}", b.name));
    let copy = dir.join("lease");
    std::fs::copy(LEASE, &copy).expect("copy lease");
    let mut held = hold(b, &key, &dir, "old");
    let ran = dir.join("ran");
    let script = format!("echo ran > {}", ran.display());
    let spawn = || {
        let mut c = b.cmd(&["run", &b.url, &key, "--", "sh", "-c", &script]);
        c.program_is(&copy);
        c
    };
    let log = dir.join("waiter.err");
    let mut waiter = spawn_retrying(spawn, &log);
    // Waiting: it says so (and had it not, it is waiting by now).
    let _ = log_says(&log, "waiting", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        waiter.child.try_wait().expect("try_wait").is_none(),
        "{}: {}",
        b.name,
        waiter.stderr()
    );
    // The upgrade: the file it was started from is replaced.
    std::fs::remove_file(&copy).expect("remove the copy");
    std::fs::write(&copy, "#!/bin/sh\nexit 99\n").expect("replace the copy");
    let_go(b, &mut held);
    assert_eq!(
        waiter.wait_timeout(Duration::from_secs(20)),
        Some(0),
        "{}: {}",
        b.name,
        waiter.stderr()
    );
    assert_eq!(
        wait_for_file(&ran, Duration::from_secs(1), "the command"),
        "ran"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `Command` for `lease` with another program path.
trait ProgramIs {
    fn program_is(&mut self, program: &Path);
}

impl ProgramIs for Command {
    fn program_is(&mut self, program: &Path) {
        let mut other = Command::new(program);
        other.args(self.get_args()).stdin(Stdio::null());
        for (k, v) in self.get_envs() {
            if let Some(v) = v {
                other.env(k, v);
            }
        }
        *self = other;
    }
}

/// Spawns `make()` with stderr to `log`, retrying while the kernel says the
/// fresh copy is busy (a process forked by another test meanwhile may hold
/// its write descriptor for an instant).
fn spawn_retrying(make: impl Fn() -> Command, log: &Path) -> Proc {
    for _ in 0..50 {
        let err = std::fs::File::create(log).expect("log file");
        match make().stdout(Stdio::null()).stderr(err).spawn() {
            Ok(child) => {
                return Proc {
                    child,
                    log: log.to_owned(),
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("spawn the copy of lease: {e}"),
        }
    }
    panic!("the copy of lease stayed busy");
}

/// `--timeout` is refused with a message naming --wait and
/// --request-timeout; --request-timeout bounds a request; the help of
/// `run` says why the wait defaults to forever.
#[test]
fn timeout_is_refused_and_request_timeout_bounds_requests() {
    let out = Command::new(LEASE)
        .args([
            "run",
            "etcd://127.0.0.1:1/x",
            "k",
            "--timeout",
            "5s",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run lease");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{err}");
    assert!(
        err.contains("--wait") && err.contains("--request-timeout"),
        "{err}"
    );
    let started = Instant::now();
    let out = Command::new(LEASE)
        .args([
            "status",
            "etcd://127.0.0.1:9/x",
            "k",
            "--request-timeout",
            "1s",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run lease");
    assert_eq!(out.status.code(), Some(69));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let out = Command::new(LEASE)
        .args(["run", "--help"])
        .output()
        .expect("run lease");
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--request-timeout",
        "-w, --wait",
        "Default: forever",
        "--skip-if-held",
        "--hold-at-least",
        "-q, --quiet",
    ] {
        assert!(
            help.contains(needle),
            "run --help lacks {needle:?}:\n{help}"
        );
    }
    assert!(!help.contains("--timeout <"), "{help}");
}

/// `lease man --dir DIR` writes lease.1 and the page of every subcommand
/// lease.1 refers to.
#[test]
fn man_pages_for_every_subcommand() {
    let (_, dir) = fresh("man");
    let out = Command::new(LEASE)
        .args(["man", "--dir"])
        .arg(&dir)
        .output()
        .expect("run lease");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let main = std::fs::read_to_string(dir.join("lease.1")).expect("lease.1");
    for sub in ["run", "hold", "elect", "leader", "status", "watch", "break"] {
        let page = dir.join(format!("lease-{sub}.1"));
        let text =
            std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        assert!(text.contains(".TH"), "{}", page.display());
        assert!(
            main.contains(&format!("lease\\-{sub}(1)")),
            "lease.1 does not refer to lease-{sub}(1)"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
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

#[cfg(feature = "etcd")]
mod etcd {
    on_shared!(etcd:
        hold_and_break_end_quietly_on_a_closed_stdout,
        skip_if_held_and_hold_at_least,
        a_wait_names_the_holder_once,
        an_upgraded_binary_still_starts_its_watchdog,
    );
}

#[cfg(feature = "nats")]
mod nats {
    on_shared!(nats: skip_if_held_and_hold_at_least, a_wait_names_the_holder_once);
}

/// Errors speak the command line's words: the flag given, and a cause in
/// words rather than a client's `Debug` or a library method's name.
#[test]
fn errors_speak_the_cli_words() {
    let out = Command::new(LEASE)
        .args([
            "status",
            "postgres://u:p@127.0.0.1:9/db",
            "k",
            "--cacert",
            "/etc/hosts",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run lease");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{err}");
    assert!(
        err.contains("--cacert") && !err.contains("Connect::"),
        "{err}"
    );
    for url in ["etcd://127.0.0.1:9/x", "nats://127.0.0.1:9/x"] {
        let out = Command::new(LEASE)
            .args(["status", url, "k", "--request-timeout", "3s"])
            .stdin(Stdio::null())
            .output()
            .expect("run lease");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{err}");
        assert!(!err.contains("Os {") && !err.contains("tonic::"), "{err}");
        assert!(err.to_lowercase().contains("connection refused"), "{err}");
    }
}
