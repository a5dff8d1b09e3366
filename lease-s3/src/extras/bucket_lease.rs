//! A single-object bucket lease with a stable instance id: one lease per
//! prefix, at `{prefix}/LEASE`.
//!
//! How it relates to the lease contract: it runs on the same conditional-write
//! protocol as [`ObjectStoreBackend`](crate::ObjectStoreBackend) (so the same
//! fences that only grow, the same takeover only after a whole TTL seen on the
//! local clock, the same store checks), but it is not a
//! [`lease_core::LeaseBackend`]: there is one lease per prefix rather than per
//! key, the holder is an instance id (a stable one per `BucketLease`), and errors are
//! [`BucketLeaseError`]s. Use [`ObjectStoreBackend`](crate::ObjectStoreBackend)
//! for keyed leases, keepers and the conformance-checked contract.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lease_core::{Error, Exclusion, HolderId, TtlRule};
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::time::Instant;

use crate::conditional::{
    Acquired, Claim, ConditionalStore, Observation, RenewPayload, Renewed, Target,
};

/// Whole seconds, 1 s to a day; 0 counts as 1.
const TTL_RULE: TtlRule = TtlRule::new(Duration::from_secs(1)..=Duration::from_secs(24 * 3600))
    .rounded_to(Duration::from_secs(1));

/// What an instance has seen of a foreign lease, kept across its acquire
/// attempts: the version it saw and since when, on the local monotonic clock.
///
/// A suspect lease (its holder went silent) is taken over only once the same
/// watch has seen the very same version for a whole TTL. Nothing from the
/// object's timestamps is ever compared with the local clock, so clock skew
/// between machines cannot shorten anyone's lease. Pass the same watch to
/// every [`BucketLease::acquire_as`] of one instance; a fresh watch starts the
/// wait from zero.
#[derive(Clone, Debug, Default)]
pub struct BucketLeaseWatch {
    seen: Option<Observation>,
}

impl BucketLeaseWatch {
    /// A watch that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Why a [`BucketLease`] operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum BucketLeaseError {
    /// Another instance holds a fresh lease, or won the race for it against
    /// this call. Try again later with the same watch.
    ForeignActive {
        /// The instance named in the lease object.
        holder: String,
        /// Its fence.
        fence: u64,
    },
    /// The service accepted a conditional PUT whose precondition should have
    /// failed: it cannot keep a second writer out, so no lease is granted.
    PreconditionsIgnored {
        /// What was observed.
        detail: String,
    },
    /// The lease object was replaced, deleted or released since our last
    /// write, or went a whole TTL without a successful renewal: the lease is
    /// lost for good. Stop writing and take a new one.
    Lost,
    /// The service failed a request (or the input was refused before any was
    /// sent). After a failed renewal, retry: [`BucketLease::write_deadline`]
    /// keeps the holder safe meanwhile.
    Store(Error),
}

impl fmt::Display for BucketLeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BucketLeaseError::ForeignActive { holder, fence } => {
                write!(f, "the lease is held by instance {holder:?} (fence {fence})")
            }
            BucketLeaseError::PreconditionsIgnored { detail } => write!(
                f,
                "the object store ignores conditional-PUT preconditions, so it cannot exclude a second writer: {detail}"
            ),
            BucketLeaseError::Lost => write!(f, "the lease was lost"),
            BucketLeaseError::Store(_) => f.write_str("object store request failed"),
        }
    }
}

impl std::error::Error for BucketLeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BucketLeaseError::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Error> for BucketLeaseError {
    fn from(e: Error) -> Self {
        match e {
            Error::PreconditionsIgnored { detail } => {
                BucketLeaseError::PreconditionsIgnored { detail }
            }
            other => BucketLeaseError::Store(other),
        }
    }
}

/// A held lease on `{prefix}/LEASE`.
///
/// Renew it every [`renew_interval`](Self::renew_interval); check
/// [`may_write`](Self::may_write) before every write, and stamp writes with
/// [`fence`](Self::fence) where the resource can check it.
pub struct BucketLease {
    conditional: ConditionalStore,
    path: Path,
    marker: Path,
    instance_id: String,
    ttl_s: u64,
    fence: u64,
    state: Mutex<Held>,
}

struct Held {
    etag: String,
    /// The TTL in the record at `etag`: a renewal writes no shorter one.
    written_ttl: Duration,
    /// When the request behind the last successful write was sent, on
    /// Tokio's clock and on the standard monotonic clock.
    renewed_at: Instant,
    renewed_at_std: std::time::Instant,
    lost: bool,
    /// Our own writes, as a watch: a lease not renewed for a whole TTL is
    /// given up rather than renewed, since others may already have taken it.
    obs: Option<Observation>,
}

impl fmt::Debug for BucketLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BucketLease")
            .field("path", &self.path.as_ref())
            .field("instance_id", &self.instance_id)
            .field("ttl_s", &self.ttl_s)
            .field("fence", &self.fence)
            .field("lost", &self.is_lost())
            .finish()
    }
}

fn lease_path(prefix: &str) -> Result<Path, Error> {
    let joined = if prefix.trim_matches('/').is_empty() {
        "LEASE".to_owned()
    } else {
        format!("{}/LEASE", prefix.trim_end_matches('/'))
    };
    Path::parse(&joined).map_err(|_| Error::InvalidKey {
        key: prefix.to_owned(),
        reason: "the prefix must be an object path without empty, `.` or `..` segments",
    })
}

impl BucketLease {
    /// Take the lease on `prefix` for `ttl_s` seconds (0 counts as 1), under
    /// a new random instance id. See [`acquire_as`](Self::acquire_as).
    ///
    /// # Errors
    /// As [`acquire_as`](Self::acquire_as).
    pub async fn acquire(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        ttl_s: u64,
    ) -> Result<BucketLease, BucketLeaseError> {
        let id = HolderId::random();
        Self::acquire_as(
            store,
            prefix,
            ttl_s,
            id.as_str(),
            &mut BucketLeaseWatch::new(),
        )
        .await
    }

    /// Take the lease on `prefix` for `ttl_s` seconds (0 counts as 1, at most
    /// a day) as `instance_id`.
    ///
    /// An instance passes the same id and watch to every attempt. A lease
    /// already naming the id — an earlier attempt whose write landed though
    /// its answer was lost — is taken back at once with its fence, and `watch`
    /// lets a suspect foreign lease be taken over once it has sat unchanged
    /// for a TTL. Costs a GET and a conditional PUT; before its first write
    /// each call also checks that the service honours preconditions (3 PUTs
    /// and a DELETE of a scratch object next to `LEASE`).
    ///
    /// # Errors
    /// [`BucketLeaseError::ForeignActive`] when another instance holds a fresh lease
    /// — or won the race for it against this call;
    /// [`BucketLeaseError::PreconditionsIgnored`] when the service ignores a
    /// conditional PUT's precondition; [`BucketLeaseError::Store`] when the service
    /// fails a request, the record at `LEASE` is not a lease record, or the
    /// id, prefix or TTL are invalid.
    pub async fn acquire_as(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        ttl_s: u64,
        instance_id: &str,
        watch: &mut BucketLeaseWatch,
    ) -> Result<BucketLease, BucketLeaseError> {
        let renewed_at = Instant::now();
        let renewed_at_std = std::time::Instant::now();
        let ttl = TTL_RULE.effective(Duration::from_secs(ttl_s))?;
        let holder = HolderId::new(instance_id)?;
        let path = lease_path(prefix)?;
        let dir = Path::parse(prefix.trim_matches('/')).unwrap_or_default();
        let marker = dir.clone().join(".used").join("LEASE");
        let core = ConditionalStore::new(store, dir);
        let name = path.to_string();
        match core
            .acquire(
                &Target {
                    path: &path,
                    marker: &marker,
                    name: &name,
                },
                holder.as_str(),
                ttl,
                Vec::new(),
                &mut watch.seen,
            )
            .await?
        {
            // The TTL written, which may be the longer one of this
            // instance's live lease: renewals keep it.
            Acquired::Granted {
                fence,
                etag,
                ttl: written,
            } => Ok(BucketLease {
                conditional: core,
                path,
                marker,
                instance_id: holder.as_str().to_owned(),
                ttl_s: TTL_RULE.effective(written).unwrap_or(ttl).as_secs(),
                fence,
                state: Mutex::new(Held {
                    etag,
                    written_ttl: written,
                    renewed_at,
                    renewed_at_std,
                    lost: false,
                    obs: watch.seen.clone(),
                }),
            }),
            Acquired::Held(r) => Err(BucketLeaseError::ForeignActive {
                holder: r.holder,
                fence: r.fence,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, Held> {
        // Updates are plain assignments: a poisoned lock holds no torn state.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_s)
    }

    fn target<'a>(&'a self, name: &'a str) -> Target<'a> {
        Target {
            path: &self.path,
            marker: &self.marker,
            name,
        }
    }

    fn claim(&self) -> Claim<'_> {
        Claim {
            holder: &self.instance_id,
            fence: self.fence,
            ttl: self.ttl(),
        }
    }

    /// This process's instance id, as the `LEASE` object names it.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The TTL this lease was taken with, in seconds.
    pub fn ttl_s(&self) -> u64 {
        self.ttl_s
    }

    /// The fencing token: greater than that of every earlier holder of this
    /// prefix's lease (takeovers increment it; releases keep it).
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// How often to renew: a third of the TTL.
    pub fn renew_interval(&self) -> Duration {
        self.ttl() / 3
    }

    /// How strongly this lease excludes a second writer on this service:
    /// expiry is judged by the taker's own clock, and conditional writes are
    /// *assumed* atomic. The check at acquire shows that the service honours
    /// preconditions one request at a time; it cannot show that two
    /// concurrent conditional writes never both succeed. See the crate docs
    /// for which services are known to be linearizable for conditional
    /// writes.
    pub fn exclusion(&self) -> Exclusion {
        Exclusion::ObservedExpiry
    }

    /// Whether the lease was found replaced or deleted. A lost lease never
    /// comes back; take a new one.
    pub fn is_lost(&self) -> bool {
        self.state().lost
    }

    /// The moment, on Tokio's clock, after which this holder must not write:
    /// two thirds of a TTL after the last successful renewal, measured from
    /// when that request was sent. `None` once the lease is lost or that
    /// moment has passed on either clock (Tokio's, or the standard monotonic
    /// clock should Tokio's be paused).
    pub fn write_deadline(&self) -> Option<Instant> {
        let s = self.state();
        if s.lost {
            return None;
        }
        let window = self.ttl().mul_f64(2.0 / 3.0);
        let deadline = s.renewed_at.checked_add(window)?;
        let deadline_std = s.renewed_at_std.checked_add(window)?;
        if Instant::now() >= deadline || std::time::Instant::now() >= deadline_std {
            return None;
        }
        Some(deadline)
    }

    /// Whether this holder may start a write now. See
    /// [`write_deadline`](Self::write_deadline).
    pub fn may_write(&self) -> bool {
        self.write_deadline().is_some()
    }

    /// Extend the lease: rewrite it with a fresh nonce, provided it is still
    /// exactly ours. One conditional PUT.
    ///
    /// # Errors
    /// [`BucketLeaseError::Lost`] when the object was replaced or deleted since our
    /// last write (or we failed to renew it for a whole TTL) — the lease is
    /// then lost for good; [`BucketLeaseError::Store`] when the service fails a
    /// request (retry; the write deadline keeps the holder safe meanwhile).
    pub async fn renew(&self) -> Result<(), BucketLeaseError> {
        let sent = Instant::now();
        let sent_std = std::time::Instant::now();
        let (etag, written_ttl, mut obs) = {
            let s = self.state();
            if s.lost {
                return Err(BucketLeaseError::Lost);
            }
            (s.etag.clone(), s.written_ttl, s.obs.clone())
        };
        let name = self.path.to_string();
        let result = self
            .conditional
            .renew(
                &self.target(&name),
                &self.claim(),
                &etag,
                Some(written_ttl),
                RenewPayload::Replace(Vec::new()),
                &mut obs,
            )
            .await;
        let mut s = self.state();
        match result {
            Ok(Renewed::Renewed { etag, ttl, .. }) => {
                s.obs = obs;
                if !s.lost {
                    s.etag = etag;
                    s.written_ttl = ttl;
                    // Concurrent renewals: keep the latest send instant that succeeded.
                    if sent > s.renewed_at {
                        s.renewed_at = sent;
                        s.renewed_at_std = sent_std;
                    }
                }
                Ok(())
            }
            Ok(Renewed::Lost) => {
                s.lost = true;
                Err(BucketLeaseError::Lost)
            }
            Err(e) => Err(BucketLeaseError::Store(e)),
        }
    }

    /// Give the lease up: mark `{prefix}/LEASE` released by a conditional
    /// overwrite if it still names us (never a DELETE, so the fence counter
    /// survives). A lost lease, or one another instance now holds, is left
    /// alone.
    ///
    /// # Errors
    /// [`BucketLeaseError::Store`] when the service fails a request; the lease then
    /// expires by itself once others have watched it for a TTL.
    pub async fn release(self) -> Result<(), BucketLeaseError> {
        let (etag, mut obs) = {
            let s = self.state();
            if s.lost {
                return Ok(());
            }
            (s.etag.clone(), s.obs.clone())
        };
        let name = self.path.to_string();
        self.conditional
            .release(&self.target(&name), &self.claim(), &etag, &mut obs)
            .await
            .map_err(BucketLeaseError::Store)
    }
}
