//! [`PostgresConfig`]: where the leases live, the default TTL, the request
//! timeout, the pool size, the statement cache and TLS.

use std::time::Duration;

use std::collections::BTreeMap;

use lease_core::url::{flag, Parts};
use lease_core::{Error, DEFAULT_TTL};

/// Default of [`PostgresConfig::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest table name accepted, schema prefix included: PostgreSQL
/// truncates identifiers at 63 bytes, and the notification channel adds
/// `_changed` to it.
pub const MAX_TABLE_LEN: usize = 55;

/// Where the leases live and how requests are made.
///
/// It may gain fields, so it is built with its constructor and setters,
/// never as a struct literal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// The lease table: one row per key. Its audit records go to
    /// `{table}_audit`, its notifications to the channel `{table}_changed`.
    /// Lower-case ASCII letters, digits and `_`, starting with a letter or
    /// `_`; optionally prefixed by a schema name of the same form and a `.`;
    /// at most [`MAX_TABLE_LEN`] bytes in all. Give it to this crate alone: a row
    /// this crate did not write is reported as [`Error::CorruptRecord`],
    /// never overwritten.
    pub table: String,
    /// TTL of requests built by [`PostgresBackend::request`](crate::PostgresBackend::request).
    pub default_ttl: Duration,
    /// How long one operation (acquire, renew, release, read, break, last
    /// break, the migration) may take, waiting for a pooled connection
    /// included, before its outcome is reported unknown
    /// ([`Error::Unavailable`]). Keep it well below the TTLs in use.
    pub request_timeout: Duration,
    /// Most connections the pool opens (the watch connection is extra).
    pub pool_size: usize,
    /// Prepare each statement once per pooled connection and run it by
    /// name from then on, instead of sending a call of its function (see
    /// the README, *Performance*). An operation then costs about what the
    /// smallest single-row `UPDATE` sent as text does, which saves the
    /// call's own cost: a tenth to a fifth of an operation.
    ///
    /// Off by default: a prepared statement belongs to one server session,
    /// so it needs a direct connection to PostgreSQL, a session-mode pool,
    /// or PgBouncer 1.21 or later with `max_prepared_statements` above
    /// zero. **Never turn it on behind a pooler in transaction or statement
    /// mode that does not track prepared statements**: a statement name may
    /// then reach another client's server session, and run that client's
    /// statement of the same name.
    pub statement_cache: bool,
    /// TLS to the server; `None`: plain TCP.
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

impl Default for PostgresConfig {
    /// Table `leases`, TTL 10 s, requests time out after 5 s, 8 pooled
    /// connections, no statement cache, no TLS.
    fn default() -> Self {
        PostgresConfig {
            table: "leases".into(),
            default_ttl: DEFAULT_TTL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pool_size: 8,
            statement_cache: false,
            tls: None,
        }
    }
}

impl PostgresConfig {
    /// The defaults with the lease table `table`.
    pub fn new(table: impl Into<String>) -> Self {
        PostgresConfig {
            table: table.into(),
            ..PostgresConfig::default()
        }
    }

    /// The connection URL for tokio-postgres and the settings a `lease`
    /// URL names, as the `lease` crate and command read it:
    ///
    /// ```text
    /// postgres://[user[:password]@]host[:port][/database][?table=name&statement_cache=true|false&connection options…]
    /// postgresql://…   (the same)
    /// ```
    ///
    /// `table` (default `leases`) and `statement_cache` (default `false`:
    /// see [`statement_cache`](Self::statement_cache)) are this crate's;
    /// every other query option (`sslmode`, `application_name`,
    /// `connect_timeout`, …) stays in the URL for tokio-postgres, which
    /// reads the URL when connecting. A host
    /// without a port is on 5432, as tokio-postgres assumes. Everything
    /// else keeps its default.
    ///
    /// The URL comes first, for
    /// [`PostgresBackend::connect`](crate::PostgresBackend::connect).
    ///
    /// ```
    /// use lease_postgres::PostgresConfig;
    ///
    /// let (url, config) =
    ///     PostgresConfig::from_url("postgres://app:pw@db-1/ops?table=locks&statement_cache=true&sslmode=disable")?;
    /// assert_eq!(url, "postgres://app:pw@db-1/ops?sslmode=disable");
    /// assert_eq!(config.table, "locks");
    /// assert!(config.statement_cache);
    /// // PostgresBackend::connect(&url, config).await?;
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`], saying what is wrong, for a URL of another scheme,
    /// without a host, with a path of more than a database name, an empty
    /// table name, or a `statement_cache` other than `true` or `false`.
    pub fn from_url(url: &str) -> Result<(String, Self), Error> {
        let bad = |reason: &str| Error::Backend(reason.to_owned().into());
        let Parts {
            scheme,
            authority,
            path,
            query,
            ..
        } = Parts::of(url).ok_or_else(|| bad("expected postgres://… or postgresql://…"))?;
        if scheme != "postgres" && scheme != "postgresql" {
            return Err(bad(&format!("not a PostgreSQL URL: scheme {scheme:?}")));
        }
        if authority.is_empty() {
            return Err(bad("no host (postgres://user@host:5432/db?table=…)"));
        }
        if path.contains('/') {
            return Err(bad("the path is one database name (postgres://host/DB)"));
        }
        let mut config = PostgresConfig::default();
        // `table` and `statement_cache` are ours; every other option is
        // tokio-postgres'.
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (decode(k), decode(v));
            if k == "table" {
                if v.is_empty() {
                    return Err(bad("empty table name"));
                }
                config.table = v;
            } else if k == STATEMENT_CACHE {
                config.statement_cache =
                    flag(&BTreeMap::from([(k, v)]), STATEMENT_CACHE).map_err(|e| bad(&e))?;
            } else {
                rest.push(format!("{k}={}", encode(&v)));
            }
        }
        let mut url = format!("{scheme}://{authority}/{path}");
        if !rest.is_empty() {
            url.push('?');
            url.push_str(&rest.join("&"));
        }
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

    /// Sets [`pool_size`](Self::pool_size).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Sets [`statement_cache`](Self::statement_cache).
    pub fn statement_cache(mut self, on: bool) -> Self {
        self.statement_cache = on;
        self
    }

    /// Sets [`tls`](Self::tls).
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        check_table(&self.table)?;
        if self.request_timeout.is_zero() || self.request_timeout > Duration::from_secs(3600) {
            return Err(Error::InvalidTiming {
                reason: format!(
                    "request_timeout {:?} must be positive and at most 1 hour",
                    self.request_timeout
                ),
            });
        }
        if self.pool_size == 0 || self.pool_size > 1024 {
            return Err(Error::Backend(
                format!("pool_size {} must be between 1 and 1024", self.pool_size).into(),
            ));
        }
        Ok(())
    }
}

/// The URL option of [`PostgresConfig::statement_cache`].
const STATEMENT_CACHE: &str = "statement_cache";

/// Percent-decoding (`+` stays `+`); malformed escapes are kept verbatim.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// What a query value may hold unescaped when passed on to tokio-postgres.
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

fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
}

/// A table name is spliced into SQL, so only plain identifiers are accepted.
pub(crate) fn check_table(table: &str) -> Result<(), Error> {
    let ok = table.len() <= MAX_TABLE_LEN
        && match table.split_once('.') {
            Some((schema, name)) => is_identifier(schema) && is_identifier(name),
            None => is_identifier(table),
        };
    if ok {
        Ok(())
    } else {
        Err(Error::Backend(
            format!(
                "lease-postgres: table name {table:?} must be [schema.]name of lower-case ASCII \
                 letters, digits and `_`, starting with a letter or `_`, at most \
                 {MAX_TABLE_LEN} bytes in all"
            )
            .into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> (String, PostgresConfig) {
        match PostgresConfig::from_url(url) {
            Ok(c) => c,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[test]
    fn urls_give_the_connection_url_and_table() {
        assert_eq!(
            parse("postgres://app:pw@h:5432/ops?table=locks&sslmode=disable"),
            (
                "postgres://app:pw@h:5432/ops?sslmode=disable".to_owned(),
                PostgresConfig::new("locks")
            )
        );
        assert_eq!(
            parse("postgresql://h/ops"),
            ("postgresql://h/ops".to_owned(), PostgresConfig::default())
        );
        assert_eq!(
            parse("postgres://h/ops?application_name=a%20b%26c").0,
            "postgres://h/ops?application_name=a%20b%26c"
        );
        assert_eq!(
            parse("postgres://h/ops?statement_cache=true&sslmode=disable"),
            (
                "postgres://h/ops?sslmode=disable".to_owned(),
                PostgresConfig::default().statement_cache(true)
            )
        );
        assert!(
            !parse("postgres://h/ops?statement_cache=false")
                .1
                .statement_cache
        );
    }

    #[test]
    fn bad_urls_say_why() {
        for (url, why) in [
            ("postgres:///ops", "no host"),
            ("postgres://h/a/b", "the path is one database name"),
            ("postgres://h/a?table=", "empty table name"),
            (
                "postgres://h/a?statement_cache=yes",
                "use statement_cache=true or statement_cache=false",
            ),
            ("mongodb://h", "not a PostgreSQL URL"),
        ] {
            match PostgresConfig::from_url(url) {
                Err(Error::Backend(e)) => assert!(e.to_string().contains(why), "{url}: {e}"),
                other => panic!("{url}: not refused: {other:?}"),
            }
        }
    }

    #[test]
    fn query_values_survive_the_round_trip() {
        assert_eq!(decode("http%3A%2F%2Fh%3A9"), "http://h:9");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(decode("a+b"), "a+b");
        assert_eq!(encode("a b&c=d/e:f"), "a%20b%26c%3Dd/e:f");
        assert_eq!(decode(&encode("é+%")), "é+%");
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["leases", "_l", "app.leases", "l_2"] {
            assert!(check_table(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Leases",
            "2l",
            "l;drop",
            "a.b.c",
            "l\"",
            "a b",
            &"x".repeat(58),
        ] {
            assert!(check_table(bad).is_err(), "{bad}");
        }
    }
}
