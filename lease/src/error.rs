//! What can go wrong opening a backend.

use crate::scheme::BackendKind;

/// Why [`connect`](crate::connect) failed.
///
/// The first three are mistakes of the caller, found before anything is
/// sent ([`is_usage`](Self::is_usage)); [`ConnectError::Backend`] is the
/// backend's own answer (unreachable, refused, a missing bucket, …).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL cannot be used: an unknown scheme, a bad port, an unknown
    /// option, ….
    #[error("bad backend URL {url:?}: {reason}")]
    BadUrl {
        /// The URL, any password in it masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The URL names a backend this build leaves out.
    #[error(
        "{kind} URLs need the `{feature}` feature of the lease crate, which this build leaves out: lease = {{ version = \"0.1\", features = [\"{feature}\"] }}",
        feature = kind.feature()
    )]
    FeatureDisabled {
        /// The backend the URL names.
        kind: BackendKind,
    },
    /// The TLS or credential options do not fit the backend, or a file they
    /// name cannot be read.
    #[error("{reason}")]
    BadOptions {
        /// What is wrong with them.
        reason: String,
    },
    /// Connecting failed: the backend could not be reached, refused the
    /// credentials, or is not set up for leases.
    #[error(transparent)]
    Backend(#[from] lease_core::Error),
}

impl ConnectError {
    /// Whether the caller's input is at fault (URL, features, options), as
    /// opposed to the backend's answer.
    pub fn is_usage(&self) -> bool {
        !matches!(self, ConnectError::Backend(_))
    }

    pub(crate) fn options(reason: impl Into<String>) -> ConnectError {
        ConnectError::BadOptions {
            reason: reason.into(),
        }
    }
}

/// For code that speaks only [`lease_core::Error`]: the backend's error as
/// it is, a usage error as [`Error::Backend`](lease_core::Error::Backend).
impl From<ConnectError> for lease_core::Error {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::Backend(e) => e,
            usage => lease_core::Error::Backend(Box::new(usage)),
        }
    }
}
