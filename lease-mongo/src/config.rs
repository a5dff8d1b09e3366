//! [`MongoConfig`]: where the leases live, the default TTL and the request
//! timeout.

use std::time::Duration;

use lease_core::url::Parts;
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

    /// The driver's URI and the settings a connection URL names, as the
    /// `lease` crate and command read it:
    ///
    /// ```text
    /// mongodb://[user:password@]host[:port][,host[:port]…][/database][?collection=name&driver options…]
    /// mongodb+srv://…   (hosts from DNS SRV records)
    /// ```
    ///
    /// `collection` (default `leases`) is this crate's; the rest of the URI
    /// goes to the MongoDB driver as written, which checks it here
    /// (`ConnectionString::parse`, no DNS lookup yet) and reads it again
    /// when connecting: its database (default `lease`) is also the default
    /// authentication source, and its options (`tls=true`, `tlsCAFile`,
    /// `replicaSet`, `directConnection`, …) are the driver's. Everything
    /// else keeps its default.
    ///
    /// The URI comes first, for
    /// [`MongoBackend::connect`](crate::MongoBackend::connect) (or the
    /// driver's `ClientOptions::parse` and
    /// [`connect_with_options`](crate::MongoBackend::connect_with_options)).
    ///
    /// ```
    /// use lease_mongo::MongoConfig;
    ///
    /// let (uri, config) =
    ///     MongoConfig::from_url("mongodb://app:pw@db-1/ops?collection=locks&replicaSet=rs0")?;
    /// assert_eq!(uri, "mongodb://app:pw@db-1/ops?replicaSet=rs0");
    /// assert_eq!((config.database.as_str(), config.collection.as_str()), ("ops", "locks"));
    /// // MongoBackend::connect(&uri, config).await?;
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`], saying what is wrong, for a URL of another scheme,
    /// without a host, with a path of more than a database name, an empty
    /// collection name, or one the driver refuses.
    pub fn from_url(url: &str) -> Result<(String, Self), Error> {
        let bad = |reason: String| Error::Backend(reason.into());
        let Parts {
            scheme,
            authority,
            path,
            address,
            query,
        } = Parts::of(url).ok_or_else(|| bad("expected mongodb://… or mongodb+srv://…".into()))?;
        if scheme != "mongodb" && scheme != "mongodb+srv" {
            return Err(bad(format!("not a MongoDB URL: scheme {scheme:?}")));
        }
        if authority.is_empty() {
            return Err(bad("no host (mongodb://host:27017/db?collection=…)".into()));
        }
        if path.contains('/') {
            return Err(bad(
                "the path is one database name (mongodb://host/DB)".into()
            ));
        }
        let mut collection = MongoConfig::default().collection;
        // `collection` is ours; the rest of the URI goes to the driver as
        // written, its database (the default authentication source)
        // included.
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if decode(k) == "collection" {
                collection = decode(v);
                if collection.is_empty() {
                    return Err(bad("empty collection name".into()));
                }
            } else {
                rest.push(pair);
            }
        }
        let mut uri = format!("{scheme}://{address}");
        if !rest.is_empty() {
            uri.push('?');
            uri.push_str(&rest.join("&"));
        }
        let parsed = mongodb::options::ConnectionString::parse(&uri)
            .map_err(|e| bad(format!("the MongoDB driver refused it: {e}")))?;
        let config = match parsed.default_database {
            Some(database) => MongoConfig::new(database),
            None => MongoConfig::default(),
        };
        Ok((uri, config.collection(collection)))
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

/// Percent-decoding (`+` stays `+`); malformed escapes are kept verbatim.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> (String, MongoConfig) {
        match MongoConfig::from_url(url) {
            Ok(c) => c,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[test]
    fn urls_give_the_uri_database_and_collection() {
        let (uri, c) = parse("mongodb://h:27017/ops?collection=locks&directConnection=true");
        assert_eq!(uri, "mongodb://h:27017/ops?directConnection=true");
        assert_eq!(c, MongoConfig::new("ops").collection("locks"));
        let (uri, c) = parse("mongodb://h");
        assert_eq!(uri, "mongodb://h");
        assert_eq!(c, MongoConfig::default());
        assert_eq!(parse("mongodb://h/?collection=a%2Bb").1.collection, "a+b");
        assert_eq!(parse("mongodb://h/?collection=a+b").1.collection, "a+b");
        assert_eq!(parse("mongodb+srv://h.example/ops").1.database, "ops");
    }

    /// The driver gets the URI as written (but for our own `collection`),
    /// so its database stays the default authentication source.
    #[tokio::test]
    async fn urls_reach_the_driver_whole() {
        use mongodb::options::ClientOptions;
        let (uri, config) = parse("mongodb://u:p@h/ops?collection=locks&directConnection=true");
        assert!(uri.contains("u:p@"));
        let options = ClientOptions::parse(&uri).await.unwrap();
        assert_eq!(options.default_database.as_deref(), Some("ops"));
        assert_eq!(config.database, "ops");
        let source = options.credential.and_then(|c| c.source);
        assert_eq!(source.as_deref(), Some("ops"));
        assert_eq!(options.direct_connection, Some(true));
    }

    #[test]
    fn bad_urls_say_why() {
        for (url, why) in [
            ("mongodb:///db", "no host"),
            ("mongodb://h/a/b", "the path is one database name"),
            ("mongodb://h/a?collection=", "empty collection name"),
            (
                "mongodb://h/a?w=notanumber&wtimeoutMS=x",
                "the MongoDB driver refused it",
            ),
            ("etcd://h", "not a MongoDB URL"),
        ] {
            match MongoConfig::from_url(url) {
                Err(Error::Backend(e)) => assert!(e.to_string().contains(why), "{url}: {e}"),
                other => panic!("{url}: not refused: {other:?}"),
            }
        }
    }
}
