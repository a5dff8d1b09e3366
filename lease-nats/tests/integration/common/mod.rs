//! Test servers for lease-nats: the shared one, and private ones a test may
//! stop, restart or cluster.
#![allow(dead_code)]

pub mod harness;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lease_core::{Error, LeaseKey};
use lease_nats::NatsBackend;

/// How long after a TTL runs out nats-server may take to remove the message
/// (its expiry timer ticks about once a second) and write the marker.
pub const EXPIRY_SLACK: Duration = Duration::from_millis(1500);

/// The nats-server binary for private servers: `LEASE_NATS_SERVER`, the one
/// `cargo xtask provision --backend nats` puts under `target/lease-servers/bin`
/// (`LEASE_SERVERS_DIR`), or the `PATH`'s.
pub fn binary() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("LEASE_NATS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let provisioned = lease_testkit::servers::servers_dir()
        .join("bin")
        .join("nats-server");
    if provisioned.exists() {
        return Ok(provisioned);
    }
    let on_path = Command::new("nats-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match on_path {
        Ok(s) if s.success() => Ok(PathBuf::from("nats-server")),
        _ => Err(
            "no nats-server >= 2.11 found: run `cargo xtask provision --backend nats`, \
             set LEASE_NATS_SERVER to a binary, or LEASE_TEST_NATS_URL to a running server"
                .into(),
        ),
    }
}

/// A free TCP port on loopback (free when asked; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on loopback")
}

/// The server every test of this process shares: `LEASE_TEST_NATS_URL`, or
/// the native nats-server `lease_testkit::servers` starts once.
pub async fn shared_url() -> Result<String, String> {
    tokio::task::spawn_blocking(|| {
        lease_testkit::servers::nats()
            .map(|n| n.url.clone())
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("starting nats-server: {e}"))?
}

fn wait_for_port(port: u16, within: Duration) -> Result<(), String> {
    let start = Instant::now();
    while start.elapsed() < within {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "nats-server did not listen on port {port} within {within:?}"
    ))
}

/// Stores `bytes` at `key` as a plain KV put (no TTL), as another program would.
pub async fn put_raw(b: &NatsBackend, key: &LeaseKey, bytes: &[u8]) -> Result<(), Error> {
    let js = async_nats::jetstream::new(b.client().clone());
    let subject = format!("$KV.{}.{}", b.config().bucket, key.as_str());
    let ack = js
        .publish(subject, bytes.to_vec().into())
        .await
        .map_err(|e| Error::unavailable("raw put", e))?;
    ack.await.map_err(|e| Error::unavailable("raw put", e))?;
    Ok(())
}

/// A private nats-server this test owns: killed when dropped.
pub struct Server {
    pub name: String,
    pub port: u16,
    pub store: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    /// A single JetStream server with file storage under `dir`.
    pub fn single(dir: &Path) -> Server {
        Server::single_with(dir, &[])
    }

    /// A single JetStream server under `dir` with extra command-line flags.
    pub fn single_with(dir: &Path, extra: &[String]) -> Server {
        let store = dir.join("js");
        let port = free_port();
        let mut args = vec![
            "-js".into(),
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            "-sd".into(),
            store.display().to_string(),
        ];
        args.extend(extra.iter().cloned());
        let mut s = Server {
            name: "single".into(),
            port,
            store,
            args,
            child: None,
        };
        s.start();
        s
    }

    /// Three clustered JetStream servers on loopback.
    pub fn cluster3(base: &Path) -> Vec<Server> {
        let client_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let routes = cluster_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers: Vec<Server> = (0..3)
            .map(|i| {
                let store = base.join(format!("n{i}"));
                let args = vec![
                    "-js".into(),
                    "-a".into(),
                    "127.0.0.1".into(),
                    "-p".into(),
                    client_ports[i].to_string(),
                    "-sd".into(),
                    store.display().to_string(),
                    "-n".into(),
                    format!("n{i}"),
                    "--cluster_name".into(),
                    "lease-test".into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{}", cluster_ports[i]),
                    "--routes".into(),
                    routes.clone(),
                ];
                Server {
                    name: format!("n{i}"),
                    port: client_ports[i],
                    store,
                    args,
                    child: None,
                }
            })
            .collect();
        for s in &mut servers {
            s.start();
        }
        servers
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn start(&mut self) {
        let bin = binary().expect("nats-server binary");
        // Beside the store, inside the test's temporary directory: removed
        // with it when the test passes, kept for diagnosis when it fails.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.store.with_extension("log"))
            .expect("log file");
        let child = Command::new(bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        wait_for_port(self.port, Duration::from_secs(10)).expect("nats-server up");
    }

    /// Kills the process (SIGKILL: no clean shutdown).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the process cleanly (SIGTERM) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fresh temporary directory for a test's servers.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "lease-nats-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A TCP relay in front of a server that delays every byte a client sends by
/// a settable latency (answers pass at once): the real server, just farther
/// away. Lets a test check that deadlines count from the send instant.
pub struct LatencyProxy {
    /// `nats://127.0.0.1:<port>` of the relay.
    pub url: String,
    latency_us: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl LatencyProxy {
    /// Starts relaying to `upstream` (`nats://host:port`) on the current runtime.
    pub async fn start(upstream: &str) -> std::io::Result<LatencyProxy> {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let upstream = upstream.trim_start_matches("nats://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("nats://{}", listener.local_addr()?);
        let latency_us = Arc::new(AtomicU64::new(0));
        let lat = latency_us.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                // Answers: straight through.
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                // Requests: each chunk is written `latency` after it was read,
                // in order.
                let (tx, mut rx) =
                    tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
                let lat = lat.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                let d = Duration::from_micros(lat.load(Ordering::Relaxed));
                                let due = tokio::time::Instant::now() + d;
                                if tx.send((due, buf[..n].to_vec())).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
                tokio::spawn(async move {
                    while let Some((due, bytes)) = rx.recv().await {
                        tokio::time::sleep_until(due).await;
                        if sw.write_all(&bytes).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(LatencyProxy { url, latency_us })
    }

    /// Sets the delay added to every byte sent from now on.
    pub fn set_latency(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.latency_us
            .store(us, std::sync::atomic::Ordering::Relaxed);
    }
}
