//! Leader election on the fake: campaign, proclaim, resign, observe, and
//! work bound to leadership — timing on tokio's paused clock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{key, ms, restless_wake, Rec};
use lease_core::{
    BoxFuture, Error, Fence, Grant, HolderId, Holding, LeaseBackend, LeaseKey, LeaseLayer,
    LeaseState, Payload, Renewal,
};
use lease_fake::Fake;
use lease_keeper::{
    Election, Keeper, Leader, Leadership, LossReason, Observer, ProclaimError, WorkEnded,
};
use tokio::time::{sleep, timeout, Instant};

const TTL: Duration = Duration::from_secs(3);

fn value(s: &str) -> Payload {
    Payload::new(s).unwrap()
}

fn candidate(rec: &Arc<Rec>, k: &LeaseKey) -> Election {
    Keeper::new(rec.clone()).with_ttl(TTL).election(k)
}

/// Records when it is dropped (tokio's clock): stands for the work `run` runs.
struct DropClock(Arc<Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

/// Work that never returns by itself; it notes that it was polled, and when it was dropped.
fn endless(
    polled: Arc<Mutex<bool>>,
    dropped: Arc<Mutex<Option<Instant>>>,
) -> impl std::future::Future<Output = ()> {
    let clock = DropClock(dropped);
    async move {
        let _clock = clock;
        *polled.lock().unwrap() = true;
        std::future::pending::<()>().await
    }
}

/// `leadership.run(work)`, failing the test if it does not end within ten minutes.
async fn bounded<F: std::future::Future>(lead: &Leadership, work: F) -> WorkEnded<F::Output> {
    timeout(Duration::from_secs(600), lead.run(work))
        .await
        .expect("run did not end")
}

async fn next(observer: &mut Observer) -> Option<Leader> {
    timeout(Duration::from_secs(60), observer.changed())
        .await
        .expect("the observer reported no change within a minute")
}

fn is(l: &Option<Leader>, holder: &HolderId, v: &str) -> bool {
    l.as_ref()
        .is_some_and(|l| l.holder.is_term_of(holder) && l.value == value(v))
}

#[tokio::test(start_paused = true)]
async fn campaign_leads_and_leader_reads_the_value() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/basic");
    let a = candidate(&rec, &k);
    assert_eq!(a.leader().await.unwrap(), None);
    let lead = a.campaign(value("a:1")).await.unwrap();
    assert!(lead.may_write());
    let leader = a.leader().await.unwrap().unwrap();
    assert!(leader.holder.is_term_of(a.keeper().holder()));
    assert_eq!(leader.fence, lead.fence());
    assert_eq!(leader.value, value("a:1"));
    let shown = format!("{leader:?} {lead:?} {a:?}");
    assert!(!shown.contains("a:1"), "Debug printed the value: {shown}");
    lead.resign().await.unwrap();
    assert_eq!(a.leader().await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn run_drops_the_work_by_the_deadline_when_the_backend_hangs() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/hang");
    let a = candidate(&rec, &k);
    let lead = a.campaign(value("a")).await.unwrap();
    rec.hang.store(true, Ordering::SeqCst);
    let deadline = lead.deadline();
    let (polled, dropped) = (Arc::new(Mutex::new(false)), Arc::new(Mutex::new(None)));
    let ended = bounded(&lead, endless(polled.clone(), dropped.clone())).await;
    assert!(matches!(ended, WorkEnded::DeadlinePassed), "{ended:?}");
    assert!(*polled.lock().unwrap(), "the work never ran");
    let at = dropped.lock().unwrap().expect("the work was not dropped");
    assert!(
        at <= deadline,
        "dropped at {at:?}, after the deadline {deadline:?}"
    );
    assert_eq!(lead.deadline(), deadline, "a renewal succeeded while hung");
}

#[tokio::test(start_paused = true)]
async fn one_leader_at_a_time_among_candidates() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/many");
    let leading: Arc<Mutex<Option<HolderId>>> = Arc::default();
    let fences: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..5u64 {
        let (election, leading, fences) = (candidate(&rec, &k), leading.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            sleep(ms(i)).await;
            for _ in 0..3 {
                let lead = election.campaign(value("c")).await.unwrap();
                {
                    let mut now = leading.lock().unwrap();
                    assert!(
                        now.is_none(),
                        "{:?} and {:?} lead at once",
                        *now,
                        lead.holder()
                    );
                    *now = Some(lead.holder().clone());
                }
                fences.lock().unwrap().push(lead.fence().get());
                sleep(ms(200)).await;
                assert!(lead.may_write());
                *leading.lock().unwrap() = None;
                lead.resign().await.unwrap();
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(600), t)
            .await
            .expect("the candidates did not all lead in time")
            .unwrap();
    }
    let fences = fences.lock().unwrap();
    assert_eq!(fences.len(), 15);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences: {fences:?}");
}

#[tokio::test(start_paused = true)]
async fn resign_wakes_a_waiting_candidate_well_before_the_ttl() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/resign");
    let long = Duration::from_secs(30);
    let (a, b) = (
        candidate(&rec, &k).with_ttl(long),
        candidate(&rec, &k).with_ttl(long),
    );
    let lead = a.campaign(value("a")).await.unwrap();
    let waiting = tokio::spawn(async move {
        let lead = b.campaign(value("b")).await.unwrap();
        (Instant::now(), lead)
    });
    sleep(Duration::from_secs(5)).await;
    assert!(!waiting.is_finished(), "b led while a did");
    let resigned = Instant::now();
    lead.resign().await.unwrap();
    let (led, b_lead) = timeout(long, waiting)
        .await
        .expect("b was not woken")
        .unwrap();
    assert!(
        led - resigned < ms(100),
        "b led {:?} after the resign",
        led - resigned
    );

    // Dropping a leadership resigns too, in the background.
    let waiting = tokio::spawn(async move { a.campaign(value("a")).await.map(|_| Instant::now()) });
    sleep(Duration::from_secs(5)).await;
    let dropped = Instant::now();
    drop(b_lead);
    let led = timeout(long, waiting)
        .await
        .expect("a was not woken")
        .unwrap()
        .unwrap();
    assert!(
        led - dropped < ms(100),
        "a led {:?} after the drop",
        led - dropped
    );
}

async fn observer_sees_every_transition_in_order(no_watch: bool) {
    let rec = Rec::new(Fake::new());
    rec.no_watch.store(no_watch, Ordering::SeqCst);
    let k = key("elect/observe");
    let (a, b) = (candidate(&rec, &k), candidate(&rec, &k));
    let (ah, bh) = (a.keeper().holder().clone(), b.keeper().holder().clone());
    let mut observer = candidate(&rec, &k).observe();
    let mut latest = observer.watch();

    let lead = a.campaign(value("a:1")).await.unwrap();
    let first = next(&mut observer).await;
    assert!(is(&first, &ah, "a:1"), "{first:?}");
    assert_eq!(first.as_ref().map(|l| l.fence), Some(lead.fence()));
    lead.proclaim(value("a:2")).await.unwrap();
    assert_eq!(lead.payload(), value("a:2"));
    let second = next(&mut observer).await;
    assert!(is(&second, &ah, "a:2"), "{second:?}");
    lead.resign().await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        None,
        "no 'no leader' after the resign"
    );

    let lead = b.campaign(value("b")).await.unwrap();
    let third = next(&mut observer).await;
    assert!(is(&third, &bh, "b"), "{third:?}");
    assert!(third.as_ref().unwrap().fence > first.unwrap().fence);
    // B's renewals are cut, and its grant runs out on the backend.
    rec.hang.store(true, Ordering::SeqCst);
    rec.fake.advance(TTL);
    assert_eq!(
        next(&mut observer).await,
        None,
        "no 'no leader' after the expiry"
    );
    assert_eq!(observer.current(), None);
    assert_eq!(*latest.borrow_and_update(), None);
    let _ = lead.lost().await;
    // Nothing more happened: nothing more is reported.
    assert!(timeout(Duration::from_secs(10), observer.changed())
        .await
        .is_err());
}

#[tokio::test(start_paused = true)]
async fn observer_sees_every_transition_in_order_by_watch() {
    observer_sees_every_transition_in_order(false).await;
}

#[tokio::test(start_paused = true)]
async fn observer_sees_every_transition_in_order_by_polling() {
    observer_sees_every_transition_in_order(true).await;
}

/// A watch wake after "no leader" is read at once: the next leader,
/// campaigning while the last one resigns, is reported the instant its
/// campaign returns (tokio's paused clock: no time passes), not after the
/// pause that keeps a watch waking without news from spinning.
#[tokio::test(start_paused = true)]
async fn the_observer_reports_the_next_leader_when_its_campaign_returns() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/next-at-once");
    let (a, b) = (candidate(&rec, &k), candidate(&rec, &k));
    let bh = b.keeper().holder().clone();
    let mut observer = candidate(&rec, &k).observe();
    let lead = a.campaign(value("a")).await.unwrap();
    while next(&mut observer).await.is_none() {}
    let waiting = tokio::spawn(async move {
        let lead = b.campaign(value("b")).await.unwrap();
        (Instant::now(), lead)
    });
    sleep(Duration::from_secs(1)).await;
    lead.resign().await.unwrap();
    let (led, _b_lead) = waiting.await.unwrap();
    let reported = loop {
        let change = next(&mut observer).await;
        if is(&change, &bh, "b") {
            break Instant::now();
        }
        assert_eq!(change, None, "only 'no leader' may come between");
    };
    assert!(
        reported - led < ms(1),
        "the next leader was reported {:?} after its campaign returned",
        reported - led
    );
}

/// On the real clock: a spinning observer would never let paused time
/// advance.
#[tokio::test]
async fn a_watch_waking_without_news_does_not_make_the_observer_spin() {
    let rec = Rec::new(Fake::new());
    rec.restless_watch.store(true, Ordering::SeqCst);
    let observer = candidate(&rec, &key("elect/restless")).with_poll_interval(PACED_POLL);
    assert_reads_paced(observer, &rec.reads, "a watch that always wakes").await;
}

/// The poll interval of the spin tests: the guard allows a read every
/// fiftieth of it, 10 ms.
const PACED_POLL: Duration = Duration::from_millis(500);

/// Observes with `election` (polling every [`PACED_POLL`]) for 300 ms of
/// the real clock and checks the spin guard held: at most 31 reads (fewer
/// on a loaded machine, whose sleeps run long).
async fn assert_reads_paced(election: Election, reads: &AtomicU64, what: &str) {
    let _observer = election.observe();
    sleep(ms(300)).await;
    let reads = reads.load(Ordering::SeqCst);
    assert!(
        (2..=32).contains(&reads),
        "{reads} reads in 300 ms of {what}"
    );
}

#[tokio::test(start_paused = true)]
async fn run_reports_finished_lost_and_resigned() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/run");
    let (a, b) = (candidate(&rec, &k), candidate(&rec, &k));

    let lead = a.campaign(value("a")).await.unwrap();
    assert!(matches!(
        bounded(&lead, async { 7 }).await,
        WorkEnded::Finished(7)
    ));

    // Resigned from another task while the work runs.
    let resigner = lead.resigner();
    tokio::spawn(async move {
        sleep(ms(500)).await;
        resigner.resign().await.unwrap();
    });
    let (polled, dropped) = (Arc::new(Mutex::new(false)), Arc::new(Mutex::new(None)));
    let started = Instant::now();
    let ended = bounded(&lead, endless(polled.clone(), dropped.clone())).await;
    assert!(matches!(ended, WorkEnded::Resigned), "{ended:?}");
    assert_eq!(*dropped.lock().unwrap(), Some(started + ms(500)));
    // The key is free for the next candidate at once.
    let lead_b = timeout(ms(100), b.campaign(value("b")))
        .await
        .expect("b not woken")
        .unwrap();
    // A resigned leadership never runs work again.
    let (polled, dropped) = (Arc::new(Mutex::new(false)), Arc::new(Mutex::new(None)));
    assert!(matches!(
        bounded(&lead, endless(polled.clone(), dropped)).await,
        WorkEnded::Resigned
    ));
    assert!(
        !*polled.lock().unwrap(),
        "work polled for a resigned leadership"
    );
    drop(lead);

    // Taken over: the backend expires b's grant and a takes the key.
    rec.fake.expire(&k);
    let lead_a = a.campaign(value("a")).await.unwrap();
    let (polled, dropped) = (Arc::new(Mutex::new(false)), Arc::new(Mutex::new(None)));
    let ended = bounded(&lead_b, endless(polled.clone(), dropped.clone())).await;
    match ended {
        WorkEnded::Lost(LossReason::TakenOver { by, fence }) => {
            assert!(by.is_term_of(a.keeper().holder()));
            assert_eq!(fence, lead_a.fence());
        }
        other => panic!("{other:?}"),
    }
    assert!(dropped.lock().unwrap().is_some());
    assert!(a
        .leader()
        .await
        .unwrap()
        .is_some_and(|l| l.fence == lead_a.fence()));
}

#[tokio::test(start_paused = true)]
async fn run_never_polls_work_past_the_deadline() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/late");
    let lead = candidate(&rec, &k).campaign(value("a")).await.unwrap();
    rec.hang.store(true, Ordering::SeqCst);
    tokio::time::sleep_until(lead.deadline()).await;
    let (polled, dropped) = (Arc::new(Mutex::new(false)), Arc::new(Mutex::new(None)));
    let ended = bounded(&lead, endless(polled.clone(), dropped)).await;
    assert!(matches!(ended, WorkEnded::DeadlinePassed), "{ended:?}");
    assert!(!*polled.lock().unwrap(), "work polled past the deadline");
}

#[tokio::test(start_paused = true)]
async fn a_late_proclaim_after_loss_is_refused_and_the_new_value_stays() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/late-proclaim");
    let (a, b) = (candidate(&rec, &k), candidate(&rec, &k));
    let lead_a = a.campaign(value("a")).await.unwrap();
    // A's grant runs out behind its back (A has not noticed) and B leads.
    rec.fake.expire(&k);
    let lead_b = b.campaign(value("b")).await.unwrap();
    assert!(lead_a.may_write(), "a noticed too early for this test");
    match lead_a.proclaim(value("a:late")).await {
        Err(ProclaimError::Lost(LossReason::TakenOver { by, .. })) => {
            assert!(by.is_term_of(b.keeper().holder()))
        }
        other => panic!("{other:?}"),
    }
    let leader = a.leader().await.unwrap().unwrap();
    assert_eq!(
        (&leader.holder, leader.fence),
        (lead_b.holder(), lead_b.fence())
    );
    assert_eq!(leader.value, value("b"));
    // Once known lost, a proclaim sends nothing.
    let renewals = rec.renew_count.load(Ordering::SeqCst);
    assert!(matches!(
        lead_a.proclaim(value("a:later")).await,
        Err(ProclaimError::Lost(_))
    ));
    assert_eq!(rec.renew_count.load(Ordering::SeqCst), renewals);
    assert_eq!(a.leader().await.unwrap().unwrap().value, value("b"));
}

#[tokio::test(start_paused = true)]
async fn unbounded_waits_and_intervals_do_not_panic() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/max");
    let a = candidate(&rec, &k);
    let b = candidate(&rec, &k).with_poll_interval(Duration::MAX);
    let _lead = a.campaign(value("a")).await.unwrap();
    let waiting = timeout(
        Duration::from_secs(60),
        b.campaign(value("b")).wait(Duration::MAX),
    )
    .await;
    assert!(waiting.is_err(), "b led while a did");
    let mut observer = b.observe();
    assert!(next(&mut observer).await.is_some());
    sleep(Duration::from_secs(3600)).await;
    assert!(observer.current().is_some());

    // Watching a free key with no poll bound at all: woken by the first leader.
    let free = key("elect/max-free");
    let mut observer = candidate(&rec, &free)
        .with_poll_interval(Duration::MAX)
        .observe();
    assert_eq!(next(&mut observer).await, None, "the first read: no leader");
    sleep(Duration::from_secs(3600)).await;
    let lead = candidate(&rec, &free).campaign(value("c")).await.unwrap();
    assert_eq!(
        next(&mut observer).await.map(|l| l.fence),
        Some(lead.fence())
    );
}

/// Reads answer from a script (then repeat its last state); the rest is the
/// fake's. Its watch, when `restless`, wakes at once every time (after a
/// yield); otherwise there is none and the observer polls.
struct Scripted {
    fake: Fake,
    reads: Mutex<VecDeque<LeaseState>>,
    last: Mutex<LeaseState>,
    restless: bool,
    count: AtomicU64,
}

impl Scripted {
    fn new(script: impl IntoIterator<Item = LeaseState>, restless: bool) -> Arc<Self> {
        Arc::new(Scripted {
            fake: Fake::new(),
            reads: Mutex::new(script.into_iter().collect()),
            last: Mutex::new(LeaseState::Free),
            restless,
            count: AtomicU64::new(0),
        })
    }
}

impl LeaseLayer for Scripted {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn read<'a>(
        &'a self,
        _key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<LeaseState, lease_core::Error>> {
        self.count.fetch_add(1, Ordering::SeqCst);
        let mut last = self.last.lock().unwrap();
        if let Some(next) = self.reads.lock().unwrap().pop_front() {
            *last = next;
        }
        let state = last.clone();
        Box::pin(async move { Ok(state) })
    }
    fn wait_for_change<'a>(
        &'a self,
        _key: &'a LeaseKey,
        _seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), lease_core::Error>> {
        if !self.restless {
            return Box::pin(async { Err(lease_core::Error::Unsupported { operation: "watch" }) });
        }
        restless_wake()
    }
}

/// Reads that go back and forth between two values of one leader (replicas
/// lagging one another), each wake-up at once: every read is news, and the
/// observer must still not read back to back.
#[tokio::test]
async fn reads_flapping_between_two_values_do_not_make_the_observer_spin() {
    let a = HolderId::random();
    let script = (0..200_000).map(|i| held(&a, 2, if i % 2 == 0 { "x" } else { "y" }));
    let backend = Scripted::new(script, true);
    let election = Keeper::new(backend.clone())
        .election(&key("elect/flapping"))
        .with_poll_interval(PACED_POLL);
    assert_reads_paced(election, &backend.count, "values flapping").await;
}

fn holding(holder: &HolderId, fence: u64, v: &str) -> Holding {
    Holding::new(holder.clone(), Fence(fence), TTL, value(v))
}

fn held(holder: &HolderId, fence: u64, v: &str) -> LeaseState {
    LeaseState::Held(holding(holder, fence, v))
}

#[tokio::test(start_paused = true)]
async fn the_observer_drops_stale_reads_and_reports_expiry_as_no_leader() {
    let (a, b) = (HolderId::random(), HolderId::random());
    // etcd reports whole seconds: zero is under a second left, still held.
    let last_second = LeaseState::Held(holding(&b, 3, "b").with_remaining(Some(Duration::ZERO)));
    let script = [
        held(&a, 2, "a"),
        held(&a, 1, "old"), // a lower fence after a higher one: stale
        LeaseState::Free,
        held(&a, 2, "a"), // a grant already seen ending: stale
        held(&b, 3, "b"),
        held(&b, 3, "b"),       // nothing changed
        last_second,            // still the leader: nothing changed
        held(&b, 3, "b:again"), // the same leader, a new value
        LeaseState::Free,       // expired: no leader
        held(&b, 3, "b:back"),  // a grant seen ending does not come back
    ];
    let backend = Scripted::new(script, false);
    let mut observer = Keeper::new(backend)
        .election(&key("elect/stale"))
        .with_poll_interval(ms(100))
        .observe();
    let seen = |l: Option<Leader>| l.map(|l| (l.holder, l.fence.get(), l.value));
    assert_eq!(
        seen(next(&mut observer).await),
        Some((a.clone(), 2, value("a")))
    );
    assert_eq!(seen(next(&mut observer).await), None);
    assert_eq!(
        seen(next(&mut observer).await),
        Some((b.clone(), 3, value("b")))
    );
    assert_eq!(
        seen(next(&mut observer).await),
        Some((b.clone(), 3, value("b:again")))
    );
    assert_eq!(seen(next(&mut observer).await), None);
    assert!(
        timeout(Duration::from_secs(10), observer.changed())
            .await
            .is_err(),
        "reported a stale leader: {:?}",
        observer.current()
    );
}

#[tokio::test(start_paused = true)]
async fn a_proclaim_while_the_loss_is_being_classified_sends_nothing() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/classifying");
    // B renews rarely, so that every renewal counted below would be A's.
    let (a, b) = (
        candidate(&rec, &k),
        candidate(&rec, &k).with_ttl(Duration::from_secs(60)),
    );
    let lead_a = a.campaign(value("a")).await.unwrap();
    rec.fake.expire(&k);
    let lead_b = b.campaign(value("b")).await.unwrap();
    // A's next renewal answers Lost; the read that says why hangs.
    rec.hang_reads.store(true, Ordering::SeqCst);
    while lead_a.may_write() {
        sleep(ms(10)).await;
    }
    assert!(Instant::now() < lead_a.deadline() && lead_a.loss().is_none());
    let renewals = rec.renew_count.load(Ordering::SeqCst);
    let refused = timeout(TTL * 2, lead_a.proclaim(value("a:late")))
        .await
        .expect("proclaim did not end");
    assert!(
        matches!(refused, Err(ProclaimError::Lost(_))),
        "{refused:?}"
    );
    assert_eq!(
        rec.renew_count.load(Ordering::SeqCst),
        renewals,
        "a renewal was sent"
    );
    rec.hang_reads.store(false, Ordering::SeqCst);
    let leader = a.leader().await.unwrap().unwrap();
    assert_eq!((leader.fence, leader.value), (lead_b.fence(), value("b")));
}

/// A proclaim cancelled while the read after its refused renewal is under
/// way still has its loss recorded, with the reason that read finds: the
/// leadership's `run` and `lost()` both report the takeover, not an
/// expiry made up after waiting a TTL for a reason nobody would record.
#[tokio::test(start_paused = true)]
async fn a_proclaim_cancelled_while_its_loss_is_classified_still_ends_the_leadership() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/cancelled-proclaim");
    let (a, b) = (
        candidate(&rec, &k),
        candidate(&rec, &k).with_ttl(Duration::from_secs(60)),
    );
    let lead_a = a.campaign(value("a")).await.unwrap();
    rec.fake.expire(&k);
    let _lead_b = b.campaign(value("b")).await.unwrap();
    rec.slow_reads_ms.store(500, Ordering::SeqCst);
    assert!(
        timeout(ms(100), lead_a.proclaim(value("a:late")))
            .await
            .is_err(),
        "the proclaim ended before its read"
    );
    assert!(!lead_a.may_write() && lead_a.loss().is_none());
    let ended = lead_a.run(std::future::pending::<()>()).await;
    assert!(
        matches!(ended, WorkEnded::Lost(LossReason::TakenOver { .. })),
        "run after a cancelled proclaim: {ended:?}"
    );
    let reason = timeout(TTL, lead_a.lost())
        .await
        .expect("the loss of a leadership whose proclaim was cancelled was never recorded");
    assert!(matches!(reason, LossReason::TakenOver { .. }), "{reason:?}");
}

/// Work running when a proclaim's renewal is refused, and the read that
/// tells why hangs until its TTL: `run` reports the reason that read
/// records (the break, from the key's last break), the same one `lost()`
/// gives, not an expiry from its own timer firing at the same moment.
#[tokio::test(start_paused = true)]
async fn run_and_lost_agree_when_the_read_after_a_refused_renewal_hangs() {
    let rec = Rec::new(Fake::new());
    let k = key("elect/hung-read");
    let lead = Arc::new(candidate(&rec, &k).campaign(value("a")).await.unwrap());
    let running = tokio::spawn({
        let lead = lead.clone();
        async move { lead.run(std::future::pending::<()>()).await }
    });
    tokio::task::yield_now().await;
    rec.fake
        .break_lease(&k, &lease_core::BreakNote::new("ops", "maintenance"))
        .await
        .unwrap();
    rec.hang_reads.store(true, Ordering::SeqCst);
    assert!(
        timeout(ms(100), lead.proclaim(value("a:late")))
            .await
            .is_err(),
        "the proclaim ended before its read"
    );
    let ended = running.await.unwrap();
    let reason = lead.loss().expect("no loss recorded once run returned");
    assert!(
        matches!(reason, LossReason::Broken { .. }),
        "lost: {reason:?}"
    );
    assert!(
        matches!(&ended, WorkEnded::Lost(r) if *r == reason),
        "run says {ended:?}, lost() says {reason:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_observer_stops_its_reads() {
    let rec = Rec::new(Fake::new());
    rec.no_watch.store(true, Ordering::SeqCst);
    let k = key("elect/drop-observer");
    let observer = candidate(&rec, &k).with_poll_interval(ms(100)).observe();
    sleep(Duration::from_secs(1)).await;
    let reads = rec.reads.load(Ordering::SeqCst);
    assert!(reads >= 5, "{reads} reads in 1 s at a 100 ms poll interval");
    drop(observer);
    sleep(ms(1)).await;
    let reads = rec.reads.load(Ordering::SeqCst);
    sleep(Duration::from_secs(10)).await;
    assert_eq!(
        rec.reads.load(Ordering::SeqCst),
        reads,
        "reads after the drop"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unbounded_ttl_is_refused_or_rounded_never_a_panic() {
    let rec = Rec::new(Fake::new());
    let election = candidate(&rec, &key("elect/max-ttl")).with_ttl(Duration::MAX);
    let _ = election.poll_interval();
    if let Ok(lead) = election.campaign(value("a")).await {
        assert!(lead.may_write());
        let _ = bounded(&lead, async {}).await;
    }
    let mut observer = election.observe();
    let _ = timeout(Duration::from_secs(5), observer.changed()).await;
}

fn assert_send_sync<T: Send + Sync>() {}

fn assert_send<F: Send>(_: F) {}

#[tokio::test]
async fn election_handles_are_send_and_sync_and_futures_spawnable() {
    assert_send_sync::<Election>();
    assert_send_sync::<Leadership>();
    assert_send_sync::<lease_keeper::Resigner>();
    assert_send_sync::<Leader>();
    assert_send_sync::<ProclaimError>();
    assert_send_sync::<WorkEnded<()>>();
    assert_send_sync::<lease_keeper::Campaign>();
    assert_send::<Observer>(candidate(&Rec::new(Fake::new()), &key("elect/send")).observe());

    let rec = Rec::new(Fake::new());
    let election = candidate(&rec, &key("elect/send"));
    let lead = election.campaign(value("a")).await.unwrap();
    let mut observer = election.observe();
    assert_send(std::future::IntoFuture::into_future(
        election.campaign(value("b")),
    ));
    assert_send(election.leader());
    assert_send(observer.changed());
    assert_send(lead.proclaim(value("a")));
    assert_send(lead.run(async {}));
    assert_send(lead.resigner().resign());
    assert_send(lead.resign());
}

/// The fake, but a renewal without a payload reads the stored payload when it
/// is sent and writes it back when it lands, 300 ms later — as a backend
/// that renews by read-modify-write does. A renewal in flight when the value
/// changes then lands the old value on top of the new one.
struct ReadModifyWrite {
    fake: Fake,
    in_flight: std::sync::atomic::AtomicBool,
}

impl LeaseLayer for ReadModifyWrite {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, lease_core::Error>> {
        Box::pin(async move {
            let Some(payload) = payload else {
                let stored = self.fake.read(grant.key()).await?;
                let old = stored.holding().map(|h| h.payload.clone());
                self.in_flight.store(true, Ordering::SeqCst);
                sleep(ms(300)).await;
                let renewed = self.fake.renew(grant, old).await;
                self.in_flight.store(false, Ordering::SeqCst);
                return renewed;
            };
            self.fake.renew(grant, Some(payload)).await
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_renewal_in_flight_during_a_proclaim_does_not_leave_the_old_value() {
    let backend = Arc::new(ReadModifyWrite {
        fake: Fake::new(),
        in_flight: Default::default(),
    });
    let election = Keeper::new(backend.clone())
        .with_ttl(TTL)
        .election(&key("elect/rmw"));
    let lead = election.campaign(value("v1")).await.unwrap();
    while !backend.in_flight.load(Ordering::SeqCst) {
        sleep(ms(1)).await;
    }
    lead.proclaim(value("v2")).await.unwrap();
    // The renewal that was in flight lands "v1" again; the next one must
    // put "v2" back, within a renew interval.
    sleep(TTL).await;
    assert!(lead.may_write());
    let leader = election.leader().await.unwrap().unwrap();
    assert_eq!(leader.value, value("v2"));
    assert_eq!(lead.payload(), value("v2"));
}

/// A read that reports a held key with no whole second left (etcd counts
/// remaining time in whole seconds).
struct LastSecond {
    fake: Fake,
}

impl LeaseLayer for LastSecond {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(async move {
            Ok(match self.fake.read(key).await? {
                LeaseState::Held(h) => LeaseState::Held(h.with_remaining(Some(Duration::ZERO))),
                free => free,
            })
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_with_under_a_second_left_is_still_the_leader() {
    let fake = Fake::new();
    let k = key("elect/last-second");
    let a = Keeper::new(Arc::new(LastSecond { fake: fake.clone() }))
        .election(&k)
        .with_ttl(Duration::from_secs(30));
    let lead = a.campaign(value("a")).await.unwrap();
    let leader = a.leader().await.unwrap();
    assert_eq!(
        leader.map(|l| (l.fence, l.value)),
        Some((lead.fence(), value("a"))),
        "a held key with zero whole seconds left showed no leader"
    );
}
