//! The one error type of the contract.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Everything that can go wrong with a lease operation.
///
/// # Display and causes
///
/// Every error type of this library follows one rule: a cause is either in
/// `Display` or returned by [`source()`](StdError::source), never both.
/// [`Error::Unavailable`] describes the failure in its own words and returns
/// the client library's error as its source; [`Error::Backend`] *is* the
/// client's error (a refusal, in the client's words), so it prints that
/// error's message and returns that error's own cause. Print the whole
/// chain with [`ErrorChain`] (or an error reporter such as `anyhow`'s
/// `{:#}`) to see every cause, each once.
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

    /// The [`Error::Unavailable`] of a request that got no answer within
    /// `limit`: `what` names the request (`"etcd txn"`, `"lease-mongo
    /// acquire"`). Its outcome is unknown, because the server may have
    /// applied it and the answer been lost, so the holder retries with the
    /// same holder id, as after a lost connection.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lease_core::Error;
    ///
    /// let e = Error::no_answer("etcd txn", Duration::from_secs(2));
    /// assert!(e.is_unknown_outcome());
    /// assert_eq!(
    ///     e.to_string(),
    ///     "backend unavailable, outcome unknown: etcd txn: no answer within 2s"
    /// );
    /// ```
    pub fn no_answer(what: impl fmt::Display, limit: std::time::Duration) -> Self {
        Error::Unavailable {
            detail: format!("{what}: no answer within {limit:?}"),
            source: None,
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
            Error::Unavailable { detail, .. } => {
                write!(f, "backend unavailable, outcome unknown: {detail}")
            }
            // The client's error is this error's message (often all there
            // is: a refusal in words); its cause is this error's cause.
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
            Error::Backend(e) => e.source(),
            _ => None,
        }
    }
}

/// An error and its causes on one line, `outer: cause: root cause`, for
/// logs and command-line messages.
///
/// Each error in the chain is printed once: error types here keep their
/// cause out of their own `Display` (see [`Error`]), and this walks
/// [`source()`](StdError::source) to add it. Some client libraries do quote
/// their cause in their own message; a cause whose text is already on the
/// line, or that prints as empty text, is not added again.
///
/// ```
/// use lease_core::{Error, ErrorChain};
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
/// let e = Error::unavailable("etcd: txn", io);
/// assert_eq!(e.to_string(), "backend unavailable, outcome unknown: etcd: txn");
/// assert_eq!(
///     ErrorChain::new(&e).to_string(),
///     "backend unavailable, outcome unknown: etcd: txn: connection refused"
/// );
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(&'a (dyn StdError + 'static));

impl<'a> ErrorChain<'a> {
    /// The chain starting at `error`.
    pub fn new(error: &'a (dyn StdError + 'static)) -> Self {
        ErrorChain(error)
    }
}

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !text.is_empty() && !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            cause = c.source();
        }
        f.write_str(&line)
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Shorthand for results of lease operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Io;
    impl fmt::Display for Io {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("connection reset")
        }
    }
    impl StdError for Io {}

    #[test]
    fn a_cause_is_printed_once_in_the_chain_and_never_in_display() {
        let e = Error::unavailable("renew", Io);
        assert!(!e.to_string().contains("connection reset"), "{e}");
        assert!(e.source().is_some());
        let line = ErrorChain::new(&e).to_string();
        assert_eq!(line.matches("connection reset").count(), 1, "{line}");

        let e = Error::Backend(Box::new(Io));
        assert_eq!(e.to_string(), "backend error: connection reset");
        assert!(e.source().is_none());
        assert_eq!(ErrorChain::new(&e).to_string(), e.to_string());
    }
}
