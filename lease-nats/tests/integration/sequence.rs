//! The stream sequence is the fence: what keeps it rising when the bucket's
//! stream empties, when the server is killed, when its data is rewound, and
//! when the bucket is missing or kept in memory.

use crate::common;

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream::StorageType};
use lease_core::{Acquire, AcquireRequest, Error, Grant, HolderId, LeaseBackend, LeaseKey};
use lease_nats::{NatsBackend, NatsConfig};

const SEC: Duration = Duration::from_secs(1);

fn key(name: &str) -> LeaseKey {
    LeaseKey::new(format!("sq/{}/{name}", HolderId::random())).unwrap()
}

fn config(bucket: &str) -> NatsConfig {
    NatsConfig::new(bucket).marker_ttl(SEC).create_bucket(true)
}

async fn grant(b: &NatsBackend, key: &LeaseKey, ttl: Duration) -> Grant {
    let req = AcquireRequest::new(key.clone(), HolderId::random()).ttl(ttl);
    match b.try_acquire(req).await.expect("acquire") {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => panic!("{key} unexpectedly held by {}", h.holder),
    }
}

/// Messages and last sequence of the bucket's stream, asked directly.
async fn stream_state(url: &str, bucket: &str) -> (u64, u64) {
    let client = async_nats::connect(url).await.unwrap();
    let js = jetstream::new(client);
    let mut stream = js.get_stream(format!("KV_{bucket}")).await.unwrap();
    let info = stream.info().await.unwrap();
    (info.state.messages, info.state.last_sequence)
}

/// Waits until the stream holds at most `messages` messages (TTLs and marker
/// TTLs running out); returns its state then.
async fn until_at_most(url: &str, bucket: &str, messages: u64, within: Duration) -> (u64, u64) {
    let start = Instant::now();
    loop {
        let state = stream_state(url, bucket).await;
        if state.0 <= messages {
            return state;
        }
        assert!(
            start.elapsed() < within,
            "stream of {bucket} still holds {} messages after {within:?}",
            state.0
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Grants, releases and expiries, so that every kind of message the library
/// writes is in the stream; returns the highest fence given.
async fn churn(b: &NatsBackend) -> u64 {
    let mut max = 0;
    for i in 0..3 {
        // A 1 s grant: its release marker lives 1 s too.
        let g = grant(b, &key(&format!("released-{i}")), SEC).await;
        max = max.max(g.fence().get());
        b.release(&g).await.unwrap();
        let g = grant(b, &key(&format!("expired-{i}")), SEC).await;
        max = max.max(g.fence().get());
    }
    max
}

/// nats-server has lost an empty stream's last sequence on restart before.
/// Here every lease message has expired and the stream is emptied completely
/// (its anchor removed too, as an operator might), then the server is killed
/// with SIGKILL and restarted: the next fence must still be above every
/// earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_after_kill_9_of_an_emptied_stream() {
    let dir = common::temp_dir("empty-kill").unwrap();
    let mut server = common::Server::single(&dir).unwrap();
    let url = server.url();
    let bucket = "empty-kill";
    let b = NatsBackend::connect(&url, config(bucket)).await.unwrap();
    let max_before = churn(&b).await;
    drop(b);
    // Grants expire after 1 s, markers 1 s later.
    until_at_most(&url, bucket, 1, SEC * 10).await;
    // Remove whatever is left (the anchor, where there is one).
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client);
    js.get_stream(format!("KV_{bucket}"))
        .await
        .unwrap()
        .purge()
        .await
        .unwrap();
    let (messages, last_before) = stream_state(&url, bucket).await;
    assert_eq!(messages, 0, "the stream is not empty");
    eprintln!("empty stream, last sequence {last_before}, highest fence {max_before}");

    server.kill();
    server.start().unwrap();
    let (_, last_after) = stream_state(&url, bucket).await;
    eprintln!("after kill -9 and restart: last sequence {last_after}");
    let b = NatsBackend::connect(&url, config(bucket)).await.unwrap();
    let g = grant(&b, &key("after"), SEC).await;
    assert!(
        g.fence().get() > max_before,
        "fence {} after a kill -9 of an empty stream is not above {max_before}",
        g.fence()
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bucket's stream never becomes empty, however long every lease has been
/// released or expired: a permanent anchor message stays, so the server never
/// has to recover the sequence of an empty stream. With the anchor in place a
/// kill -9 and restart keeps the fences rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_keeps_an_anchor_when_every_lease_has_expired() {
    let dir = common::temp_dir("anchor").unwrap();
    let mut server = common::Server::single(&dir).unwrap();
    let url = server.url();
    let bucket = "anchor";
    let b = NatsBackend::connect(&url, config(bucket)).await.unwrap();
    let max_before = churn(&b).await;
    // Every grant's TTL, then every marker's TTL, runs out; wait well beyond.
    tokio::time::sleep(SEC * 4 + common::EXPIRY_SLACK).await;
    let (messages, last) = stream_state(&url, bucket).await;
    eprintln!("after every TTL: {messages} message(s), last sequence {last}");
    assert!(
        messages >= 1,
        "the stream emptied once every lease expired (last sequence {last})"
    );
    drop(b);
    server.kill();
    server.start().unwrap();
    let b = NatsBackend::connect(&url, config(bucket)).await.unwrap();
    let g = grant(&b, &key("after"), SEC).await;
    assert!(g.fence().get() > max_before);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A restore from an older copy of the server's data rewinds the stream
/// sequence (as nats-server losing it would). A client that saw higher
/// sequences before must not hand out a fence at or below them: it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewound_stream_gives_no_lower_fence_to_a_running_client() {
    let dir = common::temp_dir("rewind").unwrap();
    let mut server = common::Server::single(&dir).unwrap();
    let url = server.url();
    let bucket = "rewind";
    let b = NatsBackend::connect(&url, config(bucket)).await.unwrap();
    let _ = grant(&b, &key("old"), SEC * 60).await;
    server.stop();
    let backup = dir.join("backup");
    copy_dir(&server.store, &backup);
    server.start().unwrap();
    let mut max_before = 0;
    for i in 0..5 {
        let g = grant_retrying(&b, &key(&format!("new-{i}"))).await;
        max_before = max_before.max(g.fence().get());
    }
    server.stop();
    std::fs::remove_dir_all(&server.store).unwrap();
    copy_dir(&backup, &server.store);
    server.start().unwrap();
    let (_, last) = stream_state(&url, bucket).await;
    eprintln!("restored: last sequence {last}, highest fence before {max_before}");
    assert!(last < max_before, "the restore did not rewind the stream");
    // The running client reconnects to the rewound server.
    let k = key("after-rewind");
    let start = Instant::now();
    let outcome = loop {
        let req = AcquireRequest::new(k.clone(), HolderId::random()).ttl(SEC * 5);
        match b.try_acquire(req).await {
            Err(e) if e.is_unknown_outcome() && start.elapsed() < SEC * 10 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other,
        }
    };
    match outcome {
        Ok(Acquire::Granted(g)) => assert!(
            g.fence().get() > max_before,
            "granted fence {} after a rewind, not above the {max_before} given before",
            g.fence()
        ),
        Ok(Acquire::Held(h)) => panic!("fresh key held by {}", h.holder),
        Err(e) => {
            eprintln!("refused: {e}");
            assert!(e.to_string().contains("backwards"), "{e}");
            // Nothing of the refused attempt stays behind to block the key.
            assert!(b.read(&k).await.unwrap().is_free());
        }
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn grant_retrying(b: &NatsBackend, k: &LeaseKey) -> Grant {
    let start = Instant::now();
    loop {
        let req = AcquireRequest::new(k.clone(), HolderId::random()).ttl(SEC * 60);
        match b.try_acquire(req).await {
            Ok(Acquire::Granted(g)) => return g,
            Err(e) if e.is_unknown_outcome() && start.elapsed() < SEC * 10 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("acquire of {k}: {other:?}"),
        }
    }
}

/// A bucket kept in memory restarts its sequence (hence fences) with the
/// server: refused at connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bucket_is_refused() {
    let url = common::shared_url().await.unwrap_or_else(|e| panic!("{e}"));
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client);
    let bucket = format!("mem-{}", &HolderId::random().as_str()[..8]);
    js.create_key_value(jetstream::kv::Config {
        bucket: bucket.clone(),
        history: 1,
        storage: StorageType::Memory,
        limit_markers: Some(SEC * 60),
        ..Default::default()
    })
    .await
    .unwrap();
    let result = NatsBackend::connect(&url, NatsConfig::new(bucket.as_str())).await;
    let _ = js.delete_key_value(&bucket).await;
    let err = match result {
        Ok(_) => panic!("a memory bucket was accepted"),
        Err(e) => e.to_string(),
    };
    eprintln!("{err}");
    assert!(err.contains("memory") && err.contains(&bucket), "{err}");
}

/// A bucket that is missing (never made, or deleted with every fence in it)
/// is an error: creating it silently would restart fences at 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_an_error() {
    let url = common::shared_url().await.unwrap_or_else(|e| panic!("{e}"));
    let bucket = format!("missing-{}", &HolderId::random().as_str()[..8]);
    let result = NatsBackend::connect(&url, NatsConfig::new(bucket.as_str())).await;
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client);
    let created = js.get_key_value(bucket.as_str()).await.is_ok();
    let _ = js.delete_key_value(&bucket).await;
    match result {
        Ok(_) => panic!("connect created the missing bucket {bucket} (created: {created})"),
        Err(e) => {
            eprintln!("{e}");
            assert!(!created, "the bucket was created despite the error");
            assert!(matches!(e, Error::Backend(_)), "{e:?}");
            assert!(e.to_string().contains(&bucket), "{e}");
        }
    }
    // Asked for, it is created (with its anchor).
    let b = NatsBackend::connect(&url, NatsConfig::new(bucket.as_str()).create_bucket(true))
        .await
        .unwrap();
    let k = key("created");
    let _ = grant(&b, &k, SEC).await;
    let (messages, _) = stream_state(&url, &bucket).await;
    let _ = js.delete_key_value(&bucket).await;
    assert_eq!(messages, 2, "the anchor and the grant");
}

/// The last message on the anchor's subject, if any, and whether it is a
/// tombstone.
async fn anchor(url: &str, bucket: &str) -> Option<(u64, bool)> {
    let client = async_nats::connect(url).await.unwrap();
    let js = jetstream::new(client);
    let stream = js.get_stream(format!("KV_{bucket}")).await.unwrap();
    let subject = format!("$KV.{bucket}.{}", lease_nats::ANCHOR_KEY);
    let msg = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .ok()?;
    let tombstone = msg
        .headers
        .get("KV-Operation")
        .is_some_and(|op| op.as_str() != "PUT");
    Some((msg.sequence, tombstone))
}

/// An operator deleting the anchor as a key leaves a tombstone (the stream
/// stays non-empty); removing it from the stream empties the subject. Either
/// way the next connect writes it again, and fences keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anchor_removed_by_an_operator_comes_back_at_connect() {
    let url = common::shared_url().await.unwrap_or_else(|e| panic!("{e}"));
    let bucket = format!("anchor-{}", &HolderId::random().as_str()[..8]);
    let b = NatsBackend::connect(&url, config(&bucket)).await.unwrap();
    let (first, tomb) = anchor(&url, &bucket)
        .await
        .expect("no anchor after connect");
    assert!(!tomb);
    let g1 = grant(&b, &key("one"), SEC * 30).await;

    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client);
    let kv = js.get_key_value(bucket.as_str()).await.unwrap();
    kv.delete(lease_nats::ANCHOR_KEY).await.unwrap();
    assert!(matches!(anchor(&url, &bucket).await, Some((_, true))));
    NatsBackend::connect(&url, config(&bucket)).await.unwrap();
    let (second, tomb) = anchor(&url, &bucket).await.expect("anchor");
    assert!(!tomb, "the anchor's tombstone was not replaced");
    assert!(second > first);

    js.get_stream(format!("KV_{bucket}"))
        .await
        .unwrap()
        .purge()
        .filter(format!("$KV.{bucket}.{}", lease_nats::ANCHOR_KEY))
        .await
        .unwrap();
    assert!(anchor(&url, &bucket).await.is_none());
    let b = NatsBackend::connect(&url, config(&bucket)).await.unwrap();
    assert!(matches!(anchor(&url, &bucket).await, Some((_, false))));
    let g2 = grant(&b, &key("two"), SEC).await;
    assert!(g2.fence() > g1.fence());
    let _ = js.delete_key_value(&bucket).await;
}

/// After a SIGKILL, nats-server 2.15.1 brings back messages removed from the
/// stream's last block since its index was last written, then removes again
/// those whose TTL has passed. A released (or broken) grant's record is
/// removed by the release's purge marker: if that marker's TTL ran out while
/// the record's had not, the released grant would come back to life — held by
/// a holder that let it go, and re-acquired by it with its old fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_grant_stays_released_after_kill_9() {
    let dir = common::temp_dir("released-kill").unwrap();
    let mut server = common::Server::single(&dir).unwrap();
    let url = server.url();
    let b = NatsBackend::connect(&url, config("released-kill"))
        .await
        .unwrap();
    // A live lease elsewhere: the stream is not empty (as in any busy bucket).
    let _ = grant(&b, &key("busy"), SEC * 60).await;
    let released = key("released");
    let a = HolderId::random();
    let req = AcquireRequest::new(released.clone(), a.clone()).ttl(SEC * 60);
    let g = match b.try_acquire(req.clone()).await.unwrap() {
        Acquire::Granted(g) => g,
        Acquire::Held(h) => panic!("held by {}", h.holder),
    };
    b.release(&g).await.unwrap();
    let broken = key("broken");
    let gb = grant(&b, &broken, SEC * 60).await;
    let note = lease_core::BreakNote::new("test", "kill -9 test").with_at_unix_ms(1);
    b.break_lease(&broken, &note).await.unwrap();
    // The markers' own TTL (1 s) runs out; the grants' 60 s do not.
    tokio::time::sleep(SEC * 3).await;
    drop(b);
    server.kill();
    server.start().unwrap();
    let b = NatsBackend::connect(&url, config("released-kill"))
        .await
        .unwrap();
    for (k, fence) in [(&released, g.fence()), (&broken, gb.fence())] {
        match b.read(k).await.unwrap() {
            lease_core::LeaseState::Free => {}
            lease_core::LeaseState::Held(h) => panic!(
                "{k} came back held by {} with fence {} (released/broken fence {fence}) after a kill -9",
                h.holder, h.fence
            ),
        }
    }
    match b.try_acquire(req).await.unwrap() {
        Acquire::Granted(g2) => assert!(
            g2.fence() > g.fence(),
            "the releasing holder got fence {} again",
            g2.fence()
        ),
        Acquire::Held(h) => panic!("held by {}", h.holder),
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that may only read (a watcher, a status check) connects even when
/// the anchor is missing and it may not write it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_client_connects_without_writing_the_anchor() {
    let dir = common::temp_dir("read-only").unwrap();
    let conf = dir.join("server.conf");
    std::fs::write(
        &conf,
        r#"accounts: {
  A: {
    jetstream: enabled
    users: [
      { user: w, password: w }
      { user: r, password: r, permissions: { publish: { deny: ["$KV.>"] } } }
    ]
  }
}
"#,
    )
    .unwrap();
    let server =
        common::Server::single_with(&dir, &["-c".into(), conf.display().to_string()]).unwrap();
    let bucket = "read-only";
    let url = server.url();
    let login =
        |user: &str| async_nats::ConnectOptions::with_user_and_password(user.into(), user.into());
    let w = NatsBackend::connect_with_options(&url, login("w"), config(bucket))
        .await
        .unwrap();
    let k = key("held");
    let g = grant(&w, &k, SEC * 30).await;
    // The anchor removed from the stream, as an operator might.
    let js = jetstream::new(w.client().clone());
    js.get_stream(format!("KV_{bucket}"))
        .await
        .unwrap()
        .purge()
        .filter(format!("$KV.{bucket}.{}", lease_nats::ANCHOR_KEY))
        .await
        .unwrap();
    let read_only = config(bucket).request_timeout(Duration::from_millis(500));
    let r = match NatsBackend::connect_with_options(&url, login("r"), read_only).await {
        Ok(r) => r,
        Err(e) => panic!("a read-only client could not connect: {e}"),
    };
    match r.read(&k).await.unwrap() {
        lease_core::LeaseState::Held(h) => assert_eq!(h.fence, g.fence()),
        other => panic!("{other:?}"),
    }
    // A writer's connect writes the anchor again.
    NatsBackend::connect_with_options(&url, login("w"), config(bucket))
        .await
        .unwrap();
    let subject = format!("$KV.{bucket}.{}", lease_nats::ANCHOR_KEY);
    let stream = js.get_stream(format!("KV_{bucket}")).await.unwrap();
    assert!(stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .is_ok());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
