//! The controlling terminal, for commands that read it.
//!
//! The command runs in a process group of its own (so that a loss can
//! signal everything it started). A background group that reads the
//! terminal gets SIGTTIN and stops — `lease run … -- psql`, a script with
//! `read` — while `lease` goes on renewing: the key would be held for ever
//! by a command that never runs. So when `lease` runs in the foreground of
//! a terminal, the command's group is made the foreground group (by the
//! command itself, before it starts, so it can never read too early), and
//! `lease` takes the terminal back when it ends.
//!
//! Job control keeps working: when the command is stopped (Ctrl-Z), `lease`
//! takes the terminal back and stops itself, so the shell sees the job
//! stopped; on `fg` it hands the terminal to the command again and
//! continues it. A stopped `lease` renews nothing: a job left stopped past
//! the lease's write deadline is killed by the watchdog.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use rustix::process::{getpgrp, getpid, kill_process, kill_process_group, Pid, Signal};
use rustix::process::{waitid, WaitId, WaitIdOptions};
use rustix::termios::{tcgetpgrp, tcsetpgrp};

/// The terminal `lease` runs in the foreground of.
pub struct Terminal {
    ours: Pid,
}

impl Terminal {
    /// The terminal on stdin, if `lease` is in its foreground group.
    pub fn foreground() -> Option<Terminal> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let ours = getpgrp();
        (tcgetpgrp(stdin.as_fd()).ok()? == ours).then_some(Terminal { ours })
    }

    /// Makes `command` (spawned with its own process group) take the
    /// terminal's foreground before it runs.
    pub fn hand_over_on_spawn(&self, command: &mut tokio::process::Command) {
        // SAFETY: the closure runs in the child between fork and exec and
        // makes only async-signal-safe system calls (signal, tcsetpgrp,
        // getpid).
        unsafe {
            command.pre_exec(|| {
                without_sigttou(|| {
                    tcsetpgrp(std::io::stdin().as_fd(), getpid()).map_err(std::io::Error::from)
                })
            });
        }
    }

    /// Gives the terminal to the process group `group` (a background
    /// process may only do this with SIGTTOU ignored).
    fn give_to(&self, group: Pid) {
        let _ = without_sigttou(|| tcsetpgrp(std::io::stdin().as_fd(), group));
    }

    /// Takes the terminal back for `lease`'s own group.
    pub fn take_back(&self) {
        self.give_to(self.ours);
    }

    /// If the command `pid` (leader of `group`) was stopped by job control:
    /// stops `lease` too (the shell then sees the job stopped), and once
    /// continued hands the terminal back to the command and continues it.
    /// Returns whether that happened.
    pub fn follow_stop(&self, pid: Pid, group: Pid) -> bool {
        let stopped = waitid(
            WaitId::Pid(pid),
            WaitIdOptions::STOPPED | WaitIdOptions::NOHANG,
        )
        .ok()
        .flatten()
        .is_some_and(|s| s.stopped());
        if !stopped {
            return false;
        }
        self.take_back();
        // Stops this whole process here until the shell continues it.
        let _ = kill_process(getpid(), Signal::TSTP);
        self.give_to(group);
        let _ = kill_process_group(group, Signal::CONT);
        true
    }
}

/// Runs `f` with SIGTTOU ignored, so a background process may set the
/// terminal's foreground group.
fn without_sigttou<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: signal(2) with SIG_IGN, then the previous disposition back;
    // no handler code is installed.
    let old = unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
    let out = f();
    // SAFETY: as above.
    unsafe {
        libc::signal(libc::SIGTTOU, old);
    }
    out
}
