//! TLS through rustls (`rediss://`, Redis' `--tls-port`): the server's
//! certificate checked against the CA given, the watch over TLS too, and
//! no process-wide crypto provider installed.

use std::time::{Duration, Instant};

use lease_core::{Acquire, HolderId, LeaseBackend, LeaseKey};
use lease_redis::{RedisBackend, RedisConfig, TlsConfig};
use lease_testkit::servers::{pki::Pki, RedisOptions};

use crate::common::unique;

#[tokio::test]
async fn leases_over_tls_with_the_servers_ca_and_not_with_another() {
    let pki = Pki::new("redis").expect("CA");
    let leaf = pki.leaf("localhost", true).expect("server certificate");
    let server = RedisOptions::new()
        .tls(&leaf.cert_pem, &leaf.key_pem)
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        server.url.starts_with("rediss://localhost:"),
        "{}",
        server.url
    );
    let config = RedisConfig::new(format!("{}:", unique("tls"))).tls(TlsConfig::new(pki.ca_pem()));
    let b = RedisBackend::connect(&server.url, config.clone())
        .await
        .expect("TLS with the server's CA");
    let waiter = RedisBackend::connect(&server.url, config.clone())
        .await
        .unwrap();
    let key = LeaseKey::new("tls/k").unwrap();
    let Acquire::Granted(g) = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap()
    else {
        panic!("a fresh key is free");
    };
    // The subscription is over TLS too.
    let seen = waiter.read(&key).await.unwrap();
    let _ = waiter.wait_for_change(&key, &seen).await;
    let (w, k) = (waiter.clone(), key.clone());
    let wait = tokio::spawn(async move {
        w.wait_for_change(&k, &seen).await.unwrap();
        Instant::now()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    b.release(&g).await.unwrap();
    let d = wait.await.unwrap().saturating_duration_since(released);
    // Well inside the one-second bound a waiter without messages polls at;
    // the 100 ms goal itself is the plain-TCP test's (a median of five).
    assert!(
        d < Duration::from_millis(500),
        "woken {d:?} after the release"
    );
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "no process-wide provider is installed"
    );

    let other = Pki::new("other").expect("CA");
    let e = RedisBackend::connect(
        &server.url,
        config.clone().tls(TlsConfig::new(other.ca_pem())),
    )
    .await
    .expect_err("a certificate from another CA is refused");
    assert!(e.is_unknown_outcome(), "{e}");
    let chain = lease_core::ErrorChain::new(&e).to_string();
    assert!(chain.contains("certificate"), "{chain}");
    // Without a CA of its own, a rediss:// URL trusts the system's, which
    // do not vouch for the test CA.
    let e = RedisBackend::connect(&server.url, RedisConfig::new("x:"))
        .await
        .expect_err("the test CA is not the system's");
    assert!(e.is_unknown_outcome(), "{e}");
    let e = RedisBackend::connect(
        &server.url,
        RedisConfig::new("x:").tls(TlsConfig::new("not PEM")),
    )
    .await
    .expect_err("no CA in the PEM");
    assert!(e.to_string().contains("TLS"), "{e}");
}
