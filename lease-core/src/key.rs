//! Validated lease keys.

use std::fmt;
use std::sync::Arc;

use crate::Error;

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// The name of a lease: segments of `[A-Za-z0-9_=.-]` joined by `/`, 1–255 bytes.
///
/// This is the intersection of what etcd keys, NATS KV keys, S3 object names and
/// MongoDB string ids accept, so one key works on every backend unchanged. In
/// addition a segment may not start or end with `.` and a key may not contain
/// `..`: NATS turns `.` into subject-token separators (an empty token is
/// invalid) and object stores treat `.` and `..` segments as paths.
///
/// ```
/// use lease_core::LeaseKey;
/// let key = LeaseKey::new("jobs/nightly-backup").unwrap();
/// assert_eq!(key.as_str(), "jobs/nightly-backup");
/// assert!(LeaseKey::new("jobs//x").is_err());
/// assert!(LeaseKey::new("").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseKey(Arc<str>);

impl LeaseKey {
    /// Validates `key`; see the type docs for the rules.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] naming the rule that was broken.
    pub fn new(key: impl Into<String>) -> Result<Self, Error> {
        let key = key.into();
        match Self::check(&key) {
            Ok(()) => Ok(LeaseKey(key.into())),
            Err(reason) => Err(Error::InvalidKey { key, reason }),
        }
    }

    fn check(key: &str) -> Result<(), &'static str> {
        if key.is_empty() {
            return Err("a key must not be empty");
        }
        if key.len() > MAX_KEY_LEN {
            return Err("a key must be at most 255 bytes");
        }
        if key.contains("..") {
            return Err("a key must not contain `..`");
        }
        for segment in key.split('/') {
            if segment.is_empty() {
                return Err("a key must not start or end with `/` or contain `//`");
            }
            if !segment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'=' | b'.' | b'-'))
            {
                return Err("a key may only contain A-Z a-z 0-9 _ = . - and `/` between segments");
            }
            if segment.starts_with('.') || segment.ends_with('.') {
                return Err("a key segment must not start or end with `.`");
            }
        }
        Ok(())
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Appends `/suffix` and validates the result.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the joined key breaks a rule.
    pub fn join(&self, suffix: &str) -> Result<Self, Error> {
        LeaseKey::new(format!("{}/{}", self.0, suffix))
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseKey({:?})", &*self.0)
    }
}

impl AsRef<str> for LeaseKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// `"jobs/nightly".parse::<LeaseKey>()`, as [`LeaseKey::new`].
impl std::str::FromStr for LeaseKey {
    type Err = Error;
    fn from_str(key: &str) -> Result<Self, Error> {
        LeaseKey::new(key)
    }
}

impl TryFrom<&str> for LeaseKey {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self, Error> {
        LeaseKey::new(value)
    }
}

impl TryFrom<String> for LeaseKey {
    type Error = Error;
    fn try_from(value: String) -> Result<Self, Error> {
        LeaseKey::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_from_str() {
        let key: LeaseKey = "jobs/nightly".parse().unwrap();
        assert_eq!(key, LeaseKey::new("jobs/nightly").unwrap());
        assert!(matches!(
            "a//b".parse::<LeaseKey>(),
            Err(Error::InvalidKey { .. })
        ));
    }

    #[test]
    fn accepts_the_common_alphabet() {
        for ok in ["a", "A-z_0=9.x", "jobs/nightly/backup", &"k".repeat(255)] {
            assert!(LeaseKey::new(ok).is_ok(), "{ok:?} should be valid");
        }
    }

    #[test]
    fn rejects_with_a_reason() {
        for bad in [
            "",
            "/a",
            "a/",
            "a//b",
            "a b",
            "ä",
            "a*",
            ".a",
            "a.",
            "a/./b",
            "a..b",
            "a/../b",
            &"k".repeat(256),
        ] {
            match LeaseKey::new(bad) {
                Err(Error::InvalidKey { key, reason }) => {
                    assert_eq!(key, bad);
                    assert!(!reason.is_empty());
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }
}
