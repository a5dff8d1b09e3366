//! How the client reaches the server: plain TCP, or rustls with the CA
//! certificates of [`TlsConfig`](crate::TlsConfig) (or the system's, for a
//! `rediss://` URL without one) when the `tls` feature is on.
//!
//! The rustls configuration is built here with an explicit crypto
//! provider: the process default when the application installed one,
//! otherwise ring for this client alone. Nothing is installed
//! process-wide, and no path asks rustls to pick a provider itself (which
//! panics in a process that links two of them).

use lease_core::Error;

use crate::config::{Address, RedisConfig};

/// How the client reaches the server: plain TCP or rustls.
#[derive(Clone)]
pub(crate) enum Tls {
    Plain,
    #[cfg(feature = "tls")]
    Rustls {
        connector: tokio_rustls::TlsConnector,
        name: rustls_pki_types::ServerName<'static>,
    },
}

#[cfg(feature = "tls")]
pub(crate) fn tls_for(config: &RedisConfig, address: &Address) -> Result<Tls, Error> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    if !address.tls && config.tls.is_none() {
        return Ok(Tls::Plain);
    }
    let bad = |what: String| Error::Backend(format!("lease-redis: TLS: {what}").into());
    let mut roots = rustls::RootCertStore::empty();
    match &config.tls {
        Some(tls) => {
            for cert in CertificateDer::pem_slice_iter(&tls.ca_pem) {
                let cert = cert.map_err(|e| bad(format!("CA PEM: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("CA certificate: {e}")))?;
            }
        }
        None => {
            // Certificates the system store holds but rustls cannot parse
            // are skipped, as every rustls client does.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    if roots.is_empty() {
        return Err(bad("no CA certificate to check the server's against".into()));
    }
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| std::sync::Arc::new(rustls::crypto::ring::default_provider()));
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from(address.host.clone())
        .map_err(|e| bad(format!("server name {:?}: {e}", address.host)))?;
    Ok(Tls::Rustls {
        connector: tokio_rustls::TlsConnector::from(std::sync::Arc::new(client)),
        name,
    })
}

#[cfg(not(feature = "tls"))]
pub(crate) fn tls_for(config: &RedisConfig, address: &Address) -> Result<Tls, Error> {
    if address.tls || config.tls.is_some() {
        return Err(Error::Backend(
            "lease-redis: TLS was asked for, but this build has no `tls` feature".into(),
        ));
    }
    Ok(Tls::Plain)
}
