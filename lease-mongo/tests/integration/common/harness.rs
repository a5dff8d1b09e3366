//! The conformance and fault-run harness: one collection of a
//! MongoDB-compatible server, reached through a fault proxy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::faults::{FaultHooks, FaultProxy, Launched, ServerControl};
use lease_conformance::Harness;
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_mongo::{MongoBackend, MongoConfig};
use lease_testkit::servers;
use mongodb::bson::doc;
use mongodb::options::{ClientOptions, ServerAddress};
use mongodb::Client;

use super::{fresh_config, server_uri};

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

/// Runs the conformance suite (and fault runs) on one collection of a
/// MongoDB-compatible server.
///
/// Clients connect through a [`FaultProxy`] when the server is a single
/// host, so the suite can add latency; fault runs put their own proxy in
/// front of the server ([`FaultHooks::upstream`]).
pub struct MongoHarness {
    uri: String,
    config: MongoConfig,
    admin: Client,
    upstream: Option<SocketAddr>,
    latency: Option<FaultProxy>,
    server: Option<Launched<servers::Mongo>>,
    /// The private server's wall clock, stepped by clock-jump faults.
    clock: Option<servers::clock::ServerClock>,
}

impl MongoHarness {
    /// On the test process's shared server.
    pub async fn start() -> Result<Self, String> {
        Self::on(server_uri()?, None).await
    }

    /// On a private server this harness can pause, kill, restart and step
    /// the wall clock of (it runs under libfaketime).
    pub async fn private() -> Result<Self, String> {
        let (server, clock) = servers::spawn_mongo_with_clock().map_err(|e| e.to_string())?;
        let uri = server.uri.clone();
        // SecantusDB keeps its data in its storage directory across a restart.
        let mut h = Self::on(uri, Some(Launched::new(server, true))).await?;
        h.clock = Some(clock);
        Ok(h)
    }

    async fn on(uri: String, server: Option<Launched<servers::Mongo>>) -> Result<Self, String> {
        let admin = Client::with_options(options(&uri, None).await.map_err(|e| e.to_string())?)
            .map_err(|e| format!("bad MongoDB URI {uri}: {e}"))?;
        admin
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await
            .map_err(|e| format!("MongoDB at {uri} does not answer: {e}"))?;
        let upstream = single_host(&uri).await;
        let latency = match upstream {
            Some(addr) => Some(
                FaultProxy::start(addr)
                    .await
                    .map_err(|e| format!("cannot start the latency proxy: {e}"))?,
            ),
            None => None,
        };
        Ok(MongoHarness {
            uri,
            config: fresh_config(),
            admin,
            upstream,
            latency,
            server,
            clock: None,
        })
    }

    /// The lease configuration every client of this harness uses.
    pub fn config(&self) -> &MongoConfig {
        &self.config
    }

    async fn connect_via(&self, via: Option<SocketAddr>) -> Result<Arc<dyn LeaseBackend>, Error> {
        let client = Client::with_options(options(&self.uri, via).await?)
            .map_err(|e| Error::Backend(Box::new(e)))?;
        let b = MongoBackend::new(client, self.config.clone()).await?;
        Ok(Arc::new(b) as Arc<dyn LeaseBackend>)
    }
}

impl Harness for MongoHarness {
    fn name(&self) -> &'static str {
        "mongo"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(self.connect_via(self.latency.as_ref().map(FaultProxy::addr)))
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

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        // What an operator's `db.leases.deleteOne({_id: key})` does.
        Some(Box::pin(async move {
            self.admin
                .database(&self.config.database)
                .collection::<mongodb::bson::Document>(&self.config.collection)
                .delete_one(doc! { "_id": key.as_str() })
                .await
                .map_err(|e| Error::Backend(Box::new(e)))?;
            Ok(())
        }))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        match &self.latency {
            Some(p) => {
                p.set_latency(latency);
                true
            }
            None => false,
        }
    }

    fn fault_hooks(&self) -> Option<&dyn FaultHooks> {
        Some(self)
    }

    fn model_cases(&self) -> u32 {
        24
    }
}

impl FaultHooks for MongoHarness {
    fn upstream(&self) -> Option<SocketAddr> {
        self.upstream
    }

    fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>>> {
        Some(Box::pin(self.connect_via(Some(addr))))
    }

    fn server(&self) -> Option<&dyn ServerControl> {
        self.server.as_ref().map(|s| s as &dyn ServerControl)
    }

    fn jump_clock(&self, by: Duration, forward: bool) -> bool {
        self.clock
            .as_ref()
            .is_some_and(|c| c.step(by, forward).is_ok())
    }
}
