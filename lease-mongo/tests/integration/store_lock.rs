//! The writer/fsck protocol (`StoreLeases`: many shared writer leases
//! against one exclusive fsck lease) on a real MongoDB-compatible server.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_mongo::store_lock::{StoreLeaseError, StoreLeases, StoreLockTiming};
use mongodb::Client;

/// Fast heartbeats so staleness can be waited out in a test (stale after
/// 600 ms: long enough that a loaded CI machine does not make a fresh owner
/// stale between two steps of a test).
fn quick() -> StoreLockTiming {
    StoreLockTiming::default()
        .refresh_interval(Duration::from_millis(200))
        .stale_multiplier(3)
        .poll(Duration::from_millis(5), Duration::from_millis(40))
        .drain_timeout(None)
}

/// A fresh collection of the protocol, with `n` independent clients
/// (separate connection pools, as separate processes would have).
async fn stores(n: usize, timing: StoreLockTiming) -> Vec<StoreLeases> {
    let uri = common::uri();
    let name = common::unique("store_leases");
    let mut out = Vec::new();
    for _ in 0..n {
        let client = Client::with_uri_str(&uri).await.expect("client");
        let db = client.database("lease_test");
        out.push(
            StoreLeases::in_collection(&db, &name, timing)
                .await
                .expect("store leases"),
        );
    }
    out
}

fn locked(r: Result<impl std::fmt::Debug, StoreLeaseError>) -> StoreLeaseError {
    match r {
        Err(e) if e.is_store_locked() && !e.is_lease_lost() => e,
        other => panic!("expected StoreLockedError, got {other:?}"),
    }
}

fn lost(r: Result<(), StoreLeaseError>) {
    match r {
        Err(e) if e.is_lease_lost() => {}
        other => panic!("expected LeaseLostError, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_share_and_fsck_excludes_them() {
    // Nothing here waits for staleness: seed timings, fast polling.
    let t = StoreLockTiming::default().poll(Duration::from_millis(5), Duration::from_millis(40));
    let s = stores(1, t).await.remove(0);
    let w1 = s.acquire_writer("w1").await.unwrap();
    let w2 = s.acquire_writer("w2").await.unwrap();
    assert_eq!(w1.generation(), 0);
    assert_eq!(w2.generation(), 0);
    assert_ne!(w1.identifier(), w2.identifier());

    // fsck drains: it waits while writers are fresh and proceeds once they leave.
    let fsck = {
        let s = s.clone();
        tokio::spawn(async move { s.acquire_fsck("fsck", false).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!fsck.is_finished(), "fsck must wait for fresh writers");
    // The singleton is installed first: a new writer is refused meanwhile.
    locked(s.acquire_writer("late").await);
    w1.refresh_heartbeat(false).await.unwrap();
    w1.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!fsck.is_finished(), "one writer is still registered");
    w2.release().await.unwrap();
    let f = fsck.await.unwrap().unwrap();
    assert_eq!(f.generation(), 1);
    locked(s.acquire_writer("during fsck").await);
    // A second fsck is refused too.
    locked(s.acquire_fsck("fsck2", false).await);
    f.release().await.unwrap();

    let w3 = s.acquire_writer("w3").await.unwrap();
    assert_eq!(
        w3.generation(),
        1,
        "the generation changes after an fsck ran"
    );
    w3.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_fsck_blocks_writers_until_cleared() {
    let t = quick();
    let s = stores(1, t).await.remove(0);
    let f = s.acquire_fsck("crashed fsck", false).await.unwrap();
    // Fresh: clear_stale_lock refuses.
    locked(s.clear_stale_lock().await);
    tokio::time::sleep(t.stale_after() + Duration::from_millis(50)).await;
    // Stale still blocks writers: only an administrator's assertion clears it.
    locked(s.acquire_writer("w").await);
    // A stale owner cannot revive itself without force.
    lost(f.refresh_heartbeat(false).await);
    assert!(s.clear_stale_lock().await.unwrap());
    assert!(
        !s.clear_stale_lock().await.unwrap(),
        "nothing left to clear"
    );
    // The displaced owner learns it on its next refresh, even with force.
    lost(f.refresh_heartbeat(true).await);
    let w = s.acquire_writer("w").await.unwrap();
    assert_eq!(w.generation(), 1);
    w.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_replaces_an_fsck_and_passes_stale_writer_residue() {
    let t = quick();
    let s = stores(1, t).await.remove(0);
    let dead_writer = s.acquire_writer("dead writer").await.unwrap();
    tokio::time::sleep(t.stale_after() + Duration::from_millis(50)).await;
    // Stale writer residue blocks fsck unless forced, and the singleton is backed out.
    let e = locked(s.acquire_fsck("fsck", false).await);
    assert!(e.to_string().contains("stale writer"), "{e}");
    let w = s.acquire_writer("w").await.unwrap();
    w.release().await.unwrap();

    let f1 = s.acquire_fsck("fsck", true).await.unwrap();
    lost(dead_writer.refresh_heartbeat(true).await);
    // A pre-existing fsck lease blocks another unless forced.
    locked(s.acquire_fsck("fsck2", false).await);
    let f2 = s.acquire_fsck("fsck2", true).await.unwrap();
    lost(f1.refresh_heartbeat(false).await);
    f2.refresh_heartbeat(false).await.unwrap();
    // Releasing the displaced one leaves the new one alone.
    f1.release().await.unwrap();
    locked(s.acquire_writer("w").await);
    f2.release().await.unwrap();
    assert_eq!(s.acquire_writer("w").await.unwrap().generation(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_timeout_backs_out() {
    let t = quick().drain_timeout(Some(Duration::from_millis(150)));
    let s = stores(1, t).await.remove(0);
    let w = s.acquire_writer("busy").await.unwrap();
    let keep = {
        let w = w.clone();
        tokio::spawn(async move {
            for _ in 0..10 {
                w.refresh_heartbeat(false).await.unwrap();
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    let started = Instant::now();
    locked(s.acquire_fsck("impatient", false).await);
    assert!(started.elapsed() >= Duration::from_millis(150));
    // Backed out: writers are admitted again.
    s.acquire_writer("next")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    keep.await.unwrap();
    w.release().await.unwrap();
    assert!(quick().stale_multiplier(1).validate().is_err());
    let max = quick().poll_max;
    assert!(quick()
        .poll(Duration::from_secs(1), max)
        .validate()
        .is_err());
}

/// The handshake under contention: writers and fsck racing from many tasks
/// on separate clients; a writer and the fsck are never both active, and
/// writers admitted after an fsck see a later generation. It runs for at
/// least `run_for` and then until both sides made enough progress to mean
/// something (a loaded machine admits fewer in the same time), up to
/// `give_up_after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_a_writer_and_fsck_together() {
    const WRITERS: usize = 8;
    const FSCKS: usize = 2;
    const WRITES_WANTED: usize = 20;
    const FSCKS_WANTED: usize = 2;
    let run_for = Duration::from_secs(6);
    let give_up_after = Duration::from_secs(60);
    let clients = stores(WRITERS + FSCKS, StoreLockTiming::default()).await;
    let active_writers = Arc::new(AtomicUsize::new(0));
    let active_fsck = Arc::new(AtomicUsize::new(0));
    let fsck_active = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Mutex::new((0usize, 0usize, 0usize, 0usize))); // writer ok/refused, fsck ok/refused
    let generations = Arc::new(Mutex::new(Vec::<(Instant, u64)>::new()));
    let fsck_runs = Arc::new(Mutex::new(Vec::<(Instant, Instant, u64)>::new()));
    let started = Instant::now();
    let enough = {
        let counts = counts.clone();
        move || {
            let (w_ok, w_refused, f_ok, _) = *counts.lock().unwrap();
            w_ok > WRITES_WANTED && w_refused > 0 && f_ok >= FSCKS_WANTED
        }
    };
    let mut tasks = Vec::new();
    for (i, s) in clients.into_iter().enumerate() {
        let (aw, af, fa, counts, gens, runs) = (
            active_writers.clone(),
            active_fsck.clone(),
            fsck_active.clone(),
            counts.clone(),
            generations.clone(),
            fsck_runs.clone(),
        );
        let enough = enough.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while started.elapsed() < run_for || (!enough() && started.elapsed() < give_up_after) {
                n += 1;
                if i < WRITERS {
                    match s.acquire_writer(&format!("writer-{i}")).await {
                        Ok(w) => {
                            aw.fetch_add(1, Ordering::SeqCst);
                            assert!(
                                !fa.load(Ordering::SeqCst),
                                "writer admitted while fsck active"
                            );
                            gens.lock().unwrap().push((Instant::now(), w.generation()));
                            tokio::time::sleep(Duration::from_millis(n % 7 * 3)).await;
                            w.refresh_heartbeat(false).await.unwrap();
                            assert!(
                                !fa.load(Ordering::SeqCst),
                                "fsck became active under a writer"
                            );
                            aw.fetch_sub(1, Ordering::SeqCst);
                            w.release().await.unwrap();
                            counts.lock().unwrap().0 += 1;
                        }
                        Err(e) if e.is_store_locked() => {
                            counts.lock().unwrap().1 += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => panic!("writer {i}: {e}"),
                    }
                } else {
                    match s.acquire_fsck(&format!("fsck-{i}"), false).await {
                        Ok(f) => {
                            let begin = Instant::now();
                            assert_eq!(af.fetch_add(1, Ordering::SeqCst), 0, "two fsck at once");
                            fa.store(true, Ordering::SeqCst);
                            assert_eq!(
                                aw.load(Ordering::SeqCst),
                                0,
                                "fsck admitted with active writers"
                            );
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            assert_eq!(
                                aw.load(Ordering::SeqCst),
                                0,
                                "a writer became active under fsck"
                            );
                            fa.store(false, Ordering::SeqCst);
                            af.fetch_sub(1, Ordering::SeqCst);
                            runs.lock()
                                .unwrap()
                                .push((begin, Instant::now(), f.generation()));
                            f.release().await.unwrap();
                            counts.lock().unwrap().2 += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) if e.is_store_locked() => {
                            counts.lock().unwrap().3 += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => panic!("fsck {i}: {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (w_ok, w_refused, f_ok, f_refused) = *counts.lock().unwrap();
    eprintln!(
        "writers admitted {w_ok}, refused {w_refused}; fsck runs {f_ok}, refused {f_refused}"
    );
    assert!(w_ok > WRITES_WANTED, "writers made progress");
    assert!(f_ok >= FSCKS_WANTED, "fsck made progress");
    assert!(w_refused > 0, "writers met an fsck at least once");
    // Every writer admitted after an fsck finished saw at least its generation.
    let gens = generations.lock().unwrap();
    for (_, end, g) in fsck_runs.lock().unwrap().iter() {
        for (at, seen) in gens.iter().filter(|(at, _)| at > end) {
            assert!(
                seen >= g,
                "writer at {at:?} saw generation {seen} after fsck {g} ended"
            );
        }
    }
}
