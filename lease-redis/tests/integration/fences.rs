//! Fences keep rising whatever happens to the keys behind the library's
//! back or to the server: an outside `DEL` of the lease key or of its
//! counter, a counter rewound, a restart with the append-only file and one
//! without any persistence, a flushed script cache, an answer lost after
//! the script ran.

use std::time::Duration;

use lease_conformance::faults::FaultProxy;
use lease_core::{Acquire, Grant, HolderId, LeaseBackend, LeaseKey, LeaseState, Renewal};
use lease_redis::{RedisBackend, RedisConfig};
use lease_testkit::servers::RedisOptions;
use redis::aio::MultiplexedConnection;

use crate::common::{admin, backend, fresh_config, unique, url};

async fn grant(b: &RedisBackend, key: &LeaseKey, ttl: Duration) -> Grant {
    match b
        .try_acquire(b.request(key.clone(), HolderId::random()).ttl(ttl))
        .await
        .unwrap()
    {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => panic!("{key} is held by {}", h.holder),
    }
}

async fn cmd<T: redis::FromRedisValue>(conn: &mut MultiplexedConnection, args: &[&str]) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The server's clock in microseconds, as the scripts read it.
async fn server_micros(conn: &mut MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = cmd(conn, &["TIME"]).await;
    s * 1_000_000 + us
}

#[tokio::test]
async fn the_counter_holds_the_fence_exactly_and_fences_follow_the_server_clock() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let key = LeaseKey::new(unique("exact")).unwrap();
    let before = server_micros(&mut admin).await;
    let g = grant(&b, &key, Duration::from_secs(10)).await;
    let after = server_micros(&mut admin).await;
    assert!(
        (before..=after).contains(&g.fence().get()),
        "a first fence is the server's clock in µs: {before} ≤ {} ≤ {after}",
        g.fence()
    );
    let counter: String = cmd(&mut admin, &["GET", &config.counter_key(&key)]).await;
    assert_eq!(counter, g.fence().get().to_string());
    let record: Vec<u8> = cmd(&mut admin, &["GET", &config.lease_key(&key)]).await;
    let head = format!("lease-redis/1\n{}\n{}\n10000\n", g.holder(), g.fence());
    assert_eq!(record, head.as_bytes(), "the record as documented");
    b.release(&g).await.unwrap();
    let next = grant(&b, &key, Duration::from_secs(10)).await;
    assert!(next.fence() > g.fence());
}

#[tokio::test]
async fn outside_deletes_of_the_lease_and_of_the_counter_keep_fences_rising() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let key = LeaseKey::new(unique("del")).unwrap();
    let (lease, counter) = (config.lease_key(&key), config.counter_key(&key));
    let mut last = grant(&b, &key, Duration::from_secs(30)).await;
    for (what, dels) in [
        ("the lease key", vec![lease.as_str()]),
        ("the counter", vec![counter.as_str()]),
        ("both", vec![lease.as_str(), counter.as_str()]),
    ] {
        // The counter goes while the grant lives, or with it.
        for k in &dels {
            let _: i64 = cmd(&mut admin, &["DEL", k]).await;
        }
        if what == "the counter" {
            // Its grant's renewal writes it again, and its release keeps it.
            assert!(matches!(
                b.renew(&last, None).await.unwrap(),
                Renewal::Renewed(_)
            ));
            let c: String = cmd(&mut admin, &["GET", &counter]).await;
            assert_eq!(
                c,
                last.fence().get().to_string(),
                "renew restores the counter"
            );
            let _: i64 = cmd(&mut admin, &["DEL", &counter]).await;
            b.release(&last).await.unwrap();
            let c: String = cmd(&mut admin, &["GET", &counter]).await;
            assert_eq!(c, last.fence().get().to_string(), "release restores it");
            let _: i64 = cmd(&mut admin, &["DEL", &counter]).await;
        }
        let next = grant(&b, &key, Duration::from_secs(30)).await;
        assert!(
            next.fence() > last.fence(),
            "after a DEL of {what}: fence {} after {}",
            next.fence(),
            last.fence()
        );
        // The old grant is gone for good.
        assert!(
            matches!(b.renew(&last, None).await.unwrap(), Renewal::Lost),
            "{what}"
        );
        b.release(&last).await.unwrap();
        assert_eq!(
            b.read(&key).await.unwrap().holding().map(|h| h.fence),
            Some(next.fence())
        );
        last = next;
    }
}

#[tokio::test]
async fn a_counter_rewound_or_deleted_after_an_expiry_is_overtaken_by_the_clock() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let key = LeaseKey::new(unique("rewind")).unwrap();
    let counter = config.counter_key(&key);
    let g = grant(&b, &key, Duration::from_secs(1)).await;
    // A restore of an old dump: the counter far behind.
    let _: () = cmd(&mut admin, &["SET", &counter, "1"]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(b.read(&key).await.unwrap().is_free());
    let next = grant(&b, &key, Duration::from_secs(1)).await;
    assert!(
        next.fence() > g.fence(),
        "{} after {}",
        next.fence(),
        g.fence()
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _: i64 = cmd(&mut admin, &["DEL", &counter]).await;
    let third = grant(&b, &key, Duration::from_secs(1)).await;
    assert!(third.fence() > next.fence());
}

#[tokio::test]
async fn a_holder_reacquiring_after_expiry_gets_a_new_term_and_its_old_one_stays_lost() {
    let url = url();
    let b = backend(&url, &fresh_config()).await;
    let key = LeaseKey::new(unique("term")).unwrap();
    let me = HolderId::random();
    let req = || {
        b.request(key.clone(), me.clone())
            .ttl(Duration::from_secs(1))
    };
    let first = b.try_acquire(req()).await.unwrap().granted().unwrap();
    // A retry while it lives is the same grant.
    let again = b.try_acquire(req()).await.unwrap().granted().unwrap();
    assert_eq!(again.fence(), first.fence());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = b.try_acquire(req()).await.unwrap().granted().unwrap();
    assert!(second.fence() > first.fence());
    assert!(matches!(
        b.renew(&first, None).await.unwrap(),
        Renewal::Lost
    ));
    b.release(&first).await.unwrap();
    let state = b.read(&key).await.unwrap();
    assert_eq!(state.holding().map(|h| h.fence), Some(second.fence()));
}

#[tokio::test]
async fn a_flushed_script_cache_is_refilled_by_the_next_request() {
    let url = url();
    let b = backend(&url, &fresh_config()).await;
    let mut admin = admin(&url).await.unwrap();
    let key = LeaseKey::new(unique("flush")).unwrap();
    let g = grant(&b, &key, Duration::from_secs(10)).await;
    for _ in 0..2 {
        let _: () = cmd(&mut admin, &["SCRIPT", "FLUSH"]).await;
        assert!(matches!(
            b.renew(&g, None).await.unwrap(),
            Renewal::Renewed(_)
        ));
        let _: () = cmd(&mut admin, &["SCRIPT", "FLUSH"]).await;
        assert!(!b.read(&key).await.unwrap().is_free());
    }
    let _: () = cmd(&mut admin, &["SCRIPT", "FLUSH"]).await;
    b.release(&g).await.unwrap();
    assert!(b.read(&key).await.unwrap().is_free());
}

/// An acquire whose answer does not come within the request timeout is an
/// unknown outcome, and it did run: the retry with the same holder id gets
/// that grant back, and nobody else gets the key meanwhile.
#[tokio::test]
async fn an_acquire_that_timed_out_after_it_ran_is_taken_back_by_its_retry() {
    let url = url();
    let config = fresh_config().request_timeout(Duration::from_millis(300));
    let upstream = lease_testkit::harness::socket_addr(&url).unwrap();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let via = url.replacen(&upstream.to_string(), &proxy.addr().to_string(), 1);
    let b = RedisBackend::connect(&via, config.clone()).await.unwrap();
    let other = backend(&url, &config).await;
    let key = LeaseKey::new(unique("late")).unwrap();
    let me = HolderId::random();
    proxy.set_latency(Duration::from_millis(400));
    let e = b
        .try_acquire(b.request(key.clone(), me.clone()))
        .await
        .expect_err("no answer within 300 ms");
    assert!(e.is_unknown_outcome(), "{e}");
    assert!(e.to_string().contains("no answer within"), "{e}");
    // It ran: the key is held, by us.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let LeaseState::Held(h) = other.read(&key).await.unwrap() else {
        panic!("the acquire did not run");
    };
    assert_eq!(h.holder, me);
    assert!(matches!(
        other
            .try_acquire(other.request(key.clone(), HolderId::random()))
            .await
            .unwrap(),
        Acquire::Held(_)
    ));
    proxy.heal();
    let g = b
        .try_acquire(b.request(key.clone(), me))
        .await
        .unwrap()
        .granted()
        .expect("the retry gets the grant back");
    assert_eq!(g.fence(), h.fence);
    // A lost answer to a release: the retry is a no-op that succeeds.
    proxy.drop_responses(1);
    let _ = b.release(&g).await;
    proxy.heal();
    b.release(&g).await.unwrap();
    assert!(other.read(&key).await.unwrap().is_free());
}

/// A server killed and restarted on its append-only file (`appendfsync
/// always`) has every grant it acknowledged; its script cache is empty,
/// and the client that was connected carries on.
#[tokio::test]
async fn a_restart_with_the_append_only_file_keeps_grants_and_fences() {
    let mut server = RedisOptions::new()
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let config = RedisConfig::new("restart:").request_timeout(Duration::from_secs(2));
    let b = backend(&server.url, &config).await;
    assert_eq!(b.persistence().keeps_acknowledged_writes(), Some(true));
    let key = LeaseKey::new("k").unwrap();
    let g = grant(&b, &key, Duration::from_secs(30)).await;
    server.kill().unwrap();
    assert!(b
        .read(&key)
        .await
        .expect_err("the server is down")
        .is_unknown_outcome());
    server.restart().unwrap();
    let h = b.read(&key).await.unwrap();
    assert_eq!(
        h.holding().map(|h| (h.holder.clone(), h.fence)),
        Some((g.holder().clone(), g.fence()))
    );
    assert!(matches!(
        b.renew(&g, None).await.unwrap(),
        Renewal::Renewed(_)
    ));
    b.release(&g).await.unwrap();
    server.restart().unwrap();
    let next = grant(&b, &key, Duration::from_secs(30)).await;
    assert!(next.fence() > g.fence());
    // A break is never sent twice: on the connection the restart killed it
    // fails (it did not run), where the other operations are sent again.
    server.restart().unwrap();
    let e = b
        .break_lease(&key, &lease_core::BreakNote::new("ops", "after a restart"))
        .await
        .expect_err("the connection died with the server");
    assert!(e.is_unknown_outcome(), "{e}");
    assert_eq!(
        b.read(&key).await.unwrap().holding().map(|h| h.fence),
        Some(next.fence())
    );
    assert!(b.last_break(&key).await.unwrap().is_none());
}

/// A server clock stepped back by more than a TTL leaves a grant's key
/// expiring further ahead than any grant is written to: it is reported
/// corrupt, and the key is never handed to a second holder; stepped forward
/// again, its holder renews it.
#[tokio::test]
async fn a_clock_stepped_back_never_hands_a_live_key_to_a_second_holder() {
    let (server, clock) = RedisOptions::new()
        .spawn_with_clock()
        .unwrap_or_else(|e| panic!("{e}"));
    let config = RedisConfig::new("clock:").request_timeout(Duration::from_secs(2));
    let b = backend(&server.url, &config).await;
    let key = LeaseKey::new("k").unwrap();
    let g = grant(&b, &key, Duration::from_secs(2)).await;
    clock.step(Duration::from_secs(5), false).unwrap();
    for _ in 0..3 {
        match b
            .try_acquire(b.request(key.clone(), HolderId::random()))
            .await
        {
            Ok(Acquire::Held(h)) => assert_eq!(h.fence, g.fence()),
            Err(lease_core::Error::CorruptRecord { detail, .. }) => {
                assert!(detail.contains("2 TTLs"), "{detail}")
            }
            other => panic!("a second holder got in: {other:?}"),
        }
    }
    clock.step(Duration::from_secs(5), true).unwrap();
    assert!(matches!(
        b.renew(&g, None).await.unwrap(),
        Renewal::Renewed(_)
    ));
    drop(server);
}

/// Without persistence a restart forgets every grant (the README says so:
/// two holders until the first one's deadline), but not the fences' order:
/// the next fence comes from the server's clock, above every earlier one.
#[tokio::test]
async fn a_restart_without_persistence_loses_grants_but_not_the_fence_order() {
    let mut server = RedisOptions::new()
        .without_persistence()
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let config = RedisConfig::new("volatile:").request_timeout(Duration::from_secs(2));
    let b = backend(&server.url, &config).await;
    assert_eq!(b.persistence().keeps_acknowledged_writes(), Some(false));
    let key = LeaseKey::new("k").unwrap();
    let mut last = grant(&b, &key, Duration::from_secs(30)).await;
    for _ in 0..3 {
        server.restart().unwrap();
        assert!(b.read(&key).await.unwrap().is_free(), "the grant is gone");
        let next = grant(&b, &key, Duration::from_secs(30)).await;
        assert!(
            next.fence() > last.fence(),
            "{} after {}",
            next.fence(),
            last.fence()
        );
        assert!(matches!(b.renew(&last, None).await.unwrap(), Renewal::Lost));
        last = next;
    }
}

/// One holder id in two places (two tasks of a process sharing it, or a
/// retry with another TTL whose first answer did arrive): the re-acquire
/// hands back the same term, and must not cut it shorter than the deadline
/// the first grant of that term reports, or a second holder gets the key
/// while the first may still write.
#[tokio::test]
async fn a_reacquire_with_a_shorter_ttl_never_ends_the_term_before_an_earlier_deadline() {
    let url = url();
    let b = backend(&url, &fresh_config()).await;
    let key = LeaseKey::new(unique("shorter")).unwrap();
    let me = HolderId::random();
    let long = b
        .try_acquire(
            b.request(key.clone(), me.clone())
                .ttl(Duration::from_secs(30)),
        )
        .await
        .unwrap()
        .granted()
        .unwrap();
    let short = b
        .try_acquire(b.request(key.clone(), me).ttl(Duration::from_secs(1)))
        .await
        .unwrap()
        .granted()
        .unwrap();
    assert_eq!(short.fence(), long.fence(), "the same term");
    assert!(
        short.ttl() >= long.ttl(),
        "the term's effective TTL is reported: {:?}",
        short.ttl()
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(long.may_write());
    let other = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap();
    assert!(
        matches!(other, Acquire::Held(_)),
        "a second holder while the first may write: {other:?}"
    );
    // The first grant's renewal keeps the key for its own TTL at least.
    let Renewal::Renewed(long) = b.renew(&long, None).await.unwrap() else {
        panic!("the term was lost");
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(long.may_write());
    assert!(matches!(
        b.try_acquire(b.request(key.clone(), HolderId::random()))
            .await
            .unwrap(),
        Acquire::Held(_)
    ));
    b.release(&long).await.unwrap();
}

/// Lua numbers are doubles: fences are exact up to 2^53 − 1, and the one
/// after it is refused rather than rounded (2^53 + 1 would read back as
/// 2^53, a repeated fence).
#[tokio::test]
async fn the_largest_fence_is_exact_and_the_next_is_refused() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let key = LeaseKey::new(unique("max")).unwrap();
    let counter = config.counter_key(&key);
    let _: () = cmd(&mut admin, &["SET", &counter, "9007199254740990"]).await;
    let g = grant(&b, &key, Duration::from_secs(10)).await;
    assert_eq!(g.fence().get(), (1 << 53) - 1);
    assert!(matches!(
        b.renew(&g, None).await.unwrap(),
        Renewal::Renewed(_)
    ));
    b.release(&g).await.unwrap();
    let c: String = cmd(&mut admin, &["GET", &counter]).await;
    assert_eq!(c, "9007199254740991");
    let e = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .expect_err("no fence above 2^53 - 1");
    assert!(e.to_string().contains("2^53"), "{e}");
    assert!(b.read(&key).await.unwrap().is_free());
}

/// A release that timed out is still on its way (a socket buffer, a
/// retransmission after a partition heals) when its holder acquires the
/// key again with the same holder id. A re-acquire of a live grant hands
/// the same term back, and grants are named by (holder, fence): the late
/// release would end the term the holder was just told it holds, and the
/// next acquirer would get the key while the holder may still write. The
/// acquire ends the term first and starts a new one, which the late release
/// leaves alone.
#[tokio::test]
async fn a_late_release_never_ends_the_term_acquired_after_it() {
    let url = url();
    let config = fresh_config().request_timeout(Duration::from_millis(300));
    let upstream = lease_testkit::harness::socket_addr(&url).unwrap();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let via = url.replacen(&upstream.to_string(), &proxy.addr().to_string(), 1);
    let b = RedisBackend::connect(&via, config.clone()).await.unwrap();
    let other = backend(&url, &config).await;
    let key = LeaseKey::new(unique("late-release")).unwrap();
    let me = HolderId::random();
    let req = || {
        b.request(key.clone(), me.clone())
            .ttl(Duration::from_secs(30))
    };
    // The release script in the server's cache, as it is in a running
    // system (a late `EVALSHA` of an uncached script does nothing).
    let warm = grant(
        &b,
        &LeaseKey::new(unique("warm")).unwrap(),
        Duration::from_secs(5),
    )
    .await;
    b.release(&warm).await.unwrap();
    let g = b.try_acquire(req()).await.unwrap().granted().unwrap();
    proxy.set_latency(Duration::from_millis(800));
    let e = b.release(&g).await.expect_err("no answer within 300 ms");
    assert!(e.is_unknown_outcome(), "{e}");
    // The release waits in the network; new connections are fast again.
    proxy.heal();
    let again = b.try_acquire(req()).await.unwrap().granted().unwrap();
    assert!(again.fence() > g.fence(), "a new term");
    assert!(matches!(b.renew(&g, None).await.unwrap(), Renewal::Lost));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(again.may_write());
    let stranger = other
        .try_acquire(other.request(key.clone(), HolderId::random()))
        .await
        .unwrap();
    assert!(
        matches!(stranger, Acquire::Held(_)),
        "a second holder while the first may write: {stranger:?}"
    );
    b.release(&again).await.unwrap();
    assert!(other.read(&key).await.unwrap().is_free());
}
