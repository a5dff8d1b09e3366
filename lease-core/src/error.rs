//! The one error type of the contract.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Everything that can go wrong with a lease operation.
///
/// Losing a lease is **not** an error: it is the [`Renewal::Lost`](crate::Renewal::Lost)
/// outcome. An error means either the request was refused before it changed
/// anything (bad input, a corrupt record) or the truth is unknown
/// ([`Error::Unavailable`]): the request may or may not have been applied, and a
/// holder must act as if its lease may be lost once its deadline passes.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The key breaks the [`LeaseKey`](crate::LeaseKey) rules; nothing was sent.
    InvalidKey {
        /// The rejected key.
        key: String,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// The holder id breaks the [`HolderId`](crate::HolderId) rules; nothing was sent.
    InvalidHolder {
        /// The rejected id.
        id: String,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// The TTL is outside what the backend accepts; nothing was sent.
    InvalidTtl {
        /// The TTL asked for.
        requested: Duration,
        /// Why it was refused, with the accepted range.
        reason: String,
    },
    /// Timing options that cannot keep a holder safe (see [`Timing`](crate::Timing)).
    InvalidTiming {
        /// What is wrong with them.
        reason: String,
    },
    /// The payload exceeds [`MAX_PAYLOAD_LEN`](crate::MAX_PAYLOAD_LEN) (or a
    /// backend's smaller limit); nothing was sent.
    PayloadTooLarge {
        /// Size of the rejected payload.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The record stored at a key is not a lease record this library wrote.
    ///
    /// Never treated as a free key: something else owns that name, or the store
    /// is damaged, and overwriting it could hand out a second live grant.
    CorruptRecord {
        /// The key whose record does not parse.
        key: String,
        /// What was wrong with it.
        detail: String,
    },
    /// The store accepted a conditional write whose condition should have
    /// failed: it cannot provide mutual exclusion, so no lease is granted.
    PreconditionsIgnored {
        /// What was observed.
        detail: String,
    },
    /// The backend does not offer this operation (see [`Capabilities`](crate::Capabilities)).
    Unsupported {
        /// The operation.
        operation: &'static str,
    },
    /// The outcome is unknown: the request may or may not have been applied
    /// (timeout, connection lost, server unavailable). Retry with the same
    /// holder id; meanwhile treat a held lease as lost once its deadline passes.
    Unavailable {
        /// What happened.
        detail: String,
        /// The client library's error, if any.
        source: Option<BoxError>,
    },
    /// Any other failure reported by the backend's client library, where the
    /// request is known not to have been applied (e.g. permission denied).
    Backend(BoxError),
}

impl Error {
    /// An [`Error::Unavailable`] with a detail and the underlying error.
    pub fn unavailable(detail: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            detail: detail.into(),
            source: Some(source.into()),
        }
    }

    /// An [`Error::CorruptRecord`].
    pub fn corrupt(key: impl fmt::Display, detail: impl Into<String>) -> Self {
        Error::CorruptRecord {
            key: key.to_string(),
            detail: detail.into(),
        }
    }

    /// Whether the outcome of the failed operation is unknown (it may have
    /// been applied). Only [`Error::Unavailable`] is.
    pub fn is_unknown_outcome(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey { key, reason } => write!(f, "invalid lease key {key:?}: {reason}"),
            Error::InvalidHolder { id, reason } => write!(f, "invalid holder id {id:?}: {reason}"),
            Error::InvalidTtl { requested, reason } => {
                write!(f, "invalid TTL {requested:?}: {reason}")
            }
            Error::InvalidTiming { reason } => write!(f, "invalid lease timing: {reason}"),
            Error::PayloadTooLarge { len, max } => {
                write!(f, "payload of {len} bytes exceeds the limit of {max} bytes")
            }
            Error::CorruptRecord { key, detail } => {
                write!(f, "record at lease key {key:?} is not a valid lease record: {detail}")
            }
            Error::PreconditionsIgnored { detail } => write!(
                f,
                "the store ignores conditional-write preconditions, so it cannot exclude a second holder: {detail}"
            ),
            Error::Unsupported { operation } => {
                write!(f, "this backend does not support {operation}")
            }
            Error::Unavailable { detail, source } => match source {
                Some(s) => write!(f, "backend unavailable, outcome unknown: {detail}: {s}"),
                None => write!(f, "backend unavailable, outcome unknown: {detail}"),
            },
            Error::Backend(e) => write!(f, "backend error: {e}"),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Unavailable {
                source: Some(s), ..
            } => Some(s.as_ref()),
            Error::Backend(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

/// Shorthand for results of lease operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
