//! NATS TLS from PEM bytes: a rustls configuration trusting what
//! async-nats would trust had it read the same PEM from files.

use std::sync::Arc;

use lease_nats::async_nats::rustls::{
    self,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    ClientConfig, RootCertStore,
};

/// Trusts the CA certificates in `ca` (only those, as async-nats with a CA
/// file), or the system's roots without one; presents `identity` (client
/// certificate chain and key) if given.
pub(crate) fn client_config(
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(pem) => {
            for cert in certificates(&pem, "CA certificate")? {
                roots
                    .add(cert)
                    .map_err(|e| format!("CA certificate: {e}"))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            if let Some(e) = native.errors.first() {
                return Err(format!("cannot load the system's trust roots: {e}"));
            }
            roots.add_parsable_certificates(native.certs);
        }
    }
    // An explicit provider: the process-wide default may be unset, or
    // ambiguous where several are compiled in.
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
    match identity {
        Some((cert, key)) => {
            let chain = certificates(&cert, "client certificate")?;
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|e| format!("client key: not a PEM private key ({e})"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate and key: {e}"))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what}: not PEM ({e})"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no certificate in the PEM"));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pem_is_named() {
        let e = client_config(Some(b"not pem".to_vec()), None).err();
        assert!(e.is_some_and(|e| e.contains("CA certificate")));
        let pki = lease_testkit::servers::pki::Pki::new("nats-tls-unit").expect("CA");
        let ca = pki.ca_pem().as_bytes().to_vec();
        assert!(client_config(Some(ca.clone()), None).is_ok());
        let leaf = pki.leaf("client", false).expect("leaf");
        let ok = client_config(
            Some(ca.clone()),
            Some((leaf.cert_pem.clone().into(), leaf.key_pem.clone().into())),
        );
        assert!(ok.is_ok(), "{:?}", ok.err());
        let e = client_config(Some(ca), Some((leaf.cert_pem.into(), b"junk".to_vec()))).err();
        assert!(e.is_some_and(|e| e.contains("client key")));
    }
}
