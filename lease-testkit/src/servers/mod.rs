//! Test servers for the backends' tests: etcd, NATS (JetStream), an S3
//! server (moto), a MongoDB-compatible server (SecantusDB) and PostgreSQL
//! 15 (see [`postgres()`]: it runs as `nobody` when the tests run as root)
//! and Redis 7 (see [`redis()`] and [`RedisOptions`]).
//!
//! Each server comes from, in order:
//! 1. an endpoint in the environment (`LEASE_TEST_ETCD_ENDPOINTS`,
//!    `LEASE_TEST_NATS_URL`, `LEASE_TEST_S3_ENDPOINT` with
//!    `LEASE_TEST_S3_BUCKET`, `LEASE_TEST_S3_REGION`, `AWS_ACCESS_KEY_ID`,
//!    `AWS_SECRET_ACCESS_KEY`, `LEASE_TEST_MONGODB_URI` and
//!    `LEASE_TEST_POSTGRES_URL` and `LEASE_TEST_REDIS_URL`);
//! 2. a native binary in `$LEASE_SERVERS_DIR` (default
//!    `<workspace>/target/lease-servers`, filled by `cargo xtask provision`),
//!    then on `PATH`, started on a free loopback port with a fresh
//!    temporary data directory;
//! 3. for the shared servers only, with the cargo feature `containers`
//!    (off by default): a container from the upstream image
//!    (`quay.io/coreos/etcd`, `nats` with `-js`, `minio/minio`, `mongo`)
//!    started with testcontainers where a Docker engine answers, its ports
//!    mapped to the host and waited for as the native path waits. Enable
//!    it from any crate with `cargo test --features
//!    lease-testkit/containers`. **This path has never run against a
//!    real Docker engine in this project's CI: none exists on its
//!    machines.** Only its failure when Docker does not answer is tested.
//!    testcontainers-rs has no Ryuk reaper; the containers are removed
//!    when the test process exits normally (see `container.rs`), and a
//!    process killed by a signal leaves them running, labelled
//!    `lease-testkit.pid`.
//!
//! When none of these gives a server, the `Unavailable` reason names what
//! was looked for, why the container fallback did not give one (disabled,
//! or on: no Docker engine answered, or the container failed) and how to
//! provision a native server. A server from a container, like one from an
//! endpoint, is not managed by the harness: `kill`, `restart`, `pause` and
//! `resume` answer `Unavailable`.
//!
//! [`etcd()`], [`nats()`], [`s3()`] and [`mongo()`] give one shared server per test
//! process, started on first use and killed when the process exits (the
//! child gets `PR_SET_PDEATHSIG(SIGKILL)` from a spawner thread that never
//! exits, and sits in its own process group). [`spawn_etcd`],
//! [`spawn_nats`], [`spawn_s3`] and [`spawn_mongo`] give private servers,
//! killed on drop, that a test may kill, restart, pause and resume.

use std::fmt;
use std::path::PathBuf;

pub mod clock;
mod container;
mod etcd;
mod mongo;
mod nats;
pub mod pki;
mod postgres;
mod process;
mod redis;
mod s3;
mod sigv4;

pub use etcd::{etcd, spawn_etcd, spawn_etcd_cluster, Etcd, EtcdMember, ServerTls};
pub use mongo::{mongo, spawn_mongo, spawn_mongo_with_clock, Mongo};
pub use nats::{nats, spawn_nats, Nats, NatsNode};
pub use postgres::{
    postgres, spawn_postgres, spawn_postgres_tls, spawn_postgres_with_clock, Postgres,
};
pub use process::TempDir;
pub use redis::{redis, spawn_redis, Redis, RedisOptions};
pub use s3::{s3, spawn_s3, S3};

pub use crate::servers_dir;

/// A test server could not be had; `reason` says why and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// `etcd`, `nats`, `s3`, `mongo`, `postgres` or `redis`.
    pub backend: &'static str,
    /// What went wrong, with the log path and what to do where useful.
    pub reason: String,
}

impl Unavailable {
    /// An `Unavailable` for `backend` with `reason`.
    pub fn new(backend: &'static str, reason: impl Into<String>) -> Unavailable {
        Unavailable {
            backend,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} test server unavailable: {}",
            self.backend, self.reason
        )
    }
}

impl std::error::Error for Unavailable {}

/// The server, or `None` when it could not be had and its backend is in
/// `LEASE_TEST_SKIP` (saying so on stderr); a test fails otherwise, with
/// the reason.
pub fn or_skip<T>(server: Result<T, Unavailable>) -> Option<T> {
    match server {
        Ok(s) => Some(s),
        Err(e) if crate::skip_allowed(e.backend) => {
            eprintln!("SKIPPED ({} in LEASE_TEST_SKIP): {e}", e.backend);
            None
        }
        Err(e) => panic!("{e} (or set LEASE_TEST_SKIP={})", e.backend),
    }
}

/// Where a test server came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An endpoint given in this environment variable.
    Env(&'static str),
    /// A native binary (for moto: the Python interpreter) started by us.
    Native(PathBuf),
    /// A container image (`name:tag`) started by the harness.
    Container(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Env(var) => write!(f, "env {var}"),
            Source::Native(path) => write!(f, "native {}", path.display()),
            Source::Container(image) => write!(f, "container {image}"),
        }
    }
}

/// Reads a variable; empty counts as unset. Abstracted so tests can check
/// the environment path without touching the process environment.
pub(crate) type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A native binary: `<servers_dir>/<rel>` if executable, else `name` on
/// `PATH`.
pub(crate) fn find_native(rel: &str, name: &str) -> Option<PathBuf> {
    let cached = servers_dir().join(rel);
    if crate::is_executable(&cached) {
        return Some(cached);
    }
    crate::which(name)
}

/// `LD_LIBRARY_PATH` for a server binary `bin` that `cargo xtask provision`
/// unpacked under `<servers_dir>/<dir>` (the libraries a minimal system
/// lacks are unpacked beside it); `None` for any other binary.
pub(crate) fn unpacked_library_path(dir: &str, bin: &std::path::Path) -> Option<String> {
    let root = servers_dir().join(dir);
    if !bin.starts_with(&root) {
        return None;
    }
    crate::provision::library_path(&root)
}

/// The reason given when neither an endpoint nor a binary was found;
/// `fallback` says why no container gave one either.
pub(crate) fn not_found(
    backend: &'static str,
    env: &str,
    what: &str,
    provision: &str,
    fallback: &str,
) -> Unavailable {
    Unavailable::new(
        backend,
        format!(
            "no endpoint in {env} and no {what} in {} or on PATH; {fallback}; \
             run `cargo xtask provision --backend {provision}`",
            servers_dir().display()
        ),
    )
}

/// The `fallback` of [`not_found`] for the private `spawn_*` servers.
pub(crate) const NATIVE_ONLY: &str =
    "private servers (which a test may kill, restart and pause) are native only";

/// Step 3 for a shared server: the container, or the full reason.
pub(crate) fn from_container(
    req: container::Request,
    ready: &(dyn Fn(&container::Started) -> bool + Sync),
    env: &str,
    what: &str,
    provision: &str,
) -> Result<container::Started, Unavailable> {
    let backend = req.backend;
    container::start(req, ready).map_err(|u| not_found(backend, env, what, provision, &u.reason))
}

/// Prints once per process which source a shared server came from.
pub(crate) fn announce(backend: &str, source: &Source, at: &str) {
    eprintln!("lease-testkit: {backend} from {source} ({at})");
}

/// Control methods for servers the harness started; a server from an
/// environment endpoint is not ours to control and answers `Unavailable`.
macro_rules! impl_control {
    ($ty:ident, $backend:literal) => {
        impl $ty {
            fn managed_mut(
                &mut self,
            ) -> Result<&mut $crate::servers::process::Managed, $crate::servers::Unavailable> {
                let source = &self.source;
                self.managed.as_mut().ok_or_else(|| {
                    $crate::servers::Unavailable::new(
                        $backend,
                        format!("the server from {source} is not managed by the harness"),
                    )
                })
            }

            fn managed_ref(
                &self,
            ) -> Result<&$crate::servers::process::Managed, $crate::servers::Unavailable> {
                self.managed.as_ref().ok_or_else(|| {
                    $crate::servers::Unavailable::new(
                        $backend,
                        format!(
                            "the server from {} is not managed by the harness",
                            self.source
                        ),
                    )
                })
            }

            /// The server's process id (None when not running or not ours).
            pub fn pid(&self) -> Option<u32> {
                self.managed.as_ref().and_then(|m| m.pid())
            }

            /// Kills the server (SIGKILL to its process group) and reaps it.
            pub fn kill(&mut self) -> Result<(), $crate::servers::Unavailable> {
                self.managed_mut()?.kill();
                Ok(())
            }

            /// Starts the server again (killing it first if it runs) with the
            /// same ports and the same data directory; waits until it answers.
            pub fn restart(&mut self) -> Result<(), $crate::servers::Unavailable> {
                self.managed_mut()?.restart()
            }

            /// Freezes the server (SIGSTOP to its process group).
            pub fn pause(&self) -> Result<(), $crate::servers::Unavailable> {
                self.managed_ref()?.signal(libc::SIGSTOP)
            }

            /// Thaws a paused server (SIGCONT).
            pub fn resume(&self) -> Result<(), $crate::servers::Unavailable> {
                self.managed_ref()?.signal(libc::SIGCONT)
            }

            /// The server's log file (stdout and stderr), when ours.
            pub fn log_path(&self) -> Option<&std::path::Path> {
                self.managed.as_ref().map(|m| m.log())
            }
        }

        /// What the suite's `Launched` drives in a fault run.
        impl lease_conformance::faults::ServerProcess for $ty {
            fn pause(&self) -> Result<(), String> {
                $ty::pause(self).map_err(|e| e.to_string())
            }
            fn resume(&self) -> Result<(), String> {
                $ty::resume(self).map_err(|e| e.to_string())
            }
            fn kill(&mut self) -> Result<(), String> {
                $ty::kill(self).map_err(|e| e.to_string())
            }
            fn restart(&mut self) -> Result<(), String> {
                $ty::restart(self).map_err(|e| e.to_string())
            }
        }
    };
}
pub(crate) use impl_control;

#[cfg(test)]
mod tests;
