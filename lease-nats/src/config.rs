//! What a [`NatsBackend`](crate::NatsBackend) is told at construction.

use std::time::Duration;

use lease_core::url::{allow, flag, hosts, query_params, Parts};
use lease_core::{Error, DEFAULT_TTL};

/// Configuration of a [`NatsBackend`](crate::NatsBackend): which bucket,
/// whether and how it is created when missing, and the TTL limits.
///
/// ```
/// use std::time::Duration;
/// use lease_nats::NatsConfig;
/// let config = NatsConfig::new("leases")
///     .default_ttl(Duration::from_secs(15))
///     .replicas(3)
///     .create_bucket(true);
/// assert_eq!(config.bucket, "leases");
/// ```
///
/// It may gain fields, so it is built with its constructor and setters,
/// never as a struct literal.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NatsConfig {
    /// The KV bucket (stream `KV_<bucket>`). It must allow message TTLs, have
    /// subject delete markers and keep its messages in files; see
    /// [`create_bucket`](Self::create_bucket) for a missing one.
    pub bucket: String,
    /// Whether [`connect`](crate::NatsBackend::connect) creates the bucket when
    /// it is missing (file storage, history 1, per-message TTLs and subject
    /// delete markers). Off by default: the bucket's stream sequence is the
    /// fence counter, and a bucket created afresh counts from 1 again, so
    /// a bucket that was deleted (with the fences it had given) must not come
    /// back silently. Turn it on for the first deployment, or where every
    /// holder of the old bucket is known to be gone and its resources do not
    /// compare fences across the deletion.
    pub create_bucket: bool,
    /// TTL used by [`NatsBackend::request`](crate::NatsBackend::request).
    pub default_ttl: Duration,
    /// Longest TTL accepted (whole seconds; at least 1 s).
    pub max_ttl: Duration,
    /// Replicas of a bucket this backend creates (1, or 3/5 on a cluster).
    pub replicas: usize,
    /// How long the server keeps the delete marker it writes when a grant
    /// expires, and at least how long the purge marker a release or break
    /// leaves is kept (whole seconds, ≥ 1 s): that marker lives at least as
    /// long as the TTL of the record it replaced, because after a crash
    /// nats-server can bring back recently removed messages whose TTL has not
    /// passed. Watchers see expiry through the marker; afterwards the key's
    /// subject is empty again (the stream's sequence, hence the fence, still
    /// only rises).
    pub marker_ttl: Duration,
    /// How long one JetStream request may take before its outcome is reported
    /// unknown ([`Error::Unavailable`]).
    pub request_timeout: Duration,
}

impl NatsConfig {
    /// Defaults: the bucket is not created, default TTL 10 s, maximum TTL 1 day,
    /// 1 replica, markers kept 60 s, requests time out after 5 s.
    pub fn new(bucket: impl Into<String>) -> Self {
        NatsConfig {
            bucket: bucket.into(),
            create_bucket: false,
            default_ttl: DEFAULT_TTL,
            max_ttl: Duration::from_secs(24 * 3600),
            replicas: 1,
            marker_ttl: Duration::from_secs(60),
            request_timeout: Duration::from_secs(5),
        }
    }

    /// The servers and the settings a connection URL names, as the `lease`
    /// crate and command read it:
    ///
    /// ```text
    /// nats://host[:port][,host[:port]…][/bucket][?create=true|false]
    /// natss://…   (the same, over TLS)
    /// ```
    ///
    /// * a host without a port is on 4222, as the `nats` tool assumes; an
    ///   IPv6 host is written in brackets (`[::1]`, `[::1]:4222`);
    /// * the path is one KV bucket name (default `leases`);
    /// * `create=true` turns [`create_bucket`](Self::create_bucket) on.
    ///
    /// The servers come first, as a comma-separated list for
    /// [`NatsBackend::connect`](crate::NatsBackend::connect): `nats://host:port`
    /// each, or `tls://host:port` for `natss://`, which async-nats connects
    /// to only over TLS. Credentials are not taken from the URL: give them
    /// in async-nats' `ConnectOptions`
    /// ([`connect_with_options`](crate::NatsBackend::connect_with_options)).
    /// Everything else keeps its default.
    ///
    /// ```
    /// use lease_nats::NatsConfig;
    ///
    /// let (servers, config) = NatsConfig::from_url("nats://n1,n2:4223/locks?create=true")?;
    /// assert_eq!(servers, "nats://n1:4222,nats://n2:4223");
    /// assert_eq!(config.bucket, "locks");
    /// assert!(config.create_bucket);
    /// // NatsBackend::connect(&servers, config).await?;
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`], saying what is wrong, for a URL of another scheme,
    /// without a host, with a bad port, credentials, an unknown option, or
    /// a path that is not one bucket name.
    pub fn from_url(url: &str) -> Result<(String, Self), Error> {
        let bad = |reason: String| Error::Backend(reason.into());
        let Parts {
            scheme,
            authority,
            path,
            query,
            ..
        } = Parts::of(url).ok_or_else(|| bad("expected nats://… or natss://…".into()))?;
        let server_scheme = match scheme {
            "nats" => "nats",
            "natss" => "tls",
            other => return Err(bad(format!("not a NATS URL: scheme {other:?}"))),
        };
        let hosts = hosts(authority, DEFAULT_PORT).map_err(bad)?;
        let params = query_params(query);
        allow(&params, &["create"]).map_err(bad)?;
        let create = flag(&params, "create").map_err(bad)?;
        if path.contains('/') {
            return Err(bad(
                "the path is one bucket name (nats://host:4222/BUCKET)".into()
            ));
        }
        let bucket = if path.is_empty() {
            DEFAULT_BUCKET
        } else {
            path
        };
        if !bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(bad(
                "a NATS KV bucket name may only contain A-Z a-z 0-9 _ -".into(),
            ));
        }
        let servers = hosts
            .iter()
            .map(|h| format!("{server_scheme}://{h}"))
            .collect::<Vec<_>>()
            .join(",");
        Ok((servers, NatsConfig::new(bucket).create_bucket(create)))
    }

    /// Sets [`default_ttl`](Self::default_ttl).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Sets [`max_ttl`](Self::max_ttl).
    pub fn max_ttl(mut self, ttl: Duration) -> Self {
        self.max_ttl = ttl;
        self
    }

    /// Sets [`create_bucket`](Self::create_bucket).
    pub fn create_bucket(mut self, create: bool) -> Self {
        self.create_bucket = create;
        self
    }

    /// Sets [`replicas`](Self::replicas).
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// Sets [`marker_ttl`](Self::marker_ttl).
    pub fn marker_ttl(mut self, ttl: Duration) -> Self {
        self.marker_ttl = ttl;
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Checks the values before anything is sent.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |reason: String| Err(Error::Backend(reason.into()));
        let name_ok = !self.bucket.is_empty()
            && self
                .bucket
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return bad(format!(
                "invalid NATS KV bucket name {:?}: use 1+ characters of A-Z a-z 0-9 _ -",
                self.bucket
            ));
        }
        if self.max_ttl < Duration::from_secs(1) {
            return bad(format!(
                "max_ttl {:?} is below NATS' one-second TTL granularity",
                self.max_ttl
            ));
        }
        if self.marker_ttl < Duration::from_secs(1) {
            return bad(format!(
                "marker_ttl {:?} is below nats-server's minimum of 1 s",
                self.marker_ttl
            ));
        }
        if self.replicas == 0 {
            return bad("replicas must be at least 1".into());
        }
        Ok(())
    }
}

/// The port of a URL's host that names none: NATS' client port.
const DEFAULT_PORT: u16 = 4222;

/// The bucket of a URL that names none.
const DEFAULT_BUCKET: &str = "leases";

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> (String, NatsConfig) {
        match NatsConfig::from_url(url) {
            Ok(c) => c,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[test]
    fn urls_give_servers_bucket_and_create() {
        let (servers, c) = parse("nats://127.0.0.1:4222/locks");
        assert_eq!(servers, "nats://127.0.0.1:4222");
        assert_eq!(c.bucket, "locks");
        assert!(!c.create_bucket);
        let (servers, c) = parse("nats://h:4222/locks?create=true");
        assert_eq!(servers, "nats://h:4222");
        assert!(c.create_bucket);
        assert_eq!(parse("nats://h").1.bucket, "leases");
        assert_eq!(parse("natss://a:4222/b").0, "tls://a:4222");
    }

    /// A host without a port gets the usual one, as the `nats` tool does.
    #[test]
    fn hosts_without_a_port_get_the_usual_one() {
        assert_eq!(
            parse("nats://h,[::1]:4333/b").0,
            "nats://h:4222,nats://[::1]:4333"
        );
    }

    #[test]
    fn bad_urls_say_why() {
        for (url, why) in [
            ("nats://", "no host"),
            ("nats://h:x", "bad port in \"h:x\""),
            ("nats://h/a/b", "the path is one bucket name"),
            ("nats://h/a.b", "may only contain"),
            ("nats://h/b?create=yes", "use create=true or create=false"),
            (
                "nats://h/b?bogus=1",
                "unknown option \"bogus\" (allowed: create)",
            ),
            ("etcd://h", "not a NATS URL"),
        ] {
            match NatsConfig::from_url(url) {
                Err(Error::Backend(e)) => assert!(e.to_string().contains(why), "{url}: {e}"),
                other => panic!("{url}: not refused: {other:?}"),
            }
        }
    }
}
