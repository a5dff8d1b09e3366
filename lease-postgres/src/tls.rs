//! How the client reaches the server: plain TCP, or rustls with the CA
//! certificates of [`TlsConfig`](crate::TlsConfig) when the `tls` feature is on.

use lease_core::Error;

use crate::config::PostgresConfig;

/// How the client reaches the server: plain TCP or rustls.
#[derive(Clone)]
pub(crate) enum Tls {
    Plain,
    #[cfg(feature = "tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

#[cfg(feature = "tls")]
pub(crate) fn tls_for(
    config: &PostgresConfig,
    pg: &mut tokio_postgres::Config,
) -> Result<Tls, Error> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let Some(tls) = &config.tls else {
        return Ok(Tls::Plain);
    };
    let bad = |what: String| Error::Backend(format!("lease-postgres: TLS: {what}").into());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&tls.ca_pem) {
        let cert = cert.map_err(|e| bad(format!("CA PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad("no CA certificate in the PEM".into()));
    }
    // The process default when the application installed one, otherwise
    // ring for this client alone: nothing is installed process-wide.
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| std::sync::Arc::new(rustls::crypto::ring::default_provider()));
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    pg.ssl_mode(tokio_postgres::config::SslMode::Require);
    Ok(Tls::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(
        client,
    )))
}

#[cfg(not(feature = "tls"))]
pub(crate) fn tls_for(
    config: &PostgresConfig,
    _pg: &mut tokio_postgres::Config,
) -> Result<Tls, Error> {
    match config.tls {
        None => Ok(Tls::Plain),
        Some(_) => Err(Error::Backend(
            "lease-postgres: TLS was asked for, but this build has no `tls` feature".into(),
        )),
    }
}
