//! The backends under test: their servers (started by the conformance
//! harness), clients direct or through a counting [`FaultProxy`](lease_conformance::faults::FaultProxy), the raw
//! single-request baselines made with the same client, and the counters
//! that cross-check the proxy's request counts.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, KvClient, Txn, TxnOp};
use lease_core::{HolderId, LeaseBackend};
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_fake::Fake;
use lease_mongo::{MongoBackend, MongoConfig};
use lease_nats::async_nats::jetstream::kv;
use lease_nats::{NatsBackend, NatsConfig};
use lease_postgres::{PostgresBackend, PostgresConfig};
use lease_redis::{RedisBackend, RedisConfig};
use lease_s3::object_store::path::Path as ObjPath;
use lease_s3::object_store::{
    ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};
use lease_s3::{ObjectStoreBackend, S3Config};
use lease_testkit::servers;
use mongodb::bson::{doc, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::{ClientOptions, ServerAddress};
use mongodb::Collection;
use tokio::task::JoinHandle;
use tokio_postgres::types::Type as PgType;

pub const NATS_BUCKET: &str = "lease-bench";

/// One backend's server (or the in-process fake).
pub enum Target {
    Fake {
        fake: Fake,
        ticker: JoinHandle<()>,
    },
    /// etcd: lease-etcd as configured by default (`sessions`: the keys a
    /// client holds with one TTL share one etcd lease), and with its
    /// sessions off (every key on an etcd lease of its own), measured
    /// beside it as its own backend, `etcd-own-leases`.
    Etcd {
        url: String,
        pid: Option<u32>,
        sessions: bool,
    },
    Nats {
        url: String,
        pid: Option<u32>,
    },
    S3 {
        server: &'static servers::S3,
    },
    Mongo {
        uri: String,
    },
    /// PostgreSQL; `statement_cache`: lease-postgres with its statement
    /// cache on (prepared statements), measured beside the default as its
    /// own backend, `postgres-statement-cache`.
    Postgres {
        url: String,
        statement_cache: bool,
    },
    /// Redis (or Valkey); `url` is the server's `redis://host:port`.
    Redis {
        url: String,
        pid: Option<u32>,
    },
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Target::Fake { ticker, .. } = self {
            ticker.abort();
        }
    }
}

pub const ALL: [&str; 9] = [
    "fake",
    "etcd",
    "etcd-own-leases",
    "nats",
    "s3",
    "mongo",
    "postgres",
    "postgres-statement-cache",
    "redis",
];

/// Whether `backend` is one of the etcd variants.
pub fn is_etcd(backend: &str) -> bool {
    backend == "etcd" || backend == "etcd-own-leases"
}

/// lease-postgres, with or without its statement cache.
pub fn is_postgres(backend: &str) -> bool {
    backend == "postgres" || backend == "postgres-statement-cache"
}

/// The raw baseline's table on the PostgreSQL server (one row per client).
pub const PG_RAW_TABLE: &str = "lease_bench_raw";

impl Target {
    /// Starts (or finds) the server of `name` through the conformance
    /// harness; a missing server is an error saying how to provision it.
    pub async fn start(name: &str) -> Result<Target, String> {
        let blocking = |f: fn() -> Result<Target, String>| tokio::task::spawn_blocking(f);
        let t = match name {
            "fake" => {
                let fake = Fake::new();
                // The fake's clock only moves when told: move it with real
                // time, so TTLs run out as on a server.
                let f = fake.clone();
                let ticker = tokio::spawn(async move {
                    let mut last = Instant::now();
                    let mut tick = tokio::time::interval(Duration::from_millis(10));
                    loop {
                        tick.tick().await;
                        let now = Instant::now();
                        f.advance(now - last);
                        last = now;
                    }
                });
                return Ok(Target::Fake { fake, ticker });
            }
            "etcd" | "etcd-own-leases" => {
                let sessions = name != "etcd-own-leases";
                tokio::task::spawn_blocking(move || {
                    let e = servers::etcd().map_err(|e| e.to_string())?;
                    Ok(Target::Etcd {
                        url: e.endpoints[0].clone(),
                        pid: e.pid(),
                        sessions,
                    })
                })
            }
            "nats" => blocking(|| {
                let n = servers::nats().map_err(|e| e.to_string())?;
                Ok(Target::Nats {
                    url: n.url.clone(),
                    pid: n.pid(),
                })
            }),
            "s3" => blocking(|| {
                let s = servers::s3().map_err(|e| e.to_string())?;
                Ok(Target::S3 { server: s })
            }),
            "mongo" => blocking(|| {
                let m = servers::mongo().map_err(|e| e.to_string())?;
                Ok(Target::Mongo { uri: m.uri.clone() })
            }),
            "postgres" | "postgres-statement-cache" => {
                let statement_cache = name == "postgres-statement-cache";
                tokio::task::spawn_blocking(move || {
                    let p = servers::postgres().map_err(|e| e.to_string())?;
                    Ok(Target::Postgres {
                        url: p.url.clone(),
                        statement_cache,
                    })
                })
            }
            "redis" => blocking(|| {
                let r = servers::redis().map_err(|e| e.to_string())?;
                Ok(Target::Redis {
                    url: r.url.clone(),
                    pid: r.pid(),
                })
            }),
            other => return Err(format!("unknown backend {other:?} (known: {ALL:?})")),
        };
        t.await
            .map_err(|e| format!("{name}: server start panicked: {e}"))?
    }

    pub fn name(&self) -> &'static str {
        match self {
            Target::Fake { .. } => "fake",
            Target::Etcd { sessions: true, .. } => "etcd",
            Target::Etcd {
                sessions: false, ..
            } => "etcd-own-leases",
            Target::Nats { .. } => "nats",
            Target::S3 { .. } => "s3",
            Target::Mongo { .. } => "mongo",
            Target::Postgres {
                statement_cache: false,
                ..
            } => "postgres",
            Target::Postgres {
                statement_cache: true,
                ..
            } => "postgres-statement-cache",
            Target::Redis { .. } => "redis",
        }
    }

    /// The server's TCP address (None for the fake).
    pub fn upstream(&self) -> Option<SocketAddr> {
        match self {
            Target::Fake { .. } => None,
            Target::Etcd { url, .. } | Target::Nats { url, .. } => addr_of(url),
            Target::S3 { server } => addr_of(&server.endpoint),
            Target::Mongo { uri } => addr_of(uri),
            Target::Postgres { url, .. } | Target::Redis { url, .. } => addr_of(url),
        }
    }

    /// The server process, when the harness started it here.
    pub fn server_pid(&self) -> Option<u32> {
        match self {
            Target::Etcd { pid, .. } | Target::Nats { pid, .. } | Target::Redis { pid, .. } => *pid,
            _ => None,
        }
    }

    /// A new client of this backend (its own connection), direct or through
    /// the proxy at `via`. Keys live under `prefix`.
    pub async fn connect(&self, via: Option<SocketAddr>, prefix: &str) -> Result<Client, String> {
        let err = |what: &str, e: &dyn std::fmt::Display| format!("{}: {what}: {e}", self.name());
        match self {
            Target::Fake { fake, .. } => Ok(Client {
                backend: Arc::new(fake.clone()),
                raw: Raw::None,
                counter: None,
            }),
            Target::Etcd { url, sessions, .. } => {
                let endpoint = match via {
                    Some(a) => format!("http://{a}"),
                    None => url.clone(),
                };
                let b = EtcdBackend::connect(
                    EtcdConfig::new([endpoint])
                        .key_prefix(format!("{prefix}/"))
                        .sessions(*sessions),
                )
                .await
                .map_err(|e| err("connect", &e))?;
                let kv = b.client().kv_client();
                Ok(Client {
                    raw: Raw::Etcd {
                        kv: Box::new(kv),
                        key: format!("{prefix}-raw/{}", HolderId::random()),
                        rev: 0,
                    },
                    counter: Some(Counter::EtcdMetrics(url.clone())),
                    backend: Arc::new(b),
                })
            }
            Target::Nats { url, .. } => {
                let endpoint = match via {
                    Some(a) => format!("nats://{a}"),
                    None => url.clone(),
                };
                let b = NatsBackend::connect(
                    &endpoint,
                    NatsConfig::new(NATS_BUCKET).create_bucket(true),
                )
                .await
                .map_err(|e| err("connect", &e))?;
                let js = lease_nats::async_nats::jetstream::new(b.client().clone());
                let store = js
                    .get_key_value(NATS_BUCKET)
                    .await
                    .map_err(|e| err("open the KV bucket", &e))?;
                Ok(Client {
                    raw: Raw::Nats {
                        kv: Box::new(store),
                        key: format!("{prefix}-raw-{}", &HolderId::random().as_str()[..12]),
                        rev: 0,
                    },
                    counter: Some(Counter::Nats(b.clone())),
                    backend: Arc::new(b),
                })
            }
            Target::S3 { server } => {
                let endpoint = match via {
                    Some(a) => format!("http://{a}"),
                    None => server.endpoint.clone(),
                };
                let store = S3Config::new(server.bucket.clone())
                    .endpoint(endpoint)
                    .region(server.region.clone())
                    .credentials(server.access_key.clone(), server.secret_key.clone())
                    .build()
                    .map_err(|e| err("client", &e))?;
                let b = ObjectStoreBackend::new(store.clone(), prefix)
                    .map_err(|e| err("backend", &e))?;
                Ok(Client {
                    raw: Raw::S3 {
                        store,
                        path: ObjPath::from(format!("{prefix}-raw/{}", HolderId::random())),
                        etag: None,
                    },
                    counter: None,
                    backend: Arc::new(b),
                })
            }
            Target::Mongo { uri } => {
                let mut o = ClientOptions::parse(uri)
                    .await
                    .map_err(|e| err("URI", &e))?;
                if let Some(a) = via {
                    o.hosts = vec![ServerAddress::Tcp {
                        host: a.ip().to_string(),
                        port: Some(a.port()),
                    }];
                    o.direct_connection = Some(true);
                }
                // Fewer monitoring `hello`s through the proxy while counting.
                o.heartbeat_freq = Some(Duration::from_secs(60));
                let commands = Arc::new(AtomicU64::new(0));
                let c = commands.clone();
                o.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
                    if matches!(ev, CommandEvent::Started(_)) {
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                }));
                let client = mongodb::Client::with_options(o).map_err(|e| err("client", &e))?;
                let collection = format!("leases_{}", prefix.replace(['/', '-'], "_"));
                let b = MongoBackend::new(
                    client,
                    MongoConfig::new("lease_bench").collection(collection),
                )
                .await
                .map_err(|e| err("backend", &e))?;
                Ok(Client {
                    raw: Raw::Mongo {
                        coll: b.collection().clone(),
                        id: format!("{prefix}-raw/{}", HolderId::random()),
                        n: 0,
                    },
                    counter: Some(Counter::Mongo(commands)),
                    backend: Arc::new(b),
                })
            }
            Target::Postgres {
                url,
                statement_cache,
            } => {
                let url = match via {
                    Some(a) => url_via(url, a),
                    None => url.clone(),
                };
                let config =
                    PostgresConfig::new(pg_table(prefix)).statement_cache(*statement_cache);
                let b = PostgresBackend::connect(&url, config)
                    .await
                    .map_err(|e| err("connect", &e))?;
                let client = pg_session(&url).await.map_err(|e| err("raw client", &e))?;
                let read_function = read_function(&b, &client)
                    .await
                    .map_err(|e| format!("postgres: the read's function: {e}"))?;
                Ok(Client {
                    raw: Raw::Postgres {
                        client,
                        id: format!("{prefix}-raw/{}", HolderId::random()),
                        n: 0,
                        read_call: format!("SELECT * FROM {read_function}($1)"),
                    },
                    // pg_stat_database's xact_commit is flushed by each
                    // session at most once a second, so its deltas cannot
                    // be pinned to one operation: the proxy alone counts.
                    counter: None,
                    backend: Arc::new(b),
                })
            }
            Target::Redis { url, .. } => {
                let url = match via {
                    Some(a) => url_via(url, a),
                    None => url.clone(),
                };
                let b = RedisBackend::connect(&url, RedisConfig::new(format!("{prefix}:")))
                    .await
                    .map_err(|e| err("connect", &e))?;
                let conn = redis_session(&url)
                    .await
                    .map_err(|e| err("raw client", &e))?;
                Ok(Client {
                    raw: Raw::Redis {
                        conn,
                        cas: redis::Script::new(REDIS_CAS),
                        key: format!("{prefix}-raw/{}", HolderId::random()),
                        n: 0,
                    },
                    // Redis' own counters (`total_commands_processed`,
                    // `commandstats`) also count the commands a script
                    // runs, so they cannot tell one request from one
                    // script's inner calls: the proxy alone counts.
                    counter: None,
                    backend: Arc::new(b),
                })
            }
        }
    }
}

/// `scheme://[user@]host:port/...` → the address.
fn addr_of(url: &str) -> Option<SocketAddr> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split(['/', '?', ',']).next()?;
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    host.to_socket_addrs().ok()?.next()
}

/// A URL `scheme://[user@]host:port/db?…` (PostgreSQL, Redis) with
/// `host:port` replaced by `via` (the counting proxy).
pub fn url_via(url: &str, via: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((user, _)) => format!("{scheme}://{user}@{via}{tail}"),
        None => format!("{scheme}://{via}{tail}"),
    }
}

/// The lease table of the clients under `prefix` (a plain identifier, as
/// lease-postgres requires).
pub fn pg_table(prefix: &str) -> String {
    let id: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("leases_{id}")
}

/// The schema-qualified name of the function `b`'s reads call, from its
/// migration SQL and the server's catalog.
async fn read_function(
    b: &PostgresBackend,
    client: &tokio_postgres::Client,
) -> Result<String, String> {
    let name = b
        .migration_sql()
        .split("CREATE FUNCTION ")
        .filter_map(|s| s.split('(').next())
        .map(|s| s.rsplit('.').next().unwrap_or(s).trim_matches('"'))
        .find(|s| s.starts_with("lease_read_"))
        .ok_or("no lease_read_ function in the migration SQL")?;
    let row = client
        .query_one(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(p.proname) FROM pg_proc p \
             JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.proname = $1",
            &[&name],
        )
        .await
        .map_err(|e| format!("{name}: {e}"))?;
    row.try_get(0).map_err(|e| format!("{name}: {e}"))
}

/// One plain tokio-postgres session (the client library lease-postgres
/// uses), its connection driven by a task of its own.
pub async fn pg_session(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// One plain redis-rs multiplexed connection (the client library
/// lease-redis uses) to the server at `url`.
pub async fn redis_session(
    url: &str,
) -> Result<redis::aio::MultiplexedConnection, redis::RedisError> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

/// The raw baseline's conditional write on Redis: one script, as every
/// lease-redis operation is, doing the least a conditional write can (a
/// compare and a set).
const REDIS_CAS: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end return 0";

/// A client: the lease backend, the raw baseline on the same connection, and
/// a second request counter where the backend has one.
pub struct Client {
    pub backend: Arc<dyn LeaseBackend>,
    pub raw: Raw,
    pub counter: Option<Counter>,
}

/// A counter of requests independent of the proxy.
pub enum Counter {
    /// etcd's own `grpc_server_msg_received_total` (all methods), read from
    /// the server's `/metrics` (the server is private to this process).
    EtcdMetrics(String),
    /// `NatsBackend::requests_sent` (JetStream requests of the lease client;
    /// raw KV calls are not counted).
    Nats(NatsBackend),
    /// MongoDB driver command-started events (application commands, not
    /// the monitoring `hello`s).
    Mongo(Arc<AtomicU64>),
}

impl Counter {
    pub fn what(&self) -> &'static str {
        match self {
            Counter::EtcdMetrics(_) => "etcd grpc_server_msg_received_total",
            Counter::Nats(_) => "NatsBackend::requests_sent (lease ops only)",
            Counter::Mongo(_) => "driver CommandStarted events",
        }
    }

    /// Whether raw baseline operations show up in this counter.
    pub fn counts_raw(&self) -> bool {
        !matches!(self, Counter::Nats(_))
    }

    pub async fn get(&self) -> Option<u64> {
        match self {
            Counter::EtcdMetrics(url) => {
                let url = url.clone();
                tokio::task::spawn_blocking(move || etcd_received(&url))
                    .await
                    .ok()
                    .flatten()
            }
            Counter::Nats(b) => Some(b.requests_sent()),
            Counter::Mongo(n) => Some(n.load(Ordering::Relaxed)),
        }
    }
}

fn etcd_received(url: &str) -> Option<u64> {
    etcd_received_by(url, |_| true)
}

/// The keep-alive messages etcd received (`LeaseKeepAlive`), for the scale
/// runs' requests per renewal.
pub async fn etcd_keep_alives(counter: &Counter) -> Option<u64> {
    let Counter::EtcdMetrics(url) = counter else {
        return None;
    };
    let url = url.clone();
    tokio::task::spawn_blocking(move || etcd_received_by(&url, |m| m == "LeaseKeepAlive"))
        .await
        .ok()
        .flatten()
}

/// etcd's `grpc_server_msg_received_total` summed over the methods `keep`
/// says yes to.
fn etcd_received_by(url: &str, keep: impl Fn(&str) -> bool) -> Option<u64> {
    let addr = addr_of(url)?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let sum: f64 = body
        .lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .filter(|l| {
            l.split("grpc_method=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .is_some_and(&keep)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Some(sum as u64)
}

/// The raw baseline: one conditional write and one read with the same
/// client library on the same server (and connection) as the lease ops.
pub enum Raw {
    None,
    /// A transaction comparing the key's mod revision, then a put; a range get.
    Etcd {
        kv: Box<KvClient>,
        key: String,
        rev: i64,
    },
    /// KV update expecting the last revision (one conditional publish); KV entry.
    Nats {
        kv: Box<kv::Store>,
        key: String,
        rev: u64,
    },
    /// PUT with If-Match on the last ETag; GET.
    S3 {
        store: Arc<dyn ObjectStore>,
        path: ObjPath,
        etag: Option<String>,
    },
    /// update_one filtered on a counter (w: majority, j: true as the lease
    /// collection); find_one.
    Mongo {
        coll: Collection<Document>,
        id: String,
        n: i64,
    },
    /// `UPDATE … SET n = n + 1 WHERE id = $1 AND n = $2`; `SELECT n … WHERE
    /// id = $1` (each one `query_typed`, one round trip, as lease-postgres
    /// sends its statements).
    Postgres {
        client: tokio_postgres::Client,
        id: String,
        n: i64,
        /// The call lease-postgres sends for a read, to time on this plain
        /// session: the read's SQL apart from the crate's client path.
        read_call: String,
    },
    /// `EVALSHA` of a compare-and-set script (`GET` = n → `SET` n + 1);
    /// `GET`, on a plain redis-rs connection.
    Redis {
        conn: redis::aio::MultiplexedConnection,
        cas: redis::Script,
        key: String,
        n: i64,
    },
}

impl Raw {
    pub fn describe(&self) -> (&'static str, &'static str) {
        match self {
            Raw::None => ("—", "—"),
            Raw::Etcd { .. } => ("txn(mod_revision = r) put", "range get"),
            Raw::Nats { .. } => ("KV update (expected last sequence)", "KV entry"),
            Raw::S3 { .. } => ("PUT If-Match", "GET"),
            Raw::Mongo { .. } => (
                "update_one on a version (majority, j)",
                "find_one (majority)",
            ),
            Raw::Postgres { .. } => (
                "UPDATE … WHERE id = $1 AND n = $2",
                "SELECT n … WHERE id = $1",
            ),
            Raw::Redis { .. } => ("EVALSHA compare-and-set (GET = n → SET n + 1)", "GET"),
        }
    }

    pub fn exists(&self) -> bool {
        !matches!(self, Raw::None)
    }

    /// Whether [`lease_read`](Self::lease_read) times anything here.
    pub fn has_lease_read(&self) -> bool {
        matches!(self, Raw::Postgres { .. })
    }

    /// PostgreSQL: the call lease-postgres sends to read `key`, sent on
    /// the raw baseline's plain session as that one's read is. Elsewhere
    /// nothing.
    pub async fn lease_read(&mut self, key: &str) -> Result<(), String> {
        match self {
            Raw::Postgres {
                client, read_call, ..
            } => client
                .query_typed(read_call, &[(&key, PgType::TEXT)])
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            _ => Ok(()),
        }
    }

    /// Creates the baseline's record.
    pub async fn setup(&mut self) -> Result<(), String> {
        match self {
            Raw::None => Ok(()),
            Raw::Etcd { kv, key, rev } => {
                let r = kv
                    .put(key.as_str(), "0", None)
                    .await
                    .map_err(|e| e.to_string())?;
                *rev = r.header().map_or(0, |h| h.revision());
                Ok(())
            }
            Raw::Nats { kv, key, rev } => {
                *rev = kv
                    .put(key.as_str(), "0".into())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(())
            }
            Raw::S3 { store, path, etag } => {
                let r = store
                    .put(path, PutPayload::from_static(b"0"))
                    .await
                    .map_err(|e| e.to_string())?;
                *etag = r.e_tag;
                Ok(())
            }
            Raw::Mongo { coll, id, n } => {
                coll.insert_one(doc! { "_id": id.as_str(), "n": 0i64 })
                    .await
                    .map_err(|e| e.to_string())?;
                *n = 0;
                Ok(())
            }
            Raw::Postgres { client, id, n, .. } => {
                client
                    .batch_execute(&format!(
                        "CREATE TABLE IF NOT EXISTS {PG_RAW_TABLE} (id text PRIMARY KEY, n bigint NOT NULL)"
                    ))
                    .await
                    .map_err(|e| e.to_string())?;
                client
                    .query_typed(
                        &format!("INSERT INTO {PG_RAW_TABLE} (id, n) VALUES ($1, 0)"),
                        &[(&id.as_str(), PgType::TEXT)],
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                *n = 0;
                Ok(())
            }
            Raw::Redis { conn, key, n, .. } => {
                redis::cmd("SET")
                    .arg(key.as_str())
                    .arg(0)
                    .query_async::<()>(conn)
                    .await
                    .map_err(|e| e.to_string())?;
                *n = 0;
                Ok(())
            }
        }
    }

    /// One conditional write; an unmet condition is an error (nobody else
    /// writes this record).
    pub async fn write(&mut self) -> Result<(), String> {
        match self {
            Raw::None => Ok(()),
            Raw::Etcd { kv, key, rev } => {
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, *rev)])
                    .and_then([TxnOp::put(key.as_str(), "x", None)]);
                let r = kv.txn(txn).await.map_err(|e| e.to_string())?;
                if !r.succeeded() {
                    return Err("raw etcd txn: condition failed".into());
                }
                *rev = r.header().map_or(0, |h| h.revision());
                Ok(())
            }
            Raw::Nats { kv, key, rev } => {
                *rev = kv
                    .update(key.as_str(), "x".into(), *rev)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(())
            }
            Raw::S3 { store, path, etag } => {
                let opts = PutOptions {
                    mode: PutMode::Update(UpdateVersion {
                        e_tag: etag.clone(),
                        version: None,
                    }),
                    ..Default::default()
                };
                let r = store
                    .put_opts(path, PutPayload::from_static(b"x"), opts)
                    .await
                    .map_err(|e| e.to_string())?;
                *etag = r.e_tag;
                Ok(())
            }
            Raw::Mongo { coll, id, n } => {
                let r = coll
                    .update_one(
                        doc! { "_id": id.as_str(), "n": *n },
                        doc! { "$set": { "n": *n + 1 } },
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                if r.matched_count != 1 {
                    return Err("raw mongo update: condition failed".into());
                }
                *n += 1;
                Ok(())
            }
            Raw::Postgres { client, id, n, .. } => {
                let rows = client
                    .query_typed(
                        &format!(
                            "UPDATE {PG_RAW_TABLE} SET n = n + 1 WHERE id = $1 AND n = $2 RETURNING n"
                        ),
                        &[(&id.as_str(), PgType::TEXT), (&*n, PgType::INT8)],
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                if rows.len() != 1 {
                    return Err("raw postgres update: condition failed".into());
                }
                *n += 1;
                Ok(())
            }
            Raw::Redis { conn, cas, key, n } => {
                let set: i64 = cas
                    .key(key.as_str())
                    .arg(*n)
                    .arg(*n + 1)
                    .invoke_async(conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if set != 1 {
                    return Err("raw redis compare-and-set: condition failed".into());
                }
                *n += 1;
                Ok(())
            }
        }
    }

    /// One read.
    pub async fn read(&mut self) -> Result<(), String> {
        match self {
            Raw::None => Ok(()),
            Raw::Etcd { kv, key, .. } => kv
                .get(key.as_str(), None::<GetOptions>)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Raw::Nats { kv, key, .. } => kv
                .entry(key.as_str())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Raw::S3 { store, path, .. } => {
                let r = store.get(path).await.map_err(|e| e.to_string())?;
                r.bytes().await.map(|_| ()).map_err(|e| e.to_string())
            }
            Raw::Mongo { coll, id, .. } => coll
                .find_one(doc! { "_id": id.as_str() })
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Raw::Postgres { client, id, .. } => client
                .query_typed(
                    &format!("SELECT n FROM {PG_RAW_TABLE} WHERE id = $1"),
                    &[(&id.as_str(), PgType::TEXT)],
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Raw::Redis { conn, key, .. } => redis::cmd("GET")
                .arg(key.as_str())
                .query_async::<Option<String>>(conn)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_through_the_proxy() {
        let via: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        let url = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable";
        assert_eq!(
            url_via(url, via),
            "postgres://postgres@127.0.0.1:9999/postgres?sslmode=disable"
        );
        assert_eq!(
            url_via("postgres://127.0.0.1:5432", via),
            "postgres://127.0.0.1:9999"
        );
        assert_eq!(
            url_via("redis://127.0.0.1:6379", via),
            "redis://127.0.0.1:9999"
        );
        assert_eq!(
            addr_of("redis://127.0.0.1:6379"),
            Some("127.0.0.1:6379".parse().unwrap())
        );
        assert_eq!(addr_of(url), Some("127.0.0.1:5432".parse().unwrap()));
        assert_eq!(pg_table("bench-0a1b/lat"), "leases_bench_0a1b_lat");
    }
}
