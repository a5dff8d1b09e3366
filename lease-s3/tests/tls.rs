//! With two rustls crypto providers compiled in (ring from async-nats or
//! testcontainers, aws-lc-rs from object_store's S3 client), rustls cannot
//! pick a process default and code asking for it panics. Building the S3
//! client must install one first, and never panic itself.
//!
//! A test binary of its own, not a module of `integration`: it starts from a
//! process with no crypto provider installed, which any S3 client built by
//! another test in the same process would have installed already.

use std::panic;

#[test]
fn building_the_s3_client_installs_a_crypto_provider() {
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "this test needs a process with no provider installed yet"
    );
    // The hazard is real in this process: rustls's default builder panics.
    let before = panic::catch_unwind(|| {
        let _ = rustls::ClientConfig::builder();
    });
    assert!(
        before.is_err(),
        "expected rustls to panic without a default provider while ring and aws-lc-rs are both compiled in"
    );

    let store = lease_s3::S3Config::new("bucket")
        .endpoint("https://127.0.0.1:1")
        .credentials("key", "secret")
        .build();
    assert!(store.is_ok(), "{:?}", store.err());
    assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    let after = panic::catch_unwind(|| {
        let _ = rustls::ClientConfig::builder();
    });
    assert!(after.is_ok(), "a default provider is installed now");

    // Idempotent: a second client, and an explicit call, change nothing.
    lease_s3::install_crypto_provider();
    assert!(lease_s3::S3Config::new("bucket")
        .endpoint("http://127.0.0.1:1")
        .build()
        .is_ok());
}
