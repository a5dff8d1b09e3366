//! MongoDB: the harness ([`MongoHarness`], one collection of a
//! MongoDB-compatible server), and the helpers the MongoDB tests share.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::faults::{FaultTuning, Launched};
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_mongo::{MongoBackend, MongoConfig};
use mongodb::bson::doc;
use mongodb::options::{ClientOptions, ServerAddress};
use mongodb::Client;

pub use super::or_panic;
pub use super::unique;
use super::{one_second_tuning, plan, Backend, ServerHarness};
use crate::servers;

/// The MongoDB part of the harness: clients of one collection.
pub struct Mongo {
    uri: String,
    config: MongoConfig,
    admin: Client,
}

/// The conformance and fault-run harness on a MongoDB-compatible server.
pub type MongoHarness = ServerHarness<Mongo>;

impl ServerHarness<Mongo> {
    /// The fault runs' plans and fault lengths on MongoDB.
    pub const FAULT_TUNING: FaultTuning = one_second_tuning(
        plan::<1, 5>,
        "$$NOW, the server's wall clock",
        crate::resources::in_memory_store,
    );

    /// On the test process's shared server.
    pub async fn shared() -> Result<Self, String> {
        Self::on(server_uri()?, None, None).await
    }

    /// On a private server this harness can pause, kill, restart and step
    /// the wall clock of (it runs under libfaketime).
    pub async fn private() -> Result<Self, String> {
        let (server, clock) = servers::spawn_mongo_with_clock().map_err(|e| e.to_string())?;
        let uri = server.uri.clone();
        // SecantusDB keeps its data in its storage directory across a restart.
        Self::on(uri, Some(Launched::new(server, true)), Some(clock)).await
    }

    async fn on(
        uri: String,
        server: Option<Launched<servers::Mongo>>,
        clock: Option<servers::clock::ServerClock>,
    ) -> Result<Self, String> {
        let admin = Client::with_options(options(&uri, None).await.map_err(|e| e.to_string())?)
            .map_err(|e| format!("bad MongoDB URI {uri}: {e}"))?;
        admin
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await
            .map_err(|e| format!("MongoDB at {uri} does not answer: {e}"))?;
        let upstream = single_host(&uri).await;
        let mongo = Mongo {
            uri,
            config: fresh_config(),
            admin,
        };
        ServerHarness::new(mongo, upstream, server, clock).await
    }
}

impl Mongo {
    /// The lease configuration every client of this harness uses.
    pub fn config(&self) -> &MongoConfig {
        &self.config
    }

    fn collection(&self) -> mongodb::Collection<mongodb::bson::Document> {
        self.admin
            .database(&self.config.database)
            .collection(&self.config.collection)
    }
}

impl Backend for Mongo {
    type Server = servers::Mongo;

    fn name(&self) -> &'static str {
        "mongo"
    }

    fn connect(
        &self,
        via: Option<SocketAddr>,
    ) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let client = Client::with_options(options(&self.uri, via).await?)
                .map_err(|e| Error::Backend(Box::new(e)))?;
            let b = MongoBackend::new(client, self.config.clone()).await?;
            Ok(Arc::new(b) as Arc<dyn LeaseBackend>)
        })
    }

    fn pass(&self, d: Duration) -> Duration {
        // Expiry is judged on $$NOW in whole milliseconds, on this machine's
        // clock: a few milliseconds of slack cover the rounding.
        d + Duration::from_millis(5)
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.collection()
                .replace_one(
                    doc! { "_id": key.as_str() },
                    doc! { "_id": key.as_str(), "note": "not a lease record" },
                )
                .upsert(true)
                .await
                .map_err(|e| Error::Backend(Box::new(e)))?;
            Ok(())
        })
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        // What an operator's `db.leases.deleteOne({_id: key})` does.
        Box::pin(async move {
            self.collection()
                .delete_one(doc! { "_id": key.as_str() })
                .await
                .map_err(|e| Error::Backend(Box::new(e)))?;
            Ok(())
        })
    }

    fn model_cases(&self) -> u32 {
        24
    }
}

/// Client options for `uri`, sent to `addr` instead (a proxy) when given.
async fn options(uri: &str, via: Option<SocketAddr>) -> Result<ClientOptions, Error> {
    let mut o = ClientOptions::parse(uri)
        .await
        .map_err(|e| Error::Backend(Box::new(e)))?;
    if let Some(addr) = via {
        o.hosts = vec![ServerAddress::Tcp {
            host: addr.ip().to_string(),
            port: Some(addr.port()),
        }];
        o.direct_connection = Some(true);
    }
    // Fail fast when a fault swallows the server: a lease answer later than
    // a few seconds is useless anyway.
    o.server_selection_timeout = Some(Duration::from_secs(5));
    Ok(o)
}

/// The single TCP address behind `uri`, if it names exactly one host.
async fn single_host(uri: &str) -> Option<SocketAddr> {
    let o = ClientOptions::parse(uri).await.ok()?;
    match o.hosts.as_slice() {
        [ServerAddress::Tcp { host, port }] => {
            tokio::net::lookup_host((host.as_str(), port.unwrap_or(27017)))
                .await
                .ok()?
                .next()
        }
        _ => None,
    }
}

/// Where the test server is: `LEASE_TEST_MONGODB_URI` (a real MongoDB, or a
/// SecantusDB started by hand), else the SecantusDB [`servers::mongo`]
/// starts from `cargo xtask provision --backend mongo`.
pub fn server_uri() -> Result<String, String> {
    servers::mongo().map(|m| m.uri.clone()).map_err(|e| {
        format!(
            "no MongoDB test server: {e}: run `cargo xtask provision --backend mongo` or set LEASE_TEST_MONGODB_URI"
        )
    })
}

/// A config on a collection of its own.
pub fn fresh_config() -> MongoConfig {
    MongoConfig::new("lease_test").collection(unique("leases"))
}

/// The test server's URI; a test without one fails, saying how to get one.
pub fn uri() -> String {
    super::or_panic(server_uri())
}

/// A backend with its own client on `config`'s collection; a test whose
/// server does not answer fails.
pub async fn backend(uri: &str, config: &MongoConfig) -> MongoBackend {
    MongoBackend::connect(uri, config.clone())
        .await
        .unwrap_or_else(|e| panic!("connect to the MongoDB test server: {e}"))
}
