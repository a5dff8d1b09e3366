//! Opaque payload bytes stored with a grant.

use std::fmt;

use crate::Error;

/// Largest payload accepted on every backend, in bytes (64 KiB).
///
/// Small enough to fit etcd's and NATS' default request limits with room for
/// the holder record around it; a lease is a pointer to work, not a data store.
pub const MAX_PAYLOAD_LEN: usize = 64 * 1024;

/// Bytes stored with a grant, returned by reads and replaceable on renew.
///
/// ```
/// use lease_core::{Payload, MAX_PAYLOAD_LEN};
/// let p = Payload::new(b"node-3:8080".to_vec()).unwrap();
/// assert_eq!(p.as_bytes(), b"node-3:8080");
/// assert!(Payload::new(vec![0; MAX_PAYLOAD_LEN + 1]).is_err());
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Payload(Vec<u8>);

impl Payload {
    /// Wraps `bytes` if they fit [`MAX_PAYLOAD_LEN`].
    ///
    /// # Errors
    /// [`Error::PayloadTooLarge`] with the size and the limit.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, Error> {
        let bytes = bytes.into();
        if bytes.len() > MAX_PAYLOAD_LEN {
            return Err(Error::PayloadTooLarge {
                len: bytes.len(),
                max: MAX_PAYLOAD_LEN,
            });
        }
        Ok(Payload(bytes))
    }

    /// The empty payload.
    pub fn empty() -> Self {
        Payload(Vec::new())
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Takes the bytes out.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// Never prints the contents: payloads may carry secrets, and leases are logged.
impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.0.len())
    }
}

impl TryFrom<Vec<u8>> for Payload {
    type Error = Error;
    fn try_from(v: Vec<u8>) -> Result<Self, Error> {
        Payload::new(v)
    }
}

impl TryFrom<&[u8]> for Payload {
    type Error = Error;
    fn try_from(v: &[u8]) -> Result<Self, Error> {
        Payload::new(v.to_vec())
    }
}
