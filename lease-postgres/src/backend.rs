//! [`PostgresBackend`]: the keyed lease on one PostgreSQL table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Fence, Grant,
    HolderId, LastBreak, LeaseBackend, LeaseKey, LeaseState, Payload, Renewal, TimeAuthority,
    TtlRule, Version,
};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use crate::config::PostgresConfig;
use crate::errors;
use crate::notify::Notifier;
use crate::record::{Answer, Sql, MAX_TTL_MS, MIN_TTL_MS};

/// TTLs in whole milliseconds, from 1 s to 1 day.
pub(crate) const TTL_RULE: TtlRule = TtlRule::new(
    Duration::from_millis(MIN_TTL_MS as u64)..=Duration::from_millis(MAX_TTL_MS as u64),
)
.rounded_to(Duration::from_millis(1));

/// How the client reaches the server: plain TCP or rustls.
#[derive(Clone)]
pub(crate) enum Tls {
    Plain,
    #[cfg(feature = "tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// Leases with fencing tokens in one PostgreSQL table, judged on the
/// server's clock. Cheap to clone: clones share the pool and the watch
/// connection.
#[derive(Clone)]
pub struct PostgresBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Sql,
    pub(crate) config: PostgresConfig,
    pub(crate) notifier: Notifier,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("table", &self.inner.sql.table)
            .field("request_timeout", &self.inner.config.request_timeout)
            .finish_non_exhaustive()
    }
}

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
    /// no table: the first operation connects. Call
    /// [`migrate`](Self::migrate) once (or create the tables from its SQL,
    /// [`migration_sql`](Self::migration_sql)) before the first lease.
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
            }),
        })
    }

    /// Creates the lease table and its audit table when they are missing
    /// (`CREATE TABLE IF NOT EXISTS`, see [`migration_sql`](Self::migration_sql));
    /// idempotent, and safe to run from many clients at once.
    pub async fn migrate(&self) -> Result<(), Error> {
        let sql = &self.inner.sql.migrate;
        for attempt in 0..3 {
            let (client, left) = self.client("migrate").await?;
            let result = tokio::time::timeout(left, client.batch_execute(sql)).await;
            match self.settle("migrate", client, result) {
                Ok(()) => return Ok(()),
                // Two clients creating the same table race on the catalog's
                // unique indexes; the loser retries and finds the table.
                Err(Error::Backend(e)) if attempt < 2 && is_catalog_race(&*e) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
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

    pub(crate) fn timeout(&self) -> Duration {
        self.inner.config.request_timeout
    }

    /// A pooled connection, within the request timeout; what is left of
    /// the timeout for the operation.
    pub(crate) async fn client(&self, op: &'static str) -> Result<(Object, Duration), Error> {
        let limit = self.timeout();
        let start = Instant::now();
        match tokio::time::timeout(limit, self.inner.pool.get()).await {
            Ok(Ok(c)) => Ok((c, limit.saturating_sub(start.elapsed()))),
            Ok(Err(e)) => Err(errors::map_pool(op, e)),
            Err(_) => Err(errors::timed_out(op, limit)),
        }
    }

    /// The result of a statement run within the timeout on `client`. A
    /// connection whose statement failed without an answer from the server
    /// (or did not answer in time: it may be stuck behind a dead network
    /// path) is taken out of the pool and closed, never handed out again.
    pub(crate) fn settle<T>(
        &self,
        op: &'static str,
        client: Object,
        result: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, Error> {
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if e.code().is_none() {
                    drop(Object::take(client));
                }
                Err(errors::map(op, e))
            }
            Err(_) => {
                drop(Object::take(client));
                Err(errors::timed_out(op, self.timeout()))
            }
        }
    }

    pub(crate) async fn query(
        &self,
        op: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        let (client, left) = self.client(op).await?;
        let result = tokio::time::timeout(left, client.query_typed(sql, params)).await;
        self.settle(op, client, result)
    }

    async fn acquire_once(
        &self,
        req: &AcquireRequest,
        ttl: Duration,
    ) -> Result<Option<Acquire>, Error> {
        let ttl_ms = millis(ttl);
        let payload = req.payload.as_bytes().to_vec();
        let sent_at = Instant::now();
        let rows = self
            .query(
                "acquire",
                &self.inner.sql.acquire,
                &[
                    (&req.key.as_str(), Type::TEXT),
                    (&req.holder.as_str(), Type::TEXT),
                    (&ttl_ms, Type::INT8),
                    (&payload, Type::BYTEA),
                ],
            )
            .await?;
        let Some(row) = rows.first() else {
            // A row inserted by a concurrent acquire after this statement's
            // snapshot: it refused to take it, but cannot see it. Run again.
            return Ok(None);
        };
        let answer = Answer::from_row(&req.key, row)?;
        let state = answer.state(&req.key)?;
        match (answer.outcome.as_str(), state) {
            ("granted", LeaseState::Held(h)) => Ok(Some(Acquire::Granted(Grant::new(
                req.key.clone(),
                h.holder,
                h.fence,
                h.ttl,
                sent_at,
                version(h.fence),
            )))),
            ("held", LeaseState::Held(h)) => Ok(Some(Acquire::Held(h))),
            // Free in this statement's snapshot but refused: a concurrent
            // change; run again.
            _ => Ok(None),
        }
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

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn version(fence: Fence) -> Version {
    Version::new(fence.get().to_string())
}

#[cfg(feature = "tls")]
fn tls_for(config: &PostgresConfig, pg: &mut tokio_postgres::Config) -> Result<Tls, Error> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let Some(tls) = &config.tls else {
        return Ok(Tls::Plain);
    };
    let bad = |what: String| Error::Backend(format!("lease-postgres: TLS: {what}").into());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&tls.ca_pem) {
        let cert = cert.map_err(|e| bad(format!("CA PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad("no CA certificate in the PEM".into()));
    }
    // The process default when the application installed one, otherwise
    // ring for this client alone: nothing is installed process-wide.
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    pg.ssl_mode(tokio_postgres::config::SslMode::Require);
    Ok(Tls::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(
        client,
    )))
}

#[cfg(not(feature = "tls"))]
fn tls_for(config: &PostgresConfig, _pg: &mut tokio_postgres::Config) -> Result<Tls, Error> {
    match config.tls {
        None => Ok(Tls::Plain),
        Some(_) => Err(Error::Backend(
            "lease-postgres: TLS was asked for, but this build has no `tls` feature".into(),
        )),
    }
}

impl LeaseBackend for PostgresBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TimeAuthority::BackendClock, TTL_RULE).with_watch(true)
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            let ttl = TTL_RULE.effective(req.ttl)?;
            for _ in 0..4 {
                if let Some(answer) = self.acquire_once(&req, ttl).await? {
                    return Ok(answer);
                }
            }
            Err(Error::Unavailable {
                detail: format!(
                    "lease-postgres: acquire of {}: the row kept changing under concurrent \
                     acquires; retry",
                    req.key
                ),
                source: None,
            })
        })
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let fence = i64::try_from(grant.fence().get()).unwrap_or(i64::MAX);
            let payload = payload.map(Payload::into_bytes);
            let sent_at = Instant::now();
            let rows = self
                .query(
                    "renew",
                    &self.inner.sql.renew,
                    &[
                        (&grant.key().as_str(), Type::TEXT),
                        (&grant.holder().as_str(), Type::TEXT),
                        (&fence, Type::INT8),
                        (&payload, Type::BYTEA),
                    ],
                )
                .await?;
            let Some(row) = rows.first() else {
                return Ok(Renewal::Lost);
            };
            let answer = Answer::from_row(grant.key(), row)?;
            // A malformed row is an error even when it is not ours.
            answer.state(grant.key())?;
            if answer.outcome == "renewed" {
                Ok(Renewal::Renewed(
                    grant.renewed(sent_at, version(grant.fence())),
                ))
            } else {
                Ok(Renewal::Lost)
            }
        })
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let fence = i64::try_from(grant.fence().get()).unwrap_or(i64::MAX);
            let rows = self
                .query(
                    "release",
                    &self.inner.sql.release,
                    &[
                        (&grant.key().as_str(), Type::TEXT),
                        (&grant.holder().as_str(), Type::TEXT),
                        (&fence, Type::INT8),
                    ],
                )
                .await?;
            if let Some(row) = rows.first() {
                let answer = Answer::from_row(grant.key(), row)?;
                if answer.outcome != "released" {
                    answer.state(grant.key())?;
                }
            }
            Ok(())
        })
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(async move {
            let rows = self
                .query("read", &self.inner.sql.read, &[(&key.as_str(), Type::TEXT)])
                .await?;
            match rows.first() {
                None => Ok(LeaseState::Free),
                Some(row) => Answer::from_row(key, row)?.state(key),
            }
        })
    }

    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(crate::notify::wait_for_change(self, key, seen))
    }

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(crate::admin::break_lease(self, key, note))
    }

    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(crate::admin::last_break(self, key))
    }
}
