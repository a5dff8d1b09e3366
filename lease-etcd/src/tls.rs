//! Turning [`TlsConfig`] into etcd-client's TLS options without panicking.

use etcd_client::{Certificate, Identity, TlsOptions};
use lease_core::Error;

use crate::TlsConfig;

/// rustls refuses to pick a crypto provider on its own when the process links
/// more than one (ring through etcd-client, aws-lc-rs through other crates of
/// the same binary), and any TLS use then panics. Installing ring as the
/// process default when none is installed avoids that; if someone else
/// installed one first (or wins a race with us), theirs is kept.
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // An Err means another provider was installed meanwhile: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// etcd-client's TLS options for `tls`, after checking the material pairs up.
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
