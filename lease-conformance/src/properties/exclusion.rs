//! Contract point 1: mutual exclusion.

use std::sync::Arc;

use lease_core::{Acquire, HolderId};
use tokio::sync::Barrier;

use super::{clients, key, long_ttl, req, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// How many acquirers race in [`exactly_one_winner`].
pub const RACERS: usize = 16;

/// Of 16 clients racing to acquire one free key, exactly one is granted; every
/// other is refused and told who won, with the winner's fence.
pub fn exactly_one_winner(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("race");
        let cs = clients(h, RACERS).await?;
        let ttl = long_ttl(&cs[0].capabilities());
        let barrier = Arc::new(Barrier::new(RACERS));
        let mut tasks = Vec::new();
        for c in cs {
            let (barrier, key) = (barrier.clone(), key.clone());
            let holder = HolderId::random();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let r = c.try_acquire(req(&key, &holder, ttl)).await;
                (holder, r)
            }));
        }
        let mut winners = Vec::new();
        let mut refusals = Vec::new();
        for t in tasks {
            let (holder, r) = t
                .await
                .map_err(|e| Failure(format!("acquirer task failed: {e}")))?;
            match r? {
                Acquire::Granted(g) => winners.push((holder, g)),
                Acquire::Held(held) => refusals.push(held),
            }
        }
        ensure!(
            winners.len() == 1,
            "{} of {RACERS} concurrent acquirers were granted {key} (fences {:?}); exactly one must win",
            winners.len(),
            winners.iter().map(|(_, g)| g.fence()).collect::<Vec<_>>()
        );
        let (winner, grant) = &winners[0];
        ensure!(
            grant.holder() == winner,
            "the grant names {} instead of its acquirer {winner}",
            grant.holder()
        );
        for held in refusals {
            ensure!(
                &held.holder == winner && held.fence == grant.fence(),
                "a refused acquirer was told {} holds fence {}, but {winner} won with fence {}",
                held.holder,
                held.fence,
                grant.fence()
            );
        }
        Ok(Outcome::Passed)
    })
}

/// A refused acquire reports the live holder, its fence and its payload, and
/// a read agrees.
pub fn refused_acquire_names_the_holder(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("refused");
        let cs = clients(h, 2).await?;
        let ttl = long_ttl(&cs[0].capabilities());
        let (a, b) = (HolderId::random(), HolderId::random());
        let p = super::payload("holder-a");
        let g =
            super::grant_req(&*cs[0], req(&key, &a, ttl).payload(p.clone()), "free key").await?;
        match cs[1].try_acquire(req(&key, &b, ttl)).await? {
            Acquire::Granted(g2) => {
                return Err(Failure(format!(
                    "{key} was granted to a second holder (fences {} and {})",
                    g.fence(),
                    g2.fence()
                )))
            }
            Acquire::Held(held) => {
                ensure!(
                    held.holder == a,
                    "refusal names {} instead of holder {a}",
                    held.holder
                );
                ensure!(
                    held.fence == g.fence(),
                    "refusal reports fence {} instead of {}",
                    held.fence,
                    g.fence()
                );
                ensure!(
                    held.payload == p,
                    "refusal reports payload {:?} instead of {:?}",
                    held.payload,
                    p
                );
            }
        }
        let seen = cs[1].read(&key).await?;
        let held = seen
            .holding()
            .ok_or_else(|| Failure(format!("read of held {key} says free")))?;
        ensure!(
            held.holder == a && held.fence == g.fence(),
            "read reports {} / {} instead of {a} / {}",
            held.holder,
            held.fence,
            g.fence()
        );
        cs[0].release(&g).await?;
        Ok(Outcome::Passed)
    })
}
