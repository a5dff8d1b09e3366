//! A three-node JetStream cluster on loopback with an R3 bucket: the stream
//! leader is killed while leases are held and contended. No two holders'
//! write windows may overlap, and fences must keep rising.

use crate::common::{self, WriteWindow};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{Acquire, AcquireRequest, HolderId, LeaseBackend, LeaseKey, Renewal};
use lease_nats::{NatsBackend, NatsConfig};

const TTL: Duration = Duration::from_secs(2);
const KEYS: usize = 2;
const WORKERS: usize = 4;
const RUN: Duration = Duration::from_secs(24);
const KILL_AT: Duration = Duration::from_secs(5);

fn config() -> NatsConfig {
    NatsConfig::new("cluster")
        .replicas(3)
        .marker_ttl(Duration::from_secs(1))
        .request_timeout(Duration::from_secs(2))
        .create_bucket(true)
}

async fn connect_when_ready(urls: &str) -> NatsBackend {
    let start = Instant::now();
    loop {
        match NatsBackend::connect(urls, config()).await {
            Ok(b) => return b,
            Err(e) if start.elapsed() < Duration::from_secs(60) => {
                eprintln!("cluster not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("the cluster never served the R3 bucket: {e}"),
        }
    }
}

/// What every worker shares with the test.
#[derive(Clone)]
struct Shared {
    keys: Arc<Vec<LeaseKey>>,
    log: Arc<Mutex<Vec<WriteWindow>>>,
    errors: Arc<Mutex<u32>>,
    /// Leases held right now.
    held: Arc<AtomicUsize>,
    t0: Instant,
    until: Instant,
}

async fn worker(b: NatsBackend, w: usize, s: Shared) {
    let Shared {
        keys,
        log,
        errors,
        held,
        t0,
        until,
    } = s;
    let mut n = 0usize;
    while Instant::now() < until {
        n += 1;
        let k = (w + n) % KEYS;
        let key = &keys[k];
        let holder = HolderId::random();
        let req = AcquireRequest::new(key.clone(), holder.clone()).ttl(TTL);
        // Retry with the same holder while the outcome is unknown: a grant
        // whose answer was lost comes back as the same grant.
        let mut got = None;
        for _ in 0..5 {
            match b.try_acquire(req.clone()).await {
                Ok(a) => {
                    got = Some(a);
                    break;
                }
                Err(e) => {
                    *errors.lock().unwrap() += 1;
                    eprintln!("{:>6.2?} worker {w}: acquire: {e}", t0.elapsed());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let mut g = match got {
            Some(Acquire::Granted(g)) => g,
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let start = Instant::now();
        let mut end = g.deadline();
        held.fetch_add(1, Ordering::SeqCst);
        // Hold for a few renewals, then release or abandon.
        let rounds = n % 4;
        let mut lost = false;
        for _ in 0..rounds {
            tokio::time::sleep(g.timing().renew_interval(TTL)).await;
            match b.renew(&g, None).await {
                Ok(Renewal::Renewed(g2)) => {
                    g = g2;
                    end = g.deadline();
                }
                Ok(Renewal::Lost) => {
                    eprintln!(
                        "{:>6.2?} worker {w}: lost fence {} on key {k}",
                        t0.elapsed(),
                        g.fence()
                    );
                    lost = true;
                    break;
                }
                Err(e) => {
                    // Unknown: act as lost from the last known deadline on.
                    *errors.lock().unwrap() += 1;
                    eprintln!("{:>6.2?} worker {w}: renew: {e}", t0.elapsed());
                    lost = true;
                    break;
                }
            }
        }
        if !lost && n.is_multiple_of(2) {
            let released = Instant::now();
            end = end.min(released);
            if let Err(e) = b.release(&g).await {
                *errors.lock().unwrap() += 1;
                eprintln!("{:>6.2?} worker {w}: release: {e}", t0.elapsed());
            }
        }
        held.fetch_sub(1, Ordering::SeqCst);
        log.lock().unwrap().push(WriteWindow {
            key: k.to_string(),
            fence: g.fence(),
            holder: holder.to_string(),
            start,
            end,
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_stream_leader_keeps_leases_exclusive() {
    let dir = common::temp_dir("cluster").unwrap();
    let mut servers = common::Server::cluster3(&dir).unwrap();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let admin = connect_when_ready(&urls.join(",")).await;

    let keys: Arc<Vec<LeaseKey>> = Arc::new(
        (0..KEYS)
            .map(|k| LeaseKey::new(format!("cl/{}/{k}", HolderId::random())).unwrap())
            .collect(),
    );
    let log = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(0u32));
    let held = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let until = t0 + RUN;
    let shared = Shared {
        keys: keys.clone(),
        log: log.clone(),
        errors: errors.clone(),
        held: held.clone(),
        t0,
        until,
    };
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        // Each worker starts on a different node and knows all three.
        let mut mine = urls.clone();
        mine.rotate_left(w % 3);
        let b = NatsBackend::connect(&mine.join(","), config())
            .await
            .unwrap();
        tasks.push(tokio::spawn(worker(b, w, shared.clone())));
    }

    tokio::time::sleep(KILL_AT).await;
    // Kill while somebody holds a lease (and is renewing it).
    while held.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held_at_kill = held.load(Ordering::SeqCst);
    let js = async_nats::jetstream::new(admin.client().clone());
    let info = js
        .get_stream("KV_cluster")
        .await
        .expect("stream info")
        .cached_info()
        .clone();
    let leader = info
        .cluster
        .and_then(|c| c.leader)
        .expect("the R3 stream has a leader");
    let killed_at = Instant::now();
    let victim = servers
        .iter_mut()
        .find(|s| s.name == leader)
        .expect("leader is one of ours");
    victim.kill();
    eprintln!(
        "killed stream leader {leader} at {:?} with {held_at_kill} lease(s) held",
        killed_at - t0
    );

    for t in tasks {
        t.await.unwrap();
    }
    let windows = log.lock().unwrap().clone();
    let errors = *errors.lock().unwrap();

    let after_kill = windows.iter().filter(|w| w.start > killed_at).count();
    eprintln!(
        "{} grants ({after_kill} after the kill), {errors} unknown outcomes",
        windows.len()
    );
    if let Some(first) = windows
        .iter()
        .map(|w| w.start)
        .filter(|s| *s > killed_at)
        .min()
    {
        eprintln!("first grant {:?} after the kill", first - killed_at);
    }
    assert!(after_kill >= 2, "no progress after the leader was killed");

    // A later fence must also be a later grant in real time, starting only
    // after the earlier holder stopped writing.
    if let Err(e) = common::check_write_windows(&windows) {
        panic!("{e}");
    }
    drop(servers);
    let _ = std::fs::remove_dir_all(&dir);
}
