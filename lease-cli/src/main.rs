//! `lease`: a distributed flock over etcd, NATS JetStream KV, S3-compatible
//! stores, MongoDB and PostgreSQL. See `lease --help` and the crate README.

mod access;
mod boottime;
mod clients;
mod commands;
mod elect;
mod leader;
mod run;
mod terminal;
mod tree;
mod util;
mod watchdog;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::run::Leftovers;
use crate::util::parse_duration;

/// Exit code: the key is not held as asked, and nothing was done. `status`:
/// the key is free (0: held), as grep's "no match", so scripts test it with
/// `if lease status -q URL KEY` and 2 stays an error; `break --if-fence` /
/// `--if-holder`: the live grant is not the one named (or there is none),
/// so nothing was broken.
pub const EXIT_NOT_HELD: u8 = 1;
/// Exit code: usage error (bad arguments, bad URL, unknown scheme, invalid key).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the backend failed or could not be reached.
pub const EXIT_BACKEND: u8 = 69;
/// Exit code: the lease could not be acquired (held past `--wait`, or held
/// with `--wait 0`).
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code: the lease was lost while the command ran (the command was
/// sent SIGTERM, then SIGKILL after the grace period).
pub const EXIT_LOST: u8 = 76;
/// Exit code: the command was found but could not be executed.
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit code: the command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// The longest the exit waits for backend clients to shut down.
const CLIENT_SHUTDOWN: Duration = Duration::from_secs(2);

const URLS: &str = "\
Backend URLs:
  etcd://host:2379[,host:2379]/prefix        keys live under `prefix/` (default `lease/`);
                                             etcds:// for TLS (with --cacert, and --cert/--key for client auth);
                                             ?sessions=false gives each key an etcd lease of its own (by default
                                             the keys one client holds with one TTL share one)
  nats://host:4222[,host:4222]/bucket        a JetStream KV bucket (default `leases`; nats-server >= 2.11) that
                                             must exist; ?create=true creates a missing one (once, on first
                                             deployment: a bucket made afresh restarts the fence counter);
                                             natss:// for TLS; --token, --user, --nkey or --creds to authenticate
  mongodb://host:27017/db?collection=name    the rest goes to the driver as written, db being the default authSource
                                             (defaults: db `lease`, collection `leases`)
  postgres://user:pw@host:5432/db?table=name other query options (sslmode, …) go to tokio-postgres (default table `leases`,
                                             created when missing); ?statement_cache=true prepares each statement
                                             once per connection (not behind a transaction-mode pooler)
  redis://user:pw@host:6379/db?prefix=p      Redis 7 or later, or Valkey (valkey://); the user, password and database
                                             number (default 0) are the connection's; keys start with `prefix`
                                             (default `lease:`); rediss:// for TLS (--cacert, else the system's roots)
  s3://bucket/prefix?endpoint=URL&region=R   the rest from the AWS environment as object_store reads it
                                             (keys, container and instance credentials, AWS_REGION,
                                             AWS_ENDPOINT, AWS_ALLOW_HTTP, …); http:// endpoints are allowed
  A host without a port is on the backend's usual one (etcd 2379, NATS 4222, MongoDB 27017, PostgreSQL 5432,
  Redis 6379).
  With LEASE_URL set, the URL may be left out: `lease run KEY -- CMD`.";

const EXIT_CODES: &str = "\
Exit codes:
  lease run exits with the command's own status (128+N if a signal N ended it), once the
  processes it left running have exited (--leftovers wait) or been stopped (--leftovers stop), or:
    2    usage error: bad arguments, bad URL, unknown scheme, invalid key or holder
    69   backend error: the backend could not be reached or failed
    75   could not acquire: the key stayed held for the whole --wait, or was held with
         -n/--skip-if-held or --wait 0 (the command was skipped; -E CODE replaces 75)
    76   lost while running: the lease was lost or its write deadline passed; every process
         started under it got SIGTERM, then SIGKILL after --grace
    126  the command could not be executed;  127  the command was not found
  lease elect exits as lease run does, after resigning: 75 if not elected within --wait,
    76 if leadership was lost. With --recampaign, a loss and the command's exit 0 lead to a
    new campaign instead; it ends when the command exits non-zero or after a signal sent to
    `lease` was passed on to it (the command's status), or with 75, 69, 126, 127 as above.
  lease status exits 0 if the key is held, 1 if it is free (as grep; -q prints nothing;
    with --permits N, 0 if the key or any of its N permits is held).
  lease break --if-fence/--if-holder exits 1 when the live grant is not the one named (nothing broken).
  watch, break and leader exit 0 on success (leader --watch also when interrupted).
  status, watch, break and leader exit 2 on usage errors, 69 on backend errors.";

const EXAMPLES: &str = "\
Examples:
  # Cron runs the nightly backup on every machine; one runs it, the others skip
  # (exit 75). Kept at least 10 minutes, so a machine whose clock fires a little
  # later skips too, even after a quick backup:
  lease run etcd://etcd-1:2379,etcd-2:2379/ops backup/nightly --skip-if-held --hold-at-least 10m -- /usr/local/bin/backup.sh

  # Wait up to 10 minutes for the key (as flock -w 600), then run:
  lease run nats://nats:4222/locks deploy/db -w 10m -- ./migrate.sh

  # Reports read side by side (as flock -s); compaction waits for them and
  # shuts new ones out meanwhile (as flock -x); at most 4 encodes at once:
  lease run etcd://etcd-1:2379/ops store/layout --shared -- ./report.sh
  lease run etcd://etcd-1:2379/ops store/layout --exclusive -- ./compact.sh
  lease run etcd://etcd-1:2379/ops gpu/pool --permits 4 -- ./encode.sh

  # Who holds it, and for how long?
  lease status mongodb://mongo:27017/ops?collection=locks backup/nightly --json

  # Follow a key's holders as they change:
  lease watch s3://my-bucket/leases?region=eu-west-1 backup/nightly

  # Clear a lease whose holder is known to be dead (an audit record is kept):
  lease break etcd://etcd-1:2379/ops backup/nightly --reason \"host db-7 was decommissioned\"

  # Leader election: every machine campaigns, the leader runs the scheduler, and
  # when it exits (or the leader dies) the next candidate takes over:
  lease elect etcd://etcd-1:2379/ops scheduler --value \"$(hostname):8080\" --recampaign -- ./scheduler

  # Who leads, and every change of leader, as JSON lines:
  lease leader etcd://etcd-1:2379/ops scheduler --watch --json";

/// A distributed flock: run a command on exactly one machine at a time,
/// with fencing tokens, over etcd, NATS JetStream KV, S3-compatible stores,
/// MongoDB or PostgreSQL; and leader election (`elect`, `leader`) on the
/// same keys.
#[derive(Parser, Debug)]
#[command(name = "lease", version, long_about = None)]
#[command(after_help = format!("{URLS}\n\n{EXIT_CODES}\n\n{EXAMPLES}"))]
struct Cli {
    /// More diagnostics on stderr (-v: info, -vv: debug, -vvv: trace).
    /// Without -v, RUST_LOG filters them (e.g. RUST_LOG=lease_keeper=debug).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,

    /// Time limit for connecting and for each backend request (default
    /// 10s; LEASE_TIMEOUT is read too when LEASE_REQUEST_TIMEOUT is not set).
    #[arg(long, global = true, env = "LEASE_REQUEST_TIMEOUT", allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    request_timeout: Option<Duration>,

    /// Refused: to flock and consul users it means the wait, to earlier
    /// `lease` the request limit; the error names both flags.
    #[arg(long, global = true, hide = true, allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    timeout: Option<Duration>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Wait for the lease, run a command while keeping it, release it when
    /// the command, and every process it started, has exited.
    ///
    /// The command gets LEASE_KEY, LEASE_FENCE and LEASE_HOLDER in its
    /// environment (stamp your writes with LEASE_FENCE). It runs in its own
    /// process group; SIGINT, SIGTERM and SIGHUP sent to `lease` are passed
    /// on to it. If the lease is lost, or no renewal succeeds before the
    /// lease's write deadline (2/3 of the TTL after the last successful
    /// renewal was sent), every process started under the lease gets
    /// SIGTERM, then SIGKILL after --grace, and `lease` exits 76. SIGTERM for a deadline
    /// goes slightly before it (a tenth of the TTL, at most 250 ms), so the
    /// watchdog, which kills at the deadline itself, finds the stop begun.
    ///
    /// The arithmetic: with TTL T, another machine can be granted the key T
    /// after the last renewal was sent. SIGTERM goes at the write deadline
    /// (2/3 T) and SIGKILL at the latest at T less a 10% margin, so the grace
    /// period must fit in T/3 − T/10 = 7/30 T (2.3 s of a 10 s TTL): the
    /// default grace (5 s) is shortened to fit, and a longer --grace is
    /// refused.
    ///
    /// Nothing started under the lease outlives it: `lease` is the child
    /// subreaper of the command, so background jobs and daemons (nohup,
    /// setsid, a double fork) stay in its care, and every one of them is
    /// stopped with the command at a loss. When the command exits and
    /// leaves some running, `lease` says so and, with --leftovers wait
    /// (the default, as flock), keeps the lease until they exit; with
    /// --leftovers stop, sends them SIGTERM, then SIGKILL after --grace.
    /// The lease is released only when they are gone, and `lease` exits
    /// with the command's status.
    ///
    /// A watchdog process guards them while `lease` cannot: if `lease` is
    /// killed (kill -9, the OOM killer), stopped (SIGSTOP, Ctrl-Z) or
    /// starved of CPU, the watchdog kills every process started under the
    /// lease at the write deadline; if `lease` exits without ending them,
    /// they get SIGTERM at once and SIGKILL after the grace period.
    #[command(after_help = format!("{EXIT_CODES}\n\n{EXAMPLES}"))]
    Run(RunArgs),
    /// Take the lease and keep it until interrupted, without a command (as
    /// `etcdctl lock NAME`).
    ///
    /// Prints the fence (or, with --json, the grant) once the lease is held,
    /// then renews it until SIGINT, SIGTERM or SIGHUP, releases it and exits
    /// 0. If the lease is lost, or its write deadline passes without a
    /// successful renewal, it exits 76 at once.
    #[command(after_help = EXIT_CODES)]
    Hold(HoldArgs),
    /// Campaign for leadership of a key, run a command while leader, and
    /// hand over when it exits.
    ///
    /// Candidates wait (up to --wait, default forever) until they lead; the
    /// leader advertises --value (default: the host name), which `lease
    /// leader` prints. The command runs exactly as under `lease run`:
    /// LEASE_KEY, LEASE_FENCE and LEASE_HOLDER in its environment, its own
    /// process group, signals passed on, SIGTERM then SIGKILL after --grace
    /// to everything it started when leadership is lost or its write
    /// deadline passes, the same --leftovers choice for processes it leaves
    /// running, and the same watchdog if `lease` is killed or frozen. When
    /// the command and what it left running have exited, the leader resigns
    /// at once: a waiting candidate takes over without waiting for the TTL.
    ///
    /// Without --recampaign, `lease elect` then exits with the command's
    /// status, or 76 if leadership was lost. With --recampaign it campaigns
    /// again after a loss (the command was stopped) and after the command
    /// exits 0 (it stepped down), and runs the command again each time it is
    /// elected; it ends when the command exits non-zero, when the command
    /// exits after a signal sent to `lease` was passed on to it, when a
    /// campaign's --wait runs out (75), or on an error.
    #[command(after_help = format!("{EXIT_CODES}\n\n{EXAMPLES}"))]
    Elect(elect::ElectArgs),
    /// Show a key's leader (holder, fence, value, or no leader), and with
    /// --watch every change.
    ///
    /// A value that is valid UTF-8 is printed as text (quoted and escaped,
    /// or as a JSON string); any other value as standard base64
    /// (value_encoding "base64" in JSON). With --json, one object per line:
    /// backend, key, leader (true or false), and with a leader holder,
    /// fence, value, value_encoding ("utf8" or "base64") and value_bytes;
    /// with --watch each line also has "at" (RFC 3339, this machine's
    /// clock). --watch reports a resignation or an expiry as no leader.
    #[command(after_help = EXAMPLES)]
    Leader(leader::LeaderArgs),
    /// Show who holds a key: holder, fence, remaining time, payload size.
    ///
    /// A key held shared (by `(shared)`, as `lease run --shared` holds it)
    /// is shown with its shared holders' own registrations and, if one
    /// waits, the exclusive holder's intent; --permits N lists the holders
    /// of N permits on the key.
    ///
    /// Exits 0 if the key is held and 1 if it is free (as grep: 0 found,
    /// 1 not, 2 and up errors), so `if lease status -q URL KEY; then …`
    /// asks whether someone holds it.
    #[command(after_help = EXIT_CODES)]
    Status(StatusArgs),
    /// Print the key's state, then every change (held, taken over, freed),
    /// until interrupted or --for runs out.
    Watch(WatchArgs),
    /// Administrative: end whatever lease is held at the key, now.
    ///
    /// For a holder that is known dead or stuck. The next grant still gets a
    /// higher fence, and an audit record of who, when, why and the previous
    /// holder and fence is written outside the lease key space. A holder that
    /// is merely slow keeps running until its own deadline: only fenced
    /// writes protect the resource from it.
    ///
    /// With --if-fence and/or --if-holder, the key is read first and the
    /// break goes ahead only if the live grant is the one named; otherwise
    /// nothing is broken and `lease` exits 1. That makes a break safe to
    /// retry and to run from a decision taken earlier (a script that saw
    /// fence 7 stuck): it cannot end the next, healthy holder. It does not
    /// close the moment between the read and the break (milliseconds): a
    /// grant that expires and is granted again within it would still be
    /// broken, and `lease` then says so on stderr.
    #[command(after_help = EXIT_CODES)]
    Break(BreakArgs),
    /// Print a shell completion script, generated from this command's
    /// options. Install it with, e.g.,
    /// `lease completions bash > /etc/bash_completion.d/lease`,
    /// `lease completions zsh > "${fpath[1]}/_lease"` or
    /// `lease completions fish > ~/.config/fish/completions/lease.fish`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), or with --dir write it and one page per
    /// subcommand (lease-run.1, lease-hold.1, …) into a directory. Install
    /// them with `lease man --dir /usr/local/share/man/man1`.
    Man {
        /// Write lease.1 and every lease-SUBCOMMAND.1 into this directory
        /// (created if missing) instead of printing lease.1.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

#[derive(Args, Debug)]
pub struct KeyArgs {
    /// Backend URL (etcd://, nats://, mongodb://, postgres://, redis://, s3://; see
    /// `lease --help`).
    /// Leave it out and give only the key when LEASE_URL is set.
    #[arg(value_name = "URL")]
    pub url: String,
    /// Lease key: segments of A-Z a-z 0-9 _ = . - joined by `/`.
    #[arg(value_name = "KEY")]
    pub key: Option<String>,
    #[command(flatten)]
    pub access: access::Access,
}

impl KeyArgs {
    /// The URL and the key, the URL from LEASE_URL when only the key is given.
    pub fn url_and_key(&self) -> Result<(String, String), String> {
        match &self.key {
            Some(key) => Ok((self.url.clone(), key.clone())),
            None => match std::env::var("LEASE_URL") {
                Ok(url) if !url.trim().is_empty() => Ok((url, self.url.clone())),
                _ => Err(format!(
                    "missing the lease key after the URL {:?} (or set LEASE_URL and give only the key)",
                    self.url
                )),
            },
        }
    }
}

/// How to take the lease: shared by `run` and `hold`.
#[derive(Args, Debug)]
pub struct AcquireArgs {
    #[command(flatten)]
    pub target: KeyArgs,
    /// Lease TTL: how long the lease outlives a holder that stops renewing.
    /// A TTL below the backend's minimum (0 included) is raised to it, and
    /// `lease` says so on stderr.
    #[arg(long, env = "LEASE_TTL", allow_negative_numbers = true, value_parser = parse_duration, default_value = "10s", value_name = "DURATION")]
    pub ttl: Duration,
    /// How long to wait for the key while someone else holds it, as flock
    /// -w (0: do not wait). Default: forever, as flock, `etcdctl lock` and
    /// `lease elect`: waiting is what a lock is for, and a bound picked for
    /// one job is wrong for the next. Give one for jobs that must not pile
    /// up, or skip a run while the key is held with -n.
    #[arg(short = 'w', long, env = "LEASE_WAIT", allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    pub wait: Option<Duration>,
    /// Skip the command if the key is held: do not wait, say who holds it
    /// (one line on stderr, none with -q) and exit 75 (-E), as flock -n
    /// does. For cron singletons; pair it with --hold-at-least.
    #[arg(short = 'n', long, visible_alias = "skip-if-held")]
    pub nonblock: bool,
    /// Exit code when the key could not be acquired: held with -n or
    /// --wait 0, or held past --wait (as flock -E; `-E 0` makes a skipped
    /// run count as a success).
    #[arg(short = 'E', long, env = "LEASE_CONFLICT_EXIT_CODE", default_value_t = EXIT_NOT_ACQUIRED, value_name = "CODE")]
    pub conflict_exit_code: u8,
    /// No notes on stderr: who holds the key while `lease` waits for it or
    /// skips, a TTL raised to the backend's minimum. Errors are still
    /// printed.
    #[arg(short, long)]
    pub quiet: bool,
    /// Holder name: the holder id becomes NAME:<8 random characters>, unique
    /// to this run, and each grant (term) adds ~<16 hex digits> of its own,
    /// so no two runs or terms ever share one grant (default:
    /// user@host:pid:random).
    #[arg(long, value_name = "NAME")]
    pub holder: Option<String>,
    /// Payload stored with the lease (shown by `status` as its size).
    #[arg(long)]
    pub payload: Option<String>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub lease: AcquireArgs,
    /// Time between SIGTERM and SIGKILL when the lease is lost (default 5s,
    /// shortened to fit the TTL: at most 7/30 of it).
    #[arg(long, env = "LEASE_GRACE", allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    pub grace: Option<Duration>,
    /// Processes the command leaves running when it exits (background
    /// jobs, daemons): `wait` keeps the lease until they exit (as flock
    /// does), `stop` sends them SIGTERM, then SIGKILL after --grace. The
    /// lease is released only when they are gone.
    #[arg(long, env = "LEASE_LEFTOVERS", value_enum, default_value_t = Leftovers::Wait, value_name = "WHAT")]
    pub leftovers: Leftovers,
    /// Keep the lease at least this long after taking it, even when the
    /// command ends sooner (as ShedLock's lockAtLeastFor): the lease is
    /// renewed until then and released after. A machine whose cron fires a
    /// little later then finds the key held and skips (-n) instead of
    /// running the job again. An interrupt ends the wait early.
    #[arg(long, env = "LEASE_HOLD_AT_LEAST", allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    pub hold_at_least: Option<Duration>,
    /// Take the key shared, as flock -s: any number of shared runs (up to
    /// 32) hold it at once, never with an exclusive one. They share one
    /// fence per shared phase (LEASE_FENCE); LEASE_HOLDER is the run's own.
    /// Waits while an exclusive run holds the key or waits for it.
    #[arg(short = 's', long, conflicts_with_all = ["exclusive", "permits"])]
    pub shared: bool,
    /// Take the key exclusively, as flock -x: first shuts new shared runs
    /// out, then waits for the shared runs already in to end, so a stream of
    /// shared runs cannot starve it. A plain `lease run` excludes shared
    /// runs too, but waits for a moment with none of them, which a stream
    /// of them may never leave.
    #[arg(short = 'x', long, conflicts_with = "permits")]
    pub exclusive: bool,
    /// Take one of N permits on the key (1 to 1024), as `consul lock -n N`:
    /// at most N runs at once. Each permit is its own lease, on the key
    /// KEY/permit-I, with its own fence; LEASE_KEY names it.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=i64::from(lease::MAX_PERMITS)))]
    pub permits: Option<u32>,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        last = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// How the key is taken.
    pub fn mode(&self) -> run::Mode {
        match (self.shared, self.exclusive, self.permits) {
            (true, _, _) => run::Mode::Shared,
            (_, true, _) => run::Mode::Exclusive,
            (_, _, Some(n)) => run::Mode::Permits(n),
            _ => run::Mode::Plain,
        }
    }
}

#[derive(Args, Debug)]
pub struct HoldArgs {
    #[command(flatten)]
    pub lease: AcquireArgs,
    /// Print the grant as one JSON object (key, holder, fence, ttl_ms).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: KeyArgs,
    /// Print one JSON object.
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
    /// Print nothing: the exit code alone answers (0 held, 1 free).
    #[arg(short, long)]
    pub quiet: bool,
    /// Also list the holders of N permits on the key (as `lease run
    /// --permits N` takes them: KEY/permit-0 … KEY/permit-<N-1>), and how
    /// many are held and free. The exit code is then 0 when the key or any
    /// permit is held.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=i64::from(lease::MAX_PERMITS)))]
    pub permits: Option<u32>,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    pub target: KeyArgs,
    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Stop after this long (default: until interrupted).
    #[arg(long = "for", allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    pub for_: Option<Duration>,
    /// Poll interval for backends that cannot watch (MongoDB, S3).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_duration, default_value = "1s", value_name = "DURATION")]
    pub interval: Duration,
}

#[derive(Args, Debug)]
pub struct BreakArgs {
    #[command(flatten)]
    pub target: KeyArgs,
    /// Why (kept in the audit record).
    #[arg(long, required = true)]
    pub reason: String,
    /// Who (default: user@host).
    #[arg(long)]
    pub by: Option<String>,
    /// Break only if the live grant has this fence (as `lease status`
    /// shows it); otherwise break nothing and exit 1.
    #[arg(long, value_name = "FENCE")]
    pub if_fence: Option<u64>,
    /// Break only if the live grant's holder id is exactly this (as `lease
    /// status` shows it); otherwise break nothing and exit 1.
    #[arg(long, value_name = "HOLDER")]
    pub if_holder: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// How a command failed: the exit code and one line for stderr.
#[derive(Debug)]
pub struct Fail {
    pub code: u8,
    pub message: String,
}

impl Fail {
    pub fn usage(message: impl Into<String>) -> Fail {
        Fail {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }

    /// A backend error; bad input the backend refused counts as usage.
    pub fn backend(e: &lease::Error) -> Fail {
        use lease::Error as E;
        let code = match e {
            E::InvalidKey { .. }
            | E::InvalidHolder { .. }
            | E::InvalidTtl { .. }
            | E::InvalidTiming { .. }
            | E::PayloadTooLarge { .. } => EXIT_USAGE,
            _ => EXIT_BACKEND,
        };
        Fail {
            code,
            message: util::one_line(e),
        }
    }
}

fn main() -> ExitCode {
    watchdog::keep_own_image();
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(std::ffi::OsStr::new(watchdog::SUBCOMMAND)) {
        let rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
        return watchdog::main(&rest);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's message in one line: everything before the usage block.
            let rendered = e.render().to_string();
            let line: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            eprintln!(
                "lease: {} (see `lease --help`)",
                line.join(" ").trim_start_matches("error: ")
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let timeout = match request_timeout(&cli) {
        Ok(t) => t,
        Err(message) => {
            eprintln!("lease: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if cli.verbose > 0 {
        let level = match cli.verbose {
            1 => tracing::Level::INFO,
            2 => tracing::Level::DEBUG,
            _ => tracing::Level::TRACE,
        };
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(level)
            .with_target(cli.verbose > 2)
            .init();
    } else if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lease: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_BACKEND);
        }
    };
    let clients = clients::Clients::default();
    let result = rt.block_on(async {
        let result = match cli.command {
            Command::Run(a) => run::run(a, timeout, &clients).await,
            Command::Hold(a) => run::hold(a, timeout, &clients).await,
            Command::Elect(a) => elect::elect(a, timeout, &clients).await,
            Command::Leader(a) => leader::leader(a, timeout, &clients).await,
            Command::Status(a) => commands::status(a, timeout, &clients).await,
            Command::Watch(a) => commands::watch(a, timeout, &clients).await,
            Command::Break(a) => commands::break_lease(a, timeout, &clients).await,
            Command::Completions { shell } => {
                // Generated whole first: clap_complete panics on a failed write.
                let mut cmd = <Cli as clap::CommandFactory>::command();
                let mut script = Vec::new();
                clap_complete::generate(shell, &mut cmd, "lease", &mut script);
                util::print_all(&script);
                Ok(0)
            }
            Command::Man { dir: Some(dir) } => man_pages(&dir),
            Command::Man { dir: None } => {
                let cmd = <Cli as clap::CommandFactory>::command();
                let mut page = Vec::new();
                match clap_mangen::Man::new(cmd).render(&mut page) {
                    Ok(()) => {
                        util::print_all(&page);
                        Ok(0)
                    }
                    Err(e) => Err(Fail {
                        code: EXIT_BACKEND,
                        message: format!("cannot render the man page: {e}"),
                    }),
                }
            }
        };
        clients.shutdown(CLIENT_SHUTDOWN.min(timeout)).await;
        result
    });
    // Background tasks (renewals, connections) end with the runtime.
    rt.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            // An empty message: a note --quiet asked to keep off stderr.
            if !f.message.is_empty() {
                eprintln!("lease: {}", f.message);
            }
            ExitCode::from(f.code)
        }
    }
}

/// `lease man --dir DIR`: lease.1 and a page per subcommand, named as the
/// SEE ALSO section of lease.1 names them.
fn man_pages(dir: &std::path::Path) -> Result<u8, Fail> {
    let failed = |e: std::io::Error| Fail {
        code: EXIT_BACKEND,
        message: format!("cannot write the man pages into {}: {e}", dir.display()),
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), dir).map_err(failed)?;
    Ok(0)
}

/// The default time limit for connecting and for each backend request.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The per-request time limit: --request-timeout or LEASE_REQUEST_TIMEOUT,
/// else LEASE_TIMEOUT (its earlier name), else the default. `--timeout` is
/// refused with a message naming both meanings it could have: a flock or
/// consul user means the wait by it, an earlier `lease` the request limit,
/// and guessing either would change what a script does without a word.
fn request_timeout(cli: &Cli) -> Result<Duration, String> {
    if cli.timeout.is_some() {
        return Err(
            "--timeout is ambiguous: use --wait DURATION (-w, as flock -w) for how long to \
                    wait for the key, or --request-timeout DURATION for the limit on connecting \
                    and on each backend request"
                .into(),
        );
    }
    if let Some(t) = cli.request_timeout {
        return Ok(t);
    }
    match std::env::var("LEASE_TIMEOUT") {
        Ok(v) if !v.trim().is_empty() => {
            parse_duration(&v).map_err(|e| format!("invalid value for LEASE_TIMEOUT: {e}"))
        }
        _ => Ok(DEFAULT_REQUEST_TIMEOUT),
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args, Command, CommandFactory, Parser};

    /// `lease run` waits for ever unless told (as flock), and -w bounds it.
    #[test]
    fn run_waits_for_ever_by_default() {
        let wait = |extra: &[&str]| {
            let mut args = vec!["lease", "run", "etcd://h/p", "k"];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--", "true"]);
            match crate::Cli::try_parse_from(args).map(|c| c.command) {
                Ok(crate::Command::Run(a)) => a.lease.wait,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(wait(&[]), None);
        assert_eq!(wait(&["-w", "5s"]), Some(std::time::Duration::from_secs(5)));
    }

    /// Every option is listed under the heading of its group: the TLS and
    /// credential options under theirs, every other under the default, in
    /// every subcommand's help.
    #[test]
    fn every_option_sits_under_its_own_heading() {
        let access: Vec<String> = crate::access::Access::augment_args(Command::new("access"))
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect();
        fn walk(cmd: &Command, access: &[String], wrong: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().to_string();
                let expected = access.contains(&id).then_some(crate::access::HEADING);
                if arg.get_help_heading() != expected {
                    wrong.push(format!(
                        "{} {id}: {:?}",
                        cmd.get_name(),
                        arg.get_help_heading()
                    ));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, access, wrong);
            }
        }
        let mut wrong = Vec::new();
        walk(&crate::Cli::command(), &access, &mut wrong);
        assert!(wrong.is_empty(), "under the wrong heading: {wrong:#?}");
    }
}
