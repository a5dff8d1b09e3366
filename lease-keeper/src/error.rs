//! Why an acquire failed, and why a group gave up.

use std::time::Duration;

use lease_core::{Error, Fence, HolderId, LeaseKey};

use crate::loss::LossReason;

/// Why an acquire did not give a lease.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// A single attempt ([`Keeper::try_acquire`](crate::Keeper::try_acquire))
    /// found the key held by someone else.
    #[error("lease {key} is held by {holder} (fence {fence})")]
    Held {
        /// The key asked for.
        key: LeaseKey,
        /// Who holds it.
        holder: HolderId,
        /// The fence of their grant.
        fence: Fence,
    },
    /// The key stayed held for the whole wait.
    #[error("lease {key} {} after waiting {waited:?}", match holder {
        Some(h) => format!("still held by {h}"),
        None => "not acquired".to_owned(),
    })]
    Timeout {
        /// The key waited for.
        key: LeaseKey,
        /// How long the wait lasted.
        waited: Duration,
        /// The holder seen last, if a read or refused acquire named one.
        holder: Option<HolderId>,
    },
    /// The backend refused the request (bad input, corrupt record, …), the
    /// key given as a string is no key ([`Error::InvalidKey`], found before
    /// anything is sent), or the keeper could not run (no tokio runtime).
    #[error(transparent)]
    Backend(#[from] Error),
    /// The [`LeaseGroup`](crate::LeaseGroup) was abandoned (one of its leases
    /// was lost); it takes no new leases.
    #[error("the lease group was abandoned")]
    GroupAbandoned(#[source] LeaseAbandoned),
}

/// A lease of the group was lost unexpectedly, so the group released all the
/// others (its leases share one fate). Names the lost keys.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseAbandoned {
    /// The leases lost unexpectedly, with why.
    pub lost: Vec<(LeaseKey, LossReason)>,
}

impl LeaseAbandoned {
    /// The lost keys.
    pub fn keys(&self) -> Vec<&LeaseKey> {
        self.lost.iter().map(|(k, _)| k).collect()
    }
}

impl std::fmt::Display for LeaseAbandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("lease(s) lost unexpectedly: ")?;
        for (i, (k, r)) in self.lost.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k} ({r})")?;
        }
        Ok(())
    }
}

impl std::error::Error for LeaseAbandoned {}
