//! The conditional-write protocol shared by [`ObjectStoreBackend`](crate::ObjectStoreBackend)
//! and [`BucketLease`](crate::extras::bucket_lease::BucketLease).
//!
//! Every change to a lease object is a conditional PUT: `Create` when no
//! object exists, `Update` (If-Match on the ETag we read or wrote) otherwise.
//! The library never deletes lease objects, so the fence they carry never
//! goes backwards; should someone else delete one, the key's marker and
//! the fence floor take over (see `on_missing` and `fence_floor`).
//! Expiry is never read from the object: a foreign record counts as expired
//! only once the caller's [`Observation`] saw the very same version for at
//! least its TTL on the local monotonic clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, HolderId, CONTENTION_ATTEMPTS, MAX_PAYLOAD_LEN};
use object_store::path::Path;
use object_store::{
    GetResult, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};
use tokio::time::Instant;

use crate::errors::{put_error, store_error};
use crate::record::{Record, State};

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
    /// The version tag: unique per write because every record carries a
    /// nonce. While the lease object is missing, [`MISSING`] followed by the
    /// tag of the key's marker.
    pub etag: String,
    /// No later than the moment the version was first known to exist: after
    /// the response of the read that returned it, or before the request of our
    /// own write that created it. Either way no holder's deadline derived
    /// from that version can be later than `since + 2/3 TTL`.
    pub since: Instant,
    /// The highest fence and the longest TTL seen on this key, kept across
    /// versions: what this client knows should the record disappear.
    pub max_fence: u64,
    pub max_ttl_ms: u64,
}

/// Starts the observation tag of a missing lease object (no version tag
/// starts with a NUL).
const MISSING: &str = "\u{0}missing\u{1f}";

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
        Some(o) => {
            o.etag = etag.to_owned();
            o.since = at;
        }
        None => {
            *obs = Some(Observation {
                etag: etag.to_owned(),
                since: at,
                max_fence: 0,
                max_ttl_ms: 0,
            })
        }
    }
}

/// [`note`], and what the record says about the key's fence and TTL.
pub(crate) fn note_record(obs: &mut Option<Observation>, s: &Stored) {
    note(obs, &s.etag, s.seen_at);
    if let Some(o) = obs {
        o.max_fence = o.max_fence.max(s.record.fence);
        o.max_ttl_ms = o.max_ttl_ms.max(s.record.ttl_ms);
    }
}

/// Folds `new` (a later observation of the same key) into `into`.
pub(crate) fn merge(into: &mut Option<Observation>, new: Observation) {
    let (max_fence, max_ttl_ms) = match into {
        Some(o) => (
            o.max_fence.max(new.max_fence),
            o.max_ttl_ms.max(new.max_ttl_ms),
        ),
        None => (new.max_fence, new.max_ttl_ms),
    };
    note(into, &new.etag, new.since);
    if let Some(o) = into {
        o.max_fence = max_fence;
        o.max_ttl_ms = max_ttl_ms;
    }
}

/// Whether `etag` has been watched unchanged for at least `ttl`.
pub(crate) fn expired(obs: &Option<Observation>, etag: &str, ttl: Duration, now: Instant) -> bool {
    matches!(obs, Some(o) if o.etag == etag && now.saturating_duration_since(o.since) >= ttl)
}

/// The lowest fence a key may be granted with after its record went
/// missing: the wall clock in microseconds since 1970, or above the highest
/// fence known (from the key's marker or this client's own observations)
/// when that is higher.
///
/// Fences rise by one per grant, so the clock reading stays above every
/// fence handed out since an earlier floor as long as the key saw fewer
/// grants than microseconds passed, and the clock of this machine is not
/// behind the one that set the earlier floor by more than the time between.
pub(crate) fn fence_floor(obs: &Option<Observation>, known: u64) -> u64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let seen = obs.as_ref().map_or(0, |o| o.max_fence);
    wall.max(known.saturating_add(1))
        .max(seen.saturating_add(1))
        .max(1)
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

/// The outcome of [`ConditionalStore::acquire`].
pub(crate) enum Acquired {
    /// `ttl`: the TTL written, which a re-acquire of a live grant keeps at
    /// least as long as that grant's.
    Granted {
        fence: u64,
        etag: String,
        ttl: Duration,
    },
    Held(Record),
}

/// The outcome of [`ConditionalStore::renew`].
pub(crate) enum Renewed {
    /// Written at `etag` with `payload` and `ttl`: the longer of the
    /// claim's TTL and the one stored before.
    Renewed {
        etag: String,
        payload: Vec<u8>,
        ttl: Duration,
    },
    Lost,
}

/// Which object an operation is about, and its name for error messages.
pub(crate) struct Target<'a> {
    pub path: &'a Path,
    /// The key's marker, rewritten before every create of the lease object:
    /// while it exists, a missing lease object means a record deleted
    /// outside the library, not a key never used.
    pub marker: &'a Path,
    pub name: &'a str,
}

/// A key's marker as read.
struct Marker {
    tag: String,
    /// The grant whose create wrote the marker (its holder is checked, not
    /// kept): its fence and TTL bound what a contender waits for and the
    /// fence it grants next while the lease object is missing.
    fence: u64,
    ttl_ms: u64,
    nonce: String,
}

/// What to do about a lease object that does not exist.
enum FromMissing {
    /// Create it with this fence (the marker is written).
    Create(u64),
    /// Not provably free yet: report it held.
    Wait(Record),
    /// The marker changed under us: read the key again.
    Changed,
}

const MARKER_FORMAT: &str = "lease-s3-key/1";

/// The holder a refused acquire (and a read) names while a key's lease
/// record is missing but the key is not yet provably free.
///
/// A key whose record was deleted outside the library (an operator's
/// `DELETE`, a lifecycle rule) is granted only once the contender has seen it
/// missing for a whole TTL on its own clock: its last holder may still be
/// live. Until then [`Acquire::Held`](lease_core::Acquire::Held) and
/// [`LeaseState::Held`](lease_core::LeaseState::Held) must name a holder,
/// and the last one is not known (the key's marker names only the grant
/// that last created the record, whose holder may have released long ago).
/// So they name this one, which no [`HolderId::random`] can be: the
/// [`Holding`](lease_core::Holding)'s `fence` is the highest fence known for
/// the key (the next grant's is above it), its `ttl` what the contender
/// waits, its payload empty. A grant being created at that moment is named
/// once its record lands: a contender that finds the record missing under
/// a marker it has not seen before reads it again for up to a quarter of a
/// second first.
pub const RECORD_MISSING_HOLDER: &str = "<record-missing>";

/// How long a contender that finds the lease object missing, under a marker
/// it has not seen before, waits for the create that marker announces (its
/// writer sends it right after the marker) before it reports the record as
/// missing.
const CREATE_IN_FLIGHT: Duration = Duration::from_millis(250);

/// What a refusal reports while the lease record is missing and the key is
/// being observed: not the grant the marker names (that grant's holder may
/// have released long ago, and later grants may have followed it), but the
/// missing record, with the highest fence known for the key and the time
/// the contender waits.
fn missing_record(fence: u64, wait: Duration) -> Record {
    Record {
        state: State::Held,
        holder: RECORD_MISSING_HOLDER.to_owned(),
        fence,
        ttl_ms: ttl_ms(wait),
        nonce: String::new(),
        payload: Vec::new(),
    }
}

/// What a read of a missing lease object found.
pub(crate) enum Missing {
    /// A key never used, or one watched missing for a whole TTL.
    Free,
    /// Not provably free yet (see [`missing_record`]).
    Held(Record),
    /// The lease object exists now (a create was in flight): read it again.
    Appeared,
}

/// A marker: one line of JSON, then (after a newline, which compact JSON
/// never contains) the payload bytes verbatim, as in a lease record.
fn marker_body(holder: &str, fence: u64, ttl: Duration, nonce: &str, payload: &[u8]) -> Vec<u8> {
    let mut body = serde_json::json!({
        "lease": MARKER_FORMAT,
        "holder": holder,
        "fence": fence,
        "ttl_ms": ttl_ms(ttl),
        "nonce": nonce,
    })
    .to_string()
    .into_bytes();
    if !payload.is_empty() {
        body.push(b'\n');
        body.extend_from_slice(payload);
    }
    body
}

/// The grant an operation acts for.
pub(crate) struct Claim<'a> {
    pub holder: &'a str,
    pub fence: u64,
    pub ttl: Duration,
}

pub(crate) enum Put {
    Written(String),
    Conflict,
}

/// Talks to the store; stateless but for the one-time precondition probe.
pub(crate) struct ConditionalStore {
    pub store: Arc<dyn ObjectStore>,
    /// Where the precondition probe writes its scratch object.
    probe_dir: Path,
    probed: AtomicBool,
}

pub(crate) fn nonce() -> String {
    HolderId::random().as_str().to_owned()
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

/// Folds a marker into `obs`: the highest fence and the longest TTL known
/// for the key, the marker's included.
fn noted_marker(obs: &mut Option<Observation>, marker: &Marker) -> (u64, u64) {
    match obs {
        Some(o) => {
            o.max_fence = o.max_fence.max(marker.fence);
            o.max_ttl_ms = o.max_ttl_ms.max(marker.ttl_ms);
            (o.max_fence, o.max_ttl_ms)
        }
        None => (marker.fence, marker.ttl_ms),
    }
}

impl ConditionalStore {
    pub fn new(store: Arc<dyn ObjectStore>, probe_dir: Path) -> Self {
        ConditionalStore {
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

    pub async fn put(&self, path: &Path, body: Vec<u8>, mode: PutMode) -> Result<Put, Error> {
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

    /// Checks once per `ConditionalStore` that the store honours preconditions: a create
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

    /// Reads a key's marker: `None` when there is none.
    async fn read_marker(&self, at: &Target<'_>) -> Result<Option<Marker>, Error> {
        let path = at.marker;
        let res = match self.store.get(path).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(store_error("GET", path, e)),
        };
        let tag = version_tag(res.meta.e_tag.as_deref(), res.meta.version.as_deref());
        let bytes = read_body(path, at.name, res).await?;
        let bytes = bytes.as_ref();
        // The payload after the first newline is not read: a contender is
        // never told about the marker's grant (see `missing_record`).
        let head = match bytes.iter().position(|b| *b == b'\n') {
            Some(at) => bytes.get(..at).unwrap_or(bytes),
            None => bytes,
        };
        let marker = serde_json::from_slice::<serde_json::Value>(head)
            .ok()
            .filter(|v| v.get("lease").and_then(|f| f.as_str()) == Some(MARKER_FORMAT))
            .and_then(|v| {
                HolderId::new(v.get("holder")?.as_str()?).ok()?;
                Some(Marker {
                    tag: String::new(),
                    fence: v
                        .get("fence")?
                        .as_u64()
                        .filter(|f| *f > 0 && *f < u64::MAX)?,
                    ttl_ms: v.get("ttl_ms")?.as_u64().filter(|t| *t > 0)?,
                    nonce: v.get("nonce")?.as_str()?.to_owned(),
                })
            })
            .ok_or_else(|| {
                Error::corrupt(
                    at.name,
                    format!("the key's marker {path} is not one this library wrote; left as it is"),
                )
            })?;
        let tag = tag.ok_or_else(|| {
            Error::Backend(
                format!("GET {path}: the store returned neither an ETag nor a version").into(),
            )
        })?;
        Ok(Some(Marker { tag, ..marker }))
    }

    /// The lease object is missing (its GET answered at `missing_at`). A key
    /// never used has no marker either and is created at once. A key with a
    /// marker had its record deleted outside the library: its last holder
    /// may still be live, so the key is granted only once this client has
    /// seen it missing, under the same marker version, for a whole TTL.
    async fn on_missing(
        &self,
        at: &Target<'_>,
        holder: &str,
        ttl: Duration,
        payload: &[u8],
        obs: &mut Option<Observation>,
        missing_at: Instant,
    ) -> Result<FromMissing, Error> {
        let watching = matches!(obs, Some(o) if o.etag.starts_with(MISSING));
        let known = if watching {
            self.read_marker(at).await?
        } else {
            None
        };
        let marker = match known {
            Some(m) => m,
            None => {
                self.ensure_probed().await?;
                let fence = fence_floor(obs, 0);
                match self
                    .write_marker(at, holder, fence, ttl, payload, PutMode::Create)
                    .await?
                {
                    Ok(()) => return Ok(FromMissing::Create(fence)),
                    Err(Some(m)) => m,
                    Err(None) => return Ok(FromMissing::Changed),
                }
            }
        };
        let watch = format!("{MISSING}{}", marker.tag);
        let fresh = !matches!(obs, Some(o) if o.etag == watch);
        note(obs, &watch, missing_at);
        let (max_fence, max_ttl_ms) = noted_marker(obs, &marker);
        // The last holder's TTL is unknown: wait the longest of ours, the
        // marker's and any this client saw on the key.
        let wait = ttl.max(Duration::from_millis(max_ttl_ms));
        if !expired(obs, &watch, wait, Instant::now()) {
            // A marker not seen before most often announces a contender's
            // create in flight: once it lands, the lease object names the
            // grant. Otherwise the record was removed (or its create never
            // came): say that, not who the marker names.
            if fresh && self.created_soon(at).await? {
                return Ok(FromMissing::Changed);
            }
            return Ok(FromMissing::Wait(missing_record(max_fence, wait)));
        }
        self.ensure_probed().await?;
        let fence = fence_floor(obs, marker.fence);
        match self
            .write_marker(at, holder, fence, ttl, payload, update_mode(&marker.tag))
            .await?
        {
            Ok(()) => Ok(FromMissing::Create(fence)),
            Err(_) => Ok(FromMissing::Changed),
        }
    }

    /// Creates the key's marker if it has none (a break over a missing lease
    /// object). Best effort: without it, only the fence floor protects a
    /// later deletion of the record the break writes.
    pub async fn ensure_marker(&self, at: &Target<'_>, holder: &str, fence: u64, ttl: Duration) {
        let _ = self
            .put(
                at.marker,
                marker_body(holder, fence, ttl, &nonce(), &[]),
                PutMode::Create,
            )
            .await;
    }

    /// Writes the key's marker for a grant of `fence`: `Ok(Ok(()))` when it
    /// is written, `Ok(Err(marker))` when another write won (with the marker
    /// now there, if any). A write whose answer was lost, or that the
    /// client retried into a conflict with itself, is recognised by its
    /// nonce.
    async fn write_marker(
        &self,
        at: &Target<'_>,
        holder: &str,
        fence: u64,
        ttl: Duration,
        payload: &[u8],
        mode: PutMode,
    ) -> Result<Result<(), Option<Marker>>, Error> {
        let n = nonce();
        match self
            .put(
                at.marker,
                marker_body(holder, fence, ttl, &n, payload),
                mode,
            )
            .await
        {
            Ok(Put::Written(_)) => return Ok(Ok(())),
            Ok(Put::Conflict) => {}
            Err(e) if e.is_unknown_outcome() => match self.read_marker(at).await {
                Ok(Some(m)) if m.nonce == n => return Ok(Ok(())),
                Ok(m) => return Ok(Err(m)),
                Err(_) => return Err(e),
            },
            Err(e) => return Err(e),
        }
        match self.read_marker(at).await? {
            Some(m) if m.nonce == n => Ok(Ok(())),
            m => Ok(Err(m)),
        }
    }

    /// What a read reports for a missing lease object (its GET answered at
    /// `missing_at`), without writing anything: free for a key never used or
    /// one this client has watched missing for a whole TTL; the lease object
    /// appeared, when a create announced by a marker not seen before lands
    /// meanwhile; else held by the missing record, as
    /// [`ConditionalStore::acquire`] would report it.
    pub async fn read_missing(
        &self,
        at: &Target<'_>,
        obs: &mut Option<Observation>,
        missing_at: Instant,
    ) -> Result<Missing, Error> {
        let Some(marker) = self.read_marker(at).await? else {
            return Ok(Missing::Free);
        };
        let watch = format!("{MISSING}{}", marker.tag);
        let fresh = !matches!(obs, Some(o) if o.etag == watch);
        note(obs, &watch, missing_at);
        let (max_fence, max_ttl_ms) = noted_marker(obs, &marker);
        let wait = Duration::from_millis(max_ttl_ms);
        if expired(obs, &watch, wait, Instant::now()) {
            return Ok(Missing::Free);
        }
        if fresh && self.created_soon(at).await? {
            return Ok(Missing::Appeared);
        }
        Ok(Missing::Held(missing_record(max_fence, wait)))
    }

    /// Whether the lease object exists within [`CREATE_IN_FLIGHT`]: read at
    /// once (the create a marker announces is sent right after it), then
    /// again a few times, further apart.
    async fn created_soon(&self, at: &Target<'_>) -> Result<bool, Error> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            if self.get(at.path, at.name).await?.is_some() {
                return Ok(true);
            }
            if start.elapsed() >= CREATE_IN_FLIGHT {
                return Ok(false);
            }
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2);
        }
    }

    /// Takes `path` for `holder` if it is free, released, expired by `obs`,
    /// or already `holder`'s (then with the same fence, extended).
    pub async fn acquire(
        &self,
        at: &Target<'_>,
        holder: &str,
        asked: Duration,
        payload: Vec<u8>,
        obs: &mut Option<Observation>,
    ) -> Result<Acquired, Error> {
        let Target { path, name, .. } = *at;
        let mut current = self.get(path, name).await?;
        let mut missing_at = Instant::now();
        let mut writes = 0;
        loop {
            if writes >= CONTENTION_ATTEMPTS {
                return Err(Error::Unavailable {
                    detail: format!(
                        "{name}: the lease object changed under {CONTENTION_ATTEMPTS} conditional writes in a row"
                    ),
                    source: None,
                });
            }
            let mut ttl = asked;
            let (mode, fence) = match &current {
                None => {
                    writes += 1;
                    match self
                        .on_missing(at, holder, ttl, &payload, obs, missing_at)
                        .await?
                    {
                        FromMissing::Create(fence) => (PutMode::Create, fence),
                        FromMissing::Wait(r) => return Ok(Acquired::Held(r)),
                        FromMissing::Changed => {
                            current = self.get(path, name).await?;
                            missing_at = Instant::now();
                            continue;
                        }
                    }
                }
                Some(s) => {
                    note_record(obs, s);
                    let update = update_mode(&s.etag);
                    let r = &s.record;
                    if r.state == State::Released || expired(obs, &s.etag, s.ttl(), Instant::now())
                    {
                        (update, r.fence.saturating_add(1))
                    } else if r.holder == holder {
                        // Ours and live: an earlier attempt landed but its answer
                        // was lost (or the holder asks again). Same fence, rewritten
                        // so the lease runs from this request, and never with a
                        // shorter TTL: a grant of this term whose answer did arrive
                        // counts its deadline, and its renewals, from its own, and
                        // an observer takes the key over on the record's.
                        ttl = ttl.max(s.ttl());
                        (update, r.fence)
                    } else {
                        return Ok(Acquired::Held(r.clone()));
                    }
                }
            };
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
                    note_own_write(obs, &etag, sent, fence, ttl);
                    return Ok(Acquired::Granted { fence, etag, ttl });
                }
                Put::Conflict => {
                    current = self.get(path, name).await?;
                    missing_at = Instant::now();
                    // The client retries internally: our write may have landed
                    // with its answer lost, and the retry then found its own work.
                    if let Some(s) = &current {
                        if s.record.nonce == nonce {
                            note_own_write(obs, &s.etag, sent, fence, ttl);
                            return Ok(Acquired::Granted {
                                fence,
                                etag: s.etag.clone(),
                                ttl,
                            });
                        }
                    }
                }
            }
        }
    }

    /// Rewrites (holder, fence)'s record, last known at `etag`, with a fresh
    /// nonce, and the payload `payload` says, and never with a TTL shorter
    /// than the stored one: a re-acquire of this term may have lengthened
    /// it since the claim was made, and an observer takes the key over on
    /// the record's TTL while that longer grant may still write.
    /// `stored_ttl` is the TTL in the record at `etag` when the caller knows
    /// it (it wrote that version); without it the record is read first.
    pub async fn renew(
        &self,
        at: &Target<'_>,
        claim: &Claim<'_>,
        etag: &str,
        stored_ttl: Option<Duration>,
        payload: RenewPayload,
        obs: &mut Option<Observation>,
    ) -> Result<Renewed, Error> {
        let Target { path, name, .. } = *at;
        let Claim { holder, fence, ttl } = *claim;
        if expired(obs, etag, ttl, Instant::now()) {
            // Unchanged for a TTL on our clock: others may already treat it as
            // free, so renewing it now could overlap a taker's window.
            return Ok(Renewed::Lost);
        }
        let mut expect = etag.to_owned();
        let (mut payload, keep) = match payload {
            RenewPayload::Replace(p) => (Some(p), false),
            RenewPayload::Keep { last_written } => (last_written, true),
        };
        let mut pending: Option<Option<Stored>> = None;
        let mut floor = stored_ttl.unwrap_or_default();
        if payload.is_none() || stored_ttl.is_none() {
            pending = Some(self.get(path, name).await?);
        }
        let mut last_nonce = String::new();
        let mut last_sent = Instant::now();
        let mut last_ttl = ttl;
        let mut writes = 0;
        loop {
            if let Some(current) = pending.take() {
                let Some(s) = current else {
                    return Ok(Renewed::Lost);
                };
                note_record(obs, &s);
                if !last_nonce.is_empty() && s.record.nonce == last_nonce {
                    note_own_write(obs, &s.etag, last_sent, fence, last_ttl);
                    return Ok(Renewed::Renewed {
                        etag: s.etag,
                        payload: s.record.payload,
                        ttl: last_ttl,
                    });
                }
                let ours = s.record.state == State::Held
                    && s.record.holder == holder
                    && s.record.fence == fence;
                if !ours || expired(obs, &s.etag, ttl, Instant::now()) {
                    return Ok(Renewed::Lost);
                }
                // Still (holder, fence), maybe at a newer version: one of our
                // own writes whose answer was lost, or a re-acquire of this
                // term (which may have lengthened it). Renew on top of it,
                // keeping its TTL if longer.
                floor = s.ttl();
                expect = s.etag;
                // Keeping the payload means keeping the one stored now: a
                // write of ours with a new payload (a renewal racing this
                // one) may have landed since the payload was last known.
                if keep || payload.is_none() {
                    payload = Some(s.record.payload);
                }
            }
            if writes == CONTENTION_ATTEMPTS {
                return Err(Error::Unavailable {
                    detail: format!(
                        "{name}: the lease object changed under {CONTENTION_ATTEMPTS} conditional writes in a row"
                    ),
                    source: None,
                });
            }
            writes += 1;
            let body_payload = payload.clone().unwrap_or_default();
            last_nonce = nonce();
            last_ttl = ttl.max(floor);
            let record = Record {
                state: State::Held,
                holder: holder.to_owned(),
                fence,
                ttl_ms: ttl_ms(last_ttl),
                nonce: last_nonce.clone(),
                payload: body_payload.clone(),
            };
            let mode = update_mode(&expect);
            last_sent = Instant::now();
            match self.put(path, record.encode(), mode).await? {
                Put::Written(etag) => {
                    note_own_write(obs, &etag, last_sent, fence, last_ttl);
                    return Ok(Renewed::Renewed {
                        etag,
                        payload: body_payload,
                        ttl: last_ttl,
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
        let Target { path, name, .. } = *at;
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
                    note_own_write(obs, &etag, sent, fence, ttl);
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
                    note_record(obs, &s);
                    let ours = s.record.state == State::Held
                        && s.record.holder == holder
                        && s.record.fence == fence;
                    if s.record.nonce == nonce || !ours {
                        return Ok(());
                    }
                    if writes == CONTENTION_ATTEMPTS {
                        return Err(Error::Unavailable {
                            detail: format!(
                                "{name}: the lease object changed under {CONTENTION_ATTEMPTS} conditional writes in a row"
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
fn note_own_write(
    obs: &mut Option<Observation>,
    etag: &str,
    sent: Instant,
    fence: u64,
    ttl: Duration,
) {
    let (max_fence, max_ttl_ms) = obs.as_ref().map_or((0, 0), |o| (o.max_fence, o.max_ttl_ms));
    *obs = Some(Observation {
        etag: etag.to_owned(),
        since: sent,
        max_fence: max_fence.max(fence),
        max_ttl_ms: max_ttl_ms.max(ttl_ms(ttl)),
    });
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The payload a renewal writes.
pub enum RenewPayload {
    /// This payload, replacing the stored one.
    Replace(Vec<u8>),
    /// The stored payload, whatever it is when the write lands.
    /// `last_written` is the payload of this client's last write of the
    /// record, which saves a read while the record is still at that version;
    /// without it, the renewal reads the record first.
    Keep {
        /// The payload this client last wrote, if it still knows it.
        last_written: Option<Vec<u8>>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

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
