//! PostgreSQL: the harness ([`PostgresHarness`], one table of a
//! PostgreSQL server), and the helpers the PostgreSQL tests share.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::faults::{FaultTuning, Launched};
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_postgres::{PostgresBackend, PostgresConfig};

pub use super::or_panic;
pub use super::unique;
use super::{one_second_tuning, plan, Backend, ServerHarness};
use crate::servers;

/// The PostgreSQL part of the harness: clients of one table.
pub struct Postgres {
    url: String,
    /// The host and port as `url` writes them, replaced by a proxy's.
    written_host: Option<String>,
    config: PostgresConfig,
    admin: tokio_postgres::Client,
}

/// The conformance and fault-run harness on a PostgreSQL server.
pub type PostgresHarness = ServerHarness<Postgres>;

impl ServerHarness<Postgres> {
    /// The fault runs' plans and fault lengths on PostgreSQL.
    pub const FAULT_TUNING: FaultTuning = one_second_tuning(
        plan::<1, 5>,
        "now(), the server's wall clock",
        // A table in the same PostgreSQL, each write admitted by
        // lease-fence's PgFences in the write's own transaction.
        crate::resources::postgres,
    );

    /// On the test process's shared server.
    pub async fn shared() -> Result<Self, String> {
        Self::on(server_url()?, None, None).await
    }

    /// The same harness whose clients keep a statement cache (prepared
    /// statements; a column of the conformance matrix of its own,
    /// `postgres_statement_cache`).
    pub fn with_statement_cache(mut self) -> Self {
        self.backend.config = self.backend.config.clone().statement_cache(true);
        self
    }

    /// On a private server this harness can pause, kill, restart and step
    /// the wall clock of (it runs under libfaketime).
    pub async fn private() -> Result<Self, String> {
        let (server, clock) = servers::spawn_postgres_with_clock().map_err(|e| e.to_string())?;
        let url = server.url.clone();
        // The data directory survives a restart.
        Self::on(url, Some(Launched::new(server, true)), Some(clock)).await
    }

    async fn on(
        url: String,
        server: Option<Launched<servers::Postgres>>,
        clock: Option<servers::clock::ServerClock>,
    ) -> Result<Self, String> {
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
        let postgres = Postgres {
            url,
            written_host: upstream.as_ref().map(|(_, w)| w.clone()),
            config,
            admin,
        };
        ServerHarness::new(postgres, upstream.map(|(a, _)| a), server, clock).await
    }
}

impl Postgres {
    /// The lease configuration every client of this harness uses.
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }
}

impl Backend for Postgres {
    type Server = servers::Postgres;

    fn name(&self) -> &'static str {
        if self.config.statement_cache {
            "postgres_statement_cache"
        } else {
            "postgres"
        }
    }

    fn connect(
        &self,
        via: Option<SocketAddr>,
    ) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let url = match (via, &self.written_host) {
                (Some(addr), Some(written)) => self.url.replacen(written, &addr.to_string(), 1),
                _ => self.url.clone(),
            };
            let config = self.config.clone().request_timeout(Duration::from_secs(2));
            let b = PostgresBackend::connect_lazy(&url, config)?;
            Ok(Arc::new(b) as Arc<dyn LeaseBackend>)
        })
    }

    fn pass(&self, d: Duration) -> Duration {
        // Expiry is judged on the server's now(), on this machine's clock,
        // compared in microseconds: a few milliseconds of slack are plenty.
        d + Duration::from_millis(5)
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
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
        })
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        // What an operator's `DELETE FROM leases WHERE key = …` does.
        Box::pin(async move {
            let sql = format!("DELETE FROM {} WHERE key = $1", self.config.table);
            self.admin
                .execute(&sql, &[&key.as_str()])
                .await
                .map_err(|e| Error::Backend(Box::new(e)))?;
            Ok(())
        })
    }

    fn model_cases(&self) -> u32 {
        24
    }
}

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

/// Where the test server is: `LEASE_TEST_POSTGRES_URL`, else the PostgreSQL
/// [`servers::postgres`] starts (the system's postgresql-15, or the one
/// `cargo xtask provision --backend postgres` unpacked).
pub fn server_url() -> Result<String, String> {
    servers::postgres().map(|p| p.url.clone()).map_err(|e| {
        format!(
            "no PostgreSQL test server: {e}: run `cargo xtask provision --backend postgres` or set LEASE_TEST_POSTGRES_URL"
        )
    })
}

/// The test server's URL; a test without one fails, saying how to get one.
pub fn url() -> String {
    super::or_panic(server_url())
}

/// A config on a table of its own.
pub fn fresh_config() -> PostgresConfig {
    PostgresConfig::new(unique("leases"))
}

/// A backend with its own pool on `config`'s table; a test whose server
/// does not answer fails.
pub async fn backend(url: &str, config: &PostgresConfig) -> PostgresBackend {
    PostgresBackend::connect(url, config.clone())
        .await
        .unwrap_or_else(|e| panic!("connect to the PostgreSQL test server: {e}"))
}

/// A plain client for reaching behind the library's back; a test whose
/// server does not answer fails.
pub async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to the PostgreSQL test server: {e}"));
    tokio::spawn(conn);
    client
}

/// `key`'s row in `table` as the server has it (`row_to_json`), to check
/// that an operation left it byte-identical; a test whose row is missing
/// fails.
pub async fn row_text(client: &tokio_postgres::Client, table: &str, key: &str) -> String {
    client
        .query_one(
            &format!("SELECT row_to_json(t)::text FROM {table} t WHERE key = $1"),
            &[&key],
        )
        .await
        .unwrap_or_else(|e| panic!("the row of {key} in {table}: {e}"))
        .get(0)
}

/// The audit record a break of `key` left in `table`'s audit table; a test
/// without one fails.
pub async fn audit_record(
    client: &tokio_postgres::Client,
    table: &str,
    key: &str,
) -> serde_json::Value {
    let row = client
        .query_one(
            &format!("SELECT record::text FROM {table}_audit WHERE key = $1"),
            &[&key],
        )
        .await
        .unwrap_or_else(|e| panic!("the audit record of {key} in {table}_audit: {e}"));
    serde_json::from_str(row.get::<_, &str>(0))
        .unwrap_or_else(|e| panic!("the audit record of {key} is not JSON: {e}"))
}

/// Writes a row for `key` into `table` as another program (or a bad
/// restore) would: `values` are the SQL values of the columns after the
/// key (format, holder, fence, ttl_ms, expires_at, payload).
pub async fn insert_row(
    client: &impl tokio_postgres::GenericClient,
    table: &str,
    key: &str,
    values: &str,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute(
            &format!(
                "INSERT INTO {table} (key, format, holder, fence, ttl_ms, expires_at, payload) \
                 VALUES ($1, {values})"
            ),
            &[&key],
        )
        .await
}
