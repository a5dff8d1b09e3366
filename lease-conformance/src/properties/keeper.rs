//! Keeping leases (`lease-keeper`) on every backend: renewal for many TTLs,
//! self-fencing when the backend stops answering, waiting acquire, and a
//! group's shared expiry.
//!
//! "Unreachable" is a fault at the client boundary: [`Unreachable`] wraps a
//! real client, and while cut its requests hang — they are not sent, or their
//! answer is withheld — until restored, when they fail as
//! [`Error::Unavailable`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, Capabilities, Error, Grant, HolderId, LeaseBackend,
    LeaseKey, LeaseLayer, LeaseState, Payload, Renewal,
};
use lease_keeper::{AcquireError, Backoff, Keeper, LossReason};
use tokio::sync::watch;
use tokio::time::{sleep, timeout, Instant};

use super::{clients, key, req, short_ttl, take_over, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// A client whose requests hang while it is cut off — all of them, or only
/// those for some keys. Hung requests fail with [`Error::Unavailable`] once
/// the cut is restored; requests in flight when the cut starts never deliver
/// their answer.
pub struct Unreachable {
    inner: Arc<dyn LeaseBackend>,
    cut: Mutex<Cut>,
    changes: watch::Sender<u64>,
}

impl std::fmt::Debug for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unreachable").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Cut {
    all: bool,
    keys: HashSet<LeaseKey>,
}

impl Unreachable {
    /// Wraps `inner`, reachable.
    pub fn new(inner: Arc<dyn LeaseBackend>) -> Arc<Self> {
        Arc::new(Unreachable {
            inner,
            cut: Mutex::default(),
            changes: watch::channel(0).0,
        })
    }

    fn update(&self, f: impl FnOnce(&mut Cut)) {
        f(&mut self.cut.lock().unwrap_or_else(|p| p.into_inner()));
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Cuts every request off.
    pub fn cut(&self) {
        self.update(|c| c.all = true);
    }

    /// Restores every request (per-key cuts stay).
    pub fn restore(&self) {
        self.update(|c| c.all = false);
    }

    /// Cuts off the requests for `key` only.
    pub fn cut_key(&self, key: &LeaseKey) {
        self.update(|c| {
            c.keys.insert(key.clone());
        });
    }

    /// Restores the requests for `key`.
    pub fn restore_key(&self, key: &LeaseKey) {
        self.update(|c| {
            c.keys.remove(key);
        });
    }

    fn is_cut(&self, key: Option<&LeaseKey>) -> bool {
        let c = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        c.all || key.is_some_and(|k| c.keys.contains(k))
    }

    async fn hang_while_cut(&self, key: Option<&LeaseKey>) {
        let mut rx = self.changes.subscribe();
        while self.is_cut(key) {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Sends `request` unless cut, and withholds the answer if cut meanwhile.
    async fn gate<'a, T: Send + 'a>(
        &'a self,
        key: Option<&'a LeaseKey>,
        request: BoxFuture<'a, Result<T, Error>>,
    ) -> Result<T, Error> {
        if self.is_cut(key) {
            self.hang_while_cut(key).await;
            return Err(Error::Unavailable {
                detail: "unreachable: the request was never sent".into(),
                source: None,
            });
        }
        let answer = request.await;
        if self.is_cut(key) {
            self.hang_while_cut(key).await;
            return Err(Error::Unavailable {
                detail: "unreachable: the answer never came".into(),
                source: None,
            });
        }
        answer
    }
}

impl LeaseLayer for Unreachable {
    fn inner(&self) -> &dyn LeaseBackend {
        &*self.inner
    }
    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            let key = req.key.clone();
            self.gate(Some(&key), self.inner.try_acquire(req)).await
        })
    }
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(self.gate(Some(grant.key()), self.inner.renew(grant, payload)))
    }
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.gate(Some(grant.key()), self.inner.release(grant)))
    }
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(self.gate(Some(key), self.inner.read(key)))
    }
    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.gate(Some(key), self.inner.wait_for_change(key, seen)))
    }
    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a lease_core::BreakNote,
    ) -> BoxFuture<'a, Result<lease_core::Broken, Error>> {
        Box::pin(self.gate(Some(key), self.inner.break_lease(key, note)))
    }
    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<lease_core::LastBreak>, Error>> {
        Box::pin(self.gate(Some(key), self.inner.last_break(key)))
    }
}

/// The TTL keeper properties use: at least 1 s, at least twice the backend's
/// minimum (2 s on the real backends), so renewals have room on a busy machine.
pub(super) fn keeper_ttl(caps: &Capabilities) -> Duration {
    let want = Duration::from_secs(1).max(short_ttl(caps) * 2);
    caps.ttl.effective(want).unwrap_or(caps.ttl.max)
}

/// Whether the harness's time is virtual (the fake: `pass` returns at once).
pub(super) async fn virtual_time(h: &dyn Harness) -> bool {
    let probe = Duration::from_millis(1);
    let t = Instant::now();
    h.pass(probe).await;
    t.elapsed() < probe
}

/// Lets `d` of real time pass, and on a virtual clock the same backend time,
/// in steps, the backend slightly ahead (the harsher side for a holder).
async fn let_time_pass(h: &dyn Harness, virtual_clock: bool, d: Duration) {
    if !virtual_clock {
        sleep(d).await;
        return;
    }
    let step = Duration::from_millis(50);
    let end = Instant::now() + d;
    loop {
        let now = Instant::now();
        if now >= end {
            return;
        }
        let s = step.min(end - now);
        h.pass(s).await;
        sleep(s).await;
    }
}

pub(super) fn keeper_on(c: Arc<dyn LeaseBackend>) -> Keeper {
    Keeper::new(c).with_backoff(
        Backoff::default()
            .first_pause(Duration::from_millis(50))
            .longest_pause(Duration::from_millis(500)),
    )
}

/// A kept lease stays held for four TTLs: it keeps its fence, `may_write()`
/// stays true, other clients see it held, a stranger is refused, and it is
/// renewed about every TTL/3.
pub fn keeper_keeps_a_lease_for_many_ttls(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("keeper-held");
        let cs = clients(h, 2).await?;
        let ttl = keeper_ttl(&cs[0].capabilities());
        let virtual_clock = virtual_time(h).await;
        let keeper = keeper_on(cs[0].clone());
        let lease = keeper
            .try_acquire(&key)
            .ttl(ttl)
            .await
            .map_err(|e| fresh(&key, e))?;
        for round in 0..4 {
            let_time_pass(h, virtual_clock, ttl).await;
            ensure!(
                lease.may_write() && lease.loss().is_none(),
                "after {round}+1 TTLs of {ttl:?} the kept lease ended: {:?}",
                lease.loss()
            );
            let seen = timeout(ttl, cs[1].read(&key))
                .await
                .map_err(|_| Failure("a read took a whole TTL".into()))??;
            ensure!(
                matches!(&seen, LeaseState::Held(x) if x.holder == *lease.holder() && x.fence == lease.fence()),
                "after {round}+1 TTLs another client reads {seen:?}, not the kept grant (fence {})",
                lease.fence()
            );
        }
        let stranger = HolderId::random();
        if let Acquire::Granted(g) = cs[1].try_acquire(req(&key, &stranger, ttl)).await? {
            return Err(Failure(format!(
                "a stranger was granted the kept key (fence {})",
                g.fence()
            )));
        }
        let renewals = lease.renewals();
        ensure!(
            renewals >= 8,
            "only {renewals} renewals in 4 TTLs (expected about 12 at TTL/3)"
        );
        lease.release().await?;
        Ok(Outcome::Passed)
    })
}

/// How often [`keeper_self_fences_when_the_backend_is_unreachable`] tries to
/// get a lease kept through one renewal before it cuts the backend off.
const SETUP_ATTEMPTS: u32 = 3;

/// How long after its deadline a lease's loss may take to be recorded.
const LOSS_RECORDED_WITHIN: Duration = Duration::from_millis(250);

/// A kept lease whose backend stops answering turns `may_write()` false no
/// later than its deadline — counted from the send instant of the last
/// renewal that was answered — and its loss notification fires with
/// `DeadlinePassed` at that deadline.
pub fn keeper_self_fences_when_the_backend_is_unreachable(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let cs = clients(h, 1).await?;
        let ttl = keeper_ttl(&cs[0].capabilities());
        let virtual_clock = virtual_time(h).await;
        let u = Unreachable::new(cs[0].clone());
        let keeper = keeper_on(u.clone());
        let mut attempt = 1;
        let lease = loop {
            let key = key("keeper-unreachable");
            let lease = keeper
                .try_acquire(&key)
                .ttl(ttl)
                .await
                .map_err(|e| fresh(&key, e))?;
            let_time_pass(h, virtual_clock, ttl).await;
            if lease.renewals() >= 1 && lease.may_write() {
                break lease;
            }
            // A server that stalls for a third of the TTL on a loaded machine
            // ends the lease by its deadline before the cut, which is the
            // keeper doing its job; the property is about what follows a cut,
            // so only that setup is tried again, and only when the lease
            // ended as the contract says it must: not writable, at or after
            // its deadline, reported as `DeadlinePassed`. An in-process fake
            // has no server to stall, so it gets one attempt.
            let attempts = if virtual_clock { 1 } else { SETUP_ATTEMPTS };
            let loss = if lease.may_write() {
                lease.loss()
            } else {
                // The loss is recorded just after the deadline passes.
                timeout(LOSS_RECORDED_WITHIN, lease.lost()).await.ok()
            };
            let (may_write, past_deadline) =
                (lease.may_write(), Instant::now() >= lease.deadline());
            ensure!(
                attempt < attempts
                    && loss == Some(LossReason::DeadlinePassed)
                    && !may_write
                    && past_deadline,
                "the lease was not kept before the cut (attempt {attempt} of {attempts}): \
                 {} renewals, loss {loss:?}, may_write() {may_write}, deadline passed {past_deadline}",
                lease.renewals()
            );
            eprintln!(
                "{}: keeper_self_fences_when_the_backend_is_unreachable: attempt {attempt} of \
                 {attempts} lost its lease by its deadline before the cut ({} renewals): the \
                 server stalled; trying again on a fresh key",
                h.name(),
                lease.renewals()
            );
            let _ = timeout(ttl, lease.release()).await;
            attempt += 1;
        };
        let mut loss = lease.loss_watch();
        u.cut();
        let cut_at = Instant::now();
        let deadline = lease.deadline();
        let fraction = keeper.timing().deadline_fraction();
        ensure!(
            deadline <= cut_at + ttl.mul_f64(fraction),
            "the deadline lies more than {fraction:.2} TTL after the cut"
        );
        let slack = Duration::from_millis(250);
        let reason = timeout(ttl * 2, loss.wait()).await;
        let noticed = Instant::now();
        let Ok(reason) = reason else {
            u.restore();
            return Err(Failure(format!(
                "no loss notification within two TTLs of the cut (deadline was {:?} after it)",
                deadline.saturating_duration_since(cut_at)
            )));
        };
        let may_write_after = lease.may_write();
        let deadline_after = lease.deadline();
        u.restore();
        let _ = timeout(ttl, lease.release()).await;
        ensure!(
            reason == LossReason::DeadlinePassed,
            "the loss was reported as {reason:?}, not DeadlinePassed"
        );
        ensure!(
            noticed >= deadline,
            "the loss was reported {:?} before the deadline",
            deadline - noticed
        );
        ensure!(
            noticed <= deadline + slack,
            "the loss was reported {:?} after the deadline",
            noticed - deadline
        );
        ensure!(!may_write_after, "may_write() is true after the loss");
        ensure!(
            deadline_after == deadline,
            "the deadline moved while no answer came"
        );
        Ok(Outcome::Passed)
    })
}

/// A waiting acquirer gets a key soon after its holder releases it: within
/// 1 s where the backend can watch; where it cannot, by polling within 3 s
/// (reported as not applicable to the watch bound).
pub fn waiting_acquirer_gets_a_released_key(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("keeper-wait-release");
        let cs = clients(h, 2).await?;
        let caps = cs[0].capabilities();
        let ttl = keeper_ttl(&caps);
        let (a, b) = (keeper_on(cs[0].clone()), keeper_on(cs[1].clone()));
        let held = a
            .try_acquire(&key)
            .ttl(ttl)
            .await
            .map_err(|e| fresh(&key, e))?;
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(
                async move { b.acquire(&key).ttl(ttl).wait(Duration::from_secs(30)).await },
            )
        };
        sleep(Duration::from_millis(300)).await;
        ensure!(
            !waiter.is_finished(),
            "the waiter finished while the key was held"
        );
        held.release().await?;
        let released = Instant::now();
        let bound = if caps.watch {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(3)
        };
        let got = match timeout(bound, waiter).await {
            Err(_) => {
                let watch = caps.watch;
                return Err(Failure(format!(
                    "the waiter did not get the released key within {bound:?} (watch: {watch})"
                )));
            }
            Ok(Err(e)) => return Err(Failure(format!("the waiter panicked: {e}"))),
            Ok(Ok(Err(e))) => return Err(Failure(format!("the waiting acquire failed: {e}"))),
            Ok(Ok(Ok(l))) => l,
        };
        let took = released.elapsed();
        ensure!(
            got.holder().is_term_of(b.holder()) && got.may_write(),
            "the waiter's lease is not its own or not writable"
        );
        got.release().await?;
        if caps.watch {
            eprintln!(
                "lease-conformance: {}: a watching acquirer got the released key {} ms after the release returned",
                h.name(),
                took.as_millis()
            );
            Ok(Outcome::Passed)
        } else {
            Ok(Outcome::NotApplicable(format!(
                "no watch: got the released key by polling after {} ms (checked within {bound:?}); the watch bound does not apply",
                took.as_millis()
            )))
        }
    })
}

/// A waiting acquirer gets a key whose holder vanished (never renewed, never
/// released) once it expires: within 3 s after a TTL of backend time passed.
pub fn waiting_acquirer_gets_an_expired_key(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("keeper-wait-expiry");
        let cs = clients(h, 2).await?;
        let caps = cs[0].capabilities();
        let ttl = keeper_ttl(&caps);
        let gone = HolderId::random();
        let g = super::grant(&*cs[0], &key, &gone, ttl, "free key").await?;
        let b = keeper_on(cs[1].clone());
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(
                async move { b.acquire(&key).ttl(ttl).wait(Duration::from_secs(60)).await },
            )
        };
        sleep(Duration::from_millis(200)).await;
        ensure!(
            !waiter.is_finished(),
            "the waiter finished while the key was held"
        );
        h.pass(ttl).await;
        let bound = Duration::from_secs(3);
        let got = match timeout(bound, waiter).await {
            Err(_) => {
                return Err(Failure(format!(
                    "the waiting acquirer did not get the expired key within {bound:?} after its TTL passed (watch: {})",
                    caps.watch
                )))
            }
            Ok(Err(e)) => return Err(Failure(format!("the waiter panicked: {e}"))),
            Ok(Ok(Err(e))) => return Err(Failure(format!("the waiting acquire failed: {e}"))),
            Ok(Ok(Ok(l))) => l,
        };
        ensure!(
            got.fence() > g.fence(),
            "the waiter got fence {} after an expired grant with fence {}",
            got.fence(),
            g.fence()
        );
        got.release().await?;
        Ok(Outcome::Passed)
    })
}

/// A group whose one lease is lost gives up all the others and names the
/// lost key. The lease is lost by cutting only its requests: its deadline
/// passes unrenewed (the keeper gives it up then — before anyone could take
/// it over), the group releases the other leases (a stranger gets them at
/// once) and reports the key; another client then takes the key over after
/// its TTL, and restoring the cut does not disturb that holder.
pub fn group_abandons_all_when_one_lease_is_lost(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let base = key("keeper-group");
        let keys: Vec<LeaseKey> = (0..3)
            .map(|i| base.join(&format!("k{i}")))
            .collect::<Result<_, _>>()?;
        let cs = clients(h, 2).await?;
        let caps = cs[0].capabilities();
        // Group refreshes come 0.3–0.55 TTL after the last: a longer TTL
        // (3 s on the real backends) leaves a busy server room to answer
        // before the 2/3 deadline.
        let ttl = caps
            .ttl
            .effective(Duration::from_secs(1).max(short_ttl(&caps) * 3))
            .unwrap_or(caps.ttl.max);
        let virtual_clock = virtual_time(h).await;
        let u = Unreachable::new(cs[0].clone());
        let keeper = keeper_on(u.clone());
        let group = keeper.group();
        let mut leases = vec![];
        for k in &keys {
            let l = group.try_acquire(k).ttl(ttl).await.map_err(|e| match e {
                AcquireError::Held { .. } => fresh(k, e),
                e => Failure(format!("group acquire of {k}: {e}")),
            })?;
            leases.push(l);
        }
        let_time_pass(h, virtual_clock, ttl.mul_f64(0.6)).await;
        ensure!(
            group.check().is_ok() && leases.iter().all(|l| l.renewals() >= 1 && l.may_write()),
            "the group did not keep its leases before the cut: {:?}",
            group.check()
        );

        let lost_key = &keys[1];
        u.cut_key(lost_key);
        // No request for the key is sent after the cut, but one in flight
        // then may still have renewed it on the server (only its answer is
        // withheld). Counting the TTL from the cut, later than any such
        // request, lets take_over excuse a late grant only once the key
        // would have expired even so.
        let cut_at = std::time::Instant::now();
        let abandoned = timeout(ttl * 2, group.abandoned()).await;
        let Ok(abandoned) = abandoned else {
            u.restore_key(lost_key);
            let _ = group.release_all().await;
            return Err(Failure(
                "the group did not give up within two TTLs of losing a lease".into(),
            ));
        };
        ensure!(
            abandoned.keys() == vec![lost_key],
            "the group's error names {:?}, not the lost key {lost_key}",
            abandoned.keys()
        );
        ensure!(
            abandoned.to_string().contains(lost_key.as_str()),
            "the error message does not name {lost_key}: {abandoned}"
        );
        ensure!(
            leases.iter().all(|l| !l.may_write()),
            "a lease of the abandoned group may still write"
        );
        let stranger = HolderId::random();
        let mut stranger_grants = vec![];
        for (k, l) in keys.iter().zip(&leases) {
            if k == lost_key {
                continue;
            }
            ensure!(
                l.loss() == Some(LossReason::Abandoned),
                "{k} ended as {:?}, not Abandoned",
                l.loss()
            );
            let g = super::grant(
                &*cs[1],
                k,
                &stranger,
                ttl,
                "a key the abandoned group released",
            )
            .await?;
            stranger_grants.push(g);
        }

        // Another client takes the lost key over once its TTL has passed…
        let thief = HolderId::random();
        let stolen = take_over(h, &*cs[1], lost_key, &thief, &leases[1].grant(), cut_at).await?;
        // …and restoring the cut (the group's requests for it fail now) leaves it alone.
        u.restore_key(lost_key);
        sleep(Duration::from_millis(100)).await;
        let stolen = match cs[1].renew(&stolen, None).await? {
            Renewal::Renewed(g) => g,
            Renewal::Lost => {
                return Err(Failure(
                    "the thief lost the key after the group's cut was restored".into(),
                ))
            }
        };
        ensure!(
            group.release_all().await == Err(abandoned.clone()),
            "release_all after the abandonment does not report it"
        );
        cs[1].release(&stolen).await?;
        for g in &stranger_grants {
            cs[1].release(g).await?;
        }
        Ok(Outcome::Passed)
    })
}

/// A kept lease that an operator breaks is lost at its next renewal, and
/// the loss says it was broken, by whom and why (read back from the break's
/// audit record through `last_break`), not that it expired. Backends without
/// an administrative break are not applicable.
pub fn keeper_reports_a_break_as_broken(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("keeper-broken");
        let cs = clients(h, 2).await?;
        let ttl = keeper_ttl(&cs[0].capabilities());
        let virtual_clock = virtual_time(h).await;
        let keeper = keeper_on(cs[0].clone());
        let lease = keeper
            .try_acquire(&key)
            .ttl(ttl)
            .await
            .map_err(|e| fresh(&key, e))?;
        let mut loss = lease.loss_watch();
        let note = lease_core::BreakNote::new("lease-conformance operator", "host decommissioned")
            .with_at_unix_ms(2);
        match cs[1].break_lease(&key, &note).await {
            Err(Error::Unsupported { .. }) => {
                let _ = lease.release().await;
                return Ok(Outcome::NotApplicable(
                    "the backend has no administrative break".into(),
                ));
            }
            other => {
                other?;
            }
        }
        let wait = async {
            if virtual_clock {
                let_time_pass(h, true, ttl).await;
            }
            loss.wait().await
        };
        let reason = timeout(ttl * 2, wait)
            .await
            .map_err(|_| Failure("no loss within two TTLs of the break".into()))?;
        ensure!(
            reason
                == LossReason::Broken {
                    by: note.by.clone(),
                    reason: note.reason.clone()
                },
            "a broken lease was reported as {reason:?} ({reason})"
        );
        ensure!(!lease.may_write(), "may_write() is true after the break");
        let _ = lease.release().await;
        Ok(Outcome::Passed)
    })
}

/// The failure of an acquire of a key nobody else should hold.
fn fresh(key: &LeaseKey, e: AcquireError) -> Failure {
    match e {
        AcquireError::Held { .. } => Failure(format!("a fresh key {key} was refused: {e}")),
        AcquireError::Backend(e) => Failure::from(e),
        e => Failure(e.to_string()),
    }
}
