//! A three-member etcd cluster on loopback loses its leader while leases are
//! held and contenders wait: no two holders' write windows overlap, fences
//! keep increasing, and a holder whose keep-alives cannot reach a quorum sees
//! its deadline pass and `may_write()` turn false.

use crate::common::{self, WriteWindow};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::Client;
use lease_core::{
    Acquire, AcquireRequest, Fence, Grant, HolderId, LeaseBackend, LeaseKey, LeaseState, Renewal,
};
use lease_etcd::{EtcdBackend, EtcdConfig};

const TTL: Duration = Duration::from_secs(2);
const RUN_FOR: Duration = Duration::from_secs(9);
const KILL_AT: Duration = Duration::from_millis(2500);
const POLL: Duration = Duration::from_millis(100);

/// What one actor did, for the checks and the report.
#[derive(Default)]
struct Log {
    windows: HashMap<(String, Fence), WriteWindow>,
    renew_ok: HashMap<String, Vec<Instant>>,
    renew_err: HashMap<String, usize>,
    acquire_err: HashMap<String, usize>,
    watch_wakes: HashMap<String, usize>,
    last_grant: HashMap<String, Grant>,
}

impl Log {
    fn granted(&mut self, g: &Grant, answered: Instant) {
        let k = (g.key().to_string(), g.fence());
        let w = self.windows.entry(k).or_insert_with(|| WriteWindow {
            key: g.key().to_string(),
            holder: g.holder().to_string(),
            fence: g.fence(),
            start: answered,
            end: g.deadline(),
        });
        w.end = w.end.max(g.deadline());
        self.last_grant.insert(g.holder().to_string(), g.clone());
    }
}

/// The leader's client URL, asking each member.
async fn leader(urls: &[String]) -> Option<String> {
    for url in urls {
        let Ok(mut c) = Client::connect([url.as_str()], None).await else {
            continue;
        };
        let Ok(st) = c.status().await else {
            continue;
        };
        if let Some(h) = st.header() {
            if st.leader() != 0 && st.leader() == h.member_id() {
                return Some(url.clone());
            }
        }
    }
    None
}

/// An actor: acquire `key` as `holder` (polling while refused), renew every
/// TTL/3 while held, go back to acquiring when lost or when the deadline
/// passes without a successful renewal.
async fn actor(
    backend: EtcdBackend,
    key: LeaseKey,
    holder: HolderId,
    until: Instant,
    log: Arc<Mutex<Log>>,
) {
    let name = holder.to_string();
    let mut held: Option<Grant> = None;
    while Instant::now() < until {
        match held.take() {
            None => {
                let req = AcquireRequest::new(key.clone(), holder.clone()).ttl(TTL);
                match backend.try_acquire(req).await {
                    Ok(Acquire::Granted(g)) => {
                        log.lock().unwrap().granted(&g, Instant::now());
                        held = Some(g);
                    }
                    Ok(Acquire::Held(h)) => {
                        // Wait on a watch for the holder to go (bounded: a
                        // watch on the member that dies ends with an error).
                        let seen = LeaseState::Held(h);
                        match tokio::time::timeout(POLL * 5, backend.wait_for_change(&key, &seen))
                            .await
                        {
                            Ok(Ok(())) => {
                                *log.lock()
                                    .unwrap()
                                    .watch_wakes
                                    .entry(name.clone())
                                    .or_default() += 1
                            }
                            Ok(Err(_)) => tokio::time::sleep(POLL).await,
                            Err(_) => {}
                        }
                    }
                    Err(_) => {
                        *log.lock()
                            .unwrap()
                            .acquire_err
                            .entry(name.clone())
                            .or_default() += 1;
                        tokio::time::sleep(POLL).await;
                    }
                }
            }
            Some(g) => {
                tokio::time::sleep_until(g.renew_at().min(until).into()).await;
                match backend.renew(&g, None).await {
                    Ok(Renewal::Renewed(g2)) => {
                        let mut l = log.lock().unwrap();
                        l.granted(&g2, Instant::now());
                        l.renew_ok
                            .entry(name.clone())
                            .or_default()
                            .push(Instant::now());
                        held = Some(g2);
                    }
                    Ok(Renewal::Lost) => {}
                    Err(_) => {
                        *log.lock()
                            .unwrap()
                            .renew_err
                            .entry(name.clone())
                            .or_default() += 1;
                        if g.may_write() {
                            // Unknown outcome: retry while the deadline lasts.
                            tokio::time::sleep(POLL).await;
                            held = Some(g);
                        }
                        // Past the deadline the holder must assume it lost the
                        // grant; it competes again (a re-acquire by the same
                        // holder returns the same grant if it is still live).
                    }
                }
            }
        }
    }
}

async fn connect(endpoints: &[String], prefix: &str) -> EtcdBackend {
    EtcdBackend::connect(
        EtcdConfig::new(endpoints.to_vec())
            .key_prefix(prefix)
            .dial_timeout(Duration::from_secs(2))
            .request_timeout(Duration::from_secs(1)),
    )
    .await
    .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_loss_keeps_exclusion_and_fences() {
    let mut members = common::start_cluster(3, None).expect("start a 3-member etcd cluster");
    let urls: Vec<String> = members.iter().map(|m| m.client_url.clone()).collect();
    if let Err(e) = common::wait_ready(&urls, None, Duration::from_secs(30)).await {
        let logs: Vec<String> = members.iter().map(|m| m.log_tail()).collect();
        panic!("{e}\n{}", logs.join("\n---\n"));
    }
    let mut leader_url = None;
    for _ in 0..50 {
        leader_url = leader(&urls).await;
        if leader_url.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader_url = leader_url.expect("the cluster elected a leader");
    let leader_idx = urls.iter().position(|u| *u == leader_url).unwrap();
    eprintln!("cluster {urls:?}, leader {leader_url}");

    let prefix = common::unique_prefix("cluster");
    let (k1, k2) = (LeaseKey::new("k1").unwrap(), LeaseKey::new("k2").unwrap());
    let a = HolderId::new("a-on-leader-only").unwrap();
    let b = HolderId::new("b-on-all").unwrap();
    // A talks only to the member that will die: its keep-alives lose the
    // quorum with it. Everyone else knows all three members.
    let only_leader = connect(std::slice::from_ref(&leader_url), &prefix).await;
    let all = connect(&urls, &prefix).await;

    // The first holders take their keys before the contenders start.
    let log = Arc::new(Mutex::new(Log::default()));
    for (c, k, h) in [(&only_leader, &k1, &a), (&all, &k2, &b)] {
        let g = c
            .try_acquire(AcquireRequest::new(k.clone(), h.clone()).ttl(TTL))
            .await
            .unwrap()
            .granted()
            .expect("fresh key");
        log.lock().unwrap().granted(&g, Instant::now());
    }

    let start = Instant::now();
    let until = start + RUN_FOR;
    let mut tasks = Vec::new();
    let actors = [
        (only_leader.clone(), k1.clone(), a.clone()),
        (all.clone(), k2.clone(), b.clone()),
        (
            connect(&urls, &prefix).await,
            k1.clone(),
            HolderId::new("c1").unwrap(),
        ),
        (
            connect(&urls, &prefix).await,
            k1.clone(),
            HolderId::new("c2").unwrap(),
        ),
        (
            connect(&urls, &prefix).await,
            k2.clone(),
            HolderId::new("c3").unwrap(),
        ),
    ];
    // The first holders' actors begin by re-acquiring their live grants
    // (same fence), then renew them.
    for (backend, key, holder) in actors {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            actor(backend, key, holder, until, log).await
        }));
    }

    tokio::time::sleep_until((start + KILL_AT).into()).await;
    let killed_at = Instant::now();
    members[leader_idx].kill();
    eprintln!("killed the leader at {:?}", killed_at - start);

    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap();

    // 1. Per key: windows in order of their start never overlap, and fences
    //    increase in that order.
    let mut per_key: HashMap<&str, Vec<&WriteWindow>> = HashMap::new();
    for w in log.windows.values() {
        per_key.entry(w.key.as_str()).or_default().push(w);
    }
    for (key, ws) in per_key.iter_mut() {
        ws.sort_by_key(|w| w.start);
        let line: Vec<String> = ws
            .iter()
            .map(|w| {
                format!(
                    "{}#{} [{:?}..{:?}]",
                    w.holder,
                    w.fence,
                    w.start.saturating_duration_since(start),
                    w.end.saturating_duration_since(start)
                )
            })
            .collect();
        eprintln!("{key}: {}", line.join(", "));
    }
    if let Err(e) = common::check_write_windows(log.windows.values()) {
        panic!("{e}");
    }

    // 2. A lost its quorum with the leader: no renewal succeeded after the
    //    kill, its deadline passed, and it may not write.
    let a_name = a.to_string();
    let late = log
        .renew_ok
        .get(&a_name)
        .map(|v| v.iter().filter(|t| **t > killed_at).count())
        .unwrap_or(0);
    assert_eq!(late, 0, "A renewed through a dead leader");
    assert!(
        log.renew_err.get(&a_name).copied().unwrap_or(0) > 0,
        "A's renewals after the kill should have failed with unknown outcome"
    );
    let a_grant = log.last_grant.get(&a_name).expect("A held k1");
    assert!(
        a_grant.deadline() < killed_at + TTL,
        "A's deadline lies beyond a TTL after the kill"
    );
    assert!(
        !a_grant.may_write(),
        "A may still write after losing its quorum"
    );

    // 3. The survivors go on: k1 passed to a contender with a higher fence,
    //    and k2 is held by someone after the kill.
    let k1_after: Vec<&WriteWindow> = per_key["k1"]
        .iter()
        .copied()
        .filter(|w| w.start > killed_at)
        .collect();
    assert!(
        k1_after
            .iter()
            .any(|w| w.holder != a_name && w.fence > a_grant.fence()),
        "no contender took k1 after its holder lost the quorum"
    );
    assert!(
        per_key["k2"].iter().any(|w| w.end > killed_at + TTL),
        "nobody held k2 after the leader died"
    );
    eprintln!(
        "renew errors {:?}, acquire errors {:?}, watch wake-ups {:?}",
        log.renew_err, log.acquire_err, log.watch_wakes
    );
}
