//! The conformance harness: clients of one store (object_store's in-memory
//! store or the S3 server) under a prefix of their own.

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::Harness;
use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};
use lease_s3::ObjectStoreBackend;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::Faulty;

/// Clients of one store under one prefix. Expiry is judged by each client's
/// own clock, so `pass` really sleeps.
pub struct ObjectHarness {
    name: &'static str,
    store: Arc<Faulty>,
    prefix: String,
    model_cases: u32,
}

impl ObjectHarness {
    fn new(name: &'static str, store: Arc<dyn ObjectStore>, model_cases: u32) -> Self {
        ObjectHarness {
            name,
            store: Faulty::new(store),
            prefix: super::unique_prefix("conformance"),
            model_cases,
        }
    }

    /// On a fresh in-memory store (`s3_memory`).
    pub fn memory() -> Result<Self, String> {
        Ok(Self::new("s3-memory", Arc::new(InMemory::new()), 48))
    }

    /// On the test process's S3 server (`s3`).
    pub fn s3() -> Result<Self, String> {
        // Each model case is a few dozen requests on a server that serves one
        // request at a time: fewer cases keep the property within minutes.
        Ok(Self::new("s3", super::s3_store()?, 12))
    }
}

impl Harness for ObjectHarness {
    fn name(&self) -> &'static str {
        self.name
    }

    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>> {
        Box::pin(async move {
            let store: Arc<dyn ObjectStore> = self.store.clone();
            let c: Arc<dyn LeaseBackend> = Arc::new(ObjectStoreBackend::new(store, &self.prefix)?);
            Ok(c)
        })
    }

    fn pass(&self, d: Duration) -> BoxFuture<'_, ()> {
        // Observers compare their own monotonic instants; a little slack covers
        // the request that starts the observation.
        Box::pin(tokio::time::sleep(d + Duration::from_millis(100)))
    }

    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        Some(Box::pin(async move {
            let path = Path::parse(format!("{}/{}", self.prefix, key.as_str()))
                .map_err(|e| Error::Backend(e.into()))?;
            self.store
                .inner
                .put(&path, PutPayload::from_static(b"not json"))
                .await
                .map_err(|e| Error::Backend(e.into()))?;
            Ok(())
        }))
    }

    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        // As an operator would: a plain DELETE of the lease object.
        Some(Box::pin(async move {
            let path = Path::parse(format!("{}/{}", self.prefix, key.as_str()))
                .map_err(|e| Error::Backend(e.into()))?;
            self.store
                .inner
                .delete(&path)
                .await
                .map_err(|e| Error::Backend(e.into()))
        }))
    }

    fn set_latency(&self, latency: Duration) -> bool {
        self.store.set_latency(latency);
        true
    }

    fn model_cases(&self) -> u32 {
        self.model_cases
    }
}
