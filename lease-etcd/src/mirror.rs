//! The client's view of its key prefix, kept current by one watch, so that
//! a renewal with sessions needs no request of its own for its key.
//!
//! A keep-alive of a session lease proves the lease lives; it does not
//! prove that a key is still on it, still the same grant: a break, a
//! release by another copy of the grant or a new payload written by one
//! changes or removes the key while the lease lives on. Reading every
//! renewing key costs etcd a range and the client a decode per key. The
//! mirror instead keeps the create revision, mod revision and lease of
//! every key under the client's prefix from one prefix watch (created
//! first, then seeded by a keys-only range read), and a renewal
//! asks the watch for its progress: once etcd answers a progress request
//! sent after the renewal began, every change etcd had applied when it
//! answered is in the mirror, and a key found there with the grant's
//! create revision, the mod revision its holder last wrote and its lease
//! was changed by nobody since. Progress requests are shared like
//! keep-alives: one in flight at a time, and every renewal that began
//! before it was sent takes its answer. So renewals cost the keep-alive of
//! their session and one progress message per batch, whatever the number
//! of keys, and the watch delivers nothing while nobody writes.
//!
//! # Only on a one-member cluster, etcd 3.5.8 or later
//! A progress notification reports the revision the answering member has
//! applied, and a member applies a write only after it was committed: on a
//! cluster of one voting member everything acknowledged to anyone before
//! the request is in it, but on a larger cluster the member serving the
//! watch may lag a write another member acknowledged. There the mirror
//! stays off and renewals read their keys (batched), which etcd serves
//! linearizably. The membership is checked before the watch starts and
//! every [`MEMBERS_EVERY`] while it runs, and every answer the mirror
//! trusts (the watch's creation, its events and progress, the server's
//! version) must come from the one voter in the raft term that check saw;
//! anything else restarts the watch. A member added without an election
//! is trusted as absent until the next check, up to [`MEMBERS_EVERY`]
//! plus one request's limit later. Releases before 3.5.8 answer a progress
//! request at once, ahead of events still queued for the watcher, so there
//! the mirror stays off too. A progress request unanswered for
//! [`PROGRESS_LIMIT`] (etcd drops one it cannot answer yet, as does its
//! gRPC proxy) restarts the watch, with the restarts backed off while
//! they repeat; renewals meanwhile read.
//!
//! # Cancel safety
//! [`Mirror::caught_up`] is cancel safe: a dropped wait leaves the
//! progress request it asked for to answer later waiters.

use hashbrown::hash_map::RawEntryMut;
use hashbrown::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, GetOptions, WatchOptions, WatchResponse};
use lease_core::LeaseKey;
use tokio::sync::Notify;

/// How often the membership is checked, while the mirror is on and while
/// it waits on a cluster of several members.
const MEMBERS_EVERY: Duration = Duration::from_secs(10);
/// The most keys one page of the initial range read returns.
const PAGE: i64 = 10_000;
/// The longest the watch task waits for one of its own requests.
const REQUEST_LIMIT: Duration = Duration::from_secs(5);
/// How long a progress request may go unanswered before the watch is
/// restarted.
const PROGRESS_LIMIT: Duration = Duration::from_secs(1);
/// A watch that lived this long before it ended was not a failure: the
/// next start is not backed off.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// How long a failed start waits before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A key as the mirror knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    create_revision: i64,
    mod_revision: i64,
    lease: i64,
}

impl Entry {
    /// A key granted by this client that the watch has not shown yet: no
    /// grant matches it (every create revision is positive), so a renewal
    /// reads until the watch's event fills it in.
    const UNSEEN: Entry = Entry {
        create_revision: 0,
        mod_revision: 0,
        lease: 0,
    };
}

#[derive(Default)]
struct State {
    /// By the caller's key (the etcd key without the prefix): keys under
    /// the prefix that are no valid lease key belong to no grant. A
    /// renewal leaves its grant's copy of the key here, so that the next
    /// one finds its entry without comparing the key's text.
    keys: HashMap<LeaseKey, Entry>,
    /// The watch is established on a one-member cluster, the range read
    /// behind it complete: progress answers mean what the module says.
    live: bool,
    /// The watch task runs (or is starting).
    running: bool,
    /// The client was closed: no more watching.
    closed: bool,
    /// The send instant of the progress request in flight.
    outstanding: Option<Instant>,
    /// The send instant of the last progress request answered since the
    /// watch (re)started.
    answered: Option<Instant>,
    /// A waiter needs a progress request sent after the one in flight.
    wanted: bool,
    /// Bumped whenever the watch restarts: a waiter's progress request
    /// belongs to one watch.
    generation: u64,
    /// The one voting member and its raft term, as the membership check
    /// saw them: a response from another member or of another term
    /// restarts the watch (and so checks again).
    voter: Voter,
    /// The watch's first try ended (established or failed).
    tried: bool,
    /// The revision the seeding range read was served at: events at or
    /// below it are in the mirror already.
    seeded_at: i64,
    /// Every change under the prefix up to this revision is applied (the
    /// seed's revision, then each event's and progress answer's).
    shown: i64,
    /// When the watch went live (a restart after a watch that lived
    /// [`HEALTHY_AFTER`] is not a repeated failure).
    live_since: Option<Instant>,
}

/// The mirror of one client's prefix.
pub(crate) struct Mirror {
    prefix: String,
    state: Mutex<State>,
    /// Progress answered, the watch restarted or the client closed.
    changed: Notify,
    /// A waiter wants a progress request sent, or the client closed.
    wake_task: Notify,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// What the mirror says of a key after catching up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Exactly as the grant last left it: nobody wrote or deleted it since.
    Unchanged,
    /// Written, deleted or moved since, or not known: read it.
    Changed,
}

impl Mirror {
    pub(crate) fn new(prefix: &str) -> Arc<Self> {
        Arc::new(Mirror {
            prefix: prefix.to_string(),
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            wake_task: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every critical section leaves the state whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the watch on the current tokio runtime (without one the
    /// mirror stays off) and waits, up to `timeout`, for its first try to
    /// end: established, or failed (it is tried again in the background).
    pub(crate) async fn start(self: &Arc<Self>, client: &Client, timeout: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut s = self.state();
            if s.running || s.closed {
                return;
            }
            s.running = true;
        }
        runtime.spawn(run(Arc::downgrade(self), client.clone()));
        let tried = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.state().tried {
                    return;
                }
                changed.await;
            }
        };
        let _ = tokio::time::timeout(timeout, tried).await;
    }

    /// Stops the watch for good.
    pub(crate) fn close(&self) {
        self.state().closed = true;
        self.wake_task.notify_one();
        self.changed.notify_waiters();
    }

    /// Whether every change etcd applied before a progress request sent at
    /// or after `since` is in the mirror, waiting up to `timeout` for it;
    /// `false` at once when the mirror is off (a cluster of several
    /// members, no tokio runtime, the watch not established), and when the
    /// watch restarts or the wait runs out: the caller then reads the key
    /// instead.
    pub(crate) async fn caught_up(&self, since: Instant, timeout: Duration) -> bool {
        let Some(deadline) = Instant::now().checked_add(timeout) else {
            return false;
        };
        let generation = {
            let s = self.state();
            if !s.live {
                return false;
            }
            s.generation
        };
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut s = self.state();
                if !s.live || s.generation != generation {
                    return false;
                }
                if s.answered.is_some_and(|a| a >= since) {
                    return true;
                }
                if s.outstanding.is_none_or(|o| o < since) {
                    s.wanted = true;
                    self.wake_task.notify_one();
                }
            }
            if tokio::time::timeout_at(deadline.into(), changed)
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// A grant of `key` (created at revision `fence`) was just handed out:
    /// the mirror keeps the grant's copy of the key from now on. Its
    /// renewals then find their entry by the key's own allocation, instead
    /// of comparing the text of the watch's copy at the first renewal, a
    /// cache miss per key once the group is large. A key whose creation
    /// the watch has not shown yet is held as [`Entry::UNSEEN`] until that
    /// event comes (it keeps the key and replaces the entry), or a restart
    /// of the watch clears it; a renewal that finds one drops it. A key
    /// whose creation was shown and that is absent was deleted since: it
    /// is left out.
    pub(crate) fn adopt(&self, key: &LeaseKey, fence: i64) {
        let mut s = self.state();
        if !s.live {
            return;
        }
        let shown = s.shown;
        match s.keys.raw_entry_mut().from_key(key) {
            RawEntryMut::Occupied(mut found) => {
                if !std::ptr::eq(found.key().as_str(), key.as_str()) {
                    *found.key_mut() = key.clone();
                }
            }
            RawEntryMut::Vacant(_) if fence <= shown => {}
            RawEntryMut::Vacant(v) => {
                v.insert(key.clone(), Entry::UNSEEN);
            }
        }
    }

    /// What the mirror holds for `ekey` against the grant's create revision
    /// (its fence), the mod revision its holder last wrote and its lease.
    /// Meaningful only after [`Mirror::caught_up`] said yes.
    pub(crate) fn seen(&self, key: &LeaseKey, fence: i64, mod_revision: i64, lease: i64) -> Seen {
        let want = Entry {
            create_revision: fence,
            mod_revision,
            lease,
        };
        let mut s = self.state();
        match s.keys.raw_entry_mut().from_key(key) {
            RawEntryMut::Occupied(found) if *found.get() == Entry::UNSEEN => {
                // Adopted, and its creation not shown by the watch yet (a
                // renewal of an earlier copy of the grant): the event to
                // come inserts it again, with the watch's copy of the key.
                found.remove();
                Seen::Changed
            }
            RawEntryMut::Occupied(mut found) => {
                if !std::ptr::eq(found.key().as_str(), key.as_str()) {
                    // An equal key: the map stays as it was.
                    *found.key_mut() = key.clone();
                }
                if *found.get() == want {
                    Seen::Unchanged
                } else {
                    Seen::Changed
                }
            }
            RawEntryMut::Vacant(_) => Seen::Changed,
        }
    }

    /// Applies one watch response; `Err` when the watch must restart.
    fn apply(&self, resp: &WatchResponse) -> Result<(), String> {
        if resp.canceled() {
            return Err(format!(
                "the watch was cancelled (compacted at {}): {}",
                resp.compact_revision(),
                resp.cancel_reason()
            ));
        }
        let mut s = self.state();
        let from = resp.header().map(|h| Voter {
            id: h.member_id(),
            term: h.raft_term(),
        });
        if from != Some(s.voter) {
            return Err(format!("an answer from {from:?}, not {:?}", s.voter));
        }
        if resp.events().is_empty() {
            if resp.created() {
                return Ok(());
            }
            // A progress notification: the answer to the request in flight
            // (none is asked for otherwise). Every event up to its revision
            // came before it on this stream and is applied.
            if let Some(sent) = s.outstanding.take() {
                s.answered = Some(sent);
            }
            if let Some(h) = resp.header() {
                s.shown = s.shown.max(h.revision());
            }
            drop(s);
            self.changed.notify_waiters();
            return Ok(());
        }
        for event in resp.events() {
            let Some(kv) = event.kv().filter(|kv| kv.mod_revision() > s.seeded_at) else {
                continue;
            };
            s.shown = s.shown.max(kv.mod_revision());
            let Some(key) = lease_key(&self.prefix, kv.key()) else {
                continue;
            };
            match event.event_type() {
                EventType::Put => {
                    s.keys.insert(
                        key,
                        Entry {
                            create_revision: kv.create_revision(),
                            mod_revision: kv.mod_revision(),
                            lease: kv.lease(),
                        },
                    );
                }
                EventType::Delete => {
                    s.keys.remove(&key);
                }
            }
        }
        Ok(())
    }

    /// Marks the watch down (to restart) or gone (closed), failing every
    /// wait on it.
    fn down(&self) {
        {
            let mut s = self.state();
            s.live = false;
            s.outstanding = None;
            s.answered = None;
            s.wanted = false;
            s.keys = HashMap::new();
            s.shown = 0;
            s.generation = s.generation.wrapping_add(1);
        }
        self.changed.notify_waiters();
    }
}

/// The lease key an etcd key under `prefix` stores, if it is one.
fn lease_key(prefix: &str, ekey: &[u8]) -> Option<LeaseKey> {
    let key = std::str::from_utf8(ekey).ok()?.strip_prefix(prefix)?;
    LeaseKey::new(key).ok()
}

/// The first key of the range under `prefix`: the prefix, or `\0` for an
/// empty one (etcd refuses an empty key).
fn prefix_start(prefix: &str) -> Vec<u8> {
    if prefix.is_empty() {
        vec![0]
    } else {
        prefix.as_bytes().to_vec()
    }
}

/// The end of the key range under `prefix`: the prefix with its last byte
/// below 0xff raised by one, or every key from it on (`\0`) when there is
/// none.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The watch task: (re)starts the watch until the client is closed.
async fn run(mirror: Weak<Mirror>, client: Client) {
    let mut failures = 0u32;
    loop {
        let Some(m) = mirror.upgrade() else { return };
        if m.state().closed {
            return;
        }
        let outcome = watch_once(&m, &client).await;
        m.state().tried = true;
        m.down();
        if m.state().closed {
            return;
        }
        // A cluster of several members, or a failure: look again later,
        // backing off while failures repeat (a watch the server refuses
        // would otherwise cost a membership check and a range read every
        // second).
        let lasted = m.state().live_since.take().map(|t| t.elapsed());
        let pause = match outcome {
            Stop::Members => MEMBERS_EVERY,
            Stop::Failed if lasted.is_some_and(|d| d >= HEALTHY_AFTER) => {
                failures = 0;
                RETRY_AFTER
            }
            Stop::Failed => {
                failures = failures.saturating_add(1).min(6);
                RETRY_AFTER.saturating_mul(1 << failures)
            }
        };
        drop(m);
        tokio::time::sleep(pause).await;
    }
}

enum Stop {
    /// Not a cluster the mirror can trust: several voting members, or a
    /// release before 3.5.8.
    Members,
    /// The watch or a request failed.
    Failed,
}

/// The keys under the prefix (keys only, paged, all read at one revision)
/// and that revision.
async fn seed(
    client: &Client,
    prefix: &str,
    end: Vec<u8>,
) -> Option<(HashMap<LeaseKey, Entry>, i64)> {
    let mut kv = client.kv_client();
    let mut keys = HashMap::new();
    let mut from = prefix_start(prefix);
    let mut at = 0;
    loop {
        let opts = GetOptions::new()
            .with_range(end.clone())
            .with_keys_only()
            .with_limit(PAGE)
            .with_revision(at);
        let Ok(Ok(resp)) =
            tokio::time::timeout(REQUEST_LIMIT, kv.get(from.clone(), Some(opts))).await
        else {
            return None;
        };
        if at == 0 {
            at = resp.header().map(|h| h.revision()).filter(|r| *r > 0)?;
        }
        for k in resp.kvs() {
            let Some(key) = lease_key(prefix, k.key()) else {
                continue;
            };
            keys.insert(
                key,
                Entry {
                    create_revision: k.create_revision(),
                    mod_revision: k.mod_revision(),
                    lease: k.lease(),
                },
            );
        }
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Some((keys, at)),
        }
    }
}

/// Whether the server answers a progress request only once the events
/// before it were sent on the stream (see [`ordered_progress`]).
/// The answer must come from the voter itself: with several endpoints
/// the client may ask another member (a learner being moved in, on
/// another release).
async fn progress_is_ordered(client: &Client, voter: u64) -> bool {
    let mut mc = client.maintenance_client();
    match tokio::time::timeout(REQUEST_LIMIT, mc.status()).await {
        Ok(Ok(status)) => {
            status.header().map(|h| h.member_id()) == Some(voter)
                && !status.is_learner()
                && ordered_progress(status.version())
        }
        _ => false,
    }
}

/// Whether etcd of `version` answers a progress request only once the
/// events before it were sent: 3.5.8 and later. Earlier releases answer at
/// once, ahead of events still queued for the watcher. A version that does
/// not parse counts as earlier.
fn ordered_progress(version: &str) -> bool {
    let mut parts = version
        .split('.')
        .map(|p| p.split(|c: char| !c.is_ascii_digit()).next().unwrap_or(""))
        .map(|p| p.parse::<u64>().ok());
    let mut next = || parts.next().flatten();
    match (next(), next(), next()) {
        (Some(major), Some(minor), Some(patch)) => (major, minor, patch) >= (3, 5, 8),
        _ => false,
    }
}

/// The one voting member of a one-member cluster, as the membership check
/// saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Voter {
    id: u64,
    /// The raft term of the check: a response of another term restarts
    /// the watch (and so checks again).
    term: u64,
}

/// The voting member, if the cluster has exactly one.
async fn one_member(client: &Client) -> Result<Option<Voter>, Stop> {
    let mut cc = client.cluster_client();
    let members = tokio::time::timeout(REQUEST_LIMIT, cc.member_list())
        .await
        .map_err(|_| Stop::Failed)?
        .map_err(|_| Stop::Failed)?;
    let mut voters = members.members().iter().filter(|m| !m.is_learner());
    let (Some(voter), None) = (voters.next(), voters.next()) else {
        return Ok(None);
    };
    let term = members.header().map(|h| h.raft_term()).unwrap_or(0);
    Ok(Some(Voter {
        id: voter.id(),
        term,
    }))
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// One watch, from its start to its failure (or the client's close): the
/// watch is created from the current revision and its `created` answer
/// awaited (so it is in sync, and answers progress requests), then a
/// keys-only range read seeds the mirror; events at or below the range's
/// revision are already in it and are skipped.
async fn watch_once(m: &Arc<Mirror>, client: &Client) -> Stop {
    let checked_at = Instant::now();
    let voter = match one_member(client).await {
        Ok(Some(voter)) => voter,
        Ok(None) => return Stop::Members,
        Err(stop) => return stop,
    };
    if !progress_is_ordered(client, voter.id).await {
        return Stop::Members;
    }
    let end = prefix_end(&m.prefix);
    let mut wc = client.watch_client();
    let opts = WatchOptions::new().with_range(end.clone());
    let Ok(Ok(stream)) =
        tokio::time::timeout(REQUEST_LIMIT, wc.watch(prefix_start(&m.prefix), Some(opts))).await
    else {
        return Stop::Failed;
    };
    let (mut requests, mut responses) = stream.split();
    match tokio::time::timeout(REQUEST_LIMIT, responses.message()).await {
        Ok(Ok(Some(resp)))
            if resp.created()
                && !resp.canceled()
                && resp.header().map(|h| h.member_id()) == Some(voter.id) => {}
        _ => return Stop::Failed,
    }
    let Some((keys, at)) = seed(client, &m.prefix, end).await else {
        return Stop::Failed;
    };
    // The membership the mirror relies on is the one seen before the
    // watch and the seed read: when those took long, look again first.
    let mut members_checked = checked_at;
    if members_checked.elapsed() >= MEMBERS_EVERY {
        members_checked = Instant::now();
        match one_member(client).await {
            Ok(Some(v)) if v == voter => {}
            Ok(None) => return Stop::Members,
            Ok(Some(_)) | Err(_) => return Stop::Failed,
        }
    }
    {
        let mut s = m.state();
        s.keys = keys;
        s.seeded_at = at;
        s.shown = at;
        s.voter = voter;
        s.live = true;
        s.live_since = Some(Instant::now());
        s.tried = true;
    }
    m.changed.notify_waiters();
    loop {
        let send = {
            let mut s = m.state();
            if s.closed {
                return Stop::Failed;
            }
            if s.wanted && s.outstanding.is_none() {
                s.wanted = false;
                s.outstanding = Some(Instant::now());
                true
            } else {
                false
            }
        };
        if send && requests.request_progress().await.is_err() {
            return Stop::Failed;
        }
        if members_checked.elapsed() >= MEMBERS_EVERY {
            // A member added without an election changes no raft term.
            let at = Instant::now();
            match one_member(client).await {
                Ok(Some(v)) if v == voter => members_checked = at,
                Ok(Some(_)) | Err(_) => return Stop::Failed,
                Ok(None) => return Stop::Members,
            }
        }
        let unanswered_until = m
            .state()
            .outstanding
            .and_then(|o| o.checked_add(PROGRESS_LIMIT));
        tokio::select! {
            biased;
            msg = responses.message() => match msg {
                Ok(Some(resp)) => {
                    if m.apply(&resp).is_err() {
                        return Stop::Failed;
                    }
                }
                Ok(None) | Err(_) => return Stop::Failed,
            },
            _ = m.wake_task.notified() => {}
            // etcd drops a progress request it cannot answer yet (a
            // watcher fallen behind): one unanswered this long restarts
            // the watch, rather than leaving every renewal to wait.
            _ = sleep_until_some(unanswered_until) => return Stop::Failed,
            _ = tokio::time::sleep(MEMBERS_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_trusted_from_etcd_3_5_8() {
        for (v, ordered) in [
            ("3.5.30", true),
            ("3.5.8", true),
            ("3.6.0", true),
            ("3.6.0-rc.1", true),
            ("4.0.0", true),
            ("3.5.7", false),
            ("3.4.23", false),
            ("3.4.25", false),
            ("", false),
            ("3.5", false),
            ("v3.5.30", false),
        ] {
            assert_eq!(ordered_progress(v), ordered, "{v:?}");
        }
    }

    #[test]
    fn only_lease_keys_under_the_prefix_are_mirrored() {
        let key = |k: &str| LeaseKey::new(k).unwrap();
        assert_eq!(lease_key("app/", b"app/jobs/a"), Some(key("jobs/a")));
        assert_eq!(lease_key("", b"jobs/a"), Some(key("jobs/a")));
        // Not a lease key: no grant can name it.
        assert_eq!(lease_key("app/", b"app/jobs/\xff"), None);
        assert_eq!(lease_key("app/", b"app/jobs//a"), None);
        assert_eq!(lease_key("app/", b"app/"), None);
        assert_eq!(lease_key("app/", b"other/jobs/a"), None);
    }

    #[test]
    fn a_key_is_seen_through_any_equal_copy_of_it() {
        let m = Mirror::new("app/");
        let stored = LeaseKey::new("jobs/a").unwrap();
        let entry = Entry {
            create_revision: 5,
            mod_revision: 6,
            lease: 7,
        };
        m.state().keys.insert(stored, entry);
        let grants = LeaseKey::new("jobs/a").unwrap();
        assert_eq!(m.seen(&grants, 5, 6, 7), Seen::Unchanged);
        // The grant's copy is kept, and the entry with it.
        assert!(m
            .state()
            .keys
            .keys()
            .any(|k| std::ptr::eq(k.as_str(), grants.as_str())));
        assert_eq!(m.seen(&grants, 5, 6, 7), Seen::Unchanged);
        assert_eq!(
            m.seen(&LeaseKey::new("jobs/a").unwrap(), 5, 6, 7),
            Seen::Unchanged
        );
        assert_eq!(m.seen(&grants, 5, 6, 8), Seen::Changed);
        assert_eq!(
            m.seen(&LeaseKey::new("jobs/b").unwrap(), 5, 6, 7),
            Seen::Changed
        );
        assert_eq!(m.state().keys.len(), 1);
    }

    #[test]
    fn an_adopted_key_keeps_the_grants_copy_and_matches_only_what_the_watch_showed() {
        let m = Mirror::new("app/");
        let entry = Entry {
            create_revision: 5,
            mod_revision: 5,
            lease: 7,
        };
        let is_grants = |m: &Mirror, k: &LeaseKey| {
            m.state()
                .keys
                .keys()
                .any(|s| std::ptr::eq(s.as_str(), k.as_str()))
        };
        // The watch is down: nothing to adopt into.
        let early = LeaseKey::new("jobs/early").unwrap();
        m.adopt(&early, 5);
        assert!(m.state().keys.is_empty());
        m.state().live = true;

        // Adopted before the watch showed its creation: nothing matches
        // until the event comes, and the event keeps the grant's copy.
        let first = LeaseKey::new("jobs/a").unwrap();
        m.adopt(&first, 5);
        assert_eq!(m.state().keys.get(&first), Some(&Entry::UNSEEN));
        m.state()
            .keys
            .insert(LeaseKey::new("jobs/a").unwrap(), entry);
        m.state().shown = 5;
        assert!(is_grants(&m, &first));
        assert_eq!(m.seen(&first, 5, 5, 7), Seen::Unchanged);

        // Adopted after it: the watch's copy is replaced, the entry kept.
        m.state()
            .keys
            .insert(LeaseKey::new("jobs/b").unwrap(), entry);
        let second = LeaseKey::new("jobs/b").unwrap();
        m.adopt(&second, 5);
        assert!(is_grants(&m, &second));
        assert_eq!(m.seen(&second, 5, 5, 7), Seen::Unchanged);

        // Created and deleted before the adopt: nothing is held for it.
        m.state().shown = 9;
        let gone = LeaseKey::new("jobs/gone").unwrap();
        m.adopt(&gone, 8);
        assert!(m.state().keys.get(&gone).is_none());
        assert_eq!(m.seen(&gone, 8, 8, 7), Seen::Changed);

        // A placeholder a renewal finds is dropped: the renewal reads.
        let pending = LeaseKey::new("jobs/pending").unwrap();
        m.adopt(&pending, 12);
        assert_eq!(m.seen(&pending, 12, 12, 7), Seen::Changed);
        assert!(m.state().keys.get(&pending).is_none());
        assert_eq!(m.state().keys.len(), 2);
    }

    /// Adopts and renewals interleaved at random with the watch's puts,
    /// deletes and restarts never make the mirror answer other than the
    /// watch alone would: without its placeholders the map is exactly the
    /// watch's view, `Unchanged` is answered only for what the watch holds,
    /// and a placeholder is held only for a key whose creation is yet to
    /// be shown.
    #[test]
    fn adoption_never_changes_what_the_watch_answers() {
        let m = Mirror::new("app/");
        m.state().live = true;
        let names = ["jobs/a", "jobs/b", "jobs/c"];
        let mut watch: std::collections::HashMap<&str, Entry> = Default::default();
        // Keys adopted before the watch showed their creation, and not
        // shown, renewed or restarted since: those a placeholder is for.
        let mut unshown: std::collections::HashSet<&str> = Default::default();
        let mut shown = 0;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for rev in 1..100_000i64 {
            let name = names[usize::try_from(next(3)).unwrap()];
            let key = LeaseKey::new(name).unwrap();
            let small = |n: u64| i64::try_from(n).unwrap();
            match next(6) {
                // A grant created at or before this revision, or just after
                // it (its creation not shown yet).
                0 => {
                    let fence = rev + 1 - small(next(3));
                    if fence > shown && !watch.contains_key(name) {
                        unshown.insert(name);
                    }
                    m.adopt(&key, fence);
                }
                1 => {
                    let e = Entry {
                        create_revision: watch.get(name).map_or(rev, |e| e.create_revision),
                        mod_revision: rev,
                        lease: 1 + small(next(2)),
                    };
                    watch.insert(name, e);
                    unshown.remove(name);
                    shown = rev;
                    let mut s = m.state();
                    s.keys.insert(key, e);
                    s.shown = rev;
                }
                2 => {
                    watch.remove(name);
                    unshown.remove(name);
                    shown = rev;
                    let mut s = m.state();
                    s.keys.remove(&key);
                    s.shown = rev;
                }
                3 if next(50) == 0 => {
                    m.down();
                    watch.clear();
                    unshown.clear();
                    shown = 0;
                    m.state().live = true;
                }
                _ => {
                    let (f, r, l) = match (next(3), watch.get(name)) {
                        (0, Some(e)) => (e.create_revision, e.mod_revision, e.lease),
                        (1, _) => (0, 0, 0),
                        _ => (small(next(4)), small(next(4)), small(next(3))),
                    };
                    let want = Entry {
                        create_revision: f,
                        mod_revision: r,
                        lease: l,
                    };
                    let expect = if watch.get(name) == Some(&want) {
                        Seen::Unchanged
                    } else {
                        Seen::Changed
                    };
                    assert_eq!(m.seen(&key, f, r, l), expect, "rev {rev} {name}");
                    unshown.remove(name);
                }
            }
            let s = m.state();
            let real: std::collections::HashMap<&str, Entry> = s
                .keys
                .iter()
                .filter(|(_, e)| **e != Entry::UNSEEN)
                .filter_map(|(k, e)| Some((names.iter().copied().find(|n| *n == k.as_str())?, *e)))
                .collect();
            assert_eq!(real, watch, "rev {rev}");
            let placeholders: std::collections::HashSet<&str> = s
                .keys
                .iter()
                .filter(|(_, e)| **e == Entry::UNSEEN)
                .filter_map(|(k, _)| names.iter().copied().find(|n| *n == k.as_str()))
                .collect();
            assert_eq!(placeholders, unshown, "rev {rev}");
        }
    }

    #[test]
    fn prefix_ranges_cover_the_prefix_exactly() {
        assert_eq!(prefix_start("a/"), b"a/".to_vec());
        assert_eq!(prefix_end("a/"), b"a0".to_vec());
        // An empty prefix is every key: from `\0` on.
        assert_eq!(prefix_start(""), vec![0]);
        assert_eq!(prefix_end(""), vec![0]);
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
