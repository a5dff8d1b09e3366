//! Tests of the launchers. Native servers are exercised when provisioned
//! (`cargo xtask provision`); otherwise those tests say so and return.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::process::{http, tcp_open};
use super::*;

fn fake_env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned().filter(|v| !v.trim().is_empty())
}

fn addr_of(url: &str) -> SocketAddr {
    let hostport = url
        .split("://")
        .nth(1)
        .unwrap()
        .split(['/', '?'])
        .next()
        .unwrap();
    hostport.parse().unwrap()
}

/// Whether the native server is there. Missing, it fails the test — as a
/// backend's conformance tests do — unless `LEASE_TEST_SKIP` names the
/// backend (or `all`); then it is skipped, loudly.
fn provisioned(what: &str, found: bool) -> bool {
    if found {
        return true;
    }
    let backend = match what {
        "nats-server" => "nats",
        "moto" => "s3",
        "secantusd-py" => "mongo",
        other => other,
    };
    assert!(
        lease_conformance::skip_allowed(backend),
        "no native {what} provisioned: run `cargo xtask provision`, or set {}={backend} to skip",
        crate::SKIP_ENV
    );
    eprintln!(
        "SKIPPED: no native {what} provisioned ({}={backend})",
        crate::SKIP_ENV
    );
    false
}

// ------------------------------------------------------------------ env

#[test]
fn env_endpoints_are_used_when_set() {
    let env = fake_env(&[
        (
            "LEASE_TEST_ETCD_ENDPOINTS",
            " http://10.0.0.1:2379, http://10.0.0.2:2379 ,",
        ),
        ("LEASE_TEST_NATS_URL", "nats://10.0.0.3:4222"),
        ("LEASE_TEST_S3_ENDPOINT", "http://10.0.0.4:9000/"),
        ("LEASE_TEST_S3_BUCKET", "b"),
        ("AWS_ACCESS_KEY_ID", "ak"),
        ("AWS_SECRET_ACCESS_KEY", "sk"),
        ("LEASE_TEST_MONGODB_URI", "mongodb://10.0.0.5:27017"),
    ]);

    let mut e = etcd::resolve(&env).unwrap();
    assert_eq!(e.source, Source::Env("LEASE_TEST_ETCD_ENDPOINTS"));
    assert_eq!(
        e.endpoints,
        vec!["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
    );
    assert_eq!(e.pid(), None);
    let err = e.kill().unwrap_err();
    assert_eq!(err.backend, "etcd");
    assert!(err.reason.contains("not managed"), "{err}");

    let n = nats::resolve(&env).unwrap();
    assert_eq!(n.source, Source::Env("LEASE_TEST_NATS_URL"));
    assert_eq!(n.url, "nats://10.0.0.3:4222");
    assert!(n.pause().is_err());

    let s = s3::resolve(&env).unwrap();
    assert_eq!(s.source, Source::Env("LEASE_TEST_S3_ENDPOINT"));
    assert_eq!(s.endpoint, "http://10.0.0.4:9000");
    assert_eq!(
        (
            s.bucket.as_str(),
            s.region.as_str(),
            s.access_key.as_str(),
            s.secret_key.as_str()
        ),
        ("b", "us-east-1", "ak", "sk")
    );

    let m = mongo::resolve(&env).unwrap();
    assert_eq!(m.source, Source::Env("LEASE_TEST_MONGODB_URI"));
    assert_eq!(m.uri, "mongodb://10.0.0.5:27017");
}

#[test]
fn empty_env_values_count_as_unset() {
    let env = fake_env(&[
        ("LEASE_TEST_ETCD_ENDPOINTS", " , "),
        ("LEASE_TEST_NATS_URL", "  "),
    ]);
    assert!(etcd::from_env(&env).is_none());
    assert!(nats::from_env(&env).is_none());
    assert!(s3::from_env(&env).is_none());
    assert!(mongo::from_env(&env).is_none());
}

#[test]
fn unavailable_reason_says_how_to_provision() {
    let u = not_found(
        "etcd",
        "LEASE_TEST_ETCD_ENDPOINTS",
        "etcd binary",
        "etcd",
        "the fallback said why",
    );
    let text = u.to_string();
    assert!(text.starts_with("etcd test server unavailable: "), "{text}");
    assert!(text.contains("LEASE_TEST_ETCD_ENDPOINTS"), "{text}");
    assert!(
        text.contains("cargo xtask provision --backend etcd"),
        "{text}"
    );
}

// ------------------------------------------------------------ containers

/// The etcd request the container fallback makes, for direct tests.
fn etcd_request() -> container::Request {
    container::Request {
        backend: "etcd",
        image: "quay.io/coreos/etcd",
        tag: "v3.5.21",
        ports: &[2379],
        cmd: vec!["/usr/local/bin/etcd".to_string()],
        env: Vec::new(),
    }
}

#[cfg(not(feature = "containers"))]
#[test]
fn container_fallback_disabled_says_how_to_enable() {
    let err = match from_container(
        etcd_request(),
        &|_| true,
        "LEASE_TEST_ETCD_ENDPOINTS",
        "etcd binary",
        "etcd",
    ) {
        Ok(_) => panic!("the fallback is compiled out, yet it gave a server"),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(text.starts_with("etcd test server unavailable: "), "{text}");
    assert!(
        text.contains("the container fallback is disabled"),
        "{text}"
    );
    assert!(
        text.contains("--features lease-testkit/containers"),
        "{text}"
    );
    assert!(text.contains("quay.io/coreos/etcd:v3.5.21"), "{text}");
    assert!(
        text.contains("cargo xtask provision --backend etcd"),
        "{text}"
    );
}

/// Whether testcontainers will find a Docker engine to talk to: a
/// `DOCKER_HOST`, or the default socket.
#[cfg(feature = "containers")]
fn docker_configured() -> bool {
    process_env("DOCKER_HOST").is_some() || std::path::Path::new("/var/run/docker.sock").exists()
}

/// With the feature on, on a machine without Docker, the shared etcd is
/// `Unavailable` with a reason saying no Docker engine answered; where
/// Docker answers, it comes from the container and answers. Needs no
/// endpoint and no native etcd: run it with `LEASE_SERVERS_DIR` pointing at
/// an empty directory.
#[cfg(feature = "containers")]
#[test]
fn container_fallback_shared_etcd_without_native() {
    if process_env("LEASE_TEST_ETCD_ENDPOINTS").is_some()
        || find_native("bin/etcd", "etcd").is_some()
    {
        eprintln!(
            "SKIPPED: an etcd endpoint or native binary exists, so the container fallback is \
             not reached; run with LEASE_SERVERS_DIR=<empty dir>, no etcd on PATH and \
             LEASE_TEST_ETCD_ENDPOINTS unset"
        );
        return;
    }
    let started = std::time::Instant::now();
    let result = etcd();
    eprintln!("etcd() answered in {:?}", started.elapsed());
    if docker_configured() {
        let e = result.unwrap_or_else(|u| panic!("Docker is configured, yet: {u}"));
        assert_eq!(
            e.source,
            Source::Container("quay.io/coreos/etcd:v3.5.21".into())
        );
        let addr =
            container::addr("localhost", addr_of(&e.endpoints[0]).port()).expect("a mapped port");
        assert_eq!(http(addr, "GET", "/health", b"").unwrap().0, 200);
    } else {
        let err = result.expect_err("no Docker here, yet etcd() gave a server");
        let text = err.to_string();
        eprintln!("{text}");
        assert_eq!(err.backend, "etcd");
        assert!(
            text.contains(
                "the container fallback (quay.io/coreos/etcd:v3.5.21) failed: \
                 no Docker engine answered"
            ),
            "{text}"
        );
        assert!(text.contains("LEASE_TEST_ETCD_ENDPOINTS"), "{text}");
        assert!(
            text.contains("cargo xtask provision --backend etcd"),
            "{text}"
        );
        // Asked again: the same answer, not a second attempt.
        assert_eq!(etcd().unwrap_err(), err);
    }
}

/// The fallback itself, for each backend's request shape: without Docker
/// every one fails with the reason, and none panics.
#[cfg(feature = "containers")]
#[test]
fn container_fallback_without_docker_fails_cleanly() {
    if docker_configured() {
        eprintln!(
            "SKIPPED: Docker is configured here; see container_fallback_shared_etcd_without_native"
        );
        return;
    }
    let err = match container::start(etcd_request(), &|_| true) {
        Ok(_) => panic!("no Docker here, yet a container started"),
        Err(e) => e,
    };
    assert!(
        err.reason.starts_with(
            "the container fallback (quay.io/coreos/etcd:v3.5.21) failed: no Docker engine answered at "
        ),
        "{}",
        err.reason
    );
}

// ---------------------------------------------------------------- sigv4

#[test]
fn sha256_and_hmac_match_published_vectors() {
    use super::sigv4::{hex, hmac, sha256, signing_key};
    assert_eq!(
        hex(&sha256(b"")),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        hex(&sha256(b"abc")),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        hex(&sha256(&[b'a'; 1000])),
        "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
    );
    // RFC 4231 test case 2.
    assert_eq!(
        hex(&hmac(b"Jefe", b"what do ya want for nothing?")),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    // AWS's documented signing-key example.
    assert_eq!(
        hex(&signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20120215",
            "us-east-1",
            "iam"
        )),
        "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
    );
}

#[test]
fn sigv4_create_bucket_matches_botocore() {
    use super::sigv4::{amz_date, Signer};
    assert_eq!(amz_date(951_868_799), "20000229T235959Z");
    assert_eq!(amz_date(1_796_034_951), "20261130T103551Z");
    // Computed with botocore's S3SigV4Auth for the same request and time.
    let signer = Signer {
        access_key: "lease-test",
        secret_key: "lease-test-secret",
        region: "us-east-1",
    };
    let headers = signer.headers_at("PUT", "127.0.0.1:9000", "/lease-test", 1_796_034_951);
    let auth = &headers
        .iter()
        .find(|(k, _)| *k == "Authorization")
        .unwrap()
        .1;
    assert_eq!(
        auth,
        "AWS4-HMAC-SHA256 Credential=lease-test/20261130/us-east-1/s3/aws4_request, \
         SignedHeaders=host;x-amz-content-sha256;x-amz-date, \
         Signature=fd7cbbd85439c629fc897911b454f7f271023e61e68020b470ebddb29341e03b"
    );
}

// ----------------------------------------------------------------- etcd

fn etcd_put(addr: SocketAddr, key_b64: &str, value_b64: &str) -> u16 {
    let body = format!(r#"{{"key":"{key_b64}","value":"{value_b64}"}}"#);
    http(addr, "POST", "/v3/kv/put", body.as_bytes())
        .map(|r| r.0)
        .unwrap_or(0)
}

fn etcd_get(addr: SocketAddr, key_b64: &str) -> String {
    let body = format!(r#"{{"key":"{key_b64}"}}"#);
    http(addr, "POST", "/v3/kv/range", body.as_bytes())
        .map(|r| r.1)
        .unwrap_or_default()
}

#[test]
fn shared_etcd_answers() {
    if process_env("LEASE_TEST_ETCD_ENDPOINTS").is_none()
        && !provisioned("etcd", find_native("bin/etcd", "etcd").is_some())
    {
        return;
    }
    let e = etcd().unwrap_or_else(|u| panic!("{u}"));
    let again = etcd().unwrap();
    assert!(std::ptr::eq(e, again), "one shared server per process");
    let addr = addr_of(&e.endpoints[0]);
    let (status, body) = http(addr, "GET", "/health", b"").unwrap();
    assert_eq!(status, 200, "{body}");
    // "lease" / "ok" in base64.
    assert_eq!(etcd_put(addr, "bGVhc2U=", "b2s="), 200);
    assert!(etcd_get(addr, "bGVhc2U=").contains("b2s="));
}

#[test]
fn private_etcd_kill_restart_pause_resume() {
    if !provisioned("etcd", find_native("bin/etcd", "etcd").is_some()) {
        return;
    }
    let mut e = spawn_etcd(None).unwrap_or_else(|u| panic!("{u}"));
    assert!(matches!(e.source, Source::Native(_)));
    let addr = addr_of(&e.endpoints[0]);
    assert_eq!(etcd_put(addr, "a2V5", "djE="), 200);
    let pid = e.pid().unwrap();

    e.pause().unwrap();
    assert!(
        http(addr, "GET", "/health", b"").is_err(),
        "a paused etcd answered"
    );
    e.resume().unwrap();
    assert_eq!(http(addr, "GET", "/health", b"").unwrap().0, 200);

    e.kill().unwrap();
    assert_eq!(e.pid(), None);
    assert!(!tcp_open(addr), "a killed etcd still listens");
    e.restart().unwrap_or_else(|u| panic!("{u}"));
    assert_ne!(e.pid(), Some(pid));
    assert!(
        etcd_get(addr, "a2V5").contains("djE="),
        "data lost across restart"
    );

    let dir = e.data_dir().unwrap().to_path_buf();
    drop(e);
    assert!(!dir.exists(), "temporary data dir not removed on drop");
}

#[test]
fn private_etcd_with_given_data_dir_keeps_it() {
    if !provisioned("etcd", find_native("bin/etcd", "etcd").is_some()) {
        return;
    }
    let keep = process::TempDir::new("etcd-given").unwrap();
    let data = keep.path().join("data");
    let e = spawn_etcd(Some(&data)).unwrap_or_else(|u| panic!("{u}"));
    assert_eq!(e.data_dir(), Some(data.as_path()));
    drop(e);
    assert!(data.join("member").exists(), "given data dir was removed");
}

// ----------------------------------------------------------------- nats

/// Reads the INFO line a NATS server sends on connect.
fn nats_info(url: &str) -> String {
    let mut s = TcpStream::connect(addr_of(url)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn shared_nats_answers_with_jetstream() {
    if process_env("LEASE_TEST_NATS_URL").is_none()
        && !provisioned(
            "nats-server",
            find_native("bin/nats-server", "nats-server").is_some(),
        )
    {
        return;
    }
    let n = nats().unwrap_or_else(|u| panic!("{u}"));
    let info = nats_info(&n.url);
    assert!(info.starts_with("INFO "), "{info}");
    assert!(info.contains("\"jetstream\":true"), "{info}");
    if let Some(monitor) = &n.monitor_url {
        let (status, body) = http(
            addr_of(monitor),
            "GET",
            "/healthz?js-enabled-only=true",
            b"",
        )
        .unwrap();
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn private_nats_restart_keeps_port() {
    if !provisioned(
        "nats-server",
        find_native("bin/nats-server", "nats-server").is_some(),
    ) {
        return;
    }
    let mut n = spawn_nats(None).unwrap_or_else(|u| panic!("{u}"));
    let pid = n.pid().unwrap();
    n.kill().unwrap();
    assert!(!tcp_open(addr_of(&n.url)));
    n.restart().unwrap_or_else(|u| panic!("{u}"));
    assert_ne!(n.pid(), Some(pid));
    assert!(nats_info(&n.url).contains("\"jetstream\":true"));
    assert!(n.store_dir().unwrap().exists());
}

// ------------------------------------------------------------------- s3

#[test]
fn shared_s3_answers_with_bucket() {
    let moto = servers_dir().join("moto/bin/python");
    if process_env("LEASE_TEST_S3_ENDPOINT").is_none() && !provisioned("moto", moto.exists()) {
        return;
    }
    let s = s3().unwrap_or_else(|u| panic!("{u}"));
    if s.source != Source::Env("LEASE_TEST_S3_ENDPOINT") {
        let addr = addr_of(&s.endpoint);
        let path = format!("/{}/probe-{}", s.bucket, std::process::id());
        let mut st = TcpStream::connect(addr).unwrap();
        st.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let req = format!(
            "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/octet-stream\r\nIf-None-Match: *\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        );
        st.write_all(req.as_bytes()).unwrap();
        let mut resp = String::new();
        st.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(resp.to_ascii_lowercase().contains("etag:"), "{resp}");
    }
}

// ---------------------------------------------------------------- mongo

/// Sends `{hello: 1, $db: "admin"}` as an OP_MSG and returns the reply.
fn mongo_hello(addr: SocketAddr) -> Vec<u8> {
    fn elem(out: &mut Vec<u8>, kind: u8, name: &str, value: &[u8]) {
        out.push(kind);
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value);
    }
    let mut fields = Vec::new();
    elem(&mut fields, 0x10, "hello", &1i32.to_le_bytes());
    let mut s = (("admin".len() + 1) as i32).to_le_bytes().to_vec();
    s.extend_from_slice(b"admin\0");
    elem(&mut fields, 0x02, "$db", &s);
    let mut doc = ((fields.len() + 5) as i32).to_le_bytes().to_vec();
    doc.extend_from_slice(&fields);
    doc.push(0);
    let mut body = 0u32.to_le_bytes().to_vec(); // flagBits
    body.push(0); // section kind 0
    body.extend_from_slice(&doc);
    let mut msg = ((16 + body.len()) as i32).to_le_bytes().to_vec();
    msg.extend_from_slice(&1i32.to_le_bytes()); // requestID
    msg.extend_from_slice(&0i32.to_le_bytes()); // responseTo
    msg.extend_from_slice(&2013i32.to_le_bytes()); // OP_MSG
    msg.extend_from_slice(&body);

    let mut st = TcpStream::connect(addr).unwrap();
    st.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    st.write_all(&msg).unwrap();
    let mut len = [0u8; 4];
    st.read_exact(&mut len).unwrap();
    let len = i32::from_le_bytes(len) as usize;
    let mut rest = vec![0u8; len - 4];
    st.read_exact(&mut rest).unwrap();
    rest
}

#[test]
fn shared_mongo_answers_hello() {
    if process_env("LEASE_TEST_MONGODB_URI").is_none()
        && !provisioned(
            "secantusd-py",
            find_native("secantus/bin/secantusd-py", "secantusd-py").is_some(),
        )
    {
        return;
    }
    let m = mongo().unwrap_or_else(|u| panic!("{u}"));
    if m.source == Source::Env("LEASE_TEST_MONGODB_URI") {
        return;
    }
    let reply = mongo_hello(addr_of(&m.uri));
    assert_eq!(i32::from_le_bytes(reply[8..12].try_into().unwrap()), 2013);
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("isWritablePrimary"), "{text}");
}

#[test]
fn private_servers_start_and_stop() {
    // spawn_s3 and spawn_mongo, and that drop kills the process.
    if provisioned("moto", servers_dir().join("moto/bin/python").exists()) {
        let s = spawn_s3().unwrap_or_else(|u| panic!("{u}"));
        let pid = s.pid().unwrap();
        let addr = addr_of(&s.endpoint);
        assert!(tcp_open(addr));
        drop(s);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
    if provisioned(
        "secantusd-py",
        find_native("secantus/bin/secantusd-py", "secantusd-py").is_some(),
    ) {
        let mut m = spawn_mongo(None).unwrap_or_else(|u| panic!("{u}"));
        m.restart().unwrap_or_else(|u| panic!("{u}"));
        let reply = mongo_hello(addr_of(&m.uri));
        assert!(String::from_utf8_lossy(&reply).contains("isWritablePrimary"));
        let dir = m.storage_dir().unwrap().to_path_buf();
        drop(m);
        assert!(!dir.exists());
    }
}

#[test]
fn mongo_launcher_finds_the_python_of_secantusd_py() {
    use std::os::unix::fs::PermissionsExt;
    let dir = process::TempDir::new("python-of").unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    let python = file("python3.11", "");
    // A pip console script names its interpreter on its `#!` line...
    let script = file(
        "secantusd-py",
        &format!("#!{}\nimport sys\n", python.display()),
    );
    assert_eq!(mongo::python_of(&script), Some(python));
    // ...but the `python` of its own virtualenv comes first,
    let beside = file("python", "");
    assert_eq!(mongo::python_of(&script), Some(beside));
    // and a program that is no Python script has none.
    std::fs::remove_file(dir.path().join("python")).unwrap();
    let shell = file("secantusd-sh", "#!/bin/sh\nexec true\n");
    assert_eq!(mongo::python_of(&shell), None);
}

/// One command on `st` as an OP_MSG; the reply's body.
fn mongo_command(st: &mut TcpStream, id: i32, cmd: &bson::Document) -> bson::Document {
    let mut doc = Vec::new();
    cmd.to_writer(&mut doc).unwrap();
    let mut msg = ((16 + 5 + doc.len()) as i32).to_le_bytes().to_vec();
    msg.extend_from_slice(&id.to_le_bytes()); // requestID
    msg.extend_from_slice(&0i32.to_le_bytes()); // responseTo
    msg.extend_from_slice(&2013i32.to_le_bytes()); // OP_MSG
    msg.extend_from_slice(&0u32.to_le_bytes()); // flagBits
    msg.push(0); // section kind 0
    msg.extend_from_slice(&doc);
    st.write_all(&msg).unwrap();
    let mut len = [0u8; 4];
    st.read_exact(&mut len).unwrap();
    let mut rest = vec![0u8; i32::from_le_bytes(len) as usize - 4];
    st.read_exact(&mut rest).unwrap();
    // requestID, responseTo, opCode, flagBits, section kind: then the body.
    bson::Document::from_reader(&rest[17..]).unwrap()
}

/// SecantusDB binds a command's `$$NOW` when the command starts, then waits
/// for the collection's lock to apply its write: writes racing on one
/// document land out of `$$NOW` order (a renewal bound early and landing
/// late sets an expiry older than the one before it, or extends a lease that
/// expired while it waited). The launcher runs it one command at a time
/// (`servers/secantus_serial.py`), as one primary applying each write at its
/// own instant would: racing pipeline updates each see the one before (none
/// is lost) and stamp `$$NOW` in the order they land.
#[test]
fn private_mongo_applies_racing_updates_one_at_a_time_in_now_order() {
    use bson::{doc, Bson};
    if !provisioned(
        "secantusd-py",
        find_native("secantus/bin/secantusd-py", "secantusd-py").is_some(),
    ) {
        return;
    }
    const CONNECTIONS: usize = 8;
    const EACH: usize = 50;
    let m = spawn_mongo(None).unwrap_or_else(|u| panic!("{u}"));
    let addr = addr_of(&m.uri);
    let connect = || {
        let st = TcpStream::connect(addr).unwrap();
        st.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        st
    };
    let inserted = mongo_command(
        &mut connect(),
        1,
        &doc! { "insert": "race", "documents": [ { "_id": "k", "n": 0_i64, "at": 0_i64 } ], "$db": "launcher" },
    );
    assert_eq!(inserted.get_f64("ok").ok(), Some(1.0), "{inserted}");
    let bump = doc! {
        "findAndModify": "race",
        "query": { "_id": "k" },
        "update": [
            { "$set": { "_now": { "$toLong": "$$NOW" } } },
            { "$set": { "n": { "$add": [ "$n", 1_i64 ] }, "at": "$_now" } },
            { "$unset": [ "_now" ] },
        ],
        "new": true,
        "$db": "launcher",
    };
    let start = std::sync::Arc::new(std::sync::Barrier::new(CONNECTIONS));
    let racers: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let (bump, start, mut st) = (bump.clone(), start.clone(), connect());
            std::thread::spawn(move || {
                start.wait();
                (0..EACH)
                    .map(|i| {
                        let reply = mongo_command(&mut st, i as i32 + 1, &bump);
                        let value = reply
                            .get_document("value")
                            .unwrap_or_else(|_| panic!("no document in {reply}"));
                        let int = |k: &str| match value.get(k) {
                            Some(Bson::Int64(v)) => *v,
                            Some(Bson::Int32(v)) => i64::from(*v),
                            other => panic!("{k} is {other:?} in {reply}"),
                        };
                        (int("n"), int("at"))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut writes: Vec<(i64, i64)> = racers.into_iter().flat_map(|r| r.join().unwrap()).collect();
    writes.sort_unstable();
    let total = (CONNECTIONS * EACH) as i64;
    let counts: Vec<i64> = writes.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        counts,
        (1..=total).collect::<Vec<_>>(),
        "{total} racing increments must count 1..={total}, each once (an update computed from a stale read is lost)"
    );
    // In the order the writes landed (their count), $$NOW never goes back.
    let (mut latest, mut back, mut worst) = (0, 0, 0);
    for (_, at) in &writes {
        if *at < latest {
            back += 1;
            worst = worst.max(latest - at);
        }
        latest = latest.max(*at);
    }
    assert_eq!(
        back, 0,
        "{back} of {total} racing writes stamped a $$NOW older than a write that landed before them (by up to {worst} ms)"
    );
}

// ------------------------------------------------------------------ redis

/// One command to `addr` (after `AUTH` when given); the raw answer.
fn redis_command(addr: SocketAddr, auth: Option<(&str, &str)>, words: &[&str]) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let encode = |words: &[&str]| {
        let mut out = format!("*{}\r\n", words.len());
        for w in words {
            out.push_str(&format!("${}\r\n{w}\r\n", w.len()));
        }
        out
    };
    let mut request = String::new();
    let mut answers = 1;
    if let Some((user, password)) = auth {
        request.push_str(&encode(&["AUTH", user, password]));
        answers += 1;
    }
    request.push_str(&encode(words));
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 1024];
    // Simple answers: one line each (bulk strings: two).
    while text.matches("\r\n").count() < answers + usize::from(text.contains('$')) {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    text
}

#[test]
fn redis_env_endpoint_is_used_when_set() {
    let env = fake_env(&[("LEASE_TEST_REDIS_URL", " redis://10.0.0.6:6379/1 ")]);
    let mut r = redis::resolve(&env).unwrap();
    assert_eq!(r.source, Source::Env("LEASE_TEST_REDIS_URL"));
    assert_eq!(r.url, "redis://10.0.0.6:6379/1");
    assert_eq!(r.pid(), None);
    assert!(r.kill().unwrap_err().reason.contains("not managed"));
    assert!(redis::from_env(&fake_env(&[("LEASE_TEST_REDIS_URL", " ")])).is_none());
}

#[test]
fn private_redis_keeps_its_data_across_kill_and_restart_and_pauses() {
    let found = crate::is_executable(&servers_dir().join(crate::provision::REDIS_CACHED_BIN))
        || crate::is_executable(std::path::Path::new("/usr/bin/redis-server"))
        || crate::which("redis-server").is_some();
    if !provisioned("redis", found) {
        return;
    }
    let dir = TempDir::new("redis-data-test").unwrap();
    let mut r = spawn_redis(Some(dir.path())).unwrap_or_else(|u| panic!("{u}"));
    let addr = addr_of(&r.url);
    assert_eq!(redis_command(addr, None, &["SET", "k", "v"]), "+OK\r\n");
    r.kill().unwrap();
    assert!(!tcp_open(addr));
    r.restart().unwrap_or_else(|u| panic!("{u}"));
    assert_eq!(redis_command(addr, None, &["GET", "k"]), "$1\r\nv\r\n");
    r.pause().unwrap();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    s.write_all(b"PING\r\n").unwrap();
    assert!(s.read(&mut [0u8; 16]).is_err(), "a paused server answered");
    r.resume().unwrap();
    assert_eq!(redis_command(addr, None, &["PING"]), "+PONG\r\n");
    drop(r);
    assert!(
        dir.path().join("appendonlydir").is_dir(),
        "the data directory is kept"
    );
}

#[test]
fn redis_variants_start_with_acl_users_tls_and_a_clock_the_test_steps() {
    let found = crate::is_executable(&servers_dir().join(crate::provision::REDIS_CACHED_BIN))
        || crate::is_executable(std::path::Path::new("/usr/bin/redis-server"))
        || crate::which("redis-server").is_some();
    if !provisioned("redis", found) {
        return;
    }
    let r = RedisOptions::new()
        .acl_user("app", "pw")
        .spawn()
        .unwrap_or_else(|u| panic!("{u}"));
    assert!(r.url.starts_with("redis://app:pw@127.0.0.1:"), "{}", r.url);
    let addr: SocketAddr = r.url.rsplit('@').next().unwrap().parse().unwrap();
    assert!(redis_command(addr, None, &["PING"]).starts_with("-NOAUTH"));
    assert!(redis_command(addr, Some(("app", "pw")), &["PING"]).ends_with("+PONG\r\n"));

    let pki = pki::Pki::new("redis").unwrap();
    let leaf = pki.leaf("localhost", true).unwrap();
    let tls = RedisOptions::new()
        .tls(&leaf.cert_pem, &leaf.key_pem)
        .spawn()
        .unwrap_or_else(|u| panic!("{u}"));
    assert!(tls.url.starts_with("rediss://localhost:"), "{}", tls.url);

    let (clocked, clock) = match RedisOptions::new().spawn_with_clock() {
        Ok(c) => c,
        Err(u) if clock::libfaketime().is_none() => {
            assert!(provisioned("libfaketime", false), "{u}");
            return;
        }
        Err(u) => panic!("{u}"),
    };
    let addr = addr_of(&clocked.url);
    let seconds = |text: String| -> i64 {
        text.lines()
            .nth(2)
            .and_then(|l| l.parse().ok())
            .unwrap_or_else(|| panic!("{text:?}"))
    };
    let before = seconds(redis_command(addr, None, &["TIME"]));
    clock.step(Duration::from_secs(3600), true).unwrap();
    let after = seconds(redis_command(addr, None, &["TIME"]));
    assert!(
        after - before >= 3599,
        "the clock moved {}s",
        after - before
    );
}

/// Servers are told their ports before they bind them, so a port from the
/// ephemeral range could meanwhile become some outgoing connection's local
/// port ("address already in use"): picks stay below that range, and one
/// process never hands out a port twice.
#[test]
fn free_ports_are_below_the_ephemeral_range_and_never_repeat() {
    let start: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..50 {
        let ports = super::process::free_ports(4).unwrap();
        assert_eq!(ports.len(), 4);
        for p in ports {
            assert!(p < start, "port {p} is in the ephemeral range from {start}");
            assert!(seen.insert(p), "port {p} handed out twice");
        }
    }
}
