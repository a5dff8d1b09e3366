//! Mapping the client's errors onto the contract's: unknown outcome or
//! refusal.

use tokio_postgres::error::SqlState;

/// Maps a client error to [`lease_core::Error`]: a lost connection, a
/// server shutting down or refusing connections, a cancelled statement, a
/// serialization failure or a deadlock is [`lease_core::Error::Unavailable`]
/// (the statement may have been applied); anything else the server refused
/// is [`lease_core::Error::Backend`].
pub(crate) fn map(op: &'static str, e: tokio_postgres::Error) -> lease_core::Error {
    if unknown_outcome(&e) {
        lease_core::Error::unavailable(format!("lease-postgres: {op}"), e)
    } else {
        lease_core::Error::Backend(Box::new(e))
    }
}

fn unknown_outcome(e: &tokio_postgres::Error) -> bool {
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection failed or closed (I/O, TLS, protocol).
        return true;
    };
    let class = code.code().get(..2).unwrap_or("");
    matches!(class, "08" | "53" | "57" | "58" | "40")
        || *code == SqlState::QUERY_CANCELED
        || *code == SqlState::ADMIN_SHUTDOWN
}

/// Maps a pool error: every one of them (a timeout waiting for a
/// connection, a connection that could not be made) leaves the outcome
/// unknown.
pub(crate) fn map_pool(op: &'static str, e: deadpool_postgres::PoolError) -> lease_core::Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => map(op, e),
        other => lease_core::Error::unavailable(format!("lease-postgres: {op}"), other),
    }
}

/// The outcome of a request that did not answer in time.
pub(crate) fn timed_out(op: &'static str, after: std::time::Duration) -> lease_core::Error {
    lease_core::Error::no_answer(format_args!("lease-postgres: {op}"), after)
}
