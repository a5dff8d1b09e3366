//! etcd: `LEASE_TEST_ETCD_ENDPOINTS`, else a native single-member `etcd`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::process::{self, Managed, Spec, TempDir};
use super::{
    announce, find_native, impl_control, not_found, process_env, EnvLookup, Source, Unavailable,
};

const BACKEND: &str = "etcd";
const ENV: &str = "LEASE_TEST_ETCD_ENDPOINTS";

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
    let binary = binary().ok_or_else(|| not_found(BACKEND, ENV, "etcd binary", "etcd"))?;
    start_native(&binary, data_dir)
}

pub(crate) fn resolve(env: EnvLookup<'_>) -> Result<Etcd, Unavailable> {
    if let Some(etcd) = from_env(env) {
        return Ok(etcd);
    }
    let binary = binary().ok_or_else(|| not_found(BACKEND, ENV, "etcd binary", "etcd"))?;
    start_native(&binary, None)
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
    let ready = Box::new(move || {
        matches!(process::http(addr, "GET", "/health", b""),
            Ok((200, body)) if body.contains("\"health\":\"true\""))
    });
    let managed = Managed::start(BACKEND, spec, dir, ready)?;
    Ok(Etcd {
        endpoints: vec![client_url],
        source: Source::Native(binary.to_path_buf()),
        data_dir: Some(data),
        managed: Some(managed),
    })
}
