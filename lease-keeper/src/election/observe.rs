//! [`Observer`]: follows an election's leader from a background task.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, Fence, HolderId, LeaseBackend, LeaseKey, LeaseState};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use super::{Election, Leader};

/// Follows an election's leader; from [`Election::observe`].
///
/// A background task reads the key, publishes what changed, and waits for
/// the next change: by the backend's watch where it has one (woken by a new
/// leader, a resign or an expiry), and at least every
/// [poll interval](Election::with_poll_interval) — which is also how a new
/// value from the same leader ([`Leadership::proclaim`](crate::Leadership::proclaim))
/// is seen, since a watch need not wake for one. Transient read errors are
/// retried (and traced), never returned.
///
/// What it publishes:
///
/// * every transition it observes, in order: a new leader, the same leader
///   with a new value, and `None` — no leader — after a resign or an expiry;
/// * never a stale leader after a newer one: a read showing a lower fence
///   than one already seen, or a grant already seen ending, is dropped.
///
/// A read that shows the key held shows a leader, whatever remaining time
/// the backend reports with it: etcd reports whole seconds, so zero means
/// under a second left, and a renewal may still come. Only a read showing
/// the key free, or held by another grant, ends a leader's term.
///
/// The first read is always published, leader or not: the first
/// [`changed`](Observer::changed) tells the state the observer starts from.
/// Changes that happen between two reads (a leader that came and went
/// within one poll interval) are not seen.
///
/// Changes not yet taken by [`changed`](Observer::changed) queue up in the
/// observer, at most [`Observer::QUEUE`] of them (one [`Leader`] each, its
/// value up to a payload's size): when a change arrives with the queue
/// full, the oldest queued change is dropped, so an observer read only
/// through [`watch`](Observer::watch) or [`current`](Observer::current)
/// holds a bounded amount of memory however often the leader proclaims. A
/// caller of `changed` that falls further behind skips the oldest changes
/// and goes on from the oldest still queued, in order;
/// [`skipped`](Observer::skipped) counts what it skipped. Dropping the
/// observer stops its task.
#[must_use = "dropping an Observer stops it"]
pub struct Observer {
    queue: broadcast::Receiver<Option<Leader>>,
    skipped: u64,
    latest: watch::Receiver<Option<Leader>>,
    task: Option<JoinHandle<()>>,
    key: LeaseKey,
}

impl Observer {
    /// The most changes queued for [`changed`](Observer::changed); older
    /// ones are dropped when more arrive.
    pub const QUEUE: usize = 16;

    pub(crate) fn start(election: &Election) -> Observer {
        let (tx, queue) = broadcast::channel(Self::QUEUE);
        let (latest_tx, latest) = watch::channel(None);
        let follow = Follow {
            backend: election.keeper().backend().clone(),
            key: election.key().clone(),
            poll: election.poll_interval(),
            read_limit: election.ttl().max(election.poll_interval()),
            queue: tx,
            latest: latest_tx,
        };
        let task = match tokio::runtime::Handle::try_current() {
            Ok(rt) => Some(rt.spawn(follow.run())),
            Err(_) => {
                tracing::warn!(key = %election.key(), "an election observer needs a tokio runtime; it will see nothing");
                None
            }
        };
        Observer {
            queue,
            skipped: 0,
            latest,
            task,
            key: election.key().clone(),
        }
    }

    /// The last state observed: the leader, or `None` for no leader (or
    /// nothing observed yet: the first read is the first change).
    pub fn current(&self) -> Option<Leader> {
        self.latest.borrow().clone()
    }

    /// The next observed change, in order: `Some(leader)` for a new leader
    /// or the same leader with a new value, `None` for no leader (resigned
    /// or expired). The first is the state of the first read, whatever it
    /// is. Never a lower fence after a higher one. Waits until there is
    /// one; changes observed before this call (since the observer started)
    /// are returned first. No observed change is skipped unless more than
    /// [`QUEUE`](Observer::QUEUE) were waiting: then the oldest are skipped
    /// (counted by [`skipped`](Observer::skipped)) and this returns the
    /// oldest still queued.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: changes queue in the observer (up to
    /// [`QUEUE`](Observer::QUEUE) of them, the oldest dropped beyond), and a
    /// dropped call takes none, so the next call returns it.
    pub async fn changed(&mut self) -> Option<Leader> {
        loop {
            match self.queue.recv().await {
                Ok(change) => return change,
                Err(RecvError::Lagged(n)) => self.skipped = self.skipped.saturating_add(n),
                // The task never ends by itself while the observer lives; if
                // it is gone (no runtime, or its runtime shut down), nothing
                // will change again.
                Err(RecvError::Closed) => std::future::pending().await,
            }
        }
    }

    /// How many changes [`changed`](Observer::changed) skipped because more
    /// than [`QUEUE`](Observer::QUEUE) were waiting when it was called; 0
    /// for a caller that keeps up.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The latest observed state as a tokio watch channel (latest value only,
    /// changes in between may be skipped), for readiness checks and UIs.
    pub fn watch(&self) -> watch::Receiver<Option<Leader>> {
        self.latest.clone()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("key", &self.key)
            .field("current", &self.current())
            // The channel counts the changes it already dropped too.
            .field("queued", &self.queue.len().min(Self::QUEUE))
            .finish()
    }
}

/// The leader a read shows: the holder of any grant it shows held, whatever
/// the remaining time reported with it (a backend reporting whole seconds
/// says zero for a grant with under a second left, which a renewal may still
/// extend); `None` for a free key.
fn leader_of(state: &LeaseState) -> Option<Leader> {
    state.holding().map(|h| Leader {
        holder: h.holder.clone(),
        fence: h.fence,
        value: h.payload.clone(),
    })
}

/// The observer's task.
struct Follow {
    backend: Arc<dyn LeaseBackend>,
    key: LeaseKey,
    poll: Duration,
    /// How long one read may take before it is retried.
    read_limit: Duration,
    queue: broadcast::Sender<Option<Leader>>,
    latest: watch::Sender<Option<Leader>>,
}

/// What the observer has published, to tell a change from a stale read.
#[derive(Default)]
struct Seen {
    /// Whether anything was published yet (the first read always is).
    published: bool,
    /// The last published state.
    last: Option<Leader>,
    /// The highest fence seen, and whether that grant was seen to end.
    highest: Option<(Fence, bool)>,
}

impl Seen {
    /// The state to publish for a read showing `now`, if it is a change and
    /// not stale.
    fn update(&mut self, now: Option<Leader>) -> Option<Option<Leader>> {
        match &now {
            Some(l) => match self.highest {
                Some((f, _)) if l.fence < f => return None,
                Some((f, true)) if l.fence == f => return None,
                _ => self.highest = Some((l.fence, false)),
            },
            None => {
                if let Some((_, ended)) = &mut self.highest {
                    *ended = true;
                }
            }
        }
        if self.published && now == self.last {
            return None;
        }
        self.published = true;
        self.last = now.clone();
        Some(now)
    }
}

impl Follow {
    async fn run(self) {
        let mut seen = Seen::default();
        let mut watch = self.backend.capabilities().watch;
        let mut failures: u32 = 0;
        loop {
            let state = match timeout(self.read_limit, self.backend.read(&self.key)).await {
                Ok(Ok(state)) => {
                    failures = 0;
                    state
                }
                Ok(Err(e)) => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(key = %self.key, error = %lease_core::ErrorChain::new(&e), failures, "election observer: read failed; retrying");
                    sleep(self.poll).await;
                    continue;
                }
                Err(_) => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(key = %self.key, failures, "election observer: read unanswered; retrying");
                    continue;
                }
            };
            let before = seen.last.as_ref().map(|l| (l.holder.clone(), l.fence));
            let highest = seen.highest;
            let news = seen.update(leader_of(&state));
            // A new leader, or the end of the newest one: the changes that
            // come one after another (a resign, then the next leader), and
            // that reads going back and forth between replicas cannot make
            // up, since the highest fence only rises and ends once.
            let advanced = news.is_some() && seen.highest != highest;
            if let Some(change) = news {
                self.log(before, &change);
                self.latest.send_replace(change.clone());
                if self.queue.send(change).is_err() {
                    return;
                }
            }
            self.wait(&state, &mut watch, advanced).await;
        }
    }

    /// Logs a published change: a new leader or none at INFO, a new value
    /// of the same leader's grant at DEBUG.
    fn log(&self, before: Option<(HolderId, Fence)>, change: &Option<Leader>) {
        match change {
            Some(l) if before.as_ref() == Some(&(l.holder.clone(), l.fence)) => {
                tracing::debug!(key = %self.key, leader = %l.holder, fence = %l.fence, "election observer: the leader's value changed");
            }
            Some(l) => {
                tracing::info!(key = %self.key, leader = %l.holder, fence = %l.fence, "election observer: new leader");
            }
            None => tracing::info!(key = %self.key, "election observer: no leader"),
        }
    }

    /// Waits for the next change of `state`: by watch where there is one,
    /// and at most a poll interval — less when the backend says the grant
    /// runs out sooner. The backend reports the remaining time rounded down
    /// to its TTL granularity (whole seconds on etcd: zero is under a
    /// second), so the grant may last up to one granule longer: waiting
    /// that long keeps a grant with zero reported from being re-read back
    /// to back.
    ///
    /// `advanced`: whether the read of `state` showed a new leader or the
    /// newest one's end. A wake after that is read at once, since one such
    /// change often follows another (a resign, then the next leader's
    /// campaign); any other wake is read no sooner than the spin guard
    /// allows.
    async fn wait(&self, state: &LeaseState, watch: &mut bool, advanced: bool) {
        let mut limit = self.poll;
        if let Some(remaining) = state.holding().and_then(|h| h.remaining) {
            let granule = self
                .backend
                .capabilities()
                .ttl
                .granularity
                .max(Duration::from_millis(1));
            limit = limit.min(remaining.saturating_add(granule));
        }
        if !*watch {
            sleep(limit).await;
            return;
        }
        let began = Instant::now();
        match timeout(limit, self.backend.wait_for_change(&self.key, state)).await {
            Err(_) => {}
            Ok(Ok(())) if advanced => {}
            Ok(Ok(())) => {
                // A watch that wakes at once without a change must not spin,
                // nor must reads that go back and forth between two values
                // (replicas that lag one another): the next read comes at
                // least a fiftieth of the poll interval (at most 20 ms) after
                // the last. The reads at once after a new leader or its end
                // are bounded by the grants made.
                let least = (self.poll / 50).min(Duration::from_millis(20));
                let took = began.elapsed();
                if took < least {
                    sleep(least.saturating_sub(took)).await;
                }
            }
            Ok(Err(Error::Unsupported { .. })) => *watch = false,
            Ok(Err(e)) => {
                tracing::debug!(key = %self.key, error = %lease_core::ErrorChain::new(&e), "election observer: watch failed; polling until the next read");
                sleep(limit.saturating_sub(began.elapsed())).await;
            }
        }
    }
}
