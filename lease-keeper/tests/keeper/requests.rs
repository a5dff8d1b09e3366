//! Each operation costs the requests it should, and no more.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::{key, Rec};
use lease_fake::Fake;
use lease_keeper::Keeper;

#[tokio::test(start_paused = true)]
async fn each_operation_costs_its_minimum_of_requests() {
    let fake = Fake::new();
    let rec = Rec::new(fake.clone());
    let keeper = Keeper::new(rec.clone());
    let k = key("obs/counts");
    let ttl = Duration::from_secs(3);
    let count = |rec: &Rec| {
        [
            rec.acquires.load(Ordering::SeqCst),
            rec.renew_count.load(Ordering::SeqCst),
            rec.reads.load(Ordering::SeqCst),
            rec.releases.load(Ordering::SeqCst),
            rec.waits.load(Ordering::SeqCst),
        ]
    };
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    assert_eq!(count(&rec), [1, 0, 0, 0, 0], "acquire: one request");
    tokio::time::sleep(ttl * 10).await;
    let [a, renews, reads, rel, waits] = count(&rec);
    // TTL/3 ± 10%: 27 to 33 renewals in 10 TTLs, nothing else.
    assert!((27..=33).contains(&renews), "{renews} renewals in 10 TTLs");
    assert_eq!(
        [a, reads, rel, waits],
        [1, 0, 0, 0],
        "keeping costs renewals only"
    );
    lease.release().await.unwrap();
    assert_eq!(count(&rec)[3], 1, "release: one request");

    // A loss costs the refused renewal and one read to say why.
    let before = count(&rec);
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    fake.expire(&k);
    lease.lost().await;
    let after = count(&rec);
    assert_eq!([after[1] - before[1], after[2] - before[2]], [1, 1]);
}
