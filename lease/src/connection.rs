//! An open backend.

use std::fmt;
use std::sync::Arc;

use lease_core::LeaseBackend;
use lease_keeper::Keeper;

use crate::url::{BackendKind, BackendUrl};

/// An open backend, from [`connect`](crate::connect) or
/// [`Connect::connect`](crate::Connect::connect).
///
/// Hand [`backend()`](Self::backend) (or [`keeper()`](Self::keeper)) to
/// whatever takes leases; clones share the same client. Before the tokio
/// runtime ends, call [`shutdown`](Self::shutdown): the MongoDB driver
/// cleans a dropped client up in a task spawned at drop time, and if the
/// runtime is tearing down its tasks at that moment that task can panic
/// inside the driver (a harmless but alarming backtrace on stderr); after a
/// shutdown there is nothing left to clean up. For the other backends it
/// does nothing.
///
/// `Debug` shows the backend and the URL with any password masked.
#[derive(Clone)]
pub struct Connection {
    backend: Arc<dyn LeaseBackend>,
    url: BackendUrl,
    closer: Closer,
}

/// What needs an explicit shutdown.
#[derive(Clone)]
pub(crate) enum Closer {
    #[cfg_attr(
        not(any(feature = "etcd", feature = "nats", feature = "s3", feature = "fake")),
        allow(dead_code)
    )]
    Nothing,
    #[cfg(feature = "mongo")]
    Mongo(lease_mongo::MongoBackend),
}

impl Connection {
    pub(crate) fn new(backend: Arc<dyn LeaseBackend>, url: BackendUrl, closer: Closer) -> Self {
        Connection {
            backend,
            url,
            closer,
        }
    }

    /// The backend, to take leases on.
    pub fn backend(&self) -> Arc<dyn LeaseBackend> {
        Arc::clone(&self.backend)
    }

    /// A [`Keeper`] on the backend, with a random holder id of its own:
    /// acquiring, renewing in the background, waiting, loss notification.
    pub fn keeper(&self) -> Keeper {
        Keeper::new(self.backend())
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
    /// it up: wrap it in a timeout where the exit must not wait.
    pub async fn shutdown(&self) {
        match &self.closer {
            Closer::Nothing => {}
            #[cfg(feature = "mongo")]
            Closer::Mongo(m) => m.shutdown().await,
        }
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
