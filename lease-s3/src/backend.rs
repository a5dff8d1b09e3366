//! The keyed contract ([`LeaseBackend`]) on `{prefix}/{key}` objects.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Exclusion, Fence,
    FenceScope, Grant, HolderId, Holding, LastBreak, LeaseBackend, LeaseKey, LeaseState, Payload,
    Renewal, TimeAuthority, TtlRule, Version, MAX_PAYLOAD_LEN,
};
use object_store::path::Path;
use object_store::ObjectStore;

use crate::conditional::{
    self, Acquired, Claim, ConditionalStore, Missing, Observation, RenewPayload, Renewed, Target,
};
use crate::record::{Record, State};

/// TTLs in whole seconds from 1 s to a day: expiry is judged by observers'
/// clocks with second-scale sleeps, so finer steps would promise nothing.
const TTL_RULE: TtlRule = TtlRule::new(Duration::from_secs(1)..=Duration::from_secs(24 * 3600))
    .rounded_to(Duration::from_secs(1));

/// How many keys a client remembers. Past this, the least recently used
/// entries are forgotten: forgetting an observation only restarts it (a
/// takeover comes later, never earlier, as for a fresh client), and
/// forgetting a payload costs the next renewal without a payload one GET.
const MAX_KEYS: usize = 4096;

/// How many payload bytes a client keeps for renewals without a payload;
/// past this the least recently used are dropped.
const MAX_CACHED_PAYLOAD: usize = 8 << 20;

/// Per-key state, bounded by [`MAX_KEYS`] and [`MAX_CACHED_PAYLOAD`].
#[derive(Default)]
struct Keys {
    map: HashMap<LeaseKey, KeyState>,
    /// Advances on every use; an entry's `used` says how recently.
    tick: u64,
    payload_bytes: usize,
}

impl Keys {
    fn touch(&mut self, key: &LeaseKey) -> &mut KeyState {
        self.tick = self.tick.wrapping_add(1);
        let tick = self.tick;
        let entry = self.map.entry(key.clone()).or_default();
        entry.used = tick;
        entry
    }

    fn set_written(&mut self, key: &LeaseKey, written: Option<(String, Vec<u8>)>) {
        let add = written.as_ref().map_or(0, |(_, p)| p.len());
        let old = std::mem::replace(&mut self.touch(key).written, written);
        let sub = old.map_or(0, |(_, p)| p.len());
        self.payload_bytes = self.payload_bytes.saturating_sub(sub).saturating_add(add);
        self.trim();
    }

    fn forget(&mut self, key: &LeaseKey) {
        if let Some(k) = self.map.remove(key) {
            let sub = k.written.map_or(0, |(_, p)| p.len());
            self.payload_bytes = self.payload_bytes.saturating_sub(sub);
        }
    }

    /// Forgets the least recently used quarter once over a limit, so the
    /// cost is amortised over many operations.
    fn trim(&mut self) {
        if self.map.len() > MAX_KEYS {
            let mut by_age: Vec<(u64, LeaseKey)> =
                self.map.iter().map(|(k, s)| (s.used, k.clone())).collect();
            by_age.sort_unstable_by_key(|(used, _)| *used);
            let excess = self.map.len() - MAX_KEYS * 3 / 4;
            for (_, k) in by_age.into_iter().take(excess) {
                self.forget(&k);
            }
        }
        if self.payload_bytes > MAX_CACHED_PAYLOAD {
            let mut by_age: Vec<(u64, LeaseKey)> = self
                .map
                .iter()
                .filter(|(_, s)| s.written.is_some())
                .map(|(k, s)| (s.used, k.clone()))
                .collect();
            by_age.sort_unstable_by_key(|(used, _)| *used);
            for (_, k) in by_age {
                if self.payload_bytes <= MAX_CACHED_PAYLOAD * 3 / 4 {
                    break;
                }
                if let Some(s) = self.map.get_mut(&k) {
                    let sub = s.written.take().map_or(0, |(_, p)| p.len());
                    self.payload_bytes = self.payload_bytes.saturating_sub(sub);
                }
            }
        }
    }
}

/// What this client knows about one key.
#[derive(Default)]
struct KeyState {
    /// When it was last used (see [`Keys::tick`]).
    used: u64,
    /// The version this client last saw or wrote, and since when: the
    /// per-(client, key) counterpart of a `BucketLeaseWatch`.
    obs: Option<Observation>,
    /// The ETag and payload of our last successful write, so a renewal that
    /// keeps the payload needs no read first.
    written: Option<(String, Vec<u8>)>,
}

/// Leases on any [`ObjectStore`] with conditional puts (S3 and S3-compatible
/// servers, GCS, Azure, [`InMemory`](object_store::memory::InMemory)); one
/// object per key at `{prefix}/{key}`.
///
/// Clones share the store and this client's observations. Object stores have
/// no clock a client can use, so a foreign lease counts as expired only after
/// **this client** saw the same version of its object for a whole TTL: a fresh
/// client (or a fresh process) waits one TTL before it can take over a lease
/// whose holder went silent ([`TimeAuthority::LocalObservation`]). Every
/// [`read`](LeaseBackend::read) and refused [`try_acquire`](LeaseBackend::try_acquire)
/// advances that observation; keep polling to take an abandoned key over.
///
/// What a client remembers per key is bounded (about 4,000 keys and 8 MiB of
/// cached payloads, least recently used first out; a released key is
/// forgotten at once), so a service touching ever new keys stays flat.
/// Forgetting a key only makes the client behave like a fresh one for it.
///
/// Costs: acquire 2 requests (GET + conditional PUT; the first write of a
/// client also probes the store once with 3 PUTs and a DELETE), renew 1
/// (conditional PUT), release 1, read 1, [`last_break`](LeaseBackend::last_break)
/// 2 (LIST + GET). After a lost answer the retry costs one more GET.
#[derive(Clone)]
pub struct ObjectStoreBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conditional: ConditionalStore,
    pub(crate) prefix: Path,
    keys: Mutex<Keys>,
}

impl std::fmt::Debug for ObjectStoreBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStoreBackend")
            .field("store", &self.inner.conditional.store.to_string())
            .field("prefix", &self.inner.prefix.as_ref())
            .finish()
    }
}

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
                keys: Mutex::new(Keys::default()),
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

    pub(crate) fn path(&self, key: &LeaseKey) -> Result<Path, Error> {
        let joined = if self.inner.prefix.as_ref().is_empty() {
            key.as_str().to_owned()
        } else {
            format!("{}/{}", self.inner.prefix.as_ref(), key.as_str())
        };
        Path::parse(&joined).map_err(|_| Error::InvalidKey {
            key: key.as_str().to_owned(),
            reason: "not a valid object path under this prefix",
        })
    }

    /// The key's marker, `{prefix}/.used/{key}`: lease keys never have a
    /// segment starting with `.`, so no lease object lives there.
    pub(crate) fn marker(&self, key: &LeaseKey) -> Result<Path, Error> {
        let joined = if self.inner.prefix.as_ref().is_empty() {
            format!(".used/{}", key.as_str())
        } else {
            format!("{}/.used/{}", self.inner.prefix.as_ref(), key.as_str())
        };
        Path::parse(&joined).map_err(|_| Error::InvalidKey {
            key: key.as_str().to_owned(),
            reason: "not a valid object path under this prefix",
        })
    }

    fn keys(&self) -> MutexGuard<'_, Keys> {
        // Every update is a single assignment: a panic elsewhere cannot leave
        // an entry half-written, so a poisoned lock is safe to reuse.
        self.inner
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How much this client remembers about keys: the number of keys it
    /// keeps an observation or a written payload for, and the payload bytes
    /// it keeps. Bounded, however many distinct keys the client touches.
    pub fn cached_keys(&self) -> (usize, usize) {
        let keys = self.keys();
        (keys.map.len(), keys.payload_bytes)
    }

    pub(crate) fn observation(&self, key: &LeaseKey) -> Option<Observation> {
        self.keys().map.get(key).and_then(|k| k.obs.clone())
    }

    /// Folds what one operation observed back into the shared state. Two
    /// observations of the same ETag keep the earlier start (ETags never
    /// repeat, so it was there throughout); a different ETag replaces the old
    /// one, which can only make a takeover later, never earlier.
    fn merge(&self, key: &LeaseKey, obs: Option<Observation>) {
        let Some(new) = obs else { return };
        let mut keys = self.keys();
        conditional::merge(&mut keys.touch(key).obs, new);
        keys.trim();
    }

    fn remember_write(&self, key: &LeaseKey, etag: &str, payload: Vec<u8>) {
        self.keys()
            .set_written(key, Some((etag.to_owned(), payload)));
    }

    fn cached_payload(&self, key: &LeaseKey, etag: &str) -> Option<Vec<u8>> {
        self.keys()
            .map
            .get(key)
            .and_then(|k| k.written.as_ref())
            .filter(|(e, _)| e == etag)
            .map(|(_, p)| p.clone())
    }
}

fn claim(grant: &Grant) -> Claim<'_> {
    Claim {
        holder: grant.holder().as_str(),
        fence: grant.fence().get(),
        ttl: grant.ttl(),
    }
}

pub(crate) fn holding(key: &LeaseKey, r: Record) -> Result<Holding, Error> {
    let holder = HolderId::new(r.holder)
        .map_err(|e| Error::corrupt(key, format!("invalid holder id in the record: {e}")))?;
    Ok(Holding::new(
        holder,
        Fence(r.fence),
        Duration::from_millis(r.ttl_ms),
        Payload::new(r.payload).map_err(|e| Error::corrupt(key, format!("stored payload: {e}")))?,
    ))
}

impl LeaseBackend for ObjectStoreBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TimeAuthority::LocalObservation, TTL_RULE)
            .with_watch(false)
            // The weakest lease-core can name, and still an assumption: the
            // probe checks that preconditions are honoured one request at a
            // time, not that check-and-store is atomic under concurrency.
            .with_exclusion(Exclusion::ObservedExpiry)
            .with_fence_scope(FenceScope::PerKey)
            .with_max_payload(MAX_PAYLOAD_LEN)
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            let sent = Instant::now();
            let ttl = TTL_RULE.effective(req.ttl)?;
            let path = self.path(&req.key)?;
            let marker = self.marker(&req.key)?;
            let mut obs = self.observation(&req.key);
            let payload = req.payload.as_bytes().to_vec();
            let result = self
                .inner
                .conditional
                .acquire(
                    &Target {
                        path: &path,
                        marker: &marker,
                        name: req.key.as_str(),
                    },
                    req.holder.as_str(),
                    ttl,
                    payload.clone(),
                    &mut obs,
                )
                .await;
            self.merge(&req.key, obs);
            match result? {
                Acquired::Granted { fence, etag } => {
                    self.remember_write(&req.key, &etag, payload);
                    Ok(Acquire::Granted(Grant::new(
                        req.key,
                        req.holder,
                        Fence(fence),
                        ttl,
                        sent,
                        Version::new(etag),
                    )))
                }
                Acquired::Held(r) => Ok(Acquire::Held(holding(&req.key, r)?)),
            }
        })
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let sent = Instant::now();
            let path = self.path(grant.key())?;
            let etag = grant.version().as_str();
            let payload = match payload {
                Some(p) => RenewPayload::Replace(p.into_bytes()),
                None => RenewPayload::Keep {
                    last_written: self.cached_payload(grant.key(), etag),
                },
            };
            let mut obs = self.observation(grant.key());
            let result = self
                .inner
                .conditional
                .renew(
                    &Target {
                        path: &path,
                        marker: &path,
                        name: grant.key().as_str(),
                    },
                    &claim(grant),
                    etag,
                    payload,
                    &mut obs,
                )
                .await;
            self.merge(grant.key(), obs);
            match result? {
                Renewed::Renewed { etag, payload } => {
                    self.remember_write(grant.key(), &etag, payload);
                    Ok(Renewal::Renewed(grant.renewed(sent, Version::new(etag))))
                }
                Renewed::Lost => {
                    // No renewal of this grant follows: its payload is not needed.
                    self.keys().set_written(grant.key(), None);
                    Ok(Renewal::Lost)
                }
            }
        })
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let path = self.path(grant.key())?;
            let mut obs = self.observation(grant.key());
            let result = self
                .inner
                .conditional
                .release(
                    &Target {
                        path: &path,
                        marker: &path,
                        name: grant.key().as_str(),
                    },
                    &claim(grant),
                    grant.version().as_str(),
                    &mut obs,
                )
                .await;
            if result.is_ok() {
                // Released, or found lost: nothing of ours is left to renew,
                // and the key is free or someone else's. Forgetting it only
                // means a later acquire of it starts observing afresh.
                self.keys().forget(grant.key());
            } else {
                self.merge(grant.key(), obs);
            }
            result
        })
    }

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(self.break_key(key, note))
    }

    /// Reads the audit records `{prefix}/.audit/{key}/{fence}-{at_unix_ms}`
    /// that [`break_lease`](LeaseBackend::break_lease) writes: one LIST, then
    /// one GET of the record with the highest fence and, among equal fences,
    /// the latest `at_unix_ms` (numbers, not names, are compared). Writes
    /// nothing.
    ///
    /// A break writes its audit record before the lease object, so one that
    /// failed after that (with an unknown outcome, or whose removal of the
    /// record failed too) still reads as a break here.
    ///
    /// # Errors
    /// [`Error::CorruptRecord`] when an object among the key's audit records
    /// has a name that is not `{fence}-{at_unix_ms}`, or the most recent is
    /// not an audit record of a break of this key; either is left untouched.
    /// [`Error::Unavailable`] or [`Error::Backend`] when the store fails the
    /// LIST or the GET.
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(self.read_last_break(key))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(async move {
            let path = self.path(key)?;
            // A second GET only when a create in flight landed meanwhile.
            let mut found = None;
            for _ in 0..2 {
                found = self.inner.conditional.get(&path, key.as_str()).await?;
                if found.is_some() {
                    break;
                }
                // Missing: a key never used is free; one whose record was
                // deleted outside the library is held until watched for a TTL.
                let missing_at = tokio::time::Instant::now();
                let marker = self.marker(key)?;
                let mut obs = self.observation(key);
                let result = self
                    .inner
                    .conditional
                    .read_missing(
                        &Target {
                            path: &path,
                            marker: &marker,
                            name: key.as_str(),
                        },
                        &mut obs,
                        missing_at,
                    )
                    .await;
                self.merge(key, obs);
                match result? {
                    Missing::Free => return Ok(LeaseState::Free),
                    Missing::Held(r) => return Ok(LeaseState::Held(holding(key, r)?)),
                    Missing::Appeared => continue,
                }
            }
            let Some(s) = found else {
                // It appeared, then went again: whatever it is, it is not
                // settled; the caller reads again.
                return Err(Error::Unavailable {
                    detail: format!("{key}: the lease object appeared and went while it was read"),
                    source: None,
                });
            };
            // Reading changes nothing in the store; it only advances this
            // client's own observation of the key.
            let mut obs = self.observation(key);
            conditional::note_record(&mut obs, &s);
            let expired = conditional::expired(
                &obs,
                &s.etag,
                Duration::from_millis(s.record.ttl_ms),
                tokio::time::Instant::now(),
            );
            self.merge(key, obs);
            if s.record.state == State::Released || expired {
                return Ok(LeaseState::Free);
            }
            Ok(LeaseState::Held(holding(key, s.record)?))
        })
    }
}
