//! Every process started under a lease, wherever it went.
//!
//! A command's process group is not enough to find what it started: a
//! background job outlives the shell that started it, and a daemon (double
//! fork, `setsid`, `nohup`) leaves the group and the session. So `lease`
//! makes itself the *child subreaper* of what it runs: an orphan is then
//! re-parented to `lease` rather than to init, and everything the command
//! started stays in `lease`'s subtree of the process tree for as long as
//! `lease` lives — running or stopped. The subtree is read from `/proc`
//! (each process's `task/*/children`, or a scan of every process's parent
//! where the kernel lacks those files).
//!
//! A process is known by its pid *and* its start time, and is signalled
//! through a pidfd opened after the start time was checked, so a pid reused
//! by an unrelated process is never signalled.
//!
//! [`Tracked`] remembers every process it has seen, so that the watchdog of
//! a `lease` that was killed (and whose subtree fell apart: its orphans went
//! to init) can still find them, their later children, and processes that
//! kept the session or process group of one of them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

/// What `/proc/PID/stat` says about a process that `lease` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The state letter (R, S, T, Z…).
    pub state: char,
    /// The parent's pid.
    pub ppid: i32,
    /// The process group.
    pub pgrp: i32,
    /// The session.
    pub session: i32,
    /// Start time in clock ticks since boot: with the pid, the process's
    /// identity.
    pub start: u64,
}

impl Stat {
    /// Parses the text of `/proc/PID/stat`.
    fn parse(text: &str) -> Option<Stat> {
        // "pid (comm) S ppid pgrp session …": the name may hold anything,
        // so the fields start after the last ')'.
        let (_, rest) = text.rsplit_once(')')?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        Some(Stat {
            state: f.first()?.chars().next()?,
            ppid: f.get(1)?.parse().ok()?,
            pgrp: f.get(2)?.parse().ok()?,
            session: f.get(3)?.parse().ok()?,
            start: f.get(19)?.parse().ok()?,
        })
    }

    /// Whether the process has ended (a zombie no one reaped yet included).
    pub fn ended(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// `/proc/PID/stat` of `pid`, if it exists.
pub fn stat(pid: i32) -> Option<Stat> {
    Stat::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// One process: its pid and start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Process {
    /// The pid.
    pub pid: i32,
    start: u64,
}

impl Process {
    /// The process that has `pid` now.
    pub fn of(pid: i32) -> Option<Process> {
        stat(pid).map(|s| Process {
            pid,
            start: s.start,
        })
    }

    /// Its state now, or `None` once it is gone (or its pid was reused).
    fn now(&self) -> Option<Stat> {
        stat(self.pid).filter(|s| s.start == self.start)
    }

    /// Whether it still runs (not ended, not a zombie).
    pub fn running(&self) -> bool {
        self.now().is_some_and(|s| !s.ended())
    }

    /// Sends `sig`, unless it is gone or its pid now names another process.
    pub fn signal(&self, sig: Signal) -> bool {
        let Some(pid) = Pid::from_raw(self.pid) else {
            return false;
        };
        match pidfd_open(pid, PidfdFlags::empty()) {
            // The pidfd names whatever had the pid when it was opened: if
            // that is still our process now, it is ours for good.
            Ok(fd) => self.now().is_some() && pidfd_send_signal(&fd, sig).is_ok(),
            // No pidfds (a kernel before 5.3): check, then signal by pid.
            Err(Errno::NOSYS) => {
                self.now().is_some() && rustix::process::kill_process(pid, sig).is_ok()
            }
            Err(_) => false,
        }
    }
}

/// The pids of `pid`'s children.
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let path = task.path().join("children");
        match std::fs::read_to_string(&path) {
            Ok(text) => out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            ),
            // A kernel without CONFIG_PROC_CHILDREN: every process's
            // parent instead.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && task.path().exists() => {
                return by_parent().remove(&pid).unwrap_or_default();
            }
            Err(_) => {}
        }
    }
    out
}

/// Every process's children, from every process's `stat`.
fn by_parent() -> BTreeMap<i32, Vec<i32>> {
    let mut map: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for (pid, s) in all() {
        map.entry(s.ppid).or_default().push(pid);
    }
    map
}

/// Every process on the machine that `/proc` shows, with its `stat`.
fn all() -> Vec<(i32, Stat)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .collect()
}

/// Whether the environment `pid` started with holds every one of `marks`
/// (`NAME=value` entries); false for no marks.
fn marked(pid: i32, marks: &[Vec<u8>]) -> bool {
    if marks.is_empty() {
        return false;
    }
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    marks
        .iter()
        .all(|m| env.split(|b| *b == 0).any(|entry| entry == m.as_slice()))
}

/// Makes this process the child subreaper of its descendants: orphans among
/// them are re-parented to it instead of to init.
pub fn become_subreaper() -> std::io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(std::io::Error::from)
}

/// Reaps this process's children that have ended, except those in `keep`
/// (children whose status someone else waits for). As the subreaper, this
/// process inherits every orphan the command leaves, and must reap them.
pub fn reap_orphans(keep: &[i32]) {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    for pid in children(me) {
        if keep.contains(&pid) || !stat(pid).is_some_and(|s| s.ended()) {
            continue;
        }
        if let Some(pid) = Pid::from_raw(pid) {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
        }
    }
}

/// Whether `me`, the subreaper of everything started under the lease, has
/// no child left but those in `keep` (the watchdog), after reaping those
/// that ended. One read of its children, not a walk of its tree: a process
/// that forks and exits while a walk runs (a pid "hopper", a daemon
/// double-forking at that moment) can be missed by a walk, but its child is
/// re-parented to `me` before it ends, so at any instant something started
/// under the lease that still runs makes `me` have a child. A walk that
/// found nothing must be confirmed by this before the lease is let go.
pub fn nothing_left(me: i32, keep: &[i32]) -> bool {
    reap_orphans(keep);
    children(me).iter().all(|pid| keep.contains(pid))
}

/// The processes started under a lease that have been seen so far.
#[derive(Debug, Default)]
pub struct Tracked {
    /// Every process seen, with when it was first seen ended (`None`
    /// while it runs). Their pids also name the sessions and process
    /// groups made under the lease.
    seen: BTreeMap<Process, Option<Instant>>,
    /// The earliest start time of a tracked process: nothing that started
    /// before it was made under the lease.
    since: Option<u64>,
}

impl Tracked {
    /// Nothing tracked yet.
    pub fn new() -> Tracked {
        Tracked::default()
    }

    /// Starts tracking `p`.
    pub fn add(&mut self, p: Process) {
        self.since = Some(self.since.map_or(p.start, |s| s.min(p.start)));
        self.seen.entry(p).or_insert(None);
    }

    /// Forgets processes that ended more than [`FORGET_AFTER`] ago, so a
    /// command that starts many short-lived ones does not make every look
    /// slower. A session or group they led matters only for a process
    /// orphaned before it was seen, which is within one look of its
    /// leader's life.
    pub fn forget_ended(&mut self) {
        let now = Instant::now();
        self.seen.retain(|p, ended| {
            if p.running() {
                return true;
            }
            let at = *ended.get_or_insert(now);
            now.saturating_duration_since(at) < FORGET_AFTER
        });
    }

    /// Tracks every descendant of `root` (not `root` itself), leaving out
    /// the subtrees of the pids in `skip`.
    pub fn add_tree(&mut self, root: i32, skip: &[i32]) {
        let mut todo = children(root);
        let mut visited = BTreeSet::new();
        while let Some(pid) = todo.pop() {
            if skip.contains(&pid) || !visited.insert(pid) {
                continue;
            }
            if let Some(p) = Process::of(pid) {
                self.add(p);
                todo.extend(children(pid));
            }
        }
    }

    /// Tracks the children (and theirs) of every tracked process that
    /// still exists.
    pub fn add_children(&mut self) {
        let alive: Vec<i32> = self
            .seen
            .keys()
            .filter(|p| p.now().is_some())
            .map(|p| p.pid)
            .collect();
        for pid in alive {
            self.add_tree(pid, &[]);
        }
    }

    /// Tracks every process, anywhere, started no earlier than the first
    /// one tracked, that is in a session or process group a tracked process
    /// led, or whose environment holds every entry of `marks` (`NAME=value`;
    /// none: this test is skipped): a daemon whose parent exited before it
    /// was seen. `me` is never tracked. One scan of every process.
    pub fn add_by_session_or_environment(&mut self, marks: &[Vec<u8>], me: i32) {
        let Some(since) = self.since else { return };
        let ids: BTreeSet<i32> = self.seen.keys().map(|p| p.pid).collect();
        for (pid, s) in all() {
            if pid == me || s.start < since {
                continue;
            }
            let p = Process {
                pid,
                start: s.start,
            };
            if self.seen.contains_key(&p) {
                continue;
            }
            if ids.contains(&s.session) || ids.contains(&s.pgrp) || marked(pid, marks) {
                self.add(p);
            }
        }
    }

    /// The tracked processes that still run.
    pub fn running(&self) -> Vec<Process> {
        self.seen.keys().filter(|p| p.running()).copied().collect()
    }

    /// Sends `sig` to every tracked process that still runs; returns how
    /// many it reached.
    pub fn signal(&self, sig: Signal) -> usize {
        self.running().iter().filter(|p| p.signal(sig)).count()
    }

    /// Kills every tracked process, and every one `refresh` adds, so that
    /// none escapes by forking while the others die: stops them all
    /// (SIGSTOP) until a refresh finds no new one, then SIGKILL. Returns the
    /// pids it killed.
    pub fn kill_all(&mut self, mut refresh: impl FnMut(&mut Tracked)) -> Vec<i32> {
        let mut stopped = BTreeSet::new();
        for _ in 0..FREEZE_ROUNDS {
            refresh(self);
            let new: Vec<Process> = self
                .running()
                .into_iter()
                .filter(|p| !stopped.contains(p))
                .collect();
            if new.is_empty() {
                break;
            }
            for p in &new {
                p.signal(Signal::STOP);
                stopped.insert(*p);
            }
            // A fork under way when the stop arrived finishes first: wait
            // until each is seen stopped, so its newest child is in the
            // next refresh.
            let started = Instant::now();
            while started.elapsed() < STOP_WAIT
                && new
                    .iter()
                    .any(|p| p.now().is_some_and(|s| !s.ended() && s.state != 'T'))
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let mut killed = Vec::new();
        // Then everything, and anything seen late, until nothing runs in
        // a few looks in a row: one look at a tree is not atomic, and a
        // process that forks and exits during it can be missed.
        let mut quiet = 0;
        for _ in 0..FREEZE_ROUNDS {
            refresh(self);
            let running = self.running();
            if running.is_empty() {
                quiet += 1;
                if quiet >= QUIET_LOOKS {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            quiet = 0;
            for p in running {
                if p.signal(Signal::KILL) && !killed.contains(&p.pid) {
                    killed.push(p.pid);
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        killed
    }
}

/// How long a tracked process is remembered after it ended.
const FORGET_AFTER: Duration = Duration::from_secs(1);

/// Looks in a row that must find nothing running before a kill is done.
const QUIET_LOOKS: usize = 3;

/// Rounds of stopping and looking again before the kill.
const FREEZE_ROUNDS: usize = 20;

/// The longest one round waits for the stopped processes to stop.
const STOP_WAIT: Duration = Duration::from_millis(50);

/// `pids` as `1, 2, 3`, the first 20 of them.
pub fn pid_list(pids: &[i32]) -> String {
    let mut s = pids
        .iter()
        .take(20)
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if pids.len() > 20 {
        s.push_str(&format!(" and {} more", pids.len().saturating_sub(20)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_whatever_the_name() {
        let line =
            "4321 (a) b (c)) S 1 4321 4300 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        let s = Stat::parse(line).unwrap();
        assert_eq!(
            s,
            Stat {
                state: 'S',
                ppid: 1,
                pgrp: 4321,
                session: 4300,
                start: 98765
            }
        );
        assert!(Stat::parse("12 (x) S 1").is_none());
    }

    #[test]
    fn a_process_is_known_by_every_mark_in_its_environment() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("LEASE_KEY", "k")
            .env("LEASE_FENCE", "7")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let marks = |m: &[&str]| m.iter().map(|m| m.as_bytes().to_vec()).collect::<Vec<_>>();
        // `spawn` returns as the child execs, a moment before the kernel has
        // set up the new environment that /proc shows: poll for it.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !marked(pid, &marks(&["LEASE_KEY=k"])) && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(marked(pid, &marks(&["LEASE_KEY=k", "LEASE_FENCE=7"])));
        assert!(!marked(pid, &marks(&["LEASE_KEY=k", "LEASE_FENCE=8"])));
        assert!(!marked(
            pid,
            &marks(&["LEASE_KEY=k", "LEASE_FENCE=7", "LEASE_HOLDER=h"])
        ));
        assert!(!marked(pid, &marks(&["LEASE_FENCE=7\0LEASE_KEY=k"])));
        assert!(!marked(pid, &[]));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_subtree_and_its_signals() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        // The shell's subtree, not this process's: other tests run
        // processes of their own beside it.
        let sh = child.id() as i32;
        let mut t = Tracked::new();
        t.add(Process::of(sh).unwrap());
        let end = Instant::now() + Duration::from_secs(5);
        while t.running().len() < 3 && Instant::now() < end {
            t.add_tree(sh, &[]);
            std::thread::sleep(Duration::from_millis(10));
        }
        let pids: BTreeSet<i32> = t.running().iter().map(|p| p.pid).collect();
        assert!(pids.contains(&sh), "{pids:?}");
        assert_eq!(pids.len(), 3, "{pids:?}");
        let killed = t.kill_all(|t| t.add_tree(sh, &[]));
        assert_eq!(killed.len(), 3, "{killed:?}");
        child.wait().unwrap();
        assert!(t.running().is_empty());
        assert_eq!(pid_list(&[1, 2]), "1, 2");
    }
}
