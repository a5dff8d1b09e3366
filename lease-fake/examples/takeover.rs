//! Two workers contend for one key on the in-memory fake.
//!
//! The loser waits; the winner is paused (think: a long GC pause) past its
//! deadline; the other takes over with a higher fence; and when the stale
//! winner wakes up and writes anyway, the storage rejects it by fence.
//!
//! Run it with `cargo run -p lease-fake --example takeover`.

use std::sync::Mutex;
use std::time::Duration;

use lease_core::{Acquire, AcquireRequest, Fence, HolderId, LeaseBackend, LeaseKey, Renewal};
use lease_fake::Fake;

/// A resource protected by fencing: it remembers the highest fence it has
/// seen and refuses writes that carry a lower one.
#[derive(Default)]
struct FencedStorage {
    highest: Mutex<Option<Fence>>,
}

impl FencedStorage {
    fn write(&self, fence: Fence, what: &str) -> Result<(), String> {
        let mut highest = self.highest.lock().map_err(|_| "storage lock poisoned")?;
        if matches!(*highest, Some(h) if fence < h) {
            return Err(format!(
                "rejected {what:?}: fence {fence} is below {}",
                highest.map_or(0, |h| h.get())
            ));
        }
        *highest = Some(fence);
        println!("storage: accepted {what:?} with fence {fence}");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fake = Fake::new();
    let storage = FencedStorage::default();
    let key = LeaseKey::new("jobs/compactor")?;
    let ttl = Duration::from_millis(300);
    let (alice, bob) = (HolderId::new("alice")?, HolderId::new("bob")?);

    // Alice wins the key and writes with her fence.
    let a = match fake
        .try_acquire(AcquireRequest::new(key.clone(), alice.clone()).ttl(ttl))
        .await?
    {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => return Err(format!("unexpected holder {}", h.holder).into()),
    };
    println!(
        "alice: granted with fence {}, may write for {:?}",
        a.fence(),
        a.deadline() - a.sent_at()
    );
    storage.write(a.fence(), "alice: first batch")?;

    // Bob loses and waits for the key to change (the fake has a watch).
    let waiter = {
        let (fake, key, bob) = (fake.clone(), key.clone(), bob.clone());
        tokio::spawn(async move {
            let req = AcquireRequest::new(key.clone(), bob).ttl(ttl);
            loop {
                match fake.try_acquire(req.clone()).await? {
                    Acquire::Granted(g) => return Ok::<_, lease_core::Error>(g),
                    Acquire::Held(h) => {
                        println!("bob: {} holds fence {}; waiting", h.holder, h.fence);
                        // Re-check after every wake-up: a wake-up is a hint, not a grant.
                        fake.wait_for_change(&key, &lease_core::LeaseState::Held(h))
                            .await?;
                    }
                }
            }
        })
    };

    // Alice stalls past her deadline. On the fake, backend time moves when we
    // say so: keep it in step with the real pause.
    println!("alice: paused…");
    tokio::time::sleep(ttl).await;
    fake.advance(ttl);

    let b = waiter.await??;
    println!(
        "bob: granted with fence {} (alice had {})",
        b.fence(),
        a.fence()
    );
    storage.write(b.fence(), "bob: takes over")?;

    // Alice wakes up. A careful holder checks may_write() first…
    println!("alice: awake; may_write() = {}", a.may_write());
    // …and a careless one that writes anyway is stopped by the fence.
    if let Err(e) = storage.write(a.fence(), "alice: stale second batch") {
        println!("storage: {e}");
    }
    match fake.renew(&a, None).await? {
        Renewal::Lost => println!("alice: renew says Lost — she stops for good"),
        Renewal::Renewed(_) => return Err("a taken-over lease was renewed".into()),
    }
    fake.release(&b).await?;
    println!("bob: released");
    Ok(())
}
