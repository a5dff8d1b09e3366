//! Many leases kept alive by one process: acquire N keys, renew every one of
//! them for a few rounds, and report wall time and the CPU both this process
//! and the (private) etcd spent. N is 2,000 by default;
//! `LEASE_ETCD_SCALE_N=10000` runs the goal's size, and
//! `LEASE_ETCD_SCALE_SESSIONS=1` keeps the keys in one session.
//! The client CPU is this process's: run the test alone (filter `scale::`)
//! for a figure that other tests running beside it do not inflate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{AcquireRequest, Grant, HolderId, LeaseBackend, LeaseKey, Renewal};
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_testkit::servers;
use tokio::sync::Semaphore;

/// CPU time (user + system) of process `pid` so far, from `/proc`.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start at ')'.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // Linux reports in USER_HZ, 100 on every platform Rust targets here.
    Duration::from_millis(ticks * 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_leases_renewed_by_one_process() {
    let n: usize = std::env::var("LEASE_ETCD_SCALE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let sessions = std::env::var("LEASE_ETCD_SCALE_SESSIONS").is_ok_and(|v| v == "1");
    let server = servers::spawn_etcd(None).expect("private etcd");
    let etcd_pid = server.pid().expect("etcd pid");
    let b = EtcdBackend::connect(
        EtcdConfig::new(server.endpoints.clone())
            .key_prefix("scale/")
            .request_timeout(Duration::from_secs(20))
            .sessions(sessions),
    )
    .await
    .unwrap();
    let me = std::process::id();
    let holder = HolderId::random();
    let limit = Arc::new(Semaphore::new(256));

    let (c0, e0, t0) = (cpu(me), cpu(etcd_pid), Instant::now());
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (b, holder, limit) = (b.clone(), holder.clone(), limit.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = limit.acquire().await.unwrap();
            let key = LeaseKey::new(format!("k/{i}")).unwrap();
            b.try_acquire(AcquireRequest::new(key, holder).ttl(Duration::from_secs(60)))
                .await
                .unwrap()
                .granted()
                .unwrap()
        }));
    }
    let mut grants: Vec<Grant> = Vec::with_capacity(n);
    for t in tasks {
        grants.push(t.await.unwrap());
    }
    let acquired = (t0.elapsed(), cpu(me) - c0, cpu(etcd_pid) - e0);

    const ROUNDS: usize = 3;
    let (c0, e0, t0) = (cpu(me), cpu(etcd_pid), Instant::now());
    for round in 0..ROUNDS {
        let (rc, rt) = (cpu(me), Instant::now());
        let mut tasks = Vec::with_capacity(n);
        for g in grants.drain(..) {
            let (b, limit) = (b.clone(), limit.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = limit.acquire().await.unwrap();
                match b.renew(&g, None).await.unwrap() {
                    Renewal::Renewed(g) => g,
                    Renewal::Lost => panic!("lost {}", g.key()),
                }
            }));
        }
        for t in tasks {
            grants.push(t.await.unwrap());
        }
        eprintln!(
            "scale: renew round {round}: {:?}, client CPU {:?}, {} keep-alive streams open",
            rt.elapsed(),
            cpu(me) - rc,
            b.open_keep_alive_streams()
        );
    }
    let renewed = (t0.elapsed(), cpu(me) - c0, cpu(etcd_pid) - e0);
    let per = |d: Duration, k: usize| d / (k as u32).max(1);
    eprintln!(
        "scale, {n} leases (sessions {sessions}): acquire all {:?} (client CPU {:?}, etcd CPU {:?}); \
         {ROUNDS} renew rounds {:?} (client CPU {:?} = {:?}/renew, etcd CPU {:?} = {:?}/renew); \
         keeping {n} leases alive at TTL 10 s (renew every 3.3 s) costs about {:.1}% of a core here + {:.1}% in etcd",
        acquired.0,
        acquired.1,
        acquired.2,
        renewed.0,
        renewed.1,
        per(renewed.1, n * ROUNDS),
        renewed.2,
        per(renewed.2, n * ROUNDS),
        100.0 * renewed.1.as_secs_f64() / ROUNDS as f64 / 3.33,
        100.0 * renewed.2.as_secs_f64() / ROUNDS as f64 / 3.33,
    );
    for g in &grants {
        b.release(g).await.unwrap();
    }
}
