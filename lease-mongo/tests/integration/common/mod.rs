//! The test server and helpers shared by this crate's tests; the conformance
//! and fault-run harness is in [`harness`].

#![allow(dead_code)]

pub mod harness;

use lease_core::HolderId;
use lease_mongo::{MongoBackend, MongoConfig};
use lease_testkit::servers;

/// Where the test server is: `LEASE_TEST_MONGODB_URI` (a real MongoDB, or a
/// SecantusDB started by hand), else the SecantusDB the conformance crate
/// starts from `cargo xtask provision --backend mongo`.
pub fn server_uri() -> Result<String, String> {
    servers::mongo()
        .map(|m| m.uri.clone())
        .map_err(|e| format!("no MongoDB test server: {e}"))
}

/// The test server's URI, or a test failure saying how to get one.
pub fn uri() -> String {
    match server_uri() {
        Ok(uri) => uri,
        Err(e) => {
            panic!("{e}: run `cargo xtask provision --backend mongo` or set LEASE_TEST_MONGODB_URI")
        }
    }
}

/// A name no other test (or test process) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", &HolderId::random().as_str()[..16])
}

/// A config on a collection of its own.
pub fn fresh_config() -> MongoConfig {
    MongoConfig::new("lease_test").collection(unique("leases"))
}

/// A backend with its own client on `config`'s collection.
pub async fn backend(uri: &str, config: &MongoConfig) -> MongoBackend {
    MongoBackend::connect(uri, config.clone())
        .await
        .expect("connect to the MongoDB test server")
}
