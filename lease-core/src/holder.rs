//! Holder identities.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Error;

/// Longest holder id accepted, in bytes.
pub const MAX_HOLDER_LEN: usize = 128;

/// Who holds (or asks for) a lease.
///
/// Keep one `HolderId` per process or worker and reuse it on every retry: a
/// backend recognises a grant whose answer was lost by the holder id, and
/// hands the same grant back instead of treating the retry as a stranger.
///
/// Printable ASCII without spaces, 1–128 bytes.
///
/// ```
/// use lease_core::HolderId;
/// let me = HolderId::new("worker-7@host-a").unwrap();
/// assert_eq!(me.as_str(), "worker-7@host-a");
/// assert_ne!(HolderId::random(), HolderId::random());
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HolderId(String);

impl HolderId {
    /// Validates a caller-chosen id.
    ///
    /// # Errors
    /// [`Error::InvalidHolder`] when it is empty, too long or not printable ASCII.
    pub fn new(id: impl Into<String>) -> Result<Self, Error> {
        let id = id.into();
        let reason = if id.is_empty() {
            Some("a holder id must not be empty")
        } else if id.len() > MAX_HOLDER_LEN {
            Some("a holder id must be at most 128 bytes")
        } else if !id.bytes().all(|b| b.is_ascii_graphic()) {
            Some("a holder id must be printable ASCII without spaces")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidHolder { id, reason }),
            None => Ok(HolderId(id)),
        }
    }

    /// A fresh random id (128 bits, hex), unique for all practical purposes.
    ///
    /// Drawn from the standard library's per-process random hash keys mixed with
    /// the time, the process id and a counter, so `lease-core` needs no RNG crate.
    pub fn random() -> Self {
        HolderId(format!("{:016x}{:016x}", random_u64(), random_u64()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// 64 random-enough bits for ids and jitter (not for cryptography).
pub(crate) fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(d) = SystemTime::now().duration_since(UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderId({:?})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates() {
        assert!(HolderId::new("a").is_ok());
        assert!(matches!(
            HolderId::new(""),
            Err(Error::InvalidHolder { .. })
        ));
        assert!(matches!(
            HolderId::new("a b"),
            Err(Error::InvalidHolder { .. })
        ));
        assert!(matches!(
            HolderId::new("x".repeat(129)),
            Err(Error::InvalidHolder { .. })
        ));
    }

    #[test]
    fn random_ids_differ_and_are_valid() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| HolderId::random()).collect();
        assert_eq!(ids.len(), 1000);
        for id in ids {
            assert!(HolderId::new(id.as_str()).is_ok());
        }
    }
}
