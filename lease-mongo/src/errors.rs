//! Mapping the driver's errors onto the contract's: unknown outcome or
//! refusal; and bounding a request in time, past which its outcome is unknown.

use std::future::Future;
use std::time::Duration;

use mongodb::error::{ErrorKind, WriteFailure};

/// MongoDB's duplicate-key error code (E11000).
const DUPLICATE_KEY: i32 = 11000;

/// Server error codes after which the operation may or may not have been
/// applied, or was refused only because the server is changing state (a
/// step-down, a shutdown, a timeout): the truth is unknown, so the caller must
/// retry rather than conclude.
const UNKNOWN_OUTCOME_CODES: &[i32] = &[
    6,     // HostUnreachable
    7,     // HostNotFound
    50,    // MaxTimeMSExpired
    64,    // WriteConcernFailed
    89,    // NetworkTimeout
    91,    // ShutdownInProgress
    189,   // PrimarySteppedDown
    262,   // ExceededTimeLimit
    9001,  // SocketException
    10107, // NotWritablePrimary
    11600, // InterruptedAtShutdown
    11602, // InterruptedDueToReplStateChange
    13435, // NotPrimaryNoSecondaryOk
    13436, // NotPrimaryOrSecondary
];

/// Whether `e` is a duplicate-key error.
///
/// A racing upsert loses with E11000. Inside `findAndModify` the server reports
/// it as a command error, in `update`/`insert` as a write error, and the
/// driver does not expose one `code()` for both: match both shapes.
pub(crate) fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => c.code == DUPLICATE_KEY,
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == DUPLICATE_KEY,
        _ => false,
    }
}

/// Maps a driver error to [`lease_core::Error`]: transport failures, timeouts
/// and server state changes are [`lease_core::Error::Unavailable`] (the
/// request may have been applied); anything else the server refused is
/// [`lease_core::Error::Backend`].
pub(crate) fn map(op: &'static str, e: mongodb::error::Error) -> lease_core::Error {
    if unknown_outcome(&e) {
        lease_core::Error::unavailable(format!("lease-mongo: {op}"), e)
    } else {
        lease_core::Error::Backend(Box::new(e))
    }
}

/// Runs one operation within `timeout`; past it, the outcome is unknown
/// ([`lease_core::Error::no_answer`]).
pub(crate) async fn bounded<T>(
    op: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, lease_core::Error>>,
) -> Result<T, lease_core::Error> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(lease_core::Error::no_answer(
            format!("lease-mongo: {op}"),
            timeout,
        )),
    }
}

fn unknown_outcome(e: &mongodb::error::Error) -> bool {
    if e.contains_label("RetryableWriteError")
        || e.contains_label("TransientTransactionError")
        || e.contains_label("NetworkError")
    {
        return true;
    }
    match e.kind.as_ref() {
        ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::ServerSelection { .. }
        | ErrorKind::DnsResolve { .. }
        | ErrorKind::InvalidResponse { .. }
        | ErrorKind::Shutdown => true,
        // A write concern error comes after the write was applied on the primary.
        ErrorKind::Write(WriteFailure::WriteConcernError(_)) => true,
        ErrorKind::Write(WriteFailure::WriteError(w)) => UNKNOWN_OUTCOME_CODES.contains(&w.code),
        ErrorKind::Command(c) => UNKNOWN_OUTCOME_CODES.contains(&c.code),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{doc, from_document};
    use mongodb::error::{CommandError, Error, WriteError};

    fn command(code: i32) -> Error {
        let c: CommandError =
            from_document(doc! { "code": code, "codeName": "X", "errmsg": "m" }).unwrap();
        Error::from(ErrorKind::Command(c))
    }

    fn write(code: i32) -> Error {
        let w: WriteError = from_document(doc! { "code": code, "errmsg": "m" }).unwrap();
        Error::from(ErrorKind::Write(WriteFailure::WriteError(w)))
    }

    #[test]
    fn duplicate_key_in_either_shape() {
        assert!(is_duplicate_key(&command(11000)));
        assert!(is_duplicate_key(&write(11000)));
        assert!(!is_duplicate_key(&command(11600)));
        assert!(!is_duplicate_key(&write(2)));
    }

    #[test]
    fn unknown_outcomes_are_unavailable() {
        let io = Error::from(ErrorKind::Io(std::sync::Arc::new(
            std::io::ErrorKind::ConnectionReset.into(),
        )));
        for e in [io, command(10107), command(91), write(64)] {
            assert!(map("op", e).is_unknown_outcome());
        }
        // A refusal that cannot have been applied: the server said no.
        for e in [command(13), command(2), write(121)] {
            assert!(matches!(map("op", e), lease_core::Error::Backend(_)));
        }
    }
}
