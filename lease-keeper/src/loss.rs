//! Why a kept lease ended.

use std::fmt;

use lease_core::{Fence, HolderId, LastBreak, LeaseState};

/// Why a kept lease ended. Once lost, a lease never comes back: take a new one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A renewal answered `Lost` and a read showed another holder on the key.
    TakenOver {
        /// Who holds the key now.
        by: HolderId,
        /// Their fence (higher than ours).
        fence: Fence,
    },
    /// A renewal answered `Lost` and the key was free (or could not be read):
    /// the grant expired on the backend.
    Expired,
    /// A renewal answered `Lost` because an operator broke the grant
    /// (`lease break`, [`LeaseBackend::break_lease`](lease_core::LeaseBackend::break_lease)); the break's audit
    /// record says who and why.
    Broken {
        /// Who broke it.
        by: String,
        /// Why, in the operator's words.
        reason: String,
    },
    /// No renewal succeeded before the write deadline (the backend was
    /// unreachable, or answered only errors): the grant may have expired, so
    /// the keeper stopped treating it as held.
    DeadlinePassed,
    /// Released by its holder ([`Lease::release`](crate::Lease::release) or a drop).
    Released,
    /// Given up by its [`LeaseGroup`](crate::LeaseGroup) because another lease
    /// of the group was lost (shared expiry).
    Abandoned,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::TakenOver { by, fence } => {
                write!(f, "taken over by {by} with fence {fence}")
            }
            LossReason::Expired => f.write_str("expired on the backend"),
            LossReason::Broken { by, reason } => write!(f, "broken by {by}: {reason}"),
            LossReason::DeadlinePassed => {
                f.write_str("write deadline passed without a successful renewal")
            }
            LossReason::Released => f.write_str("released"),
            LossReason::Abandoned => f.write_str("abandoned with its group"),
        }
    }
}

impl LossReason {
    /// Whether the lease ended without its holder asking for it (anything but
    /// [`Released`](LossReason::Released) and [`Abandoned`](LossReason::Abandoned)).
    pub fn is_unexpected(&self) -> bool {
        !matches!(self, LossReason::Released | LossReason::Abandoned)
    }

    /// Whether the grant is known to be gone on the backend (nothing left to
    /// release).
    pub(crate) fn gone_on_backend(&self) -> bool {
        matches!(
            self,
            LossReason::TakenOver { .. } | LossReason::Expired | LossReason::Broken { .. }
        )
    }

    /// Classifies a `Renewal::Lost` by what a read and the key's last break
    /// showed afterwards: a break of this very grant wins over what the key
    /// holds now.
    pub(crate) fn from_read(
        read: Option<LeaseState>,
        last_break: Option<LastBreak>,
        me: &HolderId,
        fence: Fence,
    ) -> Self {
        if let Some(b) =
            last_break.filter(|b| b.fence == Some(fence) && b.holder.as_ref() == Some(me))
        {
            return LossReason::Broken {
                by: b.note.by,
                reason: b.note.reason,
            };
        }
        match read {
            Some(LeaseState::Held(h)) if !(h.holder == *me && h.fence == fence) => {
                LossReason::TakenOver {
                    by: h.holder,
                    fence: h.fence,
                }
            }
            _ => LossReason::Expired,
        }
    }
}
