//! Fenced writes over any [`ObjectStore`]: each object remembers the fence of
//! its last writer, and a write at a lower fence is refused.

use std::fmt;

use bytes::Bytes;
use lease_core::Fence;
use object_store::path::Path;
use object_store::{
    Attribute, AttributeValue, Attributes, GetOptions, GetResult, ObjectStore, PutMode, PutOptions,
    PutPayload, PutResult, UpdateVersion,
};

use crate::Stale;

/// The user-metadata key that carries an object's fence (`x-amz-meta-lease-fence`
/// on S3).
pub const FENCE_ATTRIBUTE: &str = "lease-fence";

/// The user-metadata key that marks a deleted object: an empty object kept
/// so that its fence outlives the delete.
pub const TOMBSTONE_ATTRIBUTE: &str = "lease-tombstone";

/// How often a write is retried when another writer changed the object
/// between this write's read and its conditional put.
const CONTENTION_RETRIES: usize = 16;

/// An [`ObjectStore`] whose writes carry the writer's fence and are
/// conditional on the object's version (If-Match / If-None-Match), refusing
/// to overwrite an object last written at a higher fence.
///
/// Each [`put`](FencedStore::put) reads the object's fence, refuses a lower
/// one with [`FencedError::Stale`], and writes with the object's ETag as a
/// precondition, so a higher-fenced write that lands between the read and
/// the write makes this one read again and be refused — never overwrite it.
/// [`delete`](FencedStore::delete) leaves an empty tombstone that keeps the
/// fence, since a plain delete would let any fence write again.
///
/// The store must support conditional puts (`PutMode::Create` and
/// `PutMode::Update`) and user metadata: object_store's `InMemory` and
/// `LocalFileSystem`, and S3 (`AmazonS3Builder::with_conditional_put(S3ConditionalPut::ETagMatch)`,
/// the default) do. An object written without a fence (outside this wrapper)
/// counts as never fenced: any fence may overwrite it.
///
/// ```
/// use lease_core::Fence;
/// use lease_fence::{FencedError, FencedStore};
/// use object_store::{memory::InMemory, path::Path};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), FencedError> {
/// let store = FencedStore::new(InMemory::new());
/// let path = Path::from("reports/daily.json");
/// store.put(&path, "new holder".into(), Fence(8)).await?;
/// let late = store.put(&path, "paused old holder".into(), Fence(7)).await;
/// assert!(matches!(late, Err(FencedError::Stale(_))));
/// let object = store.get(&path).await?.expect("written");
/// assert_eq!((object.fence, &object.bytes[..]), (Some(Fence(8)), &b"new holder"[..]));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FencedStore<S> {
    inner: S,
}

/// An object read through a [`FencedStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FencedObject {
    /// Its contents.
    pub bytes: Bytes,
    /// The fence of its last writer, or `None` if it was written without one.
    pub fence: Option<Fence>,
}

/// Why a [`FencedStore`] operation did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FencedError {
    /// The object was last written at a higher fence.
    #[error(transparent)]
    Stale(#[from] Stale),
    /// The object's fence attribute is not a fence; the object was left as
    /// it is.
    #[error("object {location} has a malformed {FENCE_ATTRIBUTE} attribute {value:?}")]
    Corrupt {
        /// The object.
        location: String,
        /// The attribute's value.
        value: String,
    },
    /// Other writers kept changing the object between this write's read and
    /// its conditional put; nothing was written.
    #[error(
        "object {location} kept changing under {attempts} conditional writes; nothing was written"
    )]
    Contention {
        /// The object.
        location: String,
        /// Conditional writes tried.
        attempts: usize,
    },
    /// The store failed; for a write, whether it happened is unknown unless
    /// the error says otherwise.
    #[error("object store")]
    Store(#[source] object_store::Error),
}

/// What a read of the object's current state found.
struct Current {
    fence: Option<Fence>,
    tombstone: bool,
    version: UpdateVersion,
}

impl<S: ObjectStore> FencedStore<S> {
    /// Fences the writes to `inner` made through the returned store.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The wrapped store, for reads and listings that need no fence.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Writes `payload` to `location` at `fence`, unless the object was last
    /// written at a higher fence.
    ///
    /// # Errors
    /// [`FencedError::Stale`] when the object's fence is higher (nothing
    /// written); [`FencedError::Corrupt`] when its fence attribute is not a
    /// fence (nothing written); [`FencedError::Contention`] when other
    /// writers changed it under every attempt; [`FencedError::Store`] for
    /// the store's own errors.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped during its conditional put, the write may or
    /// may not have happened, as with any object store write. It can never
    /// have overwritten a higher fence.
    pub async fn put(
        &self,
        location: &Path,
        payload: PutPayload,
        fence: Fence,
    ) -> Result<PutResult, FencedError> {
        self.write(location, payload, fence, false).await
    }

    /// Deletes `location` at `fence`, unless it was last written at a higher
    /// fence: the object becomes an empty tombstone that keeps the fence, so
    /// a stale writer cannot re-create it. [`get`](FencedStore::get) reads a
    /// tombstone as absent.
    ///
    /// # Errors
    /// As [`put`](FencedStore::put).
    ///
    /// # Cancel safety
    ///
    /// As [`put`](FencedStore::put).
    pub async fn delete(&self, location: &Path, fence: Fence) -> Result<PutResult, FencedError> {
        self.write(location, PutPayload::new(), fence, true).await
    }

    /// Reads `location`: `None` when it does not exist or was deleted
    /// through [`delete`](FencedStore::delete).
    ///
    /// # Errors
    /// [`FencedError::Corrupt`] for a malformed fence attribute;
    /// [`FencedError::Store`] for the store's own errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn get(&self, location: &Path) -> Result<Option<FencedObject>, FencedError> {
        let result = match self.inner.get_opts(location, GetOptions::default()).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(FencedError::Store(e)),
        };
        let current = current(location, &result)?;
        if current.tombstone {
            return Ok(None);
        }
        let bytes = result.bytes().await.map_err(FencedError::Store)?;
        Ok(Some(FencedObject {
            bytes,
            fence: current.fence,
        }))
    }

    /// The fence `location` was last written at (kept by a tombstone too),
    /// or `None` for an object that does not exist or was written without
    /// one.
    ///
    /// # Errors
    /// As [`get`](FencedStore::get).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn fence(&self, location: &Path) -> Result<Option<Fence>, FencedError> {
        Ok(self.head(location).await?.and_then(|c| c.fence))
    }

    async fn head(&self, location: &Path) -> Result<Option<Current>, FencedError> {
        let options = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        match self.inner.get_opts(location, options).await {
            Ok(result) => current(location, &result).map(Some),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(FencedError::Store(e)),
        }
    }

    async fn write(
        &self,
        location: &Path,
        payload: PutPayload,
        fence: Fence,
        tombstone: bool,
    ) -> Result<PutResult, FencedError> {
        let mut attributes = Attributes::new();
        attributes.insert(
            Attribute::Metadata(FENCE_ATTRIBUTE.into()),
            AttributeValue::from(fence.get().to_string()),
        );
        if tombstone {
            attributes.insert(
                Attribute::Metadata(TOMBSTONE_ATTRIBUTE.into()),
                AttributeValue::from("true"),
            );
        }
        for _ in 0..CONTENTION_RETRIES {
            let mode = match self.head(location).await? {
                Some(current) => {
                    if let Some(seen) = current.fence.filter(|seen| fence < *seen) {
                        return Err(FencedError::Stale(Stale {
                            resource: location.to_string(),
                            offered: fence,
                            seen,
                        }));
                    }
                    PutMode::Update(current.version)
                }
                None => PutMode::Create,
            };
            let options = PutOptions {
                mode,
                attributes: attributes.clone(),
                ..PutOptions::default()
            };
            match self
                .inner
                .put_opts(location, payload.clone(), options)
                .await
            {
                Ok(done) => return Ok(done),
                // Someone wrote between the read and the write: read again.
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => continue,
                Err(e) => return Err(FencedError::Store(e)),
            }
        }
        Err(FencedError::Contention {
            location: location.to_string(),
            attempts: CONTENTION_RETRIES,
        })
    }
}

fn current(location: &Path, result: &GetResult) -> Result<Current, FencedError> {
    let attribute = |name: &'static str| result.attributes.get(&Attribute::Metadata(name.into()));
    let fence = match attribute(FENCE_ATTRIBUTE) {
        None => None,
        Some(v) => Some(
            v.trim()
                .parse::<u64>()
                .map(Fence)
                .map_err(|_| FencedError::Corrupt {
                    location: location.to_string(),
                    value: v.to_string(),
                })?,
        ),
    };
    Ok(Current {
        fence,
        tombstone: attribute(TOMBSTONE_ATTRIBUTE).is_some_and(|v| v.as_ref() == "true"),
        version: UpdateVersion {
            e_tag: result.meta.e_tag.clone(),
            version: result.meta.version.clone(),
        },
    })
}

impl<S: fmt::Display> fmt::Display for FencedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencedStore({})", self.inner)
    }
}
