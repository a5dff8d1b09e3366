//! [`IntoLeaseKey`]: what an acquire takes as its key.

use lease_core::{Error, LeaseKey};

/// What an acquire takes as its key: a `&LeaseKey`, or a `&str` or
/// `&String` that is checked against the [`LeaseKey`] rules.
///
/// Only borrows: the acquire copies the key, so `acquire(&key)` reads the
/// same whatever `key` is, and no caller gives a key up to acquire it.
///
/// A string that breaks them is not an error when the acquire is set up but
/// when it is awaited: the acquire then fails with
/// [`AcquireError::Backend`](crate::AcquireError::Backend) holding
/// [`Error::InvalidKey`], the error a backend gives for such a key, and
/// nothing is sent.
///
/// ```
/// # use std::sync::Arc;
/// # use lease_keeper::{AcquireError, Keeper};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let keeper = Keeper::new(Arc::new(lease_fake::Fake::new()));
/// let lease = keeper.try_acquire("jobs/a").await?;
/// assert_eq!(lease.key().as_str(), "jobs/a");
/// lease.release().await?;
/// let refused = keeper.try_acquire("").await;
/// assert!(matches!(
///     refused,
///     Err(AcquireError::Backend(lease_core::Error::InvalidKey { .. }))
/// ));
/// # Ok(())
/// # }
/// ```
pub trait IntoLeaseKey {
    /// The key, or [`Error::InvalidKey`] for a string that breaks the rules.
    ///
    /// # Errors
    /// [`Error::InvalidKey`], as [`LeaseKey::new`] gives it.
    fn into_lease_key(self) -> Result<LeaseKey, Error>;
}

impl IntoLeaseKey for &LeaseKey {
    fn into_lease_key(self) -> Result<LeaseKey, Error> {
        Ok(self.clone())
    }
}

impl IntoLeaseKey for &str {
    fn into_lease_key(self) -> Result<LeaseKey, Error> {
        LeaseKey::new(self)
    }
}

impl IntoLeaseKey for &String {
    fn into_lease_key(self) -> Result<LeaseKey, Error> {
        LeaseKey::new(self.as_str())
    }
}
