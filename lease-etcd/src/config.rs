//! How to reach etcd and how to lay leases out in it.

use std::fmt;
use std::time::Duration;

use lease_core::url::{allow, flag, hosts, query_params, Parts};
use lease_core::{Error, DEFAULT_TTL};

/// Connection and layout settings for [`EtcdBackend`](crate::EtcdBackend).
///
/// ```
/// use std::time::Duration;
/// use lease_etcd::EtcdConfig;
/// let config = EtcdConfig::new(["http://127.0.0.1:2379"])
///     .key_prefix("myapp/leases/")
///     .dial_timeout(Duration::from_secs(2));
/// assert_eq!(config.endpoints, vec!["http://127.0.0.1:2379".to_string()]);
/// assert_eq!(config.default_ttl, Duration::from_secs(10));
/// ```
///
/// It may gain fields, so it is built with its constructor and setters,
/// never as a struct literal.
#[derive(Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// Client URLs of the cluster members (`http://host:port`, or
    /// `https://host:port` together with [`tls`](EtcdConfig::tls)).
    pub endpoints: Vec<String>,
    /// TLS settings; `None` means plaintext (the operator's call).
    pub tls: Option<TlsConfig>,
    /// User name and password for etcd's own authentication, if enabled.
    pub user: Option<(String, String)>,
    /// How long [`EtcdBackend::connect`](crate::EtcdBackend::connect) waits for
    /// the cluster to answer a first request (default 5 s).
    pub dial_timeout: Duration,
    /// Upper bound on one request; a request that takes longer is abandoned
    /// with [`Error::Unavailable`] (default 5 s). Keep it below your TTLs: a
    /// renewal that answers after the deadline is worthless anyway.
    pub request_timeout: Duration,
    /// Prepended to every lease key to form the etcd key (default `"lease/"`).
    /// Give each application its own prefix.
    pub key_prefix: String,
    /// TTL used by the single-lease [`EtcdProvider`](crate::provider::EtcdProvider),
    /// whose calls take no TTL (default 10 s; rounded up to whole seconds,
    /// minimum 1 s).
    pub default_ttl: Duration,
    /// Whether the keys this client holds with the same TTL share one etcd
    /// lease, a *session* (default on). See
    /// [`sessions`](EtcdConfig::sessions) for what that changes.
    pub sessions: bool,
}

impl EtcdConfig {
    /// Settings for `endpoints` with every default: plaintext, 5 s dial and
    /// request timeouts, prefix `"lease/"`, TTL 10 s.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tls: None,
            user: None,
            dial_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            key_prefix: "lease/".to_string(),
            default_ttl: DEFAULT_TTL,
            sessions: true,
        }
    }

    /// Sets the key prefix.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets TLS.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the etcd user and password.
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// Sets the dial timeout.
    pub fn dial_timeout(mut self, timeout: Duration) -> Self {
        self.dial_timeout = timeout;
        self
    }

    /// Sets the per-request timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the default TTL.
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Shares one etcd lease — a session, as etcd's own `concurrency`
    /// package keeps — among the keys this client holds with the same TTL
    /// (on by default; `false` gives every key an etcd lease of its own).
    ///
    /// What it gains: an acquire is one transaction (beside it a keep-alive
    /// of the session lease when the session was last kept alive more than
    /// a sixth of the TTL ago, shared by every acquire and renewal in flight
    /// at the same time), a release is one guarded delete, a renewal is one
    /// keep-alive shared by every key of the session plus one verifying
    /// read (the reads of renewals in flight at the same time go out
    /// together, in one transaction), and an acquire refused again on the
    /// same key is one request. Without sessions an acquire is a lease
    /// grant and a transaction, a release a delete and a revoke.
    ///
    /// What it costs:
    /// * **One session's loss ends all its keys.** If the session lease
    ///   expires or is revoked, etcd deletes every key bound to it, and
    ///   each key's next renewal answers `Lost`.
    /// * **A key nobody renews is deleted by the client.** On a lease of
    ///   its own such a key expires with its lease; on a session lease,
    ///   which the client's other keys keep alive, the client deletes it
    ///   one TTL after its last renewal (a dropped grant, a cancelled
    ///   acquire or renewal), with a delete that only removes it while it
    ///   is still bound to the session lease. So that promise rests on the
    ///   client's runtime: if the tokio runtime the client was connected on
    ///   stops, its abandoned keys live until the session lease expires,
    ///   at most one TTL after the last keep-alive of any of its keys.
    /// * A refused acquire does not report the holder's remaining time
    ///   ([`Holding::remaining`](lease_core::Holding::remaining) is `None`);
    ///   a read does.
    ///
    /// Every other promise holds per key as without sessions: a fence per
    /// grant, a renewal after a takeover or an outside delete of the key is
    /// `Lost`, and a release touches only its own key (it never revokes the
    /// session lease). A grant's deadline counts from the send of the last
    /// keep-alive that extended its session lease, which may lie up to a
    /// sixth of the TTL before the call: the holder gets a little less time
    /// to write, never more than the session lease gives. A key held under
    /// one holder id by several clients at once (a re-acquire from another
    /// client, as the holders of a shared phase do) is kept on an etcd lease
    /// of its own, which each of them renews.
    pub fn sessions(mut self, on: bool) -> Self {
        self.sessions = on;
        self
    }

    /// Settings from a connection URL, as the `lease` crate and command
    /// read it:
    ///
    /// ```text
    /// etcd://host[:port][,host[:port]…][/prefix][?sessions=false|true]
    /// etcds://…   (the same, over TLS)
    /// ```
    ///
    /// * a host without a port is on 2379, as `etcdctl` assumes; an IPv6
    ///   host is written in brackets (`[::1]`, `[::1]:2379`);
    /// * `etcds://` makes every endpoint `https://`: give the CA with
    ///   [`tls`](Self::tls) before connecting;
    /// * keys live under `prefix/` (default `lease/`);
    /// * `sessions=false` turns [`sessions`](Self::sessions) off (they are
    ///   on by default).
    ///
    /// Credentials are not taken from the URL: set them with
    /// [`user`](Self::user). Everything else keeps its default.
    ///
    /// ```
    /// use lease_etcd::EtcdConfig;
    ///
    /// let config = EtcdConfig::from_url("etcd://etcd-1,etcd-2:2380/jobs")?;
    /// assert_eq!(config.endpoints, ["http://etcd-1:2379", "http://etcd-2:2380"]);
    /// assert_eq!(config.key_prefix, "jobs/");
    /// assert!(config.sessions);
    /// assert!(!EtcdConfig::from_url("etcd://etcd-1/jobs?sessions=false")?.sessions);
    /// # Ok::<(), lease_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`], saying what is wrong, for a URL of another scheme,
    /// without a host, with a bad port, credentials or an unknown option.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::Backend(reason.into());
        let Parts {
            scheme,
            authority,
            path,
            query,
            ..
        } = Parts::of(url).ok_or_else(|| bad("expected etcd://… or etcds://…".into()))?;
        let http = match scheme {
            "etcd" => "http",
            "etcds" => "https",
            other => return Err(bad(format!("not an etcd URL: scheme {other:?}"))),
        };
        let hosts = hosts(authority, DEFAULT_PORT).map_err(bad)?;
        let params = query_params(query);
        allow(&params, &["sessions"]).map_err(bad)?;
        let sessions = match params.contains_key("sessions") {
            true => flag(&params, "sessions").map_err(bad)?,
            false => true,
        };
        let mut config =
            EtcdConfig::new(hosts.iter().map(|h| format!("{http}://{h}"))).sessions(sessions);
        if !path.is_empty() {
            config = config.key_prefix(format!("{path}/"));
        }
        Ok(config)
    }

    /// Refuses settings that cannot work, before anything is dialled.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| {
            Err(Error::Backend(
                format!("invalid etcd configuration: {reason}").into(),
            ))
        };
        if self.endpoints.is_empty() {
            return invalid("no endpoints given".into());
        }
        if let Some(e) = self.endpoints.iter().find(|e| e.trim().is_empty()) {
            return invalid(format!("empty endpoint {e:?}"));
        }
        if self.dial_timeout.is_zero() {
            return invalid("the dial timeout must be positive".into());
        }
        if self.request_timeout.is_zero() {
            return invalid("the request timeout must be positive".into());
        }
        if self.tls.is_some() {
            if let Some(e) = self.endpoints.iter().find(|e| e.starts_with("http://")) {
                return invalid(format!(
                    "endpoint {e:?} is plaintext but TLS is configured: use https://"
                ));
            }
        }
        Ok(())
    }
}

/// Never prints the password.
impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("dial_timeout", &self.dial_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("default_ttl", &self.default_ttl)
            .field("sessions", &self.sessions)
            .finish()
    }
}

/// The port of a URL's host that names none: etcd's client port.
const DEFAULT_PORT: u16 = 2379;

/// TLS material, all PEM-encoded.
///
/// Built with [`TlsConfig::with_ca`] (or `default()`) and its setters; it may
/// gain fields, so it is never written as a struct literal.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct TlsConfig {
    /// The CA certificate(s) that signed the servers' certificates. Without one
    /// the server certificate is checked against nothing and the handshake fails.
    pub ca_pem: Option<Vec<u8>>,
    /// The client certificate for etcd's `--client-cert-auth`.
    pub client_cert_pem: Option<Vec<u8>>,
    /// The client certificate's private key.
    pub client_key_pem: Option<Vec<u8>>,
    /// The name to check the server certificate against, when it differs from
    /// the endpoint's host.
    pub domain: Option<String>,
}

impl TlsConfig {
    /// Trust `ca_pem` for the servers' certificates.
    pub fn with_ca(ca_pem: impl Into<Vec<u8>>) -> Self {
        TlsConfig {
            ca_pem: Some(ca_pem.into()),
            ..TlsConfig::default()
        }
    }

    /// Present a client certificate and its key.
    pub fn client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_cert_pem = Some(cert_pem.into());
        self.client_key_pem = Some(key_pem.into());
        self
    }

    /// Check the server certificate against `domain`.
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }
}

/// Never prints key material.
impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_pem", &self.ca_pem.as_ref().map(|c| c.len()))
            .field(
                "client_cert_pem",
                &self.client_cert_pem.as_ref().map(|c| c.len()),
            )
            .field("client_key_pem", &self.client_key_pem.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> EtcdConfig {
        match EtcdConfig::from_url(url) {
            Ok(c) => c,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    fn refused(url: &str) -> String {
        match EtcdConfig::from_url(url) {
            Err(Error::Backend(e)) => e.to_string(),
            other => panic!("{url}: not refused: {other:?}"),
        }
    }

    #[test]
    fn urls_give_endpoints_prefix_and_sessions() {
        let c = parse("etcd://a:2379,b:2379/jobs");
        assert_eq!(c.endpoints, ["http://a:2379", "http://b:2379"]);
        assert_eq!(c.key_prefix, "jobs/");
        assert!(c.sessions, "on by default");
        assert!(parse("etcd://a:2379/jobs?sessions=true").sessions);
        assert!(!parse("etcd://a:2379/jobs?sessions=false").sessions);
        let c = parse("etcds://a:2379");
        assert_eq!(c.endpoints, ["https://a:2379"]);
        assert_eq!(c.key_prefix, "lease/");
        assert_eq!(parse("etcd://a/x/y/").key_prefix, "x/y/");
    }

    /// A host without a port gets the usual one, as `etcdctl` does.
    #[test]
    fn hosts_without_a_port_get_the_usual_one() {
        assert_eq!(parse("etcd://h/ops").endpoints, ["http://h:2379"]);
        assert_eq!(
            parse("etcds://a,b:2380,[::1]/ops").endpoints,
            ["https://a:2379", "https://b:2380", "https://[::1]:2379"]
        );
    }

    #[test]
    fn bad_urls_say_why() {
        for (url, why) in [
            ("etcd://", "no host"),
            ("etcd://h:notaport/x", "bad port in \"h:notaport\""),
            ("etcd://a,,b", "empty host"),
            ("etcd://u:p@h", "credentials in the URL"),
            (
                "etcd://h?bogus=1",
                "unknown option \"bogus\" (allowed: sessions)",
            ),
            (
                "etcd://h?sessions=yes",
                "use sessions=true or sessions=false",
            ),
            ("nats://h", "not an etcd URL"),
            ("h:2379", "expected etcd://"),
        ] {
            let e = refused(url);
            assert!(e.contains(why), "{url}: {e}");
        }
    }
}
