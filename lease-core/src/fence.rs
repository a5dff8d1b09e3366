//! Fencing tokens.

use std::fmt;

/// A fencing token: strictly greater on every grant of a key than on any
/// earlier grant of that key (or of any key, where the backend's
/// [`FenceScope`](crate::FenceScope) is the whole cluster).
///
/// Hand it to every resource you write while holding the lease, and have the
/// resource reject writes carrying a fence lower than the highest it has seen:
/// that, not the lease alone, is what stops a paused former holder
/// ([Kleppmann, "How to do distributed locking"]).
///
/// [Kleppmann, "How to do distributed locking"]: https://martin.kleppmann.com/2016/02/08/how-to-do-distributed-locking.html
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Fence(pub u64);

impl Fence {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Fence> for u64 {
    fn from(f: Fence) -> u64 {
        f.0
    }
}
