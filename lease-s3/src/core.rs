//! The conditional-write protocol shared by [`ObjectStoreBackend`](crate::ObjectStoreBackend)
//! and [`BucketLease`](crate::BucketLease).
//!
//! Every change to a lease object is a conditional PUT: `Create` when no
//! object exists, `Update` (If-Match on the ETag we read or wrote) otherwise.
//! Objects are never deleted, so the fence they carry never goes backwards.
//! Expiry is never read from the object: a foreign record counts as expired
//! only once the caller's [`Observation`] saw the very same version for at
//! least its TTL on the local monotonic clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, HolderId, MAX_PAYLOAD_LEN};
use object_store::path::Path;
use object_store::{
    GetResult, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};
use tokio::time::Instant;

use crate::record::{Record, State};

/// How many conditional writes one operation makes before giving up on a
/// key that keeps changing under it.
const MAX_WRITES: u32 = 3;

/// The largest object read as a lease record: the largest payload plus ample
/// room for the header line. Anything larger at a lease path is not ours (a
/// data object under an empty or overlapping prefix) and is refused by its
/// size before its body is read.
pub(crate) const MAX_RECORD_LEN: u64 = MAX_PAYLOAD_LEN as u64 + 4096;

/// The body of a GET of a lease object, refused by size before it is read.
pub(crate) async fn read_body(
    path: &Path,
    name: &str,
    res: GetResult,
) -> Result<impl AsRef<[u8]>, Error> {
    let size = res.meta.size;
    if size > MAX_RECORD_LEN {
        return Err(oversize(name, size));
    }
    let bytes = res
        .bytes()
        .await
        .map_err(|e| store_error("GET (body)", path, e))?;
    // A store whose metadata understated the size.
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if len > MAX_RECORD_LEN {
        return Err(oversize(name, len));
    }
    Ok(bytes)
}

fn oversize(name: &str, size: u64) -> Error {
    Error::corrupt(
        name,
        format!(
            "an object of {size} bytes, larger than any lease record ({MAX_RECORD_LEN} bytes at most): \
             not read, left as it is"
        ),
    )
}

/// One version of a lease object as some observer saw it, and since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Observation {
    /// The ETag: unique per write because every record carries a nonce.
    pub etag: String,
    /// No later than the moment the version was first known to exist: after
    /// the response of the read that returned it, or before the request of our
    /// own write that created it. Either way no holder's deadline derived
    /// from that version can be later than `since + 2/3 TTL`.
    pub since: Instant,
}

/// Records that `etag` was present at `at`, keeping the earlier start when
/// the version is the one already being watched (ETags never repeat, so the
/// version was present throughout).
pub(crate) fn note(obs: &mut Option<Observation>, etag: &str, at: Instant) {
    match obs {
        Some(o) if o.etag == etag => {
            if at < o.since {
                o.since = at;
            }
        }
        _ => {
            *obs = Some(Observation {
                etag: etag.to_owned(),
                since: at,
            })
        }
    }
}

/// Whether `etag` has been watched unchanged for at least `ttl`.
pub(crate) fn expired(obs: &Option<Observation>, etag: &str, ttl: Duration, now: Instant) -> bool {
    matches!(obs, Some(o) if o.etag == etag && now.saturating_duration_since(o.since) >= ttl)
}

/// A lease object as read.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub etag: String,
    pub record: Record,
    /// Taken after the response arrived.
    pub seen_at: Instant,
}

impl Stored {
    fn ttl(&self) -> Duration {
        Duration::from_millis(self.record.ttl_ms)
    }
}

/// The outcome of [`Core::acquire`].
pub(crate) enum Acquired {
    Granted { fence: u64, etag: String },
    Held(Record),
}

/// The outcome of [`Core::renew`].
pub(crate) enum Renewed {
    Renewed { etag: String, payload: Vec<u8> },
    Lost,
}

/// Which object an operation is about, and its name for error messages.
pub(crate) struct Target<'a> {
    pub path: &'a Path,
    pub name: &'a str,
}

/// The grant an operation acts for.
pub(crate) struct Claim<'a> {
    pub holder: &'a str,
    pub fence: u64,
    pub ttl: Duration,
}

enum Put {
    Written(String),
    Conflict,
}

/// Talks to the store; stateless but for the one-time precondition probe.
pub(crate) struct Core {
    pub store: Arc<dyn ObjectStore>,
    /// Where the precondition probe writes its scratch object.
    probe_dir: Path,
    probed: AtomicBool,
}

fn nonce() -> String {
    HolderId::random().as_str().to_owned()
}

/// Maps a client error whose meaning is not a precondition outcome.
pub(crate) fn store_error(op: &str, path: &Path, e: object_store::Error) -> Error {
    use object_store::Error as E;
    match e {
        // Known refusals: the request was not applied and retrying will not help.
        E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::InvalidPath { .. }
        | E::UnknownConfigurationKey { .. }
        | E::NotSupported { .. }
        | E::NotImplemented { .. } => Error::Backend(format!("{op} {path}: {e}").into()),
        // Transport failures, timeouts, 5xx after retries: the outcome is unknown.
        other => Error::unavailable(format!("{op} {path}"), other),
    }
}

/// Separates the ETag from the object version in a version tag. Neither an
/// HTTP ETag nor an object version contains control characters.
const TAG_SEP: char = '\u{1f}';

/// One version of an object as this crate names it: the ETag, plus the
/// store's object version (GCS's generation) where the store reports one,
/// since some stores need the version for a conditional update. Unique per
/// write: every record carries a nonce.
pub(crate) fn version_tag(e_tag: Option<&str>, version: Option<&str>) -> Option<String> {
    match (e_tag, version) {
        (None, None) => None,
        (e, None) => e.map(str::to_owned),
        (e, Some(v)) => Some(format!("{}{TAG_SEP}{v}", e.unwrap_or_default())),
    }
}

/// The conditional-update mode for the version named by `tag`.
pub(crate) fn update_mode(tag: &str) -> PutMode {
    let (e_tag, version) = match tag.split_once(TAG_SEP) {
        Some((e, v)) => ((!e.is_empty()).then(|| e.to_owned()), Some(v.to_owned())),
        None => (Some(tag.to_owned()), None),
    };
    PutMode::Update(UpdateVersion { e_tag, version })
}

/// Maps the error of a conditional PUT that is not a precondition outcome.
///
/// Some clients refuse a request before sending it (GCS without an object
/// version, S3 or Azure without an ETag, a store without conditional puts):
/// nothing was applied, and a retry would be refused the same way, so those
/// are definite errors, never "outcome unknown".
pub(crate) fn put_error(path: &Path, e: object_store::Error) -> Error {
    use object_store::Error as E;
    match e {
        E::NotImplemented { .. } | E::NotSupported { .. } => Error::Unsupported {
            operation: "conditional put (PutMode::Create and PutMode::Update)",
        },
        E::Generic { store, source } if refused_locally(&*source) => Error::Backend(
            format!(
                "PUT {path}: the {store} client refused the conditional write before sending it \
                 (nothing was written): {source}"
            )
            .into(),
        ),
        other => store_error("PUT", path, other),
    }
}

/// Whether a client error is one of object_store's own checks of a
/// conditional write, made before any request is sent.
fn refused_locally(source: &(dyn std::error::Error + Send + Sync)) -> bool {
    let msg = source.to_string();
    [
        "Version required for conditional update",
        "ETag required for conditional put",
        "ETag required for conditional update",
    ]
    .iter()
    .any(|m| msg.contains(m))
}

impl Core {
    pub fn new(store: Arc<dyn ObjectStore>, probe_dir: Path) -> Self {
        Core {
            store,
            probe_dir,
            probed: AtomicBool::new(false),
        }
    }

    /// Reads a lease object: `None` when there is none, `CorruptRecord` when
    /// it is not ours.
    pub async fn get(&self, path: &Path, name: &str) -> Result<Option<Stored>, Error> {
        let res = match self.store.get(path).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(store_error("GET", path, e)),
        };
        let etag = version_tag(res.meta.e_tag.as_deref(), res.meta.version.as_deref());
        let bytes = read_body(path, name, res).await?;
        let seen_at = Instant::now();
        let record =
            Record::decode(bytes.as_ref()).map_err(|detail| Error::corrupt(name, detail))?;
        let etag = etag.ok_or_else(|| {
            Error::Backend(
                format!(
                    "GET {path}: the store returned neither an ETag nor a version, so conditional updates are impossible"
                )
                .into(),
            )
        })?;
        Ok(Some(Stored {
            etag,
            record,
            seen_at,
        }))
    }

    async fn put(&self, path: &Path, body: Vec<u8>, mode: PutMode) -> Result<Put, Error> {
        use object_store::Error as E;
        let create = matches!(mode, PutMode::Create);
        let opts = PutOptions::from(mode);
        match self
            .store
            .put_opts(path, PutPayload::from(body), opts)
            .await
        {
            Ok(r) => version_tag(r.e_tag.as_deref(), r.version.as_deref()).map(Put::Written).ok_or_else(|| {
                Error::Backend(
                    format!("PUT {path}: the store returned neither an ETag nor a version, so conditional updates are impossible")
                        .into(),
                )
            }),
            Err(E::AlreadyExists { .. } | E::Precondition { .. }) => Ok(Put::Conflict),
            // S3 answers 404 to If-Match on a missing object (object_store maps
            // it to Precondition, but not every store does).
            Err(E::NotFound { .. }) if !create => Ok(Put::Conflict),
            Err(e) => Err(put_error(path, e)),
        }
    }

    /// Checks once per `Core` that the store honours preconditions: a create
    /// over an existing object and an update with a wrong ETag must both fail.
    /// A store that ignores them would hand out two live grants.
    pub async fn ensure_probed(&self) -> Result<(), Error> {
        if self.probed.load(Ordering::Acquire) {
            return Ok(());
        }
        let name = format!(".lease-probe-{}", nonce());
        let path = self.probe_dir.clone().join(name.as_str());
        let result = self.probe(&path).await;
        // Best effort: a leftover probe object is harmless, and the outcome
        // of the probe is already known.
        let _ = self.store.delete(&path).await;
        if result.is_ok() {
            self.probed.store(true, Ordering::Release);
        }
        result
    }

    async fn probe(&self, path: &Path) -> Result<(), Error> {
        let tag = match self.put(path, b"probe 1".to_vec(), PutMode::Create).await? {
            Put::Written(tag) => tag,
            Put::Conflict => {
                return Err(Error::Unavailable {
                    detail: format!("precondition probe: {path} already exists"),
                    source: None,
                })
            }
        };
        if let Put::Written(_) = self.put(path, b"probe 2".to_vec(), PutMode::Create).await? {
            return Err(Error::PreconditionsIgnored {
                detail: format!(
                    "a create (If-None-Match: *) over the existing object {path} succeeded"
                ),
            });
        }
        // Wrong in every part the store may check: the ETag, and the object
        // version where the store reports one (GCS checks only that).
        let version = tag
            .split_once(TAG_SEP)
            .map(|(_, v)| if v == "1" { "2" } else { "1" }.to_owned());
        let wrong = UpdateVersion {
            e_tag: Some("\"lease-s3-probe-no-such-etag\"".into()),
            version,
        };
        if let Put::Written(_) = self
            .put(path, b"probe 3".to_vec(), PutMode::Update(wrong))
            .await?
        {
            return Err(Error::PreconditionsIgnored {
                detail: format!("an update of {path} with a wrong If-Match ETag succeeded"),
            });
        }
        Ok(())
    }

    /// Takes `path` for `holder` if it is free, released, expired by `obs`,
    /// or already `holder`'s (then with the same fence, extended).
    pub async fn acquire(
        &self,
        at: &Target<'_>,
        holder: &str,
        ttl: Duration,
        payload: Vec<u8>,
        obs: &mut Option<Observation>,
    ) -> Result<Acquired, Error> {
        let Target { path, name } = *at;
        let mut current = self.get(path, name).await?;
        let mut writes = 0;
        loop {
            let (mode, fence) = match &current {
                None => (PutMode::Create, 1),
                Some(s) => {
                    note(obs, &s.etag, s.seen_at);
                    let update = update_mode(&s.etag);
                    let r = &s.record;
                    if r.state == State::Released || expired(obs, &s.etag, s.ttl(), Instant::now())
                    {
                        (update, r.fence.saturating_add(1))
                    } else if r.holder == holder {
                        // Ours and live: an earlier attempt landed but its answer
                        // was lost (or the holder asks again). Same fence, rewritten
                        // so the lease runs from this request.
                        (update, r.fence)
                    } else {
                        return Ok(Acquired::Held(r.clone()));
                    }
                }
            };
            if writes == MAX_WRITES {
                return Err(Error::Unavailable {
                    detail: format!(
                        "{name}: the lease object changed under {MAX_WRITES} conditional writes in a row"
                    ),
                    source: None,
                });
            }
            self.ensure_probed().await?;
            writes += 1;
            let nonce = nonce();
            let record = Record {
                state: State::Held,
                holder: holder.to_owned(),
                fence,
                ttl_ms: ttl_ms(ttl),
                nonce: nonce.clone(),
                payload: payload.clone(),
            };
            let sent = Instant::now();
            match self.put(path, record.encode(), mode).await? {
                Put::Written(etag) => {
                    note_own_write(obs, &etag, sent);
                    return Ok(Acquired::Granted { fence, etag });
                }
                Put::Conflict => {
                    current = self.get(path, name).await?;
                    // The client retries internally: our write may have landed
                    // with its answer lost, and the retry then found its own work.
                    if let Some(s) = &current {
                        if s.record.nonce == nonce {
                            note_own_write(obs, &s.etag, sent);
                            return Ok(Acquired::Granted {
                                fence,
                                etag: s.etag.clone(),
                            });
                        }
                    }
                }
            }
        }
    }

    /// Rewrites (holder, fence)'s record, last known at `etag`, with a fresh
    /// nonce. `payload: None` keeps the stored payload (costing a read).
    pub async fn renew(
        &self,
        at: &Target<'_>,
        claim: &Claim<'_>,
        etag: &str,
        payload: Option<Vec<u8>>,
        obs: &mut Option<Observation>,
    ) -> Result<Renewed, Error> {
        let Target { path, name } = *at;
        let Claim { holder, fence, ttl } = *claim;
        if expired(obs, etag, ttl, Instant::now()) {
            // Unchanged for a TTL on our clock: others may already treat it as
            // free, so renewing it now could overlap a taker's window.
            return Ok(Renewed::Lost);
        }
        let mut expect = etag.to_owned();
        let mut payload = payload;
        let mut pending: Option<Option<Stored>> = None;
        if payload.is_none() {
            pending = Some(self.get(path, name).await?);
        }
        let mut last_nonce = String::new();
        let mut last_sent = Instant::now();
        let mut writes = 0;
        loop {
            if let Some(current) = pending.take() {
                let Some(s) = current else {
                    return Ok(Renewed::Lost);
                };
                note(obs, &s.etag, s.seen_at);
                if !last_nonce.is_empty() && s.record.nonce == last_nonce {
                    note_own_write(obs, &s.etag, last_sent);
                    return Ok(Renewed::Renewed {
                        etag: s.etag,
                        payload: s.record.payload,
                    });
                }
                let ours = s.record.state == State::Held
                    && s.record.holder == holder
                    && s.record.fence == fence;
                if !ours || expired(obs, &s.etag, ttl, Instant::now()) {
                    return Ok(Renewed::Lost);
                }
                // Still (holder, fence) but a newer version: one of our own
                // writes whose answer was lost. Renew on top of it.
                expect = s.etag;
                if payload.is_none() {
                    payload = Some(s.record.payload);
                }
            }
            if writes == MAX_WRITES {
                return Err(Error::Unavailable {
                    detail: format!(
                        "{name}: the lease object changed under {MAX_WRITES} conditional writes in a row"
                    ),
                    source: None,
                });
            }
            writes += 1;
            let body_payload = payload.clone().unwrap_or_default();
            last_nonce = nonce();
            let record = Record {
                state: State::Held,
                holder: holder.to_owned(),
                fence,
                ttl_ms: ttl_ms(ttl),
                nonce: last_nonce.clone(),
                payload: body_payload.clone(),
            };
            let mode = update_mode(&expect);
            last_sent = Instant::now();
            match self.put(path, record.encode(), mode).await? {
                Put::Written(etag) => {
                    note_own_write(obs, &etag, last_sent);
                    return Ok(Renewed::Renewed {
                        etag,
                        payload: body_payload,
                    });
                }
                Put::Conflict => pending = Some(self.get(path, name).await?),
            }
        }
    }

    /// Marks (holder, fence)'s record, last known at `etag`, released. Leaves
    /// any other record alone.
    pub async fn release(
        &self,
        at: &Target<'_>,
        claim: &Claim<'_>,
        etag: &str,
        obs: &mut Option<Observation>,
    ) -> Result<(), Error> {
        let Target { path, name } = *at;
        let Claim { holder, fence, ttl } = *claim;
        let mut expect = etag.to_owned();
        let mut writes = 0;
        loop {
            writes += 1;
            let nonce = nonce();
            let record = Record {
                state: State::Released,
                holder: holder.to_owned(),
                fence,
                ttl_ms: ttl_ms(ttl),
                nonce: nonce.clone(),
                payload: Vec::new(),
            };
            let mode = update_mode(&expect);
            let sent = Instant::now();
            match self.put(path, record.encode(), mode).await? {
                Put::Written(etag) => {
                    note_own_write(obs, &etag, sent);
                    return Ok(());
                }
                Put::Conflict => {
                    let s = match self.get(path, name).await {
                        Ok(Some(s)) => s,
                        // Gone or replaced by something that is not ours: nothing
                        // of ours to release.
                        Ok(None) | Err(Error::CorruptRecord { .. }) => return Ok(()),
                        Err(e) => return Err(e),
                    };
                    note(obs, &s.etag, s.seen_at);
                    let ours = s.record.state == State::Held
                        && s.record.holder == holder
                        && s.record.fence == fence;
                    if s.record.nonce == nonce || !ours {
                        return Ok(());
                    }
                    if writes == MAX_WRITES {
                        return Err(Error::Unavailable {
                            detail: format!(
                                "{name}: the lease object changed under {MAX_WRITES} conditional writes in a row"
                            ),
                            source: None,
                        });
                    }
                    expect = s.etag;
                }
            }
        }
    }
}

/// Our own write of `etag`, whose request was sent at `sent`: the version did
/// not exist before `sent`, so observing it from there is conservative for
/// every holder whose deadline is measured from `sent` or later.
fn note_own_write(obs: &mut Option<Observation>, etag: &str, sent: Instant) {
    *obs = Some(Observation {
        etag: etag.to_owned(),
        since: sent,
    });
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(msg: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "GCS",
            source: msg.to_owned().into(),
        }
    }

    #[test]
    fn writes_refused_before_sending_are_definite_errors() {
        let path = Path::from("leases/k");
        for msg in [
            "Version required for conditional update",
            "ETag required for conditional put",
            "ETag required for conditional update",
        ] {
            let e = put_error(&path, generic(msg));
            assert!(
                matches!(e, Error::Backend(_)) && !e.is_unknown_outcome(),
                "{msg}: {e:?}"
            );
        }
        let e = put_error(
            &path,
            object_store::Error::NotImplemented {
                operation: "put_opts Update".into(),
                implementer: "LocalFileSystem".into(),
            },
        );
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        let e = put_error(
            &path,
            object_store::Error::UnknownConfigurationKey {
                store: "S3",
                key: "x".into(),
            },
        );
        assert!(!e.is_unknown_outcome(), "{e:?}");
        // Anything else from the transport may have been applied.
        assert!(put_error(&path, generic("connection reset")).is_unknown_outcome());
    }

    #[test]
    fn version_tags_carry_both_parts_into_the_update() {
        let tag = version_tag(Some("\"e1\""), Some("1700000000000001")).unwrap();
        match update_mode(&tag) {
            PutMode::Update(v) => {
                assert_eq!(v.e_tag.as_deref(), Some("\"e1\""));
                assert_eq!(v.version.as_deref(), Some("1700000000000001"));
            }
            other => panic!("{other:?}"),
        }
        let tag = version_tag(Some("\"e1\""), None).unwrap();
        match update_mode(&tag) {
            PutMode::Update(v) => {
                assert_eq!((v.e_tag.as_deref(), v.version), (Some("\"e1\""), None))
            }
            other => panic!("{other:?}"),
        }
        let tag = version_tag(None, Some("7")).unwrap();
        match update_mode(&tag) {
            PutMode::Update(v) => assert_eq!((v.e_tag, v.version.as_deref()), (None, Some("7"))),
            other => panic!("{other:?}"),
        }
        assert_eq!(version_tag(None, None), None);
    }
}
