//! Backend URLs: which backend, where, and with which options.
//!
//! The grammar (the same as the `lease` command's):
//!
//! | URL | |
//! |---|---|
//! | `etcd://host:2379[,host:2379]/prefix[?sessions=true]` | a host without a port is on 2379 (NATS: 4222, MongoDB: 27017, PostgreSQL: 5432); keys live under `prefix/` (default `lease/`); `etcds://` for TLS; `sessions=true` shares one etcd lease among the keys a client holds with one TTL (cheaper; see `lease_etcd::EtcdConfig::sessions` for the trade-off) |
//! | `nats://host:4222[,host:4222]/bucket[?create=true]` | a JetStream KV bucket (default `leases`); `natss://` for TLS; `create=true` creates a missing bucket |
//! | `mongodb://host:27017/db?collection=name` | the URI, but for `collection`, goes to the driver as written, so the database is also the default `authSource`; defaults: database `lease`, collection `leases` (`mongodb+srv://` too) |
//! | `s3://bucket/prefix?endpoint=URL&region=R` | credentials from the AWS environment variables |
//! | `postgres://user:password@host:5432/db?table=name` | default table `leases`; every other query option (`sslmode`, `application_name`, …) goes to tokio-postgres (`postgresql://` too) |
//! | `memory://` | a fresh in-memory fake on every connect (feature `fake`) |

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::ConnectError;

/// The backends a URL can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// `etcd://`, `etcds://`
    Etcd,
    /// `nats://`, `natss://`
    Nats,
    /// `mongodb://`, `mongodb+srv://`
    Mongo,
    /// `s3://`
    S3,
    /// `memory://`
    Memory,
    /// `postgres://`, `postgresql://`
    Postgres,
}

impl BackendKind {
    /// The backend's name: `etcd`, `nats`, `mongodb`, `s3`, `memory` or `postgres`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Etcd => "etcd",
            BackendKind::Nats => "nats",
            BackendKind::Mongo => "mongodb",
            BackendKind::S3 => "s3",
            BackendKind::Memory => "memory",
            BackendKind::Postgres => "postgres",
        }
    }

    /// The cargo feature of this crate that brings the backend in.
    pub fn feature(self) -> &'static str {
        match self {
            BackendKind::Etcd => "etcd",
            BackendKind::Nats => "nats",
            BackendKind::Mongo => "mongo",
            BackendKind::S3 => "s3",
            BackendKind::Memory => "fake",
            BackendKind::Postgres => "postgres",
        }
    }

    /// Whether this build has the backend's feature.
    pub fn is_enabled(self) -> bool {
        match self {
            BackendKind::Etcd => cfg!(feature = "etcd"),
            BackendKind::Nats => cfg!(feature = "nats"),
            BackendKind::Mongo => cfg!(feature = "mongo"),
            BackendKind::S3 => cfg!(feature = "s3"),
            BackendKind::Memory => cfg!(feature = "fake"),
            BackendKind::Postgres => cfg!(feature = "postgres"),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed backend URL.
///
/// Parsing checks everything that can be checked without connecting; a URL
/// of a backend whose feature is off still parses (connecting to it is then
/// [`ConnectError::FeatureDisabled`]). `Debug` and `Display` show the URL with
/// any password in it masked.
#[derive(Clone, PartialEq, Eq)]
pub struct BackendUrl {
    pub(crate) target: Target,
    /// The URL as given, password masked.
    shown: String,
}

/// What a URL says, per backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `etcd://host:2379[,host:2379]/prefix[?sessions=true]` (`etcds://` for TLS)
    Etcd {
        /// `host:port` each.
        endpoints: Vec<String>,
        prefix: String,
        /// TLS by the scheme (TLS options turn it on too).
        tls: bool,
        /// One etcd lease shared by the keys a client holds with one TTL.
        sessions: bool,
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
    /// `mongodb://host:27017/db?collection=…`: the URI as given, but for
    /// `collection`, is the driver's to parse (the database too, read from
    /// the driver's options when connecting).
    Mongo { uri: String, collection: String },
    /// `s3://bucket/prefix?endpoint=…&region=…`
    S3 {
        bucket: String,
        prefix: String,
        endpoint: Option<String>,
        region: Option<String>,
    },
    /// `memory://`
    Memory,
    /// `postgres://user:password@host:5432/db?table=…` (other options go to
    /// tokio-postgres)
    Postgres { url: String, table: String },
}

/// The schemes, for messages.
pub const SCHEMES: &str =
    "etcd://, etcds://, nats://, natss://, mongodb://, s3://, memory://, postgres://";

const DEFAULT_ETCD_PREFIX: &str = "lease/";
const DEFAULT_NATS_BUCKET: &str = "leases";
/// The database of a MongoDB URL that names none.
#[cfg_attr(not(feature = "mongo"), allow(dead_code))]
pub(crate) const DEFAULT_MONGO_DB: &str = "lease";
const DEFAULT_MONGO_COLLECTION: &str = "leases";
const DEFAULT_POSTGRES_TABLE: &str = "leases";

impl BackendUrl {
    /// Parses a backend URL (see the [module documentation](self) for the
    /// forms).
    ///
    /// # Errors
    /// [`ConnectError::BadUrl`], saying what is wrong, for a URL this crate
    /// cannot use: an unknown scheme, a bad port, an unknown option, …
    pub fn parse(url: &str) -> Result<BackendUrl, ConnectError> {
        let shown = mask_password(url);
        match Target::parse(url) {
            Ok(target) => Ok(BackendUrl { target, shown }),
            Err(reason) => Err(ConnectError::BadUrl { url: shown, reason }),
        }
    }

    /// Which backend the URL names.
    pub fn kind(&self) -> BackendKind {
        match self.target {
            Target::Etcd { .. } => BackendKind::Etcd,
            Target::Nats { .. } => BackendKind::Nats,
            Target::Mongo { .. } => BackendKind::Mongo,
            Target::S3 { .. } => BackendKind::S3,
            Target::Memory => BackendKind::Memory,
            Target::Postgres { .. } => BackendKind::Postgres,
        }
    }

    /// Whether the scheme asks for TLS (`etcds://`, `natss://`). TLS options
    /// of [`Connect`](crate::Connect) turn TLS on as well; MongoDB and S3 say
    /// so in their own ways (`?tls=true`, an `https://` endpoint).
    pub fn tls(&self) -> bool {
        match self.target {
            Target::Etcd { tls, .. } | Target::Nats { tls, .. } => tls,
            _ => false,
        }
    }
}

impl FromStr for BackendUrl {
    type Err = ConnectError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        BackendUrl::parse(url)
    }
}

impl fmt::Display for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BackendUrl").field(&self.shown).finish()
    }
}

impl Target {
    /// Parses a backend URL; the error is the message of a
    /// [`ConnectError::BadUrl`].
    fn parse(url: &str) -> Result<Target, String> {
        let bad = |why: &str| Err(why.to_owned());
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
                let hosts = hosts(authority, 2379)?;
                reject_params(&params, &["sessions"])?;
                let sessions = match params.get("sessions").map(String::as_str) {
                    None | Some("false") => false,
                    Some("true") => true,
                    Some(other) => {
                        return bad(&format!(
                            "sessions={other:?}: use sessions=true or sessions=false"
                        ))
                    }
                };
                let prefix = if path.is_empty() {
                    DEFAULT_ETCD_PREFIX.to_owned()
                } else {
                    format!("{path}/")
                };
                Ok(Target::Etcd {
                    endpoints: hosts,
                    prefix,
                    tls: scheme == "etcds",
                    sessions,
                })
            }
            "nats" | "natss" => {
                let hosts = hosts(authority, 4222)?;
                reject_params(&params, &["create"])?;
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
                let mut collection = DEFAULT_MONGO_COLLECTION.to_owned();
                // `collection` is ours; the rest of the URI goes to the
                // driver as written, its database (the default
                // authentication source) included.
                let mut rest = Vec::new();
                for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    if decode(k) == "collection" {
                        collection = decode(v);
                        if collection.is_empty() {
                            return bad("empty collection name");
                        }
                    } else {
                        rest.push(pair);
                    }
                }
                let mut uri = format!("{scheme}://{before_query}");
                if !rest.is_empty() {
                    uri.push('?');
                    uri.push_str(&rest.join("&"));
                }
                Ok(Target::Mongo { uri, collection })
            }
            "postgres" | "postgresql" => {
                if authority.is_empty() {
                    return bad("no host (postgres://user@host:5432/db?table=…)");
                }
                if path.contains('/') {
                    return bad("the path is one database name (postgres://host/DB)");
                }
                let mut table = DEFAULT_POSTGRES_TABLE.to_owned();
                // `table` is ours; every other option is tokio-postgres'.
                let mut rest = Vec::new();
                for (k, v) in query_pairs(query.unwrap_or("")) {
                    if k == "table" {
                        if v.is_empty() {
                            return bad("empty table name");
                        }
                        table = v;
                    } else {
                        rest.push(format!("{k}={}", encode(&v)));
                    }
                }
                let mut url = format!("{scheme}://{authority}/{path}");
                if !rest.is_empty() {
                    url.push('?');
                    url.push_str(&rest.join("&"));
                }
                Ok(Target::Postgres { url, table })
            }
            "s3" => {
                if authority.is_empty() {
                    return bad("no bucket (s3://BUCKET/prefix?endpoint=…&region=…)");
                }
                reject_params(&params, &["endpoint", "region"])?;
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
            "memory" => {
                if !authority.is_empty() || !path.is_empty() || query.is_some_and(|q| !q.is_empty())
                {
                    return bad("memory:// takes no host, path or options");
                }
                Ok(Target::Memory)
            }
            "" => bad("empty scheme"),
            other => bad(&format!("unknown scheme {other:?}; supported: {SCHEMES}")),
        }
    }
}

/// `url` with the password of a `user:password@` part replaced by `***`
/// (only MongoDB URLs may carry one; the other schemes refuse it).
fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((userinfo, hosts)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{hosts}{tail}"),
        None => url.to_owned(),
    }
}

/// The `host:port` list of `authority`; a host without a port gets
/// `default_port`, the one the backend's own tools assume.
fn hosts(authority: &str, default_port: u16) -> Result<Vec<String>, String> {
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
        // `[::1]` is an IPv6 host without a port; `[::1]:2379` has one.
        match h.rsplit_once(':') {
            Some((_, port)) if !h.ends_with(']') => {
                if port.parse::<u16>().is_err() {
                    return Err(format!("bad port in {h:?}"));
                }
                out.push(h.to_owned());
            }
            _ => out.push(format!("{h}:{default_port}")),
        }
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

    fn parse(url: &str) -> Target {
        match BackendUrl::parse(url) {
            Ok(u) => u.target,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[test]
    fn parses_every_scheme() {
        assert_eq!(
            parse("etcd://a:2379,b:2379/jobs"),
            Target::Etcd {
                endpoints: vec!["a:2379".into(), "b:2379".into()],
                prefix: "jobs/".into(),
                tls: false,
                sessions: false,
            }
        );
        assert!(matches!(
            parse("etcd://a:2379/jobs?sessions=true"),
            Target::Etcd { sessions: true, .. }
        ));
        assert_eq!(
            parse("etcds://a:2379"),
            Target::Etcd {
                endpoints: vec!["a:2379".into()],
                prefix: "lease/".into(),
                tls: true,
                sessions: false,
            }
        );
        assert!(matches!(
            parse("natss://a:4222/b"),
            Target::Nats { tls: true, .. }
        ));
        assert_eq!(
            parse("nats://127.0.0.1:4222/locks"),
            Target::Nats {
                servers: "nats://127.0.0.1:4222".into(),
                bucket: "locks".into(),
                create: false,
                tls: false,
            }
        );
        assert_eq!(
            parse("nats://h:4222/locks?create=true"),
            Target::Nats {
                servers: "nats://h:4222".into(),
                bucket: "locks".into(),
                create: true,
                tls: false,
            }
        );
        assert!(BackendUrl::parse("nats://h:4222/locks?create=yes").is_err());
        assert_eq!(
            parse("mongodb://h:27017/ops?collection=locks&directConnection=true"),
            Target::Mongo {
                uri: "mongodb://h:27017/ops?directConnection=true".into(),
                collection: "locks".into()
            }
        );
        assert_eq!(
            parse("s3://bkt/leases/x?endpoint=http://127.0.0.1:9000&region=eu-west-1"),
            Target::S3 {
                bucket: "bkt".into(),
                prefix: "leases/x".into(),
                endpoint: Some("http://127.0.0.1:9000".into()),
                region: Some("eu-west-1".into())
            }
        );
        assert_eq!(parse("memory://"), Target::Memory);
        assert_eq!(parse("memory:///"), Target::Memory);
        assert_eq!(
            parse("postgres://app:pw@h:5432/ops?table=locks&sslmode=disable"),
            Target::Postgres {
                url: "postgres://app:pw@h:5432/ops?sslmode=disable".into(),
                table: "locks".into()
            }
        );
        assert_eq!(
            parse("postgresql://h/ops"),
            Target::Postgres {
                url: "postgresql://h/ops".into(),
                table: "leases".into()
            }
        );
        assert!(BackendUrl::parse("postgres:///ops").is_err());
        assert!(BackendUrl::parse("postgres://h/a/b").is_err());
        assert!(BackendUrl::parse("postgres://h/a?table=").is_err());
        assert_eq!(
            BackendUrl::parse("postgres://h/db").map(|u| u.kind()).ok(),
            Some(BackendKind::Postgres)
        );
    }

    /// A host without a port gets the backend's usual one, as `etcdctl`
    /// and `nats` do.
    #[test]
    fn hosts_without_a_port_get_the_usual_one() {
        assert!(matches!(
            parse("etcd://h/ops"),
            Target::Etcd { endpoints, .. } if endpoints == ["h:2379"]
        ));
        assert!(matches!(
            parse("etcds://a,b:2380,[::1]/ops"),
            Target::Etcd { endpoints, .. } if endpoints == ["a:2379", "b:2380", "[::1]:2379"]
        ));
        assert!(matches!(
            parse("nats://h,[::1]:4333/b"),
            Target::Nats { servers, .. } if servers == "nats://h:4222,nats://[::1]:4333"
        ));
    }

    #[test]
    fn kinds_names_and_tls() {
        for (url, kind, name, feature, tls) in [
            ("etcd://h:2379", BackendKind::Etcd, "etcd", "etcd", false),
            ("etcds://h:2379", BackendKind::Etcd, "etcd", "etcd", true),
            ("nats://h:4222", BackendKind::Nats, "nats", "nats", false),
            ("natss://h:4222", BackendKind::Nats, "nats", "nats", true),
            (
                "mongodb://h/db",
                BackendKind::Mongo,
                "mongodb",
                "mongo",
                false,
            ),
            (
                "mongodb+srv://h/db",
                BackendKind::Mongo,
                "mongodb",
                "mongo",
                false,
            ),
            ("s3://b/p", BackendKind::S3, "s3", "s3", false),
            ("memory://", BackendKind::Memory, "memory", "fake", false),
        ] {
            let u = BackendUrl::parse(url).expect("parses");
            assert_eq!(u.kind(), kind, "{url}");
            assert_eq!(kind.name(), name);
            assert_eq!(kind.to_string(), name);
            assert_eq!(kind.feature(), feature);
            assert_eq!(u.tls(), tls, "{url}");
            assert_eq!(url.parse::<BackendUrl>().expect("parses"), u);
        }
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
            "memory://h",
            "memory:///x",
            "memory://?a=1",
            "://h",
        ] {
            let e = BackendUrl::parse(url).expect_err("refused");
            let ConnectError::BadUrl { url: shown, reason } = &e else {
                panic!("{url}: not BadUrl: {e:?}");
            };
            assert_eq!(shown, url);
            assert!(!reason.contains('\n'), "{e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("bad backend URL {url:?}: ")),
                "{e}"
            );
        }
        let e = BackendUrl::parse("redis://h/x").expect_err("refused");
        assert!(e.to_string().contains("unknown scheme \"redis\""), "{e}");
    }

    #[test]
    fn passwords_are_masked() {
        let url = "mongodb://root:s3cret@h:27017/ops?collection=locks";
        let u = BackendUrl::parse(url).expect("parses");
        assert_eq!(
            u.to_string(),
            "mongodb://root:***@h:27017/ops?collection=locks"
        );
        assert!(!format!("{u:?}").contains("s3cret"));
        // The driver still gets the credentials.
        assert!(matches!(&u.target, Target::Mongo { uri, .. } if uri.contains("root:s3cret@")));
        let e = BackendUrl::parse("mongodb://root:s3cret@h/a/b").expect_err("refused");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        assert_eq!(mask_password("mongodb://root@h/x"), "mongodb://root@h/x");
        assert_eq!(mask_password("no scheme"), "no scheme");
    }

    /// The driver gets the URI as written (but for our own `collection`), so
    /// its database stays the default authentication source.
    #[cfg(feature = "mongo")]
    #[tokio::test]
    async fn mongo_urls_reach_the_driver_whole() {
        use lease_mongo::mongodb::options::ClientOptions;
        let Target::Mongo { uri, .. } =
            parse("mongodb://u:p@h/ops?collection=locks&directConnection=true")
        else {
            panic!("not mongo");
        };
        let options = ClientOptions::parse(&uri).await.unwrap();
        assert_eq!(options.default_database.as_deref(), Some("ops"));
        let source = options.credential.and_then(|c| c.source);
        assert_eq!(source.as_deref(), Some("ops"));
        assert_eq!(options.direct_connection, Some(true));
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
