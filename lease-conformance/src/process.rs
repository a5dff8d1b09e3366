//! Server process faults: pause and resume (SIGSTOP/SIGCONT), kill and
//! restart on the same data directory.

use std::process::Command;
use std::sync::{Mutex, MutexGuard};

/// Control over one server process, for fault runs.
///
/// Pause and resume work on any process we may signal ([`PidProcess`]);
/// kill and restart need a launcher that knows how to start the server
/// again on the same ports and data ([`Launched`] around a
/// [`ServerProcess`]).
pub trait ServerControl: Send + Sync {
    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    fn pause(&self) -> Result<(), String>;
    /// Thaws it (SIGCONT).
    fn resume(&self) -> Result<(), String>;
    /// Kills it (SIGKILL). Default: unsupported.
    fn kill(&self) -> Result<(), String> {
        Err("this server cannot be killed and restarted by the harness".into())
    }
    /// Starts it again on the same ports and data directory, waiting until
    /// it answers. Default: unsupported.
    fn restart(&self) -> Result<(), String> {
        Err("this server cannot be killed and restarted by the harness".into())
    }
    /// Whether its data survives a kill and restart (a durable backend), so
    /// the restart fault applies.
    fn durable(&self) -> bool {
        false
    }
}

/// Sends `signal` (`STOP`, `CONT`, …) to `pid` with the `kill` command.
fn signal(pid: u32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("cannot run kill -{signal} {pid}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{signal} {pid} failed: {status}"))
    }
}

/// Waits (up to a second) until every thread of `pid` is stopped, after a
/// SIGSTOP: `kill` returns before a running thread on another core has
/// stopped, and a test that probes a "paused" server at once could still be
/// answered.
pub fn wait_stopped(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let all_stopped = || -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return true;
        };
        tasks.flatten().all(|t| {
            std::fs::read_to_string(t.path().join("stat"))
                .ok()
                .and_then(|stat| {
                    // The state follows the parenthesised command name.
                    let after = stat.rsplit_once(')')?.1;
                    after
                        .split_whitespace()
                        .next()
                        .map(|s| s == "T" || s == "t")
                })
                .unwrap_or(true)
        })
    };
    while !all_stopped() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Any process by id: pause and resume only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PidProcess {
    /// The process id.
    pub pid: u32,
}

impl ServerControl for PidProcess {
    fn pause(&self) -> Result<(), String> {
        signal(self.pid, "STOP")?;
        wait_stopped(self.pid);
        Ok(())
    }
    fn resume(&self) -> Result<(), String> {
        signal(self.pid, "CONT")
    }
}

/// A server process its launcher can pause, resume, kill and restart:
/// what [`Launched`] needs to inject the process faults. Implement it for
/// the handle your test harness gets when it starts a private server.
pub trait ServerProcess: Send {
    /// Freezes the server (SIGSTOP to its process group, say).
    fn pause(&self) -> Result<(), String>;
    /// Thaws a paused server.
    fn resume(&self) -> Result<(), String>;
    /// Kills the server and reaps it.
    fn kill(&mut self) -> Result<(), String>;
    /// Starts it again with the same ports and data directory, returning
    /// once it answers.
    fn restart(&mut self) -> Result<(), String>;
}

/// A server started by a launcher (a [`ServerProcess`]), behind a lock so
/// kill and restart can take it mutably.
pub struct Launched<S> {
    server: Mutex<S>,
    durable: bool,
}

impl<S> std::fmt::Debug for Launched<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launched")
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl<S> Launched<S> {
    /// Wraps a launched server; `durable` says whether its data survives a
    /// restart (etcd and NATS with file storage: yes).
    pub fn new(server: S, durable: bool) -> Launched<S> {
        Launched {
            server: Mutex::new(server),
            durable,
        }
    }

    /// The server itself.
    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.server.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<S: ServerProcess> ServerControl for Launched<S> {
    fn pause(&self) -> Result<(), String> {
        ServerProcess::pause(&*self.lock())
    }
    fn resume(&self) -> Result<(), String> {
        ServerProcess::resume(&*self.lock())
    }
    fn kill(&self) -> Result<(), String> {
        ServerProcess::kill(&mut *self.lock())
    }
    fn restart(&self) -> Result<(), String> {
        ServerProcess::restart(&mut *self.lock())
    }
    fn durable(&self) -> bool {
        self.durable
    }
}
