//! `lease::Connect` with TLS to a real nats-server that verifies client
//! certificates and wants a token: the PEM given as bytes, as files, and
//! mixed.
#![cfg(feature = "nats")]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lease::{Connect, ConnectError, LeaseKey};
use lease_testkit::servers::pki::Pki;

/// nats-server, killed (and its directory removed) on drop.
struct Server {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

/// The provisioned nats-server with TLS, client-certificate verification
/// and a token; `None` when it is missing and NATS may be skipped.
fn tls_nats(pki: &Pki) -> Option<Server> {
    let bin = lease_testkit::servers::servers_dir()
        .join("bin")
        .join("nats-server");
    if !bin.is_file() {
        if lease_testkit::skip_allowed("nats") {
            eprintln!("SKIPPED (nats in LEASE_TEST_SKIP): no {}", bin.display());
            return None;
        }
        panic!(
            "no {} (run `cargo xtask provision`, or set LEASE_TEST_SKIP=nats)",
            bin.display()
        );
    }
    let dir = std::env::temp_dir().join(format!("lease-facade-nats-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a test directory");
    let server = pki.leaf("nats-server", true).expect("certificate");
    let cert = write(&dir, "server.pem", &server.cert_pem);
    let key = write(&dir, "server-key.pem", &server.key_pem);
    let ca = write(&dir, "ca.pem", pki.ca_pem());
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let conf = format!(
        "listen: \"127.0.0.1:{port}\"\nserver_name: lease-facade-tls\njetstream {{ store_dir: \"{}\" }}\ntls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\nauthorization {{ token: \"t0ken\" }}\n",
        dir.join("js").display(),
        cert.display(),
        key.display(),
        ca.display()
    );
    let conf = write(&dir, "nats.conf", &conf);
    let log = std::fs::File::create(dir.join("server.log")).expect("server log");
    let child = Command::new(&bin)
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start nats-server");
    let server = Server { child, dir, port };
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "nats-server did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(server)
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
    let Some(server) = tls_nats(&pki) else {
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

    let ca = write(&server.dir, "client-ca.pem", pki.ca_pem());
    let cert = write(&server.dir, "client.pem", &client.cert_pem);
    let key = write(&server.dir, "client-key.pem", &client.key_pem);
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
