//! [`InstrumentedBackend`]: a `tracing` span for every operation of any
//! backend, and with the `metrics` feature the backend metrics, written once
//! for all backends.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Error, Grant, LastBreak, LeaseBackend,
    LeaseKey, LeaseState, Payload, Renewal,
};
use tracing::field::{display, Empty};
use tracing::{Instrument, Span};

use crate::metrics::{self as m, HeldLeases};

/// A [`LeaseBackend`] that forwards every call to the backend it wraps and
/// reports it: one `tracing` span per operation and, with the `metrics`
/// feature, the backend metrics listed in [`metrics`](crate::metrics).
///
/// It changes nothing else: the same requests reach the wrapped backend at
/// the same moments, the same answers come back, and
/// [`capabilities`](LeaseBackend::capabilities) are the wrapped backend's.
/// [`lease::connect`](https://docs.rs/lease) wraps every backend it opens in
/// one already; wrapping a backend twice reports every operation twice.
///
/// # Spans
///
/// Every span has a `backend` field: the wrapper's [`label`](Self::label).
///
/// | span | level | fields |
/// | --- | --- | --- |
/// | `lease.backend.acquire` | INFO | `key`, `holder`, `ttl_ms` (asked for); `fence` (granted), or `held_by`, `held_fence` (refused) |
/// | `lease.backend.renew` | DEBUG | `key`, `holder`, `fence`, `new_payload` (whether one was sent); `deadline_left_ms` (renewed) |
/// | `lease.backend.release` | INFO | `key`, `holder`, `fence` |
/// | `lease.backend.read` | DEBUG | `key`; `held_by`, `held_fence` (held) |
/// | `lease.backend.watch` | DEBUG | `key` |
/// | `lease.backend.break` | INFO | `key`, `by`, `reason`; `held_by`, `held_fence` (the grant it ended) |
/// | `lease.backend.last_break` | DEBUG | `key`; `by` (found) |
///
/// Every span also gets, when the call ends, `outcome` (the values of the
/// `outcome` label in [`metrics`](crate::metrics): `granted`, `lost`,
/// `cancelled` for a future dropped before its answer, the kind of error…),
/// `latency_ms` (from the call to the answer) and, on an error, `error`
/// (its message). No span carries a payload: a renewal says only whether it
/// sent one. The wrapped backend's own spans and events nest inside.
///
/// ```
/// use std::sync::Arc;
/// use lease_core::LeaseBackend;
/// use lease_keeper::{InstrumentedBackend, Keeper};
///
/// let backend: Arc<dyn LeaseBackend> =
///     Arc::new(InstrumentedBackend::new(Arc::new(lease_fake::Fake::new())));
/// let keeper = Keeper::new(backend);
/// ```
///
/// # Cancel safety
///
/// Every method is exactly as cancel safe as the wrapped backend's: a
/// dropped call drops the wrapped backend's future, having sent what it
/// sent, and is reported with the outcome `cancelled`.
#[derive(Clone)]
pub struct InstrumentedBackend {
    inner: Arc<dyn LeaseBackend>,
    label: Arc<str>,
    held: HeldLeases,
}

impl InstrumentedBackend {
    /// Wraps `backend`, labelled [`UNNAMED`](crate::metrics::UNNAMED) until
    /// [`with_label`](Self::with_label) names it. With the `metrics`
    /// feature, also describes the metrics (units and help) to the recorder
    /// installed now.
    pub fn new(backend: Arc<dyn LeaseBackend>) -> Self {
        m::describe();
        let label = m::unnamed();
        InstrumentedBackend {
            inner: backend,
            held: HeldLeases::new(label.clone()),
            label,
        }
    }

    /// Names the backend in the `backend` field of every span and the
    /// `backend` label of every metric: `etcd`, `nats`… (what
    /// [`lease::connect`](https://docs.rs/lease) uses), or a name of your
    /// own to tell two backends of one kind apart. Name it before taking
    /// leases through it: leases held through the wrapper before are
    /// counted under the old name.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use lease_keeper::InstrumentedBackend;
    ///
    /// let backend = InstrumentedBackend::new(Arc::new(lease_fake::Fake::new())).with_label("fake");
    /// assert_eq!(backend.label(), "fake");
    /// ```
    pub fn with_label(mut self, label: impl Into<Arc<str>>) -> Self {
        self.label = label.into();
        self.held = HeldLeases::new(self.label.clone());
        self
    }

    /// The name of the backend in spans and metrics (see
    /// [`with_label`](Self::with_label)).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn LeaseBackend> {
        &self.inner
    }
}

impl fmt::Debug for InstrumentedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstrumentedBackend")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// One call in progress: reports its outcome once, `cancelled` if it is
/// dropped unanswered.
struct Call {
    backend: Arc<str>,
    op: &'static str,
    span: Span,
    started: Instant,
    ended: bool,
}

impl Call {
    fn new(backend: &Arc<str>, op: &'static str, span: &Span) -> Self {
        Call {
            backend: backend.clone(),
            op,
            span: span.clone(),
            started: Instant::now(),
            ended: false,
        }
    }

    fn end(mut self, outcome: &'static str) {
        self.ended = true;
        self.report(outcome);
    }

    fn fail(self, e: &Error) {
        self.span
            .record("error", display(lease_core::ErrorChain::new(e)));
        self.end(m::error_label(e));
    }

    fn report(&self, outcome: &'static str) {
        let latency = self.started.elapsed();
        self.span.record("outcome", outcome);
        self.span
            .record("latency_ms", latency.as_secs_f64() * 1000.0);
        m::record_operation(&self.backend, self.op, outcome, latency);
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.ended {
            self.report("cancelled");
        }
    }
}

/// Whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// A layer, named by path so that the tests' glob import does not make
// every call on the concrete type ambiguous.
impl lease_core::LeaseLayer for InstrumentedBackend {
    fn inner(&self) -> &dyn LeaseBackend {
        &*self.inner
    }

    /// The wrapped backend's `try_acquire`, in a `lease.backend.acquire` span.
    ///
    /// # Cancel safety
    ///
    /// The same as the wrapped backend's.
    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        let span = tracing::info_span!(
            "lease.backend.acquire",
            backend = %self.label,
            key = %req.key,
            holder = %req.holder,
            ttl_ms = millis(req.ttl),
            fence = Empty,
            held_by = Empty,
            held_fence = Empty,
            outcome = Empty,
            latency_ms = Empty,
            error = Empty,
        );
        let call = Call::new(&self.label, "acquire", &span);
        let sent = crate::clock::Sent::now();
        let key = req.key.clone();
        let answer = span.in_scope(|| self.inner.try_acquire(req));
        Box::pin(async move {
            let result = answer.instrument(span).await;
            self.held.sweep();
            match &result {
                Ok(Acquire::Granted(g)) => {
                    call.span.record("fence", display(g.fence()));
                    self.held.granted(g, sent);
                    call.end("granted");
                }
                Ok(Acquire::Held(h)) => {
                    call.span.record("held_by", display(&h.holder));
                    call.span.record("held_fence", display(h.fence));
                    self.held.seen_held(&key, h);
                    call.end("held");
                }
                Err(e) => call.fail(e),
            }
            result
        })
    }

    /// The wrapped backend's `renew`, in a `lease.backend.renew` span.
    ///
    /// # Cancel safety
    ///
    /// The same as the wrapped backend's.
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        let span = tracing::debug_span!(
            "lease.backend.renew",
            backend = %self.label,
            key = %grant.key(),
            holder = %grant.holder(),
            fence = %grant.fence(),
            new_payload = payload.is_some(),
            deadline_left_ms = Empty,
            outcome = Empty,
            latency_ms = Empty,
            error = Empty,
        );
        let call = Call::new(&self.label, "renew", &span);
        let sent = crate::clock::Sent::now();
        let answer = span.in_scope(|| self.inner.renew(grant, payload));
        Box::pin(async move {
            let result = answer.instrument(span).await;
            self.held.sweep();
            match &result {
                Ok(Renewal::Renewed(g)) => {
                    let left = g.deadline().saturating_duration_since(Instant::now());
                    call.span.record("deadline_left_ms", millis(left));
                    m::record_deadline_left(&self.label, left);
                    self.held.granted(g, sent);
                    call.end("renewed");
                }
                Ok(Renewal::Lost) => {
                    self.held.ended(grant.key(), grant.holder(), grant.fence());
                    call.end("lost");
                }
                Err(e) => call.fail(e),
            }
            result
        })
    }

    /// The wrapped backend's `release`, in a `lease.backend.release` span.
    ///
    /// # Cancel safety
    ///
    /// The same as the wrapped backend's.
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        let span = tracing::info_span!(
            "lease.backend.release",
            backend = %self.label,
            key = %grant.key(),
            holder = %grant.holder(),
            fence = %grant.fence(),
            outcome = Empty,
            latency_ms = Empty,
            error = Empty,
        );
        let call = Call::new(&self.label, "release", &span);
        let answer = span.in_scope(|| self.inner.release(grant));
        Box::pin(async move {
            let result = answer.instrument(span).await;
            self.held.sweep();
            match &result {
                Ok(()) => {
                    self.held.ended(grant.key(), grant.holder(), grant.fence());
                    call.end("released");
                }
                Err(e) => call.fail(e),
            }
            result
        })
    }

    /// The wrapped backend's `read`, in a `lease.backend.read` span.
    ///
    /// # Cancel safety
    ///
    /// The same as the wrapped backend's.
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        let span = tracing::debug_span!(
            "lease.backend.read",
            backend = %self.label,
            key = %key,
            held_by = Empty,
            held_fence = Empty,
            outcome = Empty,
            latency_ms = Empty,
            error = Empty,
        );
        let call = Call::new(&self.label, "read", &span);
        let answer = span.in_scope(|| self.inner.read(key));
        Box::pin(async move {
            let result = answer.instrument(span).await;
            self.held.sweep();
            match &result {
                Ok(LeaseState::Free) => call.end("free"),
                Ok(LeaseState::Held(h)) => {
                    call.span.record("held_by", display(&h.holder));
                    call.span.record("held_fence", display(h.fence));
                    call.end("held");
                }
                Err(e) => call.fail(e),
            }
            result
        })
    }

    /// The wrapped backend's `wait_for_change`, in a `lease.backend.watch`
    /// span.
    ///
    /// # Cancel safety
    ///
    /// The same as the wrapped backend's.
    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let span = tracing::debug_span!(
            "lease.backend.watch",
            backend = %self.label,
            key = %key,
            outcome = Empty,
            latency_ms = Empty,
            error = Empty,
        );
        let call = Call::new(&self.label, "watch", &span);
        let answer = span.in_scope(|| self.inner.wait_for_change(key, seen));
        Box::pin(async move {
            let result = answer.instrument(span).await;
            match &result {
                Ok(()) => call.end("changed"),
                Err(e) => call.fail(e),
            }
            result
        })
    }

    /// The wrapped backend's `break_lease`, in a `lease.backend.break` span.
    ///
    /// # Cancel safety
    ///
    /// The same as the wrapped backend's.
    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        let span = tracing::info_span!(
            "lease.backend.break",
            backend = %self.label,
            key = %key,
            by = %note.by,
            reason = %note.reason,
            held_by = Empty,
            held_fence = Empty,
            outcome = Empty,
            latency_ms = Empty,
            error = Empty,
        );
        let call = Call::new(&self.label, "break", &span);
        let answer = span.in_scope(|| self.inner.break_lease(key, note));
        Box::pin(async move {
            let result = answer.instrument(span).await;
            self.held.sweep();
            match &result {
                Ok(broken) => {
                    match &broken.previous {
                        Some(h) => {
                            call.span.record("held_by", display(&h.holder));
                            call.span.record("held_fence", display(h.fence));
                            self.held.ended(key, &h.holder, h.fence);
                        }
                        None => self.held.seen_free(key),
                    }
                    call.end("broken");
                }
                Err(e) => call.fail(e),
            }
            result
        })
    }

    /// The wrapped backend's `last_break`, in a `lease.backend.last_break`
    /// span.
    ///
    /// # Cancel safety
    ///
    /// The same as the wrapped backend's.
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        let span = tracing::debug_span!(
            "lease.backend.last_break",
            backend = %self.label,
            key = %key,
            by = Empty,
            outcome = Empty,
            latency_ms = Empty,
            error = Empty,
        );
        let call = Call::new(&self.label, "last_break", &span);
        let answer = span.in_scope(|| self.inner.last_break(key));
        Box::pin(async move {
            let result = answer.instrument(span).await;
            match &result {
                Ok(Some(b)) => {
                    call.span.record("by", display(&b.note.by));
                    call.end("found");
                }
                Ok(None) => call.end("none"),
                Err(e) => call.fail(e),
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::fmt::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    use lease_core::{Capabilities, HolderId};
    use lease_fake::Fake;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    use super::*;

    /// A span's name and fields, in the order recorded.
    type SpanFields = (String, Vec<(String, String)>);

    /// Every span with its fields as recorded (`name=value`), and every
    /// line of text any span or event carried.
    #[derive(Clone, Default)]
    struct Capture {
        spans: Arc<Mutex<HashMap<u64, SpanFields>>>,
        text: Arc<Mutex<String>>,
        next: Arc<AtomicU64>,
    }

    struct Fields(Vec<(String, String)>);

    impl Visit for Fields {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.push((field.name().to_owned(), value.to_owned()));
        }
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0.push((field.name().to_owned(), format!("{value:?}")));
        }
    }

    impl Capture {
        fn keep(&self, fields: &[(String, String)]) {
            let mut text = self.text.lock().unwrap();
            for (k, v) in fields {
                let _ = writeln!(text, "{k}={v}");
            }
        }

        /// The spans named `name` whose `key` is `key`, as field maps.
        fn spans(&self, name: &str, key: &str) -> Vec<HashMap<String, String>> {
            let spans = self.spans.lock().unwrap();
            let mut ids: Vec<_> = spans.keys().copied().collect();
            ids.sort_unstable();
            ids.into_iter()
                .filter_map(|id| {
                    let (n, fields) = &spans[&id];
                    let map: HashMap<String, String> = fields.iter().cloned().collect();
                    (n == name && map.get("key").map(String::as_str) == Some(key)).then_some(map)
                })
                .collect()
        }

        /// The one span named `name` on `key`.
        fn span(&self, name: &str, key: &str) -> HashMap<String, String> {
            let mut found = self.spans(name, key);
            assert_eq!(found.len(), 1, "{name} on {key}: {found:?}");
            found.remove(0)
        }
    }

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attrs: &Attributes<'_>) -> Id {
            let mut fields = Fields(Vec::new());
            attrs.record(&mut fields);
            self.keep(&fields.0);
            let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
            self.spans
                .lock()
                .unwrap()
                .insert(id, (attrs.metadata().name().to_owned(), fields.0));
            Id::from_u64(id)
        }
        fn record(&self, id: &Id, values: &Record<'_>) {
            let mut fields = Fields(Vec::new());
            values.record(&mut fields);
            self.keep(&fields.0);
            if let Some((_, all)) = self.spans.lock().unwrap().get_mut(&id.into_u64()) {
                all.extend(fields.0);
            }
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut fields = Fields(Vec::new());
            event.record(&mut fields);
            self.keep(&fields.0);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    fn key(k: &str) -> LeaseKey {
        LeaseKey::new(k).unwrap()
    }

    fn assert_fields(span: &HashMap<String, String>, want: &[(&str, &str)]) {
        for (k, v) in want {
            assert_eq!(
                span.get(*k).map(String::as_str),
                Some(*v),
                "field {k} of {span:?}"
            );
        }
    }

    fn assert_latency(span: &HashMap<String, String>) {
        let ms: f64 = span
            .get("latency_ms")
            .unwrap_or_else(|| panic!("no latency in {span:?}"))
            .parse()
            .unwrap();
        assert!(ms >= 0.0, "{span:?}");
    }

    #[tokio::test]
    async fn every_operation_has_a_span_with_key_holder_fence_outcome_and_latency_but_no_payload() {
        let capture = Capture::default();
        let _guard = tracing::subscriber::set_default(capture.clone());
        tracing::callsite::rebuild_interest_cache();

        let fake = Fake::new();
        let backend = InstrumentedBackend::new(Arc::new(fake.clone()));
        assert_eq!(backend.capabilities(), fake.capabilities());
        let secret = "SECRET-PAYLOAD-b41c";
        let k = key("instrumented/every-op");
        let ks = k.as_str();
        let me = HolderId::random();
        let other = HolderId::random();
        let payload = |s: &str| Payload::new(s.as_bytes().to_vec()).unwrap();

        let req = AcquireRequest::new(k.clone(), me.clone())
            .ttl(Duration::from_secs(9))
            .payload(payload(secret));
        let grant = backend.try_acquire(req).await.unwrap().granted().unwrap();
        let fence = grant.fence().to_string();
        let acquire = capture.span("lease.backend.acquire", ks);
        assert_fields(
            &acquire,
            &[
                ("holder", me.as_str()),
                ("ttl_ms", "9000"),
                ("fence", &fence),
                ("outcome", "granted"),
            ],
        );
        assert_latency(&acquire);

        let refused = AcquireRequest::new(k.clone(), other.clone());
        assert!(matches!(
            backend.try_acquire(refused).await.unwrap(),
            Acquire::Held(_)
        ));
        let held = capture.spans("lease.backend.acquire", ks).remove(1);
        assert_fields(
            &held,
            &[
                ("holder", other.as_str()),
                ("held_by", me.as_str()),
                ("held_fence", &fence),
                ("outcome", "held"),
            ],
        );

        let renewed = match backend.renew(&grant, Some(payload(secret))).await.unwrap() {
            Renewal::Renewed(g) => g,
            Renewal::Lost => panic!("lost"),
        };
        let renew = capture.span("lease.backend.renew", ks);
        assert_fields(
            &renew,
            &[
                ("holder", me.as_str()),
                ("fence", &fence),
                ("new_payload", "true"),
                ("outcome", "renewed"),
            ],
        );
        let left: u64 = renew["deadline_left_ms"].parse().unwrap();
        assert!(left > 0 && left <= 6000, "{renew:?}");
        assert_latency(&renew);

        let state = backend.read(&k).await.unwrap();
        assert_eq!(
            state.holding().unwrap().payload.as_bytes(),
            secret.as_bytes()
        );
        let read = capture.span("lease.backend.read", ks);
        assert_fields(
            &read,
            &[
                ("held_by", me.as_str()),
                ("held_fence", &fence),
                ("outcome", "held"),
            ],
        );
        assert_latency(&read);

        fake.fail_next(1);
        assert!(backend.release(&renewed).await.is_err());
        backend.release(&renewed).await.unwrap();
        let releases = capture.spans("lease.backend.release", ks);
        assert_eq!(releases.len(), 2, "{releases:?}");
        assert_fields(
            &releases[0],
            &[
                ("holder", me.as_str()),
                ("fence", &fence),
                ("outcome", "unavailable"),
            ],
        );
        assert!(releases[0].contains_key("error"), "{releases:?}");
        assert_fields(&releases[1], &[("outcome", "released")]);
        assert_latency(&releases[1]);

        assert_eq!(backend.renew(&renewed, None).await.unwrap(), Renewal::Lost);
        let lost = capture.spans("lease.backend.renew", ks).remove(1);
        assert_fields(&lost, &[("new_payload", "false"), ("outcome", "lost")]);
        assert!(!lost.contains_key("deadline_left_ms"), "{lost:?}");

        let seen = backend.read(&k).await.unwrap();
        let watch = backend.wait_for_change(&k, &seen);
        let taken = AcquireRequest::new(k.clone(), other.clone()).payload(payload(secret));
        let (changed, taken) = tokio::join!(watch, backend.try_acquire(taken));
        changed.unwrap();
        let taken = taken.unwrap().granted().unwrap();
        let watch = capture.span("lease.backend.watch", ks);
        assert_fields(&watch, &[("outcome", "changed")]);
        assert_latency(&watch);

        let note = BreakNote::new("operator", "stuck").with_at_unix_ms(1);
        backend.break_lease(&k, &note).await.unwrap();
        let broke = capture.span("lease.backend.break", ks);
        assert_fields(
            &broke,
            &[
                ("by", "operator"),
                ("reason", "stuck"),
                ("held_by", other.as_str()),
                ("held_fence", &taken.fence().to_string()),
                ("outcome", "broken"),
            ],
        );
        assert_latency(&broke);

        assert!(backend.last_break(&k).await.unwrap().is_some());
        let last = capture.span("lease.backend.last_break", ks);
        assert_fields(&last, &[("by", "operator"), ("outcome", "found")]);
        assert_latency(&last);

        let text = capture.text.lock().unwrap().clone();
        assert!(!text.contains("SECRET"), "a payload was traced:\n{text}");
    }

    #[tokio::test]
    async fn a_dropped_call_is_reported_cancelled_and_an_unsupported_one_by_its_error() {
        let capture = Capture::default();
        let _guard = tracing::subscriber::set_default(capture.clone());
        tracing::callsite::rebuild_interest_cache();

        /// A backend without watch or break (the trait's defaults).
        struct Plain(Fake);
        impl LeaseBackend for Plain {
            fn capabilities(&self) -> Capabilities {
                self.0.capabilities()
            }
            fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
                self.0.try_acquire(req)
            }
            fn renew<'a>(
                &'a self,
                grant: &'a Grant,
                payload: Option<Payload>,
            ) -> BoxFuture<'a, Result<Renewal, Error>> {
                self.0.renew(grant, payload)
            }
            fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
                self.0.release(grant)
            }
            fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
                self.0.read(key)
            }
        }

        let backend = InstrumentedBackend::new(Arc::new(Plain(Fake::new())));
        let k = key("instrumented/cancelled");
        drop(backend.try_acquire(AcquireRequest::new(k.clone(), HolderId::random())));
        let dropped = capture.span("lease.backend.acquire", k.as_str());
        assert_fields(&dropped, &[("outcome", "cancelled")]);
        assert_latency(&dropped);
        assert!(backend.read(&k).await.unwrap().is_free());

        let err = backend
            .wait_for_change(&k, &LeaseState::Free)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
        let watch = capture.span("lease.backend.watch", k.as_str());
        assert_fields(&watch, &[("outcome", "unsupported")]);
        assert!(backend.last_break(&k).await.unwrap().is_none());
        let last = capture.span("lease.backend.last_break", k.as_str());
        assert_fields(&last, &[("outcome", "none")]);
    }

    #[tokio::test]
    async fn every_span_names_the_backend_by_its_label() {
        let capture = Capture::default();
        let _guard = tracing::subscriber::set_default(capture.clone());
        tracing::callsite::rebuild_interest_cache();

        let unnamed = InstrumentedBackend::new(Arc::new(Fake::new()));
        assert_eq!(unnamed.label(), crate::metrics::UNNAMED);
        let k = key("instrumented/unnamed");
        unnamed.read(&k).await.unwrap();
        assert_fields(
            &capture.span("lease.backend.read", k.as_str()),
            &[("backend", "unnamed")],
        );

        let fake = Fake::new();
        let backend = InstrumentedBackend::new(Arc::new(fake.clone())).with_label("nats");
        assert_eq!(backend.label(), "nats");
        let k = key("instrumented/labelled");
        let req = AcquireRequest::new(k.clone(), HolderId::random());
        let grant = backend.try_acquire(req).await.unwrap().granted().unwrap();
        let _ = backend.renew(&grant, None).await.unwrap();
        backend.read(&k).await.unwrap();
        let seen = backend.read(&k).await.unwrap();
        let watch = backend.wait_for_change(&k, &seen);
        let (changed, released) = tokio::join!(watch, backend.release(&grant));
        changed.unwrap();
        released.unwrap();
        let note = BreakNote::new("operator", "test").with_at_unix_ms(1);
        backend.break_lease(&k, &note).await.unwrap();
        backend.last_break(&k).await.unwrap();
        for name in [
            "lease.backend.acquire",
            "lease.backend.renew",
            "lease.backend.release",
            "lease.backend.read",
            "lease.backend.watch",
            "lease.backend.break",
            "lease.backend.last_break",
        ] {
            let spans = capture.spans(name, k.as_str());
            assert!(!spans.is_empty(), "no {name} span");
            for span in &spans {
                assert_fields(span, &[("backend", "nats")]);
            }
        }
    }
}
