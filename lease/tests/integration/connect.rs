//! `lease::connect` without a server: the in-memory fake, the errors of a
//! URL whose backend is left out of the build, and what `Debug` shows.

use lease::{BackendKind, BackendUrl, ConnectError};

/// A URL of every backend, valid but for nothing that listens.
const URLS: &[(&str, BackendKind)] = &[
    ("etcd://127.0.0.1:9/x", BackendKind::Etcd),
    ("nats://127.0.0.1:9/x", BackendKind::Nats),
    ("mongodb://127.0.0.1:9/x", BackendKind::Mongo),
    ("s3://bucket/x?endpoint=http://127.0.0.1:9", BackendKind::S3),
    ("memory://", BackendKind::Memory),
    ("postgres://127.0.0.1:9/x", BackendKind::Postgres),
    ("redis://127.0.0.1:9/0", BackendKind::Redis),
];

#[cfg(feature = "fake")]
#[tokio::test]
async fn memory_urls_get_a_fresh_fake_each() -> Result<(), Box<dyn std::error::Error>> {
    use lease::LeaseKey;
    use std::time::Duration;
    const TTL: Duration = Duration::from_secs(10);

    let one = lease::connect("memory://").await?;
    assert_eq!(one.kind(), BackendKind::Memory);
    let key = LeaseKey::new("jobs/nightly")?;
    let lease = one
        .keeper()
        .acquire(&key)
        .ttl(TTL)
        .wait(Duration::ZERO)
        .await?;
    assert!(lease.may_write());
    // The same connection is one store: the key is taken.
    assert!(matches!(
        one.keeper().try_acquire(&key).ttl(TTL).await,
        Err(lease::AcquireError::Held { .. })
    ));
    // Another connect is another store: the key is free there.
    let two = lease::connect("memory://").await?;
    let other = two.keeper().try_acquire(&key).ttl(TTL).await?;
    assert!(other.may_write());
    let fence = lease.fence();
    lease.release().await?;
    let again = one
        .keeper()
        .acquire(&key)
        .ttl(TTL)
        .wait(Duration::from_secs(1))
        .await?;
    assert!(again.fence() > fence);
    again.release().await?;
    // The raw contract is there too.
    assert!(one.backend().read(&key).await?.holding().is_none());
    one.shutdown().await;
    two.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_backend_left_out_is_an_error_naming_its_feature() {
    let mut checked = 0;
    for (url, kind) in URLS {
        if kind.is_enabled() {
            continue;
        }
        checked += 1;
        let e = lease::connect(url).await.expect_err("left out");
        assert!(
            matches!(e, ConnectError::FeatureDisabled { kind: k } if k == *kind),
            "{url}: {e:?}"
        );
        assert!(e.is_usage());
        let message = e.to_string();
        assert!(
            message.contains(&format!("`{}` feature", kind.feature())),
            "{url}: {message}"
        );
        assert!(
            message.contains(&format!("features = [\"{}\"]", kind.feature())),
            "{message}"
        );
        // It still parses: only connecting needs the feature.
        assert_eq!(BackendUrl::parse(url).map(|u| u.kind()).ok(), Some(*kind));
    }
    let off = [
        cfg!(feature = "etcd"),
        cfg!(feature = "nats"),
        cfg!(feature = "mongo"),
        cfg!(feature = "s3"),
        cfg!(feature = "fake"),
        cfg!(feature = "postgres"),
        cfg!(feature = "redis"),
    ]
    .iter()
    .filter(|on| !**on)
    .count();
    assert_eq!(checked, off);
}

#[cfg(not(feature = "etcd"))]
#[tokio::test]
async fn etcd_without_its_feature() {
    let e = lease::connect("etcd://127.0.0.1:2379/ops")
        .await
        .expect_err("left out");
    assert!(e.to_string().contains("`etcd` feature"), "{e}");
}

#[cfg(not(feature = "fake"))]
#[tokio::test]
async fn memory_without_the_fake() {
    let e = lease::connect("memory://").await.expect_err("left out");
    assert!(e.to_string().contains("`fake` feature"), "{e}");
}

#[tokio::test]
async fn bad_urls_and_options_are_usage_errors() {
    let e = lease::connect("zookeeper://h:2181/x")
        .await
        .expect_err("refused");
    assert!(
        matches!(e, ConnectError::BadUrl { .. }) && e.is_usage(),
        "{e:?}"
    );
    // A usage error still converts into the contract's error.
    let core: lease::Error = e.into();
    assert!(core.to_string().contains("unknown scheme"), "{core}");
    if BackendKind::Memory.is_enabled() {
        let e = lease::Connect::new("memory://")
            .nats_token("t")
            .connect()
            .await
            .expect_err("refused");
        assert!(matches!(e, ConnectError::BadOptions { .. }), "{e:?}");
    }
}

#[cfg(feature = "fake")]
#[tokio::test]
async fn debug_shows_no_secrets() -> Result<(), ConnectError> {
    let connection = lease::connect("memory://").await?;
    let shown = format!("{connection:?}");
    assert!(shown.contains("memory"), "{shown}");
    let url = BackendUrl::parse("mongodb://app:hunter2@db-1:27017/ops")?;
    assert!(!format!("{url:?} {url}").contains("hunter2"));
    Ok(())
}
