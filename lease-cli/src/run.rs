//! `lease run` (a distributed flock) and `lease hold` (the lease alone).

use std::ffi::OsString;
use std::io::ErrorKind;
use std::process::ExitStatus;
use std::time::Duration;

use lease::{AcquireError, Keeper, Lease, LeaseView, LossWatch, SharedLease};
use lease::{HolderId, LeaseKey, Payload, Timing};
use rustix::process::{kill_process_group, Pid, Signal as Sig};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

use crate::boottime::BootClock;
use crate::clients::Clients;
use crate::commands::open;
use crate::terminal::Terminal;
use crate::tree::{self, pid_list, Tracked};
use crate::util::{self, default_holder};
use crate::watchdog::{processes, Watchdog};
use crate::{AcquireArgs, Fail, HoldArgs, RunArgs, EXIT_CANNOT_EXECUTE, EXIT_LOST, EXIT_NOT_FOUND};

/// How often the holder-side deadline is checked while the command runs.
const DEADLINE_CHECK: Duration = Duration::from_millis(50);

/// The default time between SIGTERM and SIGKILL, where the TTL leaves room.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// When the command must be stopped, and by when it must be dead.
///
/// With TTL `T`, the last successful renewal sent at `s` and the write
/// deadline `D = s + 2/3 T`, another holder can be granted the key from
/// `s + T` on. So `lease` sends SIGTERM a little before `D` (by `lead`, so
/// its own watchdog, which kills at `D`, finds it already stopping), and
/// SIGKILL at the latest at the hard limit `H = s + T − T/10`: the grace
/// period must fit in `H − D = T/3 − T/10 = 7/30 T`.
#[derive(Clone, Copy, Debug)]
pub struct StopPlan {
    ttl: Duration,
    grace: Duration,
    lead: Duration,
    deadline_fraction: f64,
}

impl StopPlan {
    /// The plan for an effective TTL `ttl` and a grace period (`None`: the
    /// default, shortened to fit).
    ///
    /// # Errors
    /// A usage message when `grace` does not fit in the TTL.
    pub fn new(ttl: Duration, grace: Option<Duration>) -> Result<StopPlan, String> {
        let deadline_fraction = Timing::default().deadline_fraction();
        let room = Self::room(ttl, deadline_fraction);
        let grace = match grace {
            None => DEFAULT_GRACE.min(room),
            Some(g) if g <= room => g,
            Some(g) => {
                return Err(format!(
                    "--grace {} does not fit --ttl {}: SIGTERM goes at the write deadline \
                     (2/3 of the TTL after the last renewal) and SIGKILL must land before \
                     another holder can be granted the key (the TTL less a 10% margin), which \
                     leaves {}; use --grace {} or less, or --ttl {} or more",
                    util::human(g),
                    util::human(ttl),
                    util::human(room),
                    util::human(tenths(room, f64::floor)),
                    util::human(tenths(g.mul_f64(30.0 / 7.0), f64::ceil))
                ))
            }
        };
        Ok(StopPlan {
            ttl,
            grace,
            lead: (ttl / 10).min(Duration::from_millis(250)),
            deadline_fraction,
        })
    }

    /// `H − D`: the time from the write deadline to the hard limit.
    fn room(ttl: Duration, deadline_fraction: f64) -> Duration {
        ttl.mul_f64(1.0 - deadline_fraction)
            .saturating_sub(ttl / 10)
    }

    /// The grace period in force.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// When to start stopping the command, for write deadline `deadline`.
    fn stop_at(&self, deadline: Instant) -> Instant {
        deadline.checked_sub(self.lead).unwrap_or(deadline)
    }

    /// The latest instant the command may live, for write deadline `deadline`.
    fn hard_limit(&self, deadline: Instant) -> Instant {
        let room = Self::room(self.ttl, self.deadline_fraction);
        deadline.checked_add(room).unwrap_or(deadline)
    }
}

/// How `lease run` takes its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A plain lease on the key.
    Plain,
    /// Shared with other shared holders (`--shared`).
    Shared,
    /// Exclusive, shutting new shared holders out first (`--exclusive`).
    Exclusive,
    /// One of this many permits (`--permits N`).
    Permits(u32),
}

/// A lease as taken: a plain one (also an exclusive one or a permit), or a
/// shared one.
pub enum Held {
    /// A lease on the key, or on a permit's slot key.
    Lease(Lease),
    /// A shared lease.
    Shared(SharedLease),
}

impl Held {
    /// What a command runs under: for a shared lease, the phase's view
    /// (key, fence), its own holder id, and its registration, whose
    /// deadline bounds the run too.
    pub fn under(&self) -> Under<'_> {
        match self {
            Held::Lease(l) => Under::plain(l),
            Held::Shared(s) => Under {
                view: s,
                holder: s.holder(),
                also: Some(s.registration()),
            },
        }
    }

    async fn release(self) -> Result<(), lease::Error> {
        match self {
            Held::Lease(l) => l.release().await,
            Held::Shared(s) => s.release().await,
        }
    }
}

/// What a command runs under: a lease's view, the holder id the command is
/// told, and, for a shared lease, the registration that must stay live too.
///
/// An exclusive holder gets in as soon as a shared holder's registration
/// is gone, whatever the phase's own grant: so the stop and the watchdog
/// go by the earlier of the two deadlines, not the phase's alone.
#[derive(Clone, Copy)]
pub struct Under<'a> {
    view: &'a LeaseView,
    holder: &'a HolderId,
    also: Option<&'a LeaseView>,
}

impl<'a> Under<'a> {
    /// A lease (or leadership) alone.
    pub fn plain(view: &'a LeaseView) -> Self {
        Under {
            view,
            holder: view.holder(),
            also: None,
        }
    }

    fn key(&self) -> &'a LeaseKey {
        self.view.key()
    }

    fn fence(&self) -> lease::Fence {
        self.view.fence()
    }

    fn ttl(&self) -> Duration {
        self.view.ttl()
    }

    fn holder(&self) -> &'a HolderId {
        self.holder
    }

    fn may_write(&self) -> bool {
        self.view.may_write() && self.also.is_none_or(LeaseView::may_write)
    }

    fn deadline(&self) -> Instant {
        let d = self.view.deadline();
        self.also.map_or(d, |a| d.min(a.deadline()))
    }

    /// The grant whose deadline comes first (its send instant and deadline
    /// belong together).
    fn grant(&self) -> lease::Grant {
        let grant = self.view.grant();
        match self.also.map(LeaseView::grant) {
            Some(other) if other.deadline() < grant.deadline() => other,
            _ => grant,
        }
    }

    fn loss(&self) -> Option<lease::LossReason> {
        self.view
            .loss()
            .or_else(|| self.also.and_then(LeaseView::loss))
    }

    fn loss_watch(&self) -> LossWatch {
        // A shared lease's phase view is lost when its registration is.
        self.view.loss_watch()
    }
}

/// A lease taken as `args` say, and what it was taken with.
struct Taken {
    key: LeaseKey,
    lease: Held,
}

/// Connects and takes the lease (waiting as `args` say); an interrupt ends
/// either step.
async fn take(
    args: &AcquireArgs,
    mode: Mode,
    timeout: Duration,
    clients: &Clients,
    signals: &mut Signals,
) -> Result<Taken, Fail> {
    let holder = HolderId::new(holder_id(args.holder.as_deref()))
        .map_err(|e| Fail::usage(util::one_line(&e)))?;
    let payload = Payload::new(args.payload.clone().unwrap_or_default().into_bytes())
        .map_err(|e| Fail::usage(util::one_line(&e)))?;
    let (kind, key, backend) = tokio::select! {
        opened = open(&args.target, timeout, clients) => opened?,
        sig = signals.next() => return Err(interrupted(sig, "while connecting")),
    };
    let keeper = Keeper::new(backend.clone())
        .with_holder(holder.clone())
        .with_backend_label(kind.name());
    // None: for ever.
    let wait = if args.nonblock {
        Some(Duration::ZERO)
    } else {
        args.wait
    };
    let conflict = args.conflict_exit_code;
    let quiet = args.quiet;
    let acquiring = async {
        let started = Instant::now();
        // One attempt first: a key held by someone else is said once, as
        // flock --verbose does, so a long wait is never a silent one.
        let held = match attempt(
            &keeper,
            &key,
            mode,
            args.ttl,
            &payload,
            Some(Duration::ZERO),
        )
        .await
        {
            Ok(lease) => return Ok(lease),
            Err(AcquireError::Held { holder, fence, .. }) => {
                format!("{key} is held by {holder} (fence {fence})")
            }
            // The one attempt of a shared, exclusive or permit acquire.
            Err(AcquireError::Timeout { holder, .. }) => match (mode, holder) {
                (Mode::Permits(n), Some(h)) => {
                    format!("all {n} permits of {key} are held (one by {h})")
                }
                (Mode::Permits(n), None) => format!("all {n} permits of {key} are held"),
                (_, Some(h)) => format!("{key} is held by {h}"),
                (_, None) => format!("{key} is held"),
            },
            Err(AcquireError::Backend(e)) => return Err(Fail::backend(&e)),
            Err(other) => {
                return Err(Fail::backend(&lease::Error::Backend(
                    other.to_string().into(),
                )))
            }
        };
        match wait {
            Some(w) if w.is_zero() => {
                let how = if args.nonblock { "-n" } else { "--wait 0" };
                return Err(Fail {
                    code: conflict,
                    message: if quiet {
                        String::new()
                    } else {
                        format!("{held}; skipped, not waiting ({how})")
                    },
                });
            }
            Some(w) if !quiet => {
                eprintln!("lease: {held}; waiting for it (up to {})", util::human(w))
            }
            None if !quiet => eprintln!("lease: {held}; waiting for it"),
            _ => {}
        }
        let left = wait.map_or(Duration::MAX, |w| w.saturating_sub(started.elapsed()));
        attempt(&keeper, &key, mode, args.ttl, &payload, Some(left))
            .await
            .map_err(|e| match e {
                AcquireError::Timeout { .. } => Fail {
                    code: conflict,
                    message: util::one_line(&e),
                },
                AcquireError::Backend(e) => Fail::backend(&e),
                other => Fail::backend(&lease::Error::Backend(other.to_string().into())),
            })
    };
    let lease = tokio::select! {
        l = acquiring => l?,
        sig = signals.next() => return Err(interrupted(sig, &format!("while waiting for lease {key}"))),
    };
    let under = lease.under();
    tracing::info!(key = %under.key(), fence = %under.fence(), holder = %under.holder(), ttl = ?under.ttl(), "lease acquired");
    // The effective TTL may be longer than asked for (a backend's minimum).
    if under.ttl() > args.ttl && !args.quiet {
        eprintln!(
            "lease: note: --ttl {} is below what the backend grants; the lease has a TTL of {}",
            util::human(args.ttl),
            util::human(under.ttl())
        );
    }
    Ok(Taken { key, lease })
}

/// One acquire of `key` as `mode` says, waiting up to `wait`. A plain one
/// with a zero wait is a single `try_acquire`, so that a held key is told
/// with its holder and fence ([`AcquireError::Held`]); the others' single
/// attempt ends in [`AcquireError::Timeout`].
async fn attempt(
    keeper: &Keeper,
    key: &LeaseKey,
    mode: Mode,
    ttl: Duration,
    payload: &Payload,
    wait: Option<Duration>,
) -> Result<Held, AcquireError> {
    let payload = payload.clone();
    let wait = wait.unwrap_or(Duration::MAX);
    match mode {
        Mode::Plain if wait.is_zero() => keeper
            .try_acquire(key)
            .ttl(ttl)
            .payload(payload)
            .await
            .map(Held::Lease),
        Mode::Plain => keeper
            .acquire(key)
            .ttl(ttl)
            .wait(wait)
            .payload(payload)
            .await
            .map(Held::Lease),
        Mode::Shared => keeper
            .acquire_shared(key)
            .ttl(ttl)
            .wait(wait)
            .payload(payload)
            .await
            .map(Held::Shared),
        Mode::Exclusive => keeper
            .acquire_exclusive(key)
            .ttl(ttl)
            .wait(wait)
            .payload(payload)
            .await
            .map(Held::Lease),
        Mode::Permits(n) => keeper
            .acquire_permit(key, n)
            .ttl(ttl)
            .wait(wait)
            .payload(payload)
            .await
            .map(Held::Lease),
    }
}

/// `lease hold`: take the lease, say so, keep it until interrupted.
pub async fn hold(args: HoldArgs, timeout: Duration, clients: &Clients) -> Result<u8, Fail> {
    let mut signals = Signals::new()?;
    let Taken { key, lease } =
        take(&args.lease, Mode::Plain, timeout, clients, &mut signals).await?;
    let Held::Lease(lease) = lease else {
        // A plain acquire gives a plain lease.
        release(lease, timeout, &mut signals).await;
        return Err(Fail::usage("`lease hold` takes a plain lease"));
    };
    let line = if args.json {
        serde_json::json!({
            "key": key.as_str(),
            "holder": lease.holder().as_str(),
            "fence": lease.fence().get(),
            "ttl_ms": u64::try_from(lease.ttl().as_millis()).unwrap_or(u64::MAX),
        })
        .to_string()
    } else {
        lease.fence().to_string()
    };
    if let Err(e) = util::try_out(&line) {
        // Nobody learns the fence: give the lease back, then end as the
        // other commands do on a closed stdout (quietly, by SIGPIPE).
        release(Held::Lease(lease), timeout, &mut signals).await;
        util::stdout_failed(e);
    }
    let mut loss = lease.loss_watch();
    let mut tick = tokio::time::interval(DEADLINE_CHECK);
    let lost = loop {
        tokio::select! {
            reason = loss.wait() => break Some(reason.to_string()),
            _ = tick.tick() => {
                if !lease.may_write() {
                    break Some(loss_reason(Under::plain(&lease), &mut loss).await);
                }
            }
            _ = signals.next() => break None,
        }
    };
    let fence = lease.fence();
    release(Held::Lease(lease), timeout, &mut signals).await;
    match lost {
        None => Ok(0),
        Some(why) => Err(Fail {
            code: EXIT_LOST,
            message: format!("lost lease {key} (fence {fence}): {why}"),
        }),
    }
}

pub async fn run(args: RunArgs, timeout: Duration, clients: &Clients) -> Result<u8, Fail> {
    // Refuse a grace period that cannot fit before anything is acquired.
    StopPlan::new(args.lease.ttl, args.grace).map_err(Fail::usage)?;
    // Signals are caught from here on, so an interrupt while connecting or
    // waiting for the key ends `lease` cleanly.
    let mut signals = Signals::new()?;
    // Sampling from before the acquire, so its send is mapped right.
    let clock = BootClock::start();
    let Taken { lease, .. } =
        take(&args.lease, args.mode(), timeout, clients, &mut signals).await?;
    let taken = Instant::now();
    let how = Supervision {
        grace: args.grace,
        leftovers: args.leftovers,
    };
    let ran = supervise(lease.under(), &args.command, how, &clock, &mut signals).await;
    if let (Ran::Exited { .. }, Some(least)) = (&ran, args.hold_at_least) {
        let until = taken.checked_add(least).unwrap_or_else(far_future);
        keep_until(lease.under(), until, &mut signals).await;
    }
    release(lease, timeout, &mut signals).await;
    ran.into_result()
}

/// An instant no wait reaches (about 30 years on).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

/// `--hold-at-least`: keeps the lease (the keeper renews it) after the
/// command ended, until `until`, an interrupt, or a loss. A loss is said
/// on stderr and changes nothing else: the command's work is done, and
/// only the minimum hold is cut short.
async fn keep_until(lease: Under<'_>, until: Instant, signals: &mut Signals) {
    let mut loss = lease.loss_watch();
    let mut tick = tokio::time::interval(DEADLINE_CHECK);
    let lost = loop {
        tokio::select! {
            () = tokio::time::sleep_until(until) => break None,
            reason = loss.wait() => break Some(reason.to_string()),
            _ = tick.tick() => {
                if !lease.may_write() {
                    break Some(loss_reason(lease, &mut loss).await);
                }
            }
            _ = signals.next() => break None,
        }
    };
    if let Some(why) = lost {
        eprintln!(
            "lease: lost lease {} (fence {}) while keeping it for --hold-at-least: {why}",
            lease.key(),
            lease.fence()
        );
    }
}

/// How a command run under a lease ([`supervise`]) ended. The lease is still
/// to be released.
#[derive(Debug)]
pub enum Ran {
    /// The command exited by itself, with `lease`'s exit code for its status
    /// (128+N for signal N).
    Exited {
        /// The exit code.
        code: u8,
        /// Whether a signal sent to `lease` was passed on to the command
        /// while it ran (an operator asked it to end).
        signalled: bool,
    },
    /// The lease was lost or its write deadline passed: the command was
    /// stopped (SIGTERM, then SIGKILL). The code is [`EXIT_LOST`].
    Lost(Fail),
    /// The command could not be started or waited for.
    Failed(Fail),
}

impl Ran {
    /// `lease run`'s result.
    pub fn into_result(self) -> Result<u8, Fail> {
        match self {
            Ran::Exited { code, .. } => Ok(code),
            Ran::Lost(f) | Ran::Failed(f) => Err(f),
        }
    }
}

/// What `lease run` and `lease elect` do with processes the command left
/// running when it exited (background jobs, daemons): the lease is held
/// until they are gone either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Leftovers {
    /// Keep the lease, renewing it, until they exit by themselves (as
    /// flock(1) holds its lock while any process keeps the descriptor).
    #[default]
    Wait,
    /// Stop them: SIGTERM, then SIGKILL after the grace period, then
    /// release.
    Stop,
}

/// How a command runs under a lease: the grace period between SIGTERM and
/// SIGKILL (`None`: the default, shortened to fit the TTL), and what
/// happens to processes it leaves running.
#[derive(Clone, Copy, Debug)]
pub struct Supervision {
    /// The grace period.
    pub grace: Option<Duration>,
    /// What to do with processes the command left running.
    pub leftovers: Leftovers,
}

/// How the supervision of a command ended, before the stopping.
enum End {
    /// The command and everything it started ended.
    Exited,
    /// The lease was lost or its deadline is due (the reason, if known).
    Lost(Option<String>),
    /// The command exited and left these running, to be stopped.
    Leftovers(Vec<i32>),
}

/// Runs `command` while `lease` may be written under, with the guarantees of
/// `lease run`: LEASE_KEY, LEASE_FENCE and LEASE_HOLDER in its environment,
/// a process group of its own, signals to `lease` passed on, SIGTERM then
/// SIGKILL (after the grace period, shortened to fit the TTL) at a loss or
/// at the write deadline to every process started under it, and a watchdog
/// process that kills them all if `lease` is killed or frozen. `lease` is
/// their child subreaper, so a daemon that leaves the group is still found.
/// Returns when every process started under the lease has ended (the
/// command exited and, as `how` says, its leftovers were waited for or
/// stopped); releasing the lease is the caller's. `clock` must have been
/// started before the lease was acquired.
pub async fn supervise(
    lease: Under<'_>,
    command: &[OsString],
    how: Supervision,
    clock: &BootClock,
    signals: &mut Signals,
) -> Ran {
    let key = lease.key();
    let plan = match StopPlan::new(lease.ttl(), how.grace) {
        Ok(plan) => plan,
        Err(e) => return Ran::Failed(Fail::usage(e)),
    };
    let Some(program) = command.first() else {
        return Ran::Failed(Fail::usage("no command to run"));
    };
    // Orphans of the command come to `lease`, not init: nothing it starts
    // can leave `lease`'s subtree while `lease` lives.
    if let Err(e) = tree::become_subreaper() {
        return Ran::Failed(Fail::backend(&lease::Error::Backend(
            format!("cannot become the child subreaper of the command: {e}").into(),
        )));
    }
    let me = rustix::process::getpid().as_raw_nonzero().get();

    // The watchdog kills the command's processes if `lease` dies or
    // freezes. It starts first and knows the deadline before the command
    // can run: a command nobody would stop is never started.
    let mut deadline = lease.deadline();
    let environment = [
        ("LEASE_KEY", key.as_str().to_owned()),
        ("LEASE_FENCE", lease.fence().get().to_string()),
        ("LEASE_HOLDER", lease.holder().as_str().to_owned()),
    ];
    let marks: Vec<String> = environment
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let watchdog = match Watchdog::start(plan.grace(), &marks) {
        Ok(mut w) => {
            let (d, h) = boot_deadlines(lease, &plan, clock);
            match w.renewed(d, h).await {
                Ok(()) => Ok(w),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    let mut watchdog = match watchdog {
        Ok(w) => w,
        Err(e) => {
            return Ran::Failed(Fail::backend(&lease::Error::Backend(
                format!("cannot start the watchdog of the command: {e}").into(),
            )));
        }
    };
    let watchdog_pid: Vec<i32> = watchdog.pid().into_iter().collect();

    let mut cmd = Command::new(program);
    cmd.args(command.get(1..).unwrap_or_default())
        .envs(environment)
        // Its own process group: signals passed on reach a shell and what
        // it started.
        .process_group(0)
        .kill_on_drop(true);
    // In a terminal's foreground, the command's group takes the terminal
    // (so it can read it), and `lease` takes it back when it ends.
    let terminal = Terminal::foreground();
    if let Some(t) = &terminal {
        t.hand_over_on_spawn(&mut cmd);
    }
    watchdog.gate(&mut cmd);
    let spawned = cmd.spawn();
    let _taken_back = terminal.as_ref().map(TakeBack);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            watchdog.done().await;
            let code = if e.kind() == ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            };
            return Ran::Failed(Fail {
                code,
                message: format!("cannot run {program:?}: {e}"),
            });
        }
    };
    let pgid = child.id().and_then(|p| i32::try_from(p).ok());
    tracing::info!(pid = ?pgid, "command started");
    // Children whose status tokio waits for are not reaped here.
    let keep_running: Vec<i32> = watchdog_pid.iter().copied().chain(pgid).collect();

    let mut loss = lease.loss_watch();
    let mut tick = tokio::time::interval(DEADLINE_CHECK);
    let mut signalled = false;
    let mut exited: Option<std::io::Result<ExitStatus>> = None;
    let mut announced = false;
    let end = loop {
        tokio::select! {
            status = child.wait(), if exited.is_none() => exited = Some(status),
            reason = loss.wait() => break End::Lost(Some(reason.to_string())),
            _ = tick.tick() => {
                if !lease.may_write() {
                    // The reason may still be on its way (see `loss_reason`):
                    // the command is stopped first.
                    break End::Lost(lease.loss().map(|r| r.to_string()));
                }
                if Instant::now() >= plan.stop_at(lease.deadline()) {
                    break End::Lost(Some("the write deadline is due without a successful renewal".into()));
                }
                if lease.deadline() != deadline {
                    deadline = lease.deadline();
                    let (d, h) = boot_deadlines(lease, &plan, clock);
                    if let Err(e) = watchdog.renewed(d, h).await {
                        break End::Lost(Some(format!("the watchdog of the command is gone ({e})")));
                    }
                }
            }
            sig = signals.next() => {
                tracing::info!(signal = sig, "passing the signal on to the command");
                signalled = true;
                if let Some(sig) = Sig::from_named_raw(sig) {
                    if exited.is_none() {
                        kill_group(pgid, sig);
                    } else {
                        leftovers(me, &watchdog_pid).signal(sig);
                    }
                }
            }
        }
        if exited.is_none() {
            tree::reap_orphans(&keep_running);
            if let (Some(t), Some(pid)) = (&terminal, pgid.and_then(Pid::from_raw)) {
                t.follow_stop(pid, pid);
            }
            continue;
        }
        tree::reap_orphans(&watchdog_pid);
        let left: Vec<i32> = leftovers(me, &watchdog_pid)
            .running()
            .iter()
            .map(|p| p.pid)
            .collect();
        if left.is_empty() {
            if tree::nothing_left(me, &watchdog_pid) {
                break End::Exited;
            }
            // A walk of the tree missed something that still runs: look
            // again at the next tick.
            continue;
        }
        if how.leftovers == Leftovers::Stop {
            break End::Leftovers(left);
        }
        if !announced {
            announced = true;
            eprintln!(
                "lease: the command exited{}; waiting for {} it left running (pids {}) before giving up lease {key} \
                 (--leftovers stop would stop them)",
                status_note(exited.as_ref()),
                processes(left.len()),
                pid_list(&left)
            );
        }
    };
    let code = |exited: Option<std::io::Result<ExitStatus>>| match exited {
        Some(Ok(status)) => Ok(exit_code(status)),
        Some(Err(e)) => Err(Ran::Failed(Fail::backend(&lease::Error::Backend(
            format!("waiting for the command failed: {e}").into(),
        )))),
        None => Ok(1),
    };
    match end {
        End::Exited => {
            watchdog.done().await;
            let killed = exited.as_ref().is_some_and(|s| {
                s.as_ref().is_ok_and(|s| {
                    use std::os::unix::process::ExitStatusExt;
                    s.signal() == Some(libc::SIGKILL)
                })
            });
            if killed && !lease.may_write() {
                // `lease` was stopped or starved past the deadline, and its
                // watchdog killed the command.
                return Ran::Lost(Fail {
                    code: EXIT_LOST,
                    message: format!(
                        "the command was killed at the write deadline of lease {key} (fence {}): \
                         `lease` did not renew in time",
                        lease.fence()
                    ),
                });
            }
            match code(exited) {
                Ok(code) => Ran::Exited { code, signalled },
                Err(ran) => ran,
            }
        }
        End::Leftovers(left) => {
            let _ = watchdog.stopping().await;
            eprintln!(
                "lease: the command exited{}; stopping {} it left running (pids {}): SIGTERM, then SIGKILL after {}",
                status_note(exited.as_ref()),
                processes(left.len()),
                pid_list(&left),
                util::human(plan.grace())
            );
            let mut stopping = Stopping {
                child: &mut child,
                exited: true,
                pgid,
                me,
                skip: &watchdog_pid,
            };
            let survivors = stopping.stop(plan.grace(), plan.hard_limit(deadline)).await;
            if !survivors.is_empty() {
                // Releasing now would let the next holder in beside them:
                // keep the lease (the keeper renews it) until they end.
                eprintln!(
                    "lease: could not stop {} (pids {}): not ours to signal, or stuck in the kernel; \
                     keeping lease {key} until they exit",
                    processes(survivors.len()),
                    pid_list(&survivors)
                );
                if let Err(why) = hold_until_gone(lease, &mut loss, me, &watchdog_pid).await {
                    watchdog.done().await;
                    return Ran::Lost(Fail {
                        code: EXIT_LOST,
                        message: format!(
                            "lease {key} was lost ({why}) while processes `lease` could not stop still ran"
                        ),
                    });
                }
            }
            watchdog.done().await;
            match code(exited) {
                Ok(code) => Ran::Exited { code, signalled },
                Err(ran) => ran,
            }
        }
        End::Lost(why) => {
            let _ = watchdog.stopping().await;
            let kill_by = plan.hard_limit(deadline);
            let fence = lease.fence();
            let what = if exited.is_some() {
                "while processes the command left running still ran"
            } else {
                "while the command ran"
            };
            // SIGTERM goes out at once; the reason, when a refused renewal's
            // is still being read, is printed as soon as it is known.
            let say = async {
                let why = match why {
                    Some(why) => why,
                    None => loss_reason(lease, &mut loss).await,
                };
                eprintln!("lease: lost lease {key} (fence {fence}) {what}: {why}; sending SIGTERM");
            };
            let mut stopping = Stopping {
                child: &mut child,
                exited: exited.is_some(),
                pgid,
                me,
                skip: &watchdog_pid,
            };
            let (survivors, ()) = tokio::join!(stopping.stop(plan.grace(), kill_by), say);
            watchdog.done().await;
            let message = if survivors.is_empty() {
                format!("the command was stopped because lease {key} was lost")
            } else {
                format!(
                    "lease {key} was lost, and {} could not be stopped (pids {}): not ours to signal, \
                     or stuck in the kernel",
                    processes(survivors.len()),
                    pid_list(&survivors)
                )
            };
            Ran::Lost(Fail {
                code: EXIT_LOST,
                message,
            })
        }
    }
}

/// The write deadline and the hard limit of `lease` on `CLOCK_BOOTTIME`,
/// for the watchdog, counted from when the last renewal was sent.
fn boot_deadlines(lease: Under<'_>, plan: &StopPlan, clock: &BootClock) -> (u128, u128) {
    // One grant: its send instant and deadline belong together.
    let grant = lease.grant();
    let sent = Instant::from_std(grant.sent_at());
    let deadline = Instant::from_std(grant.deadline());
    (
        clock.map(sent, deadline),
        clock.map(sent, plan.hard_limit(deadline)),
    )
}

/// The processes started under the lease that still run: `lease`'s
/// subtree (it is their subreaper), less the watchdog (`skip`).
fn leftovers(me: i32, skip: &[i32]) -> Tracked {
    let mut t = Tracked::new();
    t.add_tree(me, skip);
    t
}

/// " with status N" for a command's exit, when known.
fn status_note(exited: Option<&std::io::Result<ExitStatus>>) -> String {
    match exited {
        Some(Ok(s)) => format!(" with status {}", exit_code(*s)),
        _ => String::new(),
    }
}

/// Stopping everything started under the lease: the command (if it still
/// runs) and everything in `lease`'s subtree but the watchdog.
struct Stopping<'a> {
    child: &'a mut Child,
    exited: bool,
    pgid: Option<i32>,
    me: i32,
    skip: &'a [i32],
}

impl Stopping<'_> {
    /// SIGTERM to all of them (and to any found later), SIGKILL after
    /// `grace` — and never later than `kill_by`, before which no other
    /// holder can be granted the key. Returns the pids still running
    /// after that (none, unless `lease` may not signal them — a set-uid
    /// program's — or the kernel holds them in an uninterruptible wait).
    async fn stop(&mut self, grace: Duration, kill_by: Instant) -> Vec<i32> {
        let mut tracked = Tracked::new();
        let mut termed = Vec::new();
        if !self.exited {
            // The group first, as a terminal would signal it; its members
            // are not sent a second SIGTERM (to many programs, a second
            // one means "now").
            tracked.add_tree(self.me, self.skip);
            kill_group(self.pgid, Sig::TERM);
            termed.extend(
                tracked
                    .running()
                    .into_iter()
                    .filter(|p| tree::stat(p.pid).map(|s| s.pgrp) == self.pgid),
            );
        }
        let kill_at = Instant::now()
            .checked_add(grace)
            .map_or(kill_by, |t| t.min(kill_by));
        loop {
            if !self.exited {
                self.exited = matches!(self.child.try_wait(), Ok(Some(_)) | Err(_));
            }
            let keep: Vec<i32> = self.skip.iter().copied().chain(self.pgid).collect();
            tree::reap_orphans(if self.exited { self.skip } else { &keep });
            tracked.add_tree(self.me, self.skip);
            let running = tracked.running();
            if running.is_empty() && self.exited && tree::nothing_left(self.me, self.skip) {
                return Vec::new();
            }
            for p in running {
                if !termed.contains(&p) {
                    p.signal(Sig::TERM);
                    termed.push(p);
                }
            }
            if Instant::now() >= kill_at {
                break;
            }
            tokio::time::sleep(STOP_CHECK).await;
        }
        let left: Vec<i32> = tracked.running().iter().map(|p| p.pid).collect();
        eprintln!(
            "lease: {} did not exit within {}; sending SIGKILL (pids {})",
            processes(left.len()),
            util::human(grace),
            pid_list(&left)
        );
        kill_group(self.pgid, Sig::KILL);
        let (me, skip) = (self.me, self.skip);
        tracked.kill_all(|t| t.add_tree(me, skip));
        if !self.exited {
            let _ = self.child.wait().await;
        }
        // A killed process ends once the kernel schedules it, which on a
        // loaded machine can take longer than the looks above. It runs no
        // code of its own meanwhile, so waiting for it extends no write; a
        // process still there after KILL_SETTLE is reported.
        let settle_by = Instant::now() + KILL_SETTLE;
        loop {
            if tree::nothing_left(me, skip) {
                return Vec::new();
            }
            if Instant::now() >= settle_by {
                break;
            }
            tokio::time::sleep(STOP_CHECK).await;
        }
        tracked.add_tree(me, skip);
        tracked.running().iter().map(|p| p.pid).collect()
    }
}

/// Holds the lease while processes `lease` could not stop still run: `Ok`
/// once none is left, `Err` with why if the lease is lost first (the
/// keeper renews it meanwhile).
async fn hold_until_gone(
    lease: Under<'_>,
    loss: &mut LossWatch,
    me: i32,
    skip: &[i32],
) -> Result<(), String> {
    loop {
        tokio::select! {
            reason = loss.wait() => return Err(reason.to_string()),
            () = tokio::time::sleep(STOP_CHECK) => {
                if !lease.may_write() {
                    return Err("the write deadline passed without a successful renewal".into());
                }
                if tree::nothing_left(me, skip) {
                    return Ok(());
                }
            }
        }
    }
}

/// How often stopping looks for processes that have not exited yet.
const STOP_CHECK: Duration = Duration::from_millis(20);

/// How long killed processes get to end before they are reported as
/// processes `lease` could not stop.
const KILL_SETTLE: Duration = Duration::from_secs(2);

/// The longest the message of a loss waits for its reason (the keeper
/// itself gives up reading it after a TTL).
const REASON_WAIT: Duration = Duration::from_secs(5);

/// Why `lease`, which may no longer write, was lost. When a renewal is
/// refused, the keeper stops the lease at once and then reads why (who took
/// the key over, or who broke it, and with what reason): that reason is
/// waited for, at most a TTL and at most [`REASON_WAIT`].
async fn loss_reason(lease: Under<'_>, loss: &mut LossWatch) -> String {
    if let Some(r) = lease.loss() {
        return r.to_string();
    }
    let pending = lease.deadline() > Instant::now();
    match tokio::time::timeout(lease.ttl().min(REASON_WAIT), loss.wait()).await {
        Ok(r) => r.to_string(),
        Err(_) if pending => "a renewal was refused (why could not be read in time)".to_owned(),
        Err(_) => "the write deadline passed without a successful renewal".to_owned(),
    }
}

/// `d` rounded to a tenth of a second by `round` (for advice that must stay
/// on the right side of a limit).
fn tenths(d: Duration, round: fn(f64) -> f64) -> Duration {
    Duration::try_from_secs_f64(round(d.as_secs_f64() * 10.0) / 10.0).unwrap_or(d)
}

/// Takes the terminal back for `lease` when dropped (the command ended, or
/// could not start).
struct TakeBack<'a>(&'a Terminal);

impl Drop for TakeBack<'_> {
    fn drop(&mut self) {
        self.0.take_back();
    }
}

/// The holder id: `NAME:<random>` for `--holder NAME`, so that the same name
/// on two machines (or twice on one) never shares a grant; else the
/// default `user@host:pid:random`.
pub fn holder_id(name: Option<&str>) -> String {
    match name {
        Some(name) => {
            let rand = HolderId::random();
            format!("{name}:{}", &rand.as_str()[..8])
        }
        None => default_holder(),
    }
}

pub fn interrupted(sig: i32, what: &str) -> Fail {
    Fail {
        code: 128 + u8::try_from(sig).unwrap_or(0),
        message: format!("interrupted {what}"),
    }
}

fn kill_group(pgid: Option<i32>, sig: Sig) {
    if let Some(pid) = pgid.and_then(Pid::from_raw) {
        // The group may be gone already; nothing to do then.
        let _ = kill_process_group(pid, sig);
    }
}

/// Releases the lease, bounded by `timeout`; an interrupt ends the wait
/// (the lease then expires by itself).
async fn release(lease: Held, timeout: Duration, signals: &mut Signals) {
    let key = lease.under().key().clone();
    give_up(&key, "releasing", lease.release(), timeout, signals).await;
}

/// Runs `giving_up` (a release or a resignation of `key`), bounded by
/// `timeout`; an interrupt ends the wait (the lease then expires by
/// itself). A failure is said on stderr. Returns whether a signal ended it.
pub async fn give_up(
    key: &LeaseKey,
    what: &str,
    giving_up: impl std::future::Future<Output = Result<(), lease::Error>>,
    timeout: Duration,
    signals: &mut Signals,
) -> bool {
    let (failed, interrupted) = tokio::select! {
        r = tokio::time::timeout(timeout, giving_up) => (match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(util::one_line(&e)),
            Err(_) => Some(format!("no answer within {}", util::human(timeout))),
        }, false),
        _ = signals.next() => (Some("interrupted".to_owned()), true),
    };
    if let Some(why) = failed {
        eprintln!("lease: {what} {key} failed (it expires by itself after its TTL): {why}");
    }
    interrupted
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
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    pub fn new() -> Result<Signals, Fail> {
        let make = |k: SignalKind| {
            signal(k).map_err(|e| Fail::usage(format!("cannot install a signal handler: {e}")))
        };
        Ok(Signals {
            int: make(SignalKind::interrupt())?,
            term: make(SignalKind::terminate())?,
            hup: make(SignalKind::hangup())?,
        })
    }

    pub async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}
