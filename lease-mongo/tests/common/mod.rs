//! The test server and the conformance harness shared by this crate's tests.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::Harness;
use lease_core::{BoxFuture, Error, HolderId, LeaseBackend, LeaseKey};
use lease_mongo::{MongoBackend, MongoConfig};
use mongodb::bson::doc;
use mongodb::Client;

/// Where the test server is: `LEASE_TEST_MONGODB_URI` (a real MongoDB, or a
/// SecantusDB started by hand), else the server the conformance crate starts.
pub fn server_uri() -> Result<String, String> {
    if let Ok(uri) = std::env::var("LEASE_TEST_MONGODB_URI") {
        if !uri.is_empty() {
            return Ok(uri);
        }
    }
    lease_conformance::servers::mongo()
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

/// Runs the conformance suite on one collection of the test server.
pub struct MongoHarness {
    uri: String,
    config: MongoConfig,
    admin: Client,
}

impl MongoHarness {
    /// Finds the server and checks that it answers.
    pub async fn start() -> Result<Self, String> {
        let uri = server_uri()?;
        let admin = Client::with_uri_str(&uri)
            .await
            .map_err(|e| format!("bad MongoDB URI {uri}: {e}"))?;
        admin
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await
            .map_err(|e| format!("MongoDB at {uri} does not answer: {e}"))?;
        Ok(MongoHarness {
            uri,
            config: fresh_config(),
            admin,
        })
    }
}

impl Harness for MongoHarness {
    fn name(&self) -> &'static str {
        "mongo"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let b = MongoBackend::connect(&self.uri, self.config.clone()).await?;
            Ok(Arc::new(b) as Arc<dyn LeaseBackend>)
        })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        // Expiry is judged on $$NOW in whole milliseconds, on this machine's
        // clock: a few milliseconds of slack cover the rounding.
        Box::pin(tokio::time::sleep(d + Duration::from_millis(5)))
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        Some(Box::pin(async move {
            self.admin
                .database(&self.config.database)
                .collection::<mongodb::bson::Document>(&self.config.collection)
                .replace_one(
                    doc! { "_id": key.as_str() },
                    doc! { "_id": key.as_str(), "note": "not a lease record" },
                )
                .upsert(true)
                .await
                .map_err(|e| Error::Backend(Box::new(e)))?;
            Ok(())
        }))
    }

    fn model_cases(&self) -> u32 {
        24
    }
}
