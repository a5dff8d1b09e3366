//! The real resources of the fault runs' `real_resource` row: lease-fence's
//! `FencedStore` over an object store and `PgFences` inside PostgreSQL
//! transactions, behind the suite's [`RealResource`], so the history
//! checker judges what a real store accepted while holders were paused past
//! their leases.

use std::fmt;
use std::sync::Arc;

use lease_conformance::faults::tests_macro::ResourceFuture;
use lease_conformance::history::{FenceFuture, RealResource, WriteFuture};
use lease_core::Fence;
use lease_fence::postgres::{PgFenceError, PgFences};
use lease_fence::{FencedError, FencedStore};
use object_store::path::Path;
use object_store::ObjectStore;

/// `FencedStore` over any object store: one object per key.
struct StoreResource {
    store: FencedStore<Arc<dyn ObjectStore>>,
    prefix: String,
    what: &'static str,
}

impl fmt::Debug for StoreResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencedStore on {}", self.what)
    }
}

impl RealResource for StoreResource {
    fn write<'a>(&'a self, key: &'a str, holder: &'a str, fence: Fence) -> WriteFuture<'a> {
        Box::pin(async move {
            let path = Path::from(format!("{}/{key}", self.prefix));
            // The same bytes from every writer: on a store whose version is
            // a hash of the bytes (S3's ETag), the hardest case for a
            // conditional write to tell two writes apart.
            let _ = holder;
            match self.store.put(&path, "the same bytes".into(), fence).await {
                Ok(_) => Ok(true),
                Err(FencedError::Stale(_)) => Ok(false),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    fn fence<'a>(&'a self, key: &'a str) -> FenceFuture<'a> {
        Box::pin(async move {
            let path = Path::from(format!("{}/{key}", self.prefix));
            self.store.fence(&path).await.map_err(|e| e.to_string())
        })
    }
}

fn store(store: Arc<dyn ObjectStore>, what: &'static str) -> Arc<dyn RealResource> {
    let run = lease_core::HolderId::random();
    Arc::new(StoreResource {
        store: FencedStore::new(store),
        prefix: format!("lease-fault-resources/{run}"),
        what,
    })
}

/// `FencedStore` over object_store's `InMemory`.
pub fn in_memory_store() -> ResourceFuture {
    Box::pin(async {
        Ok(store(
            Arc::new(object_store::memory::InMemory::new()),
            "object_store's InMemory",
        ))
    })
}

/// `FencedStore` over the S3 test server ([`crate::servers::s3`]).
pub fn s3_store() -> ResourceFuture {
    Box::pin(async {
        let s = crate::servers::s3().map_err(|e| e.to_string())?;
        let s3 = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&s.endpoint)
            .with_allow_http(s.endpoint.starts_with("http://"))
            .with_region(&s.region)
            .with_bucket_name(&s.bucket)
            .with_access_key_id(&s.access_key)
            .with_secret_access_key(&s.secret_key)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(store(Arc::new(s3), "the S3 test server"))
    })
}

/// `PgFences` on the PostgreSQL test server ([`crate::servers::postgres`]):
/// each write a transaction that admits the fence and inserts a row, on a
/// connection of its own, so that concurrent writes meet only in
/// PostgreSQL.
struct PostgresResource {
    url: String,
    /// Idle connections, taken by a write and given back after it.
    idle: std::sync::Mutex<Vec<tokio_postgres::Client>>,
    fences: PgFences,
    data: String,
}

impl PostgresResource {
    async fn client(&self) -> Result<tokio_postgres::Client, String> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        match idle {
            Some(client) if !client.is_closed() => Ok(client),
            _ => connect(&self.url).await,
        }
    }

    fn give_back(&self, client: tokio_postgres::Client) {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(client);
    }
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

impl fmt::Debug for PostgresResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PgFences on the PostgreSQL test server ({})",
            self.fences.table()
        )
    }
}

impl RealResource for PostgresResource {
    fn write<'a>(&'a self, key: &'a str, holder: &'a str, fence: Fence) -> WriteFuture<'a> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let written = self.write_with(&mut client, key, holder, fence).await;
            self.give_back(client);
            written
        })
    }

    fn fence<'a>(&'a self, key: &'a str) -> FenceFuture<'a> {
        Box::pin(async move {
            let client = self.client().await?;
            let read = client
                // The data, not the check's own table: that table's fence
                // never falls, so it could not show a stale write that
                // landed after a newer one.
                .query_opt(
                    &format!(
                        "SELECT fence FROM {} WHERE key = $1 ORDER BY id DESC LIMIT 1",
                        self.data
                    ),
                    &[&key],
                )
                .await;
            self.give_back(client);
            match read.map_err(|e| e.to_string())? {
                None => Ok(None),
                Some(row) => {
                    let stored: i64 = row.try_get(0).map_err(|e| e.to_string())?;
                    u64::try_from(stored)
                        .map(|f| Some(Fence(f)))
                        .map_err(|e| e.to_string())
                }
            }
        })
    }
}

impl PostgresResource {
    async fn write_with(
        &self,
        client: &mut tokio_postgres::Client,
        key: &str,
        holder: &str,
        fence: Fence,
    ) -> Result<bool, String> {
        let tx = client.transaction().await.map_err(|e| e.to_string())?;
        match self.fences.admit(&tx, key, fence).await {
            Ok(()) => {}
            Err(PgFenceError::Stale(_)) => return Ok(false),
            Err(e) => return Err(e.to_string()),
        }
        let insert = format!(
            "INSERT INTO {} (key, holder, fence) VALUES ($1, $2, $3)",
            self.data
        );
        let value = i64::try_from(fence.get()).map_err(|e| e.to_string())?;
        tx.execute(&insert, &[&key, &holder, &value])
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(true)
    }
}

/// `PgFences` on the PostgreSQL test server, in tables of its own.
pub fn postgres() -> ResourceFuture {
    Box::pin(async {
        let pg = crate::servers::postgres().map_err(|e| e.to_string())?;
        let client = connect(&pg.url).await?;
        let run: String = lease_core::HolderId::random()
            .as_str()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let fences =
            PgFences::with_table(&format!("fault_fences_{run}")).map_err(|e| e.to_string())?;
        fences.migrate(&client).await.map_err(|e| e.to_string())?;
        let data = format!("fault_writes_{run}");
        client
            .batch_execute(&format!(
                "CREATE TABLE {data} (id bigserial PRIMARY KEY, key text NOT NULL, holder text NOT NULL, fence bigint NOT NULL)"
            ))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(PostgresResource {
            url: pg.url.clone(),
            idle: std::sync::Mutex::new(vec![client]),
            fences,
            data,
        }) as Arc<dyn RealResource>)
    })
}
