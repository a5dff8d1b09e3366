//! The tower layer pair over real HTTP: an axum server behind
//! CheckFenceLayer, a hyper client behind StampFenceLayer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use lease_core::{Fence, LeaseKey};
use lease_fence::http::{
    CheckFenceLayer, StampFenceLayer, LEASE_FENCE, LEASE_FENCE_SEEN, LEASE_KEY,
};
use lease_fence::Fences;
use tower_layer::Layer;
use tower_service::Service;

type Log = Arc<Mutex<Vec<String>>>;

/// A server whose one route logs the fence it was called with, around a
/// short pause, behind the fence check.
async fn server(fences: Arc<Fences>) -> (String, Log) {
    let log: Log = Arc::default();
    let handler_log = log.clone();
    let app = Router::new()
        .route(
            "/write",
            post(move |headers: http::HeaderMap| {
                let log = handler_log.clone();
                async move {
                    let fence = headers
                        .get(LEASE_FENCE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("none")
                        .to_owned();
                    log.lock().expect("log").push(format!("start {fence}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    log.lock().expect("log").push(format!("end {fence}"));
                    "written"
                }
            }),
        )
        .layer(CheckFenceLayer::new(fences));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/write"), log)
}

type Raw = Client<HttpConnector, Full<Bytes>>;

fn raw() -> Raw {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send<S>(client: &mut S, url: &str) -> (StatusCode, http::HeaderMap, String)
where
    S: Service<Request<Full<Bytes>>, Response = Response<hyper::body::Incoming>>,
    S::Error: std::fmt::Debug,
{
    std::future::poll_fn(|cx| client.poll_ready(cx))
        .await
        .expect("ready");
    let request = Request::post(url)
        .body(Full::new(Bytes::from_static(b"data")))
        .expect("request");
    let response = client.call(request).await.expect("response");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_fence_gets_409_and_never_reaches_the_handler() {
    let fences = Arc::new(Fences::new());
    let (url, log) = server(fences.clone()).await;
    let key = LeaseKey::new("reports/daily").expect("key");

    let mut new = StampFenceLayer::new(&key, Fence(2)).layer(raw());
    let (status, _, body) = send(&mut new, &url).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "written"));

    let mut old = StampFenceLayer::new(&key, Fence(1)).layer(raw());
    let (status, headers, body) = send(&mut old, &url).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        headers.get(LEASE_FENCE_SEEN).and_then(|v| v.to_str().ok()),
        Some("2")
    );
    assert!(body.contains("fence 1 is below 2"), "{body}");
    assert_eq!(*log.lock().expect("log"), ["start 2", "end 2"]);
    assert_eq!(fences.seen("reports/daily"), Some(Fence(2)));

    // Another key is another resource.
    let other = LeaseKey::new("reports/weekly").expect("key");
    let mut first = StampFenceLayer::new(&other, Fence(1)).layer(raw());
    assert_eq!(send(&mut first, &url).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_valid_stamp_gets_400() {
    let (url, log) = server(Arc::new(Fences::new())).await;
    let mut client = raw();
    let (status, _, body) = send(&mut client, &url).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("no lease-key header"), "{body}");

    for (key, fence, why) in [
        ("jobs/x", "seven", "is not a fence"),
        ("jobs//x", "7", "lease-key header"),
    ] {
        let request = Request::post(&url)
            .header(LEASE_KEY, key)
            .header(LEASE_FENCE, fence)
            .body(Full::new(Bytes::new()))
            .expect("request");
        let response = client.request(request).await.expect("response");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains(why), "{key} {fence}: {body}");
    }
    assert!(
        log.lock().expect("log").is_empty(),
        "no refused request was handled"
    );
}

/// An admitted request holds its key's turn until its response is ready:
/// writes for one key never interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_for_one_key_are_handled_one_at_a_time() {
    let (url, log) = server(Arc::new(Fences::new())).await;
    let key = LeaseKey::new("jobs/serial").expect("key");
    let mut tasks = Vec::new();
    for fence in [5u64, 5, 5] {
        let (url, key) = (url.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = StampFenceLayer::new(&key, Fence(fence)).layer(raw());
            send(&mut client, &url).await.0
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for t in tasks {
        assert_eq!(t.await.expect("task"), StatusCode::OK);
    }
    let log = log.lock().expect("log");
    assert_eq!(log.len(), 6, "{log:?}");
    for pair in log.chunks(2) {
        let fence = pair[0].strip_prefix("start ").expect("a start first");
        assert_eq!(pair[1], format!("end {fence}"), "interleaved: {log:?}");
    }
}

/// Clients name the keys, so the server's memory must not grow with every
/// key ever named: a bounded `Fences` keeps at most its bound, and a key it
/// forgot still refuses a fence below the one it had admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_keeps_a_bounded_number_of_keys_and_a_forgotten_key_stays_fenced() {
    let fences = Arc::new(Fences::bounded(8));
    let (url, log) = server(fences.clone()).await;
    let first = LeaseKey::new("tenants/0").expect("key");
    let mut client = StampFenceLayer::new(&first, Fence(50)).layer(raw());
    assert_eq!(send(&mut client, &url).await.0, StatusCode::OK);
    for i in 1..40 {
        let key = LeaseKey::new(format!("tenants/{i}")).expect("key");
        // At the first key's own fence: whichever floor any of these keys
        // shares once forgotten, it is 50, so each is admitted, and so is
        // the first key's current holder at the end. (A higher fence here
        // could be folded into the first key's floor — one bucket in a few
        // thousand — and rightly refuse its 50.)
        let mut client = StampFenceLayer::new(&key, Fence(50)).layer(raw());
        assert_eq!(send(&mut client, &url).await.0, StatusCode::OK, "{i}");
        assert!(fences.len() <= 8, "{i}: {fences:?}");
    }
    let mut stale = StampFenceLayer::new(&first, Fence(49)).layer(raw());
    let (status, headers, body) = send(&mut stale, &url).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let seen: u64 = headers
        .get(LEASE_FENCE_SEEN)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("seen");
    assert!(seen >= 50, "{seen}");
    let mut current = StampFenceLayer::new(&first, Fence(50)).layer(raw());
    assert_eq!(send(&mut current, &url).await.0, StatusCode::OK);
    assert_eq!(log.lock().expect("log").len(), 2 * 41);
}
