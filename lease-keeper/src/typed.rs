//! Typed records: a serde value as a lease's payload (JSON), behind the
//! `serde` feature.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use lease_core::LeaseKey;
//! use lease_keeper::{typed, Keeper};
//!
//! #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
//! struct Owner { node: String, port: u16 }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
//! let key = LeaseKey::new("svc/primary")?;
//! let me = Owner { node: "node-3".into(), port: 8080 };
//! let lease = keeper
//!     .try_acquire(&key)
//!     .ttl(Duration::from_secs(10))
//!     .payload(typed::to_payload(&me)?)
//!     .await?;
//! assert_eq!(typed::read_record::<Owner>(&*keeper.backend().clone(), &key).await?, Some(me));
//! lease.set_payload(typed::to_payload(&Owner { node: "node-3".into(), port: 9090 })?);
//! # Ok(())
//! # }
//! ```

use lease_core::{LeaseBackend, LeaseKey, Payload};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encoding or decoding a typed record failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The value could not be encoded (serde failed, or the encoding is
    /// larger than a payload may be: see the source).
    #[error("could not encode the lease record")]
    Encode(#[source] lease_core::BoxError),
    /// The stored payload is not a record of the expected type.
    #[error("the lease record does not decode as the expected type")]
    Decode(#[source] serde_json::Error),
    /// Reading the key failed.
    #[error(transparent)]
    Backend(#[from] lease_core::Error),
}

/// Encodes `record` as a payload (JSON).
///
/// # Errors
/// [`RecordError::Encode`] when serde fails or the encoding is too large.
pub fn to_payload<T: Serialize + ?Sized>(record: &T) -> Result<Payload, RecordError> {
    let bytes = serde_json::to_vec(record).map_err(|e| RecordError::Encode(e.into()))?;
    Payload::new(bytes).map_err(|e| RecordError::Encode(e.into()))
}

/// Decodes a payload written by [`to_payload`].
///
/// # Errors
/// [`RecordError::Decode`] when it is not a `T`.
pub fn from_payload<T: DeserializeOwned>(payload: &Payload) -> Result<T, RecordError> {
    serde_json::from_slice(payload.as_bytes()).map_err(RecordError::Decode)
}

/// Reads `key` and decodes its holder's record; `None` when the key is free.
///
/// # Errors
/// The backend's, or [`RecordError::Decode`].
///
/// # Cancel safety
///
/// This function is cancel safe: it only reads.
pub async fn read_record<T: DeserializeOwned>(
    backend: &dyn LeaseBackend,
    key: &LeaseKey,
) -> Result<Option<T>, RecordError> {
    match backend.read(key).await?.holding() {
        Some(h) => from_payload(&h.payload).map(Some),
        None => Ok(None),
    }
}

impl crate::LeaseView {
    /// The record the backend last accepted, decoded.
    ///
    /// # Errors
    /// [`RecordError::Decode`] when it is not a `T`.
    pub fn record<T: DeserializeOwned>(&self) -> Result<T, RecordError> {
        from_payload(&self.payload())
    }

    /// Encodes `record` and sends it with the next renewal.
    ///
    /// # Errors
    /// [`RecordError::Encode`].
    pub fn set_record<T: Serialize + ?Sized>(&self, record: &T) -> Result<(), RecordError> {
        self.set_payload(to_payload(record)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn an_encode_error_keeps_its_cause() {
        let big = "x".repeat(lease_core::MAX_PAYLOAD_LEN + 1);
        let e = to_payload(&big).expect_err("too large");
        let cause = e.source().expect("a source");
        assert!(
            matches!(
                cause.downcast_ref::<lease_core::Error>(),
                Some(lease_core::Error::PayloadTooLarge { .. })
            ),
            "{cause:?}"
        );

        // JSON object keys must be strings: serde_json refuses this map.
        let map: std::collections::BTreeMap<Vec<u8>, u8> = [(vec![1], 1)].into_iter().collect();
        let e = to_payload(&map).expect_err("not encodable");
        let cause = e.source().expect("a source");
        assert!(
            cause.downcast_ref::<serde_json::Error>().is_some(),
            "{cause:?}"
        );
    }
}
