//! The third source of a shared test server: a container from the upstream
//! image, started with testcontainers where a Docker engine answers. Only
//! with the cargo feature `containers` (off by default, so the default build
//! does not compile testcontainers and bollard); without it [`start`] says
//! the fallback is disabled and how to enable it.
//!
//! **Never run against a real Docker engine in this project's CI**: the
//! machines it was written on have no Docker daemon, so only the path where
//! Docker does not answer has been exercised (the `container_*` tests in
//! `tests.rs`). The image tags were chosen, not pulled.
//!
//! Lifetime: testcontainers-rs 0.28 has no Ryuk reaper (unlike the Java and
//! Go libraries); a `Container` stops and removes itself when dropped, but
//! statics are never dropped. So the started containers are held in a
//! static here and dropped (stopped and removed) from an `atexit` handler
//! when the test process exits normally. A test process killed by a
//! signal leaves its containers running; each carries the label
//! `lease-testkit.pid=<pid>`, so
//! `docker rm -f $(docker ps -aq --filter label=lease-testkit.pid)`
//! removes them.

#[cfg(not(feature = "containers"))]
use super::Unavailable;

/// What to run: an upstream image, the container ports to map to the host,
/// the command (arguments after the image's entrypoint) and environment.
#[cfg_attr(not(feature = "containers"), allow(dead_code))]
pub(crate) struct Request {
    pub(crate) backend: &'static str,
    /// Image name without tag, e.g. `quay.io/coreos/etcd`.
    pub(crate) image: &'static str,
    pub(crate) tag: &'static str,
    /// Container ports (TCP), mapped to free host ports.
    pub(crate) ports: &'static [u16],
    pub(crate) cmd: Vec<String>,
    pub(crate) env: Vec<(&'static str, String)>,
}

impl Request {
    /// `image:tag`, as put in `Source::Container`.
    pub(crate) fn reference(&self) -> String {
        format!("{}:{}", self.image, self.tag)
    }
}

/// A started container: where its mapped ports are reachable.
#[cfg_attr(not(feature = "containers"), allow(dead_code))]
pub(crate) struct Started {
    /// Host the mapped ports are on (`localhost` for a local engine).
    pub(crate) host: String,
    /// Host ports, in the order of [`Request::ports`].
    pub(crate) ports: Vec<u16>,
}

/// Why the fallback was not tried, for the reason of an `Unavailable`
/// when neither an endpoint nor a native binary was found.
#[cfg(not(feature = "containers"))]
pub(crate) fn start(
    req: Request,
    _ready: &(dyn Fn(&Started) -> bool + Sync),
) -> Result<Started, Unavailable> {
    Err(Unavailable::new(
        req.backend,
        format!(
            "the container fallback is disabled (build with \
             `--features lease-testkit/containers` to start {} where a Docker engine answers)",
            req.reference()
        ),
    ))
}

#[cfg(feature = "containers")]
pub(crate) use enabled::start;

#[cfg(feature = "containers")]
mod enabled {
    use std::sync::{Mutex, OnceLock};
    use std::time::{Duration, Instant};

    use testcontainers::core::IntoContainerPort;
    use testcontainers::runners::SyncRunner;
    use testcontainers::{Container, GenericImage, ImageExt};

    use super::{Request, Started};
    use crate::servers::process::READY_TIMEOUT;
    use crate::servers::Unavailable;

    /// Time allowed for pulling an image and creating the container, on
    /// top of [`READY_TIMEOUT`] for the server to answer.
    const PULL_TIMEOUT: Duration = Duration::from_secs(300);

    /// The shared servers' containers, kept for the whole process and
    /// removed at exit (see the module docs).
    static HELD: Mutex<Vec<Container<GenericImage>>> = Mutex::new(Vec::new());

    /// Starts `req`'s container, maps its ports and waits until `ready`
    /// answers true. Runs on its own thread: testcontainers' blocking
    /// runner owns a tokio runtime, and the caller may be inside another
    /// one (an async test), where a nested `block_on` would panic.
    pub(crate) fn start(
        req: Request,
        ready: &(dyn Fn(&Started) -> bool + Sync),
    ) -> Result<Started, Unavailable> {
        let backend = req.backend;
        std::thread::scope(|s| {
            s.spawn(|| start_here(req, ready))
                .join()
                .unwrap_or_else(|_| {
                    Err(Unavailable::new(
                        backend,
                        "the container fallback panicked (see the test output)",
                    ))
                })
        })
    }

    fn start_here(
        req: Request,
        ready: &(dyn Fn(&Started) -> bool + Sync),
    ) -> Result<Started, Unavailable> {
        let reference = req.reference();
        let fail = |what: String| {
            Unavailable::new(
                req.backend,
                format!("the container fallback ({reference}) failed: {what}"),
            )
        };
        let mut image = GenericImage::new(req.image, req.tag);
        for port in req.ports {
            image = image.with_exposed_port(port.tcp());
        }
        let mut request = image
            .with_cmd(req.cmd.iter().cloned())
            .with_label("lease-testkit.pid", std::process::id().to_string())
            .with_startup_timeout(PULL_TIMEOUT);
        for (k, v) in &req.env {
            request = request.with_env_var(*k, v.clone());
        }
        let container = request.start().map_err(|e| fail(describe(&e)))?;
        // From here on the container is held (and removed at exit) even if
        // it never becomes ready, so that it does not outlive the process.
        let host = container
            .get_host()
            .map(|h| h.to_string())
            .map_err(|e| fail(format!("no host for the mapped ports: {e}")));
        let ports = req
            .ports
            .iter()
            .map(|p| container.get_host_port_ipv4(p.tcp()))
            .collect::<Result<Vec<u16>, _>>()
            .map_err(|e| fail(format!("a port was not mapped: {e}")));
        let id = container.id().to_string();
        hold(container);
        let started = Started {
            host: host?,
            ports: ports?,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        while !ready(&started) {
            if Instant::now() >= deadline {
                return Err(fail(format!(
                    "container {id} did not answer within {READY_TIMEOUT:?} on {}:{:?} \
                     (see `docker logs {id}`)",
                    started.host, started.ports
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(started)
    }

    /// Says plainly when no Docker engine answered, else quotes
    /// testcontainers' error.
    fn describe(e: &testcontainers::TestcontainersError) -> String {
        let text = e.to_string();
        let mut chain = text.clone();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            chain.push_str(": ");
            chain.push_str(&s.to_string());
            source = s.source();
        }
        let lower = chain.to_lowercase();
        let no_engine = [
            "socket not found",
            "no such file or directory",
            "connection refused",
            "error trying to connect",
            "failed to initialize a docker client",
            "client error (connect)",
        ]
        .iter()
        .any(|needle| lower.contains(needle));
        let host = std::env::var("DOCKER_HOST")
            .ok()
            .filter(|h| !h.trim().is_empty())
            .unwrap_or_else(|| "unix:///var/run/docker.sock (DOCKER_HOST unset)".to_string());
        if no_engine {
            format!("no Docker engine answered at {host}: {chain}")
        } else {
            format!("testcontainers could not start it (Docker host {host}): {chain}")
        }
    }

    fn hold(container: Container<GenericImage>) {
        static REGISTERED: OnceLock<()> = OnceLock::new();
        REGISTERED.get_or_init(|| {
            // SAFETY: registering a plain extern "C" function with no
            // captures.
            unsafe {
                libc::atexit(remove_at_exit);
            }
        });
        if let Ok(mut held) = HELD.lock() {
            held.push(container);
        }
    }

    /// Drops the held containers: testcontainers stops and removes each.
    extern "C" fn remove_at_exit() {
        let _ = std::panic::catch_unwind(|| {
            let taken = match HELD.try_lock() {
                Ok(mut held) => std::mem::take(&mut *held),
                Err(_) => return,
            };
            drop(taken);
        });
    }
}

/// The first address `host:port` resolves to.
pub(crate) fn addr(host: &str, port: u16) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    // An IPv6 host comes bracketed from `url::Host`'s Display.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port).to_socket_addrs().ok()?.next()
}
