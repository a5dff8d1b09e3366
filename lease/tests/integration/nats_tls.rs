//! `lease::Connect` with TLS to a real nats-server that verifies client
//! certificates and wants a token: the PEM given as bytes, as files, and
//! mixed.
#![cfg(feature = "nats")]

use std::path::PathBuf;
use std::time::Duration;

use lease::{Connect, ConnectError, LeaseKey};
use lease_testkit::servers::pki::Pki;
use lease_testkit::servers::{or_skip, NatsNode, TempDir};

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

/// The provisioned nats-server with TLS, client-certificate verification
/// and a token, and its directory; `None` when it is missing and NATS may
/// be skipped.
fn tls_nats(pki: &Pki) -> Option<(NatsNode, TempDir)> {
    let dir = TempDir::new("facade-nats-tls").expect("a test directory");
    let server = pki.leaf("nats-server", true).expect("certificate");
    let cert = write(&dir, "server.pem", &server.cert_pem);
    let key = write(&dir, "server-key.pem", &server.key_pem);
    let ca = write(&dir, "ca.pem", pki.ca_pem());
    let tls = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\nauthorization {{ token: \"t0ken\" }}",
        cert.display(),
        key.display(),
        ca.display()
    );
    let node = or_skip(NatsNode::with_config(dir.path(), &tls))?;
    Some((node, dir))
}

async fn take_and_release(connect: &Connect, key: &str) -> Result<(), Box<dyn std::error::Error>> {
    let connection = connect.connect().await?;
    let key = LeaseKey::new(key)?;
    let lease = connection
        .keeper()
        .acquire(&key)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .await?;
    assert!(lease.fence().get() > 0);
    lease.release().await?;
    connection.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn natss_with_pem_bytes_files_or_both() {
    let pki = Pki::new("lease-facade-nats").expect("CA");
    let Some((server, dir)) = tls_nats(&pki) else {
        return;
    };
    let client = pki.leaf("lease-client", false).expect("certificate");
    let url = format!("natss://127.0.0.1:{}/facade_tls?create=true", server.port);
    let base = Connect::new(&url)
        .timeout(Duration::from_secs(5))
        .nats_token("t0ken");
    let bytes = base
        .clone()
        .ca_pem(pki.ca_pem())
        .client_identity(client.cert_pem.clone(), client.key_pem.clone());
    take_and_release(&bytes, "tls/bytes")
        .await
        .expect("PEM as bytes");

    let ca = write(&dir, "client-ca.pem", pki.ca_pem());
    let cert = write(&dir, "client.pem", &client.cert_pem);
    let key = write(&dir, "client-key.pem", &client.key_pem);
    let files = base.clone().ca_file(&ca).identity_files(&cert, &key);
    take_and_release(&files, "tls/files")
        .await
        .expect("PEM in files");
    let mixed = base
        .clone()
        .ca_file(&ca)
        .client_identity(client.cert_pem.clone(), client.key_pem.clone());
    take_and_release(&mixed, "tls/mixed")
        .await
        .expect("CA in a file, identity as bytes");

    // Without the client certificate the server refuses the handshake;
    // without the CA the system's roots do not know the server.
    let no_identity = base.clone().ca_pem(pki.ca_pem());
    let e = no_identity.connect().await.expect_err("refused");
    assert!(matches!(e, ConnectError::Backend(_)), "{e:?}");
    let no_ca = base
        .clone()
        .client_identity(client.cert_pem.clone(), client.key_pem.clone());
    let e = no_ca.connect().await.expect_err("refused");
    assert!(matches!(e, ConnectError::Backend(_)), "{e:?}");
    // Bad PEM is the caller's mistake, found before connecting.
    let e = base
        .clone()
        .ca_pem("not a certificate")
        .connect()
        .await
        .expect_err("refused");
    assert!(matches!(e, ConnectError::BadOptions { .. }), "{e:?}");
}
