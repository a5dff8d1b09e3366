//! Backend URLs: parsing (a usage error when wrong) and connecting.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
#[cfg(feature = "mongo")]
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use lease_core::{Error, LeaseBackend};

use crate::access::Material;

/// A parsed backend URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `etcd://host:2379[,host:2379]/prefix` (`etcds://` for TLS)
    Etcd {
        /// `host:port` each.
        endpoints: Vec<String>,
        prefix: String,
        /// TLS by the scheme (TLS options turn it on too).
        tls: bool,
    },
    /// `nats://host:4222[,host:4222]/bucket[?create=true]` (`natss://` for TLS)
    Nats {
        servers: String,
        bucket: String,
        /// Create the bucket if it is missing (off by default: a bucket
        /// made afresh restarts the fence counter).
        create: bool,
        /// TLS by the scheme (TLS options turn it on too).
        tls: bool,
    },
    /// `mongodb://host:27017/db?collection=…` (other options go to the driver)
    Mongo {
        uri: String,
        database: String,
        collection: String,
    },
    /// `s3://bucket/prefix?endpoint=…&region=…`
    S3 {
        bucket: String,
        prefix: String,
        endpoint: Option<String>,
        region: Option<String>,
    },
}

/// A URL that cannot be used: a usage error (exit code 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadUrl(pub String);

impl fmt::Display for BadUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub const SCHEMES: &str = "etcd://, etcds://, nats://, natss://, mongodb://, s3://";

const DEFAULT_ETCD_PREFIX: &str = "lease/";
const DEFAULT_NATS_BUCKET: &str = "leases";
const DEFAULT_MONGO_DB: &str = "lease";
const DEFAULT_MONGO_COLLECTION: &str = "leases";

impl Target {
    /// Parses a backend URL; see the `--help` text for the forms.
    pub fn parse(url: &str) -> Result<Target, BadUrl> {
        let fail = |why: &str| BadUrl(format!("bad backend URL {url:?}: {why}"));
        let bad = |why: &str| Err(fail(why));
        let Some((scheme, rest)) = url.split_once("://") else {
            return bad(&format!(
                "expected SCHEME://…, with SCHEME one of {SCHEMES}"
            ));
        };
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.split_once('/') {
            Some((a, p)) => (a, p.trim_matches('/')),
            None => (before_query, ""),
        };
        let params = parse_query(query.unwrap_or(""));
        match scheme {
            "etcd" | "etcds" => {
                let hosts = hosts(authority).map_err(|e| fail(&e))?;
                reject_params(&params, &[]).map_err(|e| fail(&e))?;
                let prefix = if path.is_empty() {
                    DEFAULT_ETCD_PREFIX.to_owned()
                } else {
                    format!("{path}/")
                };
                Ok(Target::Etcd {
                    endpoints: hosts,
                    prefix,
                    tls: scheme == "etcds",
                })
            }
            "nats" | "natss" => {
                let hosts = hosts(authority).map_err(|e| fail(&e))?;
                reject_params(&params, &["create"]).map_err(|e| fail(&e))?;
                let create = match params.get("create").map(String::as_str) {
                    None | Some("false") => false,
                    Some("true") => true,
                    Some(other) => {
                        return bad(&format!(
                            "create={other:?}: use create=true or create=false"
                        ))
                    }
                };
                if path.contains('/') {
                    return bad("the path is one bucket name (nats://host:4222/BUCKET)");
                }
                let bucket = if path.is_empty() {
                    DEFAULT_NATS_BUCKET.to_owned()
                } else {
                    path.to_owned()
                };
                if !bucket
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                {
                    return bad("a NATS KV bucket name may only contain A-Z a-z 0-9 _ -");
                }
                let servers = hosts
                    .iter()
                    .map(|h| format!("nats://{h}"))
                    .collect::<Vec<_>>()
                    .join(",");
                Ok(Target::Nats {
                    servers,
                    bucket,
                    create,
                    tls: scheme == "natss",
                })
            }
            "mongodb" | "mongodb+srv" => {
                if authority.is_empty() {
                    return bad("no host (mongodb://host:27017/db?collection=…)");
                }
                if path.contains('/') {
                    return bad("the path is one database name (mongodb://host/DB)");
                }
                let database = if path.is_empty() {
                    DEFAULT_MONGO_DB.to_owned()
                } else {
                    path.to_owned()
                };
                let mut collection = DEFAULT_MONGO_COLLECTION.to_owned();
                // `collection` is ours; every other option is the driver's.
                let mut rest = Vec::new();
                for (k, v) in query_pairs(query.unwrap_or("")) {
                    if k == "collection" {
                        if v.is_empty() {
                            return bad("empty collection name");
                        }
                        collection = v;
                    } else {
                        rest.push(format!("{k}={}", encode(&v)));
                    }
                }
                let mut uri = format!("{scheme}://{authority}/");
                if !rest.is_empty() {
                    uri.push('?');
                    uri.push_str(&rest.join("&"));
                }
                Ok(Target::Mongo {
                    uri,
                    database,
                    collection,
                })
            }
            "s3" => {
                if authority.is_empty() {
                    return bad("no bucket (s3://BUCKET/prefix?endpoint=…&region=…)");
                }
                reject_params(&params, &["endpoint", "region"]).map_err(|e| fail(&e))?;
                let endpoint = params.get("endpoint").cloned();
                if let Some(e) = &endpoint {
                    if !(e.starts_with("http://") || e.starts_with("https://")) {
                        return bad("endpoint must be an http:// or https:// URL");
                    }
                }
                Ok(Target::S3 {
                    bucket: authority.to_owned(),
                    prefix: path.to_owned(),
                    endpoint,
                    region: params.get("region").cloned(),
                })
            }
            "" => bad("empty scheme"),
            other => bad(&format!("unknown scheme {other:?}; supported: {SCHEMES}")),
        }
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        match self {
            Target::Etcd { .. } => "etcd",
            Target::Nats { .. } => "nats",
            Target::Mongo { .. } => "mongodb",
            Target::S3 { .. } => "s3",
        }
    }

    /// Whether this build has the backend (each is a cargo feature); a
    /// usage error otherwise.
    pub fn ensure_built(&self) -> Result<(), String> {
        let built = match self {
            Target::Etcd { .. } => cfg!(feature = "etcd"),
            Target::Nats { .. } => cfg!(feature = "nats"),
            Target::Mongo { .. } => cfg!(feature = "mongo"),
            Target::S3 { .. } => cfg!(feature = "s3"),
        };
        if built {
            return Ok(());
        }
        let backend = self.backend();
        let feature = if backend == "mongodb" {
            "mongo"
        } else {
            backend
        };
        Err(format!(
            "this build of `lease` has no {backend} support (install it with `cargo install lease-cli --features {feature}`)"
        ))
    }

    /// Connects (and for NATS and MongoDB, opens the bucket or collection),
    /// with the TLS and credentials in `access` (loaded for this target by
    /// [`Access::load`](crate::access::Access::load)). A client that needs an
    /// explicit shutdown is noted in `clients`.
    pub async fn connect(
        &self,
        access: Material,
        timeout: Duration,
        clients: &Clients,
    ) -> Result<Arc<dyn LeaseBackend>, Error> {
        let connecting = async {
            let backend: Arc<dyn LeaseBackend> = match self {
                #[cfg(feature = "etcd")]
                Target::Etcd {
                    endpoints, prefix, ..
                } => {
                    let scheme = if access.tls { "https" } else { "http" };
                    let endpoints = endpoints.iter().map(|h| format!("{scheme}://{h}"));
                    let mut cfg = lease_etcd::EtcdConfig::new(endpoints)
                        .key_prefix(prefix.clone())
                        .dial_timeout(timeout)
                        .request_timeout(timeout);
                    if let Some(ca) = access.ca_pem {
                        let mut tls = lease_etcd::TlsConfig::with_ca(ca);
                        if let Some((cert, key)) = access.identity {
                            tls = tls.client_identity(cert, key);
                        }
                        cfg = cfg.tls(tls);
                    }
                    if let Some((user, password)) = access.user {
                        cfg = cfg.user(user, password);
                    }
                    Arc::new(lease_etcd::EtcdBackend::connect(cfg).await?)
                }
                #[cfg(feature = "nats")]
                Target::Nats {
                    servers,
                    bucket,
                    create,
                    ..
                } => {
                    let cfg = lease_nats::NatsConfig::new(bucket.clone())
                        .request_timeout(timeout)
                        .create_bucket(*create);
                    let options = nats_options(access).await?;
                    Arc::new(
                        lease_nats::NatsBackend::connect_with_options(servers, options, cfg)
                            .await?,
                    )
                }
                #[cfg(feature = "mongo")]
                Target::Mongo {
                    uri,
                    database,
                    collection,
                } => {
                    let cfg = lease_mongo::MongoConfig::new(database.clone())
                        .collection(collection.clone())
                        .request_timeout(timeout);
                    let mongo = lease_mongo::MongoBackend::connect(uri, cfg).await?;
                    clients.note_mongo(mongo.clone());
                    Arc::new(mongo)
                }
                #[cfg(feature = "s3")]
                Target::S3 {
                    bucket,
                    prefix,
                    endpoint,
                    region,
                } => {
                    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
                    let mut cfg = lease_s3::S3Config::new(bucket.clone());
                    if let Some(r) = region
                        .clone()
                        .or_else(|| env("AWS_REGION"))
                        .or_else(|| env("AWS_DEFAULT_REGION"))
                    {
                        cfg = cfg.region(r);
                    }
                    if let Some(e) = endpoint
                        .clone()
                        .or_else(|| env("AWS_ENDPOINT_URL_S3"))
                        .or_else(|| env("AWS_ENDPOINT_URL"))
                    {
                        cfg = cfg.endpoint(e);
                    }
                    if let (Some(k), Some(s)) =
                        (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"))
                    {
                        cfg = cfg.credentials(k, s);
                    }
                    let mut builder = cfg.builder();
                    if let Some(t) = env("AWS_SESSION_TOKEN") {
                        builder = builder.with_token(t);
                    }
                    let store = lease_s3::build_s3(builder)?;
                    Arc::new(lease_s3::ObjectStoreBackend::new(store, prefix)?)
                }
                #[cfg(not(all(
                    feature = "etcd",
                    feature = "nats",
                    feature = "mongo",
                    feature = "s3"
                )))]
                _ => {
                    let _ = (access, clients);
                    return Err(Error::Backend(
                        self.ensure_built().err().unwrap_or_default().into(),
                    ));
                }
            };
            Ok(backend)
        };
        match tokio::time::timeout(timeout, connecting).await {
            Ok(r) => r,
            Err(_) => Err(Error::Unavailable {
                detail: format!("could not connect to {} within {timeout:?}", self.backend()),
                source: None,
            }),
        }
    }
}

/// async-nats' options for the TLS and credentials given.
#[cfg(feature = "nats")]
async fn nats_options(access: Material) -> Result<lease_nats::async_nats::ConnectOptions, Error> {
    let mut o = lease_nats::async_nats::ConnectOptions::new().require_tls(access.tls);
    if let Some(ca) = access.ca_file {
        o = o.add_root_certificates(ca);
    }
    if let Some((cert, key)) = access.identity_files {
        o = o.add_client_certificate(cert, key);
    }
    if let Some((user, password)) = access.user {
        o = o.user_and_password(user, password);
    }
    if let Some(token) = access.token {
        o = o.token(token);
    }
    if let Some(seed) = access.nkey_seed {
        o = o.nkey(seed);
    }
    if let Some(creds) = access.creds {
        o = o.credentials_file(&creds).await.map_err(|e| {
            Error::Backend(format!("NATS credentials file {}: {e}", creds.display()).into())
        })?;
    }
    Ok(o)
}

/// Clients to shut down while the runtime still runs.
///
/// The MongoDB driver cleans up a dropped client in a task it spawns at drop
/// time; when that happens as the runtime tears down, the task can panic
/// inside the driver and print a backtrace on the command's stderr. Shutting
/// the client down first leaves nothing to clean up.
#[derive(Debug, Default)]
pub struct Clients {
    #[cfg(feature = "mongo")]
    mongo: Mutex<Vec<lease_mongo::MongoBackend>>,
}

impl Clients {
    #[cfg(feature = "mongo")]
    fn note_mongo(&self, backend: lease_mongo::MongoBackend) {
        self.mongo
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(backend);
    }

    /// Shuts every noted client down, giving up after `limit` (a frozen
    /// server must not hold up the exit).
    pub async fn shutdown(&self, limit: Duration) {
        #[cfg(not(feature = "mongo"))]
        let _ = limit;
        #[cfg(feature = "mongo")]
        let mongo = std::mem::take(&mut *self.mongo.lock().unwrap_or_else(PoisonError::into_inner));
        #[cfg(feature = "mongo")]
        {
            let all = async {
                for m in &mongo {
                    m.shutdown().await;
                }
            };
            if tokio::time::timeout(limit, all).await.is_err() {
                tracing::debug!(?limit, "client shutdown did not finish");
            }
        }
    }
}

fn hosts(authority: &str) -> Result<Vec<String>, String> {
    if authority.is_empty() {
        return Err("no host".into());
    }
    let mut out = Vec::new();
    for h in authority.split(',') {
        let h = h.trim();
        if h.is_empty() {
            return Err("empty host in the host list".into());
        }
        if h.contains('@') {
            return Err("credentials in the URL are not supported".into());
        }
        if let Some((_, port)) = h.rsplit_once(':') {
            if port.parse::<u16>().is_err() {
                return Err(format!("bad port in {h:?}"));
            }
        }
        out.push(h.to_owned());
    }
    Ok(out)
}

fn reject_params(params: &BTreeMap<String, String>, allowed: &[&str]) -> Result<(), String> {
    match params.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) if allowed.is_empty() => {
            Err(format!("unknown option {k:?} (this scheme takes none)"))
        }
        Some(k) => Err(format!(
            "unknown option {k:?} (allowed: {})",
            allowed.join(", ")
        )),
        None => Ok(()),
    }
}

fn query_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    query_pairs(q).into_iter().collect()
}

/// Percent-decoding (`+` stays `+`); malformed escapes are kept verbatim.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// What a query value may hold unescaped when passed on to the driver.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':')
    .remove(b'/')
    .remove(b',');

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, QUERY_VALUE).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme() {
        assert_eq!(
            Target::parse("etcd://a:2379,b:2379/jobs").unwrap(),
            Target::Etcd {
                endpoints: vec!["a:2379".into(), "b:2379".into()],
                prefix: "jobs/".into(),
                tls: false,
            }
        );
        assert_eq!(
            Target::parse("etcds://a:2379").unwrap(),
            Target::Etcd {
                endpoints: vec!["a:2379".into()],
                prefix: "lease/".into(),
                tls: true,
            }
        );
        assert!(matches!(
            Target::parse("natss://a:4222/b").unwrap(),
            Target::Nats { tls: true, .. }
        ));
        assert_eq!(
            Target::parse("nats://127.0.0.1:4222/locks").unwrap(),
            Target::Nats {
                servers: "nats://127.0.0.1:4222".into(),
                bucket: "locks".into(),
                create: false,
                tls: false,
            }
        );
        assert_eq!(
            Target::parse("nats://h:4222/locks?create=true").unwrap(),
            Target::Nats {
                servers: "nats://h:4222".into(),
                bucket: "locks".into(),
                create: true,
                tls: false,
            }
        );
        assert!(Target::parse("nats://h:4222/locks?create=yes").is_err());
        assert_eq!(
            Target::parse("mongodb://h:27017/ops?collection=locks&directConnection=true").unwrap(),
            Target::Mongo {
                uri: "mongodb://h:27017/?directConnection=true".into(),
                database: "ops".into(),
                collection: "locks".into()
            }
        );
        assert_eq!(
            Target::parse("s3://bkt/leases/x?endpoint=http://127.0.0.1:9000&region=eu-west-1")
                .unwrap(),
            Target::S3 {
                bucket: "bkt".into(),
                prefix: "leases/x".into(),
                endpoint: Some("http://127.0.0.1:9000".into()),
                region: Some("eu-west-1".into())
            }
        );
    }

    #[test]
    fn refuses_bad_urls() {
        for url in [
            "redis://h/x",
            "etcd:/h",
            "etcd://",
            "etcd://h:notaport/x",
            "nats://h/a/b",
            "s3:///x",
            "s3://b/x?bogus=1",
            "localhost:2379",
        ] {
            let e = Target::parse(url).unwrap_err();
            assert!(!e.0.contains('\n'), "{e}");
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(decode("http%3A%2F%2Fh%3A9"), "http://h:9");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(decode("a+b"), "a+b");
        assert_eq!(encode("a b&c=d/e:f"), "a%20b%26c%3Dd/e:f");
        assert_eq!(decode(&encode("é+%")), "é+%");
    }
}
