//! Releases whose outcome is unknown (timed out, connection lost,
//! cancelled), remembered until settled.
//!
//! Such a release may still be on its way to the server (in a socket
//! buffer, a retransmission after a partition heals) and land later. A
//! grant is named by its holder and fence, and a re-acquire of one's own
//! live grant hands the same term back: if the holder acquired the key
//! again before the late release landed, the release would end the term
//! the holder was just told it holds, and the next acquirer would get the
//! key while the holder may still write. So before an acquire by the same
//! holder of the same key, the release is sent again and answered first:
//! the term ends now, the acquire starts a new one with a higher fence,
//! and the late release finds another fence and leaves it alone.

use std::collections::HashMap;
use std::sync::Mutex;

use lease_core::{Fence, HolderId, LeaseKey};

/// How many unsettled releases are remembered; past it, one of them is
/// forgotten (each needs a timed-out release that its holder never
/// follows with another acquire or release of the key).
const MAX_UNSETTLED: usize = 65_536;

/// The fence of each (key, holder) whose last release has no answer yet.
#[derive(Debug, Default)]
pub(crate) struct Unsettled {
    releases: Mutex<HashMap<(LeaseKey, HolderId), Fence>>,
}

impl Unsettled {
    /// A release of `fence` is about to be sent: unsettled until
    /// [`settle`](Self::settle)d (a cancelled release stays so).
    pub(crate) fn begin(&self, key: &LeaseKey, holder: &HolderId, fence: Fence) {
        if let Ok(mut releases) = self.releases.lock() {
            if releases.len() >= MAX_UNSETTLED {
                if let Some(any) = releases.keys().next().cloned() {
                    releases.remove(&any);
                }
            }
            releases.insert((key.clone(), holder.clone()), fence);
        }
    }

    /// The release of `fence` was answered (or refused before it ran).
    pub(crate) fn settle(&self, key: &LeaseKey, holder: &HolderId, fence: Fence) {
        if let Ok(mut releases) = self.releases.lock() {
            let k = (key.clone(), holder.clone());
            if releases.get(&k) == Some(&fence) {
                releases.remove(&k);
            }
        }
    }

    /// The fence of `holder`'s unsettled release of `key`, if any.
    pub(crate) fn pending(&self, key: &LeaseKey, holder: &HolderId) -> Option<Fence> {
        self.releases
            .lock()
            .ok()
            .and_then(|r| r.get(&(key.clone(), holder.clone())).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_stays_unsettled_until_its_own_fence_is_settled() {
        let u = Unsettled::default();
        let (k, h) = (LeaseKey::new("k").unwrap(), HolderId::new("h").unwrap());
        assert_eq!(u.pending(&k, &h), None);
        u.begin(&k, &h, Fence(5));
        u.settle(&k, &h, Fence(4));
        assert_eq!(u.pending(&k, &h), Some(Fence(5)));
        assert_eq!(u.pending(&k, &HolderId::new("other").unwrap()), None);
        u.settle(&k, &h, Fence(5));
        assert_eq!(u.pending(&k, &h), None);
        for i in 0..=MAX_UNSETTLED {
            u.begin(&LeaseKey::new(format!("k{i}")).unwrap(), &h, Fence(1));
        }
        assert_eq!(u.releases.lock().unwrap().len(), MAX_UNSETTLED);
    }
}
