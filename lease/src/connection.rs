//! An open backend.

use std::fmt;
use std::sync::Arc;

use lease_core::{HolderId, LeaseBackend};
use lease_keeper::{InstrumentedBackend, Keeper};

use crate::scheme::BackendKind;
use crate::url::BackendUrl;

/// An open backend, from [`connect`](crate::connect) or
/// [`Connect::connect`](crate::Connect::connect).
///
/// Hand [`backend()`](Self::backend) (or [`keeper()`](Self::keeper)) to
/// whatever takes leases; clones share the same client. Before the tokio
/// runtime ends, call [`shutdown`](Self::shutdown): the MongoDB driver
/// cleans a dropped client up in a task spawned at drop time, and if the
/// runtime is tearing down its tasks at that moment that task can panic
/// inside the driver (a harmless but alarming backtrace on stderr); after a
/// shutdown there is nothing left to clean up. For backends with nothing
/// to close it does nothing.
///
/// The backend comes wrapped in an
/// [`InstrumentedBackend`](lease_keeper::InstrumentedBackend): every
/// operation is a `tracing` span with its key, holder, fence, outcome and
/// latency (never the payload) and the backend's name (`etcd`, `nats`…, as
/// [`BackendKind::name`](crate::BackendKind::name) says it), so any `tracing` subscriber the application
/// installs sees them with no code; with this crate's `metrics` feature the
/// same wrapper records the metrics [`metrics`](crate::metrics) lists.
///
/// `Debug` shows the backend and the URL with any password masked.
#[derive(Clone)]
pub struct Connection {
    backend: Arc<dyn LeaseBackend>,
    /// The holder id of every keeper of this connection.
    holder: HolderId,
    url: BackendUrl,
}

impl Connection {
    /// `backend` as opened, wrapped here so that every connection is
    /// instrumented the same way.
    pub(crate) fn new(backend: Arc<dyn LeaseBackend>, url: BackendUrl) -> Self {
        Connection {
            backend: Arc::new(InstrumentedBackend::new(backend).with_label(url.kind().name())),
            holder: HolderId::random(),
            url,
        }
    }

    /// The backend, to take leases on, instrumented (see above).
    pub fn backend(&self) -> Arc<dyn LeaseBackend> {
        Arc::clone(&self.backend)
    }

    /// A [`Keeper`] on the backend: acquiring, renewing in the background,
    /// waiting, loss notification.
    ///
    /// Every keeper of this connection and of its clones has the same holder
    /// id, [`holder`](Self::holder): one name for the process in `lease
    /// status` and break records, however many keepers it makes. Each
    /// acquire still gets a term id of its own drawn from it
    /// ([`HolderId::term`]), so two acquires never share a grant.
    /// [`Keeper::with_holder`] names the holder otherwise. The keeper's
    /// spans and metrics name the backend as the connection's do.
    pub fn keeper(&self) -> Keeper {
        Keeper::new(self.backend())
            .with_holder(self.holder.clone())
            .with_backend_label(self.kind().name())
    }

    /// The holder id of this connection's keepers, drawn at random when it
    /// was opened.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// Which backend this is.
    pub fn kind(&self) -> BackendKind {
        self.url.kind()
    }

    /// The URL it was opened from.
    pub fn url(&self) -> &BackendUrl {
        &self.url
    }

    /// Closes the client of a backend that needs it (MongoDB), for this
    /// connection and all its clones; afterwards their requests fail with
    /// [`Error::Unavailable`](lease_core::Error::Unavailable). Held leases
    /// are not released: they expire by their TTL. A frozen server can hold
    /// it up: wrap it in a timeout where the exit must not wait. This is the
    /// backend's own [`LeaseBackend::shutdown`].
    pub async fn shutdown(&self) {
        self.backend.shutdown().await;
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("backend", &self.kind().name())
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, feature = "fake"))]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use lease_core::LeaseKey;
    use lease_fake::Fake;
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    use super::Connection;
    use crate::url::BackendUrl;

    /// A connection to a fresh fake, as `connect("memory://")` opens it.
    fn memory() -> Connection {
        let url = BackendUrl::parse("memory://").unwrap();
        Connection::new(Arc::new(Fake::new()), url)
    }

    /// Records the names of the spans opened, with their `backend` field
    /// if they have one (`name backend=value`).
    #[derive(Clone, Default)]
    struct Names {
        names: Arc<Mutex<Vec<String>>>,
        next: Arc<AtomicU64>,
    }

    impl Subscriber for Names {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attrs: &Attributes<'_>) -> Id {
            let mut name = attrs.metadata().name().to_owned();
            struct Backend<'a>(&'a mut String);
            impl tracing::field::Visit for Backend<'_> {
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    if field.name() == "backend" {
                        self.0.push_str(&format!(" backend={value:?}"));
                    }
                }
            }
            attrs.record(&mut Backend(&mut name));
            self.names.lock().unwrap().push(name);
            Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed) + 1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// Every keeper of one connection (and of its clones) is the same holder;
    /// each acquire still gets a term id of its own.
    #[tokio::test]
    async fn keepers_of_a_connection_share_its_holder_id() {
        let connection = memory();
        let first = connection.keeper();
        assert_eq!(first.holder(), connection.keeper().holder());
        assert_eq!(first.holder(), connection.clone().keeper().holder());
        assert_eq!(first.holder(), connection.holder());
        let other = memory();
        assert_ne!(first.holder(), other.keeper().holder());
        let a = first
            .acquire(&LeaseKey::new("connection/a").unwrap())
            .await
            .unwrap();
        let b = connection
            .keeper()
            .acquire(&LeaseKey::new("connection/b").unwrap())
            .await
            .unwrap();
        assert_ne!(a.holder(), b.holder());
        a.release().await.unwrap();
        b.release().await.unwrap();
    }

    /// Counts the shutdowns that reach it; the fake does the rest.
    struct Closing {
        fake: Fake,
        shutdowns: Arc<AtomicU64>,
    }

    impl lease_core::LeaseLayer for Closing {
        fn inner(&self) -> &dyn lease_core::LeaseBackend {
            &self.fake
        }
        fn shutdown(&self) -> lease_core::BoxFuture<'_, ()> {
            self.shutdowns.fetch_add(1, Ordering::Relaxed);
            Box::pin(async {})
        }
    }

    /// The shutdown of a connection (and of each clone) is its backend's,
    /// through the instrumentation wrapped around it.
    #[tokio::test]
    async fn a_connection_shuts_its_backend_down() {
        let shutdowns = Arc::new(AtomicU64::new(0));
        let backend = Closing {
            fake: Fake::new(),
            shutdowns: shutdowns.clone(),
        };
        let connection =
            Connection::new(Arc::new(backend), BackendUrl::parse("memory://").unwrap());
        connection.shutdown().await;
        connection.clone().shutdown().await;
        assert_eq!(shutdowns.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_connection_traces_every_operation_of_its_backend() {
        let names = Names::default();
        let _guard = tracing::subscriber::set_default(names.clone());
        tracing::callsite::rebuild_interest_cache();
        let connection = memory();
        let key = LeaseKey::new("connection/traced").unwrap();
        assert!(connection.backend().read(&key).await.unwrap().is_free());
        let names = names.names.lock().unwrap().clone();
        assert!(
            names
                .iter()
                .any(|n| n == "lease.backend.read backend=memory"),
            "no read span naming the backend: {names:?}"
        );
        let keeper = connection.keeper();
        assert_eq!(keeper.backend_label(), "memory");
        keeper
            .try_acquire(&key)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
}
