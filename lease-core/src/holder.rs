//! Holder identities.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Error;

/// Longest holder id accepted, in bytes.
pub const MAX_HOLDER_LEN: usize = 128;

/// Marks the start of the term part of an id drawn by [`HolderId::term`].
const TERM_MARK: char = '~';

/// Hex digits of the term part of an id drawn by [`HolderId::term`].
const TERM_DIGITS: usize = 16;

/// Who holds (or asks for) a lease.
///
/// A backend recognises a grant whose answer was lost by the holder id, and
/// hands the same grant back to a retry with the same id instead of treating
/// it as a stranger. That makes the holder id the identity of one *term*: a
/// release, renewal or retry carrying it acts on that term's grant. So reuse
/// an id only for retries of one acquire, never for a second acquire of the
/// same key — a late release of the first term would end the second, and the
/// two terms would share one fence. [`HolderId::term`] draws such a per-term
/// id from a longer-lived one (a process's or worker's name); the keeper does
/// this for every acquire call.
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
pub struct HolderId(Arc<str>);

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
            None => Ok(HolderId(id.into())),
        }
    }

    /// A fresh random id (128 bits, hex), unique for all practical purposes.
    ///
    /// A holder id is a safety identity: a second process that drew the same
    /// one could renew or release the first one's grant. So the bits come
    /// from the operating system's random source (`/dev/urandom`), the same
    /// one `getrandom` reads, which needs no seeding and does not repeat
    /// across forks or restored snapshots. Only where that source cannot be
    /// read do they fall back to the standard library's random hash keys
    /// mixed with the time, the process id and a counter.
    pub fn random() -> Self {
        HolderId(format!("{:016x}{:016x}", id_bits(), id_bits()).into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A fresh id for one term of this holder: this id, a `~` and 16 random
    /// hex digits. An id too long for that keeps its first 102 bytes, a `#`
    /// and 8 hex digits of a hash of the whole, so the term id fits
    /// [`MAX_HOLDER_LEN`] and still tells long ids apart.
    ///
    /// Use a new one for every acquire of a key, and the same one for the
    /// retries of that acquire: no release, renewal or retry of one term can
    /// then touch another term's grant, even of the same process.
    ///
    /// ```
    /// use lease_core::HolderId;
    /// let me = HolderId::new("worker-7@host-a").unwrap();
    /// let (t1, t2) = (me.term(), me.term());
    /// assert_ne!(t1, t2);
    /// assert!(t1.is_term_of(&me) && t2.is_term_of(&me));
    /// assert!(t1.as_str().starts_with("worker-7@host-a~"));
    /// ```
    pub fn term(&self) -> HolderId {
        let base = self.term_base();
        HolderId(format!("{base}{TERM_MARK}{:016x}", id_bits()).into())
    }

    /// Whether this id was drawn by [`term`](HolderId::term) from `holder`.
    pub fn is_term_of(&self, holder: &HolderId) -> bool {
        match self.0.rsplit_once(TERM_MARK) {
            Some((base, digits)) => {
                digits.len() == TERM_DIGITS
                    && digits.bytes().all(|b| b.is_ascii_hexdigit())
                    && base == holder.term_base().as_ref()
            }
            None => false,
        }
    }

    /// The part of this id that a term id keeps: all of it, or, where a
    /// term part would not fit, its first bytes and a hash of the whole (so
    /// two long ids that differ only at their ends keep apart). Ids are
    /// ASCII, so any cut is on a character boundary.
    fn term_base(&self) -> std::borrow::Cow<'_, str> {
        let room = MAX_HOLDER_LEN - TERM_DIGITS - TERM_MARK.len_utf8();
        if self.0.len() <= room {
            return std::borrow::Cow::Borrowed(&self.0);
        }
        // FNV-1a: the same on every machine and in every process.
        let hash = self.0.bytes().fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        let keep = room - 9;
        let head = self.0.get(..keep).unwrap_or(&self.0);
        std::borrow::Cow::Owned(format!("{head}#{hash:08x}"))
    }
}

/// The operating system's random source, opened once: a file descriptor
/// per id would cost a keeper drawing a term id per acquire three system
/// calls more. Reads of one descriptor from several threads are safe (each
/// read takes bytes of its own).
static OS_RANDOM: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();

/// 64 bits for an identity: from the operating system's random source, or
/// [`random_u64`] where it cannot be read.
fn id_bits() -> u64 {
    use std::io::Read as _;
    let mut bytes = [0u8; 8];
    match OS_RANDOM.get_or_init(|| std::fs::File::open("/dev/urandom").ok()) {
        // `Read` is implemented for `&File`: a shared descriptor reads.
        Some(file) if (&mut &*file).read_exact(&mut bytes).is_ok() => u64::from_ne_bytes(bytes),
        _ => random_u64(),
    }
}

/// 64 random-enough bits for jitter (not for identities, not for
/// cryptography).
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
        write!(f, "HolderId({:?})", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_operating_systems_random_source() {
        let ids: std::collections::HashSet<_> = (0..10_000).map(|_| HolderId::random()).collect();
        assert_eq!(ids.len(), 10_000);
        if std::path::Path::new("/dev/urandom").exists() {
            assert!(
                matches!(OS_RANDOM.get(), Some(Some(_))),
                "ids must be drawn from /dev/urandom where it exists"
            );
        }
    }

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
    fn term_ids_are_valid_and_name_their_holder() {
        let long = HolderId::new("h".repeat(MAX_HOLDER_LEN)).unwrap();
        for base in [
            HolderId::new("a").unwrap(),
            HolderId::new("a~b").unwrap(),
            long,
        ] {
            let t = base.term();
            assert!(HolderId::new(t.as_str()).is_ok(), "{t:?}");
            assert!(t.is_term_of(&base));
            assert!(!base.is_term_of(&base));
            assert_ne!(t, base.term());
        }
        assert!(!HolderId::new("a~0123")
            .unwrap()
            .is_term_of(&HolderId::new("a").unwrap()));
        assert!(!HolderId::new("a")
            .unwrap()
            .term()
            .is_term_of(&HolderId::new("b").unwrap()));
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
