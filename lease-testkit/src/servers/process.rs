//! Process plumbing shared by the launchers: temporary directories, free
//! ports, a spawner thread that never exits (so `PR_SET_PDEATHSIG` only
//! fires when the test process dies), managed children with readiness
//! checks, and a tiny HTTP/1.1 client over `TcpStream`.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use super::Unavailable;

/// How long a server may take to answer after it was started.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

const TEMP_PREFIX: &str = "lease-test-";
const FAILED_MARKER: &str = "FAILED";
/// Directories of failed starts are kept this long for diagnosis.
const KEEP_FAILED: Duration = Duration::from_secs(24 * 3600);

// ------------------------------------------------------------- temp dirs

/// A directory under `std::env::temp_dir()` named
/// `lease-test-<pid>-<n>-<label>`, removed on drop unless marked failed.
/// Directories left by dead processes are swept when the first one of a
/// process is created.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    /// A fresh directory labelled `label`.
    pub fn new(label: &str) -> io::Result<TempDir> {
        static SWEPT: OnceLock<()> = OnceLock::new();
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        SWEPT.get_or_init(sweep_stale_temp_dirs);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("{TEMP_PREFIX}{}-{n}-{label}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path)?;
        Ok(TempDir { path, keep: false })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the directory (logs of a failed start) and marks it so that
    /// the sweep leaves it alone for a day.
    pub(crate) fn keep_failed(&mut self) {
        self.keep = true;
        let _ = fs::write(self.path.join(FAILED_MARKER), b"");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes `lease-test-<pid>-…` directories whose process is gone.
fn sweep_stale_temp_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TEMP_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        if let Ok(meta) = fs::metadata(path.join(FAILED_MARKER)) {
            let age = meta
                .modified()
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .unwrap_or_default();
            if age < KEEP_FAILED {
                continue;
            }
        }
        let _ = fs::remove_dir_all(path);
    }
}

// ----------------------------------------------------------------- ports

/// `n` distinct free loopback ports (bound together, then released), for
/// servers that are told their port before they bind it.
///
/// They come from below the kernel's ephemeral range: a port in that range,
/// released here, can be taken as the local port of any outgoing
/// connection on the machine (the tests make thousands) before the server
/// binds it, and the server then fails with "address already in use".
/// Below the range only another listener can take it; the ports are
/// picked at random and never handed out twice by one process, so two test
/// processes rarely pick the same one, and a launcher that retries its
/// start recovers when they do.
pub(crate) fn free_ports(n: usize) -> io::Result<Vec<u16>> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let (lo, hi) = listening_range();
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = seed();
    let mut listeners = Vec::with_capacity(n);
    let span = u64::from(hi - lo);
    for _ in 0..(64 * n.max(1)) {
        if listeners.len() == n {
            break;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let port = lo + u16::try_from(rng % span).unwrap_or(0);
        if given.contains(&port) {
            continue;
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            given.push(port);
            listeners.push(l);
        }
    }
    // A machine with no room below its ephemeral range: the kernel's pick.
    while listeners.len() < n {
        listeners.push(TcpListener::bind(("127.0.0.1", 0))?);
    }
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// Ports to listen on: from 10000 up to the start of the kernel's
/// ephemeral range (32768 when it cannot be read).
fn listening_range() -> (u16, u16) {
    const LOW: u16 = 10_000;
    let ephemeral_start = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_start > LOW + 1_000 {
        (LOW, ephemeral_start)
    } else {
        (1_024, ephemeral_start.max(2_048))
    }
}

/// A per-process random seed for the port picks (never zero).
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(d) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish() | 1
}

// --------------------------------------------------------------- spawner

type Job = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from a dedicated thread that lives as long as the process,
/// with the child in its own process group and `PR_SET_PDEATHSIG(SIGKILL)`
/// (which fires when the *spawning thread* exits: test threads exit after
/// each test, this one never does).
pub(crate) fn spawn(mut cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Result<mpsc::Sender<Job>, String>> = OnceLock::new();
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe system calls (prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent died before prctl took effect: do not outlive it.
            if libc::getppid() != parent {
                return Err(io::Error::other("test process exited during spawn"));
            }
            Ok(())
        });
    }
    cmd.process_group(0);
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("lease-server-spawner".into())
            .spawn(move || {
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static, so recv never fails; never
                // exit anyway: children die with this thread.
                loop {
                    std::thread::park();
                }
            })
            .map(|_| tx)
            .map_err(|e| format!("cannot start the spawner thread: {e}"))
    });
    let sender = sender.as_ref().map_err(|e| io::Error::other(e.clone()))?;
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread did not answer"))?
}

// ------------------------------------------------------ at-exit cleanup

/// Children (process group id) and directories of the per-process shared
/// servers: statics are never dropped, so these are killed and removed
/// when the process exits normally (PDEATHSIG covers the other exits).
static AT_EXIT: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

pub(crate) fn cleanup_at_exit(pid: u32, dir: PathBuf) {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        // SAFETY: registering a plain extern "C" function with no captures.
        unsafe {
            libc::atexit(run_at_exit);
        }
    });
    if let Ok(mut list) = AT_EXIT.lock() {
        list.push((pid, dir));
    }
}

extern "C" fn run_at_exit() {
    let Ok(list) = AT_EXIT.try_lock() else {
        return;
    };
    for (pid, dir) in list.iter() {
        // SAFETY: plain system calls on a process group / child we started.
        unsafe {
            libc::kill(-(*pid as libc::pid_t), libc::SIGKILL);
            libc::waitpid(*pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
        let _ = fs::remove_dir_all(dir);
    }
}

// ------------------------------------------------------ managed process

/// What to run: kept so that a killed server can be restarted identically.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) envs: Vec<(OsString, OsString)>,
}

impl Spec {
    pub(crate) fn new(program: impl Into<PathBuf>) -> Spec {
        Spec {
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
        }
    }

    pub(crate) fn arg(mut self, a: impl Into<OsString>) -> Spec {
        self.args.push(a.into());
        self
    }

    pub(crate) fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Spec {
        self.envs.push((k.into(), v.into()));
        self
    }
}

type ReadyCheck = Box<dyn Fn() -> bool + Send + Sync>;

/// A server process we started: killed (whole process group) on drop.
pub(crate) struct Managed {
    backend: &'static str,
    spec: Spec,
    child: Option<Child>,
    ready: ReadyCheck,
    log: PathBuf,
    // Declared last: dropped after the child is killed.
    dir: TempDir,
}

impl std::fmt::Debug for Managed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed")
            .field("backend", &self.backend)
            .field("program", &self.spec.program)
            .field("pid", &self.pid())
            .field("log", &self.log)
            .finish()
    }
}

impl Managed {
    /// Starts `spec` with stdout and stderr going to `<dir>/server.log` and
    /// waits until `ready` answers true. On failure the directory is kept
    /// and the reason names the log and quotes its last lines.
    pub(crate) fn start(
        backend: &'static str,
        spec: Spec,
        dir: TempDir,
        ready: ReadyCheck,
    ) -> Result<Managed, Unavailable> {
        let log = dir.path().join("server.log");
        let mut m = Managed {
            backend,
            spec,
            child: None,
            ready,
            log,
            dir,
        };
        m.launch()?;
        Ok(m)
    }

    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Registers the child and the directory for killing/removal at exit.
    pub(crate) fn cleanup_at_exit(&self) {
        if let Some(pid) = self.pid() {
            cleanup_at_exit(pid, self.dir.path().to_path_buf());
        }
    }

    fn launch(&mut self) -> Result<(), Unavailable> {
        let program = self.spec.program.display().to_string();
        let fail = |m: &mut Managed, what: String| {
            m.dir.keep_failed();
            Unavailable::new(
                m.backend,
                format!(
                    "{what} (log: {}){}",
                    m.log.display(),
                    log_tail(&m.log, 6)
                        .map(|t| format!("; last lines: {t}"))
                        .unwrap_or_default()
                ),
            )
        };
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log);
        let (out, err) = match log.and_then(|f| Ok((f.try_clone()?, f))) {
            Ok(pair) => pair,
            Err(e) => {
                let what = format!("cannot open log {}: {e}", self.log.display());
                return Err(fail(self, what));
            }
        };
        let mut cmd = Command::new(&self.spec.program);
        cmd.args(&self.spec.args)
            .envs(self.spec.envs.iter().map(|(k, v)| (k, v)))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = match spawn(cmd) {
            Ok(c) => c,
            Err(e) => return Err(fail(self, format!("cannot start {program}: {e}"))),
        };
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        self.child = None;
                        let what = format!("{program} exited ({status}) before it answered");
                        return Err(fail(self, what));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.kill();
                        return Err(fail(self, format!("cannot watch {program}: {e}")));
                    }
                }
            }
            if (self.ready)() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                let what = format!(
                    "{program} did not answer within {}s",
                    READY_TIMEOUT.as_secs()
                );
                return Err(fail(self, what));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL to the whole process group, then reap.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling the process group of a child we started.
            unsafe {
                libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs and starts it again with the same
    /// arguments (same ports, same data directory).
    pub(crate) fn restart(&mut self) -> Result<(), Unavailable> {
        self.kill();
        self.launch()
    }

    /// Starts the server again with the same arguments, unless it runs.
    pub(crate) fn start_again(&mut self) -> Result<(), Unavailable> {
        if self.running() {
            return Ok(());
        }
        self.launch()
    }

    /// Whether the server process is still running (not exited, not
    /// killed).
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Stops the server cleanly: SIGTERM to its process group, then waits
    /// for it to exit (SIGKILL after `grace`).
    pub(crate) fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: signalling the process group of a child we started.
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
        self.kill();
    }

    /// Sends `sig` to the server's process group.
    pub(crate) fn signal(&self, sig: libc::c_int) -> Result<(), Unavailable> {
        let pid = self
            .pid()
            .ok_or_else(|| Unavailable::new(self.backend, "the server is not running"))?;
        // SAFETY: signalling the process group of a child we started.
        let rc = unsafe { libc::kill(-(pid as libc::pid_t), sig) };
        if rc == 0 {
            if sig == libc::SIGSTOP {
                lease_conformance::faults::wait_stopped(pid);
            }
            Ok(())
        } else {
            Err(Unavailable::new(
                self.backend,
                format!("kill({pid}, {sig}): {}", io::Error::last_os_error()),
            ))
        }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `n` non-empty lines of a log, joined with " | ", at most
/// 1500 characters.
pub(crate) fn log_tail(path: &Path, n: usize) -> Option<String> {
    let text = fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text);
    let mut lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .rev()
        .take(n)
        .collect();
    if lines.is_empty() {
        return None;
    }
    lines.reverse();
    let mut joined = lines.join(" | ");
    if joined.len() > 1500 {
        let mut cut = joined.len() - 1500;
        while !joined.is_char_boundary(cut) {
            cut += 1;
        }
        joined = format!("…{}", &joined[cut..]);
    }
    Some(joined)
}

// ------------------------------------------------------------ net helpers

/// True when something accepts TCP connections on `addr`.
pub(crate) fn tcp_open(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}

/// One HTTP/1.1 request with `Connection: close`; returns the status code
/// and the body (chunked bodies are returned raw).
pub(crate) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> io::Result<(u16, String)> {
    http_with(addr, method, path, &[], body)
}

/// [`http`] with extra request headers (`Host` is always `addr`).
pub(crate) fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> io::Result<(u16, String)> {
    let timeout = Duration::from_secs(3);
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP response from {addr}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Output of `program args…` (stdout and stderr), when it exits 0.
pub(crate) fn output_of(program: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    Some(s)
}
