//! Fenced writes over any [`ObjectStore`]: each object remembers the fence of
//! its last writer, and a write at a lower fence is refused.

use std::fmt;

use bytes::Bytes;
use lease_core::{Fence, HolderId};
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

/// The user-metadata key that carries the nonce of the write that made the
/// object, repeated in the frame at the start of its bytes. Its presence
/// marks an object written in the framed format.
pub const NONCE_ATTRIBUTE: &str = "lease-fence-nonce";

/// What every framed object's bytes begin with, before the fence, the nonce
/// and a newline.
const FRAME_MAGIC: &str = "lease-fence/1";

/// How often a write is retried when another writer changed the object
/// between this write's read and its conditional put.
const CONTENTION_RETRIES: usize = 16;

/// An [`ObjectStore`] whose writes carry the writer's fence and are
/// conditional on the object's version (If-Match / If-None-Match), refusing
/// to overwrite an object last written at a higher fence.
///
/// Each [`put`](FencedStore::put) reads the object's fence, refuses a lower
/// one with [`FencedError::Stale`], and writes with the object's version as
/// a precondition, so a higher-fenced write that lands between the read and
/// the write makes this one read again and be refused — never overwrite it.
/// [`delete`](FencedStore::delete) leaves an empty tombstone that keeps the
/// fence, since a plain delete would let any fence write again.
///
/// # The stored format
///
/// A precondition on an ETag only proves nothing was written since the read
/// if no two writes can leave the same ETag — and S3's ETag is a hash of
/// the bytes alone: two tombstones, or the same bytes rewritten at a higher
/// fence, would share it, and a stale writer's If-Match would still match.
/// So every write stores its bytes behind a one-line frame,
/// `lease-fence/1 <fence> <nonce>\n`, with a fresh random nonce: no two
/// writes store the same bytes, whatever the caller writes. The nonce is
/// also kept in the [`NONCE_ATTRIBUTE`] metadata, so that a write whose
/// answer was lost, or that object_store retried after it was applied, is
/// recognised as this write's own. [`get`](FencedStore::get) strips the
/// frame; [`inner`](FencedStore::inner) reads the framed bytes as stored.
///
/// An object without [`NONCE_ATTRIBUTE`] (written before this format, or
/// outside this wrapper) is read as its bytes, unframed, and the first
/// fenced write replaces it with a framed one — unless it has no metadata
/// at all and its bytes begin with a frame: that is a framed object whose
/// metadata was lost (a copy or restore that kept only the bytes, a store
/// that drops user metadata), and its frame's fence is honoured. (An
/// unfenced object whose own bytes happen to begin with
/// `lease-fence/1 ` is read the same way.) Writers of the earlier,
/// unframed format must not write the same objects at the same time as
/// this one: their writes can still share an ETag.
///
/// # Stores
///
/// The store must support conditional puts (`PutMode::Create` and
/// `PutMode::Update`) and user metadata (attributes). Tested here:
/// object_store's `InMemory`, and S3 through `AmazonS3Builder` with its
/// default conditional put (`S3ConditionalPut::ETagMatch`), on an S3
/// server that honours `If-Match` and `If-None-Match`. object_store's
/// `LocalFileSystem` does **not** work: it refuses `PutMode::Update` and
/// attributes, so every write fails with [`FencedError::Store`] and
/// nothing is written. Other stores (GCS, Azure) are untested; a store
/// that needs the object's version for a conditional update gets the one
/// it reported on the read. An object written without a fence (outside
/// this wrapper) counts as never fenced: any fence may overwrite it.
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
    /// The object's bytes do not begin with the frame its
    /// [`NONCE_ATTRIBUTE`] announces; the object was left as it is.
    #[error("object {location} is marked framed ({NONCE_ATTRIBUTE}) but its bytes do not begin with its frame")]
    CorruptFrame {
        /// The object.
        location: String,
    },
    /// Whether this write was applied is unknown: a conditional put of it
    /// was refused after an earlier attempt may have been applied (object_store
    /// retries a write after a 5xx or a 409, and the retry of an applied
    /// write is refused; so is a put whose object changed under it), and the
    /// object no longer shows this write — it was either never written, or
    /// written and then overwritten by another writer. Not an answer that
    /// nothing was written.
    #[error("object {location}: whether this write was applied is unknown (a conditional put was refused after an attempt that may have been applied; the object now holds fence {seen:?})")]
    OutcomeUnknown {
        /// The object.
        location: String,
        /// The fence the object held when this write gave up, if any.
        seen: Option<Fence>,
    },
    /// The store failed; for a write, whether it happened is unknown unless
    /// the error says otherwise.
    #[error("object store")]
    Store(#[source] object_store::Error),
}

/// What a read of the object's current state found.
struct Current {
    fence: Option<Fence>,
    /// The nonce of the framed write that made it; `None` for an unframed
    /// object.
    nonce: Option<String>,
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
    /// written); [`FencedError::Corrupt`] when its fence attribute is
    /// malformed, [`FencedError::CorruptFrame`] when an object without
    /// metadata begins with a damaged frame (nothing written either way; a
    /// put reads the metadata, not the bytes, of an object that has it, so
    /// a frame damaged behind its metadata is found by
    /// [`get`](FencedStore::get));
    /// [`FencedError::OutcomeUnknown`] when a conditional put was refused
    /// after an attempt that may have been applied, and the object no longer
    /// shows it; [`FencedError::Store`] for the store's own errors (whether
    /// the write happened is unknown).
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
        let bytes = match (&current.nonce, current.fence) {
            (Some(nonce), Some(fence)) => {
                let header = header(fence, nonce);
                if !bytes.starts_with(header.as_bytes()) {
                    return Err(FencedError::CorruptFrame {
                        location: location.to_string(),
                    });
                }
                bytes.slice(header.len()..)
            }
            (Some(_), None) => {
                return Err(FencedError::CorruptFrame {
                    location: location.to_string(),
                })
            }
            (None, Some(_)) => bytes,
            // No metadata at all: a framed object whose metadata was lost
            // (a copy, a restore, a store that drops it) still says its
            // fence in its bytes.
            (None, None) => match frame(location, &bytes)? {
                Some((fence, _, len)) => {
                    return Ok(Some(FencedObject {
                        bytes: bytes.slice(len..),
                        fence: Some(fence),
                    }))
                }
                None => bytes,
            },
        };
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
        let result = match self.inner.get_opts(location, options).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(FencedError::Store(e)),
        };
        let found = current(location, &result)?;
        if found.fence.is_some() || found.nonce.is_some() || result.meta.size == 0 {
            return Ok(Some(found));
        }
        // No metadata at all: read the start of the bytes, where a framed
        // object whose metadata was lost still carries its fence — never
        // take it for an object nobody fenced. The version comes from this
        // same read, so a conditional put on it checks what was read.
        let options = GetOptions {
            range: Some((0..result.meta.size.min(FRAME_MAX)).into()),
            ..GetOptions::default()
        };
        let result = match self.inner.get_opts(location, options).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(FencedError::Store(e)),
        };
        let mut found = current(location, &result)?;
        let start = result.bytes().await.map_err(FencedError::Store)?;
        if let Some((fence, nonce, _)) = frame(location, &start)? {
            found.fence = Some(fence);
            found.nonce = Some(nonce);
        }
        Ok(Some(found))
    }

    async fn write(
        &self,
        location: &Path,
        payload: PutPayload,
        fence: Fence,
        tombstone: bool,
    ) -> Result<PutResult, FencedError> {
        let nonce = HolderId::random().as_str().to_owned();
        let mut attributes = Attributes::new();
        attributes.insert(
            Attribute::Metadata(FENCE_ATTRIBUTE.into()),
            AttributeValue::from(fence.get().to_string()),
        );
        attributes.insert(
            Attribute::Metadata(NONCE_ATTRIBUTE.into()),
            AttributeValue::from(nonce.clone()),
        );
        if tombstone {
            attributes.insert(
                Attribute::Metadata(TOMBSTONE_ATTRIBUTE.into()),
                AttributeValue::from("true"),
            );
        }
        let framed: PutPayload = std::iter::once(Bytes::from(header(fence, &nonce)))
            .chain(payload.iter().cloned())
            .collect();
        // Set once a put was refused: it may have been object_store's retry
        // of an attempt that was applied, so from then on a refusal cannot
        // mean "nothing written".
        let mut maybe_applied = false;
        let mut seen = None;
        for _ in 0..CONTENTION_RETRIES {
            let current = self.head(location).await?;
            let mode = match current {
                Some(current) => {
                    if current.nonce.as_deref() == Some(nonce.as_str()) {
                        return Ok(written(current.version));
                    }
                    seen = current.fence;
                    if let Some(seen) = current.fence.filter(|seen| fence < *seen) {
                        if maybe_applied {
                            break;
                        }
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
            match self.inner.put_opts(location, framed.clone(), options).await {
                Ok(done) => return Ok(done),
                // Someone wrote between the read and the write, or this was
                // the retry of an attempt that was applied: read again.
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => maybe_applied = true,
                Err(e) => {
                    // The answer was lost, perhaps after the write was applied:
                    // if the object shows this write, it was.
                    if let Ok(Some(current)) = self.head(location).await {
                        if current.nonce.as_deref() == Some(nonce.as_str()) {
                            return Ok(written(current.version));
                        }
                    }
                    return Err(FencedError::Store(e));
                }
            }
        }
        Err(FencedError::OutcomeUnknown {
            location: location.to_string(),
            seen,
        })
    }
}

/// The frame every write's bytes begin with: no two writes share it.
fn header(fence: Fence, nonce: &str) -> String {
    format!("{FRAME_MAGIC} {} {nonce}\n", fence.get())
}

/// The longest frame: the magic, a 20-digit fence, a nonce, spaces and the
/// newline, with room to spare.
const FRAME_MAX: u64 = 256;

/// The frame `bytes` begin with, if they begin with one: its fence, its
/// nonce and its length. Bytes that begin with the magic but not with a
/// whole frame are a [`FencedError::CorruptFrame`].
fn frame(location: &Path, bytes: &[u8]) -> Result<Option<(Fence, String, usize)>, FencedError> {
    let magic = format!("{FRAME_MAGIC} ");
    if !bytes.starts_with(magic.as_bytes()) {
        return Ok(None);
    }
    let corrupt = || FencedError::CorruptFrame {
        location: location.to_string(),
    };
    let end = bytes.iter().position(|b| *b == b'\n').ok_or_else(corrupt)?;
    let line = std::str::from_utf8(&bytes[magic.len()..end]).map_err(|_| corrupt())?;
    let (fence, nonce) = line.split_once(' ').ok_or_else(corrupt)?;
    let fence = fence.parse::<u64>().map_err(|_| corrupt())?;
    if nonce.is_empty() || nonce.contains(' ') {
        return Err(corrupt());
    }
    Ok(Some((Fence(fence), nonce.to_owned(), end + 1)))
}

fn written(version: UpdateVersion) -> PutResult {
    PutResult {
        e_tag: version.e_tag,
        version: version.version,
        extensions: Default::default(),
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
        nonce: attribute(NONCE_ATTRIBUTE).map(|v| v.to_string()),
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
