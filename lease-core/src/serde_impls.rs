//! `serde` for the identity types a user stores in records of their own
//! (feature `serde`): [`LeaseKey`] and [`HolderId`] as strings, validated
//! on the way in exactly as [`LeaseKey::new`] and [`HolderId::new`] do, and
//! [`Fence`] as its number.
//!
//! ```
//! use lease_core::{Fence, HolderId, LeaseKey};
//!
//! let key: LeaseKey = serde_json::from_str(r#""jobs/compactor""#).unwrap();
//! assert_eq!(serde_json::to_string(&key).unwrap(), r#""jobs/compactor""#);
//! let fence: Fence = serde_json::from_str("42").unwrap();
//! assert_eq!(fence, Fence(42));
//! // An id with a space is refused, as HolderId::new refuses it.
//! assert!(serde_json::from_str::<HolderId>(r#""not an id""#).is_err());
//! ```

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Fence, HolderId, LeaseKey};

impl Serialize for LeaseKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for LeaseKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        LeaseKey::new(String::deserialize(d)?).map_err(D::Error::custom)
    }
}

impl Serialize for HolderId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for HolderId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        HolderId::new(String::deserialize(d)?).map_err(D::Error::custom)
    }
}

impl Serialize for Fence {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Fence {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u64::deserialize(d).map(Fence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_ids_round_trip_and_bad_ones_are_refused() {
        let key = LeaseKey::new("a/b").expect("a key");
        let text = serde_json::to_string(&key).expect("encodes");
        assert_eq!(
            serde_json::from_str::<LeaseKey>(&text).expect("decodes"),
            key
        );
        assert!(serde_json::from_str::<LeaseKey>(r#""""#).is_err());
        let id = HolderId::new("worker-1").expect("an id");
        let text = serde_json::to_string(&id).expect("encodes");
        assert_eq!(
            serde_json::from_str::<HolderId>(&text).expect("decodes"),
            id
        );
        assert!(serde_json::from_str::<Fence>("-1").is_err());
    }
}
