//! Work bound to a held lease: `Lease::run` and `Keeper::run_exclusive`, on
//! the fake, timing on tokio's paused clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{key, ms, Rec};
use lease_fake::Fake;
use lease_keeper::{AcquireError, Keeper, Lease, LossReason, WorkEnded};
use tokio::time::{sleep, timeout, Instant};

const TTL: Duration = Duration::from_secs(3);

/// Work that never returns by itself; it notes when it was dropped.
fn endless(dropped: Arc<Mutex<Option<Instant>>>) -> impl std::future::Future<Output = ()> {
    struct DropClock(Arc<Mutex<Option<Instant>>>);
    impl Drop for DropClock {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(Instant::now());
        }
    }
    let clock = DropClock(dropped);
    async move {
        let _clock = clock;
        std::future::pending::<()>().await
    }
}

async fn bounded<F: std::future::Future>(lease: &Lease, work: F) -> WorkEnded<F::Output> {
    timeout(Duration::from_secs(600), lease.run(work))
        .await
        .expect("run did not end")
}

#[tokio::test(start_paused = true)]
async fn lease_run_finishes_or_drops_the_work_by_the_deadline() {
    let rec = Rec::new(Fake::new());
    let keeper = Keeper::new(rec.clone()).with_ttl(TTL);
    let lease = keeper.acquire(&key("run/hang")).await.unwrap();
    assert!(matches!(
        bounded(&lease, async { 7 }).await,
        WorkEnded::Finished(7)
    ));

    // The backend stops answering: the work is dropped by the write
    // deadline, not at the loss the keeper learns of later.
    rec.hang.store(true, Ordering::SeqCst);
    let deadline = lease.deadline();
    let dropped = Arc::new(Mutex::new(None));
    let ended = bounded(&lease, endless(dropped.clone())).await;
    assert!(matches!(ended, WorkEnded::DeadlinePassed), "{ended:?}");
    let at = dropped.lock().unwrap().expect("the work was not dropped");
    assert!(
        at <= deadline,
        "dropped at {at:?}, after the deadline {deadline:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn lease_run_drops_the_work_at_once_when_the_lease_is_taken_over() {
    let rec = Rec::new(Fake::new());
    let k = key("run/taken");
    let (a, b) = (
        Keeper::new(rec.clone()).with_ttl(TTL),
        Keeper::new(rec.clone()).with_ttl(TTL),
    );
    let lease_a = a.acquire(&k).await.unwrap();
    let dropped = Arc::new(Mutex::new(None));
    let taker = {
        let (rec, k) = (rec.clone(), k.clone());
        tokio::spawn(async move {
            sleep(ms(500)).await;
            rec.fake.expire(&k);
            b.acquire(&k).await.unwrap()
        })
    };
    let ended = bounded(&lease_a, endless(dropped.clone())).await;
    let lease_b = taker.await.unwrap();
    match ended {
        WorkEnded::Lost(LossReason::TakenOver { fence, .. }) => assert_eq!(fence, lease_b.fence()),
        other => panic!("{other:?}"),
    }
    let at = dropped.lock().unwrap().expect("the work was not dropped");
    assert!(
        at <= lease_a.deadline(),
        "work dropped at {at:?}, after A's deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn run_exclusive_runs_the_work_on_one_holder_at_a_time_and_releases() {
    let rec = Rec::new(Fake::new());
    let k = key("run/exclusive");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let keeper = Keeper::new(rec.clone()).with_ttl(TTL);
        let (k, inside, most) = (k.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            keeper
                .run_exclusive(&k, async {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    sleep(ms(700)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    "done"
                })
                .await
        }));
    }
    let started = Instant::now();
    for t in tasks {
        let ended = t.await.unwrap().expect("acquired");
        assert!(matches!(ended, WorkEnded::Finished("done")), "{ended:?}");
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two holders ran the work at once"
    );
    // Each release wakes the next waiter: four runs of 0.7 s, not four TTLs.
    assert!(
        started.elapsed() < TTL * 2,
        "the runs took {:?}: a lease was not released after its work",
        started.elapsed()
    );
    // And nothing is left held.
    let probe = Keeper::new(rec.clone()).with_ttl(TTL);
    let _last = probe
        .try_acquire(&k)
        .await
        .expect("the key is free after the last run");
}

/// A job that finished early still keeps the key for the minimum hold,
/// renewed past several TTLs: another holder cannot take it before, and
/// takes it right after.
#[tokio::test(start_paused = true)]
async fn release_after_keeps_the_key_for_the_minimum_hold_then_frees_it() {
    let rec = Rec::new(Fake::new());
    let (first, second) = (Keeper::new(rec.clone()), Keeper::new(rec.clone()));
    let k = key("run/hold-at-least");
    let min_hold = Duration::from_secs(10);
    let lease = first.try_acquire(&k).ttl(TTL).await.unwrap();
    let acquired = Instant::now();
    // The job took no time: the hold starts at once.
    let releasing = tokio::spawn(lease.release_after(min_hold));
    sleep(min_hold - ms(100)).await;
    assert!(
        matches!(
            second.try_acquire(&k).ttl(TTL).await,
            Err(AcquireError::Held { .. })
        ),
        "taken before the minimum hold"
    );
    let taken = second
        .acquire(&k)
        .ttl(TTL)
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    let at = acquired.elapsed();
    assert!(
        at >= min_hold && at < min_hold + ms(200),
        "taken {at:?} after the first acquire"
    );
    releasing.await.unwrap().unwrap();
    taken.release().await.unwrap();

    // Held longer than the minimum already: released at once.
    let lease = first.try_acquire(&k).ttl(TTL).await.unwrap();
    sleep(Duration::from_secs(4)).await;
    let start = Instant::now();
    lease.release_after(Duration::from_secs(1)).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(second.try_acquire(&k).await.is_ok());
}

/// `release_after` awaited outside any tokio runtime (as `release` may
/// be): no panic, the hold is kept, then the key is free.
#[test]
fn release_after_works_outside_a_tokio_runtime() {
    use std::task::{Context, Poll, Wake, Waker};

    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    /// The smallest executor: polls on this thread, parks between polls.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
                return out;
            }
            std::thread::park_timeout(Duration::from_millis(10));
        }
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let fake = Fake::new();
    let keeper = Keeper::new(Arc::new(fake.clone())).with_ttl(TTL);
    let k = key("run/no-runtime");
    let lease = rt
        .block_on(std::future::IntoFuture::into_future(keeper.acquire(&k)))
        .expect("acquired");
    let started = std::time::Instant::now();
    let released = std::thread::spawn(move || block_on(lease.release_after(ms(300))))
        .join()
        .expect("release_after panicked outside a runtime");
    released.expect("released");
    assert!(
        started.elapsed() >= ms(250),
        "the minimum hold was not kept: {:?}",
        started.elapsed()
    );
    let again = rt.block_on(std::future::IntoFuture::into_future(
        Keeper::new(Arc::new(fake)).try_acquire(&k),
    ));
    assert!(again.is_ok(), "the key stayed held: {:?}", again.err());
}
