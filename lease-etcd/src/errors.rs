//! Sorting etcd client errors into "known not applied" and "outcome unknown".

use std::future::Future;
use std::time::Duration;

use etcd_client::Error as EtcdError;
use lease_core::Error;
use tonic::Code as G;

/// What an etcd-client error means for our purposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Code {
    /// The request may or may not have been applied.
    Unknown,
    /// The server refused it: nothing was applied.
    Refused,
    /// The lease (or key) named does not exist.
    NotFound,
}

/// Classifies an etcd-client error.
fn classify(e: &EtcdError) -> Code {
    match e {
        EtcdError::GRpcStatus(status) => {
            match status.code() {
                G::NotFound => Code::NotFound,
                // "etcdserver: not leader" comes with FailedPrecondition
                // during a leader change: transient, retried like
                // Unavailable.
                G::FailedPrecondition if status.message().contains("not leader") => Code::Unknown,
                G::InvalidArgument
                | G::PermissionDenied
                | G::Unauthenticated
                | G::FailedPrecondition
                | G::OutOfRange
                | G::AlreadyExists
                | G::Unimplemented => Code::Refused,
                // Unavailable ("leader changed", "no leader"), DeadlineExceeded
                // ("request timed out"), Cancelled, Aborted, Internal, Unknown,
                // ResourceExhausted, DataLoss: etcd may have applied it.
                _ => Code::Unknown,
            }
        }
        EtcdError::TransportError(_)
        | EtcdError::IoError(_)
        | EtcdError::WatchError(_)
        | EtcdError::LeaseKeepAliveError(_)
        | EtcdError::Internal(_) => Code::Unknown,
        _ => Code::Refused,
    }
}

/// Whether etcd says the lease does not exist (expired or revoked).
pub(crate) fn is_lease_not_found(e: &EtcdError) -> bool {
    match e {
        // etcd-client reports a keepalive answered with TTL 0 this way.
        EtcdError::LeaseKeepAliveError(m) => m == "lease not found",
        EtcdError::GRpcStatus(s) => {
            classify(e) == Code::NotFound || s.message().contains("requested lease not found")
        }
        _ => false,
    }
}

/// Converts an etcd-client error from operation `what`.
pub(crate) fn convert(what: &str, e: EtcdError) -> Error {
    match classify(&e) {
        Code::Unknown => Error::unavailable(format!("etcd {what}"), e),
        Code::Refused | Code::NotFound => Error::Backend(Box::new(Refused {
            what: what.to_string(),
            source: e,
        })),
    }
}

/// A request etcd refused, with the operation that was refused.
#[derive(Debug)]
struct Refused {
    what: String,
    source: EtcdError,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd refused {}", self.what)
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Runs one request under the configured timeout; a timeout is an unknown
/// outcome, like a lost connection.
pub(crate) async fn timed<T>(
    what: &str,
    limit: Duration,
    fut: impl Future<Output = Result<T, EtcdError>>,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(convert(what, e)),
        Err(_) => Err(Error::no_answer(format_args!("etcd {what}"), limit)),
    }
}

/// Like [`timed`], but keeps the raw etcd error for callers that must tell
/// "lease not found" apart.
pub(crate) async fn timed_raw<T>(
    what: &str,
    limit: Duration,
    fut: impl Future<Output = Result<T, EtcdError>>,
) -> Result<Result<T, EtcdError>, Error> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| Error::no_answer(format_args!("etcd {what}"), limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: G, message: &str) -> EtcdError {
        EtcdError::GRpcStatus(tonic::Status::new(code, message))
    }

    /// etcd's own statuses (server/etcdserver/api/v3rpc/rpctypes): a leader
    /// change is transient (retried), a refusal is final.
    #[test]
    fn a_leader_change_is_an_unknown_outcome_not_a_refusal() {
        for (code, message) in [
            (G::FailedPrecondition, "etcdserver: not leader"),
            (G::Unavailable, "etcdserver: leader changed"),
            (G::Unavailable, "etcdserver: no leader"),
        ] {
            assert!(
                convert("txn", status(code, message)).is_unknown_outcome(),
                "{code:?} {message:?} must be retried"
            );
        }
        for (code, message) in [
            (G::FailedPrecondition, "etcdserver: not capable"),
            (G::InvalidArgument, "etcdserver: request is too large"),
            (G::PermissionDenied, "etcdserver: permission denied"),
        ] {
            assert!(
                !convert("txn", status(code, message)).is_unknown_outcome(),
                "{code:?} {message:?} is a refusal"
            );
        }
    }
}
