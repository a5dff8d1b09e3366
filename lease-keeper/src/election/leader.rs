//! [`Leader`]: who leads an election, as a read of its key shows.

use std::fmt;

use lease_core::{Fence, HolderId, LeaseState, Payload};

/// Who leads an election: the holder of its key, the fence of their grant,
/// and the value they advertise (the grant's payload).
///
/// Two `Leader`s are equal when holder, fence and value all are: the same
/// leader advertising a new value is a change. `Debug` prints the value's
/// length, never its bytes.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's holder id.
    pub holder: HolderId,
    /// The fence of the leader's grant: a later leader's is higher.
    pub fence: Fence,
    /// The value the leader advertises.
    pub value: Payload,
}

impl Leader {
    /// The leader a read showed: `None` for a free key. A held key is led
    /// whatever remaining time the backend reports: backends that count in
    /// whole seconds (etcd) report zero for a grant with under a second
    /// left, and only the backend ends a grant.
    pub(crate) fn of(state: &LeaseState) -> Option<Leader> {
        match state {
            LeaseState::Held(h) => Some(Leader {
                holder: h.holder.clone(),
                fence: h.fence,
                value: h.payload.clone(),
            }),
            _ => None,
        }
    }
}

impl fmt::Debug for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leader")
            .field("holder", &self.holder)
            .field("fence", &self.fence)
            .field("value", &self.value)
            .finish()
    }
}
