//! Building an S3 client suited to leases (feature `s3`, on by default).

use std::sync::Arc;
use std::time::Duration;

use lease_core::url::{allow, query_params, Parts};
use lease_core::Error;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{BackoffConfig, ClientConfigKey, ClientOptions, ObjectStore, RetryConfig};

/// Where and how to reach an S3-compatible service.
///
/// ```
/// let cfg = lease_s3::S3Config::new("my-bucket")
///     .endpoint("http://127.0.0.1:9000")
///     .credentials("minio", "minio123");
/// assert_eq!(cfg.bucket, "my-bucket");
/// ```
///
/// It may gain fields, so it is built with its constructor and setters,
/// never as a struct literal.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct S3Config {
    /// The bucket; it must exist.
    pub bucket: String,
    /// The region (`us-east-1` unless told otherwise).
    pub region: String,
    /// A custom endpoint (MinIO, moto, R2…); `None` means AWS. `http://`
    /// endpoints are allowed.
    pub endpoint: Option<String>,
    /// Access key id; `None` leaves credentials to the environment
    /// (`AWS_ACCESS_KEY_ID`, instance metadata, …).
    pub access_key: Option<String>,
    /// Secret access key.
    pub secret_key: Option<String>,
    /// Limit on one HTTP request, retries excluded. Keep it well under a
    /// third of your TTL: a renewal stuck longer cannot save the lease anyway.
    pub request_timeout: Duration,
    /// Total time the client may spend retrying one operation.
    pub retry_timeout: Duration,
    /// Whether [`builder`](S3Config::builder) starts from the AWS
    /// environment, as object_store reads it (set by
    /// [`from_url`](S3Config::from_url)).
    environment: bool,
}

impl S3Config {
    /// A bucket on AWS in `us-east-1`, credentials from the environment,
    /// 5 s per request, 10 s of retries.
    pub fn new(bucket: impl Into<String>) -> Self {
        S3Config {
            bucket: bucket.into(),
            region: "us-east-1".into(),
            endpoint: None,
            access_key: None,
            secret_key: None,
            request_timeout: Duration::from_secs(5),
            retry_timeout: Duration::from_secs(10),
            environment: false,
        }
    }

    /// The settings a connection URL names, over the AWS environment, as
    /// the `lease` crate and command read it; the key prefix comes second,
    /// for [`ObjectStoreBackend::new`](crate::ObjectStoreBackend::new):
    ///
    /// ```text
    /// s3://bucket[/prefix][?endpoint=http(s)://host:port&region=name]
    /// ```
    ///
    /// The client it [`build`](Self::build)s reads the AWS environment as
    /// object_store's `AmazonS3Builder::from_env` does: credentials of every
    /// kind object_store knows (`AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, web identity, ECS and
    /// EKS container credentials, instance metadata), `AWS_REGION`,
    /// `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, `AWS_TIMEOUT`, …. The URL's
    /// `region` and `endpoint` win over the environment's; the region is
    /// read here (the URL's, else the environment's, else `us-east-1`). A
    /// plain `http://` endpoint (MinIO, moto) is allowed unless
    /// `AWS_ALLOW_HTTP` says otherwise, and this configuration's
    /// [`request_timeout`](Self::request_timeout) applies unless
    /// `AWS_TIMEOUT` / `AWS_CONNECT_TIMEOUT` set one. Setters called
    /// afterwards (e.g. [`credentials`](Self::credentials)) win over both.
    ///
    /// ```
    /// use lease_s3::S3Config;
    ///
    /// let (config, prefix) =
    ///     S3Config::from_url("s3://my-bucket/jobs/leases?endpoint=http://127.0.0.1:9000&region=eu-west-1")?;
    /// assert_eq!(config.bucket, "my-bucket");
    /// assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    /// assert_eq!(config.region, "eu-west-1");
    /// assert_eq!(prefix, "jobs/leases");
    /// // ObjectStoreBackend::new(config.build()?, &prefix)?;
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`], saying what is wrong, for a URL of another scheme,
    /// without a bucket, with an unknown option or an endpoint that is not
    /// an `http://` or `https://` URL.
    pub fn from_url(url: &str) -> Result<(Self, String), Error> {
        let bad = |reason: String| Error::Backend(reason.into());
        let Parts {
            scheme,
            authority: bucket,
            path: prefix,
            query,
            ..
        } = Parts::of(url).ok_or_else(|| bad("expected s3://…".into()))?;
        if scheme != "s3" {
            return Err(bad(format!("not an S3 URL: scheme {scheme:?}")));
        }
        if bucket.is_empty() {
            return Err(bad(
                "no bucket (s3://BUCKET/prefix?endpoint=…&region=…)".into()
            ));
        }
        let params = query_params(query);
        allow(&params, &["endpoint", "region"]).map_err(bad)?;
        let mut config = S3Config::new(bucket);
        config.environment = true;
        if let Some(endpoint) = params.get("endpoint") {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(bad("endpoint must be an http:// or https:// URL".into()));
            }
            config.endpoint = Some(endpoint.clone());
        }
        config.region = match params.get("region") {
            Some(region) => region.clone(),
            None => AmazonS3Builder::from_env()
                .get_config_value(&AmazonS3ConfigKey::Region)
                .unwrap_or(config.region),
        };
        Ok((config, prefix.to_owned()))
    }

    /// Sets a custom endpoint.
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Sets the region.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = region.into();
        self
    }

    /// Sets static credentials.
    pub fn credentials(
        mut self,
        access_key: impl Into<String>,
        secret_key: impl Into<String>,
    ) -> Self {
        self.access_key = Some(access_key.into());
        self.secret_key = Some(secret_key.into());
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`retry_timeout`](Self::retry_timeout).
    pub fn retry_timeout(mut self, timeout: Duration) -> Self {
        self.retry_timeout = timeout;
        self
    }

    /// The object_store builder for this configuration (path-style requests,
    /// conditional puts by ETag), for further tuning.
    pub fn builder(&self) -> AmazonS3Builder {
        if self.environment {
            return self.environment_builder();
        }
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(&self.region)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(self.request_timeout)
                    .with_connect_timeout(self.request_timeout.min(Duration::from_secs(5))),
            )
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: 3,
                retry_timeout: self.retry_timeout,
            });
        if let Some(endpoint) = &self.endpoint {
            b = b
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        if let (Some(k), Some(s)) = (&self.access_key, &self.secret_key) {
            b = b.with_access_key_id(k).with_secret_access_key(s);
        }
        b
    }

    /// The builder of a configuration read from a URL: object_store's own
    /// reading of the AWS environment, then this configuration, which wins,
    /// and its request limits where the environment sets none.
    fn environment_builder(&self) -> AmazonS3Builder {
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_region(&self.region)
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: 3,
                retry_timeout: self.retry_timeout,
            });
        let connect_timeout = self.request_timeout.min(Duration::from_secs(5));
        // object_store's own defaults (30 s) are too long for a renewal.
        for (var, key, limit) in [
            (
                "AWS_TIMEOUT",
                ClientConfigKey::Timeout,
                self.request_timeout,
            ),
            (
                "AWS_CONNECT_TIMEOUT",
                ClientConfigKey::ConnectTimeout,
                connect_timeout,
            ),
        ] {
            if std::env::var_os(var).is_none() {
                b = b.with_config(
                    AmazonS3ConfigKey::Client(key),
                    format!("{}ms", limit.as_millis()),
                );
            }
        }
        if let Some(endpoint) = &self.endpoint {
            b = b.with_endpoint(endpoint);
        }
        // A plain-HTTP endpoint is a local server (MinIO, moto): allowed
        // unless the environment says otherwise.
        let plain_http = [AmazonS3ConfigKey::Endpoint, AmazonS3ConfigKey::S3Endpoint]
            .iter()
            .any(|k| {
                b.get_config_value(k)
                    .is_some_and(|e| e.starts_with("http://"))
            });
        if plain_http && std::env::var_os("AWS_ALLOW_HTTP").is_none() {
            b = b.with_allow_http(true);
        }
        if let (Some(k), Some(s)) = (&self.access_key, &self.secret_key) {
            b = b.with_access_key_id(k).with_secret_access_key(s);
        }
        b
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`Error::Backend`] when the configuration is refused.
    pub fn build(&self) -> Result<Arc<dyn ObjectStore>, Error> {
        build_s3(self.builder())
    }
}

/// Builds an S3 client from an object_store builder.
///
/// No process-wide rustls crypto provider is installed: the client uses the
/// process default if the application installed one, and otherwise
/// aws-lc-rs for this client only (see the crate's README, *TLS*).
///
/// # Errors
/// [`Error::Backend`] when the builder refuses its configuration.
pub fn build_s3(builder: AmazonS3Builder) -> Result<Arc<dyn ObjectStore>, Error> {
    let store = builder
        .build()
        .map_err(|e| Error::Backend(format!("S3 client configuration: {e}").into()))?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_bucket_prefix_endpoint_and_region() {
        let (c, prefix) = S3Config::from_url(
            "s3://bkt/leases/x?endpoint=http%3A%2F%2F127.0.0.1:9000&region=eu-west-1",
        )
        .unwrap();
        assert_eq!(c.bucket, "bkt");
        assert_eq!(prefix, "leases/x");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(c.region, "eu-west-1");
        let b = c.builder();
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::Region).as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
                .as_deref(),
            Some("true")
        );
        let (c, prefix) = S3Config::from_url("s3://bkt").unwrap();
        assert_eq!(
            (c.bucket.as_str(), prefix.as_str(), c.endpoint),
            ("bkt", "", None)
        );
    }

    #[test]
    fn bad_urls_say_why() {
        for (url, why) in [
            ("s3:///x", "no bucket"),
            (
                "s3://b/x?bogus=1",
                "unknown option \"bogus\" (allowed: endpoint, region)",
            ),
            (
                "s3://b/x?endpoint=ftp://h",
                "endpoint must be an http:// or https:// URL",
            ),
            ("etcd://h", "not an S3 URL"),
        ] {
            match S3Config::from_url(url) {
                Err(Error::Backend(e)) => assert!(e.to_string().contains(why), "{url}: {e}"),
                other => panic!("{url}: not refused: {other:?}"),
            }
        }
    }
}
