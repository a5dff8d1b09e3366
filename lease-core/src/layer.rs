//! [`LeaseLayer`]: a backend that wraps another and changes only some of its
//! operations.

use crate::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Grant, LastBreak,
    LeaseBackend, LeaseKey, LeaseState, Payload, Renewal,
};

/// A wrapper around another backend — for timing, recording, fault
/// injection, metrics — that overrides only the operations it changes and
/// passes every other one to [`inner`](LeaseLayer::inner) unchanged.
///
/// Every `LeaseLayer` is a [`LeaseBackend`]. Writing a wrapper this way
/// instead of implementing [`LeaseBackend`] by hand means an operation the
/// wrapper does not mention is *forwarded*, never answered by the trait's
/// default (a `break_lease` that says "unsupported", a `last_break` that says
/// "never broken", a watch that is not one): the wrapper behaves exactly as
/// its inner backend except where it says otherwise, also for operations
/// added to the contract later.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use lease_core::{AcquireRequest, Acquire, BoxFuture, Error, LeaseBackend, LeaseLayer};
///
/// /// Counts acquire attempts; everything else passes through.
/// struct Counting {
///     inner: Arc<dyn LeaseBackend>,
///     acquires: AtomicU64,
/// }
///
/// impl LeaseLayer for Counting {
///     fn inner(&self) -> &dyn LeaseBackend {
///         &*self.inner
///     }
///     fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
///         self.acquires.fetch_add(1, Ordering::Relaxed);
///         self.inner.try_acquire(req)
///     }
/// }
///
/// let counting: Arc<dyn LeaseBackend> = Arc::new(Counting {
///     inner: Arc::new(lease_fake::Fake::new()),
///     acquires: AtomicU64::new(0),
/// });
/// assert!(counting.capabilities().watch); // the fake's, forwarded
/// ```
///
/// Its methods share their names with [`LeaseBackend`]'s: call the inner
/// backend's through [`inner`](LeaseLayer::inner), and a wrapper's own
/// through `LeaseBackend` (e.g. as `Arc<dyn LeaseBackend>`).
pub trait LeaseLayer: Send + Sync {
    /// The backend this one wraps.
    fn inner(&self) -> &dyn LeaseBackend;

    /// [`LeaseBackend::capabilities`]; by default the inner backend's.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// [`LeaseBackend::try_acquire`]; by default the inner backend's.
    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        self.inner().try_acquire(req)
    }

    /// [`LeaseBackend::renew`]; by default the inner backend's.
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        self.inner().renew(grant, payload)
    }

    /// [`LeaseBackend::release`]; by default the inner backend's.
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        self.inner().release(grant)
    }

    /// [`LeaseBackend::read`]; by default the inner backend's.
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        self.inner().read(key)
    }

    /// [`LeaseBackend::wait_for_change`]; by default the inner backend's.
    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner().wait_for_change(key, seen)
    }

    /// [`LeaseBackend::break_lease`]; by default the inner backend's.
    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        self.inner().break_lease(key, note)
    }

    /// [`LeaseBackend::last_break`]; by default the inner backend's.
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        self.inner().last_break(key)
    }

    /// [`LeaseBackend::shutdown`]; by default the inner backend's.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.inner().shutdown()
    }
}

impl<L: LeaseLayer> LeaseBackend for L {
    fn capabilities(&self) -> Capabilities {
        LeaseLayer::capabilities(self)
    }
    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        LeaseLayer::try_acquire(self, req)
    }
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        LeaseLayer::renew(self, grant, payload)
    }
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        LeaseLayer::release(self, grant)
    }
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        LeaseLayer::read(self, key)
    }
    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        LeaseLayer::wait_for_change(self, key, seen)
    }
    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        LeaseLayer::break_lease(self, key, note)
    }
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        LeaseLayer::last_break(self, key)
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        LeaseLayer::shutdown(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::time::{Duration, Instant};

    use super::*;
    use crate::{Fence, HolderId, Version};

    /// Answers every operation with an error naming it, where the trait's
    /// defaults would answer otherwise, and counts its shutdowns.
    #[derive(Default)]
    struct Probe {
        shutdowns: std::sync::atomic::AtomicUsize,
    }

    fn named(op: &str) -> Error {
        Error::Unavailable {
            detail: format!("probe: {op}"),
            source: None,
        }
    }

    impl LeaseBackend for Probe {
        fn capabilities(&self) -> Capabilities {
            Capabilities::new(
                crate::TimeAuthority::LocalObservation,
                crate::TtlRule::new(Duration::from_secs(3)..=Duration::from_secs(7)),
            )
            .with_max_payload(3)
        }
        fn try_acquire(&self, _: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
            Box::pin(async { Err(named("try_acquire")) })
        }
        fn renew<'a>(
            &'a self,
            _: &'a Grant,
            _: Option<Payload>,
        ) -> BoxFuture<'a, Result<Renewal, Error>> {
            Box::pin(async { Err(named("renew")) })
        }
        fn release<'a>(&'a self, _: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin(async { Err(named("release")) })
        }
        fn read<'a>(&'a self, _: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
            Box::pin(async { Err(named("read")) })
        }
        fn wait_for_change<'a>(
            &'a self,
            _: &'a LeaseKey,
            _: &'a LeaseState,
        ) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin(async { Err(named("wait_for_change")) })
        }
        fn break_lease<'a>(
            &'a self,
            _: &'a LeaseKey,
            _: &'a BreakNote,
        ) -> BoxFuture<'a, Result<Broken, Error>> {
            Box::pin(async { Err(named("break_lease")) })
        }
        fn last_break<'a>(
            &'a self,
            _: &'a LeaseKey,
        ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
            Box::pin(async { Err(named("last_break")) })
        }
        fn shutdown(&self) -> BoxFuture<'_, ()> {
            self.shutdowns
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Box::pin(async {})
        }
    }

    /// Overrides nothing.
    struct PassThrough(Probe);

    impl LeaseLayer for PassThrough {
        fn inner(&self) -> &dyn LeaseBackend {
            &self.0
        }
    }

    /// Polls a future that is ready at once (every future here is).
    fn now<T>(f: BoxFuture<'_, T>) -> T {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = f;
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(t) => t,
            std::task::Poll::Pending => panic!("the probe answers at once"),
        }
    }

    fn said<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
        match r {
            Err(Error::Unavailable { detail, .. }) => detail,
            other => format!("not forwarded: {other:?}"),
        }
    }

    #[test]
    fn a_layer_that_overrides_nothing_forwards_every_operation() {
        let probe = Arc::new(PassThrough(Probe::default()));
        let layer: Arc<dyn LeaseBackend> = probe.clone();
        let key = LeaseKey::new("k").unwrap();
        let holder = HolderId::new("h").unwrap();
        let grant = Grant::new(
            key.clone(),
            holder.clone(),
            Fence(1),
            Duration::from_secs(1),
            Instant::now(),
            Version::new("v"),
        );
        let note = BreakNote::new("me", "test");
        assert_eq!(layer.capabilities(), Probe::default().capabilities());
        assert_eq!(
            said(now(
                layer.try_acquire(AcquireRequest::new(key.clone(), holder))
            )),
            "probe: try_acquire"
        );
        assert_eq!(said(now(layer.renew(&grant, None))), "probe: renew");
        assert_eq!(said(now(layer.release(&grant))), "probe: release");
        assert_eq!(said(now(layer.read(&key))), "probe: read");
        assert_eq!(
            said(now(layer.wait_for_change(&key, &LeaseState::Free))),
            "probe: wait_for_change"
        );
        assert_eq!(
            said(now(layer.break_lease(&key, &note))),
            "probe: break_lease"
        );
        assert_eq!(said(now(layer.last_break(&key))), "probe: last_break");
        now(layer.shutdown());
        assert_eq!(
            probe.0.shutdowns.load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }
}
