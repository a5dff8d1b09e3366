//! Shared/exclusive leases and permits (`lease-keeper`'s
//! [`Keeper::acquire_shared`], [`Keeper::acquire_exclusive`] and
//! [`Keeper::acquire_permit`]) on every backend: never a shared and an
//! exclusive holder at once, never more than `N` permit holders, an
//! exclusive waiter not starved by a stream of shared holders, and fences
//! that rise across phases.
//!
//! Every holder gets a client and a keeper of its own, as separate processes
//! would. A holder counts as in from the moment its acquire answers until
//! it stops writing, and only while [`may_write`](lease_keeper::LeaseView::may_write)
//! says it may: what a resource would see.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{Fence, LeaseBackend, LeaseKey};
use lease_keeper::{Keeper, Lease, SharedLease};
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout, Instant};

use super::election::on_backend_time;
use super::keeper::{keeper_on, keeper_ttl};
use super::{clients, key, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// How long a holder stays in: long enough for another to show up inside.
const WORK: Duration = Duration::from_millis(150);

/// The longest any single acquire is waited for.
fn patience(ttl: Duration) -> Duration {
    Duration::from_secs(10) + ttl * 4
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Shared,
    Exclusive,
}

/// Who is in, and every entry with its fence, in order.
#[derive(Default)]
struct Inside {
    shared: usize,
    exclusive: usize,
    most: usize,
    /// (kind, fence, entered at, left at)
    entries: Vec<(Kind, Fence, Instant, Option<Instant>)>,
    violations: Vec<String>,
}

impl Inside {
    fn enter(&mut self, kind: Kind, fence: Fence) -> usize {
        let clash = match kind {
            Kind::Shared => self.exclusive > 0,
            Kind::Exclusive => self.exclusive > 0 || self.shared > 0,
        };
        if clash {
            self.violations.push(format!(
                "a {kind:?} holder (fence {fence}) came in while {} shared and {} exclusive holders were in",
                self.shared, self.exclusive
            ));
        }
        match kind {
            Kind::Shared => self.shared += 1,
            Kind::Exclusive => self.exclusive += 1,
        }
        self.most = self.most.max(self.shared + self.exclusive);
        self.entries.push((kind, fence, Instant::now(), None));
        self.entries.len() - 1
    }

    fn leave(&mut self, kind: Kind, entry: usize) {
        match kind {
            Kind::Shared => self.shared = self.shared.saturating_sub(1),
            Kind::Exclusive => self.exclusive = self.exclusive.saturating_sub(1),
        }
        if let Some(e) = self.entries.get_mut(entry) {
            e.3 = Some(Instant::now());
        }
    }

    /// Fences rise across phases: a holder that came in after another left
    /// has a fence at least as high, and strictly higher when either of the
    /// two was exclusive.
    fn check_fences(&self) -> Result<(), Failure> {
        for (i, (k1, f1, _, left)) in self.entries.iter().enumerate() {
            let Some(left) = left else { continue };
            for (k2, f2, entered, _) in &self.entries[i + 1..] {
                if entered <= left {
                    continue;
                }
                let strict = *k1 == Kind::Exclusive || *k2 == Kind::Exclusive;
                ensure!(
                    if strict { f2 > f1 } else { f2 >= f1 },
                    "a {k2:?} holder that came in after a {k1:?} holder (fence {f1}) left got fence {f2}"
                );
            }
        }
        Ok(())
    }
}

/// A shared or an exclusive lease.
enum Held {
    Shared(SharedLease),
    Exclusive(Lease),
}

impl Held {
    fn may_write(&self) -> bool {
        match self {
            Held::Shared(l) => l.may_write(),
            Held::Exclusive(l) => l.may_write(),
        }
    }

    fn fence(&self) -> Fence {
        match self {
            Held::Shared(l) => l.fence(),
            Held::Exclusive(l) => l.fence(),
        }
    }

    async fn release(self) -> Result<(), lease_core::Error> {
        match self {
            Held::Shared(l) => l.release().await,
            Held::Exclusive(l) => l.release().await,
        }
    }
}

async fn take(keeper: &Keeper, key: &LeaseKey, kind: Kind, ttl: Duration) -> Result<Held, String> {
    let limit = patience(ttl);
    match kind {
        Kind::Shared => keeper
            .acquire_shared(key)
            .ttl(ttl)
            .wait(limit)
            .await
            .map(Held::Shared)
            .map_err(|e| format!("a shared acquire of {key}: {e}")),
        Kind::Exclusive => keeper
            .acquire_exclusive(key)
            .ttl(ttl)
            .wait(limit)
            .await
            .map(Held::Exclusive)
            .map_err(|e| format!("an exclusive acquire of {key}: {e}")),
    }
}

fn lock(inside: &Mutex<Inside>) -> std::sync::MutexGuard<'_, Inside> {
    inside
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One holder's rounds: acquire, stay in for [`WORK`] while it may write,
/// leave, release.
async fn rounds(
    keeper: Keeper,
    key: LeaseKey,
    kind: Kind,
    rounds: usize,
    ttl: Duration,
    inside: Arc<Mutex<Inside>>,
) -> Result<(), String> {
    for _ in 0..rounds {
        let held = take(&keeper, &key, kind, ttl).await?;
        let entry = held
            .may_write()
            .then(|| lock(&inside).enter(kind, held.fence()));
        sleep(WORK).await;
        if let Some(entry) = entry {
            lock(&inside).leave(kind, entry);
        }
        held.release()
            .await
            .map_err(|e| format!("a release on {key}: {e}"))?;
    }
    Ok(())
}

/// Runs every task to its end; the first failure, if any.
async fn all(mut tasks: JoinSet<Result<(), String>>) -> Result<(), Failure> {
    let mut first = None;
    while let Some(done) = tasks.join_next().await {
        let r = done
            .map_err(|e| format!("a holder task ended without an answer: {e}"))
            .and_then(|r| r);
        if let (Err(e), None) = (r, &first) {
            first = Some(e);
        }
    }
    match first {
        Some(e) => Err(Failure(e)),
        None => Ok(()),
    }
}

/// Keepers on fresh clients, one per holder.
async fn keepers(h: &dyn Harness, n: usize) -> Result<(Vec<Keeper>, Duration), Failure> {
    let cs: Vec<Arc<dyn LeaseBackend>> = clients(h, n).await?;
    let ttl = keeper_ttl(&cs[0].capabilities());
    Ok((cs.into_iter().map(keeper_on).collect(), ttl))
}

/// Three shared and two exclusive holders, each coming back three times:
/// never an exclusive holder with anyone else, fences rising across phases,
/// and shared holders in at once at least once.
pub fn shared_and_exclusive_never_overlap(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("rw-exclusion");
        let (keepers, ttl) = keepers(h, 5).await?;
        let inside = Arc::new(Mutex::new(Inside::default()));
        let mut tasks = JoinSet::new();
        for (i, keeper) in keepers.into_iter().enumerate() {
            let kind = if i < 3 { Kind::Shared } else { Kind::Exclusive };
            let (key, inside) = (key.clone(), inside.clone());
            tasks.spawn(async move {
                if kind == Kind::Exclusive {
                    // Let the shared holders in first, so the exclusive ones
                    // arrive while they are inside.
                    sleep(WORK / 3).await;
                }
                rounds(keeper, key, kind, 3, ttl, inside).await
            });
        }
        all(tasks).await?;
        let inside = lock(&inside);
        if let Some(v) = inside.violations.first() {
            return Err(Failure(format!(
                "{v} (on {key}; {} clashes in all)",
                inside.violations.len()
            )));
        }
        inside.check_fences()?;
        ensure!(
            inside.entries.len() == 15,
            "only {} of 15 holds were ever writable",
            inside.entries.len()
        );
        Ok(Outcome::Passed)
    }))
}

/// Five holders of two permits, each coming back three times: never more
/// than two in at once, and two at once at least once.
pub fn permits_never_exceed_their_number(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("permits");
        let (keepers, ttl) = keepers(h, 5).await?;
        let inside = Arc::new(Mutex::new(Inside::default()));
        let mut tasks = JoinSet::new();
        for keeper in keepers {
            let (key, inside) = (key.clone(), inside.clone());
            tasks.spawn(async move {
                for _ in 0..3 {
                    let lease = keeper
                        .acquire_permit(&key, 2)
                        .ttl(ttl)
                        .wait(patience(ttl))
                        .await
                        .map_err(|e| format!("a permit of {key}: {e}"))?;
                    let entry = lease
                        .may_write()
                        .then(|| lock(&inside).enter(Kind::Shared, lease.fence()));
                    sleep(WORK).await;
                    if let Some(entry) = entry {
                        lock(&inside).leave(Kind::Shared, entry);
                    }
                    lease
                        .release()
                        .await
                        .map_err(|e| format!("a permit release on {key}: {e}"))?;
                }
                Ok(())
            });
        }
        all(tasks).await?;
        let inside = lock(&inside);
        ensure!(
            inside.most <= 2,
            "{} holders of 2 permits of {key} were in at once",
            inside.most
        );
        ensure!(
            inside.most == 2,
            "never two holders of 2 permits of {key} at once: the permits were not shared"
        );
        ensure!(
            inside.entries.len() == 15,
            "only {} of 15 permits were ever writable",
            inside.entries.len()
        );
        Ok(Outcome::Passed)
    }))
}

/// Shared holders come and go so that one is always in; an exclusive
/// acquire started among them is granted within its patience all the same,
/// alone, and the shared holders get back in after it.
pub fn an_exclusive_waiter_is_not_starved(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("rw-starve");
        let (mut keepers, ttl) = keepers(h, 4).await?;
        let Some(writer) = keepers.pop() else {
            return Err(Failure("no keeper for the exclusive holder".into()));
        };
        let inside = Arc::new(Mutex::new(Inside::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        for (i, keeper) in keepers.into_iter().enumerate() {
            let (key, inside, stop) = (key.clone(), inside.clone(), stop.clone());
            tasks.spawn(async move {
                // Staggered, each in for two WORKs: always one in.
                sleep(WORK * u32::try_from(i).unwrap_or(0) * 2 / 3).await;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let held = take(&keeper, &key, Kind::Shared, ttl).await?;
                    let entry = held
                        .may_write()
                        .then(|| lock(&inside).enter(Kind::Shared, held.fence()));
                    sleep(WORK * 2).await;
                    if let Some(entry) = entry {
                        lock(&inside).leave(Kind::Shared, entry);
                    }
                    held.release()
                        .await
                        .map_err(|e| format!("a shared release on {key}: {e}"))?;
                }
                Ok(())
            });
        }
        sleep(WORK * 3).await;
        let limit = patience(ttl);
        let asked = Instant::now();
        let got = timeout(
            limit + WORK,
            writer.acquire_exclusive(&key).ttl(ttl).wait(limit),
        )
        .await;
        let lease = match got {
            Ok(Ok(lease)) => lease,
            Ok(Err(e)) => {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = all(tasks).await;
                return Err(Failure(format!(
                    "an exclusive acquire of {key} among a stream of shared holders failed after {:?}: {e}",
                    asked.elapsed()
                )));
            }
            Err(_) => {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = all(tasks).await;
                return Err(Failure(format!(
                    "an exclusive acquire of {key} was starved for {limit:?}"
                )));
            }
        };
        let entries_before = lock(&inside).entries.len();
        let entry = lease
            .may_write()
            .then(|| lock(&inside).enter(Kind::Exclusive, lease.fence()));
        sleep(WORK).await;
        if let Some(entry) = entry {
            lock(&inside).leave(Kind::Exclusive, entry);
        }
        lease.release().await?;
        sleep(WORK * 4).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        all(tasks).await?;
        let inside = lock(&inside);
        if let Some(v) = inside.violations.first() {
            return Err(Failure(format!("{v} (on {key})")));
        }
        ensure!(
            entry.is_some(),
            "the exclusive lease of {key} was never writable"
        );
        ensure!(
            inside.entries.len() > entries_before + 1,
            "no shared holder got back into {key} after the exclusive one left"
        );
        inside.check_fences()?;
        Ok(Outcome::Passed)
    }))
}

/// Two shared holders of one phase share its fence; an exclusive grant
/// after them is above it, and the next shared phase above that; a second
/// exclusive grant above the phase before it.
pub fn fences_rise_across_shared_and_exclusive_phases(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("rw-fences");
        let (keepers, ttl) = keepers(h, 3).await?;
        let (a, b, x) = (&keepers[0], &keepers[1], &keepers[2]);
        let sa = take(a, &key, Kind::Shared, ttl).await.map_err(Failure)?;
        let sb = take(b, &key, Kind::Shared, ttl).await.map_err(Failure)?;
        ensure!(
            sa.fence() == sb.fence(),
            "two shared holders of one phase of {key} got fences {} and {}",
            sa.fence(),
            sb.fence()
        );
        let phase = sa.fence();
        sa.release().await?;
        sb.release().await?;
        let ex = take(x, &key, Kind::Exclusive, ttl).await.map_err(Failure)?;
        ensure!(
            ex.fence() > phase,
            "the exclusive grant of {key} after a shared phase with fence {phase} got {}",
            ex.fence()
        );
        let fx = ex.fence();
        ex.release().await?;
        let sc = take(a, &key, Kind::Shared, ttl).await.map_err(Failure)?;
        ensure!(
            sc.fence() > fx,
            "the shared phase of {key} after an exclusive grant with fence {fx} got {}",
            sc.fence()
        );
        let next = sc.fence();
        sc.release().await?;
        let ex2 = take(x, &key, Kind::Exclusive, ttl).await.map_err(Failure)?;
        ensure!(
            ex2.fence() > next,
            "the second exclusive grant of {key} after a shared phase with fence {next} got {}",
            ex2.fence()
        );
        ex2.release().await?;
        Ok(Outcome::Passed)
    }))
}

/// Two shared holders of one phase with different TTLs: the one with the
/// short TTL renews for a while and leaves; while the one with the long TTL
/// may still write, no plain holder gets the key — the phase lives as long
/// as its longest promise, whoever renewed it last.
pub fn a_shared_phase_lives_as_long_as_its_longest_holder(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(on_backend_time(h, async move {
        let key = key("rw-ttls");
        let (keepers, short) = keepers(h, 3).await?;
        let caps = h.client().await?.capabilities();
        let long = caps.ttl.effective(short * 4).unwrap_or(caps.ttl.max);
        ensure!(long > short, "no TTL above {short:?} to mix with it");
        let (a, b, plain) = (&keepers[0], &keepers[1], &keepers[2]);
        let sa = a
            .acquire_shared(&key)
            .ttl(short)
            .wait(patience(short))
            .await
            .map_err(|e| Failure(format!("a shared acquire of {key} with {short:?}: {e}")))?;
        let sb = b
            .acquire_shared(&key)
            .ttl(long)
            .wait(patience(short))
            .await
            .map_err(|e| Failure(format!("a shared acquire of {key} with {long:?}: {e}")))?;
        // The short holder renews the phase a few times, then leaves.
        sleep(short + short / 2).await;
        ensure!(
            sa.may_write(),
            "the short shared holder of {key} lost its lease: {:?}",
            sa.loss()
        );
        sa.release().await?;
        let until = Instant::now() + short * 2;
        while Instant::now() < until {
            match plain.try_acquire(&key).ttl(short).await {
                Ok(l) => {
                    let (writable, fence) = (sb.may_write(), l.fence());
                    l.release().await?;
                    ensure!(
                        !writable,
                        "a plain holder got {key} (fence {fence}) while the long shared holder (fence {}) may still write",
                        sb.fence()
                    );
                }
                Err(lease_keeper::AcquireError::Held { .. }) => {}
                Err(e) => return Err(Failure(format!("a plain try of {key}: {e}"))),
            }
            sleep(Duration::from_millis(100)).await;
        }
        ensure!(
            sb.may_write(),
            "the long shared holder of {key} lost its lease: {:?}",
            sb.loss()
        );
        sb.release().await?;
        Ok(Outcome::Passed)
    }))
}
