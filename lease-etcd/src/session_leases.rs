//! The session leases one client knows: which etcd lease serves which TTL,
//! and until when it is known to live. The acquires that grant them and the
//! renewals that lean on them are [the session module's](crate::session).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sweep::Bindings;

/// How many keys [`Sessions::refused`] remembers before it forgets them all.
const REFUSED_MAX: usize = 4096;

/// A session lease as this client knows it.
#[derive(Clone, Copy, Debug)]
struct Session {
    /// The etcd lease.
    id: i64,
    /// The send instant of the last keep-alive (or of the grant) that etcd
    /// answered alive: the lease lives at least a TTL from it.
    alive_from: Instant,
    /// Until when the lease is known to live: `alive_from` plus the TTL.
    alive_until: Instant,
}

/// A session lease is *fresh* while its last answered keep-alive was sent
/// less than this share of the TTL ago: an acquire then binds its key with
/// the transaction alone and counts the grant from that keep-alive, leaving
/// its holder at least `deadline fraction − 1/6` of the TTL to write (1/2 with
/// the default timing); an older session gets a keep-alive beside the
/// transaction.
const FRESH_SHARE: u32 = 6;

/// The session leases of one client, by TTL in whole seconds.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<u64, Session>>,
    /// Serialises the creation of session leases, so that acquires racing on
    /// a client without a session create one lease, not one each.
    pub(crate) create: tokio::sync::Mutex<()>,
    /// Keys whose last acquire by this client was refused: the next attempt
    /// on them sends its transaction alone (one request), and sends the
    /// keep-alive only if it wins.
    refused: Mutex<HashSet<String>>,
    /// The keys bound to the session leases, swept when nobody renews them.
    pub(crate) bindings: Arc<Bindings>,
    /// Every session lease this client granted and has not seen gone, the
    /// ones no longer current included: a lease replaced in `map` (its
    /// known end near) may still be alive in etcd, with keys on it whose
    /// renewals must still move their dues. With each, when it was
    /// replaced, if it was.
    ours: Mutex<HashMap<i64, Option<Instant>>>,
}

/// `sent` plus `ttl_secs`. A TTL past the clock's range counts as run out
/// (`sent` itself): the next acquire asks for a new session rather than
/// trusting an overflowed instant.
fn until(sent: Instant, ttl_secs: u64) -> Instant {
    sent.checked_add(Duration::from_secs(ttl_secs))
        .unwrap_or(sent)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is a map operation that cannot leave the map
    // half-changed, so a poisoned lock is safe to keep using.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A session lease replaced this long ago, with no key known to be bound
/// to it, is no longer remembered as this client's.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Some room for the requests of an acquire: a session lease this close to
/// its known end is treated as gone, and a new one is granted.
const MARGIN: Duration = Duration::from_millis(250);

impl Sessions {
    /// The session lease for `ttl_secs`, unless none is known or it may have
    /// run out already; with it, the instant a key bound to it now may count
    /// from without a keep-alive of its own, if the session is fresh.
    pub(crate) fn current(&self, ttl_secs: u64) -> Option<(i64, Option<Instant>)> {
        let map = lock(&self.map);
        let s = map.get(&ttl_secs)?;
        let now = Instant::now();
        if now.checked_add(MARGIN).unwrap_or(now) >= s.alive_until {
            return None;
        }
        let fresh_for = Duration::from_secs(ttl_secs) / FRESH_SHARE;
        let fresh = now.saturating_duration_since(s.alive_from) < fresh_for;
        Some((s.id, fresh.then_some(s.alive_from)))
    }

    /// The last answered keep-alive of session lease `id` (of `ttl_secs`),
    /// if the session is fresh and that keep-alive was sent at least a
    /// [`FRESH_SHARE`]th of the TTL after `counted_from`: a renewal of a key
    /// counted from `counted_from` may then count from it instead of sending
    /// a keep-alive of its own, and still moves its deadline on by that much
    /// (so a holder renewing on schedule never renews again at once).
    pub(crate) fn kept_alive_since(
        &self,
        ttl_secs: u64,
        id: i64,
        counted_from: Instant,
    ) -> Option<Instant> {
        let (current, from) = self.current(ttl_secs)?;
        let from = from.filter(|_| current == id)?;
        let step = Duration::from_secs(ttl_secs) / FRESH_SHARE;
        (from.saturating_duration_since(counted_from) >= step).then_some(from)
    }

    /// A new session lease for `ttl_secs`, granted by a request sent at `sent`.
    pub(crate) fn insert(&self, ttl_secs: u64, id: i64, sent: Instant) {
        let session = Session {
            id,
            alive_from: sent,
            alive_until: until(sent, ttl_secs),
        };
        let replaced = lock(&self.map).insert(ttl_secs, session).map(|s| s.id);
        let mut ours = lock(&self.ours);
        ours.insert(id, None);
        if let Some(old) = replaced.filter(|old| *old != id) {
            ours.insert(old, Some(sent));
        }
        // A lease replaced a while ago that no key is known to be bound to
        // any more is forgotten (an acquire that picked it before it was
        // replaced has long bound or failed).
        let stale: Vec<i64> = ours
            .iter()
            .filter(|(_, at)| {
                at.is_some_and(|at| sent.saturating_duration_since(at) > FORGET_AFTER)
            })
            .map(|(l, _)| *l)
            .collect();
        if !stale.is_empty() {
            let referenced = self.bindings.referenced(&stale);
            ours.retain(|l, _| !stale.contains(l) || referenced.contains(l));
        }
    }

    /// etcd answered a keep-alive of `id`, sent at `sent`, alive.
    pub(crate) fn alive(&self, id: i64, sent: Instant) {
        for (ttl, s) in lock(&self.map).iter_mut() {
            if s.id == id && sent > s.alive_from {
                s.alive_from = sent;
                s.alive_until = s.alive_until.max(until(sent, *ttl));
            }
        }
    }

    /// etcd has no lease `id` any more (expired or revoked): every key bound
    /// to it is gone, and the next acquire grants a new session lease.
    pub(crate) fn gone(&self, id: i64) {
        lock(&self.ours).remove(&id);
        lock(&self.map).retain(|_, s| s.id != id);
    }

    /// Whether `id` is one of this client's session leases, current or
    /// not, as long as it was not seen gone.
    pub(crate) fn is_session(&self, id: i64) -> bool {
        id != 0 && lock(&self.ours).contains_key(&id)
    }

    /// Whether the last acquire of `ekey` by this client was refused.
    pub(crate) fn was_refused(&self, ekey: &str) -> bool {
        lock(&self.refused).contains(ekey)
    }

    /// Remembers whether the last acquire of `ekey` was refused.
    pub(crate) fn note_refused(&self, ekey: &str, refused: bool) {
        let mut set = lock(&self.refused);
        if !refused {
            set.remove(ekey);
            return;
        }
        if set.len() >= REFUSED_MAX {
            set.clear();
        }
        set.insert(ekey.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_current_until_its_known_end() {
        let s = Sessions::default();
        assert_eq!(s.current(10), None);
        let long_ago = Instant::now() - Duration::from_secs(20);
        s.insert(10, 7, long_ago);
        assert_eq!(s.current(10), None, "ran out 10 s ago");
        let now = Instant::now();
        s.alive(7, now);
        assert_eq!(s.current(10), Some((7, Some(now))), "fresh");
        s.alive(7, now - Duration::from_secs(1));
        assert_eq!(
            s.current(10),
            Some((7, Some(now))),
            "an older keep-alive moves nothing"
        );
        assert!(s.is_session(7));
        s.gone(7);
        assert_eq!(s.current(10), None);
        assert!(!s.is_session(7));
    }

    #[test]
    fn a_session_kept_alive_a_while_ago_is_current_but_not_fresh() {
        let s = Sessions::default();
        let a_while_ago = Instant::now() - Duration::from_secs(3);
        s.insert(10, 7, a_while_ago);
        assert_eq!(
            s.current(10),
            Some((7, None)),
            "3 s of a 10 s TTL is past a sixth"
        );
        assert_eq!(s.current(30), None, "no session of that TTL");
    }

    #[test]
    fn a_renewal_counts_from_a_fresh_keep_alive_only_if_it_moves_on() {
        let s = Sessions::default();
        let now = Instant::now();
        s.insert(12, 7, now);
        assert_eq!(s.kept_alive_since(12, 7, now), None, "no later keep-alive");
        let two_ago = now - Duration::from_secs(2);
        assert_eq!(s.kept_alive_since(12, 7, two_ago), Some(now), "2 s on");
        assert_eq!(s.kept_alive_since(12, 8, two_ago), None, "another lease");
        let one_ago = now - Duration::from_secs(1);
        assert_eq!(
            s.kept_alive_since(12, 7, one_ago),
            None,
            "1 s of 12 is too little"
        );
    }

    #[test]
    fn a_replaced_session_stays_ours_until_long_unused() {
        let s = Sessions::default();
        let long_ago = Instant::now() - 2 * FORGET_AFTER;
        s.insert(10, 7, long_ago);
        s.insert(10, 8, long_ago + Duration::from_secs(1));
        assert!(s.is_session(7), "replaced a moment ago");
        s.insert(10, 9, Instant::now());
        assert!(!s.is_session(7), "replaced long ago, no key on it");
        assert!(s.is_session(8) && s.is_session(9));
    }

    #[test]
    fn refusals_are_remembered_per_key() {
        let s = Sessions::default();
        s.note_refused("a", true);
        assert!(s.was_refused("a") && !s.was_refused("b"));
        s.note_refused("a", false);
        assert!(!s.was_refused("a"));
    }
}
