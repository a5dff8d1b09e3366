//! Records removed behind the library's back: an operator's `del`, a cleanup
//! script, a storage lifecycle rule expiring old objects. Fences must keep
//! rising (contract point 2), and no grant may be given that could overlap a
//! live one where the backend can know (contract point 1).

use lease_core::{Acquire, Fence, HolderId, LeaseBackend, LeaseKey, Renewal, TimeAuthority};

use super::{clients, grant, key, req, short_ttl, PropFuture};
use crate::{ensure, Failure, Harness, Outcome};

/// After the record of a live grant, and then of a released one, is deleted
/// outside the library, the next grant's fence is above every earlier one;
/// the deleted holder cannot renew once another holder was granted; and a
/// backend that judges expiry by local observation grants the key only after
/// a TTL of observation (it cannot prove the deleted holder gone sooner).
pub fn outside_delete_keeps_fences_rising(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let key = key("outside-delete");
        if h.delete_outside(&key).is_none() {
            return Ok(Outcome::NotApplicable(
                "the harness cannot delete a record outside the library".into(),
            ));
        }
        let cs = clients(h, 2).await?;
        let caps = cs[0].capabilities();
        let observed = caps.time_authority == TimeAuthority::LocalObservation;
        let ttl = short_ttl(&caps);
        let (a, b) = (HolderId::random(), HolderId::random());

        // A live holder's record disappears.
        let g1 = grant(&*cs[0], &key, &a, ttl, "first acquire").await?;
        delete(h, &key).await?;
        let gb = match cs[1].try_acquire(req(&key, &b, ttl)).await? {
            Acquire::Granted(gb) => {
                ensure!(
                    !observed,
                    "granted fence {} at once over a deleted record, though expiry is judged \
                     by local observation and the deleted holder may still be live",
                    gb.fence()
                );
                match cs[0].renew(&g1, None).await? {
                    Renewal::Lost => {}
                    Renewal::Renewed(r) => {
                        return Err(Failure(format!(
                            "the holder whose record was deleted renewed (fence {}) while \
                             another holder was granted fence {}",
                            r.fence(),
                            gb.fence()
                        )))
                    }
                }
                gb
            }
            Acquire::Held(_) => {
                // The deleted holder stops renewing; one TTL later the key
                // is provably free.
                h.pass(ttl).await;
                grant(
                    &*cs[1],
                    &key,
                    &b,
                    ttl,
                    "a TTL after the live record was deleted",
                )
                .await?
            }
        };
        above(gb.fence(), g1.fence(), "after a live record was deleted")?;

        // A released record disappears: its fence counter goes with it.
        cs[1].release(&gb).await?;
        delete(h, &key).await?;
        let g3 = grant_eventually(h, &*cs[0], &key, &a, ttl).await?;
        above(
            g3.fence(),
            gb.fence(),
            "after a released record was deleted",
        )?;
        cs[0].release(&g3).await?;
        Ok(Outcome::Passed)
    })
}

async fn delete(h: &dyn Harness, key: &LeaseKey) -> Result<(), Failure> {
    match h.delete_outside(key) {
        Some(d) => d
            .await
            .map_err(|e| Failure(format!("deleting {key} outside the library: {e}"))),
        None => Err(Failure("delete_outside stopped being available".into())),
    }
}

/// A grant now, or — where the backend could not prove the key free — after
/// one TTL of backend time.
async fn grant_eventually(
    h: &dyn Harness,
    c: &dyn LeaseBackend,
    key: &LeaseKey,
    holder: &HolderId,
    ttl: std::time::Duration,
) -> Result<lease_core::Grant, Failure> {
    match c.try_acquire(req(key, holder, ttl)).await? {
        Acquire::Granted(g) => Ok(g),
        Acquire::Held(_) => {
            h.pass(ttl).await;
            grant(c, key, holder, ttl, "a TTL after the record was deleted").await
        }
    }
}

fn above(new: Fence, old: Fence, when: &str) -> Result<(), Failure> {
    ensure!(new > old, "fence {new} {when} is not above {old}");
    Ok(())
}
