//! PostgreSQL: `LEASE_TEST_POSTGRES_URL`, else a native PostgreSQL 15
//! (`<servers>/postgres/usr/lib/postgresql/15/bin/postgres` from
//! `cargo xtask provision`, else Debian's `/usr/lib/postgresql/15/bin`,
//! else `postgres` on `PATH`), else (feature `containers`) the
//! `postgres` alpine image.
//!
//! The native server runs `initdb` once per data directory and then
//! `postgres` on a private loopback port, socket directory and data
//! directory, with `fsync=off`: a killed server keeps what it
//! acknowledged (the operating system still holds it), a crashed machine
//! may not, which is fine for tests. `synchronous_commit` stays on: with it
//! off, a commit is acknowledged before its WAL leaves the server's own
//! buffers, and the server-restart fault (SIGKILL) would lose granted
//! fences. PostgreSQL refuses to run as root; when the tests do (CI), both
//! run as `nobody` (uid and gid 65534) through `setpriv`, with the data
//! directory owned by that user.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::clock::ServerClock;
use super::container::{self, Request, Started};
use super::process::{self, Managed, Spec, TempDir};
use super::{
    announce, from_container, not_found, process_env, EnvLookup, Source, Unavailable, NATIVE_ONLY,
};

const BACKEND: &str = "postgres";
const ENV: &str = "LEASE_TEST_POSTGRES_URL";
const WHAT: &str = "PostgreSQL 15 server (postgres, initdb)";
const IMAGE: &str = "postgres";
const TAG: &str = "15.10-alpine";
/// Where `cargo xtask provision` unpacks Debian's `postgresql-15`, and where
/// that package puts its binaries on a Debian system.
pub(crate) const PROVISIONED_BIN: &str = "postgres/usr/lib/postgresql/15/bin";
const SYSTEM_BIN: &str = "/usr/lib/postgresql/15/bin";
/// The unprivileged user the server runs as when the tests run as root.
const NOBODY: u32 = 65534;

/// A PostgreSQL server for tests.
#[derive(Debug)]
pub struct Postgres {
    /// Connection URL, e.g. `postgres://postgres@127.0.0.1:5432/postgres`
    /// (user `postgres`, trust authentication).
    pub url: String,
    /// Where the server came from.
    pub source: Source,
    data_dir: Option<PathBuf>,
    managed: Option<Managed>,
}

// Not `impl_control!`: PostgreSQL puts every child process (each
// session's backend, the checkpointer, …) in a session of its own
// (`setsid` in `InitPostmasterChild`), so a signal to the postmaster's
// process group reaches none of them, and a "paused" server would go on
// answering on the connections it has. Pausing stops the children too.
impl Postgres {
    fn managed_mut(&mut self) -> Result<&mut Managed, Unavailable> {
        let source = &self.source;
        self.managed.as_mut().ok_or_else(|| {
            Unavailable::new(
                BACKEND,
                format!("the server from {source} is not managed by the harness"),
            )
        })
    }

    fn managed_ref(&self) -> Result<&Managed, Unavailable> {
        self.managed.as_ref().ok_or_else(|| {
            Unavailable::new(
                BACKEND,
                format!(
                    "the server from {} is not managed by the harness",
                    self.source
                ),
            )
        })
    }

    /// The server's process id (None when not running or not ours).
    pub fn pid(&self) -> Option<u32> {
        self.managed.as_ref().and_then(|m| m.pid())
    }

    /// Kills the server (SIGKILL to its process group; its children exit
    /// when they see the postmaster gone) and reaps it.
    pub fn kill(&mut self) -> Result<(), Unavailable> {
        let children = self.pid().map(children_of).unwrap_or_default();
        self.managed_mut()?.kill();
        for child in children {
            signal_pid(child, libc::SIGKILL);
        }
        Ok(())
    }

    /// Starts the server again (killing it first if it runs) with the same
    /// port and the same data directory; waits until it answers.
    pub fn restart(&mut self) -> Result<(), Unavailable> {
        self.kill()?;
        // The old children must be gone before a new postmaster takes the
        // data directory.
        std::thread::sleep(Duration::from_millis(50));
        self.managed_mut()?.restart()
    }

    /// Freezes the server: the postmaster (SIGSTOP to its process group),
    /// then every child process it has, each waited for until stopped.
    pub fn pause(&self) -> Result<(), Unavailable> {
        let managed = self.managed_ref()?;
        managed.signal(libc::SIGSTOP)?;
        if let Some(pid) = managed.pid() {
            for child in children_of(pid) {
                signal_pid(child, libc::SIGSTOP);
                lease_conformance::faults::wait_stopped(child);
            }
        }
        Ok(())
    }

    /// Thaws a paused server (SIGCONT to its children and its postmaster).
    pub fn resume(&self) -> Result<(), Unavailable> {
        let managed = self.managed_ref()?;
        if let Some(pid) = managed.pid() {
            for child in children_of(pid) {
                signal_pid(child, libc::SIGCONT);
            }
        }
        managed.signal(libc::SIGCONT)
    }

    /// The server's log file (stdout and stderr), when ours.
    pub fn log_path(&self) -> Option<&Path> {
        self.managed.as_ref().map(|m| m.log())
    }
}

/// What the suite's `Launched` drives in a fault run.
impl lease_conformance::faults::ServerProcess for Postgres {
    fn pause(&self) -> Result<(), String> {
        Postgres::pause(self).map_err(|e| e.to_string())
    }
    fn resume(&self) -> Result<(), String> {
        Postgres::resume(self).map_err(|e| e.to_string())
    }
    fn kill(&mut self) -> Result<(), String> {
        Postgres::kill(self).map_err(|e| e.to_string())
    }
    fn restart(&mut self) -> Result<(), String> {
        Postgres::restart(self).map_err(|e| e.to_string())
    }
}

/// The direct children of `pid` (from `/proc/*/stat`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|stat| {
                    // After the parenthesised name: state, then the parent.
                    let after = stat.rsplit_once(')')?.1.to_owned();
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

fn signal_pid(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: signalling a child of a server we started.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

impl Postgres {
    /// The data directory of a server the harness started.
    pub fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_deref()
    }
}

/// The shared PostgreSQL server of this test process, started on first use.
pub fn postgres() -> Result<&'static Postgres, Unavailable> {
    static SHARED: OnceLock<Result<Postgres, Unavailable>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let pg = resolve(&process_env)?;
            if let Some(m) = &pg.managed {
                m.cleanup_at_exit();
            }
            announce(BACKEND, &pg.source, &pg.url);
            Ok(pg)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A private native PostgreSQL, killed on drop; its data survives
/// `restart()`. With `data_dir` the cluster lives there (created by
/// `initdb` when the directory holds none yet, and kept).
pub fn spawn_postgres(data_dir: Option<&Path>) -> Result<Postgres, Unavailable> {
    let bin = bin_dir().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "postgres", NATIVE_ONLY))?;
    start_native(&bin, data_dir)
}

/// A private native PostgreSQL whose wall clock the test steps (see
/// [`ServerClock`]: libfaketime, preloaded into the server, which reads its
/// clock through the C library), killed on drop; its data survives
/// `restart()`.
pub fn spawn_postgres_with_clock() -> Result<(Postgres, ServerClock), Unavailable> {
    let bin = bin_dir().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "postgres", NATIVE_ONLY))?;
    let io = |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot fake the clock: {e}"));
    let dir = TempDir::new("postgres-clock").map_err(io)?;
    let (clock, env) = ServerClock::new(dir.path()).map_err(io)?;
    let pg = start_native_with(&bin, None, &env)?;
    Ok((pg, clock.keeping(dir)))
}

/// A private native PostgreSQL that also accepts TLS (`ssl=on`) with the
/// certificate `cert_pem` and its key `key_pem` (say, a
/// [`Pki`](super::pki::Pki) leaf), killed on drop.
pub fn spawn_postgres_tls(cert_pem: &str, key_pem: &str) -> Result<Postgres, Unavailable> {
    let bin = bin_dir().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "postgres", NATIVE_ONLY))?;
    start_once(&bin, None, &[], Some((cert_pem, key_pem)))
}

pub(crate) fn resolve(env: EnvLookup<'_>) -> Result<Postgres, Unavailable> {
    if let Some(pg) = from_env(env) {
        return Ok(pg);
    }
    match bin_dir() {
        Some(bin) => start_native(&bin, None),
        None => start_container(),
    }
}

pub(crate) fn from_env(env: EnvLookup<'_>) -> Option<Postgres> {
    Some(Postgres {
        url: env(ENV)?.trim().to_string(),
        source: Source::Env(ENV),
        data_dir: None,
        managed: None,
    })
}

/// The directory holding `postgres` and `initdb`.
fn bin_dir() -> Option<PathBuf> {
    let has_both = |d: &Path| {
        crate::is_executable(&d.join("postgres")) && crate::is_executable(&d.join("initdb"))
    };
    let provisioned = crate::servers_dir().join(PROVISIONED_BIN);
    if has_both(&provisioned) {
        return Some(provisioned);
    }
    let system = PathBuf::from(SYSTEM_BIN);
    if has_both(&system) {
        return Some(system);
    }
    crate::which("postgres")
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .filter(|d| has_both(d))
}

/// Extra library directories of a provisioned (unpacked) server, for
/// `LD_LIBRARY_PATH`: the libraries a minimal system lacks are unpacked
/// beside it.
fn library_path(bin: &Path) -> Option<String> {
    super::unpacked_library_path("postgres", bin)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `program`, run as `nobody` through `setpriv` when we are root (the
/// parent-death signal is set again after the uid change, which clears it).
/// `env` is set for `program` alone: through `env(1)` after the uid change
/// when we are root, so that a preloaded library (libfaketime) is not
/// loaded into `setpriv` while it is still root (its shared semaphore would
/// then be out of the server's reach).
fn as_server_user(program: &Path, env: &[(String, String)]) -> Spec {
    if is_root() {
        let setpriv = crate::which("setpriv").unwrap_or_else(|| PathBuf::from("setpriv"));
        let mut spec = Spec::new(setpriv)
            .arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .arg("--clear-groups")
            .arg("--pdeathsig")
            .arg("SIGKILL")
            .arg("--");
        if !env.is_empty() {
            spec = spec.arg(crate::which("env").unwrap_or_else(|| PathBuf::from("/usr/bin/env")));
            for (k, v) in env {
                spec = spec.arg(format!("{k}={v}"));
            }
        }
        spec.arg(program)
    } else {
        env.iter()
            .fold(Spec::new(program), |spec, (k, v)| spec.env(k, v))
    }
}

fn chown_to_server_user(path: &Path) -> std::io::Result<()> {
    if is_root() {
        std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY))?;
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Runs `initdb` into `data` unless it already holds a cluster.
fn init_cluster(bin: &Path, data: &Path, log: &Path) -> Result<(), Unavailable> {
    if data.join("PG_VERSION").is_file() {
        return Ok(());
    }
    let io = |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot prepare initdb: {e}"));
    std::fs::create_dir_all(data).map_err(io)?;
    chown_to_server_user(data).map_err(io)?;
    set_mode(data, 0o700).map_err(io)?;
    let spec = as_server_user(&bin.join("initdb"), &[])
        .arg("-D")
        .arg(data)
        .arg("-U")
        .arg("postgres")
        .arg("-A")
        .arg("trust")
        .arg("-E")
        .arg("UTF8")
        .arg("--locale=C")
        .arg("--no-sync")
        .arg("--no-instructions");
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .stdin(Stdio::null())
        .current_dir(data.parent().unwrap_or(data));
    if let Some(lib) = library_path(bin) {
        cmd.env("LD_LIBRARY_PATH", lib);
    }
    let out = cmd
        .output()
        .map_err(|e| Unavailable::new(BACKEND, format!("cannot run initdb: {e}")))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::write(log, &text);
    if !out.status.success() {
        return Err(Unavailable::new(
            BACKEND,
            format!(
                "initdb failed ({}) (log: {}){}",
                out.status,
                log.display(),
                process::log_tail(log, 6)
                    .map(|t| format!("; last lines: {t}"))
                    .unwrap_or_default()
            ),
        ));
    }
    Ok(())
}

fn start_native(bin: &Path, data_dir: Option<&Path>) -> Result<Postgres, Unavailable> {
    start_native_with(bin, data_dir, &[])
}

fn start_native_with(
    bin: &Path,
    data_dir: Option<&Path>,
    env: &[(String, String)],
) -> Result<Postgres, Unavailable> {
    let mut last = None;
    // A port picked free can be taken before postgres binds it: retry then.
    for _ in 0..3 {
        match start_once(bin, data_dir, env, None) {
            Ok(pg) => return Ok(pg),
            Err(e) if e.reason.contains("already in use") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Unavailable::new(BACKEND, "could not start")))
}

fn start_once(
    bin: &Path,
    data_dir: Option<&Path>,
    env: &[(String, String)],
    tls: Option<(&str, &str)>,
) -> Result<Postgres, Unavailable> {
    let io = |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot prepare postgres: {e}"));
    let dir = TempDir::new("postgres").map_err(io)?;
    let data = match data_dir {
        Some(d) => d.to_path_buf(),
        None => dir.path().join("data"),
    };
    init_cluster(bin, &data, &dir.path().join("initdb.log"))?;
    let socket = dir.path().join("socket");
    std::fs::create_dir_all(&socket).map_err(io)?;
    chown_to_server_user(&socket).map_err(io)?;
    let port = process::free_ports(1).map_err(io)?[0];
    let mut spec = as_server_user(&bin.join("postgres"), env)
        .arg("-D")
        .arg(&data)
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(&socket);
    for setting in [
        "listen_addresses=127.0.0.1",
        "fsync=off",
        "full_page_writes=off",
        "max_connections=200",
        "shared_buffers=32MB",
        "jit=off",
        "log_min_messages=warning",
        "logging_collector=off",
    ] {
        spec = spec.arg("-c").arg(setting);
    }
    if let Some((cert, key)) = tls {
        let tls_dir = dir.path().join("tls");
        std::fs::create_dir_all(&tls_dir).map_err(io)?;
        let (cert_path, key_path) = (tls_dir.join("server.crt"), tls_dir.join("server.key"));
        std::fs::write(&cert_path, cert).map_err(io)?;
        std::fs::write(&key_path, key).map_err(io)?;
        // The server refuses a key others can read.
        set_mode(&key_path, 0o600).map_err(io)?;
        for path in [&tls_dir, &cert_path, &key_path] {
            chown_to_server_user(path).map_err(io)?;
        }
        spec = spec
            .arg("-c")
            .arg("ssl=on")
            .arg("-c")
            .arg(format!("ssl_cert_file={}", cert_path.display()))
            .arg("-c")
            .arg(format!("ssl_key_file={}", key_path.display()));
    }
    if let Some(lib) = library_path(bin) {
        spec = spec.env("LD_LIBRARY_PATH", lib);
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let ready = Box::new(move || accepts_sessions(addr));
    let managed = Managed::start(BACKEND, spec, dir, ready)?;
    Ok(Postgres {
        url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        source: Source::Native(bin.join("postgres")),
        data_dir: Some(data),
        managed: Some(managed),
    })
}

/// Step 3: the upstream image with the native server's settings.
fn start_container() -> Result<Postgres, Unavailable> {
    let mut cmd = vec!["postgres".to_string()];
    for setting in ["fsync=off", "max_connections=200"] {
        cmd.push("-c".into());
        cmd.push(setting.into());
    }
    let req = Request {
        backend: BACKEND,
        image: IMAGE,
        tag: TAG,
        ports: &[5432],
        cmd,
        env: vec![("POSTGRES_HOST_AUTH_METHOD", "trust".to_string())],
    };
    let image = req.reference();
    let ready = |s: &Started| container::addr(&s.host, s.ports[0]).is_some_and(accepts_sessions);
    let started = from_container(req, &ready, ENV, WHAT, "postgres")?;
    Ok(Postgres {
        url: format!(
            "postgres://postgres@{}:{}/postgres",
            started.host, started.ports[0]
        ),
        source: Source::Container(image),
        data_dir: None,
        managed: None,
    })
}

/// Ready: a startup message as user `postgres` is answered with
/// authentication (`R`), not with an error such as "the database system is
/// starting up" (`E`).
fn accepts_sessions(addr: SocketAddr) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let timeout = Duration::from_millis(500);
        let mut s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        let mut body = Vec::new();
        body.extend_from_slice(&196_608u32.to_be_bytes()); // protocol 3.0
        for part in ["user", "postgres", "database", "postgres"] {
            body.extend_from_slice(part.as_bytes());
            body.push(0);
        }
        body.push(0);
        let len = u32::try_from(body.len() + 4).unwrap_or(u32::MAX);
        s.write_all(&len.to_be_bytes())?;
        s.write_all(&body)?;
        let mut tag = [0u8; 1];
        s.read_exact(&mut tag)?;
        // Terminate, politely.
        let _ = s.write_all(&[b'X', 0, 0, 0, 4]);
        Ok(tag[0] == b'R')
    };
    attempt().unwrap_or(false)
}
