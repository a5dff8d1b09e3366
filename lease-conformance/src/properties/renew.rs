//! Contract point 8: the payload.

use lease_core::{Acquire, HolderId, Renewal};

use super::{clients, key, long_ttl, payload, req, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// The payload given at acquire is what reads return; a renew with a new
/// payload replaces it, a renew without one keeps it.
pub fn payload_round_trips_and_is_replaced_on_renew(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("payload");
        let cs = clients(h, 2).await?;
        let ttl = long_ttl(&cs[0].capabilities());
        let (a, b) = (HolderId::random(), HolderId::random());
        // Not valid UTF-8, and every byte value: payloads are opaque bytes.
        let p1 = lease_core::Payload::new((0..=255u8).rev().collect::<Vec<_>>())?;
        let g =
            super::grant_req(&*cs[0], req(&key, &a, ttl).payload(p1.clone()), "free key").await?;
        let read_payload = |s: lease_core::LeaseState| s.holding().map(|x| x.payload.clone());
        let got = read_payload(cs[1].read(&key).await?);
        ensure!(
            got.as_ref() == Some(&p1),
            "read returned payload {got:?}, stored {p1:?}"
        );

        let p2 = payload("second");
        let g = match cs[0].renew(&g, Some(p2.clone())).await? {
            Renewal::Renewed(g) => g,
            Renewal::Lost => return Err(Failure("renew of a live grant was Lost".into())),
        };
        let got = read_payload(cs[1].read(&key).await?);
        ensure!(
            got.as_ref() == Some(&p2),
            "after a renew with a new payload, read returned {got:?}"
        );

        let g = match cs[0].renew(&g, None).await? {
            Renewal::Renewed(g) => g,
            Renewal::Lost => return Err(Failure("renew of a live grant was Lost".into())),
        };
        let got = read_payload(cs[1].read(&key).await?);
        ensure!(
            got.as_ref() == Some(&p2),
            "a renew without a payload changed it to {got:?}"
        );
        match cs[1].try_acquire(req(&key, &b, ttl)).await? {
            Acquire::Held(held) => ensure!(
                held.payload == p2,
                "a refusal reported payload {:?}",
                held.payload
            ),
            Acquire::Granted(_) => return Err(Failure("a stranger was granted a held key".into())),
        }
        let empty = key.join("empty")?;
        let g2 = super::grant(&*cs[0], &empty, &a, ttl, "free key").await?;
        let got = read_payload(cs[1].read(&empty).await?);
        ensure!(
            got == Some(lease_core::Payload::empty()),
            "an empty payload reads back as {got:?}"
        );
        cs[0].release(&g2).await?;
        cs[0].release(&g).await?;
        Ok(Outcome::Passed)
    })
}
