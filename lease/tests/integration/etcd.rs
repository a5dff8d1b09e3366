//! `lease::connect` on a real etcd (the test kit's shared server, or
//! the one `LEASE_TEST_ETCD_ENDPOINTS` names).
#![cfg(feature = "etcd")]

use std::time::{Duration, Instant};

use lease::{BackendKind, ConnectError, Error, LeaseKey};

/// The etcd URL of the test server, `None` when it may be skipped.
fn etcd_url(prefix: &str) -> Option<String> {
    match lease_testkit::servers::etcd() {
        Ok(s) => Some(format!(
            "etcd://{}/{prefix}",
            s.endpoints
                .iter()
                .map(|e| e.trim_start_matches("http://"))
                .collect::<Vec<_>>()
                .join(",")
        )),
        Err(e) if lease_testkit::skip_allowed("etcd") => {
            eprintln!("SKIPPED (etcd in LEASE_TEST_SKIP): {e}");
            None
        }
        Err(e) => panic!("{e} (run `cargo xtask provision`, or set LEASE_TEST_SKIP=etcd)"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_acquire_release_on_etcd() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = etcd_url("lease-facade-test") else {
        return Ok(());
    };
    let connection = lease::Connect::new(&url)
        .timeout(Duration::from_secs(5))
        .connect()
        .await?;
    assert_eq!(connection.kind(), BackendKind::Etcd);
    assert!(connection.backend().capabilities().watch);
    let key = LeaseKey::new(format!("connect/{}", std::process::id()))?;
    let keeper = connection.keeper();
    let lease = keeper
        .acquire(&key)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .await?;
    let fence = lease.fence();
    // A second connection sees the holder, with the same fence.
    let other = lease::connect(&url).await?;
    let state = other.backend().read(&key).await?;
    assert_eq!(state.holding().map(|h| h.fence), Some(fence));
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
    Ok(())
}

#[tokio::test]
async fn an_unreachable_etcd_is_a_backend_error_within_the_timeout() {
    let started = Instant::now();
    let e = lease::Connect::new("etcd://127.0.0.1:9/x")
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
async fn tls_to_etcd_needs_a_ca() {
    let e = lease::connect("etcds://127.0.0.1:9/x")
        .await
        .expect_err("no CA");
    assert!(matches!(e, ConnectError::BadOptions { .. }), "{e:?}");
    let e = lease::Connect::new("etcds://127.0.0.1:9/x")
        .ca_file("/nonexistent/ca.pem")
        .connect()
        .await
        .expect_err("no such file");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
}

/// Sessions are on by default and `?sessions=false` reaches the etcd
/// backend: a client with sessions does not spend a second request on a
/// refused holder's remaining time, a client without them reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_option_reaches_the_backend() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = etcd_url("lease-facade-sessions") else {
        return Ok(());
    };
    let with = url.clone();
    let holder = lease::connect(&with).await?;
    let key = LeaseKey::new(format!("sessions/{}", std::process::id()))?;
    let lease = holder
        .keeper()
        .acquire(&key)
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .await?;
    let req = || lease::AcquireRequest::new(key.clone(), lease::HolderId::random());
    let refused = |a: lease::Acquire| match a {
        lease::Acquire::Held(h) => h,
        lease::Acquire::Granted(g) => panic!("granted a held key: {g:?}"),
    };
    let by_session = refused(
        lease::connect(&with)
            .await?
            .backend()
            .try_acquire(req())
            .await?,
    );
    assert_eq!(by_session.fence, lease.fence());
    assert_eq!(by_session.remaining, None, "sessions are not on by default");
    let plain = refused(
        lease::connect(&format!("{url}?sessions=false"))
            .await?
            .backend()
            .try_acquire(req())
            .await?,
    );
    assert!(plain.remaining.is_some(), "{plain:?}");
    lease.release().await?;
    let e = lease::connect(&format!("{url}?sessions=maybe"))
        .await
        .expect_err("a bad sessions value");
    assert!(e.to_string().contains("sessions=true"), "{e}");
    Ok(())
}
