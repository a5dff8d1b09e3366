//! Connecting: the connection pool, the watch connection's settings, the
//! tables' migration; and what the backend was built with.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use lease_core::{AcquireRequest, Error, HolderId, LeaseKey};

use crate::backend::{Inner, PostgresBackend};
use crate::config::PostgresConfig;
use crate::function::Use;
use crate::notify::Notifier;
use crate::record::Sql;
use crate::tls::{tls_for, Tls};

impl PostgresBackend {
    /// Connects to `url` (`postgres://user:password@host:port/database?…`,
    /// as libpq and tokio-postgres read it), then runs
    /// [`migrate`](Self::migrate): the lease table and its audit table are
    /// created when missing. Fails at once, with the server's reason, when
    /// no connection can be made.
    pub async fn connect(url: &str, config: PostgresConfig) -> Result<Self, Error> {
        let backend = Self::connect_lazy(url, config)?;
        backend.migrate().await?;
        Ok(backend)
    }

    /// Like [`connect`](Self::connect), but opens no connection and creates
    /// no table or function: the first operation connects, and checks once
    /// whether the statements' functions are there (and are this crate's);
    /// without them the operations send the statements' text until
    /// [`migrate`](Self::migrate) runs. Call `migrate` once (or run its
    /// SQL, [`migration_sql`](Self::migration_sql), with a migration tool
    /// of your own) before the first lease.
    pub fn connect_lazy(url: &str, config: PostgresConfig) -> Result<Self, Error> {
        config.check()?;
        let mut pg: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
            Error::Backend(format!("lease-postgres: bad connection URL: {e}").into())
        })?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(config.request_timeout);
        }
        pg.keepalives(true);
        pg.keepalives_idle(Duration::from_secs(10));
        let tls = tls_for(&config, &mut pg)?;
        let mgr_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            Tls::Plain => Manager::from_config(pg.clone(), tokio_postgres::NoTls, mgr_config),
            #[cfg(feature = "tls")]
            Tls::Rustls(t) => Manager::from_config(pg.clone(), t.clone(), mgr_config),
        };
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(config.request_timeout))
            .create_timeout(Some(config.request_timeout))
            .recycle_timeout(Some(config.request_timeout))
            .build()
            .map_err(|e| Error::Backend(format!("lease-postgres: pool: {e}").into()))?;
        let sql = Sql::new(&config.table);
        let notifier = Notifier::new(pg, tls, sql.channel.clone());
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                pool,
                sql,
                config,
                notifier,
                functions: Use::new(),
            }),
        })
    }

    /// Creates the lease table and its audit table when they are missing
    /// (`CREATE TABLE IF NOT EXISTS`), and the functions the operations
    /// call (each statement stored as a PL/pgSQL function, whose plan the
    /// server keeps; see the README, *Performance*). Idempotent, and safe
    /// to run from many clients at once; see
    /// [`migration_sql`](Self::migration_sql).
    ///
    /// A table without its functions still works: the operations then
    /// send their statements' text, which costs two to three times as
    /// much. Running `migrate` again makes them call the functions.
    pub async fn migrate(&self) -> Result<(), Error> {
        let sql = &self.inner.sql.tables;
        for attempt in 0..3 {
            let (client, left) = self.client("migrate").await?;
            let result = tokio::time::timeout(left, client.batch_execute(sql)).await;
            match self.settle("migrate", client, result) {
                Ok(()) => break,
                // Two clients creating the same table race on the catalog's
                // unique indexes; the loser retries and finds the table.
                Err(Error::Backend(e)) if attempt < 2 && is_catalog_race(&*e) => continue,
                Err(e) => return Err(e),
            }
        }
        self.create_functions().await
    }

    /// The SQL [`migrate`](Self::migrate) runs, for a migration tool of
    /// your own.
    pub fn migration_sql(&self) -> &str {
        &self.inner.sql.migrate
    }

    /// An acquire request for `key` with the configured default TTL.
    pub fn request(&self, key: LeaseKey, holder: HolderId) -> AcquireRequest {
        AcquireRequest::new(key, holder).ttl(self.inner.config.default_ttl)
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.inner.sql.table
    }
}

fn is_catalog_race(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::code)
        .is_some_and(|c| {
            *c == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                || *c == tokio_postgres::error::SqlState::DUPLICATE_TABLE
                || *c == tokio_postgres::error::SqlState::DUPLICATE_OBJECT
        })
}
