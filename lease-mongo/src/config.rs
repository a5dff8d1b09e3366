//! [`MongoConfig`]: where the leases live, the default TTL and the request
//! timeout.

use std::time::Duration;

use lease_core::{Error, DEFAULT_TTL};

/// Where the leases live and the TTL used by [`MongoBackend::request`](crate::MongoBackend::request).
///
/// It may gain fields, so it is built with its constructor and setters,
/// never as a struct literal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MongoConfig {
    /// Database name.
    pub database: String,
    /// Collection name. Give it to this crate alone: a document at a lease key
    /// that this crate did not write is reported as
    /// [`Error::CorruptRecord`], never overwritten.
    pub collection: String,
    /// TTL of requests built by [`MongoBackend::request`](crate::MongoBackend::request).
    pub default_ttl: Duration,
    /// How long one operation (acquire, renew, release, read, break, and the
    /// index check of [`MongoBackend::new`](crate::MongoBackend::new)) may take before its outcome is
    /// reported unknown ([`Error::Unavailable`]). Also the server's
    /// `wtimeout` for the majority write concern, so a write with no
    /// majority to acknowledge it ends too. Keep it well below the TTLs in
    /// use: an answer later than the holder's deadline is of no use.
    pub request_timeout: Duration,
}

/// Default of [`MongoConfig::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for MongoConfig {
    /// Database `lease`, collection `leases`, TTL 10 s, requests time out
    /// after 5 s.
    fn default() -> Self {
        MongoConfig {
            database: "lease".into(),
            collection: "leases".into(),
            default_ttl: DEFAULT_TTL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

impl MongoConfig {
    /// The defaults in database `database`.
    pub fn new(database: impl Into<String>) -> Self {
        MongoConfig {
            database: database.into(),
            ..MongoConfig::default()
        }
    }

    /// Sets the collection name.
    pub fn collection(mut self, collection: impl Into<String>) -> Self {
        self.collection = collection.into();
        self
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
}

/// Checks a request timeout: positive, and at most an hour.
pub(crate) fn check_request_timeout(timeout: Duration) -> Result<(), Error> {
    if timeout.is_zero() || timeout > Duration::from_secs(3600) {
        return Err(Error::InvalidTiming {
            reason: format!("request_timeout {timeout:?} must be positive and at most 1 hour"),
        });
    }
    Ok(())
}
