//! The test server and helpers shared by this crate's tests; the conformance
//! and fault-run harness is in [`harness`].

#![allow(dead_code)]

pub mod harness;

use lease_core::HolderId;
use lease_postgres::{PostgresBackend, PostgresConfig};
use lease_testkit::servers;

/// Where the test server is: `LEASE_TEST_POSTGRES_URL`, else the PostgreSQL
/// the test kit starts (the system's postgresql-15, or the one
/// `cargo xtask provision --backend postgres` unpacked).
pub fn server_url() -> Result<String, String> {
    servers::postgres()
        .map(|p| p.url.clone())
        .map_err(|e| format!("no PostgreSQL test server: {e}"))
}

/// The test server's URL, or a test failure saying how to get one.
pub fn url() -> String {
    match server_url() {
        Ok(url) => url,
        Err(e) => panic!(
            "{e}: run `cargo xtask provision --backend postgres` or set LEASE_TEST_POSTGRES_URL"
        ),
    }
}

/// A name no other test (or test process) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", &HolderId::random().as_str()[..16])
}

/// A config on a table of its own.
pub fn fresh_config() -> PostgresConfig {
    PostgresConfig::new(unique("leases"))
}

/// A backend with its own pool on `config`'s table.
pub async fn backend(url: &str, config: &PostgresConfig) -> PostgresBackend {
    PostgresBackend::connect(url, config.clone())
        .await
        .expect("connect to the PostgreSQL test server")
}

/// A plain client for reaching behind the library's back.
pub async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the PostgreSQL test server");
    tokio::spawn(conn);
    client
}
