//! TLS and credentials through the `lease` binary, on real servers started
//! here: etcd with TLS and client-certificate authentication, etcd with user
//! and password authentication, nats-server with TLS, client certificates
//! and a token, nats-server with nkey authentication, and Redis with TLS
//! and an ACL user.
//!
//! The servers are the provisioned binaries (`cargo xtask provision`); a
//! missing one fails the test unless its backend is in `LEASE_TEST_SKIP`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lease_testkit::servers::pki::Pki;
use lease_testkit::servers::{
    or_skip, spawn_etcd_cluster, EtcdMember, NatsNode, RedisOptions, ServerTls, TempDir,
};

const LEASE: &str = env!("CARGO_BIN_EXE_lease");
const EXIT_USAGE: i32 = 2;
const EXIT_BACKEND: i32 = 69;
/// `lease status` of a free key.
const EXIT_FREE: i32 = 1;

fn fresh_dir(name: &str) -> TempDir {
    TempDir::new(&format!("cli-tls-{name}")).expect("create a test directory")
}

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

/// A one-member etcd on a private port (etcd's default raft timing); with
/// `tls` = (cert, key, ca) TLS with client-certificate authentication on
/// the client port.
fn etcd(tls: Option<(&Path, &Path, &Path)>) -> Option<EtcdMember> {
    let tls = tls.map(|(cert, key, ca)| ServerTls {
        cert: cert.into(),
        key: key.into(),
        ca: ca.into(),
    });
    let mut members = or_skip(spawn_etcd_cluster(1, tls.as_ref(), 100, 1000))?;
    members.pop()
}

/// nats-server with JetStream and the given extra configuration.
fn nats(extra: &str, dir: &TempDir) -> Option<NatsNode> {
    or_skip(NatsNode::with_config(dir.path(), extra))
}

/// `lease ARGS` with `env`, a 5 s request timeout.
fn lease(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(LEASE);
    cmd.args(args)
        .env("LEASE_TIMEOUT", "5s")
        .env_remove("LEASE_URL")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run lease")
}

fn check(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `lease run URL KEY OPTIONS -- sh -c 'echo $LEASE_FENCE'`, retried while
/// the server is still starting (a fresh etcd needs a moment to elect
/// itself).
fn run_until_ready(url: &str, key: &str, options: &[&str]) -> Output {
    let start = Instant::now();
    loop {
        let mut args = vec!["run", url, key];
        args.extend_from_slice(options);
        args.extend(["--", "sh", "-c", "echo $LEASE_FENCE"]);
        let out = lease(&args, &[]);
        if out.status.code() == Some(0) || start.elapsed() > Duration::from_secs(20) {
            return out;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_over_tls_with_a_client_certificate() {
    let pki = Pki::new("lease-cli").expect("CA");
    let dir = fresh_dir("etcd");
    let server = pki.leaf("etcd-server", true).expect("certificate");
    let client = pki.leaf("lease-client", false).expect("certificate");
    let stranger = Pki::new("stranger").expect("CA");
    let (cert, key, ca) = (
        write(&dir, "server.pem", &server.cert_pem),
        write(&dir, "server-key.pem", &server.key_pem),
        write(&dir, "ca.pem", pki.ca_pem()),
    );
    let client_cert = write(&dir, "client.pem", &client.cert_pem);
    let client_key = write(&dir, "client-key.pem", &client.key_pem);
    let wrong_ca = write(&dir, "stranger-ca.pem", stranger.ca_pem());
    let Some(etcd) = etcd(Some((&cert, &key, &ca))) else {
        return;
    };
    let url = format!("etcds://127.0.0.1:{}/cli-tls", etcd.port);
    let (ca, client_cert, client_key, wrong_ca) = (
        ca.display().to_string(),
        client_cert.display().to_string(),
        client_key.display().to_string(),
        wrong_ca.display().to_string(),
    );
    let good = [
        "--cacert",
        ca.as_str(),
        "--cert",
        client_cert.as_str(),
        "--key",
        client_key.as_str(),
    ];
    let out = run_until_ready(&url, "job", &good);
    check(&out, 0, "etcds:// with the CA and a client certificate");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .is_ok(),
        "the command printed its fence: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The same through the environment, the URL from LEASE_URL.
    let out = lease(
        &["status", "job", "--json"],
        &[
            ("LEASE_URL", url.as_str()),
            ("LEASE_CACERT", ca.as_str()),
            ("LEASE_CERT", client_cert.as_str()),
            ("LEASE_CERT_KEY", client_key.as_str()),
        ],
    );
    check(
        &out,
        EXIT_FREE,
        "status with LEASE_URL and the TLS variables",
    );

    // etcd:// with TLS options is TLS too.
    let plain_scheme = url.replacen("etcds://", "etcd://", 1);
    let mut args = vec!["status", plain_scheme.as_str(), "job"];
    args.extend_from_slice(&good);
    check(&lease(&args, &[]), EXIT_FREE, "etcd:// with --cacert");

    // Without a client certificate the server refuses the handshake.
    let out = lease(&["status", &url, "job", "--cacert", &ca], &[]);
    check(&out, EXIT_BACKEND, "no client certificate");
    // A CA that did not sign the server's certificate.
    let mut args = vec!["status", url.as_str(), "job"];
    args.extend_from_slice(&good);
    args[4] = wrong_ca.as_str();
    check(&lease(&args, &[]), EXIT_BACKEND, "the wrong CA");
    // etcds:// without a CA, or a key without its certificate: usage errors.
    let out = lease(&["status", &url, "job"], &[]);
    check(&out, EXIT_USAGE, "etcds:// without --cacert");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cacert"));
    let out = lease(
        &["status", &url, "job", "--cacert", &ca, "--key", &client_key],
        &[],
    );
    check(&out, EXIT_USAGE, "--key without --cert");
    let out = lease(
        &["status", &url, "job", "--cacert", "/nonexistent.pem"],
        &[],
    );
    check(&out, EXIT_USAGE, "a missing CA file");
    let out = lease(&["status", "job"], &[]);
    check(&out, EXIT_USAGE, "only a key, no LEASE_URL");
    assert!(String::from_utf8_lossy(&out.stderr).contains("LEASE_URL"));
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_user_and_password() {
    let Some(etcd) = etcd(None) else {
        return;
    };
    let endpoint = format!("http://127.0.0.1:{}", etcd.port);
    let start = Instant::now();
    let mut admin = loop {
        match etcd_client::Client::connect([endpoint.as_str()], None).await {
            Ok(c) => break c,
            Err(e) if start.elapsed() > Duration::from_secs(20) => panic!("etcd: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    admin
        .user_add("root", "s3cret", None)
        .await
        .expect("add root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("grant root");
    admin.auth_enable().await.expect("enable auth");

    let url = format!("etcd://127.0.0.1:{}/cli-auth", etcd.port);
    let run = |env: Vec<(&'static str, &'static str)>, opts: Vec<&'static str>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let mut args = vec!["run", url.as_str(), "job"];
            args.extend(opts);
            args.extend(["--", "true"]);
            lease(&args, &env)
        })
    };
    let out = run(vec![], vec!["--user", "root:s3cret"])
        .await
        .expect("lease");
    check(&out, 0, "--user root:s3cret");
    let out = run(
        vec![("LEASE_USER", "root"), ("LEASE_PASSWORD", "s3cret")],
        vec![],
    )
    .await
    .expect("lease");
    check(&out, 0, "LEASE_USER and LEASE_PASSWORD");
    let out = run(vec![], vec!["--user", "root:wrong"])
        .await
        .expect("lease");
    check(&out, EXIT_BACKEND, "a wrong password");
    let out = run(vec![], vec![]).await.expect("lease");
    check(&out, EXIT_BACKEND, "no credentials on an etcd with auth");
}

#[cfg(feature = "nats")]
#[test]
fn nats_over_tls_with_client_certificates_and_a_token() {
    let pki = Pki::new("lease-cli-nats").expect("CA");
    let dir = fresh_dir("nats");
    let server = pki.leaf("nats-server", true).expect("certificate");
    let client = pki.leaf("lease-client", false).expect("certificate");
    let (cert, key, ca) = (
        write(&dir, "server.pem", &server.cert_pem),
        write(&dir, "server-key.pem", &server.key_pem),
        write(&dir, "ca.pem", pki.ca_pem()),
    );
    let client_cert = write(&dir, "client.pem", &client.cert_pem);
    let client_key = write(&dir, "client-key.pem", &client.key_pem);
    let extra = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\nauthorization {{ token: \"t0ken\" }}",
        cert.display(),
        key.display(),
        ca.display()
    );
    let Some(nats) = nats(&extra, &dir) else {
        return;
    };
    let url = format!("natss://127.0.0.1:{}/cli_tls?create=true", nats.port);
    let (ca, client_cert, client_key) = (
        ca.display().to_string(),
        client_cert.display().to_string(),
        client_key.display().to_string(),
    );
    let good = [
        "--cacert",
        ca.as_str(),
        "--cert",
        client_cert.as_str(),
        "--key",
        client_key.as_str(),
        "--token",
        "t0ken",
    ];
    let out = run_until_ready(&url, "job", &good);
    check(
        &out,
        0,
        "natss:// with the CA, a client certificate and the token",
    );

    let out = lease(
        &["status", &url, "job", "--json"],
        &[
            ("LEASE_CACERT", ca.as_str()),
            ("LEASE_CERT", client_cert.as_str()),
            ("LEASE_CERT_KEY", client_key.as_str()),
            ("LEASE_NATS_TOKEN", "t0ken"),
        ],
    );
    check(&out, EXIT_FREE, "status with the variables");

    let mut args = vec!["status", url.as_str(), "job"];
    args.extend_from_slice(&good[..6]);
    check(&lease(&args, &[]), EXIT_BACKEND, "no token");
    let mut args = vec!["status", url.as_str(), "job"];
    args.extend_from_slice(&good[..6]);
    args.extend(["--token", "wrong"]);
    check(&lease(&args, &[]), EXIT_BACKEND, "a wrong token");
    let out = lease(&["status", &url, "job", "--token", "t0ken"], &[]);
    check(
        &out,
        EXIT_BACKEND,
        "the system's roots do not know the test CA",
    );
    let out = lease(
        &["status", &url, "job", "--token", "t0ken", "--user", "u:p"],
        &[],
    );
    check(&out, EXIT_USAGE, "two ways to authenticate");
}

#[cfg(all(feature = "nats", feature = "mongo"))]
#[test]
fn nats_with_an_nkey() {
    let user = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user();
    let dir = fresh_dir("nats-nkey");
    let seed = write(&dir, "user.nk", &user.seed().expect("seed"));
    let wrong = write(&dir, "stranger.nk", &stranger.seed().expect("seed"));
    let extra = format!(
        "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}",
        user.public_key()
    );
    let Some(nats) = nats(&extra, &dir) else {
        return;
    };
    let url = format!("nats://127.0.0.1:{}/cli_nkey?create=true", nats.port);
    let seed = seed.display().to_string();
    let out = run_until_ready(&url, "job", &["--nkey", &seed]);
    check(&out, 0, "--nkey with the user's seed");
    let out = lease(
        &[
            "status",
            &url,
            "job",
            "--nkey",
            &wrong.display().to_string(),
        ],
        &[],
    );
    check(&out, EXIT_BACKEND, "another user's seed");
    let not_a_seed = write(&dir, "bad.nk", "hello\n");
    let out = lease(
        &[
            "status",
            &url,
            "job",
            "--nkey",
            &not_a_seed.display().to_string(),
        ],
        &[],
    );
    check(&out, EXIT_USAGE, "a file without a seed");
    let out = lease(&["status", &url, "job", "--cacert", "/nonexistent"], &[]);
    check(&out, EXIT_USAGE, "a missing CA file");
    let mongo = lease(
        &["status", "mongodb://127.0.0.1:1/db", "job", "--token", "t"],
        &[],
    );
    check(&mongo, EXIT_USAGE, "NATS options on a MongoDB URL");
    assert!(String::from_utf8_lossy(&mongo.stderr).contains("MongoDB takes them in its URL"));
}

/// `rediss://` with an ACL user in the URL and `--cacert`: the CA (here or
/// in `LEASE_CACERT`) is what lets the client trust the server; a wrong
/// password is a backend error; `--user` and `--cert` are refused, naming
/// where Redis takes credentials.
#[cfg(feature = "redis")]
#[test]
fn redis_over_tls_with_an_acl_user() {
    let pki = Pki::new("lease-cli-redis").expect("CA");
    let dir = fresh_dir("redis");
    let server = pki.leaf("redis-server", true).expect("certificate");
    let ca = write(&dir, "ca.pem", pki.ca_pem());
    let Some(redis) = or_skip(
        RedisOptions::new()
            .tls(&server.cert_pem, &server.key_pem)
            .acl_user("app", "s3cret")
            .spawn(),
    ) else {
        return;
    };
    let url = format!("{}/0?prefix=cli-tls:", redis.url);
    assert!(url.starts_with("rediss://app:s3cret@"), "{url}");
    let ca = ca.display().to_string();
    let out = run_until_ready(&url, "job", &["--cacert", ca.as_str()]);
    check(&out, 0, "rediss:// with the CA and the ACL user");
    let out = lease(
        &["status", &url, "job", "--json"],
        &[("LEASE_CACERT", ca.as_str())],
    );
    check(&out, EXIT_FREE, "status with LEASE_CACERT");
    let out = lease(&["status", &url, "job"], &[]);
    check(
        &out,
        EXIT_BACKEND,
        "the system's roots do not know the test CA",
    );
    let wrong = url.replacen("s3cret", "wrong", 1);
    let out = lease(&["status", &wrong, "job", "--cacert", ca.as_str()], &[]);
    check(&out, EXIT_BACKEND, "a wrong password");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("wrong@"), "the password is shown: {err}");
    for (extra, said) in [
        (&["--user", "app:s3cret"][..], "in its URL"),
        (
            &["--cert", ca.as_str(), "--key", ca.as_str()][..],
            "no client certificate",
        ),
    ] {
        let mut args = vec!["status", url.as_str(), "job", "--cacert", ca.as_str()];
        args.extend_from_slice(extra);
        let out = lease(&args, &[]);
        check(&out, EXIT_USAGE, extra[0]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(said), "{}: {err}", extra[0]);
    }
}
