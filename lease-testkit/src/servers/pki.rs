//! Certificates for TLS test servers: a throw-away CA and the server and
//! client certificates it signs (rcgen), so TLS and client-certificate
//! authentication are tested on the real servers without files checked in.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate authority made for one test.
pub struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate the CA signed, and its private key, PEM.
pub struct Leaf {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

fn failed(what: &str, e: rcgen::Error) -> String {
    format!("cannot make the test {what}: {e}")
}

impl Pki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Result<Pki, String> {
        let key = KeyPair::generate().map_err(|e| failed("CA key", e))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| failed("CA", e))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = params.self_signed(&key).map_err(|e| failed("CA", e))?;
        Ok(Pki {
            ca_pem: ca.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM: what clients and servers trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A certificate for `localhost` (and, for a `server`, 127.0.0.1) with
    /// common name `cn`, good for server and client authentication.
    pub fn leaf(&self, cn: &str, server: bool) -> Result<Leaf, String> {
        let key = KeyPair::generate().map_err(|e| failed("key", e))?;
        let mut params = CertificateParams::new(vec!["localhost".to_string()])
            .map_err(|e| failed("certificate", e))?;
        params.distinguished_name.push(DnType::CommonName, cn);
        if server {
            params
                .subject_alt_names
                .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        }
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| failed("certificate", e))?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}
