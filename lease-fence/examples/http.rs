//! The tower layer pair over real HTTP, in one process: an axum server
//! behind CheckFenceLayer and two hyper clients behind StampFenceLayer.
//!
//! Run it with `cargo run -p lease-fence --features http --example http`.

use std::sync::Arc;

use axum::{routing::put, Router};
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use lease_core::{Fence, LeaseKey};
use lease_fence::http::{CheckFenceLayer, StampFenceLayer, LEASE_FENCE_SEEN};
use lease_fence::Fences;
use tower_layer::Layer;
use tower_service::Service;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The server: the fence check in front of the handler that writes.
    let app = Router::new()
        .route("/report", put(|| async { "written\n" }))
        // Bounded: the clients name the keys, so the server must not keep
        // every key it was ever shown.
        .layer(CheckFenceLayer::new(Arc::new(Fences::bounded(100_000))));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/report", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let key = LeaseKey::new("reports/daily")?;
    for (who, fence) in [("b", 2), ("a, paused until now", 1)] {
        // Each client stamps its requests with the lease it holds.
        let mut client = StampFenceLayer::new(&key, Fence(fence))
            .layer(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
        std::future::poll_fn(|cx| client.poll_ready(cx)).await?;
        let response = client
            .call(Request::put(&url).body(Full::new(Bytes::from("report")))?)
            .await?;
        let seen = response
            .headers()
            .get(LEASE_FENCE_SEEN)
            .and_then(|v| v.to_str().ok())
            .map(|s| format!(" (fence seen: {s})"))
            .unwrap_or_default();
        println!("{who} at fence {fence}: {}{seen}", response.status());
    }
    Ok(())
}
