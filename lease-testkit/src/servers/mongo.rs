//! MongoDB: `LEASE_TEST_MONGODB_URI`, else a native SecantusDB
//! (`secantusd-py`, a MongoDB wire-compatible server from
//! `cargo xtask provision`) behind `servers/secantus_serial.py`, which runs
//! one command at a time so each write is judged on the `$$NOW` of the
//! instant it lands, else (feature `containers`) a single-node `mongo`
//! container.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::clock::ServerClock;
use super::container::{self, Request, Started};
use super::process::{self, Managed, Spec, TempDir};
use super::{
    announce, find_native, from_container, impl_control, not_found, process_env, EnvLookup, Source,
    Unavailable, NATIVE_ONLY,
};

const BACKEND: &str = "mongo";
const ENV: &str = "LEASE_TEST_MONGODB_URI";
const WHAT: &str = "secantusd-py";
const IMAGE: &str = "mongo";
const TAG: &str = "7";

/// The launcher script, embedded so the harness works from any directory.
const SECANTUS_SERIAL: &str = include_str!("../../servers/secantus_serial.py");

/// A MongoDB-compatible server, for tests.
#[derive(Debug)]
pub struct Mongo {
    /// Connection string, e.g. `mongodb://127.0.0.1:27017/?directConnection=true`.
    pub uri: String,
    /// Where the server came from.
    pub source: Source,
    storage_dir: Option<PathBuf>,
    managed: Option<Managed>,
}

impl_control!(Mongo, "mongo");

impl Mongo {
    /// The storage directory of a server the harness started.
    pub fn storage_dir(&self) -> Option<&Path> {
        self.storage_dir.as_deref()
    }
}

/// The shared MongoDB-compatible server of this test process, started on
/// first use.
pub fn mongo() -> Result<&'static Mongo, Unavailable> {
    static SHARED: OnceLock<Result<Mongo, Unavailable>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let mongo = resolve(&process_env)?;
            if let Some(m) = &mongo.managed {
                m.cleanup_at_exit();
            }
            announce(BACKEND, &mongo.source, &mongo.uri);
            Ok(mongo)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A private native SecantusDB, killed on drop; its storage survives
/// `restart()`. With `storage_dir` the data lives there (and is kept).
pub fn spawn_mongo(storage_dir: Option<&Path>) -> Result<Mongo, Unavailable> {
    let binary = binary().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "mongo", NATIVE_ONLY))?;
    start_native(&binary, storage_dir)
}

/// A private native SecantusDB whose wall clock the test steps (see
/// [`ServerClock`]), killed on drop; its storage survives `restart()`.
pub fn spawn_mongo_with_clock() -> Result<(Mongo, ServerClock), Unavailable> {
    let binary = binary().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "mongo", NATIVE_ONLY))?;
    let io = |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot fake the clock: {e}"));
    let dir = TempDir::new("mongo-clock").map_err(io)?;
    let (clock, env) = ServerClock::new(dir.path()).map_err(io)?;
    let mongo = start_native_with(&binary, None, &env)?;
    // The clock file outlives the server's own directory only as long as
    // the clock does; keep its directory with the clock. SecantusDB serves
    // each connection on a thread of its own.
    Ok((mongo, clock.keeping(dir).in_threaded_server()))
}

pub(crate) fn resolve(env: EnvLookup<'_>) -> Result<Mongo, Unavailable> {
    if let Some(mongo) = from_env(env) {
        return Ok(mongo);
    }
    match binary() {
        Some(binary) => start_native(&binary, None),
        None => start_container(),
    }
}

/// Step 3: a real single-node `mongod` (no replica set), waited for as the
/// native server is: until it accepts connections.
fn start_container() -> Result<Mongo, Unavailable> {
    let req = Request {
        backend: BACKEND,
        image: IMAGE,
        tag: TAG,
        ports: &[27017],
        cmd: Vec::new(),
        env: Vec::new(),
    };
    let image = req.reference();
    let ready = |s: &Started| container::addr(&s.host, s.ports[0]).is_some_and(process::tcp_open);
    let started = from_container(req, &ready, ENV, WHAT, "mongo")?;
    Ok(Mongo {
        uri: format!(
            "mongodb://{}:{}/?directConnection=true",
            started.host, started.ports[0]
        ),
        source: Source::Container(image),
        storage_dir: None,
        managed: None,
    })
}

pub(crate) fn from_env(env: EnvLookup<'_>) -> Option<Mongo> {
    Some(Mongo {
        uri: env(ENV)?.trim().to_string(),
        source: Source::Env(ENV),
        storage_dir: None,
        managed: None,
    })
}

fn binary() -> Option<PathBuf> {
    find_native("secantus/bin/secantusd-py", "secantusd-py")
}

/// The Python that runs `binary` (a pip console script), which the launcher
/// script needs: the `python` beside it in its virtualenv, else the Python
/// its `#!` line names.
pub(crate) fn python_of(binary: &Path) -> Option<PathBuf> {
    let beside = binary.with_file_name("python");
    if crate::is_executable(&beside) {
        return Some(beside);
    }
    let text = std::fs::read(binary).ok()?;
    let first = text.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(first).ok()?.strip_prefix("#!")?;
    let mut words = line.split_whitespace();
    let mut interpreter = PathBuf::from(words.next()?);
    if interpreter.file_name().is_some_and(|n| n == "env") {
        interpreter = crate::which(words.next()?)?;
    }
    let is_python = interpreter
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("python"));
    (is_python && interpreter.is_absolute() && crate::is_executable(&interpreter))
        .then_some(interpreter)
}

fn start_native(binary: &Path, storage_dir: Option<&Path>) -> Result<Mongo, Unavailable> {
    start_native_with(binary, storage_dir, &[])
}

fn start_native_with(
    binary: &Path,
    storage_dir: Option<&Path>,
    env: &[(String, String)],
) -> Result<Mongo, Unavailable> {
    let mut last = None;
    for _ in 0..3 {
        match start_once(binary, storage_dir, env) {
            Ok(mongo) => return Ok(mongo),
            Err(e) if e.reason.contains("in use") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Unavailable::new(BACKEND, "could not start")))
}

fn start_once(
    binary: &Path,
    storage_dir: Option<&Path>,
    env: &[(String, String)],
) -> Result<Mongo, Unavailable> {
    let io =
        |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot prepare secantusd-py: {e}"));
    let python = python_of(binary).ok_or_else(|| {
        Unavailable::new(
            BACKEND,
            format!("cannot find the Python that runs {}", binary.display()),
        )
    })?;
    let dir = TempDir::new("mongo").map_err(io)?;
    let script = dir.path().join("secantus_serial.py");
    std::fs::write(&script, SECANTUS_SERIAL).map_err(io)?;
    // Our own directory rather than `:memory:`: a SIGKILLed server cannot
    // clean up its own temporary directory, the harness can.
    let storage = match storage_dir {
        Some(d) => d.to_path_buf(),
        None => dir.path().join("data"),
    };
    let port = process::free_ports(1).map_err(io)?[0];
    let spec = Spec::new(&python)
        .arg(&script)
        .arg("--host")
        .arg("127.0.0.1")
        .arg("--port")
        .arg(port.to_string())
        .arg("--storage-path")
        .arg(&storage)
        .arg("--log-level")
        .arg("WARNING")
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let spec = env.iter().fold(spec, |spec, (k, v)| spec.env(k, v));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let ready = Box::new(move || process::tcp_open(addr));
    let managed = Managed::start(BACKEND, spec, dir, ready)?;
    Ok(Mongo {
        uri: format!("mongodb://127.0.0.1:{port}/?directConnection=true"),
        source: Source::Native(binary.to_path_buf()),
        storage_dir: Some(storage),
        managed: Some(managed),
    })
}
