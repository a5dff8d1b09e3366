//! What an election observer keeps while nobody takes its changes: a
//! bounded queue, the oldest changes dropped and counted as skipped.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{key, ms};
use lease_core::{LeaseBackend, Payload};
use lease_fake::Fake;
use lease_keeper::{Keeper, Observer};
use tokio::time::{sleep, timeout};

/// The number of changes queued in `observer`, as its `Debug` shows it.
fn queued(observer: &Observer) -> usize {
    let shown = format!("{observer:?}");
    let n = shown
        .split("queued: ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    n.unwrap_or_else(|| panic!("no queue length in {shown}"))
}

#[tokio::test(start_paused = true)]
async fn an_observer_read_only_through_watch_keeps_a_bounded_queue() {
    let backend: Arc<dyn LeaseBackend> = Arc::new(Fake::new());
    let election = Keeper::new(backend)
        .with_ttl(Duration::from_secs(3))
        .election(&key("elect/bounded-queue"))
        .with_poll_interval(ms(100));
    let mut observer = election.observe();
    let latest = observer.watch();
    let lead = election
        .campaign(Payload::new(vec![0u8; 1024]).unwrap())
        .await
        .unwrap();
    const PROCLAIMS: usize = 300;
    for i in 0..PROCLAIMS {
        let mut v = vec![0u8; 1024];
        v[..8].copy_from_slice(&(i as u64).to_be_bytes());
        lead.proclaim(Payload::new(v).unwrap()).await.unwrap();
        // Long enough for the observer to read each value.
        sleep(ms(150)).await;
    }
    let last = latest.borrow().clone().expect("a leader");
    assert_eq!(
        &last.value.as_bytes()[..8],
        &((PROCLAIMS - 1) as u64).to_be_bytes()
    );
    let n = queued(&observer);
    assert!(
        n <= Observer::QUEUE,
        "{n} changes queued after {PROCLAIMS} proclaims nobody took"
    );
    // A late caller of `changed` goes on from the oldest change still
    // queued, in order, up to the latest, and is told how many it skipped.
    let mut seen = Vec::new();
    while let Ok(change) = timeout(ms(10), observer.changed()).await {
        seen.push(change.expect("a leader"));
    }
    assert_eq!(seen.last(), Some(&last));
    assert!(seen.len() <= Observer::QUEUE, "{} changes", seen.len());
    assert!(
        observer.skipped() as usize + seen.len() >= PROCLAIMS,
        "skipped {} and saw {} of {PROCLAIMS} changes",
        observer.skipped(),
        seen.len()
    );
    drop(lead);
}
