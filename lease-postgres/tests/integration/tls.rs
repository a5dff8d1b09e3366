//! TLS through rustls: the server's certificate checked against the CA
//! given, and no process-wide crypto provider installed.

use lease_core::{Acquire, HolderId, LeaseBackend, LeaseKey};
use lease_postgres::{PostgresBackend, PostgresConfig, TlsConfig};
use lease_testkit::servers::{self, pki::Pki};

use crate::common::unique;

#[tokio::test]
async fn leases_over_tls_with_the_servers_ca_and_not_with_another() {
    let pki = Pki::new("postgres").expect("CA");
    let leaf = pki.leaf("localhost", true).expect("server certificate");
    let pg = servers::spawn_postgres_tls(&leaf.cert_pem, &leaf.key_pem)
        .unwrap_or_else(|e| panic!("{e}"));
    let config = PostgresConfig::new(unique("leases")).tls(TlsConfig::new(pki.ca_pem()));
    let b = PostgresBackend::connect(&pg.url, config.clone())
        .await
        .expect("TLS with the server's CA");
    let key = LeaseKey::new("tls/k").unwrap();
    assert!(matches!(
        b.try_acquire(b.request(key, HolderId::random())).await,
        Ok(Acquire::Granted(_))
    ));
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "no process-wide provider is installed"
    );

    let other = Pki::new("other").expect("CA");
    let e = PostgresBackend::connect(&pg.url, config.tls(TlsConfig::new(other.ca_pem())))
        .await
        .expect_err("a certificate from another CA is refused");
    assert!(e.is_unknown_outcome(), "{e}");

    let e = PostgresBackend::connect_lazy(
        &pg.url,
        PostgresConfig::new(unique("leases")).tls(TlsConfig::new("not PEM")),
    )
    .expect_err("no CA in the PEM");
    assert!(e.to_string().contains("TLS"), "{e}");
}
