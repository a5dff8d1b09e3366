//! The conformance and fault-run harness: one table of a PostgreSQL
//! server, reached through a fault proxy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::faults::{FaultHooks, FaultProxy, Launched, ServerControl};
use lease_conformance::Harness;
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_postgres::{PostgresBackend, PostgresConfig};
use lease_testkit::servers;

use super::{fresh_config, server_url};

/// The single TCP address of `url`'s host, with the `host:port` text it
/// was written as.
async fn single_host(url: &str) -> Option<(SocketAddr, String)> {
    let config: tokio_postgres::Config = url.parse().ok()?;
    let host = match config.get_hosts() {
        [tokio_postgres::config::Host::Tcp(h)] => h.clone(),
        _ => return None,
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .ok()?
        .next()?;
    Some((addr, format!("{host}:{port}")))
}

/// Runs the conformance suite (and fault runs) on one table of a PostgreSQL
/// server.
pub struct PostgresHarness {
    url: String,
    config: PostgresConfig,
    admin: tokio_postgres::Client,
    upstream: Option<(SocketAddr, String)>,
    latency: Option<FaultProxy>,
    server: Option<Launched<servers::Postgres>>,
    /// The private server's wall clock, stepped by clock-jump faults.
    clock: Option<servers::clock::ServerClock>,
}

impl PostgresHarness {
    /// On the test process's shared server.
    pub async fn start() -> Result<Self, String> {
        Self::on(server_url()?, None).await
    }

    /// On a private server this harness can pause, kill, restart and step
    /// the wall clock of (it runs under libfaketime).
    pub async fn private() -> Result<Self, String> {
        let (server, clock) = servers::spawn_postgres_with_clock().map_err(|e| e.to_string())?;
        let url = server.url.clone();
        // The data directory survives a restart.
        let mut h = Self::on(url, Some(Launched::new(server, true))).await?;
        h.clock = Some(clock);
        Ok(h)
    }

    async fn on(url: String, server: Option<Launched<servers::Postgres>>) -> Result<Self, String> {
        let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("PostgreSQL at {url} does not answer: {e}"))?;
        tokio::spawn(conn);
        let config = fresh_config();
        // Create the table once, so the clients the suite opens at once do
        // not all race to.
        PostgresBackend::connect(&url, config.clone())
            .await
            .map_err(|e| format!("cannot create the lease table: {e}"))?;
        let upstream = single_host(&url).await;
        let latency = match &upstream {
            Some((addr, _)) => Some(
                FaultProxy::start(*addr)
                    .await
                    .map_err(|e| format!("cannot start the latency proxy: {e}"))?,
            ),
            None => None,
        };
        Ok(PostgresHarness {
            url,
            config,
            admin,
            upstream,
            latency,
            server,
            clock: None,
        })
    }

    /// The lease configuration every client of this harness uses.
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    async fn connect_via(&self, via: Option<SocketAddr>) -> Result<Arc<dyn LeaseBackend>, Error> {
        let url = match (via, &self.upstream) {
            (Some(addr), Some((_, written))) => self.url.replacen(written, &addr.to_string(), 1),
            _ => self.url.clone(),
        };
        let config = self.config.clone().request_timeout(Duration::from_secs(2));
        let b = PostgresBackend::connect_lazy(&url, config)?;
        Ok(Arc::new(b) as Arc<dyn LeaseBackend>)
    }
}

impl Harness for PostgresHarness {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(self.connect_via(self.latency.as_ref().map(FaultProxy::addr)))
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        // Expiry is judged on the server's now(), on this machine's clock,
        // compared in microseconds: a few milliseconds of slack are plenty.
        Box::pin(tokio::time::sleep(d + Duration::from_millis(5)))
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        Some(Box::pin(async move {
            let sql = format!(
                "INSERT INTO {t} (key, format, holder, fence, ttl_ms, expires_at, payload) \
                 VALUES ($1, 'not a lease record', 'no holder here', -1, 0, NULL, 'garbage') \
                 ON CONFLICT (key) DO UPDATE SET format = EXCLUDED.format, holder = EXCLUDED.holder, \
                 fence = EXCLUDED.fence, ttl_ms = EXCLUDED.ttl_ms, expires_at = NULL, \
                 payload = EXCLUDED.payload",
                t = self.config.table
            );
            self.admin
                .execute(&sql, &[&key.as_str()])
                .await
                .map_err(|e| Error::Backend(Box::new(e)))?;
            Ok(())
        }))
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        // What an operator's `DELETE FROM leases WHERE key = …` does.
        Some(Box::pin(async move {
            let sql = format!("DELETE FROM {} WHERE key = $1", self.config.table);
            self.admin
                .execute(&sql, &[&key.as_str()])
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

impl FaultHooks for PostgresHarness {
    fn upstream(&self) -> Option<SocketAddr> {
        self.upstream.as_ref().map(|(a, _)| *a)
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
