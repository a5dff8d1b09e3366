//! Opening a backend from a URL: [`connect`] and the [`Connect`] builder
//! for TLS, credentials and the timeout.

use std::fmt;
#[cfg(any(feature = "etcd", feature = "nats", feature = "redis"))]
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, LeaseBackend};

use crate::connection::Connection;
use crate::error::ConnectError;
use crate::scheme::BackendKind;
use crate::url::BackendUrl;

/// The default of [`Connect::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to the backend `url` names, with every default: no TLS beyond
/// what the scheme asks for, no credentials, a 10 s timeout.
///
/// The same as `Connect::new(url).connect().await`; see [`Connect`] for the
/// options and the [URL grammar](crate::url).
///
/// Every operation on the backend it opens is a `tracing` span (and, with
/// the `metrics` feature, recorded as metrics): see [`Connection`].
///
/// # Errors
/// As [`Connect::connect`].
pub async fn connect(url: &str) -> Result<Connection, ConnectError> {
    Connect::new(url).connect().await
}

/// Options for connecting to a backend URL: the timeout, TLS and
/// credentials.
///
/// TLS and credentials apply to etcd and NATS, and the CA to Redis (which
/// takes its user and password in its URL, `redis://user:password@host/0`,
/// and no client certificate); MongoDB takes them in its
/// URL (`mongodb://user:password@host/db?tls=true&tlsCAFile=FILE`) and S3
/// from the AWS environment as object_store reads it
/// (`AmazonS3Builder::from_env`: `AWS_ACCESS_KEY_ID`, `AWS_SESSION_TOKEN`,
/// web identity, ECS and EKS container credentials, instance metadata,
/// `AWS_REGION`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, …; the URL's `region` and
/// `endpoint` win). An option given for a backend it does not apply to is
/// refused rather than ignored.
///
/// TLS material is PEM, given either as bytes ([`ca_pem`](Self::ca_pem),
/// [`client_identity`](Self::client_identity)) or as files read at connect
/// time ([`ca_file`](Self::ca_file), [`identity_files`](Self::identity_files));
/// either form works for every backend that takes it, and the later call of
/// a pair wins. Any TLS option turns TLS on, as `etcds://`, `natss://` and
/// `rediss://` do. TLS to etcd needs the CA; NATS and Redis without one
/// trust the system's roots.
///
/// No crate here installs a process-wide rustls crypto provider: that is the
/// application's choice. etcd and S3 use the process default when there is
/// one and a provider of their own otherwise; the NATS TLS configuration
/// built here names its provider (ring) explicitly, as lease-redis does when
/// there is no process default; MongoDB's driver always uses its own.
///
/// ```no_run
/// # async fn example() -> Result<(), lease::ConnectError> {
/// use std::time::Duration;
///
/// let connection = lease::Connect::new("etcds://etcd-1:2379,etcd-2:2379/ops")
///     .ca_file("/etc/lease/ca.pem")
///     .identity_files("/etc/lease/me.pem", "/etc/lease/me-key.pem")
///     .timeout(Duration::from_secs(5))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
///
/// `Debug` shows which options are set, never a password, token, seed or
/// key.
#[derive(Clone)]
pub struct Connect {
    url: Result<BackendUrl, (String, String)>,
    timeout: Duration,
    ca: Option<Pem>,
    identity: Option<(Pem, Pem)>,
    user: Option<(String, String)>,
    token: Option<String>,
    nkey_seed: Option<String>,
    creds: Option<PathBuf>,
}

/// PEM material, in memory or in a file.
#[derive(Clone)]
enum Pem {
    Bytes(Vec<u8>),
    File(PathBuf),
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pem::Bytes(b) => write!(f, "<{} bytes of PEM>", b.len()),
            Pem::File(p) => p.fmt(f),
        }
    }
}

impl Connect {
    /// Options for `url` (see the [URL grammar](crate::url)); a URL that does
    /// not parse is reported by [`connect`](Self::connect).
    pub fn new(url: impl AsRef<str>) -> Connect {
        let url = match BackendUrl::parse(url.as_ref()) {
            Ok(u) => Ok(u),
            Err(ConnectError::BadUrl { url, reason }) => Err((url, reason)),
            Err(other) => Err((url.as_ref().to_owned(), other.to_string())),
        };
        Connect::with(url)
    }

    fn with(url: Result<BackendUrl, (String, String)>) -> Connect {
        Connect {
            url,
            timeout: DEFAULT_TIMEOUT,
            ca: None,
            identity: None,
            user: None,
            token: None,
            nkey_seed: None,
            creds: None,
        }
    }

    /// The time limit for connecting, and for each request of the backend
    /// (default 10 s). Keep it below your TTLs: a renewal that answers after
    /// the lease's deadline is worthless anyway.
    pub fn timeout(mut self, timeout: Duration) -> Connect {
        self.timeout = timeout;
        self
    }

    /// The CA certificates (PEM) that signed the servers' certificates;
    /// turns TLS on (etcd, NATS, Redis).
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Connect {
        self.ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// As [`ca_pem`](Self::ca_pem), read from a file when connecting.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Connect {
        self.ca = Some(Pem::File(path.into()));
        self
    }

    /// A client certificate and its private key (PEM) for TLS client
    /// authentication; turns TLS on (etcd, NATS).
    pub fn client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Connect {
        self.identity = Some((Pem::Bytes(cert_pem.into()), Pem::Bytes(key_pem.into())));
        self
    }

    /// As [`client_identity`](Self::client_identity), read from files when
    /// connecting.
    pub fn identity_files(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Connect {
        self.identity = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// A user name and password: etcd's authentication, or NATS
    /// user/password authentication.
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Connect {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// A NATS authentication token.
    pub fn nats_token(mut self, token: impl Into<String>) -> Connect {
        self.token = Some(token.into());
        self
    }

    /// A NATS user nkey seed (`SU…`).
    pub fn nats_nkey_seed(mut self, seed: impl Into<String>) -> Connect {
        self.nkey_seed = Some(seed.into());
        self
    }

    /// A NATS credentials file (user JWT and nkey seed, as `nsc` writes it),
    /// read when connecting.
    pub fn nats_credentials_file(mut self, path: impl Into<PathBuf>) -> Connect {
        self.creds = Some(path.into());
        self
    }

    /// Connects, and for NATS and MongoDB opens the bucket or collection.
    ///
    /// `memory://` makes a new, empty [`Fake`](lease_fake::Fake) each time:
    /// two connections to `memory://` share nothing (share one
    /// [`Connection`], or build the fake yourself, to share one store).
    ///
    /// # Errors
    /// * [`ConnectError::BadUrl`]: the URL does not parse;
    /// * [`ConnectError::FeatureDisabled`]: the backend's feature is off;
    /// * [`ConnectError::BadOptions`]: options the backend does not take (a
    ///   NATS token for etcd, TLS to etcd without a CA, two NATS
    ///   authentication methods, a client certificate for Redis), or TLS
    ///   material that cannot be read;
    /// * [`ConnectError::Backend`]: the backend's own error, e.g.
    ///   [`Error::Unavailable`] when it did not answer within the timeout.
    pub async fn connect(&self) -> Result<Connection, ConnectError> {
        let url = match &self.url {
            Ok(u) => u,
            Err((url, reason)) => {
                return Err(ConnectError::BadUrl {
                    url: url.clone(),
                    reason: reason.clone(),
                })
            }
        };
        let kind = url.kind();
        if !kind.is_enabled() {
            return Err(ConnectError::FeatureDisabled { kind });
        }
        let tls = self.check(url)?;
        let timeout = self.timeout;
        let backend = match tokio::time::timeout(timeout, self.open(url, tls)).await {
            Ok(opened) => opened?,
            Err(_) => {
                return Err(Error::Unavailable {
                    detail: format!("could not connect to {kind} within {timeout:?}"),
                    source: None,
                }
                .into())
            }
        };
        Ok(Connection::new(backend, url.clone()))
    }

    /// The options set, by the name of the method that set them.
    fn given(&self) -> Vec<&'static str> {
        [
            self.ca.as_ref().map(|p| match p {
                Pem::Bytes(_) => "ca_pem",
                Pem::File(_) => "ca_file",
            }),
            self.identity.as_ref().map(|(p, _)| match p {
                Pem::Bytes(_) => "client_identity",
                Pem::File(_) => "identity_files",
            }),
            self.user.as_ref().map(|_| "user"),
            self.token.as_ref().map(|_| "nats_token"),
            self.nkey_seed.as_ref().map(|_| "nats_nkey_seed"),
            self.creds.as_ref().map(|_| "nats_credentials_file"),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Checks the options against the backend; whether TLS is on.
    fn check(&self, url: &BackendUrl) -> Result<bool, ConnectError> {
        let kind = url.kind();
        let given = self.given();
        let instead = match kind {
            BackendKind::Mongo => Some(
                "MongoDB takes them in its URL: mongodb://user:password@host/db?tls=true&tlsCAFile=FILE&tlsCertificateKeyFile=FILE",
            ),
            BackendKind::S3 => Some(
                "S3 takes credentials and TLS settings from the AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, container and instance credentials, …) and an https:// endpoint",
            ),
            BackendKind::Memory => Some("memory:// takes none"),
            BackendKind::Postgres => Some(
                "PostgreSQL takes them in its URL: postgres://user:password@host/db?sslmode=…",
            ),
            BackendKind::Etcd | BackendKind::Nats | BackendKind::Redis => None,
        };
        if let Some(instead) = instead {
            return match given.first() {
                Some(first) => Err(ConnectError::options(format!(
                    "Connect::{first} applies to etcd and NATS only; {instead}"
                ))),
                None => Ok(false),
            };
        }
        if kind == BackendKind::Redis {
            if let Some(other) = given.iter().find(|g| !matches!(**g, "ca_pem" | "ca_file")) {
                let why = match *other {
                    "user" => "Redis takes its user and password in its URL: redis://user:password@host:6379/0",
                    "client_identity" | "identity_files" => {
                        "TLS to Redis authenticates the server only: give its CA (Connect::ca_pem or Connect::ca_file), no client certificate"
                    }
                    _ => "it applies to NATS only",
                };
                return Err(ConnectError::options(format!(
                    "Connect::{other} does not apply to Redis: {why}"
                )));
            }
        }
        if kind == BackendKind::Etcd {
            if let Some(nats) = given.iter().find(|g| g.starts_with("nats_")) {
                return Err(ConnectError::options(format!(
                    "Connect::{nats} applies to NATS only"
                )));
            }
        }
        if let Some((name, _)) = &self.user {
            if name.is_empty() {
                return Err(ConnectError::options("Connect::user: empty user name"));
            }
        }
        let methods = [
            self.user.is_some(),
            self.token.is_some(),
            self.nkey_seed.is_some(),
            self.creds.is_some(),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            return Err(ConnectError::options(
                "give one of Connect::user, nats_token, nats_nkey_seed and nats_credentials_file",
            ));
        }
        let tls = url.tls() || self.ca.is_some() || self.identity.is_some();
        if kind == BackendKind::Etcd && tls && self.ca.is_none() {
            return Err(ConnectError::options(
                "TLS to etcd needs the CA that signed the etcd servers' certificates: Connect::ca_pem or Connect::ca_file",
            ));
        }
        Ok(tls)
    }

    /// Opens the backend (the options already checked): the scheme picks
    /// the crate, whose `from_url` reads the rest of the URL.
    #[cfg_attr(not(any(feature = "etcd", feature = "nats")), allow(unused_variables))]
    async fn open(
        &self,
        url: &BackendUrl,
        tls: bool,
    ) -> Result<Arc<dyn LeaseBackend>, ConnectError> {
        // Parsing the URL ran the same parser, so this refuses nothing new.
        #[cfg_attr(
            not(any(
                feature = "etcd",
                feature = "nats",
                feature = "mongo",
                feature = "s3",
                feature = "postgres",
                feature = "redis"
            )),
            allow(unused_variables)
        )]
        let bad = |e: Error| ConnectError::BadUrl {
            url: url.to_string(),
            reason: crate::url::reason(e),
        };
        match url.kind() {
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => {
                let cfg = lease_etcd::EtcdConfig::from_url(url.as_str()).map_err(bad)?;
                self.etcd(cfg, tls).await
            }
            #[cfg(feature = "nats")]
            BackendKind::Nats => {
                let (servers, cfg) = lease_nats::NatsConfig::from_url(url.as_str()).map_err(bad)?;
                let cfg = cfg.request_timeout(self.timeout);
                let options = self.nats_options(tls).await?;
                let nats =
                    lease_nats::NatsBackend::connect_with_options(&servers, options, cfg).await?;
                Ok(Arc::new(nats))
            }
            #[cfg(feature = "mongo")]
            BackendKind::Mongo => {
                let (uri, cfg) = lease_mongo::MongoConfig::from_url(url.as_str()).map_err(bad)?;
                // The driver's full reading, DNS (`mongodb+srv://`) included.
                let options = lease_mongo::mongodb::options::ClientOptions::parse(&uri)
                    .await
                    .map_err(|e| ConnectError::BadUrl {
                        url: url.to_string(),
                        reason: format!("the MongoDB driver refused it: {e}"),
                    })?;
                let cfg = cfg.request_timeout(self.timeout);
                let mongo = lease_mongo::MongoBackend::connect_with_options(options, cfg).await?;
                Ok(Arc::new(mongo))
            }
            #[cfg(feature = "s3")]
            BackendKind::S3 => {
                let (cfg, prefix) = lease_s3::S3Config::from_url(url.as_str()).map_err(bad)?;
                Ok(Arc::new(lease_s3::ObjectStoreBackend::new(
                    cfg.build()?,
                    &prefix,
                )?))
            }
            #[cfg(feature = "fake")]
            BackendKind::Memory => Ok(Arc::new(lease_fake::Fake::new())),
            #[cfg(feature = "postgres")]
            BackendKind::Postgres => {
                let (pg_url, cfg) =
                    lease_postgres::PostgresConfig::from_url(url.as_str()).map_err(bad)?;
                let cfg = cfg.request_timeout(self.timeout);
                let pg = lease_postgres::PostgresBackend::connect(&pg_url, cfg).await?;
                Ok(Arc::new(pg))
            }
            #[cfg(feature = "redis")]
            BackendKind::Redis => {
                let (redis_url, cfg) =
                    lease_redis::RedisConfig::from_url(url.as_str()).map_err(bad)?;
                self.redis(&redis_url, cfg).await
            }
            #[allow(unreachable_patterns)]
            kind => Err(ConnectError::FeatureDisabled { kind }),
        }
    }

    #[cfg(feature = "etcd")]
    async fn etcd(
        &self,
        cfg: lease_etcd::EtcdConfig,
        tls: bool,
    ) -> Result<Arc<dyn LeaseBackend>, ConnectError> {
        let mut cfg = cfg.dial_timeout(self.timeout).request_timeout(self.timeout);
        if tls {
            // A TLS option on an `etcd://` URL: the same endpoints, over TLS.
            for endpoint in &mut cfg.endpoints {
                if let Some(host) = endpoint.strip_prefix("http://") {
                    *endpoint = format!("https://{host}");
                }
            }
        }
        if let Some(ca) = &self.ca {
            let mut tls = lease_etcd::TlsConfig::with_ca(ca.bytes("CA certificate")?);
            if let Some((cert, key)) = &self.identity {
                tls = tls
                    .client_identity(cert.bytes("client certificate")?, key.bytes("client key")?);
            }
            cfg = cfg.tls(tls);
        }
        if let Some((user, password)) = &self.user {
            cfg = cfg.user(user, password);
        }
        Ok(Arc::new(lease_etcd::EtcdBackend::connect(cfg).await?))
    }

    /// Redis with the facade's timeout for connecting and for each request;
    /// a CA turns TLS on for a `redis://` URL too (a `rediss://` URL
    /// without one trusts the system's roots).
    #[cfg(feature = "redis")]
    async fn redis(
        &self,
        url: &str,
        cfg: lease_redis::RedisConfig,
    ) -> Result<Arc<dyn LeaseBackend>, ConnectError> {
        let mut cfg = cfg
            .connect_timeout(self.timeout)
            .request_timeout(self.timeout);
        if let Some(ca) = &self.ca {
            cfg = cfg.tls(lease_redis::TlsConfig::new(ca.bytes("CA certificate")?));
        }
        Ok(Arc::new(
            lease_redis::RedisBackend::connect(url, cfg).await?,
        ))
    }

    /// async-nats' options for the TLS and credentials given. TLS files go
    /// to async-nats as they are (it reads them itself); PEM bytes become a
    /// rustls configuration that trusts the same roots.
    #[cfg(feature = "nats")]
    async fn nats_options(
        &self,
        tls: bool,
    ) -> Result<lease_nats::async_nats::ConnectOptions, ConnectError> {
        let mut o = lease_nats::async_nats::ConnectOptions::new().require_tls(tls);
        // Always our own rustls configuration, with an explicit provider:
        // async-nats would otherwise need a process-wide default provider,
        // which no library installs (it is the application's to choose, and
        // with several compiled in none is picked for it).
        if tls || self.ca.is_some() || self.identity.is_some() {
            let ca = match &self.ca {
                Some(ca) => Some(ca.bytes("CA certificate")?),
                None => None,
            };
            let identity = match &self.identity {
                Some((cert, key)) => {
                    Some((cert.bytes("client certificate")?, key.bytes("client key")?))
                }
                None => None,
            };
            let config =
                crate::nats_tls::client_config(ca, identity).map_err(ConnectError::options)?;
            o = o.tls_client_config(config);
        }
        if let Some((user, password)) = &self.user {
            o = o.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &self.token {
            o = o.token(token.clone());
        }
        if let Some(seed) = &self.nkey_seed {
            o = o.nkey(seed.clone());
        }
        if let Some(creds) = &self.creds {
            o = o.credentials_file(creds).await.map_err(|e| {
                Error::Backend(format!("NATS credentials file {}: {e}", creds.display()).into())
            })?;
        }
        Ok(o)
    }
}

impl From<BackendUrl> for Connect {
    /// Options for an already parsed URL.
    fn from(url: BackendUrl) -> Connect {
        Connect::with(Ok(url))
    }
}

/// Never prints a password, token, seed or key.
impl fmt::Debug for Connect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url: &dyn fmt::Debug = match &self.url {
            Ok(u) => u,
            Err((shown, _)) => shown,
        };
        let secret = |set: bool| set.then_some("<redacted>");
        f.debug_struct("Connect")
            .field("url", url)
            .field("timeout", &self.timeout)
            .field("ca", &self.ca)
            .field(
                "identity",
                &self.identity.as_ref().map(|(cert, _)| (cert, "<redacted>")),
            )
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("token", &secret(self.token.is_some()))
            .field("nkey_seed", &secret(self.nkey_seed.is_some()))
            .field("creds", &self.creds)
            .finish()
    }
}

impl Pem {
    /// The PEM bytes, read from the file if need be.
    #[cfg(any(feature = "etcd", feature = "nats", feature = "redis"))]
    fn bytes(&self, what: &str) -> Result<Vec<u8>, ConnectError> {
        match self {
            Pem::Bytes(b) => Ok(b.clone()),
            Pem::File(path) => read(path, what),
        }
    }
}

#[cfg(any(feature = "etcd", feature = "nats", feature = "redis"))]
fn read(path: &Path, what: &str) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path)
        .map_err(|e| ConnectError::options(format!("{what} {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(connect: &Connect, url: &str) -> String {
        let url = BackendUrl::parse(url).expect("url");
        match connect.check(&url) {
            Err(ConnectError::BadOptions { reason }) => reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn options_that_do_not_fit_are_refused() {
        let token = Connect::new("").nats_token("t");
        let e = refused(&token, "s3://b/p");
        assert!(
            e.contains("Connect::nats_token applies to etcd and NATS only"),
            "{e}"
        );
        assert!(e.contains("AWS_ACCESS_KEY_ID"), "{e}");
        let e = refused(&token, "mongodb://h/db");
        assert!(e.contains("in its URL"), "{e}");
        let e = refused(&token, "memory://");
        assert!(e.contains("memory:// takes none"), "{e}");
        let e = refused(&token, "etcd://h:2379");
        assert!(e.contains("nats_token applies to NATS only"), "{e}");
        let e = refused(&Connect::new(""), "etcds://h:2379");
        assert!(e.contains("Connect::ca_pem or Connect::ca_file"), "{e}");
        let e = refused(
            &Connect::new("").identity_files("c.pem", "k.pem"),
            "etcd://h:2379",
        );
        assert!(e.contains("TLS to etcd needs"), "{e}");
        let e = refused(&Connect::new("").user("", "pw"), "etcd://h:2379");
        assert!(e.contains("empty user name"), "{e}");
        let two = Connect::new("").nats_token("t").user("u", "p");
        let e = refused(&two, "nats://h:4222");
        assert!(e.contains("give one of"), "{e}");
        let e = refused(&Connect::new("").user("u", "p"), "redis://h");
        assert!(e.contains("redis://user:password@host"), "{e}");
        let e = refused(
            &Connect::new("").ca_file("ca.pem").identity_files("c", "k"),
            "rediss://h",
        );
        assert!(
            e.contains("identity_files does not apply to Redis")
                && e.contains("no client certificate"),
            "{e}"
        );
        let e = refused(&token, "valkey://h");
        assert!(e.contains("nats_token does not apply to Redis"), "{e}");
    }

    #[test]
    fn tls_is_on_by_scheme_or_option() {
        let check = |c: &Connect, url: &str| {
            c.check(&BackendUrl::parse(url).expect("url"))
                .expect("accepted")
        };
        assert!(!check(&Connect::new(""), "nats://h:4222"));
        assert!(check(&Connect::new(""), "natss://h:4222"));
        assert!(check(&Connect::new("").ca_pem("x"), "nats://h:4222"));
        assert!(check(
            &Connect::new("").client_identity("c", "k"),
            "nats://h:4222"
        ));
        assert!(check(&Connect::new("").ca_file("ca.pem"), "etcd://h:2379"));
        assert!(!check(&Connect::new("").user("u", "p"), "etcd://h:2379"));
        assert!(!check(&Connect::new(""), "s3://b"));
        assert!(!check(&Connect::new(""), "redis://h"));
        assert!(check(&Connect::new(""), "rediss://h"));
        assert!(check(&Connect::new("").ca_pem("x"), "redis://h"));
        assert!(check(&Connect::new("").ca_file("ca.pem"), "valkey://h"));
    }

    #[test]
    fn debug_shows_no_secrets() {
        let c = Connect::new("mongodb://root:pw-in-url@h/db")
            .user("root", "pw-in-option")
            .nats_token("the-token")
            .nats_nkey_seed("SUSEED")
            .client_identity("CERT", "THE-KEY")
            .ca_file("/etc/ca.pem");
        let shown = format!("{c:?}");
        for secret in [
            "pw-in-url",
            "pw-in-option",
            "the-token",
            "SUSEED",
            "THE-KEY",
        ] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(
            shown.contains("root") && shown.contains("/etc/ca.pem"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn a_bad_url_is_reported_when_connecting() {
        let e = Connect::new("zookeeper://h/x")
            .connect()
            .await
            .expect_err("refused");
        assert!(matches!(e, ConnectError::BadUrl { .. }), "{e:?}");
        assert!(e.is_usage());
        assert!(e.to_string().contains("unknown scheme"), "{e}");
    }
}
