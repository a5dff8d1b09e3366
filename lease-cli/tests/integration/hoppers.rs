//! Leftovers that are hard to see or to stop. Processes that keep changing
//! their pid ("hoppers": fork, parent exits, over and over): one walk of a
//! tree is not atomic and can miss a hopper, so neither the wait for
//! leftovers nor the stop at a loss may end on a single look that found
//! nothing. A leftover `lease` may not signal: the lease is kept until it
//! exits.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::e2e::{fresh, stamps, wait_for_file, Backend, Proc};

/// A process that keeps changing its pid: every `pause` seconds it forks and
/// the parent exits (as a daemon's double fork does, over and over). It
/// appends a timestamp to `a.log` every 20 ms for `secs` seconds, and
/// with `setsid` starts a new session at every hop.
fn hopper(dir: &Path, secs: f64, setsid: bool, pause: f64, ignore_term: bool) -> String {
    let file = dir.join("hop.pl");
    std::fs::write(
        &file,
        format!(
            r#"use Time::HiRes qw(time sleep); use POSIX ();
$SIG{{TERM}} = 'IGNORE' if {i};
my $end = time + {secs}; my $last = 0;
open P, ">", "{d}/a.pid"; print P "$$\n"; close P;
while (time < $end) {{
  if (time - $last >= 0.02) {{ open F, ">>", "{d}/a.log"; printf F "%.0f\n", time * 1e9; close F; $last = time; }}
  sleep {pause};
  my $p = fork; exit 0 if $p;
  POSIX::setsid() if {s};
}}
"#,
            d = dir.display(),
            s = u8::from(setsid),
            i = u8::from(ignore_term),
        ),
    )
    .expect("hopper script");
    format!("perl {}", file.display())
}

fn writing(dir: &Path) {
    wait_for_file(&dir.join("a.pid"), Duration::from_secs(20), "hopper");
    let end = Instant::now() + Duration::from_secs(20);
    while stamps(&dir.join("a.log")).is_empty() {
        assert!(Instant::now() < end, "the hopper never wrote");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn next_holder(b: &Backend, key: &str, dir: &Path) -> Proc {
    let script = format!("date +%s%N > {d}/b.start", d = dir.display());
    b.spawn(
        &[
            "run", &b.url, key, "--ttl", "2s", "--wait", "30s", "--", "sh", "-c", &script,
        ],
        &dir.join("b.err"),
    )
}

/// The last stamp in `a.log` minus the next holder's start (ms; positive:
/// the first lease's process wrote while the next holder held the key).
fn overlap(b: &Backend, dir: &Path, next: &mut Proc) -> i128 {
    assert_eq!(
        next.wait_timeout(Duration::from_secs(40)),
        Some(0),
        "{}: the next holder: {}",
        b.name,
        next.stderr()
    );
    let started: i128 = std::fs::read_to_string(dir.join("b.start"))
        .unwrap_or_default()
        .trim()
        .parse()
        .expect("the next holder's start");
    std::thread::sleep(Duration::from_millis(300));
    let last = stamps(&dir.join("a.log")).into_iter().max().unwrap_or(0) as i128;
    (last - started) / 1_000_000
}

/// `--leftovers wait` (the default): the command leaves a process that
/// hops from pid to pid. `lease` must hold the key until it is gone; a
/// scan of its subtree that reads `lease`'s children, and only later finds
/// the one it saw ended, misses the new one (re-parented to `lease` after
/// the read), and `lease` releases while it runs.
fn a_hopping_leftover_keeps_the_lease(b: &Backend) {
    let (key, dir) = fresh(&format!("hop-wait-{}", b.name));
    let script = format!("{} & exit 0", hopper(&dir, 4.0, false, 0.001, false));
    let started = Instant::now();
    let mut first = b.spawn(
        &[
            "run", &b.url, &key, "--ttl", "2s", "--", "sh", "-c", &script,
        ],
        &dir.join("a.err"),
    );
    writing(&dir);
    let mut next = next_holder(b, &key, &dir);
    let first_code = first.wait_timeout(Duration::from_secs(20));
    let first_took = started.elapsed();
    let over = overlap(b, &dir, &mut next);
    assert!(
        over < 0,
        "{}: the first lease's leftover wrote {over} ms after the next holder's command started \
         (first `lease` exited {first_code:?} after {first_took:?}; the hopper runs 4 s): {}",
        b.name,
        first.stderr()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The lease is broken while the command runs and a process it started
/// hops from pid to pid, each hop in a session of its own: everything
/// started under the lease must be dead once `lease` exits 76.
fn a_hopping_daemon_dies_with_a_lost_lease(b: &Backend) {
    let script = |dir: &Path| hopper(dir, 3.0, true, 0.0002, false);
    dies_with_a_lost_lease(b, "hop-lost", script, &["--ttl", "3s", "--grace", "0.3s"]);
}

/// As above, with a hopper that ignores SIGTERM (it must get SIGKILL even
/// when one look at the tree misses it).
fn a_hopper_ignoring_sigterm_dies_with_a_lost_lease(b: &Backend) {
    let script = |dir: &Path| hopper(dir, 6.0, false, 0.001, true);
    dies_with_a_lost_lease(
        b,
        "hop-lost-noterm",
        script,
        &["--ttl", "10s", "--grace", "2s"],
    );
}

/// Runs `hopper` under `lease run` with `timing`, breaks the lease, and
/// checks that nothing it started writes after `lease` exited.
fn dies_with_a_lost_lease(
    b: &Backend,
    name: &str,
    hopper: impl Fn(&Path) -> String,
    timing: &[&str],
) {
    let (key, dir) = fresh(&format!("{name}-{}", b.name));
    let script = format!("{} & while :; do sleep 0.05; done", hopper(&dir));
    let mut args = vec!["run", &b.url, &key];
    args.extend_from_slice(timing);
    args.extend(["--", "sh", "-c", &script]);
    let mut first = b.spawn(&args, &dir.join("a.err"));
    writing(&dir);
    let broke = b.output(&["break", &b.url, &key, "--reason", "e2e: hopper"]);
    assert!(
        broke.status.success(),
        "{}",
        String::from_utf8_lossy(&broke.stderr)
    );
    let code = first.wait_timeout(Duration::from_secs(10));
    let ended = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    std::thread::sleep(Duration::from_millis(300));
    let last = stamps(&dir.join("a.log")).into_iter().max().unwrap_or(0);
    assert!(
        last < ended,
        "{}: the hopper wrote {} ms after `lease` exited {code:?}: {}",
        b.name,
        (last - ended) / 1_000_000,
        first.stderr()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "etcd")]
mod etcd {
    #[test]
    fn a_hopping_leftover_keeps_the_lease() {
        if let Some(b) = crate::e2e::backend("etcd") {
            super::a_hopping_leftover_keeps_the_lease(&b);
        }
    }

    #[test]
    fn a_hopping_daemon_dies_with_a_lost_lease() {
        if let Some(b) = crate::e2e::backend("etcd") {
            super::a_hopping_daemon_dies_with_a_lost_lease(&b);
        }
    }
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_a_hopper_ignoring_sigterm_dies_with_a_lost_lease() {
    if let Some(b) = crate::e2e::backend("etcd") {
        a_hopper_ignoring_sigterm_dies_with_a_lost_lease(&b);
    }
}

/// A leftover that `lease` may not signal (run as root by a set-uid
/// program, as `sudo` does, under a `lease` run by another user) with
/// `--leftovers stop`: SIGTERM and SIGKILL both fail with EPERM, so `lease`
/// must keep the lease until it exits rather than let the next holder in
/// beside it. Needs root (to make the set-uid program); says it skipped
/// otherwise.
fn an_unkillable_leftover_keeps_the_lease(b: &Backend) {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: skipped");
        return;
    }
    let (key, dir) = fresh(&format!("suid-{}", b.name));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let src = dir.join("su.c");
    std::fs::write(
        &src,
        "#define _GNU_SOURCE\n#include <unistd.h>\nint main(int c, char **v) { \
         if (setresgid(0,0,0) || setresuid(0,0,0)) return 99; \
         execv(\"/bin/sh\", v); return 98; }\n",
    )
    .expect("su.c");
    let su = dir.join("su");
    let built = std::process::Command::new("cc")
        .arg("-o")
        .arg(&su)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(built.success());
    std::fs::set_permissions(&su, std::fs::Permissions::from_mode(0o4755)).expect("setuid");
    let writer = dir.join("w.sh");
    std::fs::write(
        &writer,
        format!(
            "echo $$ > {d}/a.pid; for i in $(seq 200); do date +%s%N >> {d}/a.log; sleep 0.02; done",
            d = dir.display()
        ),
    )
    .expect("writer");
    let script = format!(
        "{} {} & while [ ! -s {d}/a.log ]; do sleep 0.02; done; exit 0",
        su.display(),
        writer.display(),
        d = dir.display()
    );
    let err = std::fs::File::create(dir.join("a.err")).expect("log");
    let child = b
        .cmd(&[
            "run",
            &b.url,
            &key,
            "--ttl",
            "3s",
            "--grace",
            "0.3s",
            "--leftovers",
            "stop",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .uid(65534)
        .gid(65534)
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn lease as nobody");
    let mut first = Proc {
        child,
        log: dir.join("a.err"),
    };
    writing(&dir);
    let code = first.wait_timeout(Duration::from_secs(10));
    let mut next = next_holder(b, &key, &dir);
    let over = overlap(b, &dir, &mut next);
    assert!(
        over < 0,
        "{}: a leftover `lease` could not kill wrote {over} ms after the next holder's command \
         started; `lease` exited {code:?}: {}",
        b.name,
        first.stderr()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_an_unkillable_leftover_keeps_the_lease() {
    if let Some(b) = crate::e2e::backend("etcd") {
        an_unkillable_leftover_keeps_the_lease(&b);
    }
}
