//! Leader election: run three of these side by side on one backend and they
//! take turns leading.
//!
//! ```text
//! cargo run -p lease --example election --features etcd -- etcd://127.0.0.1:2379/demo alice
//! ```
//!
//! Arguments: the backend URL (default `memory://`, which only this process
//! sees), a name (default `candidate-<pid>`) and how many terms to lead
//! before exiting (default 3).
//!
//! Each process observes the election (printing every change of leader,
//! including "no leader"), campaigns, and when elected does a little work
//! bound to its leadership (`Leadership::run` drops it at the write
//! deadline or on loss), resigns, which hands over to a waiting candidate at
//! once, then waits a moment and campaigns again.

use std::time::Duration;

use lease::{HolderId, LeaseKey, Payload, WorkEnded};

/// The election's key.
const KEY: &str = "demo/leader";
/// The leadership TTL: a leader that dies is replaced this long after its
/// last renewal.
const TTL: Duration = Duration::from_secs(5);
/// One step of the leader's work.
const STEP: Duration = Duration::from_millis(500);
/// Steps per term.
const STEPS: u32 = 4;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "memory://".to_owned());
    let name = args
        .next()
        .unwrap_or_else(|| format!("candidate-{}", std::process::id()));
    let terms: u32 = match args.next() {
        Some(n) => n.parse()?,
        None => 3,
    };

    let connection = lease::connect(&url).await?;
    // One holder id per candidate process: the name and the process id.
    let holder = HolderId::new(format!("{name}-{}", std::process::id()))?;
    let keeper = connection.keeper().with_holder(holder).with_ttl(TTL);
    let election = keeper.election(&LeaseKey::new(KEY)?);

    // Anyone may observe, candidate or not: every change of leader, in order.
    let mut observer = election.observe();
    let who = name.clone();
    let observing = tokio::spawn(async move {
        loop {
            match observer.changed().await {
                Some(leader) => println!(
                    "{who}: sees leader {} (fence {}, value {:?})",
                    leader.holder,
                    leader.fence,
                    String::from_utf8_lossy(leader.value.as_bytes())
                ),
                None => println!("{who}: sees no leader"),
            }
        }
    });

    for term in 1..=terms {
        println!("{name}: campaigning for {KEY} (term {term} of {terms})");
        let value = Payload::new(format!("{name}, term {term}"))?;
        let leadership = election.campaign(value).await?;
        let fence = leadership.fence();
        println!("{name}: LEADER with fence {fence}");
        let work = async {
            for step in 1..=STEPS {
                // Stamp every write to the shared resource with the fence.
                println!("{name}: working, step {step} of {STEPS}, fence {fence}");
                tokio::time::sleep(STEP).await;
            }
        };
        match leadership.run(work).await {
            WorkEnded::Finished(()) => println!("{name}: work done, resigning"),
            ended => println!("{name}: work cut short ({ended:?}), resigning"),
        }
        leadership.resign().await?;
        println!("{name}: resigned");
        // A moment for a waiting candidate to take its turn.
        tokio::time::sleep(STEP).await;
    }

    observing.abort();
    connection.shutdown().await;
    Ok(())
}
