//! Native peers measured in the same run: etcd's own v3lock service (lock +
//! unlock through `etcd-client`) and a `concurrency`-style session lock (a
//! transaction putting the key on the session's lease if it does not exist,
//! released by a delete, as `etcdctl lock` and Go's `concurrency.Mutex` do)
//! against lease-etcd acquire + release, and
//! a plain NATS KV create + delete against lease-nats acquire + release,
//! and PostgreSQL's session advisory lock (`pg_advisory_lock` +
//! `pg_advisory_unlock` on one session) against lease-postgres acquire +
//! release, and the two usual Redis locks (the single-instance `SET NX PX`
//! lock with its compare-and-delete script, and Redisson's reentrant lock,
//! a hash of holder → count with a TTL, taken and given back by scripts)
//! against lease-redis acquire + release.
//! Interleaved iterations, so machine noise falls on both sides alike.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};
use lease_conformance::faults::FaultProxy;
use lease_core::{AcquireRequest, HolderId, LeaseBackend, LeaseKey};
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_nats::{NatsBackend, NatsConfig};
use lease_postgres::{PostgresBackend, PostgresConfig};
use lease_redis::{RedisBackend, RedisConfig};
use serde::Serialize;
use tokio_postgres::types::Type as PgType;

use crate::measure;
use crate::ops::{Meter, Rec};
use crate::stats::{self, Count, Latency};
use crate::targets::{self, Counter, Target, NATS_BUCKET};

#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub what: String,
    pub latency: Latency,
    pub proxy_requests: Option<Count>,
    pub counter_requests: Option<Count>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Peer {
    pub backend: &'static str,
    pub lease: Side,
    pub peers: Vec<Side>,
}

fn side(what: &str, lat: &Rec, cnt: &Rec) -> Side {
    Side {
        what: what.into(),
        latency: stats::latency(&lat.lat),
        proxy_requests: stats::count(&cnt.proxy),
        counter_requests: stats::count(&cnt.counter),
    }
}

/// lease-etcd acquire + release vs v3lock lock + unlock (on a lease granted
/// once, the plain lock), vs v3lock with its own lease per lock (grant +
/// lock + unlock + revoke, what a lease-etcd grant without a shared lease
/// carries), and vs a session lock: one session lease granted once, lock =
/// `txn(create_revision(key) == 0 → put(key, lease))`, unlock = `delete`.
pub async fn etcd(t: &Target, run: &str, iters: usize, count_iters: usize) -> Result<Peer, String> {
    let Target::Etcd { url, sessions, .. } = t else {
        return Err("etcd peers need the etcd target".into());
    };
    let upstream = t.upstream().ok_or("etcd: no address")?;
    let proxy = FaultProxy::start(upstream)
        .await
        .map_err(|e| format!("proxy: {e}"))?;
    let counter = Counter::EtcdMetrics(url.clone());
    const SIDES: usize = 4;
    let mut lat: [Rec; SIDES] = Default::default();
    let mut cnt: [Rec; SIDES] = Default::default();
    for (endpoint, meter, n) in [
        (url.clone(), Meter::NONE, iters),
        (
            format!("http://{}", proxy.addr()),
            Meter {
                proxy: Some(&proxy),
                counter: Some(&counter),
            },
            count_iters,
        ),
    ] {
        let counting = meter.proxy.is_some();
        let b = EtcdBackend::connect(
            EtcdConfig::new([endpoint])
                .key_prefix(format!("{run}/peer/{}/", t.name()))
                .sessions(*sessions),
        )
        .await
        .map_err(|e| format!("etcd connect: {e}"))?;
        let client = b.client().clone();
        let mut locks = client.lock_client();
        let mut leases = client.lease_client();
        let mut kv = client.kv_client();
        let long = leases
            .grant(600, None)
            .await
            .map_err(|e| format!("lease grant: {e}"))?
            .id();
        // The session: one lease for every lock this client takes.
        let session = leases
            .grant(600, None)
            .await
            .map_err(|e| format!("session lease grant: {e}"))?
            .id();
        let session_key = format!("{run}/peer/{}/session-lock", t.name());
        let key = LeaseKey::new(format!("{run}/peer/lease")).map_err(|e| e.to_string())?;
        let lock_name = format!("{run}/peer/{}/v3lock", t.name());
        let holder = HolderId::random();
        let warm = 5;
        for i in 0..warm + n {
            let mut scratch: [Rec; SIDES] = Default::default();
            let recs = if i < warm {
                &mut scratch
            } else if counting {
                &mut cnt
            } else {
                &mut lat
            };
            // Rotate the order: no side always runs first.
            for k in 0..SIDES {
                match (i + k) % SIDES {
                    0 => {
                        let req = AcquireRequest::new(key.clone(), holder.clone())
                            .ttl(Duration::from_secs(10));
                        measure!(
                            recs[0],
                            meter,
                            async {
                                let g = b
                                    .try_acquire(req)
                                    .await
                                    .map_err(|e| e.to_string())?
                                    .granted()
                                    .ok_or("lease-etcd: key held")?;
                                b.release(&g).await.map_err(|e| e.to_string())
                            }
                            .await
                        )?;
                    }
                    1 => {
                        measure!(
                            recs[1],
                            meter,
                            async {
                                let l = locks
                                    .lock(
                                        lock_name.as_str(),
                                        Some(LockOptions::new().with_lease(long)),
                                    )
                                    .await
                                    .map_err(|e| format!("v3lock lock: {e}"))?;
                                locks
                                    .unlock(l.key().to_vec())
                                    .await
                                    .map(|_| ())
                                    .map_err(|e| format!("v3lock unlock: {e}"))
                            }
                            .await
                        )?;
                    }
                    2 => {
                        measure!(
                            recs[3],
                            meter,
                            async {
                                let put = TxnOp::put(
                                    session_key.as_str(),
                                    "",
                                    Some(PutOptions::new().with_lease(session)),
                                );
                                let locked = kv
                                    .txn(
                                        Txn::new()
                                            .when([Compare::create_revision(
                                                session_key.as_str(),
                                                CompareOp::Equal,
                                                0,
                                            )])
                                            .and_then([put]),
                                    )
                                    .await
                                    .map_err(|e| format!("session lock: {e}"))?;
                                if !locked.succeeded() {
                                    return Err("session lock: key held".to_string());
                                }
                                kv.delete(session_key.as_str(), None)
                                    .await
                                    .map(|_| ())
                                    .map_err(|e| format!("session unlock: {e}"))
                            }
                            .await
                        )?;
                    }
                    _ => {
                        measure!(
                            recs[2],
                            meter,
                            async {
                                let id = leases
                                    .grant(10, None)
                                    .await
                                    .map_err(|e| format!("lease grant: {e}"))?
                                    .id();
                                let l = locks
                                    .lock(
                                        lock_name.as_str(),
                                        Some(LockOptions::new().with_lease(id)),
                                    )
                                    .await
                                    .map_err(|e| format!("v3lock lock: {e}"))?;
                                locks
                                    .unlock(l.key().to_vec())
                                    .await
                                    .map_err(|e| format!("v3lock unlock: {e}"))?;
                                leases
                                    .revoke(id)
                                    .await
                                    .map(|_| ())
                                    .map_err(|e| format!("lease revoke: {e}"))
                            }
                            .await
                        )?;
                    }
                }
            }
        }
        let _ = leases.revoke(long).await;
        let _ = leases.revoke(session).await;
    }
    Ok(Peer {
        backend: t.name(),
        lease: side(
            if *sessions {
                "lease-etcd acquire + release"
            } else {
                "lease-etcd (own leases) acquire + release"
            },
            &lat[0],
            &cnt[0],
        ),
        peers: vec![
            side(
                "v3lock lock + unlock (lease granted once)",
                &lat[1],
                &cnt[1],
            ),
            side(
                "v3lock lease grant + lock + unlock + revoke",
                &lat[2],
                &cnt[2],
            ),
            side(
                "session lock: txn put on the session lease if absent + delete",
                &lat[3],
                &cnt[3],
            ),
        ],
    })
}

/// lease-nats acquire + release vs KV create + delete on the same bucket.
pub async fn nats(t: &Target, run: &str, iters: usize, count_iters: usize) -> Result<Peer, String> {
    let Target::Nats { url, .. } = t else {
        return Err("nats peers need the nats target".into());
    };
    let upstream = t.upstream().ok_or("nats: no address")?;
    let proxy = FaultProxy::start(upstream)
        .await
        .map_err(|e| format!("proxy: {e}"))?;
    let mut lat = [Rec::default(), Rec::default()];
    let mut cnt = [Rec::default(), Rec::default()];
    for (endpoint, counting, n) in [
        (url.clone(), false, iters),
        (format!("nats://{}", proxy.addr()), true, count_iters),
    ] {
        let b = NatsBackend::connect(&endpoint, NatsConfig::new(NATS_BUCKET).create_bucket(true))
            .await
            .map_err(|e| format!("nats connect: {e}"))?;
        let js = lease_nats::async_nats::jetstream::new(b.client().clone());
        let kv = js
            .get_key_value(NATS_BUCKET)
            .await
            .map_err(|e| format!("nats bucket: {e}"))?;
        let counter = Counter::Nats(b.clone());
        let meter = if counting {
            Meter {
                proxy: Some(&proxy),
                counter: Some(&counter),
            }
        } else {
            Meter::NONE
        };
        let key = LeaseKey::new(format!("{run}/peer/lease")).map_err(|e| e.to_string())?;
        let kv_key = format!("{run}/peer/kv");
        let holder = HolderId::random();
        let warm = 5;
        for i in 0..warm + n {
            let mut scratch = [Rec::default(), Rec::default()];
            let recs = if i < warm {
                &mut scratch
            } else if counting {
                &mut cnt
            } else {
                &mut lat
            };
            for k in 0..2 {
                if (i + k) % 2 == 0 {
                    let req = AcquireRequest::new(key.clone(), holder.clone())
                        .ttl(Duration::from_secs(10));
                    measure!(
                        recs[0],
                        meter,
                        async {
                            let g = b
                                .try_acquire(req)
                                .await
                                .map_err(|e| e.to_string())?
                                .granted()
                                .ok_or("lease-nats: key held")?;
                            b.release(&g).await.map_err(|e| e.to_string())
                        }
                        .await
                    )?;
                } else {
                    measure!(
                        recs[1],
                        meter,
                        async {
                            kv.create(kv_key.as_str(), "x".into())
                                .await
                                .map_err(|e| format!("kv create: {e}"))?;
                            kv.delete(kv_key.as_str())
                                .await
                                .map_err(|e| format!("kv delete: {e}"))
                        }
                        .await
                    )?;
                }
            }
        }
        let _ = kv.purge(kv_key.as_str()).await;
    }
    // requests_sent counts lease ops only: the KV side has no client counter.
    cnt[1].counter.clear();
    Ok(Peer {
        backend: "nats",
        lease: side("lease-nats acquire + release", &lat[0], &cnt[0]),
        peers: vec![side("KV create + delete", &lat[1], &cnt[1])],
    })
}

/// lease-postgres acquire + release vs `pg_advisory_lock($1)` +
/// `pg_advisory_unlock($1)` on one plain session of the same server (a
/// lock held by the session, no TTL, no fence, lost with the connection).
pub async fn postgres(
    t: &Target,
    run: &str,
    iters: usize,
    count_iters: usize,
) -> Result<Peer, String> {
    let Target::Postgres {
        url,
        statement_cache,
    } = t
    else {
        return Err("postgres peers need the postgres target".into());
    };
    let upstream = t.upstream().ok_or("postgres: no address")?;
    let proxy = FaultProxy::start(upstream)
        .await
        .map_err(|e| format!("proxy: {e}"))?;
    let mut lat = [Rec::default(), Rec::default()];
    let mut cnt = [Rec::default(), Rec::default()];
    for (endpoint, counting, n) in [
        (url.clone(), false, iters),
        (targets::url_via(url, proxy.addr()), true, count_iters),
    ] {
        let table = targets::pg_table(&format!("{run}/peer"));
        let config = PostgresConfig::new(table).statement_cache(*statement_cache);
        let b = PostgresBackend::connect(&endpoint, config)
            .await
            .map_err(|e| format!("postgres connect: {e}"))?;
        let session = targets::pg_session(&endpoint)
            .await
            .map_err(|e| format!("postgres session: {e}"))?;
        let meter = if counting {
            Meter {
                proxy: Some(&proxy),
                counter: None,
            }
        } else {
            Meter::NONE
        };
        let key = LeaseKey::new(format!("{run}/peer/lease")).map_err(|e| e.to_string())?;
        // One lock id per run, so a stray session of another run never waits.
        let lock_id: i64 = i64::from_str_radix(&HolderId::random().as_str()[..15], 16)
            .map_err(|e| e.to_string())?;
        let holder = HolderId::random();
        let warm = 5;
        for i in 0..warm + n {
            let mut scratch = [Rec::default(), Rec::default()];
            let recs = if i < warm {
                &mut scratch
            } else if counting {
                &mut cnt
            } else {
                &mut lat
            };
            for k in 0..2 {
                if (i + k) % 2 == 0 {
                    let req = AcquireRequest::new(key.clone(), holder.clone())
                        .ttl(Duration::from_secs(10));
                    measure!(
                        recs[0],
                        meter,
                        async {
                            let g = b
                                .try_acquire(req)
                                .await
                                .map_err(|e| e.to_string())?
                                .granted()
                                .ok_or("lease-postgres: key held")?;
                            b.release(&g).await.map_err(|e| e.to_string())
                        }
                        .await
                    )?;
                } else {
                    measure!(
                        recs[1],
                        meter,
                        async {
                            session
                                .query_typed(
                                    "SELECT pg_advisory_lock($1)",
                                    &[(&lock_id, PgType::INT8)],
                                )
                                .await
                                .map_err(|e| format!("pg_advisory_lock: {e}"))?;
                            let rows = session
                                .query_typed(
                                    "SELECT pg_advisory_unlock($1)",
                                    &[(&lock_id, PgType::INT8)],
                                )
                                .await
                                .map_err(|e| format!("pg_advisory_unlock: {e}"))?;
                            match rows.first().map(|r| r.try_get::<_, bool>(0)) {
                                Some(Ok(true)) => Ok(()),
                                other => Err(format!("pg_advisory_unlock: not held ({other:?})")),
                            }
                        }
                        .await
                    )?;
                }
            }
        }
    }
    Ok(Peer {
        backend: t.name(),
        lease: side(
            if *statement_cache {
                "lease-postgres (statement cache) acquire + release"
            } else {
                "lease-postgres acquire + release"
            },
            &lat[0],
            &cnt[0],
        ),
        peers: vec![side(
            "pg_advisory_lock + pg_advisory_unlock (one session)",
            &lat[1],
            &cnt[1],
        )],
    })
}

/// The single-instance Redis lock: `SET key token NX PX ttl`, released by a
/// script deleting the key only while it holds the caller's token.
const REDIS_UNLOCK: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Redisson's `RedissonLock.tryLockInnerAsync`: the lock is a hash of
/// holder → reentrancy count with a TTL (`pexpire`); a refused attempt
/// answers the holder's remaining time.
const REDISSON_LOCK: &str = "if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then \
redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; \
return redis.call('pttl', KEYS[1]);";

/// Redisson's `unlockInnerAsync`: one reentrancy level given back; the last
/// deletes the hash and publishes to the lock's channel, which wakes its
/// waiters.
const REDISSON_UNLOCK: &str =
    "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; \
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; \
else redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1; end;";

/// lease-redis acquire + release vs the single-instance `SET NX PX` lock
/// (with its compare-and-delete script) and vs Redisson's lock and unlock
/// scripts, on one plain redis-rs connection to the same server. Neither
/// peer has a fence; both expire by the server's clock as lease-redis does.
pub async fn redis(
    t: &Target,
    run: &str,
    iters: usize,
    count_iters: usize,
) -> Result<Peer, String> {
    let Target::Redis { url, .. } = t else {
        return Err("redis peers need the redis target".into());
    };
    let upstream = t.upstream().ok_or("redis: no address")?;
    let proxy = FaultProxy::start(upstream)
        .await
        .map_err(|e| format!("proxy: {e}"))?;
    const SIDES: usize = 3;
    let mut lat: [Rec; SIDES] = Default::default();
    let mut cnt: [Rec; SIDES] = Default::default();
    let unlock = redis::Script::new(REDIS_UNLOCK);
    let redisson_lock = redis::Script::new(REDISSON_LOCK);
    let redisson_unlock = redis::Script::new(REDISSON_UNLOCK);
    for (endpoint, counting, n) in [
        (url.clone(), false, iters),
        (targets::url_via(url, proxy.addr()), true, count_iters),
    ] {
        let b = RedisBackend::connect(&endpoint, RedisConfig::new(format!("{run}/peer:")))
            .await
            .map_err(|e| format!("redis connect: {e}"))?;
        let mut conn = targets::redis_session(&endpoint)
            .await
            .map_err(|e| format!("redis session: {e}"))?;
        let meter = if counting {
            Meter {
                proxy: Some(&proxy),
                counter: None,
            }
        } else {
            Meter::NONE
        };
        let key = LeaseKey::new(format!("{run}/peer/lease")).map_err(|e| e.to_string())?;
        let lock_key = format!("{run}/peer/set-nx");
        let redisson_key = format!("{run}/peer/redisson");
        let channel = format!("redisson_lock__channel:{{{redisson_key}}}");
        let holder = HolderId::random();
        // Redisson's lock name: the client's id and the thread's.
        let token = format!("{}:1", HolderId::random());
        let warm = 5;
        for i in 0..warm + n {
            let mut scratch: [Rec; SIDES] = Default::default();
            let recs = if i < warm {
                &mut scratch
            } else if counting {
                &mut cnt
            } else {
                &mut lat
            };
            // Rotate the order: no side always runs first.
            for k in 0..SIDES {
                match (i + k) % SIDES {
                    0 => {
                        let req = AcquireRequest::new(key.clone(), holder.clone())
                            .ttl(Duration::from_secs(10));
                        measure!(
                            recs[0],
                            meter,
                            async {
                                let g = b
                                    .try_acquire(req)
                                    .await
                                    .map_err(|e| e.to_string())?
                                    .granted()
                                    .ok_or("lease-redis: key held")?;
                                b.release(&g).await.map_err(|e| e.to_string())
                            }
                            .await
                        )?;
                    }
                    1 => {
                        measure!(
                            recs[1],
                            meter,
                            async {
                                let locked: Option<String> = redis::cmd("SET")
                                    .arg(lock_key.as_str())
                                    .arg(token.as_str())
                                    .arg("NX")
                                    .arg("PX")
                                    .arg(10_000)
                                    .query_async(&mut conn)
                                    .await
                                    .map_err(|e| format!("SET NX PX: {e}"))?;
                                if locked.is_none() {
                                    return Err("SET NX PX: key held".to_string());
                                }
                                let deleted: i64 = unlock
                                    .key(lock_key.as_str())
                                    .arg(token.as_str())
                                    .invoke_async(&mut conn)
                                    .await
                                    .map_err(|e| format!("unlock script: {e}"))?;
                                match deleted {
                                    1 => Ok(()),
                                    _ => Err("unlock script: not held".to_string()),
                                }
                            }
                            .await
                        )?;
                    }
                    _ => {
                        measure!(
                            recs[2],
                            meter,
                            async {
                                let refused: Option<i64> = redisson_lock
                                    .key(redisson_key.as_str())
                                    .arg(10_000)
                                    .arg(token.as_str())
                                    .invoke_async(&mut conn)
                                    .await
                                    .map_err(|e| format!("Redisson lock: {e}"))?;
                                if let Some(ms) = refused {
                                    return Err(format!("Redisson lock: held for {ms} ms"));
                                }
                                let released: Option<i64> = redisson_unlock
                                    .key(redisson_key.as_str())
                                    .key(channel.as_str())
                                    .arg(0)
                                    .arg(10_000)
                                    .arg(token.as_str())
                                    .invoke_async(&mut conn)
                                    .await
                                    .map_err(|e| format!("Redisson unlock: {e}"))?;
                                match released {
                                    Some(1) => Ok(()),
                                    other => Err(format!("Redisson unlock: {other:?}")),
                                }
                            }
                            .await
                        )?;
                    }
                }
            }
        }
    }
    Ok(Peer {
        backend: "redis",
        lease: side("lease-redis acquire + release", &lat[0], &cnt[0]),
        peers: vec![
            side(
                "SET NX PX + compare-and-delete script (the single-instance lock)",
                &lat[1],
                &cnt[1],
            ),
            side(
                "Redisson lock + unlock scripts (hash holder → count, pexpire, publish)",
                &lat[2],
                &cnt[2],
            ),
        ],
    })
}
