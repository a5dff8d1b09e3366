//! [`RedisConfig`]: where the leases live (the key prefix), the default
//! TTL, the timeouts and TLS; and [`RedisConfig::from_url`], which reads
//! them from a `lease` URL.

use std::time::Duration;

use lease_core::url::{allow, query_params, Parts};
use lease_core::{Error, LeaseKey, DEFAULT_TTL};

/// Default of [`RedisConfig::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of [`RedisConfig::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of [`RedisConfig::prefix`].
pub const DEFAULT_PREFIX: &str = "lease:";

/// Longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;

/// Where the leases live and how requests are made.
///
/// It may gain fields, so it is built with its constructor and setters,
/// never as a struct literal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// What every Redis key of this crate starts with. The lease `jobs/a`
    /// lives at `{prefix}{jobs/a}`, its fence counter at
    /// `{prefix}{jobs/a}:fence` and its audit records at
    /// `{prefix}{jobs/a}:audit` (the braces are Redis' hash tag: the three
    /// share one cluster slot); changes are published on the channel
    /// `{prefix}changed`. 1 to [`MAX_PREFIX_LEN`] printable ASCII
    /// characters, without spaces or braces. Give it to this crate alone:
    /// a value this crate did not write is reported as
    /// [`Error::CorruptRecord`], never overwritten.
    pub prefix: String,
    /// TTL of requests built by [`RedisBackend::request`](crate::RedisBackend::request).
    pub default_ttl: Duration,
    /// How long one operation (acquire, renew, release, read, break, last
    /// break) may take, connecting included, before its outcome is reported
    /// unknown ([`Error::Unavailable`]). Keep it well below the TTLs in use.
    pub request_timeout: Duration,
    /// How long opening a connection (TCP, TLS and authentication) may
    /// take before it is given up.
    pub connect_timeout: Duration,
    /// TLS to the server, with these CA certificates. A `rediss://` URL
    /// without one trusts the system's CA certificates.
    pub tls: Option<TlsConfig>,
}

/// TLS to the server, through rustls: the CA certificates the server's
/// certificate must chain to. The server's name is checked against the host
/// of the connection URL.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsConfig {
    /// PEM: one or more CA certificates.
    pub ca_pem: Vec<u8>,
}

impl TlsConfig {
    /// Trust the CA certificates in `ca_pem`.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        TlsConfig {
            ca_pem: ca_pem.into(),
        }
    }
}

impl Default for RedisConfig {
    /// Prefix `lease:`, TTL 10 s, requests and connections time out after
    /// 5 s, no TLS beyond what the URL asks for.
    fn default() -> Self {
        RedisConfig {
            prefix: DEFAULT_PREFIX.into(),
            default_ttl: DEFAULT_TTL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls: None,
        }
    }
}

impl RedisConfig {
    /// The defaults with the key prefix `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        RedisConfig {
            prefix: prefix.into(),
            ..RedisConfig::default()
        }
    }

    /// The connection URL and the settings a `lease` URL names, as the
    /// `lease` crate and command read it:
    ///
    /// ```text
    /// redis://[user[:password]@]host[:port][/db][?prefix=p]
    /// rediss://…            (TLS)
    /// valkey://…, valkeys://…   (the same)
    /// ```
    ///
    /// `prefix` (default `lease:`) is this crate's and is taken out of the
    /// URL; the rest (the ACL user and password, percent-encoded; the
    /// database number) is the connection's. A host without a port is on
    /// 6379. No other option is accepted.
    ///
    /// The URL comes first, for
    /// [`RedisBackend::connect`](crate::RedisBackend::connect).
    ///
    /// ```
    /// use lease_redis::RedisConfig;
    ///
    /// let (url, config) = RedisConfig::from_url("rediss://app:pw@cache-1:6380/2?prefix=ops:")?;
    /// assert_eq!(url, "rediss://app:pw@cache-1:6380/2");
    /// assert_eq!(config.prefix, "ops:");
    /// // RedisBackend::connect(&url, config).await?;
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`], saying what is wrong, for a URL of another
    /// scheme, without a host, with a path other than a database number, an
    /// unknown option or a prefix [`RedisBackend::connect`](crate::RedisBackend::connect)
    /// would refuse.
    pub fn from_url(url: &str) -> Result<(String, Self), Error> {
        let bad = |reason: &str| Error::Backend(format!("lease-redis: {reason}").into());
        let parts = Parts::of(url).ok_or_else(|| bad("expected redis://… or rediss://…"))?;
        Address::parse(&parts)?;
        let params = query_params(parts.query);
        allow(&params, &["prefix"]).map_err(|e| bad(&e))?;
        let mut config = RedisConfig::default();
        if let Some(prefix) = params.get("prefix") {
            check_prefix(prefix)?;
            config.prefix = prefix.clone();
        }
        let url = format!("{}://{}", parts.scheme, parts.address.trim_end_matches('/'));
        Ok((url, config))
    }

    /// Sets the default TTL.
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`tls`](Self::tls).
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Where the lease `key` lives: `{prefix}{key}`, the braces being
    /// Redis' hash tag (a lease key has none, and a prefix none either, so
    /// the tag is always the lease key).
    ///
    /// ```
    /// use lease_core::LeaseKey;
    /// use lease_redis::RedisConfig;
    ///
    /// let config = RedisConfig::new("app:");
    /// let key = LeaseKey::new("jobs/a")?;
    /// assert_eq!(config.lease_key(&key), "app:{jobs/a}");
    /// assert_eq!(config.counter_key(&key), "app:{jobs/a}:fence");
    /// assert_eq!(config.audit_key(&key), "app:{jobs/a}:audit");
    /// assert_eq!(config.channel(), "app:changed");
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    pub fn lease_key(&self, key: &LeaseKey) -> String {
        format!("{}{{{}}}", self.prefix, key.as_str())
    }

    /// Where the fence counter of `key` lives: beside its lease, in the
    /// same cluster slot.
    pub fn counter_key(&self, key: &LeaseKey) -> String {
        format!("{}:fence", self.lease_key(key))
    }

    /// Where the audit records of `key`'s breaks live (a list, oldest
    /// first): beside its lease, in the same cluster slot.
    pub fn audit_key(&self, key: &LeaseKey) -> String {
        format!("{}:audit", self.lease_key(key))
    }

    /// The channel changes of this prefix's leases are published on.
    pub fn channel(&self) -> String {
        format!("{}changed", self.prefix)
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        check_prefix(&self.prefix)?;
        for (what, t) in [
            ("request_timeout", self.request_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if t.is_zero() || t > Duration::from_secs(3600) {
                return Err(Error::InvalidTiming {
                    reason: format!("{what} {t:?} must be positive and at most 1 hour"),
                });
            }
        }
        Ok(())
    }
}

/// A key prefix is spliced into every key name, before the hash tag: a
/// brace in it would move the tag.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), Error> {
    let ok = !prefix.is_empty()
        && prefix.len() <= MAX_PREFIX_LEN
        && prefix
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
    if ok {
        Ok(())
    } else {
        Err(Error::Backend(
            format!(
                "lease-redis: key prefix {prefix:?} must be 1 to {MAX_PREFIX_LEN} printable ASCII \
                 characters without spaces, `{{` or `}}`"
            )
            .into(),
        ))
    }
}

/// Where to connect and as whom, read from a connection URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Address {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) tls: bool,
    pub(crate) db: i64,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl Address {
    /// The connection URL given to [`RedisBackend::connect`](crate::RedisBackend::connect).
    pub(crate) fn from_url(url: &str) -> Result<Address, Error> {
        let bad = |reason: &str| Error::Backend(format!("lease-redis: {reason}").into());
        let parts = Parts::of(url).ok_or_else(|| bad("expected redis://… or rediss://…"))?;
        if !parts.query.is_empty() {
            return Err(bad(
                "the connection URL takes no options (read a lease URL with RedisConfig::from_url)",
            ));
        }
        Address::parse(&parts)
    }

    fn parse(parts: &Parts<'_>) -> Result<Address, Error> {
        let bad = |reason: String| Error::Backend(format!("lease-redis: {reason}").into());
        let tls = match parts.scheme {
            "redis" | "valkey" => false,
            "rediss" | "valkeys" => true,
            other => return Err(bad(format!("not a Redis URL: scheme {other:?}"))),
        };
        let (userinfo, hostport) = match parts.authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, parts.authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((user, pw)) => (Some(decode(user)), Some(decode(pw))),
                None => (Some(decode(u)), None),
            },
        };
        // `redis://:pw@host` is a password for the default user.
        let username = username.filter(|u| !u.is_empty());
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !hostport.ends_with(']') => {
                let port = p
                    .parse::<u16>()
                    .map_err(|_| bad(format!("bad port in {hostport:?}")))?;
                (h, port)
            }
            _ => (hostport, 6379),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("no host (redis://[user:password@]host:6379/0)".into()));
        }
        let db = match parts.path {
            "" => 0,
            p => p
                .parse::<i64>()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| bad(format!("the path is a database number, not {p:?}")))?,
        };
        Ok(Address {
            host: host.to_owned(),
            port,
            tls,
            db,
            username,
            password,
        })
    }
}

/// Percent-decoding (`+` stays `+`); malformed escapes are kept verbatim.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> (String, RedisConfig) {
        match RedisConfig::from_url(url) {
            Ok(c) => c,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    fn address(url: &str) -> Address {
        match Address::from_url(url) {
            Ok(a) => a,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[test]
    fn urls_give_the_connection_url_and_prefix() {
        assert_eq!(
            parse("redis://h:6380/2?prefix=ops:"),
            ("redis://h:6380/2".to_owned(), RedisConfig::new("ops:"))
        );
        assert_eq!(
            parse("rediss://u:p%40ss@h/"),
            ("rediss://u:p%40ss@h".to_owned(), RedisConfig::default())
        );
        assert_eq!(parse("valkey://h?prefix=a%2Fb").1.prefix, "a/b");
    }

    #[test]
    fn addresses_carry_user_password_database_and_tls() {
        assert_eq!(
            address("rediss://app:p%40ss@cache-1:6390/3"),
            Address {
                host: "cache-1".into(),
                port: 6390,
                tls: true,
                db: 3,
                username: Some("app".into()),
                password: Some("p@ss".into()),
            }
        );
        let a = address("redis://:secret@[::1]");
        assert_eq!((a.host.as_str(), a.port), ("::1", 6379));
        assert_eq!((a.username, a.password), (None, Some("secret".into())));
        let a = address("redis://[::1]:7000");
        assert_eq!((a.host.as_str(), a.port, a.tls), ("::1", 7000, false));
    }

    #[test]
    fn bad_urls_say_why() {
        for (url, why) in [
            ("redis:///0", "no host"),
            ("redis://h/a/b", "database number"),
            ("redis://h/-1", "database number"),
            ("redis://h:port", "bad port"),
            ("redis://h?prefix=", "key prefix"),
            ("redis://h?prefix=a%7Bb", "key prefix"),
            ("redis://h?table=x", "unknown option"),
            ("postgres://h", "not a Redis URL"),
            ("h:6379", "expected redis://"),
        ] {
            match RedisConfig::from_url(url) {
                Err(Error::Backend(e)) => assert!(e.to_string().contains(why), "{url}: {e}"),
                other => panic!("{url}: not refused: {other:?}"),
            }
        }
        assert!(Address::from_url("redis://h?prefix=x").is_err());
    }

    #[test]
    fn prefixes_and_timeouts_are_checked() {
        for ok in ["lease:", "a", "app/leases:", &"x".repeat(MAX_PREFIX_LEN)] {
            assert!(RedisConfig::new(ok).check().is_ok(), "{ok}");
        }
        for bad in ["", "a b", "a{b", "}", "é", &"x".repeat(MAX_PREFIX_LEN + 1)] {
            assert!(RedisConfig::new(bad).check().is_err(), "{bad}");
        }
        let zero = RedisConfig::default().request_timeout(Duration::ZERO);
        assert!(matches!(zero.check(), Err(Error::InvalidTiming { .. })));
        let long = RedisConfig::default().connect_timeout(Duration::from_secs(7200));
        assert!(matches!(long.check(), Err(Error::InvalidTiming { .. })));
    }
}
