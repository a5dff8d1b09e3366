//! Redis: `LEASE_TEST_REDIS_URL`, else a native `redis-server`
//! (`<servers>/redis/usr/bin/redis-server` from `cargo xtask provision`,
//! Debian 12's `redis-server` unpacked with its libraries beside it, else
//! the system's `/usr/bin/redis-server`, else `redis-server` on `PATH`),
//! else (feature `containers`) the `redis` image.
//!
//! The native server runs on a private loopback port and data directory
//! with `appendonly yes` and `appendfsync always` (and no RDB snapshots):
//! every write it acknowledged is on disk before the answer, so a killed
//! and restarted server has every grant and fence it handed out, as the
//! server-restart fault runs require. [`RedisOptions`] starts variants:
//! without persistence, with TLS only, with an ACL user instead of the
//! default one, or under libfaketime (a wall clock the test steps).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use super::clock::ServerClock;
use super::container::{self, Request, Started};
use super::process::{self, Managed, Spec, TempDir};
use super::{
    announce, from_container, impl_control, not_found, process_env, EnvLookup, Source, Unavailable,
    NATIVE_ONLY,
};

const BACKEND: &str = "redis";
const ENV: &str = "LEASE_TEST_REDIS_URL";
const WHAT: &str = "redis-server binary";
const IMAGE: &str = "redis";
const TAG: &str = "7.0-alpine";
const SYSTEM_BIN: &str = "/usr/bin/redis-server";

/// A Redis server for tests.
#[derive(Debug)]
pub struct Redis {
    /// Connection URL, e.g. `redis://127.0.0.1:6379` (`rediss://localhost:…`
    /// with TLS; `redis://user:password@…` with an ACL user).
    pub url: String,
    /// Where the server came from.
    pub source: Source,
    data_dir: Option<PathBuf>,
    managed: Option<Managed>,
}

impl_control!(Redis, "redis");

impl Redis {
    /// The data directory (the append-only file) of a server the harness
    /// started.
    pub fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_deref()
    }
}

/// What a private server is started with; the default is the shared
/// server's setup: plain TCP, no password, `appendonly yes` with
/// `appendfsync always`, a fresh data directory.
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    data_dir: Option<PathBuf>,
    no_persistence: bool,
    tls: Option<(String, String)>,
    acl: Option<(String, String)>,
}

impl RedisOptions {
    /// The shared server's setup.
    pub fn new() -> Self {
        RedisOptions::default()
    }

    /// Keeps the data in `dir` (created when missing, and kept).
    pub fn data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(dir.to_path_buf());
        self
    }

    /// No append-only file and no snapshots: a restart forgets everything.
    pub fn without_persistence(mut self) -> Self {
        self.no_persistence = true;
        self
    }

    /// TLS only (`--port 0`, `--tls-port`), with the certificate `cert_pem`
    /// and its key `key_pem` (say, a [`Pki`](super::pki::Pki) leaf); clients
    /// need no certificate. The URL is `rediss://localhost:…`.
    pub fn tls(mut self, cert_pem: &str, key_pem: &str) -> Self {
        self.tls = Some((cert_pem.to_owned(), key_pem.to_owned()));
        self
    }

    /// The default user off, and `user` with `password` allowed everything:
    /// the URL carries the two.
    pub fn acl_user(mut self, user: &str, password: &str) -> Self {
        self.acl = Some((user.to_owned(), password.to_owned()));
        self
    }

    /// A private native server with these options, killed on drop; its
    /// data survives `restart()` (unless [`without_persistence`](Self::without_persistence)).
    pub fn spawn(&self) -> Result<Redis, Unavailable> {
        let bin = binary().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "redis", NATIVE_ONLY))?;
        start_native(&bin, self, &[])
    }

    /// [`spawn`](Self::spawn) under libfaketime: the server's wall clock is
    /// the returned [`ServerClock`], which the test steps.
    pub fn spawn_with_clock(&self) -> Result<(Redis, ServerClock), Unavailable> {
        let bin = binary().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "redis", NATIVE_ONLY))?;
        let io =
            |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot fake the clock: {e}"));
        let dir = TempDir::new("redis-clock").map_err(io)?;
        let (clock, mut env) = ServerClock::new(dir.path()).map_err(io)?;
        // Debian's redis-server allocates with jemalloc, whose start reads
        // the clock, which starts libfaketime, which allocates: the two
        // wait on each other for ever. The C library preloaded after
        // libfaketime makes glibc's malloc the server's (redis asks
        // jemalloc only for statistics, and for a size class it compares
        // with the block's real size before it trusts it).
        for (name, value) in &mut env {
            if name == "LD_PRELOAD" {
                value.push_str(":libc.so.6");
            }
        }
        let redis = start_native(&bin, self, &env)?;
        Ok((redis, clock.keeping(dir)))
    }
}

/// The shared Redis server of this test process, started on first use.
pub fn redis() -> Result<&'static Redis, Unavailable> {
    static SHARED: OnceLock<Result<Redis, Unavailable>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let redis = resolve(&process_env)?;
            if let Some(m) = &redis.managed {
                m.cleanup_at_exit();
            }
            announce(BACKEND, &redis.source, &redis.url);
            Ok(redis)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A private native Redis with the shared server's setup, killed on drop;
/// its data survives `restart()`. With `data_dir` the data lives there
/// (and is kept).
pub fn spawn_redis(data_dir: Option<&Path>) -> Result<Redis, Unavailable> {
    let options = RedisOptions::new();
    match data_dir {
        Some(d) => options.data_dir(d).spawn(),
        None => options.spawn(),
    }
}

pub(crate) fn resolve(env: EnvLookup<'_>) -> Result<Redis, Unavailable> {
    if let Some(redis) = from_env(env) {
        return Ok(redis);
    }
    match binary() {
        Some(bin) => start_native(&bin, &RedisOptions::new(), &[]),
        None => start_container(),
    }
}

pub(crate) fn from_env(env: EnvLookup<'_>) -> Option<Redis> {
    Some(Redis {
        url: env(ENV)?.trim().to_string(),
        source: Source::Env(ENV),
        data_dir: None,
        managed: None,
    })
}

/// `redis-server`: the provisioned one, the system's, or one on `PATH`.
fn binary() -> Option<PathBuf> {
    let provisioned = crate::servers_dir().join(crate::provision::REDIS_CACHED_BIN);
    if crate::is_executable(&provisioned) {
        return Some(provisioned);
    }
    let system = PathBuf::from(SYSTEM_BIN);
    if crate::is_executable(&system) {
        return Some(system);
    }
    crate::which("redis-server")
}

fn start_native(
    bin: &Path,
    options: &RedisOptions,
    env: &[(String, String)],
) -> Result<Redis, Unavailable> {
    let mut last = None;
    // A port picked free can be taken before the server binds it: retry.
    for _ in 0..3 {
        match start_once(bin, options, env) {
            Ok(r) => return Ok(r),
            Err(e) if e.reason.contains("Address already in use") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Unavailable::new(BACKEND, "could not start")))
}

fn start_once(
    bin: &Path,
    options: &RedisOptions,
    env: &[(String, String)],
) -> Result<Redis, Unavailable> {
    let io = |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot prepare redis: {e}"));
    let dir = TempDir::new("redis").map_err(io)?;
    let data = match &options.data_dir {
        Some(d) => d.clone(),
        None => dir.path().join("data"),
    };
    std::fs::create_dir_all(&data).map_err(io)?;
    let port = process::free_ports(1).map_err(io)?[0];
    let mut settings: Vec<(&str, String)> = vec![
        ("bind", "127.0.0.1".into()),
        ("dir", data.display().to_string()),
        ("daemonize", "no".into()),
        ("logfile", String::new()),
        ("save", String::new()),
    ];
    if options.no_persistence {
        settings.push(("appendonly", "no".into()));
    } else {
        settings.push(("appendonly", "yes".into()));
        settings.push(("appendfsync", "always".into()));
    }
    match &options.tls {
        None => settings.push(("port", port.to_string())),
        Some((cert, key)) => {
            let tls_dir = dir.path().join("tls");
            std::fs::create_dir_all(&tls_dir).map_err(io)?;
            let (cert_path, key_path) = (tls_dir.join("server.crt"), tls_dir.join("server.key"));
            std::fs::write(&cert_path, cert).map_err(io)?;
            std::fs::write(&key_path, key).map_err(io)?;
            settings.push(("port", "0".into()));
            settings.push(("tls-port", port.to_string()));
            settings.push(("tls-cert-file", cert_path.display().to_string()));
            settings.push(("tls-key-file", key_path.display().to_string()));
            settings.push(("tls-auth-clients", "no".into()));
        }
    }
    let mut spec = settings.iter().fold(Spec::new(bin), |spec, (name, value)| {
        spec.arg(format!("--{name}")).arg(value)
    });
    if let Some((user, password)) = &options.acl {
        // One `user` directive: its rules are the value's words.
        spec = spec
            .arg("--user")
            .arg("default")
            .arg("off")
            .arg("--user")
            .arg(user)
            .arg("on")
            .arg(format!(">{password}"))
            .arg("~*")
            .arg("&*")
            .arg("+@all");
    }
    for (k, v) in env {
        spec = spec.env(k, v);
    }
    if let Some(lib) = library_path(bin) {
        spec = spec.env("LD_LIBRARY_PATH", lib);
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let auth = options.acl.clone();
    let ready: Box<dyn Fn() -> bool + Send + Sync> = if options.tls.is_some() {
        Box::new(move || process::tcp_open(addr))
    } else {
        Box::new(move || answers_ping(addr, auth.as_ref()))
    };
    let managed = Managed::start(BACKEND, spec, dir, ready)?;
    let credentials = options
        .acl
        .as_ref()
        .map(|(u, p)| format!("{u}:{p}@"))
        .unwrap_or_default();
    let url = match options.tls {
        Some(_) => format!("rediss://{credentials}localhost:{port}"),
        None => format!("redis://{credentials}127.0.0.1:{port}"),
    };
    Ok(Redis {
        url,
        source: Source::Native(bin.to_path_buf()),
        data_dir: Some(data),
        managed: Some(managed),
    })
}

/// `LD_LIBRARY_PATH` for a provisioned (unpacked) server: the libraries a
/// minimal system lacks (jemalloc, lzf) are unpacked beside it.
fn library_path(bin: &Path) -> Option<String> {
    super::unpacked_library_path("redis", bin)
}

/// Step 3: the upstream image with the native server's settings.
fn start_container() -> Result<Redis, Unavailable> {
    let cmd = [
        "redis-server",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
    ]
    .map(String::from)
    .to_vec();
    let req = Request {
        backend: BACKEND,
        image: IMAGE,
        tag: TAG,
        ports: &[6379],
        cmd,
        env: Vec::new(),
    };
    let image = req.reference();
    let ready =
        |s: &Started| container::addr(&s.host, s.ports[0]).is_some_and(|a| answers_ping(a, None));
    let started = from_container(req, &ready, ENV, WHAT, "redis")?;
    Ok(Redis {
        url: format!("redis://{}:{}", started.host, started.ports[0]),
        source: Source::Container(image),
        data_dir: None,
        managed: None,
    })
}

/// Ready: `PING` (after `AUTH` when the server has an ACL user) is
/// answered `+PONG`, not `-LOADING` while the append-only file is read.
pub(crate) fn answers_ping(addr: SocketAddr, auth: Option<&(String, String)>) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let timeout = Duration::from_millis(500);
        let mut s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        let mut request = Vec::new();
        if let Some((user, password)) = auth {
            request.extend_from_slice(&resp(&["AUTH", user, password]));
        }
        request.extend_from_slice(&resp(&["PING"]));
        s.write_all(&request)?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 256];
        while !answer.ends_with(b"\r\n") || (auth.is_some() && count_lines(&answer) < 2) {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
        Ok(answer.ends_with(b"+PONG\r\n"))
    };
    attempt().unwrap_or(false)
}

fn count_lines(bytes: &[u8]) -> usize {
    bytes.windows(2).filter(|w| w == b"\r\n").count()
}

/// One command in RESP, as an array of bulk strings.
fn resp(words: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
    }
    out
}
