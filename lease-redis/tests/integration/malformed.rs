//! Bad input and corrupt values: refused before anything is sent, or
//! reported as `CorruptRecord` with every key left byte-identical (value
//! and expiry) until a break replaces them.

use std::time::{Duration, Instant};

use lease_core::audit::AuditRecord;
use lease_core::{
    Acquire, BreakNote, Error, Fence, Grant, HolderId, LeaseBackend, LeaseKey, Version,
};
use lease_redis::{RedisBackend, RedisConfig};
use redis::aio::MultiplexedConnection;

use crate::common::{admin, backend, fresh_config, snapshot, unique, url};

#[tokio::test]
async fn bad_prefixes_timings_and_urls_are_refused_before_connecting() {
    let url = url();
    for bad in ["", "a b", "x{y}", "é"] {
        let e = RedisBackend::connect(&url, RedisConfig::new(bad))
            .await
            .expect_err("a bad prefix is refused");
        assert!(e.to_string().contains("key prefix"), "{bad:?}: {e}");
    }
    let e = RedisBackend::connect(&url, fresh_config().request_timeout(Duration::ZERO))
        .await
        .expect_err("zero timeout");
    assert!(matches!(e, Error::InvalidTiming { .. }), "{e}");
    for bad in [
        "redis://h:port",
        "http://h",
        "redis://h/x",
        "redis://h?prefix=a",
    ] {
        let e = RedisBackend::connect(bad, fresh_config())
            .await
            .expect_err("bad URL");
        assert!(matches!(e, Error::Backend(_)), "{bad}: {e}");
    }
}

#[tokio::test]
async fn ttls_out_of_range_are_refused_and_short_ones_rounded_up() {
    let url = url();
    let b = backend(&url, &fresh_config()).await;
    let key = LeaseKey::new(unique("k")).unwrap();
    let e = b
        .try_acquire(
            b.request(key.clone(), HolderId::random())
                .ttl(Duration::from_secs(2 * 86_400)),
        )
        .await
        .expect_err("too long");
    assert!(matches!(e, Error::InvalidTtl { .. }), "{e}");
    assert!(b.read(&key).await.unwrap().is_free(), "nothing was written");
    let g = b
        .try_acquire(
            b.request(key, HolderId::random())
                .ttl(Duration::from_millis(10)),
        )
        .await
        .unwrap()
        .granted()
        .expect("granted");
    assert_eq!(g.ttl(), Duration::from_secs(1));
}

async fn raw(conn: &mut MultiplexedConnection, args: &[&[u8]]) {
    let mut c = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async::<redis::Value>(conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// What each key of a lease holds, to compare before and after.
async fn snapshots(
    conn: &mut MultiplexedConnection,
    config: &RedisConfig,
    key: &LeaseKey,
) -> Vec<(Option<Vec<u8>>, i64)> {
    let mut out = Vec::new();
    for name in [
        config.lease_key(key),
        config.counter_key(key),
        config.audit_key(key),
    ] {
        out.push(snapshot(conn, &name).await);
    }
    out
}

fn corrupt<T: std::fmt::Debug>(what: &str, op: &str, r: Result<T, Error>) {
    match r {
        Err(Error::CorruptRecord { detail, .. }) => {
            assert!(detail.contains("break the lease"), "{what}: {op}: {detail}")
        }
        other => panic!("{what}: {op}: expected CorruptRecord, got {other:?}"),
    }
}

#[tokio::test]
async fn corrupt_values_are_errors_for_every_operation_and_stay_byte_identical() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let big = format!("lease-redis/1\nh\n5\n10000\n{}", "x".repeat(70_000));
    // Each wrong in one way; `counter` says which key gets it.
    let cases: Vec<(&str, bool, Vec<Vec<u8>>)> = vec![
        (
            "junk",
            false,
            vec![
                b"SET".to_vec(),
                b"not a lease".to_vec(),
                b"PX".to_vec(),
                b"60000".to_vec(),
            ],
        ),
        (
            "fence 0",
            false,
            vec![
                b"SET".to_vec(),
                b"lease-redis/1\nh\n0\n10000\n".to_vec(),
                b"PX".to_vec(),
                b"9000".to_vec(),
            ],
        ),
        (
            "fence with a leading zero",
            false,
            vec![
                b"SET".to_vec(),
                b"lease-redis/1\nh\n07\n10000\n".to_vec(),
                b"PX".to_vec(),
                b"9000".to_vec(),
            ],
        ),
        (
            "fence past 2^53",
            false,
            vec![
                b"SET".to_vec(),
                b"lease-redis/1\nh\n9007199254740992\n10000\n".to_vec(),
                b"PX".to_vec(),
                b"9000".to_vec(),
            ],
        ),
        (
            "TTL below the minimum",
            false,
            vec![
                b"SET".to_vec(),
                b"lease-redis/1\nh\n5\n5\n".to_vec(),
                b"PX".to_vec(),
                b"9000".to_vec(),
            ],
        ),
        (
            "holder with a space",
            false,
            vec![
                b"SET".to_vec(),
                b"lease-redis/1\na b\n5\n10000\n".to_vec(),
                b"PX".to_vec(),
                b"9000".to_vec(),
            ],
        ),
        (
            "no expiry",
            false,
            vec![b"SET".to_vec(), b"lease-redis/1\nh\n5\n10000\n".to_vec()],
        ),
        (
            "expiry a century away",
            false,
            vec![
                b"SET".to_vec(),
                b"lease-redis/1\nh\n5\n10000\n".to_vec(),
                b"EX".to_vec(),
                b"3153600000".to_vec(),
            ],
        ),
        (
            "payload too long",
            false,
            vec![
                b"SET".to_vec(),
                big.into_bytes(),
                b"PX".to_vec(),
                b"9000".to_vec(),
            ],
        ),
        (
            "a hash",
            false,
            vec![b"HSET".to_vec(), b"f".to_vec(), b"v".to_vec()],
        ),
        (
            "counter not a number",
            true,
            vec![b"SET".to_vec(), b"twelve".to_vec()],
        ),
        ("counter 0", true, vec![b"SET".to_vec(), b"0".to_vec()]),
        (
            "counter negative",
            true,
            vec![b"SET".to_vec(), b"-5".to_vec()],
        ),
        (
            "counter a list",
            true,
            vec![b"RPUSH".to_vec(), b"1".to_vec()],
        ),
    ];
    for (what, on_counter, command) in cases {
        let key = LeaseKey::new(unique("corrupt")).unwrap();
        let target = if on_counter {
            config.counter_key(&key)
        } else {
            config.lease_key(&key)
        };
        let mut args: Vec<&[u8]> = vec![&command[0], target.as_bytes()];
        args.extend(command[1..].iter().map(Vec::as_slice));
        raw(&mut admin, &args).await;
        let before = snapshots(&mut admin, &config, &key).await;
        let me = HolderId::new("h").unwrap();
        let grant = Grant::new(
            key.clone(),
            me.clone(),
            Fence(5),
            Duration::from_secs(10),
            Instant::now(),
            Version::new("5"),
        );
        corrupt(what, "read", b.read(&key).await);
        corrupt(
            what,
            "acquire by another",
            b.try_acquire(b.request(key.clone(), HolderId::random()))
                .await,
        );
        corrupt(
            what,
            "acquire by its holder",
            b.try_acquire(b.request(key.clone(), me.clone())).await,
        );
        corrupt(what, "renew", b.renew(&grant, None).await);
        corrupt(what, "release", b.release(&grant).await);
        assert_eq!(
            snapshots(&mut admin, &config, &key).await,
            before,
            "{what}: changed"
        );

        // A break replaces it, keeps what it was in the audit record, and
        // the key can be taken again, with a fence above the clock's.
        let broken = b
            .break_lease(&key, &BreakNote::new("ops", what))
            .await
            .unwrap_or_else(|e| panic!("{what}: break {e}"));
        assert!(broken.previous.is_none(), "{what}");
        let record: Vec<u8> = redis::cmd("LINDEX")
            .arg(config.audit_key(&key))
            .arg(-1)
            .query_async(&mut admin)
            .await
            .unwrap();
        let record = AuditRecord::from_json(&record, "lease-redis-audit/1", &key)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(record.removed_corrupt_record, "{what}");
        assert!(record.removed.as_ref().is_some_and(|r| r.len > 0), "{what}");
        let Acquire::Granted(next) = b.try_acquire(b.request(key.clone(), me)).await.unwrap()
        else {
            panic!("{what}: the key is not free after the break");
        };
        assert!(
            next.fence().get() > 1_700_000_000_000_000,
            "{what}: {}",
            next.fence()
        );
    }
}

/// An audit key that is not a list stops a break before it changes
/// anything (a Redis script keeps the writes it made before an error), and
/// `last_break` reports it.
#[tokio::test]
async fn a_corrupt_audit_key_stops_a_break_before_it_writes() {
    let url = url();
    let config = fresh_config();
    let b = backend(&url, &config).await;
    let mut admin = admin(&url).await.unwrap();
    let key = LeaseKey::new(unique("audit")).unwrap();
    let g = b
        .try_acquire(b.request(key.clone(), HolderId::random()))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let audit = config.audit_key(&key);
    raw(&mut admin, &[b"SET", audit.as_bytes(), b"not a list"]).await;
    let before = snapshots(&mut admin, &config, &key).await;
    for (op, r) in [
        (
            "break",
            b.break_lease(&key, &BreakNote::new("ops", "x"))
                .await
                .map(|_| ()),
        ),
        ("last break", b.last_break(&key).await.map(|_| ())),
    ] {
        match r {
            Err(Error::CorruptRecord { detail, .. }) => {
                assert!(detail.contains("audit key"), "{op}: {detail}")
            }
            other => panic!("{op}: expected CorruptRecord, got {other:?}"),
        }
    }
    assert_eq!(snapshots(&mut admin, &config, &key).await, before);
    assert_eq!(
        b.read(&key).await.unwrap().holding().map(|h| h.fence),
        Some(g.fence()),
        "the grant lives on"
    );
    // A list holding something else than audit records.
    raw(&mut admin, &[b"DEL", audit.as_bytes()]).await;
    raw(
        &mut admin,
        &[b"RPUSH", audit.as_bytes(), b"{\"action\":\"other\"}"],
    )
    .await;
    assert!(matches!(
        b.last_break(&key).await,
        Err(Error::CorruptRecord { .. })
    ));
}

#[tokio::test]
async fn oversize_payloads_are_refused_before_sending() {
    let url = url();
    let b = backend(&url, &fresh_config()).await;
    let e =
        lease_core::Payload::new(vec![0; lease_core::MAX_PAYLOAD_LEN + 1]).expect_err("too large");
    assert!(matches!(e, Error::PayloadTooLarge { .. }));
    // The largest one round-trips, every byte value in it.
    let key = LeaseKey::new(unique("payload")).unwrap();
    let bytes: Vec<u8> = (0..lease_core::MAX_PAYLOAD_LEN)
        .map(|i| (i % 256) as u8)
        .collect();
    let payload = lease_core::Payload::new(bytes.clone()).unwrap();
    let _held = b
        .try_acquire(b.request(key.clone(), HolderId::random()).payload(payload))
        .await
        .unwrap()
        .granted()
        .unwrap();
    let state = b.read(&key).await.unwrap();
    assert_eq!(state.holding().unwrap().payload.as_bytes(), &bytes[..]);
}
