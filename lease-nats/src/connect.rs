//! Connecting: the server version and JetStream checks, opening (or creating)
//! the bucket and checking that it can hold leases, and its anchor; and what
//! the backend was built with.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use async_nats::jetstream::stream::StorageType;
use async_nats::jetstream::{self, Context};
use async_nats::{Client, ConnectOptions, HeaderMap};
use bytes::Bytes;
use futures_util::FutureExt;
use lease_core::{
    AcquireRequest, Capabilities, Error, Exclusion, FenceScope, HolderId, LeaseKey, TimeAuthority,
    TtlRule, MAX_PAYLOAD_LEN,
};

use crate::backend::{Inner, NatsBackend};
use crate::cache::Cache;
use crate::config::NatsConfig;
use crate::errors::{connect_error, refused};
use crate::record;

/// The oldest nats-server with per-message TTLs (`Nats-TTL`, ADR-43).
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 11);

/// Bytes of a NATS message reserved for our record header and the JetStream
/// headers, out of the server's `max_payload`.
const ENVELOPE: usize = 1024;

/// The bucket key of the anchor message: a key no [`LeaseKey`] can be
/// (a lease key never starts with `/`), so it never collides with a lease.
pub const ANCHOR_KEY: &str = "/lease-nats/anchor";

/// The anchor's body: says what it is to whoever looks at the bucket.
const ANCHOR_BODY: &[u8] =
    b"lease-nats anchor: a permanent message that keeps this bucket's stream \
non-empty, so that its sequence (the leases' fence counter) is never that of an empty stream. \
Do not delete it.";

impl NatsBackend {
    /// Connects to `url` (one server, or a comma-separated list of a cluster's
    /// servers) with default connection options, opens the configured bucket
    /// (creating it only if [`NatsConfig::create_bucket`] says so) and writes
    /// its anchor ([`ANCHOR_KEY`]) if that is missing and this client may
    /// write it.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the server cannot be reached;
    /// [`Error::Backend`] when it is older than 2.11, has no JetStream, the
    /// bucket is missing (and not to be created), or it cannot be used for
    /// leases (no message TTLs or delete markers, a `max_age`, memory storage).
    pub async fn connect(url: &str, config: NatsConfig) -> Result<Self, Error> {
        Self::connect_with_options(url, ConnectOptions::new(), config).await
    }

    /// Connects with `options` (credentials, TLS, names… as async-nats offers).
    ///
    /// TLS: async-nats uses the configuration given with
    /// `ConnectOptions::tls_client_config` or, without one, builds its own
    /// with rustls's process-wide crypto provider. When more than one
    /// provider is compiled into the program, the application must install
    /// one or pass such a configuration: lease-nats never installs one.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), and [`Error::Backend`] naming the fix
    /// when TLS is needed and rustls cannot choose a crypto provider.
    pub async fn connect_with_options(
        url: &str,
        options: ConnectOptions,
        config: NatsConfig,
    ) -> Result<Self, Error> {
        config.validate()?;
        // A comma-separated list names several servers of one cluster: the
        // client fails over between them (and learns the others from INFO).
        let servers: Vec<&str> = url.split(',').map(str::trim).collect();
        // async-nats builds its own TLS configuration (when `options` carry
        // none) with rustls's process-wide crypto provider, and panics when
        // rustls cannot choose one: a clear error instead (see
        // `NO_CRYPTO_PROVIDER`). No provider is ever installed here.
        let client = AssertUnwindSafe(options.connect(servers))
            .catch_unwind()
            .await
            .map_err(connect_panic)?
            .map_err(|e| connect_error(url, e))?;
        Self::with_client(client, config).await
    }

    /// Keys held in this client's per-key caches (for observing that they stay
    /// bounded).
    #[doc(hidden)]
    pub fn cached_keys(&self) -> usize {
        self.inner.cache.len()
    }

    /// An acquire request for `key` by `holder` with the configured default TTL.
    pub fn request(&self, key: LeaseKey, holder: HolderId) -> AcquireRequest {
        AcquireRequest::new(key, holder).ttl(self.inner.config.default_ttl)
    }

    /// The underlying connection.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The configuration in force.
    pub fn config(&self) -> &NatsConfig {
        &self.inner.config
    }

    /// JetStream requests this backend (all clones) has sent: for measuring
    /// round trips per operation.
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Uses an existing connection.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_client(client: Client, config: NatsConfig) -> Result<Self, Error> {
        config.validate()?;
        let info = client.server_info();
        check_server_version(&info.version)?;
        if !info.jetstream {
            return Err(refused(format!(
                "nats-server {} at {}:{} has JetStream disabled; lease-nats needs it (run nats-server with -js)",
                info.version, info.host, info.port
            )));
        }
        let js = jetstream::ContextBuilder::new()
            .timeout(config.request_timeout)
            .build(client.clone());
        let (kv, last_seq) = open_bucket(&js, &config).await?;
        let max_payload = info
            .max_payload
            .saturating_sub(ENVELOPE)
            .min(MAX_PAYLOAD_LEN);
        let ttl =
            TtlRule::new(Duration::from_secs(1)..=Duration::from_secs(config.max_ttl.as_secs()))
                .rounded_to(Duration::from_secs(1));
        let capabilities = Capabilities::new(TimeAuthority::BackendClock, ttl)
            .with_watch(true)
            .with_exclusion(Exclusion::Atomic)
            .with_fence_scope(FenceScope::Global)
            .with_max_payload(max_payload);
        let backend = NatsBackend {
            inner: Arc::new(Inner {
                subject_prefix: format!("$KV.{}.", config.bucket),
                client,
                js,
                kv,
                config,
                capabilities,
                cache: Cache::new(),
                max_seq: AtomicU64::new(last_seq),
                requests: AtomicU64::new(0),
            }),
        };
        // Best effort: a client that may only read (a watcher, a status
        // check) must still connect, and any writer's connect writes it.
        let _ = backend.ensure_anchor().await;
        Ok(backend)
    }

    /// Writes the bucket's anchor unless it is there: a message on the key
    /// [`ANCHOR_KEY`] without a TTL, so the stream is never empty (nats-server
    /// has, in several versions, lost an empty stream's last sequence on
    /// restart or crash recovery). An anchor deleted or purged as a key leaves
    /// a tombstone, which keeps the stream non-empty too and is replaced here;
    /// one removed from the stream itself is written again by the next
    /// connect. A failure leaves the bucket as it was (the next connect tries
    /// again).
    async fn ensure_anchor(&self) -> Result<(), Error> {
        let subject = format!("{}{ANCHOR_KEY}", self.inner.subject_prefix);
        let bucket = &self.inner.config.bucket;
        let expected = match self.last_message(&subject).await {
            Ok(Some(msg)) => {
                let tombstone = msg.headers.get(record::MARKER_REASON).is_some()
                    || msg
                        .headers
                        .get(record::KV_OPERATION)
                        .is_some_and(|op| op.as_str() != "PUT");
                if !tombstone {
                    return Ok(());
                }
                msg.sequence
            }
            Ok(None) => 0,
            Err(e) => {
                return Err(Error::unavailable(
                    format!("reading the anchor of NATS KV bucket {bucket:?}"),
                    e,
                ))
            }
        };
        match self
            .publish_expecting(
                subject,
                HeaderMap::new(),
                Bytes::from_static(ANCHOR_BODY),
                expected,
            )
            .await
        {
            Ok(Some(ack)) => {
                self.saw_seq(ack.sequence);
                Ok(())
            }
            // Another client wrote it in between.
            Ok(None) => Ok(()),
            Err(e) => Err(Error::unavailable(
                format!("writing the anchor of NATS KV bucket {bucket:?}"),
                e,
            )),
        }
    }
}

/// Refuses servers without per-message TTLs: on them a lease would be stored
/// without an expiry and never run out.
///
/// ```
/// assert!(lease_nats::check_server_version("2.15.1").is_ok());
/// assert!(lease_nats::check_server_version("2.11.0-RC.1").is_ok());
/// let err = lease_nats::check_server_version("2.9.25").unwrap_err();
/// assert!(err.to_string().contains("2.11"));
/// ```
///
/// # Errors
/// [`Error::Backend`] naming the version found and the version needed.
pub fn check_server_version(version: &str) -> Result<(), Error> {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().ok());
    let found = match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => {
            return Err(refused(format!(
                "cannot read the nats-server version {version:?}; lease-nats needs nats-server >= {}.{} (per-message TTLs)",
                MIN_SERVER_VERSION.0, MIN_SERVER_VERSION.1
            )))
        }
    };
    if found < MIN_SERVER_VERSION {
        return Err(refused(format!(
            "nats-server {version} is too old: lease-nats needs nats-server >= {}.{} for per-message TTLs (Nats-TTL); on older servers a lease would never expire",
            MIN_SERVER_VERSION.0, MIN_SERVER_VERSION.1
        )));
    }
    Ok(())
}

/// Opens the bucket (creating it when missing, if asked to) and checks that it
/// can hold leases safely. Returns it with its stream's last sequence.
pub(crate) async fn open_bucket(
    js: &Context,
    config: &NatsConfig,
) -> Result<(kv::Store, u64), Error> {
    let bucket = config.bucket.as_str();
    let stream_name = format!("KV_{bucket}");
    let exists = match js.get_stream(stream_name.as_str()).await {
        Ok(_) => true,
        Err(e) if stream_not_found(&e) => false,
        Err(e) => {
            return Err(Error::unavailable(
                format!("cannot read NATS KV bucket {bucket:?}"),
                e,
            ))
        }
    };
    if !exists && !config.create_bucket {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} does not exist. Its stream sequence is the leases' fence \
             counter: a bucket made afresh counts from 1 again, so it is not created unless \
             asked for (NatsConfig::create_bucket). Create it that way for a first deployment; \
             if it existed before and was deleted, fences from a new one can repeat old ones"
        )));
    }
    let store = if exists {
        js.get_key_value(bucket)
            .await
            .map_err(|e| Error::unavailable(format!("cannot open NATS KV bucket {bucket:?}"), e))?
    } else {
        let kv_config = kv::Config {
            bucket: bucket.to_owned(),
            description: "lease-nats: leases with fencing tokens".into(),
            history: 1,
            // Memory storage restarts the sequence, hence the fences, with
            // the server.
            storage: StorageType::File,
            num_replicas: config.replicas,
            // Allows per-message TTLs and makes the server leave a delete
            // marker (kept this long) when a grant expires: expiry becomes an
            // event watchers see.
            limit_markers: Some(config.marker_ttl),
            ..Default::default()
        };
        match js.create_key_value(kv_config).await {
            Ok(store) => store,
            // Another client may have created it in between.
            Err(create_err) => js.get_key_value(bucket).await.map_err(|_| {
                Error::unavailable(
                    format!("cannot create NATS KV bucket {bucket:?}"),
                    create_err,
                )
            })?,
        }
    };
    let info = store.stream.cached_info();
    let sc = &info.config;
    if !sc.allow_message_ttl {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} does not allow per-message TTLs: leases in it would never expire. Use a new bucket (lease-nats creates it with message TTLs and delete markers) or update the stream with allow_msg_ttl"
        )));
    }
    if sc.subject_delete_marker_ttl.is_none() {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} has no subject delete markers: an expired lease would vanish without an event, so watchers would never see it. Use a bucket created by lease-nats (or set subject_delete_marker_ttl)"
        )));
    }
    if !sc.max_age.is_zero() {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} has max_age {:?}: the server would drop a lease before its TTL. Use a bucket without max_age",
            sc.max_age
        )));
    }
    if sc.storage == StorageType::Memory {
        return Err(refused(format!(
            "NATS KV bucket {bucket:?} keeps its messages in memory: its stream sequence, the \
             leases' fence counter, starts again from 1 when the server restarts, so fences \
             would repeat. Use a bucket with file storage"
        )));
    }
    Ok((store.clone(), info.state.last_sequence))
}

pub(crate) fn stream_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    use async_nats::jetstream::context::GetStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    matches!(e.kind(), GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// A panic inside async-nats' connect, as an error: the one rustls raises
/// when it cannot choose a crypto provider says how to fix it.
fn connect_panic(payload: Box<dyn std::any::Any + Send>) -> Error {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    if msg.contains("CryptoProvider") {
        Error::Backend(NO_CRYPTO_PROVIDER.into())
    } else {
        Error::Backend(format!("lease-nats: the NATS client failed while connecting: {msg}").into())
    }
}

/// Why a connect that needed TLS failed without a crypto provider, and the
/// fix: the choice of provider is the application's.
pub(crate) const NO_CRYPTO_PROVIDER: &str = "lease-nats: TLS to NATS needs a rustls crypto \
provider, and rustls cannot choose one because more than one (ring and aws-lc-rs) is compiled \
into this program. Choose one in the application before connecting, e.g. \
`rustls::crypto::ring::default_provider().install_default()`, or pass async-nats a TLS \
configuration built with an explicit provider (`ConnectOptions::tls_client_config` with \
`rustls::ClientConfig::builder_with_provider`). lease-nats never installs one itself";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_crypto_provider_is_an_error_naming_the_fix() {
        let rustls_panic: Box<dyn std::any::Any + Send> = Box::new(String::from(
            "Could not automatically determine the process-level CryptoProvider from Rustls crate features.",
        ));
        let e = connect_panic(rustls_panic).to_string();
        assert!(
            e.contains("install_default()") && e.contains("tls_client_config"),
            "{e}"
        );
        let other: Box<dyn std::any::Any + Send> = Box::new("index out of bounds");
        let e = connect_panic(other).to_string();
        assert!(
            e.contains("index out of bounds") && !e.contains("install_default"),
            "{e}"
        );
    }

    #[test]
    fn version_gate() {
        assert!(check_server_version("2.11.0").is_ok());
        assert!(check_server_version("v2.12.3").is_ok());
        assert!(check_server_version("3.0.0").is_ok());
        for old in ["2.10.22", "2.9.0", "1.4.1", "", "garbage"] {
            let e = check_server_version(old).unwrap_err();
            assert!(e.to_string().contains(">= 2.11"), "{e}");
        }
    }
}
