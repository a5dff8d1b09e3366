//! Opening the client: [`EtcdBackend::connect`] checks the configuration,
//! connects, probes the cluster and learns the shortest TTL it grants; and
//! what an open backend tells about itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use lease_core::{Error, LeaseKey};

use crate::backend::EtcdBackend;
use crate::conn::Conn;
use crate::errors::{convert, timed};
use crate::keepalive::KeepAlives;
use crate::reads::Reads;
use crate::session_leases::Sessions;
use crate::{tls, EtcdConfig};

impl EtcdBackend {
    /// Connects to the cluster and checks that it answers within the dial
    /// timeout. Touches no lease key.
    ///
    /// # Errors
    /// [`Error::Backend`] for an invalid configuration or a refused request
    /// (e.g. bad credentials), [`Error::Unavailable`] when no member answered
    /// in time (including TLS handshakes that fail).
    pub async fn connect(config: EtcdConfig) -> Result<Self, Error> {
        config.validate()?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.dial_timeout)
            // etcd answers pings more often than every 5 s with GOAWAY; this
            // still notices a silently dead connection within 15 s.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from the quorum answers at once instead of
            // hanging, so a holder learns it cannot renew.
            .with_require_leader(true);
        if let Some(t) = &config.tls {
            #[cfg(feature = "tls")]
            {
                opts = opts.with_tls(tls::options(t)?);
            }
            #[cfg(not(feature = "tls"))]
            return Err(tls::refuse(t));
        }
        if let Some((user, password)) = &config.user {
            opts = opts.with_user(user.clone(), password.clone());
        }
        let dial = config.dial_timeout;
        let where_ = config.endpoints.join(", ");
        let client = match tokio::time::timeout(
            dial,
            Client::connect(&config.endpoints, Some(opts)),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(convert(&format!("connect to {where_}"), e)),
            Err(_) => {
                return Err(Error::Unavailable {
                    detail: format!("no etcd member at {where_} answered within {dial:?}"),
                    source: None,
                })
            }
        };
        let backend = EtcdBackend {
            inner: Arc::new(Conn {
                client,
                prefix: config.key_prefix.clone(),
                timeout: config.request_timeout,
                default_ttl: config.default_ttl,
                endpoints: config.endpoints.clone(),
                keep_alives: KeepAlives::new(),
                sessions: config.sessions.then(Sessions::default),
                reads: Reads::new(),
                mirror: config
                    .sessions
                    .then(|| crate::mirror::Mirror::new(&config.key_prefix)),
                min_ttl_secs: AtomicU64::new(1),
            }),
        };
        backend.probe(dial, &config).await?;
        backend.learn_min_ttl().await?;
        if let Some(mirror) = &backend.inner.mirror {
            mirror
                .start(&backend.inner.client, backend.inner.timeout)
                .await;
        }
        // Without a tokio runtime to run on (a foreign executor), keys are
        // still swept before every keep-alive of their session.
        if let (Some(sessions), Ok(runtime)) = (
            &backend.inner.sessions,
            tokio::runtime::Handle::try_current(),
        ) {
            runtime.spawn(crate::sweep::run(
                sessions.bindings.clone(),
                backend.inner.client.clone(),
                backend.inner.timeout,
            ));
        }
        Ok(backend)
    }

    /// One cheap read, so that a wrong address, certificate or password shows
    /// up here rather than on the first acquire. The probe key cannot collide
    /// with a lease key (no lease-key segment starts with `.`).
    async fn probe(&self, dial: Duration, config: &EtcdConfig) -> Result<(), Error> {
        let mut kv = self.inner.client.kv_client();
        let key = format!("{}.probe", self.inner.prefix);
        let where_ = self.inner.endpoints.join(", ");
        match tokio::time::timeout(dial, kv.get(key, Some(GetOptions::new().with_count_only())))
            .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                let what = match closed_hint(&e, config) {
                    Some(hint) => format!("first request to {where_} ({hint})"),
                    None => format!("first request to {where_}"),
                };
                Err(convert(&what, e))
            }
            Err(_) => Err(Error::Unavailable {
                detail: format!("no etcd member at {where_} answered within {dial:?}"),
                source: None,
            }),
        }
    }

    /// Asks the server for a 1 s lease and records the TTL it really granted
    /// (then revokes it), so the capabilities report the minimum the server
    /// enforces rather than etcd's nominal 1 s.
    async fn learn_min_ttl(&self) -> Result<(), Error> {
        let mut lc = self.inner.client.lease_client();
        let granted = timed("lease grant", self.inner.timeout, lc.grant(1, None)).await?;
        let secs = u64::try_from(granted.ttl()).unwrap_or(1).max(1);
        self.inner.min_ttl_secs.store(secs, Ordering::Relaxed);
        self.inner.revoke_quietly(granted.id()).await;
        Ok(())
    }
}

impl EtcdBackend {
    /// The etcd key under which `key` is stored.
    pub fn etcd_key(&self, key: &LeaseKey) -> String {
        self.inner.etcd_key(key)
    }

    /// The underlying etcd client, for what this crate does not cover (e.g.
    /// watching many keys). Writing to lease keys through it breaks the
    /// guarantees of this crate.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The default TTL from the configuration.
    pub fn default_ttl(&self) -> Duration {
        self.inner.default_ttl
    }

    /// Whether this client binds its keys to session leases.
    pub fn sessions(&self) -> bool {
        self.inner.sessions()
    }

    /// How many keep-alive streams this client holds open (one per lease it
    /// renewed and has not seen end; with sessions, one per session).
    pub fn open_keep_alive_streams(&self) -> usize {
        self.inner.keep_alives.open()
    }

    /// The etcd key of the audit record of a break of `key` at `revision`.
    pub fn audit_key(&self, key: &LeaseKey, revision: i64) -> String {
        self.inner.audit_key(key, revision)
    }
}

/// When the server hangs up on the first request, the client library only
/// says "broken pipe" or "connection closed"; with TLS that almost always
/// means the server refused our client certificate (or its absence), and
/// without TLS that we spoke plaintext to a TLS port. Say so.
fn closed_hint(e: &etcd_client::Error, config: &EtcdConfig) -> Option<&'static str> {
    let text = format!("{e:?}").to_lowercase();
    let hung_up = [
        "broken pipe",
        "connection closed",
        "connection reset",
        "brokenpipe",
        "connectionreset",
        "fatal alert",
    ]
    .iter()
    .any(|w| text.contains(w));
    if !hung_up {
        return None;
    }
    Some(match &config.tls {
        Some(t) if t.client_cert_pem.is_none() => {
            "the server closed the TLS connection: it probably requires a client certificate (--client-cert-auth) and none is configured"
        }
        Some(_) => {
            "the server closed the TLS connection: it probably does not accept this client certificate (is it signed by the CA in the server's --trusted-ca-file?)"
        }
        None => {
            "the server closed the connection: if it serves TLS, use an https:// endpoint and a TlsConfig"
        }
    })
}
