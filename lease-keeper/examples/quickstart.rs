//! Three workers share one key on the in-memory fake, through keepers.
//!
//! Alice's lease renews itself while she works; Bob waits for the key and is
//! woken the moment she releases it; Bob then stalls past his TTL, Carol
//! takes over with a higher fence, Bob's keeper reports the loss, and when
//! Bob writes anyway the storage rejects him by fence. Last, a `LeaseGroup`
//! keeps several shards at once and releases them on exit.
//!
//! Run it with `cargo run -p lease-keeper --example quickstart`.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Fence, HolderId, LeaseKey};
use lease_fake::Fake;
use lease_fence::Fences;
use lease_keeper::Keeper;

/// A resource protected by fencing: `lease_fence::Fences` remembers the
/// highest fence it has accepted and refuses writes that carry a lower one.
#[derive(Default)]
struct FencedStorage {
    fences: Fences,
}

impl FencedStorage {
    async fn write(&self, fence: Fence, what: &str) -> Result<(), String> {
        // The turn is held while the write is done: no other write slips in.
        let _turn = self
            .fences
            .admit("storage", fence)
            .await
            .map_err(|stale| format!("rejected {what:?}: {stale}"))?;
        println!("storage: accepted {what:?} with fence {fence}");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fake = Fake::new(); // or an etcd, NATS, S3, MongoDB or PostgreSQL client
    let backend = Arc::new(fake.clone());
    let storage = FencedStorage::default();
    let key = LeaseKey::new("jobs/compactor")?;
    let ttl = Duration::from_millis(600);
    let alice = Keeper::new(backend.clone()).with_holder(HolderId::new("alice")?);
    let bob = Keeper::new(backend.clone()).with_holder(HolderId::new("bob")?);
    let carol = Keeper::new(backend.clone()).with_holder(HolderId::new("carol")?);

    // Alice takes the key; her lease renews itself every TTL/3 in the background.
    let a = alice.try_acquire(&key).ttl(ttl).await?;
    println!("alice: acquired {} with fence {}", a.key(), a.fence());
    storage.write(a.fence(), "alice: batch 1").await?;

    // Bob waits for the key (woken by the backend's watch, or polling).
    let waiter = {
        let (bob, key) = (bob.clone(), key.clone());
        tokio::spawn(async move {
            println!("bob: waiting for {key}…");
            bob.acquire(&key)
                .ttl(ttl)
                .wait(Duration::from_secs(10))
                .await
        })
    };

    while a.renewals() < 3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "alice: kept through {} renewals, may_write() = {}",
        a.renewals(),
        a.may_write()
    );
    storage.write(a.fence(), "alice: batch 2").await?;
    a.release().await?;
    println!("alice: released");

    let b = waiter.await??;
    println!("bob: acquired with fence {}", b.fence());
    storage.write(b.fence(), "bob: batch 1").await?;

    // Bob stalls past his TTL: the backend expires his grant (the fake does
    // it on request) and Carol takes the key with a higher fence.
    fake.expire(&key);
    let c = carol.try_acquire(&key).ttl(ttl).await?;
    println!("carol: acquired with fence {}", c.fence());
    storage.write(c.fence(), "carol: batch 1").await?;

    // Bob's next renewal is refused: his keeper says why, and may_write() is false…
    let reason = b.lost().await;
    println!(
        "bob: lost the lease: {reason}; may_write() = {}",
        b.may_write()
    );
    // …and if he writes anyway, the fence stops him.
    if let Err(e) = storage.write(b.fence(), "bob: stale batch").await {
        println!("storage: {e}");
    }
    c.release().await?;
    println!("carol: released");

    // A group keeps many leases on one schedule; losing one gives up all.
    let group = carol.group();
    for shard in 0..3 {
        let key = LeaseKey::new(format!("shards/{shard}"))?;
        let _in_the_group = group.try_acquire(&key).ttl(ttl).await?;
    }
    let kept = group
        .scope(async {
            tokio::time::sleep(ttl * 2).await;
            group.leases().iter().all(|l| l.may_write())
        })
        .await?;
    println!("carol: kept 3 shards for two TTLs: {kept}; all released on exit");
    Ok(())
}
