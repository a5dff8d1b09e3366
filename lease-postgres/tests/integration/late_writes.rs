//! Writes the server applies after their holder gave up on them.

use std::time::Duration;

use lease_core::{HolderId, LeaseBackend, LeaseKey, Renewal};

use crate::common::{admin, backend, fresh_config, unique, url};

/// A statement's `now()` is its start; one that waited for the row (a lock,
/// a stall) can land after the holder's next renewal, which had already
/// promised it a later deadline. Landing, a renewal or re-acquire of the
/// same grant must never move the stored expiry earlier — by the statements'
/// text or by their functions alike.
#[tokio::test]
async fn a_renewal_or_reacquire_landing_late_never_moves_the_expiry_earlier() {
    let url = url();
    let admin = admin(&url).await;
    for cache in [false, true] {
        let config = fresh_config().statement_cache(cache);
        let b = backend(&url, &config).await;
        let key = LeaseKey::new(unique("late")).unwrap();
        let holder = HolderId::random();
        let request = || {
            b.request(key.clone(), holder.clone())
                .ttl(Duration::from_secs(10))
        };
        let g = b.try_acquire(request()).await.unwrap().granted().unwrap();
        // A later write (started 5 s later) landed first.
        let later: f64 = admin
            .query_one(
                &format!(
                    "UPDATE {} SET expires_at = expires_at + interval '5 seconds' \
                     WHERE key = $1 RETURNING extract(epoch FROM expires_at)::float8",
                    config.table
                ),
                &[&key.as_str()],
            )
            .await
            .unwrap()
            .get(0);
        let stored = || async {
            let at: f64 = admin
                .query_one(
                    &format!(
                        "SELECT extract(epoch FROM expires_at)::float8 FROM {} WHERE key = $1",
                        config.table
                    ),
                    &[&key.as_str()],
                )
                .await
                .unwrap()
                .get(0);
            at
        };
        let renewed = b.renew(&g, None).await.unwrap();
        assert!(matches!(renewed, Renewal::Renewed(_)), "{renewed:?}");
        let after = stored().await;
        assert!(
            after >= later,
            "cache {cache}: the renewal moved the expiry from {later} to {after}"
        );
        let again = b.try_acquire(request()).await.unwrap().granted().unwrap();
        assert_eq!(again.fence(), g.fence());
        let after = stored().await;
        assert!(
            after >= later,
            "cache {cache}: the re-acquire moved the expiry from {later} to {after}"
        );
    }
}
