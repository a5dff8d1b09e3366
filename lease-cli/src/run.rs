//! `lease run`: a distributed flock.

use std::io::ErrorKind;
use std::process::ExitStatus;
use std::time::Duration;

use lease_core::{HolderId, Payload};
use lease_keeper::{AcquireError, Keeper, Lease};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::commands::open;
use crate::target::Clients;
use crate::util::{self, default_holder};
use crate::{Fail, RunArgs, EXIT_CANNOT_EXECUTE, EXIT_LOST, EXIT_NOT_ACQUIRED, EXIT_NOT_FOUND};

/// How often the holder-side deadline is checked while the command runs.
const DEADLINE_CHECK: Duration = Duration::from_millis(50);

pub async fn run(args: RunArgs, timeout: Duration, clients: &Clients) -> Result<u8, Fail> {
    let holder = HolderId::new(args.holder.clone().unwrap_or_else(default_holder))
        .map_err(|e| Fail::usage(util::one_line(&e)))?;
    let payload = Payload::new(args.payload.clone().unwrap_or_default().into_bytes())
        .map_err(|e| Fail::usage(util::one_line(&e)))?;
    // Signals are caught from here on, so an interrupt while waiting for the
    // key ends the wait cleanly.
    let mut signals = Signals::new()?;
    let (_, key, backend) = open(&args.target, timeout, clients).await?;
    let keeper = Keeper::new(backend.clone()).with_holder(holder.clone());

    let acquiring = async {
        if args.wait.is_zero() {
            match keeper.try_acquire(&key, args.ttl, payload.clone()).await {
                Ok(Some(lease)) => Ok(lease),
                Ok(None) => {
                    let who = match backend.read(&key).await {
                        Ok(state) => state
                            .holding()
                            .map(|h| format!(" by {} (fence {})", h.holder, h.fence))
                            .unwrap_or_default(),
                        Err(_) => String::new(),
                    };
                    Err(Fail {
                        code: EXIT_NOT_ACQUIRED,
                        message: format!("lease {key} is held{who}; not waiting (--wait 0)"),
                    })
                }
                Err(e) => Err(Fail::backend(&e)),
            }
        } else {
            keeper
                .acquire(&key, args.ttl, payload.clone(), args.wait)
                .await
                .map_err(|e| match e {
                    AcquireError::Timeout { .. } => Fail {
                        code: EXIT_NOT_ACQUIRED,
                        message: util::one_line(&e),
                    },
                    AcquireError::Backend(e) => Fail::backend(&e),
                    other => Fail::backend(&lease_core::Error::Backend(other.to_string().into())),
                })
        }
    };
    let lease = tokio::select! {
        l = acquiring => l?,
        sig = signals.next() => {
            return Err(Fail {
                code: 128 + u8::try_from(sig).unwrap_or(0),
                message: format!("interrupted while waiting for lease {key}"),
            });
        }
    };
    tracing::info!(key = %key, fence = %lease.fence(), holder = %holder, ttl = ?lease.ttl(), "lease acquired");

    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LEASE_KEY", key.as_str())
        .env("LEASE_FENCE", lease.fence().get().to_string())
        .env("LEASE_HOLDER", holder.as_str())
        // Its own process group: a loss signals the whole group (a shell and
        // what it started), and terminal signals reach it through us.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            release(lease).await;
            let code = if e.kind() == ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            };
            return Err(Fail {
                code,
                message: format!("cannot run {:?}: {e}", args.command[0]),
            });
        }
    };
    let pgid = child.id().and_then(|p| i32::try_from(p).ok());
    tracing::info!(pid = ?pgid, "command started");

    let mut loss = lease.loss_watch();
    let mut tick = tokio::time::interval(DEADLINE_CHECK);
    let ended = loop {
        tokio::select! {
            status = child.wait() => break Ok(status),
            reason = loss.wait() => break Err(reason.to_string()),
            _ = tick.tick() => {
                if !lease.may_write() {
                    let why = lease.loss().map_or_else(
                        || "the write deadline passed without a successful renewal".to_owned(),
                        |r| r.to_string(),
                    );
                    break Err(why);
                }
            }
            sig = signals.next() => {
                tracing::info!(signal = sig, "passing the signal on to the command");
                kill_group(pgid, sig);
            }
        }
    };
    match ended {
        Ok(status) => {
            release(lease).await;
            match status {
                Ok(status) => Ok(exit_code(status)),
                Err(e) => Err(Fail::backend(&lease_core::Error::Backend(
                    format!("waiting for the command failed: {e}").into(),
                ))),
            }
        }
        Err(why) => {
            eprintln!(
                "lease: lost lease {key} (fence {}) while the command ran: {why}; sending SIGTERM",
                lease.fence()
            );
            stop(&mut child, pgid, args.grace).await;
            release(lease).await;
            Err(Fail {
                code: EXIT_LOST,
                message: format!("the command was stopped because lease {key} was lost"),
            })
        }
    }
}

/// SIGTERM to the command's group, SIGKILL after `grace`.
async fn stop(child: &mut Child, pgid: Option<i32>, grace: Duration) {
    kill_group(pgid, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "lease: the command did not exit within {}; sending SIGKILL",
            util::human(grace)
        );
        kill_group(pgid, libc::SIGKILL);
        let _ = child.wait().await;
    }
    // Whatever else is left in the group (a shell's background jobs) goes too.
    kill_group(pgid, libc::SIGKILL);
}

fn kill_group(pgid: Option<i32>, sig: i32) {
    if let Some(pgid) = pgid.filter(|p| *p > 0) {
        // SAFETY: kill(2) with a negative pid signals that process group; it
        // has no memory-safety preconditions.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

async fn release(lease: Lease) {
    let key = lease.key().clone();
    if let Err(e) = lease.release().await {
        eprintln!(
            "lease: releasing {key} failed (it expires by itself after its TTL): {}",
            util::one_line(&e)
        );
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught to be passed on to the command.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> Result<Signals, Fail> {
        let make = |k: SignalKind| {
            signal(k).map_err(|e| Fail::usage(format!("cannot install a signal handler: {e}")))
        };
        Ok(Signals {
            int: make(SignalKind::interrupt())?,
            term: make(SignalKind::terminate())?,
            hup: make(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}
