//! The watchdog of `lease run`: a second process that stops everything the
//! command started if `lease` itself cannot — killed (`kill -9`, the OOM
//! killer), stopped (SIGSTOP, Ctrl-Z) or starved of CPU.
//!
//! `lease` tells it the lease's write deadline (as `CLOCK_BOOTTIME`, which
//! keeps counting while the machine is suspended, as the backend's clock
//! does; see [`crate::boottime`]) after every renewal. It knows whom to kill
//! without being told: `lease` is the child subreaper of the command, so
//! every process the command started, daemons that left its group and
//! session included, stays in `lease`'s subtree; the watchdog reads that
//! subtree from `/proc` every [`TICK`] and remembers each process by pid and
//! start time ([`crate::tree`]). When `lease` dies, its orphans go to init,
//! and the watchdog follows them from what it remembers: their children,
//! and any process in a session or group one of them led — and any process
//! whose environment carries this term's LEASE_KEY, LEASE_FENCE and
//! LEASE_HOLDER (the holder id is unique to the run), which is how it finds
//! a daemon started and orphaned too late for it to have seen.
//!
//! The watchdog exists, and knows the deadline, before the command does:
//! the command's process waits between fork and exec (the gate) until it has
//! told the watchdog its process group and the watchdog has answered. A
//! `lease` frozen or killed at any instant after that — even as the command
//! starts — leaves a watchdog that knows whom to kill and when; one frozen or
//! killed before it leaves nothing running (the gate waits, or sees the
//! watchdog gone and never execs).
//!
//! The watchdog kills every process started under the lease
//! * at the write deadline, unless `lease` said it is stopping them itself
//!   (then at the hard limit, which `lease`'s own SIGKILL precedes);
//! * when the pipe closes without `lease` saying it is done — `lease` died:
//!   SIGTERM at once, SIGKILL after the grace period or at the deadline,
//!   whichever comes first;
//!
//! and exits when `lease` says they all ended, or, once `lease` is gone,
//! when they have. Only `lease` renews, so a frozen `lease` always lets the
//! deadline pass.
//!
//! What it cannot see: a process that is started and orphaned within one
//! [`TICK`] before `lease` is killed, that also left the session and the
//! process group of everything seen, and that replaced its environment
//! (`env -i`). While `lease` lives, nothing escapes.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::pipe::{pipe_with, PipeFlags};
use rustix::process::{getpgrp, getpid, getppid, Signal};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, Command};

use crate::boottime::boot_now;
use crate::tree::{pid_list, Process, Tracked};

/// Looks in a row that must find `lease` gone and nothing running before
/// the watchdog ends.
const QUIET_LOOKS: u32 = 3;

/// The hidden subcommand that runs the watchdog.
pub const SUBCOMMAND: &str = "__watchdog";

/// How often the watchdog looks at the clock and the processes while waiting.
const TICK: Duration = Duration::from_millis(20);

/// One message from `lease` to its watchdog, one line each.
#[derive(Debug, PartialEq, Eq)]
enum Message {
    /// Renewed: the write deadline and the hard limit, `CLOCK_BOOTTIME` ns.
    Renewed { deadline: u128, hard: u128 },
    /// From the command's process, before it execs: its process group.
    Group(i32),
    /// `lease` is stopping the command itself (SIGTERM, then SIGKILL before
    /// the hard limit).
    Stopping,
    /// Everything started under the lease ended; nothing to do.
    Done,
}

impl Message {
    fn line(&self) -> String {
        match self {
            Message::Renewed { deadline, hard } => format!("R {deadline} {hard}\n"),
            Message::Group(pid) => format!("G {pid}\n"),
            Message::Stopping => "S\n".into(),
            Message::Done => "X\n".into(),
        }
    }

    fn parse(line: &str) -> Option<Message> {
        let mut f = line.split_whitespace();
        match (f.next(), f.next(), f.next()) {
            (Some("R"), Some(d), Some(h)) => Some(Message::Renewed {
                deadline: d.parse().ok()?,
                hard: h.parse().ok()?,
            }),
            (Some("G"), Some(p), None) => Some(Message::Group(p.parse().ok()?)),
            (Some("S"), None, None) => Some(Message::Stopping),
            (Some("X"), None, None) => Some(Message::Done),
            _ => None,
        }
    }
}

/// `lease run`'s end of the pipes to its watchdog.
pub struct Watchdog {
    process: Child,
    pipe: ChildStdin,
    /// The watchdog's answer to the command's gate (read by the command's
    /// process only, between fork and exec).
    answer: OwnedFd,
}

/// The running program's own image, opened by [`keep_own_image`].
static OWN_IMAGE: OnceLock<Option<std::fs::File>> = OnceLock::new();

/// Opens the running program's image (`/proc/self/exe`) and keeps it open,
/// for [`Watchdog::start`]: the watchdog is started from the program that
/// runs, even after an upgrade replaced or removed the file it was started
/// from (a waiting `lease run` may take its grant hours later). Call it
/// first thing, before an upgrade can get in between; where `/proc` is
/// missing, the watchdog is started from the path of the program instead.
pub fn keep_own_image() {
    use std::os::unix::fs::OpenOptionsExt;
    OWN_IMAGE.get_or_init(|| {
        // O_PATH: a program installed execute-only can be kept too.
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open("/proc/self/exe")
            .ok()
    });
}

impl Watchdog {
    /// Starts a watchdog, with `grace` between its SIGTERM and SIGKILL if
    /// `lease` dies. It guards the command that [`Watchdog::gate`] is put on.
    /// `environment` is what the command's environment holds that no other
    /// process's does (`NAME=value` entries: the key, fence and holder of
    /// this term), by which the watchdog of a `lease` that died also knows
    /// a process it never saw.
    pub fn start(grace: Duration, environment: &[String]) -> std::io::Result<Watchdog> {
        let exe = match OWN_IMAGE.get().and_then(Option::as_ref) {
            // Opened close-on-exec: the kernel opens the program by this
            // path before it closes such descriptors, so the watchdog keeps
            // none of them.
            Some(image) => format!("/proc/self/fd/{}", image.as_raw_fd()).into(),
            None => std::env::current_exe()?,
        };
        let me = getpid().as_raw_nonzero().get();
        // Blocking and close-on-exec: the command's process reads it before
        // exec, and neither the command nor the watchdog keeps it.
        let (answer, answer_w) = pipe_with(PipeFlags::CLOEXEC)?;
        let mut process = Command::new(exe)
            .arg0("lease")
            .arg(SUBCOMMAND)
            .arg(grace.as_millis().to_string())
            .arg(me.to_string())
            .args(environment)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::from(answer_w))
            // Out of the terminal's job control: Ctrl-C, Ctrl-Z and a stop
            // of `lease`'s group do not reach it.
            .process_group(0)
            .kill_on_drop(false)
            .spawn()?;
        let pipe = process
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the watchdog has no stdin"))?;
        Ok(Watchdog {
            process,
            pipe,
            answer,
        })
    }

    /// Makes `command` (spawned with a process group of its own) wait before
    /// it execs until it has told this watchdog its group and the watchdog
    /// has answered, so no instant exists at which the command runs and the
    /// watchdog does not know it. Tell the watchdog the deadline
    /// ([`Watchdog::renewed`]) before spawning.
    ///
    /// Spawning then fails (and nothing runs) if the watchdog is gone.
    pub fn gate(&self, command: &mut tokio::process::Command) {
        let (to, from) = (self.pipe.as_raw_fd(), self.answer.as_raw_fd());
        // SAFETY: the closure runs in the child between fork and exec and
        // makes only async-signal-safe system calls (getpid, getpgrp, poll,
        // write, read), on a stack buffer, allocating nothing.
        unsafe {
            command.pre_exec(move || pass_gate(to, from).map_err(std::io::Error::from));
        }
    }

    async fn send(&mut self, m: Message) -> std::io::Result<()> {
        self.pipe.write_all(m.line().as_bytes()).await?;
        self.pipe.flush().await
    }

    /// The watchdog's pid.
    pub fn pid(&self) -> Option<i32> {
        self.process.id().and_then(|p| i32::try_from(p).ok())
    }

    /// A renewal moved the write deadline to `deadline`; everything must be
    /// dead by `hard` (both `CLOCK_BOOTTIME` nanoseconds, see
    /// [`crate::boottime::BootClock::map`]).
    pub async fn renewed(&mut self, deadline: u128, hard: u128) -> std::io::Result<()> {
        self.send(Message::Renewed { deadline, hard }).await
    }

    /// `lease` is stopping the command itself.
    pub async fn stopping(&mut self) -> std::io::Result<()> {
        self.send(Message::Stopping).await
    }

    /// Everything started under the lease ended: the watchdog exits
    /// without touching anything.
    pub async fn done(mut self) {
        let _ = self.send(Message::Done).await;
        drop(self.pipe);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.process.wait()).await;
    }
}

/// The command's side of the gate, between fork and exec: `G <group>` to
/// the watchdog, then one byte back. The group must be the process's own
/// (set by `process_group(0)` before this runs), or the watchdog would be
/// told to kill `lease`'s.
fn pass_gate(to: RawFd, from: RawFd) -> Result<(), Errno> {
    let pid = getpid();
    if getpgrp() != pid {
        return Err(Errno::PERM);
    }
    let mut line = [0u8; 24];
    let len = group_line(pid.as_raw_nonzero().get(), &mut line);
    // SAFETY: both descriptors are `lease`'s, open across fork, and stay
    // open until exec (this process's copies close there).
    let (to, from) = unsafe { (BorrowedFd::borrow_raw(to), BorrowedFd::borrow_raw(from)) };
    let mut rest = line.get(..len).unwrap_or_default();
    while !rest.is_empty() {
        // `lease`'s end of the pipe is non-blocking (shared with this copy).
        match rustix::io::write(to, rest) {
            Ok(n) => rest = rest.get(n..).unwrap_or_default(),
            Err(Errno::AGAIN) => {
                poll(&mut [PollFd::new(&to, PollFlags::OUT)], None)?;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    let mut byte = [0u8; 1];
    loop {
        match rustix::io::read(from, &mut byte) {
            Ok(1) if byte[0] == b'g' => return Ok(()),
            // The watchdog is gone or refused: never exec.
            Ok(_) => return Err(Errno::CANCELED),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes `G <pid>\n` into `buf` without allocating; returns its length.
fn group_line(pid: i32, buf: &mut [u8; 24]) -> usize {
    let mut digits = [0u8; 11];
    let (mut n, mut i) = (pid.unsigned_abs(), digits.len());
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    let digits = digits.get(i..).unwrap_or_default();
    buf[0] = b'G';
    buf[1] = b' ';
    let end = 2 + digits.len();
    if let Some(slot) = buf.get_mut(2..end) {
        slot.copy_from_slice(digits);
    }
    buf[end] = b'\n';
    end + 1
}

/// The watchdog process: `lease __watchdog GRACE_MS LEASE_PID NAME=VALUE…`
/// (the command's environment entries that mark it), messages on stdin, the
/// gate's answer on stdout.
pub fn main(args: &[String]) -> ExitCode {
    let parsed = match args {
        [grace, lease, marks @ ..] => grace
            .parse::<u64>()
            .ok()
            .map(Duration::from_millis)
            .zip(lease.parse::<i32>().ok())
            .map(|(g, l)| (g, l, marks.iter().map(|m| m.as_bytes().to_vec()).collect())),
        _ => None,
    };
    let Some((grace, lease, marks)) = parsed else {
        eprintln!("lease: {SUBCOMMAND} is started by `lease run`, not by hand");
        return ExitCode::from(crate::EXIT_USAGE);
    };
    ignore_stop_signals();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(std::io::stdin()).lines() {
            let Ok(line) = line else { break };
            if let Some(m) = Message::parse(&line) {
                if tx.send(m).is_err() {
                    break;
                }
            }
        }
        // Dropping `tx` tells the main loop the pipe closed.
    });
    // A `lease` already gone started no command (the gate needs this
    // watchdog's answer): nothing to guard.
    if getppid().map(|p| p.as_raw_nonzero().get()) == Some(lease) {
        guard(grace, lease, marks, &rx);
    }
    ExitCode::SUCCESS
}

/// Terminal and user signals leave the watchdog alone: it ends when its job
/// is done, or by SIGKILL.
fn ignore_stop_signals() {
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGPIPE,
    ] {
        // SAFETY: SIG_IGN installs no handler code; signal(2) has no
        // memory-safety preconditions.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
}

/// What the watchdog knows of the processes started under the lease.
struct Watched {
    lease: i32,
    me: i32,
    /// The command's environment entries that mark this term.
    marks: Vec<Vec<u8>>,
    tracked: Tracked,
}

impl Watched {
    /// Whether `lease` still lives (the watchdog is its child until then).
    fn lease_alive(&self) -> bool {
        getppid().map(|p| p.as_raw_nonzero().get()) == Some(self.lease)
    }

    /// Looks again: `lease`'s subtree while it lives (the subreaper keeps
    /// every process started under it there), the children of every
    /// process seen, and, once `lease` is gone, the sessions and groups
    /// they led.
    fn refresh(&mut self) {
        let alive = self.lease_alive();
        refresh(&mut self.tracked, self.lease, self.me, &self.marks, alive);
        self.tracked.forget_ended();
    }
}

fn refresh(tracked: &mut Tracked, lease: i32, me: i32, marks: &[Vec<u8>], lease_alive: bool) {
    if lease_alive {
        tracked.add_tree(lease, &[me]);
    } else {
        tracked.add_children();
        tracked.add_by_session_or_environment(marks, me);
    }
}

fn guard(grace: Duration, lease: i32, mut marks: Vec<Vec<u8>>, rx: &mpsc::Receiver<Message>) {
    let mut watched: Option<Watched> = None;
    let mut deadline: Option<u128> = None;
    let mut hard: Option<u128> = None;
    let mut stopping = false;
    // Looks in a row that found `lease` gone and nothing running: one look
    // is not atomic, and a process forking and exiting during it can be
    // missed.
    let mut quiet = 0;
    loop {
        if let Some(w) = &mut watched {
            w.refresh();
            if !w.lease_alive() && w.tracked.running().is_empty() {
                quiet += 1;
                if quiet >= QUIET_LOOKS {
                    return; // `lease` is gone, and so is all it started
                }
            } else {
                quiet = 0;
            }
        }
        let kill_at = if stopping { hard } else { deadline };
        if let Some(w) = watched
            .as_mut()
            .filter(|_| kill_at.is_some_and(|k| boot_now() >= k))
        {
            let why = if stopping {
                "the hard limit passed while `lease` was stopping them"
            } else {
                "the lease's write deadline passed and `lease` did not stop them (killed, stopped or starved)"
            };
            kill_all(w, why);
            return;
        }
        match rx.recv_timeout(TICK) {
            Ok(Message::Renewed {
                deadline: d,
                hard: h,
            }) => {
                deadline = Some(d);
                hard = Some(h);
            }
            Ok(Message::Group(g)) => {
                let Some(command) = Process::of(g) else {
                    return; // it is gone already
                };
                let mut w = Watched {
                    lease,
                    me: getpid().as_raw_nonzero().get(),
                    marks: std::mem::take(&mut marks),
                    tracked: Tracked::new(),
                };
                w.tracked.add(command);
                // The command may exec only with a deadline to hold it to,
                // and only before that deadline.
                let why = if deadline.is_none_or(|d| boot_now() >= d) {
                    "the write deadline passed before the command started"
                } else if open_gate().is_err() {
                    "the command could not be let through"
                } else {
                    watched = Some(w);
                    continue;
                };
                kill_all(&mut w, why);
                return;
            }
            Ok(Message::Stopping) => stopping = true,
            Ok(Message::Done) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if let Some(w) = &mut watched {
                    orphaned(w, grace, deadline);
                }
                return;
            }
        }
    }
}

/// Answers the command's gate: it may exec.
fn open_gate() -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(b"g")?;
    out.flush()
}

/// `lease` died without saying everything ended: SIGTERM now (and to each
/// process found later), SIGKILL after `grace` or at the deadline,
/// whichever is first.
fn orphaned(w: &mut Watched, grace: Duration, deadline: Option<u128>) {
    w.refresh();
    let mut termed: Vec<Process> = w.tracked.running();
    for p in &termed {
        p.signal(Signal::TERM);
    }
    if !termed.is_empty() {
        let pids: Vec<i32> = termed.iter().map(|p| p.pid).collect();
        eprintln!(
            "lease (watchdog): SIGTERM to {} started under the lease (pids {}): `lease` exited without ending them",
            processes(pids.len()),
            pid_list(&pids)
        );
    }
    let by_grace = boot_now().saturating_add(grace.as_nanos());
    let kill_at = deadline.map_or(by_grace, |d| d.min(by_grace));
    while boot_now() < kill_at {
        w.refresh();
        let running = w.tracked.running();
        if running.is_empty() {
            return;
        }
        for p in running {
            if !termed.contains(&p) {
                p.signal(Signal::TERM);
                termed.push(p);
            }
        }
        std::thread::sleep(TICK);
    }
    kill_all(w, "they outlived the grace period");
}

/// SIGKILL to everything started under the lease, found and stopped first
/// so that nothing forks away while the rest die.
fn kill_all(w: &mut Watched, why: &str) {
    let (lease, me, marks) = (w.lease, w.me, &w.marks);
    let killed = w.tracked.kill_all(|t| {
        let alive = getppid().map(|p| p.as_raw_nonzero().get()) == Some(lease);
        refresh(t, lease, me, marks, alive);
    });
    if !killed.is_empty() {
        eprintln!(
            "lease (watchdog): SIGKILL to {} started under the lease (pids {}): {why}",
            processes(killed.len()),
            pid_list(&killed)
        );
    }
}

/// "1 process", "3 processes".
pub fn processes(n: usize) -> String {
    if n == 1 {
        "1 process".into()
    } else {
        format!("{n} processes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for m in [
            Message::Renewed {
                deadline: 12,
                hard: u128::MAX,
            },
            Message::Group(4321),
            Message::Stopping,
            Message::Done,
        ] {
            assert_eq!(Message::parse(m.line().trim_end()), Some(m));
        }
        assert_eq!(Message::parse("R 1"), None);
        assert_eq!(Message::parse("R x 2"), None);
        assert_eq!(Message::parse("Q"), None);
    }

    #[test]
    fn the_gate_line_is_written_without_allocating() {
        for pid in [1, 9, 10, 4321, i32::MAX] {
            let mut buf = [0u8; 24];
            let len = group_line(pid, &mut buf);
            assert_eq!(&buf[..len], format!("G {pid}\n").as_bytes());
        }
    }
}
