//! Failover: from a holder's release to a waiting acquirer's grant, and
//! from a holder's silent death (it stops renewing, never releases) to the
//! next grant — TTL plus detection. The waiter is a `lease-keeper`
//! `Keeper::acquire` on its own client: woken by the backend's watch where
//! it has one, polling (50 ms doubling to 500 ms, ±20%) otherwise.

use std::time::{Duration, Instant};

use lease_core::{AcquireRequest, HolderId, LeaseBackend, LeaseKey};
use lease_keeper::Keeper;
use serde::Serialize;

use crate::stats::{self, Latency};
use crate::targets::Target;

#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    pub backend: &'static str,
    pub watch: bool,
    /// From the instant the holder sends its release to the waiter's grant.
    pub release_to_grant: Latency,
    pub death_ttl_s: f64,
    /// From the holder's last answer (its acquire) to the waiter's grant.
    pub death_to_grant: Latency,
    /// `death_to_grant` minus the TTL.
    pub detection: Latency,
}

pub async fn measure(
    t: &Target,
    run: &str,
    releases: usize,
    deaths: usize,
    death_ttl: Duration,
) -> Result<Failover, String> {
    let name = t.name();
    let holder_client = t.connect(None, &format!("{run}/fo")).await?;
    let waiter_client = t.connect(None, &format!("{run}/fo")).await?;
    let holder = holder_client.backend.clone();
    let watch = holder.capabilities().watch;
    let keeper = Keeper::new(waiter_client.backend.clone());
    let me = HolderId::random();
    let mut rel = Vec::new();
    for i in 0..releases {
        let key = LeaseKey::new(format!("{run}/fo/release-{i}")).map_err(|e| e.to_string())?;
        let g = holder
            .try_acquire(AcquireRequest::new(key.clone(), me.clone()).ttl(Duration::from_secs(30)))
            .await
            .map_err(|e| format!("{name}: holder acquire: {e}"))?
            .granted()
            .ok_or_else(|| format!("{name}: {key} held"))?;
        let k = keeper.clone();
        let kk = key.clone();
        let waiter = tokio::spawn(async move {
            let r = k
                .acquire(&kk)
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(20))
                .await;
            (Instant::now(), r)
        });
        // Let the waiter settle into its wait; spread the release over the
        // poll phase of polling backends.
        tokio::time::sleep(Duration::from_millis(300 + (i as u64 * 211) % 700)).await;
        let t0 = Instant::now();
        holder
            .release(&g)
            .await
            .map_err(|e| format!("{name}: release: {e}"))?;
        let (t1, r) = waiter.await.map_err(|e| e.to_string())?;
        let lease = r.map_err(|e| format!("{name}: waiter after release: {e}"))?;
        rel.push(t1 - t0);
        let _ = lease.release().await;
    }
    let mut death = Vec::new();
    let mut detect = Vec::new();
    for i in 0..deaths {
        let key = LeaseKey::new(format!("{run}/fo/death-{i}")).map_err(|e| e.to_string())?;
        let g = holder
            .try_acquire(AcquireRequest::new(key.clone(), HolderId::random()).ttl(death_ttl))
            .await
            .map_err(|e| format!("{name}: holder acquire: {e}"))?
            .granted()
            .ok_or_else(|| format!("{name}: {key} held"))?;
        // The holder goes silent now: no renewal, no release.
        let t0 = Instant::now();
        let ttl = g.ttl();
        let r = keeper
            .acquire(&key)
            .ttl(Duration::from_secs(30))
            .wait(ttl * 5 + Duration::from_secs(10))
            .await;
        let el = t0.elapsed();
        let lease = r.map_err(|e| format!("{name}: waiter after silent death: {e}"))?;
        death.push(el);
        detect.push(el.saturating_sub(ttl));
        let _ = lease.release().await;
    }
    Ok(Failover {
        backend: name,
        watch,
        release_to_grant: stats::latency(&rel),
        death_ttl_s: death_ttl.as_secs_f64(),
        death_to_grant: stats::latency(&death),
        detection: stats::latency(&detect),
    })
}
