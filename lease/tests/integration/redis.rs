//! `lease::connect` on a real Redis (the test kit's shared server, or the
//! one `LEASE_TEST_REDIS_URL` names).
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use lease::{BackendKind, ConnectError, Error, LeaseKey};

/// The test server's URL, `None` when it may be skipped.
fn redis_url() -> Option<String> {
    match lease_testkit::servers::redis() {
        Ok(r) => Some(r.url.clone()),
        Err(e) if lease_testkit::skip_allowed("redis") => {
            eprintln!("SKIPPED (redis in LEASE_TEST_SKIP): {e}");
            None
        }
        Err(e) => panic!("{e} (run `cargo xtask provision`, or set LEASE_TEST_SKIP=redis)"),
    }
}

/// A lease taken through a `redis://` URL is seen by a second connection,
/// released, and taken again with a higher fence; the URL's `prefix`
/// reaches the backend (under another prefix the key is free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_acquire_release_on_redis() -> Result<(), Box<dyn std::error::Error>> {
    let Some(server) = redis_url() else {
        return Ok(());
    };
    let prefix = format!("facade-{}:", std::process::id());
    let sep = if server.contains('?') { '&' } else { '?' };
    let url = format!("{server}{sep}prefix={prefix}");
    let connection = lease::Connect::new(&url)
        .timeout(Duration::from_secs(5))
        .connect()
        .await?;
    assert_eq!(connection.kind(), BackendKind::Redis);
    assert!(connection.backend().capabilities().watch);
    let key = LeaseKey::new("connect/redis")?;
    let lease = connection
        .keeper()
        .acquire(&key)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .await?;
    let fence = lease.fence();
    let other = lease::connect(&url).await?;
    let state = other.backend().read(&key).await?;
    assert_eq!(state.holding().map(|h| h.fence), Some(fence));
    // Under another prefix the key is another lease: free.
    let elsewhere = lease::connect(&format!("{server}{sep}prefix=facade-other:")).await?;
    assert!(elsewhere.backend().read(&key).await?.holding().is_none());
    lease.release().await?;
    assert!(other.backend().read(&key).await?.holding().is_none());
    let again = other
        .keeper()
        .acquire(&key)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .await?;
    assert!(again.fence() > fence);
    again.release().await?;
    connection.shutdown().await;
    other.shutdown().await;
    elsewhere.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn an_unreachable_redis_is_a_backend_error_within_the_timeout() {
    let started = Instant::now();
    let e = lease::Connect::new("redis://127.0.0.1:9/0")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect_err("nothing listens on port 9");
    assert!(!e.is_usage(), "{e:?}");
    assert!(
        matches!(e, ConnectError::Backend(Error::Unavailable { .. })),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn tls_options_for_redis() {
    let e = lease::Connect::new("rediss://127.0.0.1:9/0")
        .ca_file("/nonexistent/ca.pem")
        .connect()
        .await
        .expect_err("no such file");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    let e = lease::Connect::new("redis://127.0.0.1:9/0")
        .identity_files("me.pem", "me-key.pem")
        .connect()
        .await
        .expect_err("no client certificate for Redis");
    assert!(matches!(e, ConnectError::BadOptions { .. }), "{e:?}");
    assert!(e.to_string().contains("no client certificate"), "{e}");
}

/// TLS to a TLS-only Redis: `rediss://` with the CA, and a CA given for a
/// `redis://` URL (which turns TLS on); without the CA the system's roots
/// do not vouch for the test CA, and connecting fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_redis_with_the_ca() -> Result<(), Box<dyn std::error::Error>> {
    use lease_testkit::servers::{pki::Pki, RedisOptions};
    let pki = Pki::new("lease-facade-redis")?;
    let leaf = pki.leaf("redis", true)?;
    let server = match RedisOptions::new()
        .tls(&leaf.cert_pem, &leaf.key_pem)
        .spawn()
    {
        Ok(s) => s,
        Err(e) if lease_testkit::skip_allowed("redis") => {
            eprintln!("SKIPPED (redis in LEASE_TEST_SKIP): {e}");
            return Ok(());
        }
        Err(e) => panic!("{e} (run `cargo xtask provision`, or set LEASE_TEST_SKIP=redis)"),
    };
    assert!(server.url.starts_with("rediss://"), "{}", server.url);
    let plain = server.url.replacen("rediss://", "redis://", 1);
    let key = LeaseKey::new("connect/redis-tls")?;
    for url in [&server.url, &plain] {
        let connection = lease::Connect::new(url)
            .ca_pem(pki.ca_pem())
            .timeout(Duration::from_secs(5))
            .connect()
            .await?;
        let lease = connection
            .keeper()
            .acquire(&key)
            .ttl(Duration::from_secs(5))
            .wait(Duration::from_secs(10))
            .await?;
        lease.release().await?;
        connection.shutdown().await;
    }
    let e = lease::Connect::new(&server.url)
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect_err("the system's roots do not vouch for the test CA");
    assert!(!e.is_usage(), "{e:?}");
    Ok(())
}
