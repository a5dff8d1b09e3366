//! Real etcd servers for the integration tests: the shared one, and private
//! ones (single members with TLS, three-member clusters) started from the
//! binary `cargo xtask provision --backend etcd` caches.
#![allow(dead_code)] // not every helper is used by every configuration

pub mod harness;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lease_etcd::{EtcdBackend, EtcdConfig, TlsConfig};

/// The etcd binary the conformance harness would start: in
/// `$LEASE_SERVERS_DIR` (default `target/lease-servers`, filled by
/// `cargo xtask provision --backend etcd`), else `etcd` on `PATH`.
pub fn etcd_bin() -> Result<PathBuf, String> {
    let cached = lease_testkit::servers::servers_dir()
        .join("bin")
        .join("etcd");
    if cached.is_file() {
        return Ok(cached);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let p = d.join("etcd");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(format!(
        "no etcd binary at {} nor on PATH: run `cargo xtask provision --backend etcd`",
        cached.display()
    ))
}

/// A free loopback port (the OS picks; a race with another process taking it
/// before etcd does is possible but rare, and shows as a start failure).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

fn fresh_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "lease-etcd-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a data dir");
    dir
}

/// TLS files for a member: server cert/key and the CA that client certs
/// must chain to (`--client-cert-auth`).
#[derive(Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// One etcd member process; killed (and its data removed) on drop.
pub struct Member {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    pub data_dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Member {
    fn start(&mut self) -> Result<(), String> {
        let bin = etcd_bin()?;
        let log = std::fs::File::create(self.data_dir.with_extension("log"))
            .map_err(|e| format!("etcd log file: {e}"))?;
        let child = Command::new(&bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the member abruptly (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the process is running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data_dir);
        let _ = std::fs::remove_file(self.data_dir.with_extension("log"));
    }
}

/// Starts `n` members forming one cluster on loopback (plaintext, or with
/// `tls` on the client port). Returns once they run; use [`wait_ready`].
pub fn start_cluster(n: usize, tls: Option<&ServerTls>) -> Result<Vec<Member>, String> {
    // Faster elections than the defaults (100/1000 ms), still far above
    // loopback latency; etcd's minimum lease TTL becomes 1 s.
    start_cluster_timed(n, tls, 50, 500)
}

/// [`start_cluster`] with the given heartbeat interval and election timeout
/// (ms); etcd's defaults are 100 and 1000.
pub fn start_cluster_timed(
    n: usize,
    tls: Option<&ServerTls>,
    heartbeat_ms: u64,
    election_ms: u64,
) -> Result<Vec<Member>, String> {
    let token = format!("lease-etcd-test-{}-{}", std::process::id(), free_port());
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut members: Vec<Member> = (0..n)
        .map(|i| {
            let name = format!("m{i}");
            Member {
                client_url: format!("{scheme}://127.0.0.1:{}", free_port()),
                peer_url: format!("http://127.0.0.1:{}", free_port()),
                data_dir: fresh_dir(&name),
                name,
                args: Vec::new(),
                child: None,
            }
        })
        .collect();
    let initial = members
        .iter()
        .map(|m| format!("{}={}", m.name, m.peer_url))
        .collect::<Vec<_>>()
        .join(",");
    for m in &mut members {
        let mut args = vec![
            format!("--name={}", m.name),
            format!("--data-dir={}", m.data_dir.display()),
            format!("--listen-client-urls={}", m.client_url),
            format!("--advertise-client-urls={}", m.client_url),
            format!("--listen-peer-urls={}", m.peer_url),
            format!("--initial-advertise-peer-urls={}", m.peer_url),
            format!("--initial-cluster={initial}"),
            format!("--initial-cluster-token={token}"),
            "--initial-cluster-state=new".into(),
            "--log-level=warn".into(),
            format!("--heartbeat-interval={heartbeat_ms}"),
            format!("--election-timeout={election_ms}"),
            // Test data need not survive a power cut; fsync on a shared CI
            // disk only makes elections and commits slow.
            "--unsafe-no-fsync".into(),
        ];
        if let Some(t) = tls {
            args.extend([
                format!("--cert-file={}", t.cert.display()),
                format!("--key-file={}", t.key.display()),
                format!("--trusted-ca-file={}", t.ca.display()),
                "--client-cert-auth".into(),
            ]);
        }
        m.args = args;
        m.start()?;
    }
    Ok(members)
}

/// Connects until the cluster answers (an elected leader), or fails after
/// `limit` with the members' logs.
pub async fn wait_ready(
    endpoints: &[String],
    tls: Option<TlsConfig>,
    limit: Duration,
) -> Result<EtcdBackend, String> {
    let start = Instant::now();
    loop {
        let mut config = EtcdConfig::new(endpoints.to_vec()).dial_timeout(Duration::from_secs(1));
        if let Some(t) = &tls {
            config = config.tls(t.clone());
        }
        match EtcdBackend::connect(config).await {
            Ok(b) => return Ok(b),
            Err(e) if start.elapsed() > limit => {
                return Err(format!(
                    "etcd at {endpoints:?} not ready after {limit:?}: {e}"
                ))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The endpoints of the etcd every test of this process shares, from the
/// conformance harness: `LEASE_TEST_ETCD_ENDPOINTS` when set, else a native
/// member it starts once per test binary (and stops when the process exits).
pub fn shared_endpoints() -> Result<Vec<String>, String> {
    lease_testkit::servers::etcd()
        .map(|e| e.endpoints.clone())
        .map_err(|e| e.to_string())
}

/// A key prefix unique to this test process, so runs sharing a server (and
/// earlier runs' leftovers) never meet.
pub fn unique_prefix(tag: &str) -> String {
    format!(
        "lease-etcd-test/{tag}/{}-{}/",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}
