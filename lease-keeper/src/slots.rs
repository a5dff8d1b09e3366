//! What shared leases and permits are built from: numbered slot keys under
//! a key, taking one of several keys, and waiting for any of several keys
//! to change.
//!
//! Both primitives are built on the plain contract alone — one exclusive
//! grant per key — so they work on every backend unchanged: a permit is a
//! grant on one of `N` slot keys, and a shared holder registers on one of
//! [`MAX_SHARED`](crate::MAX_SHARED) slot keys.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireRequest, Error, Grant, Holding, LeaseBackend, LeaseKey, LeaseState, Payload, Timing,
};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, timeout_at, Instant};

use crate::acquire::{settle, Attempts};
use crate::clock::{jittered, later, Sent};
use crate::error::AcquireError;
use crate::keeper::Keeper;

/// `<key>/<kind>-<i>`, or why that is no key (too long, above all).
pub(crate) fn slot_key(key: &LeaseKey, kind: &str, i: u32) -> Result<LeaseKey, Error> {
    LeaseKey::new(format!("{key}/{kind}-{i}"))
}

/// The slot keys `<key>/<kind>-0` … `<key>/<kind>-<n-1>`.
pub(crate) fn slot_keys(key: &LeaseKey, kind: &str, n: u32) -> Result<Vec<LeaseKey>, Error> {
    (0..n).map(|i| slot_key(key, kind, i)).collect()
}

/// The end of a wait, and when it began.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WaitEnd {
    start: Instant,
    /// `None`: no end.
    end: Option<Instant>,
}

impl WaitEnd {
    pub(crate) fn new(wait: Duration) -> Self {
        let start = Instant::now();
        WaitEnd {
            start,
            end: start.checked_add(wait),
        }
    }

    /// What is left of the wait (`Duration::MAX`: no end).
    pub(crate) fn remaining(&self) -> Duration {
        self.end.map_or(Duration::MAX, |e| {
            e.saturating_duration_since(Instant::now())
        })
    }

    /// How long the wait has lasted.
    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub(crate) fn passed(&self) -> bool {
        self.end.is_some_and(|e| Instant::now() >= e)
    }

    /// `t`, or the end of the wait if that comes first.
    pub(crate) fn cap(&self, t: Instant) -> Instant {
        self.end.map_or(t, |e| t.min(e))
    }

    /// The timeout this wait ends in, for `key`, last seen held by `holder`.
    pub(crate) fn timeout(&self, key: &LeaseKey, holder: Option<Holding>) -> AcquireError {
        AcquireError::Timeout {
            key: key.clone(),
            waited: self.start.elapsed(),
            holder: holder.map(|h| h.holder),
        }
    }
}

/// One pass over slot keys: the first of `slots` (tried from a random one
/// on, so that many takers spread) that this call's term can take, with the
/// send instant of its request — for the caller to keep at once, without
/// another await —; or every slot as it was seen held, to watch.
///
/// An attempt whose outcome is unknown is settled in the background (the
/// grant it may have left is released if found) and the call goes on with a
/// fresh term, so that settling can never release a grant this call keeps.
pub(crate) async fn take_one(
    keeper: &Keeper,
    attempts: &mut Attempts,
    slots: &[LeaseKey],
    ttl: Duration,
    payload: &Payload,
) -> Result<Result<(Grant, Sent), Vec<(LeaseKey, LeaseState)>>, Error> {
    let n = slots.len();
    if n == 0 {
        return Ok(Err(Vec::new()));
    }
    // `random_unit` is in [0, 1): the index is below `n`.
    let first = ((Timing::random_unit() * n as f64) as usize).min(n - 1);
    let mut seen = Vec::new();
    let mut unknown = None;
    for slot in slots.iter().cycle().skip(first).take(n) {
        match attempts.try_grant_settled(slot, ttl, payload.clone()).await {
            Ok(Ok(granted)) => return Ok(Ok(granted)),
            Ok(Err(h)) => seen.push((slot.clone(), LeaseState::Held(h))),
            Err(e) if e.is_unknown_outcome() => {
                *attempts = keeper.attempts();
                unknown = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    match unknown {
        // No slot was taken, and one answer was lost: report it, so that
        // the caller retries (pausing) rather than waits for a change.
        Some(e) => Err(e),
        None => Ok(Err(seen)),
    }
}

/// Gives a slot up, and with it the term that took it: a release that
/// failed may still be on its way, and would end the same grant should this
/// term take the slot again (the backend hands a term its own live grant
/// back). Such a release is settled in the background too.
pub(crate) async fn leave(keeper: &Keeper, attempts: &mut Attempts, slot: &Grant) {
    let (backend, grant) = (keeper.backend().clone(), slot.clone());
    let holder = attempts.holder.clone();
    // From a task of its own, which goes on if this call is dropped.
    let release = tokio::spawn(async move {
        let ttl = grant.ttl();
        let released = tokio::time::timeout(ttl, backend.release(&grant)).await;
        if !matches!(released, Ok(Ok(()))) {
            let req = AcquireRequest::new(grant.key().clone(), holder).ttl(ttl);
            settle(backend, req).await;
        }
    });
    *attempts = keeper.attempts();
    let _ = release.await;
}

/// A slot grant taken by a call that may yet be dropped: released from a
/// task of its own if the call ends before it is handed over, so that it
/// does not keep an exclusive holder waiting for its TTL.
pub(crate) struct Unkept {
    backend: Arc<dyn LeaseBackend>,
    grant: Option<Grant>,
}

impl Unkept {
    pub(crate) fn new(backend: Arc<dyn LeaseBackend>, grant: &Grant) -> Self {
        Unkept {
            backend,
            grant: Some(grant.clone()),
        }
    }

    /// The grant is handed over (or given up by the caller itself).
    pub(crate) fn kept(mut self) {
        self.grant = None;
    }
}

impl Drop for Unkept {
    fn drop(&mut self) {
        let Some(grant) = self.grant.take() else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let backend = self.backend.clone();
            rt.spawn(async move {
                let _ = tokio::time::timeout(grant.ttl(), backend.release(&grant)).await;
            });
        }
    }
}

/// Reads every key at once; the ones found held, with their states.
pub(crate) async fn held_among(
    backend: &Arc<dyn LeaseBackend>,
    keys: &[LeaseKey],
) -> Result<Vec<(LeaseKey, LeaseState)>, Error> {
    let mut reads = JoinSet::new();
    for key in keys {
        let (backend, key) = (backend.clone(), key.clone());
        reads.spawn(async move {
            let state = backend.read(&key).await;
            (key, state)
        });
    }
    let mut held = Vec::new();
    while let Some(done) = reads.join_next().await {
        let (key, state) = done.map_err(|e| Error::Unavailable {
            detail: format!("a read of a slot key ended without an answer: {e}"),
            source: None,
        })?;
        let state = state?;
        if !state.is_free() {
            held.push((key, state));
        }
    }
    held.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(held)
}

/// Waits until any of `seen` may have changed, a seen grant may have run
/// out, `idle` has passed, or the wait ends: by watch where the backend has
/// one, else by a jittered pause of `pause`.
pub(crate) async fn wait_for_any(
    backend: &Arc<dyn LeaseBackend>,
    seen: &[(LeaseKey, LeaseState)],
    pause: Duration,
    idle: Duration,
    end: &WaitEnd,
) {
    let now = Instant::now();
    if !backend.capabilities().watch || seen.is_empty() {
        sleep_until(end.cap(later(now, jittered(pause)))).await;
        return;
    }
    let bound = seen
        .iter()
        .map(|(_, s)| s.recheck_within(idle))
        .min()
        .unwrap_or(idle);
    let mut watches = JoinSet::new();
    for (key, state) in seen {
        let (backend, key, state) = (backend.clone(), key.clone(), state.clone());
        watches.spawn(async move { backend.wait_for_change(&key, &state).await });
    }
    let woke = timeout_at(end.cap(later(now, bound)), watches.join_next()).await;
    if let Ok(Some(Ok(Err(_)))) = woke {
        // The watch failed (or the backend has none after all): pause
        // rather than spin on a failing watch.
        sleep_until(end.cap(later(Instant::now(), jittered(pause)))).await;
    }
}
