//! Two holders of one key; the old one paused past its TTL: its late write
//! is refused and the new holder's stays.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{LeaseKey, Payload};
use lease_fence::Fences;
use lease_keeper::Keeper;

#[tokio::test]
async fn a_holder_paused_past_its_ttl_is_refused_at_the_resource() {
    let fake = Arc::new(lease_fake::Fake::new());
    let key = LeaseKey::new("fence/paused").expect("key");
    let fences = Fences::new();
    let mut written = Vec::new();

    let old = Keeper::new(fake.clone())
        .acquire(&key)
        .ttl(Duration::from_secs(10))
        .payload(Payload::empty())
        .await
        .expect("old holder");
    {
        let _turn = fences
            .admit("table", old.fence())
            .await
            .expect("old writes first");
        written.push(("old", old.fence()));
    }
    // The old holder freezes; its lease expires behind its back.
    assert!(fake.expire(&key), "the old grant was live");
    let new = Keeper::new(fake.clone())
        .acquire(&key)
        .ttl(Duration::from_secs(10))
        .await
        .expect("new holder");
    assert!(new.fence() > old.fence(), "a new grant has a higher fence");
    {
        let _turn = fences
            .admit("table", new.fence())
            .await
            .expect("new writes");
        written.push(("new", new.fence()));
    }
    // The old holder wakes and writes, unaware.
    let refused = fences
        .admit("table", old.fence())
        .await
        .expect_err("the paused holder's late write is refused");
    assert_eq!((refused.offered, refused.seen), (old.fence(), new.fence()));
    assert_eq!(written, [("old", old.fence()), ("new", new.fence())]);
    assert_eq!(fences.seen("table"), Some(new.fence()));
}
