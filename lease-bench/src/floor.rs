//! The floor under a NATS renewal's client CPU: the same client library's
//! bare conditional KV update (one JetStream publish expecting the key's
//! last sequence, what a renewal sends), paced as the group's renewals ran
//! — the group's rate, started in batches every 10 ms as the group starts
//! whatever is due within its coalescing window, each batch's updates in
//! flight together and polled by one task, as the group polls its
//! renewals — with no keeper and no lease record around it.
//!
//! A renewal cannot cost the client less than the request it sends. What
//! that request costs depends on the rate more than on the request: at a
//! few thousand a second each answer arrives on its own, and its read, the
//! connection task's wake-up and the waiting task's wake-up (often on the
//! other worker thread) are paid per message, where a saturated client
//! pays them once per batch.

use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use lease_nats::async_nats::jetstream::kv;
use serde::Serialize;

use crate::alloc;
use crate::sys;

/// How often the group starts the renewals due (its coalescing window).
const BATCH_EVERY: Duration = Duration::from_millis(10);

/// The paced bare updates and what they cost the client.
#[derive(Clone, Debug, Serialize)]
pub struct Floor {
    /// Updates started per second (the group's renewals per second).
    pub rate_per_s: f64,
    pub writes: usize,
    /// Updates the server refused or that failed.
    pub failed: usize,
    pub cpu_per_write_us: f64,
    pub allocations_per_write: f64,
}

/// Updates keys under `prefix` in `kv` at `rate_per_s` for `window`.
pub async fn nats(
    kv: &kv::Store,
    prefix: &str,
    rate_per_s: f64,
    window: Duration,
) -> Result<Floor, String> {
    if !(rate_per_s.is_finite() && rate_per_s > 0.0) {
        return Err(format!("no rate to pace at ({rate_per_s})"));
    }
    // One key per update a second: a key's previous update has long been
    // answered when it comes round again.
    let keys: Vec<String> = (0..(rate_per_s.ceil() as usize).clamp(64, 20_000))
        .map(|i| format!("{prefix}/floor-{i:05}"))
        .collect();
    let body = bytes::Bytes::from_static(&[b'x'; 96]);
    let mut revs: Vec<u64> = futures_util::stream::iter(&keys)
        .map(|k| kv.put(k.as_str(), body.clone()))
        .buffered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("create the floor's keys: {e}"))?;
    let mut busy = vec![false; keys.len()];
    let per_batch = rate_per_s * BATCH_EVERY.as_secs_f64();
    let mut due = 0.0;
    let mut next = 0usize;
    let (mut writes, mut failed) = (0usize, 0usize);
    let mut running = FuturesUnordered::new();
    let mut batch = tokio::time::interval(BATCH_EVERY);
    batch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (cpu0, calls0) = (sys::cpu_self(), alloc::calls());
    let end = Instant::now() + window;
    loop {
        tokio::select! {
            biased;
            Some((i, r)) = running.next(), if !running.is_empty() => {
                busy[i] = false;
                match r {
                    Ok(rev) => revs[i] = rev,
                    Err(_) => failed += 1,
                }
            }
            _ = batch.tick(), if Instant::now() < end => {
                due += per_batch;
                while due >= 1.0 {
                    due -= 1.0;
                    let i = next;
                    next = (next + 1) % keys.len();
                    if busy[i] {
                        continue;
                    }
                    busy[i] = true;
                    writes += 1;
                    let (key, body, rev) = (&keys[i], body.clone(), revs[i]);
                    running.push(async move { (i, kv.update(key.as_str(), body, rev).await) });
                }
            }
            else => break,
        }
    }
    let (cpu, calls) = (
        sys::cpu_self().saturating_sub(cpu0),
        alloc::calls().saturating_sub(calls0),
    );
    let per = |x: f64| x / writes.max(1) as f64;
    Ok(Floor {
        rate_per_s,
        writes,
        failed,
        cpu_per_write_us: per(cpu.as_secs_f64() * 1e6),
        allocations_per_write: per(calls as f64),
    })
}
