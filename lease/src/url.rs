//! Backend URLs: which backend, where, and with which options.
//!
//! The scheme names the backend; the rest of the URL is the backend's own,
//! read by its crate's `from_url` (linked below, with every detail). The
//! grammar (the same as the `lease` command's):
//!
//! | URL | |
//! |---|---|
//! | `etcd://host:2379[,host:2379]/prefix[?sessions=false]` | a host without a port is on 2379 (NATS: 4222, MongoDB: 27017, PostgreSQL: 5432, Redis: 6379); keys live under `prefix/` (default `lease/`); `etcds://` for TLS; the keys a client holds with one TTL share one etcd lease (a session) unless `sessions=false` gives each its own (one more request per acquire and release; see `lease_etcd::EtcdConfig::sessions` for the trade-off); `lease_etcd::EtcdConfig::from_url` |
//! | `nats://host:4222[,host:4222]/bucket[?create=true]` | a JetStream KV bucket (default `leases`); `natss://` for TLS; `create=true` creates a missing bucket; `lease_nats::NatsConfig::from_url` |
//! | `mongodb://host:27017/db?collection=name` | the URI, but for `collection`, goes to the driver as written, so the database is also the default `authSource`; defaults: database `lease`, collection `leases` (`mongodb+srv://` too); `lease_mongo::MongoConfig::from_url` |
//! | `s3://bucket/prefix?endpoint=URL&region=R` | credentials from the AWS environment variables; `lease_s3::S3Config::from_url` |
//! | `postgres://user:password@host:5432/db?table=name` | default table `leases`; `statement_cache=true` prepares each statement once per connection (faster; not behind a transaction-mode pooler that does not track prepared statements: see `lease_postgres::PostgresConfig::statement_cache`); every other query option (`sslmode`, `application_name`, …) goes to tokio-postgres (`postgresql://` too); `lease_postgres::PostgresConfig::from_url` |
//! | `redis://[user:password@]host:6379[/db][?prefix=p]` | Redis 7 or later, or Valkey (`valkey://` too); the ACL user and password (percent-encoded) and the database number are the connection's; keys start with `prefix` (default `lease:`); `rediss://` (`valkeys://`) for TLS; `lease_redis::RedisConfig::from_url` |
//! | `memory://` | a fresh in-memory fake on every connect (feature `fake`) |

use std::fmt;
use std::str::FromStr;

use crate::error::ConnectError;
pub use crate::scheme::{BackendKind, SCHEMES};

/// A parsed backend URL.
///
/// Parsing checks everything that can be checked without connecting, with
/// the backend's own parser. A URL of a backend whose feature is off still
/// parses, its scheme checked only (connecting to it is then
/// [`ConnectError::FeatureDisabled`]). `Debug` and `Display` show the URL
/// with any password in it masked.
#[derive(Clone, PartialEq, Eq)]
pub struct BackendUrl {
    kind: BackendKind,
    /// TLS by the scheme.
    tls: bool,
    /// The URL as given, for the backend's parser.
    url: String,
    /// The URL as given, password masked.
    shown: String,
}

impl BackendUrl {
    /// Parses a backend URL (see the [module documentation](self) for the
    /// forms).
    ///
    /// # Errors
    /// [`ConnectError::BadUrl`], saying what is wrong, for a URL this crate
    /// cannot use: an unknown scheme, a bad port, an unknown option, …
    pub fn parse(url: &str) -> Result<BackendUrl, ConnectError> {
        let shown = mask_password(url);
        let bad = |reason: String| ConnectError::BadUrl {
            url: shown.clone(),
            reason,
        };
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(bad(format!(
                "expected SCHEME://…, with SCHEME one of {SCHEMES}"
            )));
        };
        let Some((kind, tls)) = BackendKind::of_scheme(scheme) else {
            return Err(bad(if scheme.is_empty() {
                "empty scheme".to_owned()
            } else {
                format!("unknown scheme {scheme:?}; supported: {SCHEMES}")
            }));
        };
        check(kind, url).map_err(bad)?;
        Ok(BackendUrl {
            kind,
            tls,
            url: url.to_owned(),
            shown,
        })
    }

    /// Which backend the URL names.
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// Whether the scheme asks for TLS (`etcds://`, `natss://`, `rediss://`,
    /// `valkeys://`). TLS options
    /// of [`Connect`](crate::Connect) turn TLS on as well; MongoDB and S3 say
    /// so in their own ways (`?tls=true`, an `https://` endpoint).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The URL as given, password included, for the backend's parser.
    #[cfg_attr(
        not(any(
            feature = "etcd",
            feature = "nats",
            feature = "mongo",
            feature = "s3",
            feature = "postgres",
            feature = "redis"
        )),
        allow(dead_code)
    )]
    pub(crate) fn as_str(&self) -> &str {
        &self.url
    }
}

/// Checks `url` with the parser of its backend, where this build has it.
fn check(kind: BackendKind, url: &str) -> Result<(), String> {
    match kind {
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => lease_etcd::EtcdConfig::from_url(url)
            .map(drop)
            .map_err(reason),
        #[cfg(feature = "nats")]
        BackendKind::Nats => lease_nats::NatsConfig::from_url(url)
            .map(drop)
            .map_err(reason),
        #[cfg(feature = "mongo")]
        BackendKind::Mongo => lease_mongo::MongoConfig::from_url(url)
            .map(drop)
            .map_err(reason),
        #[cfg(feature = "s3")]
        BackendKind::S3 => lease_s3::S3Config::from_url(url).map(drop).map_err(reason),
        #[cfg(feature = "postgres")]
        BackendKind::Postgres => lease_postgres::PostgresConfig::from_url(url)
            .map(drop)
            .map_err(reason),
        #[cfg(feature = "redis")]
        BackendKind::Redis => lease_redis::RedisConfig::from_url(url)
            .map(drop)
            .map_err(reason),
        BackendKind::Memory => {
            let rest = url.split_once("://").map_or("", |(_, rest)| rest);
            let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
            if before_query.trim_matches('/').is_empty() && query.is_empty() {
                Ok(())
            } else {
                Err("memory:// takes no host, path or options".to_owned())
            }
        }
        // Without the backend's crate only the scheme is known: connecting
        // says which feature is missing.
        #[allow(unreachable_patterns)]
        _ => Ok(()),
    }
}

/// What a backend's `from_url` found wrong with a URL, in its own words.
pub(crate) fn reason(e: lease_core::Error) -> String {
    match e {
        lease_core::Error::Backend(e) => e.to_string(),
        other => other.to_string(),
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

/// `url` with the password of a `user:password@` part replaced by `***`
/// (MongoDB, PostgreSQL and Redis URLs may carry one; the other schemes
/// refuse it).
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scheme parses to its backend; the rest of each URL is its
    /// backend's to check (each crate's `from_url` tests say how), so a
    /// URL its backend refuses is refused here where this build has it.
    #[test]
    fn parses_every_scheme() {
        for (url, kind) in [
            ("etcd://a:2379,b:2379/jobs", BackendKind::Etcd),
            ("etcd://a:2379/jobs?sessions=true", BackendKind::Etcd),
            ("etcds://a:2379", BackendKind::Etcd),
            ("natss://a:4222/b", BackendKind::Nats),
            ("nats://h:4222/locks?create=true", BackendKind::Nats),
            (
                "mongodb://h:27017/ops?collection=locks&directConnection=true",
                BackendKind::Mongo,
            ),
            (
                "s3://bkt/leases/x?endpoint=http://127.0.0.1:9000&region=eu-west-1",
                BackendKind::S3,
            ),
            ("memory://", BackendKind::Memory),
            ("memory:///", BackendKind::Memory),
            (
                "postgres://app:pw@h:5432/ops?table=locks&sslmode=disable",
                BackendKind::Postgres,
            ),
            ("postgresql://h/ops", BackendKind::Postgres),
            ("redis://h:6379/2?prefix=ops:", BackendKind::Redis),
            ("rediss://app:pw@h", BackendKind::Redis),
            ("valkey://h", BackendKind::Redis),
            ("valkeys://h:6380/1", BackendKind::Redis),
        ] {
            let parsed = BackendUrl::parse(url).map(|u| u.kind());
            assert_eq!(parsed.ok(), Some(kind), "{url}");
        }
        for (url, kind) in [
            ("nats://h:4222/locks?create=yes", BackendKind::Nats),
            ("postgres:///ops", BackendKind::Postgres),
            ("postgres://h/a/b", BackendKind::Postgres),
            ("postgres://h/a?table=", BackendKind::Postgres),
            ("redis://h/a", BackendKind::Redis),
            ("redis://h?table=x", BackendKind::Redis),
            ("rediss:///0", BackendKind::Redis),
        ] {
            assert_eq!(BackendUrl::parse(url).is_err(), kind.is_enabled(), "{url}");
        }
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
            ("redis://h", BackendKind::Redis, "redis", "redis", false),
            ("rediss://h", BackendKind::Redis, "redis", "redis", true),
            ("valkey://h", BackendKind::Redis, "redis", "redis", false),
            ("valkeys://h", BackendKind::Redis, "redis", "redis", true),
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
        // Refused by the scheme, or by the backend's parser where this
        // build has the backend.
        for (url, kind) in [
            ("zookeeper://h/x", None),
            ("etcd:/h", None),
            ("etcd://", Some(BackendKind::Etcd)),
            ("etcd://h:notaport/x", Some(BackendKind::Etcd)),
            ("nats://h/a/b", Some(BackendKind::Nats)),
            ("s3:///x", Some(BackendKind::S3)),
            ("s3://b/x?bogus=1", Some(BackendKind::S3)),
            ("localhost:2379", None),
            ("memory://h", None),
            ("memory:///x", None),
            ("memory://?a=1", None),
            ("://h", None),
        ] {
            if kind.is_some_and(|k| !k.is_enabled()) {
                assert!(BackendUrl::parse(url).is_ok(), "{url}");
                continue;
            }
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
        let e = BackendUrl::parse("zookeeper://h/x").expect_err("refused");
        assert!(
            e.to_string().contains("unknown scheme \"zookeeper\""),
            "{e}"
        );
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
        // The backend's parser still gets the credentials.
        assert!(u.as_str().contains("root:s3cret@"));
        for refused in ["mongodb://root:s3cret@h/a/b", "mongo://root:s3cret@h/a"] {
            if let Err(e) = BackendUrl::parse(refused) {
                assert!(!e.to_string().contains("s3cret"), "{e}");
            }
        }
        assert!(BackendUrl::parse("mongo://root:s3cret@h/a").is_err());
        assert_eq!(mask_password("mongodb://root@h/x"), "mongodb://root@h/x");
        assert_eq!(mask_password("no scheme"), "no scheme");
        // Redis: a password for the default user, or an ACL user's.
        for (url, shown) in [
            ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
            (
                "rediss://app:s3cret@h?prefix=p:",
                "rediss://app:***@h?prefix=p:",
            ),
        ] {
            let u = BackendUrl::parse(url).expect("parses");
            assert_eq!(u.to_string(), shown);
            assert!(!format!("{u:?}").contains("s3cret"));
        }
    }
}
