//! Building an [`ObjectStoreBackend`] on a store, checking that the store
//! honours preconditions, and the value's accessors. (Building the S3 client
//! itself is `config.rs`'s.)

use std::sync::Arc;

use lease_core::Error;
use object_store::path::Path;
use object_store::ObjectStore;

use crate::backend::{Inner, ObjectStoreBackend};
use crate::cache::KeyCache;
use crate::conditional::ConditionalStore;

impl ObjectStoreBackend {
    /// Leases under `prefix` (e.g. `"leases"`, or `""` for the store's root)
    /// in `store`.
    ///
    /// Nothing is sent yet; the first write checks that the store honours
    /// preconditions (see [`probe`](Self::probe)).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when `prefix` is not a valid object path.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Self, Error> {
        let prefix = Path::parse(prefix).map_err(|_| Error::InvalidKey {
            key: prefix.to_owned(),
            reason: "the prefix must be an object path without empty, `.` or `..` segments",
        })?;
        Ok(ObjectStoreBackend {
            inner: Arc::new(Inner {
                conditional: ConditionalStore::new(store, prefix.clone()),
                prefix,
                keys: KeyCache::default(),
            }),
        })
    }

    /// The store this client writes to.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.conditional.store
    }

    /// Checks now (instead of at the first write) that the store refuses a
    /// create over an existing object and an update with a wrong ETag.
    ///
    /// # Errors
    /// [`Error::PreconditionsIgnored`] when it accepts either: such a store
    /// cannot exclude a second holder. [`Error::Unsupported`] when it has no
    /// conditional puts at all (e.g. `LocalFileSystem`, S3 with conditional
    /// put disabled); [`Error::Unavailable`] when the store cannot be reached.
    pub async fn probe(&self) -> Result<(), Error> {
        self.inner.conditional.ensure_probed().await
    }

    /// How much this client remembers about keys: the number of keys it
    /// keeps an observation or a written payload for, and the payload bytes
    /// it keeps. Bounded, however many distinct keys the client touches.
    pub fn cached_keys(&self) -> (usize, usize) {
        self.inner.keys.sizes()
    }
}
