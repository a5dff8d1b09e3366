//! The suite's fault controls on a real server: the TCP fault proxy in
//! front of etcd (its HTTP gateway), where "forward the request, drop the
//! response" must leave the write applied on the server, and process faults
//! (pause, kill, restart) on a launched etcd through
//! [`Launched`](lease_conformance::faults::Launched).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::faults::{FaultProxy, Launched, PidProcess, ServerControl};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::servers;

/// Whether the peer closed the connection within `wait` (EOF or reset).
async fn closed(s: &mut TcpStream, wait: Duration) -> bool {
    let mut b = [0u8; 64];
    matches!(timeout(wait, s.read(&mut b)).await, Ok(Ok(0)) | Ok(Err(_)))
}

const WAIT: Duration = Duration::from_secs(2);

fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn etcd_addr() -> SocketAddr {
    let etcd = servers::etcd().unwrap_or_else(|e| panic!("{e}"));
    endpoint_addr(&etcd.endpoints[0])
}

fn endpoint_addr(endpoint: &str) -> SocketAddr {
    endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|e| panic!("etcd endpoint {endpoint:?}: {e}"))
}

/// One HTTP/1.1 request with `Connection: close`; the whole answer, or
/// `Err` when none came within `wait`.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    wait: Duration,
) -> Result<(u16, String), String> {
    let call = async {
        let mut s = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("no HTTP answer ({} bytes)", out.len()))?;
        Ok((status, text))
    };
    timeout(wait, call)
        .await
        .map_err(|_| "no answer".to_string())?
}

async fn health(addr: SocketAddr, wait: Duration) -> Result<(), String> {
    match http(addr, "GET", "/health", "", wait).await? {
        (200, body) if body.contains("\"health\":\"true\"") => Ok(()),
        (code, body) => Err(format!("{code}: {body}")),
    }
}

async fn put(addr: SocketAddr, key: &str, value: &str) -> Result<(u16, String), String> {
    let body = format!(
        "{{\"key\":\"{}\",\"value\":\"{}\"}}",
        b64(key.as_bytes()),
        b64(value.as_bytes())
    );
    http(addr, "POST", "/v3/kv/put", &body, WAIT).await
}

async fn get(addr: SocketAddr, key: &str) -> String {
    let body = format!("{{\"key\":\"{}\"}}", b64(key.as_bytes()));
    let (code, text) = http(addr, "POST", "/v3/kv/range", &body, WAIT)
        .await
        .unwrap();
    assert_eq!(code, 200, "{text}");
    text
}

#[test]
fn base64_matches_the_rfc_vectors() {
    for (plain, enc) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(b64(plain.as_bytes()), enc);
    }
}

#[tokio::test]
async fn etcd_through_the_proxy_with_each_control() {
    let server = etcd_addr();
    let p = FaultProxy::start(server).await.unwrap();
    health(p.addr(), WAIT)
        .await
        .unwrap_or_else(|e| panic!("health through the proxy: {e}"));

    // Forward the request, drop the response: the put is applied on the
    // server, the client never hears so.
    let key = format!("faults/proxy/{}", std::process::id());
    p.drop_responses(1);
    let t = Instant::now();
    let r = put(p.addr(), &key, "applied-but-unanswered").await;
    assert!(r.is_err(), "the answer came through: {r:?}");
    eprintln!("dropped put: {r:?} after {:?}", t.elapsed());
    let seen = get(server, &key).await;
    assert!(
        seen.contains(&b64(b"applied-but-unanswered")),
        "not applied: {seen}"
    );
    assert_eq!(p.stats().dropped_exchanges, 1);

    // Latency: both legs.
    p.set_latency(Duration::from_millis(100));
    let t = Instant::now();
    health(p.addr(), WAIT).await.unwrap();
    let slow = t.elapsed();
    assert!(slow >= Duration::from_millis(200), "{slow:?}");
    p.set_latency(Duration::ZERO);

    // Blackhole: nothing through the proxy, the server itself is fine.
    p.blackhole(true);
    let r = health_within(p.addr(), Duration::from_millis(500)).await;
    assert_eq!(r, Err("no answer".into()));
    health(server, WAIT).await.unwrap();
    p.blackhole(false);
    health(p.addr(), WAIT).await.unwrap();

    // Sever: a keep-alive connection dies, a new one works.
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    let req = format!("GET /health HTTP/1.1\r\nHost: {server}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = [0u8; 512];
    let n = timeout(WAIT, s.read(&mut buf)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    p.sever();
    assert!(
        closed(&mut s, WAIT).await,
        "keep-alive connection survived the sever"
    );
    health(p.addr(), WAIT).await.unwrap();

    let st = p.stats();
    eprintln!("proxy in front of etcd: {st:?}");
    assert!(st.requests >= 6, "{st:?}");
}

async fn health_within(addr: SocketAddr, wait: Duration) -> Result<(), String> {
    match http(addr, "GET", "/health", "", wait).await? {
        (200, _) => Ok(()),
        (code, body) => Err(format!("{code}: {body}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launched_etcd_paused_killed_and_restarted() {
    let etcd = servers::spawn_etcd(None).unwrap_or_else(|e| panic!("{e}"));
    let addr = endpoint_addr(&etcd.endpoints[0]);
    let pid = etcd.pid().expect("a launched etcd has a pid");
    let server = Launched::new(etcd, true);
    let control: &dyn ServerControl = &server;
    health(addr, WAIT).await.unwrap();
    let key = format!("faults/durable/{}", std::process::id());
    let (code, text) = put(addr, &key, "kept").await.unwrap();
    assert_eq!(code, 200, "{text}");

    control.pause().unwrap();
    let r = health_within(addr, Duration::from_millis(500)).await;
    assert_eq!(r, Err("no answer".into()), "a paused etcd answered");
    control.resume().unwrap();
    health(addr, WAIT).await.unwrap();

    // The same by bare process id.
    let bare = PidProcess { pid };
    bare.pause().unwrap();
    let r = health_within(addr, Duration::from_millis(500)).await;
    assert_eq!(
        r,
        Err("no answer".into()),
        "an etcd stopped by pid answered"
    );
    bare.resume().unwrap();
    health(addr, WAIT).await.unwrap();
    assert!(bare.kill().is_err(), "a bare pid cannot be restarted");

    let t = Instant::now();
    tokio::task::block_in_place(|| control.kill()).unwrap();
    assert!(
        health_within(addr, Duration::from_millis(500))
            .await
            .is_err(),
        "a killed etcd answered"
    );
    tokio::task::block_in_place(|| control.restart()).unwrap();
    eprintln!("etcd kill + restart took {:?}", t.elapsed());
    health(addr, WAIT).await.unwrap();
    assert!(
        get(addr, &key).await.contains(&b64(b"kept")),
        "the data did not survive the restart"
    );
}

/// The fake as the lease backend, with a launched etcd process as the
/// "server" whose process faults are injected: checks the injection
/// mechanics on a real process (not lease safety on etcd).
struct FakeBesideEtcd {
    fake: lease_conformance::FakeHarness,
    server: Launched<servers::Etcd>,
}

impl lease_conformance::Harness for FakeBesideEtcd {
    fn name(&self) -> &'static str {
        "fake-beside-etcd"
    }
    fn client(
        &self,
    ) -> lease_core::BoxFuture<'_, Result<Arc<dyn lease_core::LeaseBackend>, lease_core::Error>>
    {
        self.fake.client()
    }
    fn pass(&self, d: Duration) -> lease_core::BoxFuture<'_, ()> {
        self.fake.pass(d)
    }
    fn fault_hooks(&self) -> Option<&dyn lease_conformance::faults::FaultHooks> {
        Some(self)
    }
}

impl lease_conformance::faults::FaultHooks for FakeBesideEtcd {
    fn advance_clock(&self, by: Duration) -> bool {
        self.fake.fake.advance(by);
        true
    }
    fn server(&self) -> Option<&dyn ServerControl> {
        Some(&self.server)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_pause_runs_thaw_the_server_even_when_dropped() {
    use lease_conformance::faults::{self, FaultKind, FaultPlan};
    let etcd = servers::spawn_etcd(None).unwrap_or_else(|e| panic!("{e}"));
    let addr = endpoint_addr(&etcd.endpoints[0]);
    let h = FakeBesideEtcd {
        fake: lease_conformance::FakeHarness::new(),
        server: Launched::new(etcd, true),
    };
    let ttl = Duration::from_millis(300);

    // A whole run: paused and thawed, history safe.
    let plan = FaultPlan::new(FaultKind::ServerPause(Duration::from_millis(300)))
        .ttl(ttl)
        .duration(Duration::from_secs(2));
    let r = faults::run(&h, &plan)
        .await
        .unwrap_or_else(|f| panic!("{f}"));
    eprintln!("{r}");
    assert!(r.faults_injected >= 1, "{r}");
    health_within(addr, WAIT)
        .await
        .expect("etcd thawed after the run");

    // A run dropped in the middle of a 3 s pause still thaws the server.
    let plan = FaultPlan::new(FaultKind::ServerPause(Duration::from_secs(3)))
        .ttl(ttl)
        .duration(Duration::from_secs(10));
    let dropped = timeout(Duration::from_millis(1200), faults::run(&h, &plan)).await;
    assert!(dropped.is_err(), "the run should still be going");
    health_within(addr, Duration::from_millis(500))
        .await
        .expect("etcd left frozen by a dropped run");
}
