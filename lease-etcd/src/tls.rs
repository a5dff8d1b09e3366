//! Turning [`TlsConfig`] into etcd-client's TLS options without panicking.

#[cfg(feature = "tls")]
use etcd_client::{Certificate, Identity, TlsOptions};
use lease_core::Error;

use crate::TlsConfig;

/// Without the `tls` feature there is no TLS to configure.
#[cfg(not(feature = "tls"))]
pub(crate) fn refuse(_tls: &TlsConfig) -> Error {
    invalid("this build of lease-etcd has no TLS support: enable its `tls` feature")
}

/// rustls refuses to pick a crypto provider on its own when the process links
/// more than one (ring through etcd-client, aws-lc-rs through other crates of
/// the same binary), and any TLS use then panics. Installing ring as the
/// process default when none is installed avoids that; if someone else
/// installed one first (or wins a race with us), theirs is kept.
#[cfg(feature = "tls")]
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // An Err means another provider was installed meanwhile: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// etcd-client's TLS options for `tls`, after checking the material pairs up.
#[cfg(feature = "tls")]
pub(crate) fn options(tls: &TlsConfig) -> Result<TlsOptions, Error> {
    ensure_crypto_provider();
    let mut opts = TlsOptions::new();
    if let Some(ca) = &tls.ca_pem {
        if !looks_like_pem(ca) {
            return Err(invalid("the CA certificate is not PEM"));
        }
        opts = opts.ca_certificate(Certificate::from_pem(ca));
    }
    match (&tls.client_cert_pem, &tls.client_key_pem) {
        (Some(cert), Some(key)) => {
            if !looks_like_pem(cert) || !looks_like_pem(key) {
                return Err(invalid("the client certificate or key is not PEM"));
            }
            opts = opts.identity(Identity::from_pem(cert, key));
        }
        (None, None) => {}
        _ => {
            return Err(invalid(
                "a client certificate needs its key and a key needs its certificate",
            ))
        }
    }
    if let Some(domain) = &tls.domain {
        opts = opts.domain_name(domain.clone());
    }
    Ok(opts)
}

#[cfg(feature = "tls")]
/// tonic only parses PEM when the first connection is made, where a mistake
/// looks like a network failure; catch the obvious one here.
fn looks_like_pem(bytes: &[u8]) -> bool {
    bytes
        .windows(b"-----BEGIN ".len())
        .any(|w| w == b"-----BEGIN ")
}

fn invalid(reason: &str) -> Error {
    Error::Backend(format!("invalid etcd TLS configuration: {reason}").into())
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    #[test]
    fn configuring_tls_installs_a_process_crypto_provider() {
        let pem = b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n".to_vec();
        assert!(options(&TlsConfig::with_ca(pem)).is_ok());
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        // A second call with a provider already installed keeps it, quietly.
        ensure_crypto_provider();
    }

    #[test]
    fn half_an_identity_is_refused() {
        let cfg = TlsConfig {
            client_key_pem: Some(b"-----BEGIN PRIVATE KEY-----".to_vec()),
            ..TlsConfig::default()
        };
        let err = options(&cfg)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("needs its certificate"), "{err}");
    }
}
