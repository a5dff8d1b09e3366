//! `lease elect`: campaign for leadership of a key, run a command while
//! leader, hand over when it exits.
//!
//! The command runs under exactly the guarantees of `lease run` (the same
//! code: [`supervise`]); what differs is how leadership is taken and given
//! up. A candidate campaigns with a value (advertised to `lease leader`)
//! and waits as long as `--wait` says (default: forever); when the command
//! exits, the leader resigns at once, so a waiting candidate takes over
//! without waiting for the TTL.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::time::Duration;

use clap::Args;
use lease::{AcquireError, Election, HolderId, Keeper, Leadership, Payload};

use crate::boottime::BootClock;
use crate::clients::Clients;
use crate::commands::open;
use crate::run::Supervision;
use crate::run::{
    give_up, holder_id, interrupted, supervise, Leftovers, Ran, Signals, StopPlan, Under,
};
use crate::util::{self, hostname, parse_duration};
use crate::{Fail, KeyArgs, EXIT_NOT_ACQUIRED};

#[derive(Args, Debug)]
pub struct ElectArgs {
    #[command(flatten)]
    pub target: KeyArgs,
    /// The value this candidate advertises while leader (what `lease leader`
    /// prints: an address, a name), stored as the lease's payload
    /// (default: this machine's host name).
    #[arg(long, value_name = "VALUE")]
    pub value: Option<OsString>,
    /// Leadership TTL: how long the leadership outlives a leader that stops
    /// renewing. A TTL below the backend's minimum is raised to it, and
    /// `lease` says so on stderr.
    #[arg(long, env = "LEASE_TTL", allow_negative_numbers = true, value_parser = parse_duration, default_value = "10s", value_name = "DURATION")]
    pub ttl: Duration,
    /// How long each campaign waits to become leader (default: forever;
    /// 0: fail at once if another candidate leads). Running out exits 75.
    #[arg(long, env = "LEASE_WAIT", allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    pub wait: Option<Duration>,
    /// After leadership is lost, or after the command exits 0, campaign
    /// again and run the command again when elected (see the exit codes).
    #[arg(long)]
    pub recampaign: bool,
    /// Holder name: the holder id becomes NAME:<8 random characters>, unique
    /// to this run (default: user@host:pid:random).
    #[arg(long, value_name = "NAME")]
    pub holder: Option<String>,
    /// Time between SIGTERM and SIGKILL when leadership is lost (default 5s,
    /// shortened to fit the TTL: at most 7/30 of it).
    #[arg(long, env = "LEASE_GRACE", allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    pub grace: Option<Duration>,
    /// Processes the command leaves running when it exits: `wait` keeps
    /// leadership until they exit, `stop` sends them SIGTERM, then SIGKILL
    /// after --grace; leadership is given up only when they are gone.
    #[arg(long, env = "LEASE_LEFTOVERS", value_enum, default_value_t = Leftovers::Wait, value_name = "WHAT")]
    pub leftovers: Leftovers,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        last = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// `lease elect`.
pub async fn elect(args: ElectArgs, timeout: Duration, clients: &Clients) -> Result<u8, Fail> {
    // Refuse a grace period that cannot fit before campaigning.
    StopPlan::new(args.ttl, args.grace).map_err(Fail::usage)?;
    let holder = HolderId::new(holder_id(args.holder.as_deref()))
        .map_err(|e| Fail::usage(util::one_line(&e)))?;
    let value = match &args.value {
        Some(v) => v.clone().into_vec(),
        None => hostname().into_bytes(),
    };
    let value = Payload::new(value).map_err(|e| Fail::usage(util::one_line(&e)))?;
    let mut signals = Signals::new()?;
    // Sampling from before the first campaign, so each grant's send is
    // mapped right.
    let clock = BootClock::start();
    let how = Supervision {
        grace: args.grace,
        leftovers: args.leftovers,
    };
    let (kind, key, backend) = tokio::select! {
        opened = open(&args.target, timeout, clients) => opened?,
        sig = signals.next() => return Err(interrupted(sig, "while connecting")),
    };
    let keeper = Keeper::new(backend)
        .with_holder(holder.clone())
        .with_backend_label(kind.name());
    let election = Election::new(keeper, key.clone()).with_ttl(args.ttl);
    let wait = args.wait.unwrap_or(Duration::MAX);
    let mut noted_ttl = false;
    loop {
        let campaign = async {
            election
                .campaign(value.clone())
                .wait(wait)
                .await
                .map_err(|e| match e {
                    AcquireError::Timeout { .. } | AcquireError::Held { .. } => Fail {
                        code: EXIT_NOT_ACQUIRED,
                        message: util::one_line(&e),
                    },
                    AcquireError::Backend(e) => Fail::backend(&e),
                    other => Fail::backend(&lease::Error::Backend(other.to_string().into())),
                })
        };
        let leadership: Leadership = tokio::select! {
            l = campaign => l?,
            sig = signals.next() => {
                return Err(interrupted(sig, &format!("while campaigning for {key}")));
            }
        };
        tracing::info!(key = %key, fence = %leadership.fence(), holder = %leadership.holder(), "elected");
        if leadership.ttl() > args.ttl && !noted_ttl {
            noted_ttl = true;
            eprintln!(
                "lease: note: --ttl {} is below what the backend grants; leadership has a TTL of {}",
                util::human(args.ttl),
                util::human(leadership.ttl())
            );
        }
        let ran = supervise(
            Under::plain(&leadership),
            &args.command,
            how,
            &clock,
            &mut signals,
        )
        .await;
        // Hand over at once: a waiting candidate is woken now, not after
        // the TTL.
        let fence = leadership.fence();
        let interrupted_resign = give_up(
            &key,
            "resigning",
            leadership.resign(),
            timeout,
            &mut signals,
        )
        .await;
        match ran {
            Ran::Exited {
                code: 0,
                signalled: false,
            } if args.recampaign && !interrupted_resign => {
                tracing::info!(key = %key, %fence, "the command exited 0; campaigning again");
            }
            Ran::Exited { code, .. } => return Ok(code),
            Ran::Lost(f) if args.recampaign && !interrupted_resign => {
                eprintln!("lease: {}; campaigning again", f.message);
            }
            Ran::Lost(f) | Ran::Failed(f) => return Err(f),
        }
    }
}
