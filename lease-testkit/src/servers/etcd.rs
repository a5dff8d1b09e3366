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

/// TLS files for an etcd member's client port: its certificate and key,
/// and the CA that client certificates must chain to
/// (`--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The member's certificate (PEM).
    pub cert: PathBuf,
    /// The member's private key (PEM).
    pub key: PathBuf,
    /// The CA client certificates must chain to (PEM).
    pub ca: PathBuf,
}

/// One member of a cluster from [`spawn_etcd_cluster`]: killed (and its
/// data removed) on drop.
#[derive(Debug)]
pub struct EtcdMember {
    /// The member's name in the cluster (`m0`, `m1`, …).
    pub name: String,
    /// Its client URL (`http://` or, with TLS, `https://127.0.0.1:port`).
    pub client_url: String,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// Its peer URL.
    pub peer_url: String,
    /// Its data directory.
    pub data_dir: PathBuf,
    managed: Managed,
}

impl EtcdMember {
    /// Kills the member abruptly (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        self.managed.kill();
    }

    /// Whether the member's process runs.
    pub fn running(&mut self) -> bool {
        self.managed.running()
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        process::log_tail(self.managed.log(), 15).unwrap_or_default()
    }
}

/// Starts `n` native etcd members forming one cluster on loopback, with
/// the given raft heartbeat interval and election timeout (ms; etcd's
/// defaults are 100 and 1000), and `tls` on the client port when given.
/// Returns once every member listens; the cluster answers once it has
/// elected a leader.
pub fn spawn_etcd_cluster(
    n: usize,
    tls: Option<&ServerTls>,
    heartbeat_ms: u64,
    election_ms: u64,
) -> Result<Vec<EtcdMember>, Unavailable> {
    let binary = binary().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "etcd", NATIVE_ONLY))?;
    let io = |e: std::io::Error| Unavailable::new(BACKEND, format!("cannot prepare etcd: {e}"));
    let ports = process::free_ports(2 * n).map_err(io)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let planned: Vec<(String, u16, String, String)> = (0..n)
        .map(|i| {
            (
                format!("m{i}"),
                ports[2 * i],
                format!("{scheme}://127.0.0.1:{}", ports[2 * i]),
                format!("http://127.0.0.1:{}", ports[2 * i + 1]),
            )
        })
        .collect();
    let initial = planned
        .iter()
        .map(|(name, _, _, peer)| format!("{name}={peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let token = format!("lease-etcd-test-{}-{}", std::process::id(), ports[0]);
    let mut members = Vec::with_capacity(n);
    for (name, client_port, client_url, peer_url) in planned {
        let dir = TempDir::new(&format!("etcd-{name}")).map_err(io)?;
        let data_dir = dir.path().join("data");
        let mut spec = Spec::new(&binary)
            .arg(format!("--name={name}"))
            .arg(format!("--data-dir={}", data_dir.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={initial}"))
            .arg(format!("--initial-cluster-token={token}"))
            .arg("--initial-cluster-state=new")
            .arg("--log-level=warn")
            .arg(format!("--heartbeat-interval={heartbeat_ms}"))
            .arg(format!("--election-timeout={election_ms}"));
        if supports_no_fsync(&binary) {
            // Test data need not survive a power cut; fsync on a shared CI
            // disk only makes elections and commits slow.
            spec = spec.arg("--unsafe-no-fsync");
        }
        if let Some(t) = tls {
            spec = spec
                .arg(format!("--cert-file={}", t.cert.display()))
                .arg(format!("--key-file={}", t.key.display()))
                .arg(format!("--trusted-ca-file={}", t.ca.display()))
                .arg("--client-cert-auth");
        }
        // A member listens before the cluster has a leader (which needs the
        // members started after it): wait for its port, not its health.
        let addr = SocketAddr::from(([127, 0, 0, 1], client_port));
        let ready = Box::new(move || process::tcp_open(addr));
        let managed = Managed::start(BACKEND, spec, dir, ready)?;
        members.push(EtcdMember {
            name,
            client_url,
            port: client_port,
            peer_url,
            data_dir,
            managed,
        });
    }
    Ok(members)
}
