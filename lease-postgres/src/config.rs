//! [`PostgresConfig`]: where the leases live, the default TTL, the request
//! timeout, the pool size and TLS.

use std::time::Duration;

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
    /// connections, no TLS.
    fn default() -> Self {
        PostgresConfig {
            table: "leases".into(),
            default_ttl: DEFAULT_TTL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pool_size: 8,
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
