//! CheckFenceLayer keeps a key's turn until the handler is done, even when
//! the request's future is dropped (hyper drops it when the client
//! disconnects; so does a timeout layer outside it) while the handler's
//! write goes on — file I/O through `tokio::fs` runs on the blocking pool,
//! a database statement already sent still executes: a request admitted at
//! a higher fence must not run until that write has landed.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use lease_fence::http::{CheckFenceLayer, LEASE_FENCE, LEASE_KEY};
use lease_fence::Fences;
use tower_layer::Layer;
use tower_service::Service;

type Log = Arc<Mutex<Vec<String>>>;

/// A handler whose write runs on the blocking pool, as `tokio::fs::write`
/// does: dropping the handler's future does not stop it.
#[derive(Clone)]
struct BlockingWrite {
    log: Log,
}

impl Service<Request<String>> for BlockingWrite {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<String>) -> Self::Future {
        let fence = request
            .headers()
            .get(LEASE_FENCE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_owned();
        let log = self.log.clone();
        // The first write is slow (a slow disk, a paused thread), later ones
        // quick.
        let took = if fence == "5" { 100 } else { 10 };
        Box::pin(async move {
            let _ = tokio::task::spawn_blocking(move || {
                std::thread::sleep(Duration::from_millis(took));
                log.lock().unwrap().push(fence);
            })
            .await;
            Ok(Response::new("written".to_owned()))
        })
    }
}

fn request(fence: u64) -> Request<String> {
    Request::post("/write")
        .header(LEASE_KEY, "orders")
        .header(LEASE_FENCE, fence.to_string())
        .body(String::new())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_request_keeps_its_turn_until_its_write_is_done() {
    let log: Log = Arc::default();
    let mut service = CheckFenceLayer::new(Arc::new(Fences::bounded(100)))
        .layer(BlockingWrite { log: log.clone() });

    // The paused holder's request at fence 5 is admitted, its write starts,
    // and its future is dropped 20 ms later (the client went away).
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let stale = service.call(request(5));
    assert!(tokio::time::timeout(Duration::from_millis(20), stale)
        .await
        .is_err());

    // The new holder's request at fence 7.
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let newer = service.call(request(7)).await.unwrap();
    assert_eq!(newer.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        vec!["5".to_owned(), "7".to_owned()],
        "the write at fence 5 landed after the one at fence 7 was handled"
    );
}
