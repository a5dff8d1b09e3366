//! NATS with JetStream: `LEASE_TEST_NATS_URL`, else a native
//! `nats-server -js`, else (feature `containers`) the `nats` image with
//! `-js`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::container::{self, Request, Started};
use super::process::{self, Managed, Spec, TempDir};
use super::{
    announce, find_native, from_container, impl_control, not_found, process_env, EnvLookup, Source,
    Unavailable, NATIVE_ONLY,
};

const BACKEND: &str = "nats";
const ENV: &str = "LEASE_TEST_NATS_URL";
const WHAT: &str = "nats-server binary";
/// 2.11 is the first release with per-message TTLs (`Nats-TTL`).
const IMAGE: &str = "nats";
const TAG: &str = "2.11";

/// A NATS server with JetStream enabled, for tests.
#[derive(Debug)]
pub struct Nats {
    /// Client URL, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// Where the server came from.
    pub source: Source,
    /// HTTP monitoring URL (`/healthz`, `/jsz`, …) of a server the harness
    /// started.
    pub monitor_url: Option<String>,
    store_dir: Option<PathBuf>,
    managed: Option<Managed>,
}

impl_control!(Nats, "nats");

impl Nats {
    /// The JetStream store directory of a server the harness started.
    pub fn store_dir(&self) -> Option<&Path> {
        self.store_dir.as_deref()
    }
}

/// The shared NATS server of this test process, started on first use.
pub fn nats() -> Result<&'static Nats, Unavailable> {
    static SHARED: OnceLock<Result<Nats, Unavailable>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let nats = resolve(&process_env)?;
            if let Some(m) = &nats.managed {
                m.cleanup_at_exit();
            }
            announce(BACKEND, &nats.source, &nats.url);
            Ok(nats)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A private native nats-server with JetStream, killed on drop. With
/// `store_dir`, JetStream keeps its data there (and it is kept); otherwise
/// in a fresh temporary directory.
pub fn spawn_nats(store_dir: Option<&Path>) -> Result<Nats, Unavailable> {
    let binary = binary().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "nats", NATIVE_ONLY))?;
    start_native(&binary, store_dir)
}

pub(crate) fn resolve(env: EnvLookup<'_>) -> Result<Nats, Unavailable> {
    if let Some(nats) = from_env(env) {
        return Ok(nats);
    }
    match binary() {
        Some(binary) => start_native(&binary, None),
        None => start_container(),
    }
}

/// Step 3: the upstream image (its entrypoint is `nats-server`).
fn start_container() -> Result<Nats, Unavailable> {
    let args = [
        "--port",
        "4222",
        "--http_port",
        "8222",
        "--server_name",
        "lease-test",
        "-js",
    ];
    let req = Request {
        backend: BACKEND,
        image: IMAGE,
        tag: TAG,
        ports: &[4222, 8222],
        cmd: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
    };
    let image = req.reference();
    let ready = |s: &Started| container::addr(&s.host, s.ports[1]).is_some_and(healthy);
    let started = from_container(req, &ready, ENV, WHAT, "nats")?;
    Ok(Nats {
        url: format!("nats://{}:{}", started.host, started.ports[0]),
        source: Source::Container(image),
        monitor_url: Some(format!("http://{}:{}", started.host, started.ports[1])),
        store_dir: None,
        managed: None,
    })
}

/// Ready: the monitor's `/healthz` answers 200 only once JetStream is up.
fn healthy(monitor: SocketAddr) -> bool {
    matches!(process::http(monitor, "GET", "/healthz", b""), Ok((200, _)))
}

pub(crate) fn from_env(env: EnvLookup<'_>) -> Option<Nats> {
    let url = env(ENV)?.trim().to_string();
    Some(Nats {
        url,
        source: Source::Env(ENV),
        monitor_url: None,
        store_dir: None,
        managed: None,
    })
}

fn binary() -> Option<PathBuf> {
    find_native("bin/nats-server", "nats-server")
}

fn start_native(binary: &Path, store_dir: Option<&Path>) -> Result<Nats, Unavailable> {
    let mut last = None;
    // A port picked free can be taken before nats-server binds it: retry.
    for _ in 0..3 {
        match start_once(binary, store_dir) {
            Ok(nats) => return Ok(nats),
            Err(e) if e.reason.contains("address already in use") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Unavailable::new(BACKEND, "could not start")))
}

fn start_once(binary: &Path, store_dir: Option<&Path>) -> Result<Nats, Unavailable> {
    let io =
        |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot prepare nats-server: {e}"));
    let dir = TempDir::new("nats").map_err(io)?;
    let store = match store_dir {
        Some(d) => d.to_path_buf(),
        None => dir.path().join("jetstream"),
    };
    let ports = process::free_ports(2).map_err(io)?;
    let (client, monitor) = (ports[0], ports[1]);
    let spec = Spec::new(binary)
        .arg("--addr")
        .arg("127.0.0.1")
        .arg("--port")
        .arg(client.to_string())
        .arg("--http_port")
        .arg(monitor.to_string())
        .arg("--server_name")
        .arg("lease-test")
        .arg("--jetstream")
        .arg("--store_dir")
        .arg(&store);
    let addr = SocketAddr::from(([127, 0, 0, 1], monitor));
    let ready = Box::new(move || healthy(addr));
    let managed = Managed::start(BACKEND, spec, dir, ready)?;
    Ok(Nats {
        url: format!("nats://127.0.0.1:{client}"),
        source: Source::Native(binary.to_path_buf()),
        monitor_url: Some(format!("http://127.0.0.1:{monitor}")),
        store_dir: Some(store),
        managed: Some(managed),
    })
}
