//! TLS with client-certificate authentication, on an etcd started with
//! certificates generated here (rcgen): the right client certificate works,
//! a missing or foreign one gets a clear error.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use lease_core::{AcquireRequest, Error, HolderId, LeaseBackend, LeaseKey, Renewal};
use lease_etcd::{EtcdBackend, EtcdConfig, TlsConfig};
use lease_testkit::servers::pki::Pki;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_auth() {
    let pki = Pki::new("lease-etcd").unwrap();
    let server = pki.leaf("etcd-server", true).unwrap();
    let client = pki.leaf("lease-client", false).unwrap();
    let stranger_pki = Pki::new("stranger").unwrap();
    let stranger = stranger_pki.leaf("stranger-client", false).unwrap();

    let dir = std::env::temp_dir().join(format!("lease-etcd-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Removed however the test ends.
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(dir.clone());
    let tls_files = common::ServerTls {
        cert: write(&dir, "server.pem", &server.cert_pem),
        key: write(&dir, "server-key.pem", &server.key_pem),
        ca: write(&dir, "ca.pem", pki.ca_pem()),
    };
    let members = common::start_cluster(1, Some(&tls_files)).expect("start etcd with TLS");
    let url = members[0].client_url.clone();
    assert!(url.starts_with("https://"));
    let good = TlsConfig::with_ca(pki.ca_pem().to_owned())
        .client_identity(client.cert_pem.clone(), client.key_pem.clone());
    if let Err(e) = common::wait_ready(
        std::slice::from_ref(&url),
        Some(good.clone()),
        Duration::from_secs(30),
    )
    .await
    {
        panic!("{e}\n{}", members[0].log_tail());
    }

    // The right certificate: the whole cycle works over TLS.
    let prefix = common::unique_prefix("tls");
    let backend =
        EtcdBackend::connect(EtcdConfig::new([url.clone()]).key_prefix(&prefix).tls(good))
            .await
            .expect("connect with the right client certificate");
    let key = LeaseKey::new("tls/leader").unwrap();
    let g = backend
        .try_acquire(
            AcquireRequest::new(key.clone(), HolderId::random()).ttl(Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .granted()
        .expect("free key");
    assert!(matches!(
        backend.renew(&g, None).await.unwrap(),
        Renewal::Renewed(_)
    ));
    backend.release(&g).await.unwrap();
    assert!(backend.read(&key).await.unwrap().is_free());

    // Each wrong setup fails at connect, promptly, with an error that says
    // what is wrong rather than a bare timeout.
    let quick = |c: EtcdConfig| c.dial_timeout(Duration::from_secs(3)).key_prefix(&prefix);
    let cases: Vec<(&str, EtcdConfig, &[&str])> = vec![
        (
            "no client certificate",
            quick(EtcdConfig::new([url.clone()]).tls(TlsConfig::with_ca(pki.ca_pem().to_owned()))),
            &["requires a client certificate"],
        ),
        (
            "a client certificate of another CA",
            quick(
                EtcdConfig::new([url.clone()]).tls(
                    TlsConfig::with_ca(pki.ca_pem().to_owned())
                        .client_identity(stranger.cert_pem.clone(), stranger.key_pem.clone()),
                ),
            ),
            &["certificate", "tls", "handshake", "transport", "connection"],
        ),
        (
            "a server certificate we do not trust",
            quick(
                EtcdConfig::new([url.clone()]).tls(
                    TlsConfig::with_ca(stranger_pki.ca_pem().to_owned())
                        .client_identity(client.cert_pem.clone(), client.key_pem.clone()),
                ),
            ),
            &["invalid peer certificate: unknownissuer"],
        ),
        (
            "plaintext to a TLS port",
            quick(EtcdConfig::new([url.replace("https://", "http://")])),
            &["use an https:// endpoint"],
        ),
    ];
    for (what, config, words) in cases {
        let t = Instant::now();
        match EtcdBackend::connect(config).await {
            Ok(_) => panic!("{what}: connected"),
            Err(e) => {
                let text = full_text(&e).to_lowercase();
                eprintln!("{what}: {:?}: {text}", t.elapsed());
                assert!(
                    matches!(e, Error::Unavailable { .. } | Error::Backend(_)),
                    "{what}: {e:?}"
                );
                assert!(
                    words.iter().any(|w| text.contains(&w.to_lowercase())),
                    "{what}: the error does not say what is wrong: {text}"
                );
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "{what}: took {:?}",
                    t.elapsed()
                );
            }
        }
    }
}

/// An error with its whole source chain.
fn full_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        text.push_str(": ");
        text.push_str(&s.to_string());
        cur = s.source();
    }
    text
}
