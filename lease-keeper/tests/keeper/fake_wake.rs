//! Review of dbcc2c7 (the fake's renewal wakes no watcher unless its
//! payload changed): a waiter on `wait_for_change` still wakes on every
//! change `same_state` can see — a new payload (also one whose answer was
//! lost), a release, an expiry, a new holder — and a plain extension keeps
//! the grant's version.

use std::time::Duration;

use crate::common::{key, ms};
use lease_core::{Acquire, AcquireRequest, Grant, HolderId, LeaseBackend, Payload, Renewal};
use lease_fake::Fake;
use tokio::time::timeout;

async fn grant(fake: &Fake, k: &str, holder: &HolderId) -> Grant {
    let req = AcquireRequest::new(key(k), holder.clone()).ttl(Duration::from_secs(10));
    match fake.try_acquire(req).await.unwrap() {
        Acquire::Granted(g) => g,
        other => panic!("not granted: {other:?}"),
    }
}

/// Whether a waiter that read `k` before `change` is woken by it.
async fn wakes(fake: &Fake, k: &str, change: impl std::future::Future<Output = ()>) -> bool {
    let k = key(k);
    let seen = fake.read(&k).await.unwrap();
    let waiter = {
        let (fake, k) = (fake.clone(), k.clone());
        tokio::spawn(async move { fake.wait_for_change(&k, &seen).await })
    };
    tokio::task::yield_now().await;
    change.await;
    timeout(ms(500), waiter).await.is_ok()
}

#[tokio::test(start_paused = true)]
async fn a_watcher_wakes_on_every_change_same_state_sees() {
    let fake = Fake::new();
    let (me, you) = (HolderId::random(), HolderId::random());
    let g = grant(&fake, "fwake/a", &me).await;
    // A plain extension: nothing a watcher compares changed, the version stays.
    let mut renewed = None;
    let woke = wakes(&fake, "fwake/a", async {
        renewed = Some(fake.renew(&g, None).await.unwrap());
    })
    .await;
    assert!(!woke, "a plain extension woke the watcher");
    let Some(Renewal::Renewed(r)) = renewed else {
        panic!("not renewed: {renewed:?}")
    };
    assert_eq!(r.version(), g.version());
    assert_eq!(r.fence(), g.fence());
    // A new payload wakes.
    let p = Payload::new(b"v2".to_vec()).unwrap();
    assert!(
        wakes(&fake, "fwake/a", async {
            fake.renew(&r, Some(p.clone())).await.unwrap();
        })
        .await
    );
    // A new payload whose answer was lost was applied: it wakes too.
    let p3 = Payload::new(b"v3".to_vec()).unwrap();
    assert!(
        wakes(&fake, "fwake/a", async {
            fake.lose_next_responses(1);
            assert!(fake.renew(&r, Some(p3.clone())).await.is_err());
        })
        .await
    );
    assert_eq!(
        fake.read(&key("fwake/a"))
            .await
            .unwrap()
            .holding()
            .unwrap()
            .payload,
        p3
    );
    // A release wakes.
    assert!(
        wakes(&fake, "fwake/a", async {
            fake.release(&r).await.unwrap();
        })
        .await
    );
    // A new holder wakes.
    assert!(
        wakes(&fake, "fwake/a", async {
            let _ = grant(&fake, "fwake/a", &you).await;
        })
        .await
    );
    // An expiry on the backend's clock wakes.
    assert!(
        wakes(&fake, "fwake/a", async {
            fake.advance(Duration::from_secs(11));
        })
        .await
    );
    // A refused renewal (the grant is gone) changes nothing and wakes nobody.
    let g2 = grant(&fake, "fwake/a", &me).await;
    fake.advance(Duration::from_secs(11));
    assert!(
        !wakes(&fake, "fwake/a", async {
            assert!(matches!(fake.renew(&g2, None).await, Ok(Renewal::Lost)));
        })
        .await
    );
}
