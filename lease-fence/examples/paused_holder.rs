//! The story fencing exists for, on the in-memory rule: a holder paused past
//! its lease wakes up and writes; the resource refuses it.
//!
//! Run it with `cargo run -p lease-fence --example paused_holder`.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{HolderId, LeaseKey};
use lease_fence::Fences;
use lease_keeper::Keeper;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = Arc::new(lease_fake::Fake::new()); // or etcd, NATS, S3, MongoDB, PostgreSQL
    let key = LeaseKey::new("reports/daily")?;
    let resource = Fences::new(); // lives with the data, not with the writers
    let ttl = Duration::from_secs(10);

    let a = Keeper::new(backend.clone()).with_holder(HolderId::new("a")?);
    let b = Keeper::new(backend.clone()).with_holder(HolderId::new("b")?);

    let old = a.acquire(&key).ttl(ttl).await?;
    println!("a: holds {key} with fence {}", old.fence());
    println!(
        "a: checks may_write() = {}, prepares its write… and is paused (a GC, a frozen VM)",
        old.may_write()
    );

    // While a is paused its lease expires, and b is granted the key.
    backend.expire(&key);
    let new = b.acquire(&key).ttl(ttl).await?;
    println!(
        "b: holds {key} with fence {} (a's lease expired while it was paused)",
        new.fence()
    );
    drop(resource.admit("reports/daily", new.fence()).await?);
    println!("resource: accepted b's write at fence {}", new.fence());

    // a wakes up, unaware, and writes what it prepared before the pause.
    match resource.admit("reports/daily", old.fence()).await {
        Ok(_) => println!("resource: accepted a's late write — two writers!"),
        Err(stale) => println!("resource: refused a's late write: {stale}"),
    }
    Ok(())
}
