//! What a [`NatsBackend`](crate::NatsBackend) is told at construction.

use std::time::Duration;

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
