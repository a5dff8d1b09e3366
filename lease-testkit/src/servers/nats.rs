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

/// A private nats-server with JetStream and file storage that a test owns
/// whole: it may stop it cleanly, kill it, start it again on the same port
/// and store, cluster it, or give it flags of its own. Killed on drop.
#[derive(Debug)]
pub struct NatsNode {
    /// The server's name (`single`, or `n0`… in a cluster).
    pub name: String,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// Its JetStream store directory.
    pub store: PathBuf,
    managed: Managed,
}

impl NatsNode {
    /// A single server storing under `dir` (in `dir/js`).
    pub fn single(dir: &Path) -> Result<NatsNode, Unavailable> {
        NatsNode::single_with(dir, &[])
    }

    /// A single server storing under `dir`, with extra command-line flags.
    pub fn single_with(dir: &Path, extra: &[String]) -> Result<NatsNode, Unavailable> {
        let store = dir.join("js");
        let port = node_ports(1)?[0];
        let mut args = node_args(port, &store);
        args.extend(extra.iter().cloned());
        NatsNode::start_node("single", port, store, args)
    }

    /// A single server configured by a file: a free port, JetStream
    /// storing under `dir/js`, and `extra` (TLS, accounts, authorization…),
    /// written to `dir/nats.conf`.
    pub fn with_config(dir: &Path, extra: &str) -> Result<NatsNode, Unavailable> {
        let store = dir.join("js");
        let port = node_ports(1)?[0];
        let conf = format!(
            "listen: \"127.0.0.1:{port}\"\nserver_name: lease-test\njetstream {{ store_dir: \"{}\" }}\n{extra}\n",
            store.display()
        );
        let path = dir.join("nats.conf");
        std::fs::write(&path, conf).map_err(|e| {
            Unavailable::new(BACKEND, format!("cannot write {}: {e}", path.display()))
        })?;
        let args = vec!["-c".to_string(), path.display().to_string()];
        NatsNode::start_node("single", port, store, args)
    }

    /// Three clustered servers on loopback, storing under `base/n0`… .
    pub fn cluster3(base: &Path) -> Result<Vec<NatsNode>, Unavailable> {
        let ports = node_ports(6)?;
        let (client, cluster) = ports.split_at(3);
        let routes = cluster
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        (0..3)
            .map(|i| {
                let name = format!("n{i}");
                let store = base.join(&name);
                let mut args = node_args(client[i], &store);
                args.extend([
                    "-n".into(),
                    name.clone(),
                    "--cluster_name".into(),
                    "lease-test".into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{}", cluster[i]),
                    "--routes".into(),
                    routes.clone(),
                ]);
                NatsNode::start_node(&name, client[i], store, args)
            })
            .collect()
    }

    fn start_node(
        name: &str,
        port: u16,
        store: PathBuf,
        args: Vec<String>,
    ) -> Result<NatsNode, Unavailable> {
        let binary = node_binary()?;
        let dir = TempDir::new(&format!("nats-{name}"))
            .map_err(|e| Unavailable::new(BACKEND, format!("cannot prepare nats-server: {e}")))?;
        let spec = args.into_iter().fold(Spec::new(binary), Spec::arg);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let ready = Box::new(move || process::tcp_open(addr));
        let managed = Managed::start(BACKEND, spec, dir, ready)?;
        Ok(NatsNode {
            name: name.to_string(),
            port,
            store,
            managed,
        })
    }

    /// Its client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts it again (same port, store and flags) unless it runs, and
    /// waits until it listens.
    pub fn start(&mut self) -> Result<(), Unavailable> {
        self.managed.start_again()
    }

    /// Kills it (SIGKILL: no clean shutdown).
    pub fn kill(&mut self) {
        self.managed.kill();
    }

    /// Stops it cleanly (SIGTERM) and waits until it has exited.
    pub fn stop(&mut self) {
        self.managed.stop(std::time::Duration::from_secs(10));
    }

    /// The server's log file.
    pub fn log_path(&self) -> &Path {
        self.managed.log()
    }
}

/// `LEASE_NATS_SERVER`, else the provisioned or `PATH`'s nats-server.
fn node_binary() -> Result<PathBuf, Unavailable> {
    if let Some(p) = process_env("LEASE_NATS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    binary().ok_or_else(|| not_found(BACKEND, ENV, WHAT, "nats", NATIVE_ONLY))
}

fn node_ports(n: usize) -> Result<Vec<u16>, Unavailable> {
    process::free_ports(n)
        .map_err(|e| Unavailable::new(BACKEND, format!("no free loopback port: {e}")))
}

fn node_args(port: u16, store: &Path) -> Vec<String> {
    vec![
        "-js".into(),
        "-a".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string(),
        "-sd".into(),
        store.display().to_string(),
    ]
}
