//! With two rustls crypto providers compiled in (ring from async-nats or
//! testcontainers, aws-lc-rs from object_store's S3 client), rustls cannot
//! pick a process default and code asking for it panics. lease-s3 leaves
//! that choice to the application: building the S3 client and sending a
//! request over TLS must neither panic nor install a process-wide provider.
//!
//! A test binary of its own, not a module of `integration`: it starts from a
//! process with no crypto provider installed, which only a fresh process can
//! show.

use std::panic;

use lease_s3::object_store::path::Path;
use lease_s3::object_store::ObjectStoreExt;

#[test]
fn the_s3_client_does_tls_without_installing_a_crypto_provider() {
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
        .build()
        .expect("the S3 client builds its TLS configuration without a process default");
    // A request over TLS gets as far as the network (nothing listens on port
    // 1): an error, not a panic in the client's TLS setup.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let got = rt.block_on(store.head(&Path::from("leases/k")));
    assert!(got.is_err(), "nothing listens on port 1: {got:?}");

    // The process's choice is still the application's to make.
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "lease-s3 installed a process-wide crypto provider"
    );
    // Plain HTTP works the same.
    assert!(lease_s3::S3Config::new("bucket")
        .endpoint("http://127.0.0.1:1")
        .build()
        .is_ok());
}
