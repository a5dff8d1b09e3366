//! Bounded operations on a real MongoDB-compatible server: a request the
//! server never answers (a write waiting for a majority that is gone, a
//! frozen primary, a network black hole) ends as an unknown outcome in
//! bounded time, and a server that cannot be reached says why.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lease_conformance::faults::FaultProxy;
use lease_core::{AcquireRequest, BreakNote, Error, HolderId, LeaseBackend, LeaseKey};
use lease_mongo::MongoBackend;
use mongodb::options::{ClientOptions, ServerAddress};

fn key(name: &str) -> LeaseKey {
    LeaseKey::new(format!("to/{}", common::unique(name))).unwrap()
}

async fn upstream() -> SocketAddr {
    let o = ClientOptions::parse(common::uri()).await.unwrap();
    match o.hosts.as_slice() {
        [ServerAddress::Tcp { host, port }] => {
            tokio::net::lookup_host((host.as_str(), port.unwrap_or(27017)))
                .await
                .unwrap()
                .next()
                .unwrap()
        }
        other => panic!("a single-host test server, not {other:?}"),
    }
}

/// Every operation, sent into a black hole (the connection stays open, the
/// server never answers), ends within the configured request timeout as
/// `Error::Unavailable` — never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_request_is_an_unknown_outcome_in_bounded_time() {
    let proxy = FaultProxy::start(upstream().await).await.unwrap();
    let uri = format!("mongodb://{}/?directConnection=true", proxy.addr());
    let timeout = Duration::from_millis(1500);
    let config = common::fresh_config().request_timeout(timeout);
    let b = MongoBackend::connect(&uri, config).await.unwrap();
    let k = key("hole");
    let g = b
        .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    proxy.blackhole(true);
    let note = BreakNote::new("t", "t").with_at_unix_ms(0);
    let bound = timeout * 3;
    let mut failures = Vec::new();
    for op in ["acquire", "renew", "release", "read", "break"] {
        let started = Instant::now();
        let fut = async {
            match op {
                "acquire" => b
                    .try_acquire(AcquireRequest::new(k.clone(), HolderId::random()))
                    .await
                    .map(|_| ()),
                "renew" => b.renew(&g, None).await.map(|_| ()),
                "release" => b.release(&g).await,
                "read" => b.read(&k).await.map(|_| ()),
                _ => b.break_lease(&k, &note).await.map(|_| ()),
            }
        };
        match tokio::time::timeout(bound, fut).await {
            Err(_) => failures.push(format!("{op}: no answer after {bound:?}")),
            Ok(Err(Error::Unavailable { .. })) => {
                eprintln!("{op}: unknown outcome after {:?}", started.elapsed())
            }
            Ok(other) => failures.push(format!("{op}: {other:?}")),
        }
    }
    proxy.blackhole(false);
    b.shutdown().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A port nobody listens on fails within the request timeout, and the error
/// names the cause the driver saw (the refused connection) instead of only
/// "server selection timed out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_fails_fast_with_the_cause() {
    // A port that was just free: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let uri = format!("mongodb://127.0.0.1:{port}/?directConnection=true");
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        MongoBackend::connect(&uri, common::fresh_config()),
    )
    .await;
    let took = started.elapsed();
    let e = match r {
        Err(_) => panic!("connect to a closed port gave no answer in 20 s"),
        Ok(Ok(_)) => panic!("connected to a closed port"),
        Ok(Err(e)) => e,
    };
    // The cause is the driver's error, this error's source.
    let text = lease_core::ErrorChain::new(&e).to_string();
    eprintln!("closed port: {took:?}: {text}");
    assert!(
        matches!(e, Error::Unavailable { .. }),
        "an unreachable server is an unknown outcome: {e:?}"
    );
    assert!(
        text.to_lowercase().contains("refused"),
        "the error names the cause: {text}"
    );
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

/// The writer/fsck protocol's connect fails as fast, with the same cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_leases_on_a_closed_port_fail_fast_with_the_cause() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let uri = format!("mongodb://127.0.0.1:{port}/?directConnection=true");
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        lease_mongo::store_lock::StoreLeases::connect(
            &uri,
            "lease_test",
            lease_mongo::store_lock::StoreLockTiming::default(),
        ),
    )
    .await
    .expect("an answer within 20 s");
    let took = started.elapsed();
    let text = match r {
        Ok(_) => panic!("connected to a closed port"),
        Err(e) => lease_core::ErrorChain::new(&e).to_string(),
    };
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
}
