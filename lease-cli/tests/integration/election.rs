//! `lease elect` and `lease leader` end to end, on each backend's test
//! server: one leader's command at a time, handover at the command's exit
//! (resign, not expiry), the leader as `lease leader` prints it and as
//! `lease leader --watch --json` follows it, re-campaigning after a loss.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::e2e::{
    fresh, wait_for_file, Backend, Proc, EXIT_LOST, EXIT_NOT_ACQUIRED, EXIT_USAGE, LEASE,
};

/// `lease leader --json` once, as one JSON object.
fn leader_json(b: &Backend, key: &str) -> Value {
    let out = b.output(&["leader", &b.url, key, "--json"]);
    assert!(
        out.status.success(),
        "{}: leader failed: {}",
        b.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim().lines().count(), 1, "{}: {text}", b.name);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{}: {e}: {text}", b.name))
}

/// The `NAME` of a holder id `NAME:<random>`.
fn holder_name(v: &Value) -> &str {
    v["holder"]
        .as_str()
        .unwrap_or("")
        .split(':')
        .next()
        .unwrap_or("")
}

/// A line of `lease leader --watch --json` as `none` or `NAME:VALUE:FENCE`.
fn summary(v: &Value) -> String {
    match v["leader"].as_bool() {
        Some(false) => "none".into(),
        Some(true) => format!(
            "{}:{}:{}",
            holder_name(v),
            v["value"].as_str().unwrap_or("?"),
            v["fence"]
        ),
        None => format!("not a leader line: {v}"),
    }
}

/// The lines `lease leader --watch --json` wrote to `path` so far.
fn watched(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect()
}

/// Two candidates: only the first runs its command while it leads (and a
/// `--wait 0` candidate is refused with 75); `lease leader` names the first
/// with its value and fence; when the first's command exits it resigns and
/// the second takes over at once (well within the TTL, which an expiry
/// would take), with a higher fence; then there is no leader, and
/// `lease leader --watch --json` has reported each of these in order.
fn candidates_take_turns_and_hand_over(b: &Backend) {
    let (key, dir) = fresh(&format!("elect-{}", b.name));
    let ttl = Duration::from_secs(4);
    let log = dir.join("log");
    let go = dir.join("go");
    let watch_out = dir.join("watch.out");
    let mut watch = Proc {
        child: b
            .cmd(&[
                "leader",
                &b.url,
                &key,
                "--watch",
                "--json",
                "--interval",
                "100ms",
            ])
            .stdout(std::fs::File::create(&watch_out).expect("watch.out"))
            .stderr(std::fs::File::create(dir.join("watch.err")).expect("watch.err"))
            .spawn()
            .expect("spawn leader --watch"),
        log: dir.join("watch.err"),
    };
    wait_for_file(&watch_out, Duration::from_secs(20), "leader --watch");

    let script = |who: &str, wait_go: bool| {
        format!(
            "echo \"$LEASE_FENCE $LEASE_HOLDER $LEASE_KEY\" > {d}/{who}.env; echo {who}-start >> {log}; {wait}echo {who}-end >> {log}",
            d = dir.display(),
            log = log.display(),
            wait = if wait_go {
                format!("while [ ! -f {} ]; do sleep 0.05; done; ", go.display())
            } else {
                // Long enough for a polling observer to see this leader.
                "sleep 1; ".to_owned()
            }
        )
    };
    let (sa, sb) = (script("a", true), script("b", false));
    let mut a = b.spawn(
        &[
            "elect", &b.url, &key, "--value", "alpha", "--ttl", "4s", "--holder", "alice", "--",
            "sh", "-c", &sa,
        ],
        &dir.join("a.err"),
    );
    let a_env = wait_for_file(&dir.join("a.env"), Duration::from_secs(20), "first leader");
    let mut bob = b.spawn(
        &[
            "elect", &b.url, &key, "--value", "beta", "--ttl", "4s", "--holder", "bob", "--", "sh",
            "-c", &sb,
        ],
        &dir.join("b.err"),
    );
    let refused = b.output(&["elect", &b.url, &key, "--wait", "0", "--", "true"]);
    let refused_err = String::from_utf8_lossy(&refused.stderr).to_string();
    assert_eq!(
        refused.status.code(),
        Some(EXIT_NOT_ACQUIRED),
        "{}: {refused_err}",
        b.name
    );
    assert_eq!(
        refused_err.trim().lines().count(),
        1,
        "{}: {refused_err}",
        b.name
    );

    let fields: Vec<&str> = a_env.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{}: {a_env}", b.name);
    let fa: u64 = fields[0].parse().expect("fence");
    assert!(fields[1].starts_with("alice:"), "{}: {a_env}", b.name);
    assert_eq!(fields[2], key, "{}: {a_env}", b.name);
    let now = leader_json(b, &key);
    assert_eq!(now["leader"], true, "{}: {now}", b.name);
    assert_eq!(now["key"], key.as_str(), "{}: {now}", b.name);
    assert_eq!(now["holder"], fields[1], "{}: {now}", b.name);
    assert_eq!(now["fence"], fa, "{}: {now}", b.name);
    assert_eq!(now["value"], "alpha", "{}: {now}", b.name);
    assert_eq!(now["value_encoding"], "utf8", "{}: {now}", b.name);
    assert_eq!(now["value_bytes"], 5, "{}: {now}", b.name);
    let text = b.output(&["leader", &b.url, &key]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("led by {}", fields[1]))
            && text.contains(&format!("fence {fa}"))
            && text.contains("value \"alpha\""),
        "{}: {text}",
        b.name
    );

    // Bob must still be waiting while Alice leads.
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        !dir.join("b.env").exists(),
        "{}: bob ran while alice led",
        b.name
    );
    std::fs::write(&go, "").expect("go");
    let told = Instant::now();
    let b_env = wait_for_file(
        &dir.join("b.env"),
        Duration::from_secs(10),
        "second leader after the handover",
    );
    let took = told.elapsed();
    // An expiry would take at least 0.6 TTL after the first's exit (its
    // last renewal was at most 0.37 TTL before); a resignation, a watch
    // round trip or a poll.
    assert!(
        took < ttl / 2,
        "{}: the second candidate led {took:?} after the first's command was told to finish: \
         that is an expiry, not a handover",
        b.name
    );
    assert_eq!(
        a.wait_timeout(Duration::from_secs(10)),
        Some(0),
        "{}: {}",
        b.name,
        a.stderr()
    );
    assert_eq!(
        bob.wait_timeout(Duration::from_secs(20)),
        Some(0),
        "{}: {}",
        b.name,
        bob.stderr()
    );
    let fb: u64 = b_env
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .expect("fence");
    assert!(fb > fa, "{}: fence {fb} after {fa}", b.name);
    assert_eq!(
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .collect::<Vec<_>>(),
        ["a-start", "a-end", "b-start", "b-end"],
        "{}: the leaders' commands overlapped",
        b.name
    );
    let after = leader_json(b, &key);
    assert_eq!(after["leader"], false, "{}: {after}", b.name);

    // The watcher saw: no leader, alice, (perhaps no leader), bob, no leader.
    let end = Instant::now() + Duration::from_secs(15);
    let seen = loop {
        let lines = watched(&watch_out);
        let seen: Vec<String> = lines.iter().map(summary).collect();
        let done =
            seen.iter().any(|s| s.starts_with("bob:")) && seen.last().is_some_and(|s| s == "none");
        if done || Instant::now() > end {
            for l in &lines {
                assert!(l["at"].is_string(), "{}: no \"at\" in {l}", b.name);
            }
            break seen;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (alice, bob) = (format!("alice:alpha:{fa}"), format!("bob:beta:{fb}"));
    let none = "none".to_owned();
    let direct = [none.clone(), alice.clone(), bob.clone(), none.clone()];
    let via_none = [none.clone(), alice, none.clone(), bob, none];
    assert!(
        seen == direct || seen == via_none,
        "{}: leader --watch printed {seen:?}; stderr: {}",
        b.name,
        watch.stderr()
    );
    eprintln!(
        "{}: the second candidate's command started {} ms after the first's was told to finish",
        b.name,
        took.as_millis()
    );
    let _ = watch.child.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// With --recampaign: a broken leadership stops the command (SIGTERM) and
/// `lease elect` campaigns again and reruns it; the command's exit 0 hands
/// over and campaigns again; its non-zero exit ends `lease elect` with that
/// status. Each term has a higher fence. A value that is not UTF-8 is shown
/// as base64. Without --recampaign, a loss exits 76.
fn recampaign_after_loss_and_step_down(b: &Backend) {
    let (key, dir) = fresh(&format!("recampaign-{}", b.name));
    let runs = dir.join("runs");
    let script = format!(
        "echo $LEASE_FENCE >> {r}; n=$(wc -l < {r}); if [ $n -eq 1 ]; then while :; do sleep 0.05; done; elif [ $n -eq 2 ]; then exit 0; else exit 3; fi",
        r = runs.display()
    );
    let value = OsStr::from_bytes(&[0xff, 0xfe, 0x41]);
    let mut cmd = b.cmd(&["elect", &b.url, &key, "--recampaign", "--ttl", "2s"]);
    cmd.args([OsStr::new("--value"), value]);
    cmd.args([
        "--grace", "0.3s", "--holder", "rc", "--", "sh", "-c", &script,
    ]);
    let mut rc = Proc {
        child: cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("rc.err")).expect("rc.err"))
            .spawn()
            .expect("spawn lease elect"),
        log: dir.join("rc.err"),
    };
    wait_for_file(&runs, Duration::from_secs(20), "first term");
    let now = leader_json(b, &key);
    assert_eq!(now["value"], "//5B", "{}: {now}", b.name);
    assert_eq!(now["value_encoding"], "base64", "{}: {now}", b.name);
    assert_eq!(now["value_bytes"], 3, "{}: {now}", b.name);
    let broke = b.output(&["break", &b.url, &key, "--reason", "e2e: step aside"]);
    assert!(
        broke.status.success(),
        "{}: {}",
        b.name,
        String::from_utf8_lossy(&broke.stderr)
    );
    assert_eq!(
        rc.wait_timeout(Duration::from_secs(20)),
        Some(3),
        "{}: {}",
        b.name,
        rc.stderr()
    );
    let fences: Vec<u64> = std::fs::read_to_string(&runs)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().expect("fence"))
        .collect();
    assert_eq!(fences.len(), 3, "{}: {fences:?}", b.name);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "{}: fences {fences:?}",
        b.name
    );
    let err = rc.stderr();
    assert!(
        err.contains("broken by") && err.contains("campaigning again"),
        "{}: {err}",
        b.name
    );
    assert_eq!(leader_json(b, &key)["leader"], false, "{}", b.name);

    // Without --recampaign, a loss ends `lease elect` with 76.
    let up = dir.join("up");
    let mut once = b.spawn(
        &[
            "elect",
            &b.url,
            &key,
            "--ttl",
            "2s",
            "--grace",
            "0.3s",
            "--",
            "sh",
            "-c",
            &format!("echo up > {}; while :; do sleep 0.05; done", up.display()),
        ],
        &dir.join("once.err"),
    );
    wait_for_file(&up, Duration::from_secs(20), "single term");
    let broke = b.output(&["break", &b.url, &key, "--reason", "e2e: again"]);
    assert!(broke.status.success(), "{}", b.name);
    assert_eq!(
        once.wait_timeout(Duration::from_secs(10)),
        Some(EXIT_LOST),
        "{}: {}",
        b.name,
        once.stderr()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `elect` and `leader` are in the help, the man page and the completions,
/// with their exit codes and JSON fields.
#[test]
fn elect_and_leader_are_documented() {
    let help = |args: &[&str]| {
        let out = Command::new(LEASE).args(args).output().expect("run lease");
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let top = help(&["--help"]);
    for needle in [
        "elect",
        "leader",
        "lease elect",
        "--recampaign",
        "lease leader",
    ] {
        assert!(top.contains(needle), "--help lacks {needle:?}");
    }
    let elect = help(&["elect", "--help"]);
    for needle in [
        "--value",
        "--wait",
        "--recampaign",
        "--grace",
        "resigns",
        "LEASE_FENCE",
        "75",
        "76",
    ] {
        assert!(elect.contains(needle), "elect --help lacks {needle:?}");
    }
    let leader = help(&["leader", "--help"]);
    for needle in [
        "--watch",
        "--json",
        "base64",
        "value_encoding",
        "holder",
        "fence",
        "no leader",
    ] {
        assert!(leader.contains(needle), "leader --help lacks {needle:?}");
    }
    let man = help(&["man"]);
    let bash = help(&["completions", "bash"]);
    for sub in ["elect", "leader"] {
        assert!(man.contains(sub), "the man page lacks {sub}");
        assert!(bash.contains(sub), "bash completions lack {sub}");
    }
}

/// Usage errors of `elect` and `leader`: exit 2, one line, no server needed.
#[test]
fn elect_and_leader_usage_errors() {
    let cases: &[&[&str]] = &[
        &["elect", "etcd://127.0.0.1:1/x", "k"],
        &["elect", "etcd://127.0.0.1:1/x", "bad//key", "--", "true"],
        &[
            "elect",
            "etcd://127.0.0.1:1/x",
            "k",
            "--ttl",
            "1s",
            "--grace",
            "5s",
            "--",
            "true",
        ],
        &["elect", "memory://", "k", "--", "true"],
        &["leader", "etcd://127.0.0.1:1/x", "k", "--for", "1s"],
        &["leader", "redis://h/x", "k"],
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
    }
}

/// One `#[test]` per function, each on the backend's shared test server.
macro_rules! election_tests {
    ($($backend:ident),* $(,)?) => {$(
        mod $backend {
            #[test]
            fn candidates_take_turns_and_hand_over() {
                if let Some(b) = crate::e2e::backend(stringify!($backend)) {
                    super::candidates_take_turns_and_hand_over(&b);
                }
            }

            #[test]
            fn recampaign_after_loss_and_step_down() {
                if let Some(b) = crate::e2e::backend(stringify!($backend)) {
                    super::recampaign_after_loss_and_step_down(&b);
                }
            }
        }
    )*};
}

#[cfg(feature = "etcd")]
election_tests!(etcd);
#[cfg(feature = "nats")]
election_tests!(nats);
#[cfg(feature = "s3")]
election_tests!(s3);
#[cfg(feature = "mongo")]
election_tests!(mongo);
#[cfg(feature = "postgres")]
election_tests!(postgres);
#[cfg(feature = "redis")]
election_tests!(redis);
