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

/// etcd-client's TLS options for `tls`, after checking the material pairs up.
///
/// No process-wide rustls crypto provider is installed here: tonic builds
/// the client's TLS configuration with the process default if the
/// application installed one, and otherwise with the provider the `tls`
/// feature compiles in (ring), for this client only. So TLS to etcd works
/// whatever other providers the binary links, and the choice stays the
/// application's.
#[cfg(feature = "tls")]
pub(crate) fn options(tls: &TlsConfig) -> Result<TlsOptions, Error> {
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
    fn configuring_tls_leaves_the_process_crypto_provider_alone() {
        let pem = b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n".to_vec();
        assert!(options(&TlsConfig::with_ca(pem)).is_ok());
        // Nothing in this test binary installs one: the choice is the
        // application's, never this library's.
        assert!(rustls::crypto::CryptoProvider::get_default().is_none());
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
