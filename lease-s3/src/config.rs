//! Building an S3 client suited to leases (feature `s3`, on by default).

use std::sync::Arc;
use std::time::Duration;

use lease_core::Error;
use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

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
        }
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
