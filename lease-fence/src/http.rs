//! The fence check across HTTP, as a pair of `tower` layers: the client
//! stamps each request with the lease key and fence, the server refuses a
//! request whose fence is below the highest it has admitted for that key.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use lease_core::{Fence, LeaseKey};
use tower_layer::Layer;
use tower_service::Service;

use crate::Fences;

/// The request header carrying the lease key the writer holds.
pub const LEASE_KEY: HeaderName = HeaderName::from_static("lease-key");
/// The request header carrying the writer's fence (a decimal number).
pub const LEASE_FENCE: HeaderName = HeaderName::from_static("lease-fence");
/// The response header of a refused request: the highest fence the server
/// has admitted for the key.
pub const LEASE_FENCE_SEEN: HeaderName = HeaderName::from_static("lease-fence-seen");

/// Client side: stamps every request with [`LEASE_KEY`] and [`LEASE_FENCE`].
///
/// Build it from the lease being held (`lease.key()`, `lease.fence()`), and
/// build a new one when a new lease is granted: a fence belongs to one grant.
#[derive(Clone, Debug)]
pub struct StampFenceLayer {
    key: HeaderValue,
    fence: HeaderValue,
}

impl StampFenceLayer {
    /// Stamps requests with `key` and `fence`.
    pub fn new(key: &LeaseKey, fence: Fence) -> Self {
        Self {
            // A LeaseKey is printable ASCII without control characters, which
            // a header value always admits; the fallback is never taken.
            key: HeaderValue::from_str(key.as_str())
                .unwrap_or_else(|_| HeaderValue::from_static("")),
            fence: HeaderValue::from(fence.get()),
        }
    }
}

impl<S> Layer<S> for StampFenceLayer {
    type Service = StampFence<S>;

    fn layer(&self, inner: S) -> StampFence<S> {
        StampFence {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`StampFenceLayer`].
#[derive(Clone, Debug)]
pub struct StampFence<S> {
    inner: S,
    layer: StampFenceLayer,
}

impl<S, B> Service<Request<B>> for StampFence<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> S::Future {
        let headers = request.headers_mut();
        headers.insert(LEASE_KEY, self.layer.key.clone());
        headers.insert(LEASE_FENCE, self.layer.fence.clone());
        self.inner.call(request)
    }
}

/// Server side: admits each request's fence for its lease key through
/// [`Fences`] and refuses a stale one with `409 Conflict` (and the fence seen
/// in [`LEASE_FENCE_SEEN`]), a request without a valid key and fence with
/// `400 Bad Request`. The inner service never sees a refused request.
///
/// An admitted request holds its key's turn until the inner service's
/// response is ready, so two requests for one key are handled one after the
/// other, and one admitted at a lower fence can never be handled after one
/// at a higher fence. Requests for different keys run concurrently. The
/// inner service runs in a task of its own (on the current tokio runtime)
/// that keeps the turn even if the request's future is dropped — a client
/// that went away, a timeout layer outside this one — so its write always
/// ends before the next one for the key begins. Work a handler detaches
/// (a task it spawns, a response body it streams after the headers) is
/// not covered: finish every write before returning the response.
///
/// The response body type must be buildable from a `String` (axum's `Body`,
/// `http_body_util::Full<Bytes>`, …): refusals carry a short explanation.
///
/// # Memory
///
/// The clients name the keys, so give it a
/// [`Fences::bounded`](crate::Fences::bounded) set: with
/// [`Fences::new`](crate::Fences::new) it keeps an entry for every key any
/// client ever named. A bounded set forgets the least recently used keys,
/// never letting their fences fall (a forgotten key admits no fence below a
/// floor it shares with a few others), so a key unused for a long time may
/// refuse an old fence but never admits a stale one.
///
/// ```
/// use std::sync::Arc;
/// use lease_fence::{http::CheckFenceLayer, Fences};
///
/// let layer = CheckFenceLayer::new(Arc::new(Fences::bounded(100_000)));
/// # let _ = layer;
/// ```
///
/// # Trust
///
/// The layer believes the headers: it refuses a *lower* fence than one it
/// admitted, but any client can present any fence it likes — a fence far
/// above every lease's, for a key it never held — and be admitted, and
/// from then on the real holders are refused. It stops paused holders, not
/// hostile or buggy ones. Deploy it behind authentication that admits only
/// the processes allowed to hold the leases (mutual TLS, a service mesh's
/// identities), or check the fence against the lease backend itself before
/// admitting it — read the key's current grant and refuse a fence above it,
/// as Chubby's servers check a sequencer against the lock service.
#[derive(Clone, Debug)]
pub struct CheckFenceLayer {
    fences: Arc<Fences>,
}

impl CheckFenceLayer {
    /// Checks requests against `fences` (share it with whatever else writes
    /// the same resources).
    pub fn new(fences: Arc<Fences>) -> Self {
        Self { fences }
    }
}

impl<S> Layer<S> for CheckFenceLayer {
    type Service = CheckFence<S>;

    fn layer(&self, inner: S) -> CheckFence<S> {
        CheckFence {
            inner,
            fences: self.fences.clone(),
        }
    }
}

/// The service made by [`CheckFenceLayer`].
#[derive(Clone)]
pub struct CheckFence<S> {
    inner: S,
    fences: Arc<Fences>,
}

impl<S> fmt::Debug for CheckFence<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckFence")
            .field("fences", &self.fences)
            .finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<Request<B>> for CheckFence<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: From<String> + Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that was polled ready handles this request; the clone
        // left behind is polled for the next one (tower's usual pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let fences = self.fences.clone();
        Box::pin(async move {
            let (key, fence) = match stamp(&request) {
                Ok(stamp) => stamp,
                Err(why) => return Ok(refusal(StatusCode::BAD_REQUEST, why, None)),
            };
            let turn = match fences.admit(&key, fence).await {
                Ok(turn) => turn,
                Err(stale) => {
                    return Ok(refusal(
                        StatusCode::CONFLICT,
                        stale.to_string(),
                        Some(stale.seen),
                    ))
                }
            };
            // The handler runs in a task of its own that keeps the key's
            // turn until it is done: dropping this future (a client gone, a
            // timeout outside this layer) must not let the next writer of
            // the key in while this one's write may still be under way.
            let handle = async move {
                let _turn = turn;
                inner.call(request).await
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => match rt.spawn(handle).await {
                    Ok(answer) => answer,
                    Err(e) => match e.try_into_panic() {
                        Ok(panic) => std::panic::resume_unwind(panic),
                        Err(_) => Ok(refusal(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the server is shutting down".into(),
                            None,
                        )),
                    },
                },
                Err(_) => handle.await,
            }
        })
    }
}

fn stamp<B>(request: &Request<B>) -> Result<(String, Fence), String> {
    let header = |name: &HeaderName| {
        request
            .headers()
            .get(name)
            .ok_or_else(|| format!("the request has no {name} header"))?
            .to_str()
            .map_err(|_| format!("the {name} header is not text"))
    };
    let key = header(&LEASE_KEY)?;
    LeaseKey::new(key).map_err(|e| format!("the {LEASE_KEY} header: {e}"))?;
    let fence = header(&LEASE_FENCE)?;
    let fence = fence
        .parse::<u64>()
        .map_err(|_| format!("the {LEASE_FENCE} header {fence:?} is not a fence"))?;
    Ok((key.to_owned(), Fence(fence)))
}

fn refusal<R: From<String>>(status: StatusCode, why: String, seen: Option<Fence>) -> Response<R> {
    let mut response = Response::new(R::from(format!("{why}\n")));
    *response.status_mut() = status;
    if let Some(seen) = seen {
        response
            .headers_mut()
            .insert(LEASE_FENCE_SEEN, HeaderValue::from(seen.get()));
    }
    response
}
