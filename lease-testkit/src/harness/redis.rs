//! Redis: the harness ([`RedisHarness`], one key prefix of a Redis
//! server), and the helpers the Redis tests share.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::faults::{FaultTuning, Launched};
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_redis::{RedisBackend, RedisConfig};
use redis::aio::MultiplexedConnection;

pub use super::or_panic;
pub use super::unique;
use super::{one_second_tuning, plan, socket_addr, Backend, ServerHarness};
use crate::servers::{self, RedisOptions};

/// The Redis part of the harness: clients of one key prefix.
pub struct Redis {
    url: String,
    /// The host and port as `url` writes them, replaced by a proxy's.
    written_host: String,
    config: RedisConfig,
    admin: MultiplexedConnection,
}

/// The conformance and fault-run harness on a Redis server.
pub type RedisHarness = ServerHarness<Redis>;

impl ServerHarness<Redis> {
    /// The fault runs' plans and fault lengths on Redis.
    pub const FAULT_TUNING: FaultTuning = one_second_tuning(
        plan::<1, 5>,
        "PX expiry, on the server's wall clock",
        crate::resources::in_memory_store,
    );

    /// On the test process's shared server.
    pub async fn shared() -> Result<Self, String> {
        Self::on(server_url()?, None, None).await
    }

    /// On a private server (appendonly yes, appendfsync always) this
    /// harness can pause, kill, restart and step the wall clock of (it runs
    /// under libfaketime).
    pub async fn private() -> Result<Self, String> {
        let (server, clock) = RedisOptions::new()
            .spawn_with_clock()
            .map_err(|e| e.to_string())?;
        let url = server.url.clone();
        // The append-only file survives a restart.
        Self::on(url, Some(Launched::new(server, true)), Some(clock)).await
    }

    async fn on(
        url: String,
        server: Option<Launched<servers::Redis>>,
        clock: Option<servers::clock::ServerClock>,
    ) -> Result<Self, String> {
        let admin = admin(&url).await?;
        let written_host = host_port(&url);
        let upstream = socket_addr(&written_host)?;
        let redis = Redis {
            url,
            written_host,
            config: fresh_config(),
            admin,
        };
        ServerHarness::new(redis, Some(upstream), server, clock).await
    }
}

impl Redis {
    /// The lease configuration every client of this harness uses.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A plain connection to the server, behind the library's back.
    pub fn admin(&self) -> MultiplexedConnection {
        self.admin.clone()
    }
}

impl Backend for Redis {
    type Server = servers::Redis;

    fn name(&self) -> &'static str {
        "redis"
    }

    fn connect(
        &self,
        via: Option<SocketAddr>,
    ) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let url = match via {
                Some(addr) => self.url.replacen(&self.written_host, &addr.to_string(), 1),
                None => self.url.clone(),
            };
            let config = self
                .config
                .clone()
                .request_timeout(Duration::from_secs(2))
                .connect_timeout(Duration::from_secs(2));
            let b = RedisBackend::connect(&url, config).await?;
            Ok(Arc::new(b) as Arc<dyn LeaseBackend>)
        })
    }

    fn pass(&self, d: Duration) -> Duration {
        // A key past its PX is gone for every command at once (expired keys
        // are judged on access, on the server's clock, in milliseconds).
        d + Duration::from_millis(5)
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        let lease = self.config.lease_key(key);
        Box::pin(async move {
            let mut conn = self.admin.clone();
            redis::cmd("SET")
                .arg(&lease)
                .arg("not a lease record")
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| Error::Backend(Box::new(e)))
        })
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<(), Error>> {
        // What an operator's `DEL` of the lease key does.
        let lease = self.config.lease_key(key);
        Box::pin(async move {
            let mut conn = self.admin.clone();
            redis::cmd("DEL")
                .arg(&lease)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| Error::Backend(Box::new(e)))
        })
    }

    fn model_cases(&self) -> u32 {
        24
    }
}

/// `host:port` of a `redis://[user:pw@]host:port[/db]` URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, h)| h)
        .to_owned()
}

/// Where the test server is: `LEASE_TEST_REDIS_URL`, else the Redis
/// [`servers::redis`] starts (the one `cargo xtask provision --backend
/// redis` unpacked, or the system's).
pub fn server_url() -> Result<String, String> {
    servers::redis().map(|r| r.url.clone()).map_err(|e| {
        format!(
            "no Redis test server: {e}: run `cargo xtask provision --backend redis` or set LEASE_TEST_REDIS_URL"
        )
    })
}

/// The test server's URL; a test without one fails, saying how to get one.
pub fn url() -> String {
    super::or_panic(server_url())
}

/// A config on a key prefix of its own.
pub fn fresh_config() -> RedisConfig {
    RedisConfig::new(format!("{}:", unique("lease")))
}

/// A backend on `config`'s prefix; a test whose server does not answer
/// fails.
pub async fn backend(url: &str, config: &RedisConfig) -> RedisBackend {
    RedisBackend::connect(url, config.clone())
        .await
        .unwrap_or_else(|e| panic!("connect to the Redis test server: {e}"))
}

/// A plain connection for reaching behind the library's back.
pub async fn admin(url: &str) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| format!("Redis URL {url}: {e}"))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("Redis at {url} does not answer: {e}"))
}

/// What the server holds at `name`, to check that an operation left it
/// byte-identical: its `DUMP` (type and value) and its absolute expiry in
/// milliseconds (`PEXPIRETIME`: -1 none, -2 no key).
pub async fn snapshot(conn: &mut MultiplexedConnection, name: &str) -> (Option<Vec<u8>>, i64) {
    let dump: Option<Vec<u8>> = redis::cmd("DUMP")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("DUMP {name}: {e}"));
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("PEXPIRETIME {name}: {e}"));
    (dump, at)
}
