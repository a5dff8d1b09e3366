//! The workspace's test servers, and the names `cargo xtask` and the tests
//! agree on.
//!
//! This crate is not published: it is how this workspace's own tests get
//! real servers. A third-party backend needs only `lease-conformance` (the
//! contract, the fault runs and the history checker) and its own way of
//! starting its server.
//!
//! - [`servers`] finds or starts etcd, NATS (JetStream), an S3 server
//!   (moto) and a MongoDB-compatible server (SecantusDB): an endpoint from
//!   the environment, a native binary from [`provision`], or (with the
//!   cargo feature `containers`) a container. Its servers plug into the
//!   suite's process faults through
//!   [`Launched`](lease_conformance::faults::Launched).
//! - `harness` (one cargo feature per backend: `etcd`, `nats`, `s3`,
//!   `mongo`, `postgres`) is each backend's conformance and fault-run
//!   harness and the helpers its tests share, so the backend crates'
//!   tests, and lease-bench, drive the same clients the same way.
//! - `stores` (feature `resources`) wraps an object store so a test can
//!   change what the store does to its requests.
//! - [`provision`] installs those native servers under [`servers_dir`]
//!   (what `cargo xtask provision` runs).
//! - The constants below are the one place each name lives: where the
//!   servers are, which backends have servers, where reports go; the
//!   suite's own (its report, skip and soak variables and the fault rows)
//!   are re-exported from `lease-conformance`.

#![deny(missing_docs)]

use std::fs;
use std::path::{Path, PathBuf};

#[cfg(feature = "harness")]
pub mod harness;
pub mod provision;
#[cfg(feature = "resources")]
pub mod resources;
pub mod servers;
#[cfg(feature = "resources")]
pub mod stores;

pub use lease_conformance::faults::{FAULT_ROWS, FAULT_ROW_PREFIX, SOAK_ENV};
pub use lease_conformance::{skip_allowed, REPORT_ENV, SKIP_ENV};

/// Environment variable: where the provisioned native servers are (default
/// `<workspace>/target/lease-servers`).
pub const SERVERS_DIR_ENV: &str = "LEASE_SERVERS_DIR";

/// The backends that need a test server, in provisioning order (the fake
/// needs none).
pub const SERVER_BACKENDS: [&str; 6] = ["etcd", "nats", "s3", "mongo", "postgres", "redis"];

/// The directory under `<workspace>/target` where `cargo xtask conformance`
/// collects the reports the tests write (one subdirectory per run).
pub const REPORT_DIR_NAME: &str = "conformance-report";

/// The workspace root (this crate lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `$LEASE_SERVERS_DIR`, or `<workspace>/target/lease-servers` (where
/// `cargo xtask provision` puts the servers).
pub fn servers_dir() -> PathBuf {
    match std::env::var_os(SERVERS_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join("target").join("lease-servers"),
    }
}

/// `<workspace>/target/conformance-report`: the parent of every run's
/// report directory.
pub fn report_root() -> PathBuf {
    workspace_root().join("target").join(REPORT_DIR_NAME)
}

/// The first executable file called `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// True when `path` is an executable file.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod fault_control;
