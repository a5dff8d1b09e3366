//! The shared in-memory store behind every clone of [`Fake`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Exclusion, Fence,
    FenceScope, Grant, HolderId, Holding, LastBreak, LeaseBackend, LeaseKey, LeaseState, Payload,
    Renewal, TimeAuthority, TtlRule, Version, MAX_PAYLOAD_LEN,
};
use tokio::sync::watch;

/// The in-memory lease backend. See the crate docs.
///
/// Clones share the store, its clock and its fault hooks.
#[derive(Clone)]
pub struct Fake {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Fake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fake").finish_non_exhaustive()
    }
}

struct Shared {
    state: Mutex<State>,
    /// Bumped on every change (and every clock move): wakes `wait_for_change`.
    changes: watch::Sender<u64>,
    capabilities: Capabilities,
}

#[derive(Default)]
struct State {
    /// The backend clock: time since the fake's epoch.
    now: Duration,
    entries: HashMap<LeaseKey, Entry>,
    /// Audit records left by `break_lease`, oldest first.
    audit: Vec<(LeaseKey, BreakNote, Option<Holding>)>,
    fail_next: u32,
    lose_next: u32,
    latency: Duration,
}

impl State {
    /// The fault decision for one operation: an injected failure, then a
    /// lost answer, as many as were asked for.
    fn next_fault(&mut self) -> Fault {
        if self.fail_next > 0 {
            self.fail_next -= 1;
            Fault::Fail
        } else if self.lose_next > 0 {
            self.lose_next -= 1;
            Fault::LoseResponse
        } else {
            Fault::None
        }
    }
}

/// One key. `last_fence` outlives the record: release and expiry must never
/// let a fence go backwards.
#[derive(Default)]
struct Entry {
    last_fence: u64,
    record: Option<Record>,
}

enum Record {
    Live {
        holder: HolderId,
        fence: Fence,
        ttl: Duration,
        expires_at: Duration,
        payload: Payload,
    },
    /// Bytes that are not a lease record (see [`Fake::write_raw`]).
    Corrupt(Vec<u8>),
}

/// What the fault hooks decided for one operation.
enum Fault {
    None,
    /// Fail before applying.
    Fail,
    /// Apply, then lose the answer.
    LoseResponse,
}

impl Default for Fake {
    fn default() -> Self {
        Self::new()
    }
}

impl Fake {
    /// An empty store with 1 ms TTL granularity (1 ms to 1 day), clock at zero.
    pub fn new() -> Self {
        Self::with_ttl_rule(
            TtlRule::new(Duration::from_millis(1)..=Duration::from_secs(24 * 3600))
                .rounded_to(Duration::from_millis(1)),
        )
    }

    /// An empty store that rounds TTLs by `rule`, to mimic a real backend
    /// (e.g. whole seconds, minimum 1 s, like etcd and NATS).
    pub fn with_ttl_rule(rule: TtlRule) -> Self {
        let (changes, _) = watch::channel(0);
        Fake {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                changes,
                capabilities: Capabilities::new(TimeAuthority::BackendClock, rule)
                    .with_watch(true)
                    .with_exclusion(Exclusion::Atomic)
                    .with_fence_scope(FenceScope::PerKey)
                    .with_max_payload(MAX_PAYLOAD_LEN),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-written
        // (every mutation is a single assignment), so a poisoned lock is safe to reuse.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn changed(&self) {
        self.shared.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The backend clock: time since this store was created, as moved by
    /// [`advance`](Fake::advance) and [`set`](Fake::set).
    pub fn now(&self) -> Duration {
        self.lock().now
    }

    /// Moves the backend clock forward; grants whose TTL runs out expire.
    pub fn advance(&self, by: Duration) {
        {
            let mut s = self.lock();
            s.now = s.now.saturating_add(by);
        }
        self.changed();
    }

    /// Sets the backend clock, forward or **backward** (a clock jump). Going
    /// back lengthens live grants on the backend's time; holders are still
    /// bounded by their own deadlines.
    pub fn set(&self, now: Duration) {
        self.lock().now = now;
        self.changed();
    }

    /// Expires the live grant on `key` now, as if its TTL had lapsed; the next
    /// acquire wins with a higher fence (for tests: expire a key now).
    /// Returns whether there was a live grant.
    pub fn expire(&self, key: &LeaseKey) -> bool {
        let found = {
            let mut s = self.lock();
            let now = s.now;
            match s.entries.get_mut(key) {
                Some(e) if matches!(&e.record, Some(r) if r.live_at(now)) => {
                    e.record = None;
                    true
                }
                _ => false,
            }
        };
        if found {
            self.changed();
        }
        found
    }

    /// Removes the record at `key`, live or not, as an operator or a cleanup
    /// job deleting it behind the library's back would. A live grant ends at
    /// once; the fence counter is kept, so the next grant's fence is still
    /// higher. Returns whether there was a record.
    pub fn delete_record(&self, key: &LeaseKey) -> bool {
        let found = {
            let mut s = self.lock();
            s.entries
                .get_mut(key)
                .is_some_and(|e| e.record.take().is_some())
        };
        if found {
            self.changed();
        }
        found
    }

    /// The next `n` operations (of any kind, from any clone) fail with
    /// [`Error::Unavailable`] without being applied.
    pub fn fail_next(&self, n: u32) {
        self.lock().fail_next = n;
    }

    /// The next `n` operations are applied, but their answers are lost: the
    /// caller gets [`Error::Unavailable`] (outcome unknown).
    pub fn lose_next_responses(&self, n: u32) {
        self.lock().lose_next = n;
    }

    /// Every operation takes at least `latency` (real time) between the
    /// request being sent and it being applied; zero turns it off.
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// Stores `bytes` at `key` as a record that does not parse, as another
    /// program or a damaged store would leave it. Reads and acquires of the key
    /// then fail with [`Error::CorruptRecord`]; the fence counter is kept.
    pub fn write_raw(&self, key: &LeaseKey, bytes: impl Into<Vec<u8>>) {
        self.lock().entries.entry(key.clone()).or_default().record =
            Some(Record::Corrupt(bytes.into()));
        self.changed();
    }

    /// Waits out the injected latency, then takes the fault decision for one
    /// operation.
    async fn enter(&self) -> Fault {
        let latency = {
            let mut s = self.lock();
            if s.latency.is_zero() {
                return s.next_fault();
            }
            s.latency
        };
        tokio::time::sleep(latency).await;
        self.lock().next_fault()
    }

    fn answer<T>(
        &self,
        fault: Fault,
        applied: Result<T, Error>,
        changed: bool,
    ) -> Result<T, Error> {
        if changed {
            self.changed();
        }
        match fault {
            Fault::LoseResponse => Err(Error::Unavailable {
                detail: "lease-fake: response lost after the operation was applied".into(),
                source: None,
            }),
            _ => applied,
        }
    }
}

fn injected_failure() -> Error {
    Error::Unavailable {
        detail: "lease-fake: injected failure, operation not applied".into(),
        source: None,
    }
}

impl Record {
    fn live_at(&self, now: Duration) -> bool {
        match self {
            Record::Live { expires_at, .. } => now < *expires_at,
            Record::Corrupt(_) => true,
        }
    }
}

fn corrupt(key: &LeaseKey, bytes: &[u8]) -> Error {
    Error::corrupt(
        key,
        format!("{} bytes that are not a lease record", bytes.len()),
    )
}

fn version(fence: Fence) -> Version {
    Version::new(fence.get().to_string())
}

impl LeaseBackend for Fake {
    fn capabilities(&self) -> Capabilities {
        self.shared.capabilities
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            let sent = Instant::now();
            let ttl = self.shared.capabilities.ttl.effective(req.ttl)?;
            let fault = self.enter().await;
            if let Fault::Fail = fault {
                return Err(injected_failure());
            }
            let (result, changed) = {
                let mut s = self.lock();
                let now = s.now;
                let entry = s.entries.entry(req.key.clone()).or_default();
                match &mut entry.record {
                    Some(Record::Corrupt(bytes)) => (Err(corrupt(&req.key, bytes)), false),
                    Some(Record::Live {
                        holder,
                        fence,
                        ttl: held_ttl,
                        expires_at,
                        payload,
                    }) if now < *expires_at => {
                        if *holder == req.holder {
                            // Our own live grant (an earlier answer was lost): hand it back,
                            // extended from this request, so the new deadline is backed, and
                            // never shorter: a grant of this term whose answer did arrive
                            // counts its deadline, and its renewals, from the longer TTL.
                            let ttl = ttl.max(*held_ttl);
                            *expires_at = now + ttl;
                            *held_ttl = ttl;
                            *payload = req.payload;
                            let grant =
                                Grant::new(req.key, req.holder, *fence, ttl, sent, version(*fence));
                            (Ok(Acquire::Granted(grant)), true)
                        } else {
                            let holding =
                                Holding::new(holder.clone(), *fence, *held_ttl, payload.clone())
                                    .with_remaining(Some(*expires_at - now));
                            (Ok(Acquire::Held(holding)), false)
                        }
                    }
                    _ => {
                        entry.last_fence += 1;
                        let fence = Fence(entry.last_fence);
                        entry.record = Some(Record::Live {
                            holder: req.holder.clone(),
                            fence,
                            ttl,
                            expires_at: now + ttl,
                            payload: req.payload,
                        });
                        let grant =
                            Grant::new(req.key, req.holder, fence, ttl, sent, version(fence));
                        (Ok(Acquire::Granted(grant)), true)
                    }
                }
            };
            self.answer(fault, result, changed)
        })
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(async move {
            let sent = Instant::now();
            let fault = self.enter().await;
            if let Fault::Fail = fault {
                return Err(injected_failure());
            }
            let (result, changed) = {
                let mut s = self.lock();
                let now = s.now;
                match s
                    .entries
                    .get_mut(grant.key())
                    .and_then(|e| e.record.as_mut())
                {
                    Some(Record::Corrupt(bytes)) => (Err(corrupt(grant.key(), bytes)), false),
                    Some(Record::Live {
                        holder,
                        fence,
                        ttl,
                        expires_at,
                        payload: stored,
                    }) if now < *expires_at
                        && holder == grant.holder()
                        && *fence == grant.fence() =>
                    {
                        *expires_at = now + *ttl;
                        // Only a new payload is a change a watcher sees: an
                        // extension alone wakes nobody.
                        let changed = payload.is_some();
                        if let Some(p) = payload {
                            *stored = p;
                        }
                        // The version is the fence's, which a renewal keeps.
                        let renewed = grant.renewed(sent, grant.version().clone());
                        (Ok(Renewal::Renewed(renewed)), changed)
                    }
                    _ => (Ok(Renewal::Lost), false),
                }
            };
            self.answer(fault, result, changed)
        })
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let fault = self.enter().await;
            if let Fault::Fail = fault {
                return Err(injected_failure());
            }
            let changed = {
                let mut s = self.lock();
                let now = s.now;
                match s.entries.get_mut(grant.key()) {
                    Some(entry) => {
                        let ours = matches!(
                            &entry.record,
                            Some(Record::Live { holder, fence, expires_at, .. })
                                if now < *expires_at && holder == grant.holder() && *fence == grant.fence()
                        );
                        if ours {
                            entry.record = None;
                        }
                        ours
                    }
                    None => false,
                }
            };
            self.answer(fault, Ok(()), changed)
        })
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(async move {
            let fault = self.enter().await;
            if let Fault::Fail = fault {
                return Err(injected_failure());
            }
            let result = observe(&self.lock(), key);
            self.answer(fault, result, false)
        })
    }

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(async move {
            let fault = self.enter().await;
            if let Fault::Fail = fault {
                return Err(injected_failure());
            }
            let broken = {
                let mut s = self.lock();
                let previous = observe(&s, key).ok().and_then(|st| st.holding().cloned());
                if let Some(e) = s.entries.get_mut(key) {
                    // The record goes, the fence counter stays.
                    e.record = None;
                }
                s.audit.push((key.clone(), note.clone(), previous.clone()));
                Broken::new(
                    previous,
                    format!("lease-fake audit log entry {}", s.audit.len() - 1),
                )
            };
            self.answer(fault, Ok(broken), true)
        })
    }

    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(async move {
            let s = self.lock();
            Ok(s.audit
                .iter()
                .rev()
                .find(|(k, _, _)| k == key)
                .map(|(_, note, previous)| {
                    LastBreak::new(
                        previous.as_ref().map(|h| h.holder.clone()),
                        previous.as_ref().map(|h| h.fence),
                        note.clone(),
                    )
                }))
        })
    }

    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let mut rx = self.shared.changes.subscribe();
            loop {
                // Subscribed before looking, so a change between the look and
                // the wait still wakes us.
                rx.borrow_and_update();
                match observe(&self.lock(), key) {
                    // A new holder, a release, an expiry or a new payload.
                    Ok(now) if now.same_state(seen) => {}
                    _ => return Ok(()),
                }
                if rx.changed().await.is_err() {
                    return Ok(());
                }
            }
        })
    }
}

/// The state of `key` at the store's current time.
fn observe(s: &State, key: &LeaseKey) -> Result<LeaseState, Error> {
    match s.entries.get(key).and_then(|e| e.record.as_ref()) {
        Some(Record::Corrupt(bytes)) => Err(corrupt(key, bytes)),
        Some(Record::Live {
            holder,
            fence,
            ttl,
            expires_at,
            payload,
        }) if s.now < *expires_at => Ok(LeaseState::Held(
            Holding::new(holder.clone(), *fence, *ttl, payload.clone())
                .with_remaining(Some(*expires_at - s.now)),
        )),
        _ => Ok(LeaseState::Free),
    }
}
