//! etcd: `LEASE_TEST_ETCD_ENDPOINTS`, else a native single-member `etcd`,
//! else (feature `containers`) the `quay.io/coreos/etcd` image.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::container::{self, Request, Started};
use super::process::{self, Managed, Spec, TempDir};
use super::{
    announce, find_native, from_container, impl_control, not_found, process_env, EnvLookup, Source,
    Unavailable, NATIVE_ONLY,
};

const BACKEND: &str = "etcd";
const ENV: &str = "LEASE_TEST_ETCD_ENDPOINTS";
const WHAT: &str = "etcd binary";
/// A 3.5 release, as the native path expects (`--unsafe-no-fsync`).
const IMAGE: &str = "quay.io/coreos/etcd";
const TAG: &str = "v3.5.21";

/// An etcd server for tests.
#[derive(Debug)]
pub struct Etcd {
    /// Client endpoints, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Where the server came from.
    pub source: Source,
    data_dir: Option<PathBuf>,
    managed: Option<Managed>,
}

impl_control!(Etcd, "etcd");

impl Etcd {
    /// The data directory of a server the harness started.
    pub fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_deref()
    }
}

/// The shared etcd of this test process, started on first use.
pub fn etcd() -> Result<&'static Etcd, Unavailable> {
    static SHARED: OnceLock<Result<Etcd, Unavailable>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let etcd = resolve(&process_env)?;
            if let Some(m) = &etcd.managed {
                m.cleanup_at_exit();
            }
            announce(BACKEND, &etcd.source, &etcd.endpoints.join(","));
            Ok(etcd)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A private native etcd, killed on drop. With `data_dir`, that directory
/// holds its data (and is kept); otherwise a fresh temporary one does.
pub fn spawn_etcd(data_dir: Option<&Path>) -> Result<Etcd, Unavailable> {
    let binary = binary().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "etcd", NATIVE_ONLY))?;
    start_native(&binary, data_dir)
}

pub(crate) fn resolve(env: EnvLookup<'_>) -> Result<Etcd, Unavailable> {
    if let Some(etcd) = from_env(env) {
        return Ok(etcd);
    }
    match binary() {
        Some(binary) => start_native(&binary, None),
        None => start_container(),
    }
}

/// Step 3: the upstream image, same flags as the native server.
fn start_container() -> Result<Etcd, Unavailable> {
    let args = [
        "/usr/local/bin/etcd",
        "--name",
        "lease-test",
        "--data-dir",
        "/tmp/etcd-data",
        "--listen-client-urls",
        "http://0.0.0.0:2379",
        "--advertise-client-urls",
        "http://0.0.0.0:2379",
        "--heartbeat-interval",
        "25",
        "--election-timeout",
        "250",
        "--unsafe-no-fsync",
    ];
    let req = Request {
        backend: BACKEND,
        image: IMAGE,
        tag: TAG,
        ports: &[2379],
        cmd: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
    };
    let image = req.reference();
    let ready = |s: &Started| container::addr(&s.host, s.ports[0]).is_some_and(healthy);
    let started = from_container(req, &ready, ENV, WHAT, "etcd")?;
    Ok(Etcd {
        endpoints: vec![format!("http://{}:{}", started.host, started.ports[0])],
        source: Source::Container(image),
        data_dir: None,
        managed: None,
    })
}

/// Ready: `/health` says so.
fn healthy(addr: SocketAddr) -> bool {
    matches!(process::http(addr, "GET", "/health", b""),
        Ok((200, body)) if body.contains("\"health\":\"true\""))
}

pub(crate) fn from_env(env: EnvLookup<'_>) -> Option<Etcd> {
    let endpoints: Vec<String> = env(ENV)?
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    if endpoints.is_empty() {
        return None;
    }
    Some(Etcd {
        endpoints,
        source: Source::Env(ENV),
        data_dir: None,
        managed: None,
    })
}

fn binary() -> Option<PathBuf> {
    find_native("bin/etcd", "etcd")
}

/// etcd 3.5 has `--unsafe-no-fsync` (data still survives a killed
/// process, only not a machine crash); 3.4 does not.
fn supports_no_fsync(binary: &Path) -> bool {
    static ANSWER: OnceLock<bool> = OnceLock::new();
    *ANSWER.get_or_init(|| {
        process::output_of(binary, &["--version"])
            .and_then(|out| {
                out.lines()
                    .find_map(|l| l.strip_prefix("etcd Version:"))
                    .map(|v| {
                        let mut parts = v.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
                        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (3, 5)
                    })
            })
            .unwrap_or(false)
    })
}

fn start_native(binary: &Path, data_dir: Option<&Path>) -> Result<Etcd, Unavailable> {
    let mut last = None;
    // A port picked free can be taken before etcd binds it: retry then.
    for _ in 0..3 {
        match start_once(binary, data_dir) {
            Ok(etcd) => return Ok(etcd),
            Err(e) if e.reason.contains("address already in use") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Unavailable::new(BACKEND, "could not start")))
}

fn start_once(binary: &Path, data_dir: Option<&Path>) -> Result<Etcd, Unavailable> {
    let io = |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot prepare etcd: {e}"));
    let dir = TempDir::new("etcd").map_err(io)?;
    let data = match data_dir {
        Some(d) => d.to_path_buf(),
        None => dir.path().join("data"),
    };
    let ports = process::free_ports(2).map_err(io)?;
    let (client, peer) = (ports[0], ports[1]);
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut spec = Spec::new(binary)
        .arg("--name")
        .arg("lease-test")
        .arg("--data-dir")
        .arg(&data)
        .arg("--listen-client-urls")
        .arg(&client_url)
        .arg("--advertise-client-urls")
        .arg(&client_url)
        .arg("--listen-peer-urls")
        .arg(&peer_url)
        .arg("--initial-advertise-peer-urls")
        .arg(&peer_url)
        .arg("--initial-cluster")
        .arg(format!("lease-test={peer_url}"))
        .arg("--initial-cluster-state")
        .arg("new")
        // Short raft ticks: quick start, and a minimum lease TTL of 1 s
        // (etcd's floor is 1.5 election timeouts).
        .arg("--heartbeat-interval")
        .arg("25")
        .arg("--election-timeout")
        .arg("250");
    if supports_no_fsync(binary) {
        spec = spec.arg("--unsafe-no-fsync");
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], client));
    let ready = Box::new(move || healthy(addr));
    let managed = Managed::start(BACKEND, spec, dir, ready)?;
    Ok(Etcd {
        endpoints: vec![client_url],
        source: Source::Native(binary.to_path_buf()),
        data_dir: Some(data),
        managed: Some(managed),
    })
}
