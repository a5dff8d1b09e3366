//! The statement cache (`PostgresConfig::statement_cache`): the shared
//! suite and the fault runs with it on, and a connection whose prepared
//! statements went stale replaced rather than failing every later call.

use std::time::Duration;

use lease_core::{Error, HolderId, LeaseBackend, LeaseKey};
use tokio_postgres::error::SqlState;

use crate::common::{admin, backend, fresh_config, unique, url};

/// The shared conformance suite with the statement cache on.
mod suite {
    use crate::common::PostgresHarness;
    use lease_conformance::conformance_tests;

    conformance_tests!(postgres_statement_cache, async {
        PostgresHarness::shared()
            .await
            .map(PostgresHarness::with_statement_cache)
    });
}

/// The fault runs with the statement cache on.
mod fault_runs {
    use crate::common::{or_panic, PostgresHarness};

    lease_conformance::fault_tests!(
        async { or_panic(PostgresHarness::shared().await).with_statement_cache() },
        async { or_panic(PostgresHarness::private().await).with_statement_cache() },
        PostgresHarness::FAULT_TUNING
    );
}

#[tokio::test]
async fn a_connection_with_stale_statements_is_replaced() {
    let url = url();
    // One pooled connection: the one whose statements go stale is the one
    // the next call would get back.
    let config = fresh_config().statement_cache(true).pool_size(1);
    let b = backend(&url, &config).await;
    let key = LeaseKey::new(unique("s")).unwrap();
    let me = HolderId::random();
    let request = || {
        b.request(key.clone(), me.clone())
            .ttl(Duration::from_secs(60))
    };
    let g = b.try_acquire(request()).await.unwrap().granted().unwrap();
    b.read(&key).await.unwrap();
    // The answer's `holder` column changes type: the server refuses to run
    // the statements prepared before as they were prepared.
    admin(&url)
        .await
        .batch_execute(&format!(
            "ALTER TABLE {} ALTER COLUMN holder TYPE varchar",
            config.table
        ))
        .await
        .unwrap();
    match b.read(&key).await {
        Err(Error::Backend(e)) => {
            let code = e
                .downcast_ref::<tokio_postgres::Error>()
                .and_then(tokio_postgres::Error::code);
            assert_eq!(code, Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e:?}");
        }
        other => panic!("a stale statement ran: {other:?}"),
    }
    // The next call prepares afresh on a new connection.
    let state = b.read(&key).await.expect("read after the change");
    assert_eq!(state.holding().map(|h| &h.holder), Some(&me));
    let again = b.try_acquire(request()).await.unwrap().granted().unwrap();
    assert_eq!(again.fence(), g.fence());
    b.release(&again).await.unwrap();
    assert!(b.read(&key).await.unwrap().is_free());
}
