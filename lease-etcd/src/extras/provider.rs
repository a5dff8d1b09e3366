//! A single-lease `Provider` surface, shaped like the interfaces Go
//! leader-election code expects: `Acquire(candidate)` answering
//! `(granted, Status)`, `Renew(holder, epoch)`, `Read()`; a lost
//! race or a lost lease is `false`, not an error; dropping the provider is
//! `Close()` (it does not revoke).
//!
//! This is the provider-shaped API over the same contract, not a second
//! lease protocol: it runs on the same code as [`EtcdBackend`]'s
//! [`LeaseBackend`] implementation, so its epochs are the same fences, its
//! grants the same etcd leases, and everything the conformance suite checks
//! holds for it too. New code should use [`EtcdBackend`] (or a keeper over
//! it); this module exists for code written against that interface.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, Error, Fence, Grant, HolderId, LeaseBackend, LeaseKey, LeaseState,
    Renewal, Version,
};

use crate::{EtcdBackend, EtcdConfig};

/// A point-in-time view of the lease: holder, epoch (the fencing token) and
/// remaining time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The current holder's candidate id; empty when free.
    pub holder: String,
    /// The fencing token of the current grant; 0 when free. Strictly
    /// increasing over the cluster's life (it is an etcd revision).
    pub epoch: u64,
    /// Remaining lease time as etcd reports it; zero when free.
    pub valid_for: Duration,
}

impl Status {
    fn free() -> Self {
        Status {
            holder: String::new(),
            epoch: 0,
            valid_for: Duration::ZERO,
        }
    }
}

/// One named lease behind a single-lease `Provider` interface (`acquire`,
/// `renew`, `read`, answering `(bool, Status)` or `(bool, Duration)`
/// as Go leader-election code expects), for code written against that
/// design. Loss is `Ok(false)`, never an error; errors mean the truth is
/// unknown (or the request was invalid).
///
/// ```no_run
/// use lease_etcd::provider::EtcdProvider;
/// use lease_etcd::EtcdConfig;
///
/// # async fn demo() -> Result<(), lease_core::Error> {
/// let config = EtcdConfig::new(["http://127.0.0.1:2379"]);
/// let provider = EtcdProvider::connect(config, "culvert/leader").await?;
/// let (granted, status) = provider.acquire("node-a").await?;
/// if granted {
///     let (ok, valid_for) = provider.renew("node-a", status.epoch).await?;
///     println!("still leader: {ok}, for {valid_for:?}");
/// }
/// drop(provider); // does not revoke: the lease expires on its own
/// # Ok(())
/// # }
/// ```
pub struct EtcdProvider {
    backend: EtcdBackend,
    key: LeaseKey,
    ttl: Duration,
    /// The last grant this provider handed out, so that renewing it keeps
    /// alive the exact etcd lease without a lookup.
    last: Mutex<Option<Grant>>,
}

impl std::fmt::Debug for EtcdProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdProvider")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl EtcdProvider {
    /// Connects (touching no key) and serves the lease named `key` with the
    /// configuration's default TTL.
    ///
    /// # Errors
    /// Those of [`EtcdBackend::connect`], [`Error::InvalidKey`] and
    /// [`Error::InvalidTtl`].
    pub async fn connect(config: EtcdConfig, key: &str) -> Result<Self, Error> {
        let key = LeaseKey::new(key)?;
        let backend = EtcdBackend::connect(config).await?;
        Self::new(backend, key)
    }

    /// Serves `key` through an existing backend, with its default TTL.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`] when the configured default TTL is out of range.
    pub fn new(backend: EtcdBackend, key: LeaseKey) -> Result<Self, Error> {
        let ttl = backend
            .capabilities()
            .ttl
            .effective(backend.default_ttl())?;
        Ok(EtcdProvider {
            backend,
            key,
            ttl,
            last: Mutex::new(None),
        })
    }

    /// The effective TTL (rounded up to whole seconds, at least 1 s).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Takes the lease for `candidate_id` if it is free or expired (or already
    /// held by `candidate_id`: then the same epoch comes back). Returns whether
    /// it was granted and the status: the new grant's, or the current holder's.
    ///
    /// # Errors
    /// [`Error::InvalidHolder`], [`Error::CorruptRecord`], or
    /// [`Error::Unavailable`] when the outcome is unknown.
    pub async fn acquire(&self, candidate_id: &str) -> Result<(bool, Status), Error> {
        let holder = HolderId::new(candidate_id)?;
        let req = AcquireRequest::new(self.key.clone(), holder).ttl(self.ttl);
        match self.backend.try_acquire(req).await? {
            Acquire::Granted(g) => {
                let status = Status {
                    holder: g.holder().as_str().to_string(),
                    epoch: g.fence().get(),
                    valid_for: g.ttl(),
                };
                self.remember(Some(g));
                Ok((true, status))
            }
            Acquire::Held(h) => Ok((
                false,
                Status {
                    holder: h.holder.as_str().to_string(),
                    epoch: h.fence.get(),
                    valid_for: h.remaining.unwrap_or(Duration::ZERO),
                },
            )),
        }
    }

    /// Keeps alive the lease granted to (`holder_id`, `epoch`). `Ok((false, _))`
    /// when it was lost (expired, released, superseded).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the truth is unknown: fail toward
    /// self-fencing once the TTL since your last successful renewal has passed.
    pub async fn renew(&self, holder_id: &str, epoch: u64) -> Result<(bool, Duration), Error> {
        let holder = HolderId::new(holder_id)?;
        let known = self
            .recall()
            .filter(|g| *g.holder() == holder && g.fence() == Fence(epoch));
        // Without the grant in hand (another process, a restart), an empty
        // version makes the backend find the key's etcd lease itself.
        let grant = known.unwrap_or_else(|| {
            Grant::new(
                self.key.clone(),
                holder,
                Fence(epoch),
                self.ttl,
                Instant::now(),
                Version::default(),
            )
        });
        match self.backend.renew(&grant, None).await? {
            Renewal::Renewed(g) => {
                let ttl = g.ttl();
                self.remember(Some(g));
                Ok((true, ttl))
            }
            Renewal::Lost => Ok((false, Duration::ZERO)),
        }
    }

    /// The current lease state. Never mutates.
    ///
    /// # Errors
    /// [`Error::CorruptRecord`], or [`Error::Unavailable`].
    pub async fn read(&self) -> Result<Status, Error> {
        match self.backend.read(&self.key).await? {
            LeaseState::Free => Ok(Status::free()),
            LeaseState::Held(h) => Ok(Status {
                holder: h.holder.as_str().to_string(),
                epoch: h.fence.get(),
                valid_for: h.remaining.unwrap_or(Duration::ZERO),
            }),
        }
    }

    fn remember(&self, g: Option<Grant>) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = g;
    }

    fn recall(&self) -> Option<Grant> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
