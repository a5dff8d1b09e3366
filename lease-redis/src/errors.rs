//! Mapping the client's errors onto the contract's: unknown outcome or
//! refusal.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Maps a client error to [`lease_core::Error`]: a lost or refused
/// connection, an I/O error, and a server that cannot serve the request
/// now (loading its data, busy with a script, a replica, a cluster that is
/// down or moving the slot) are [`lease_core::Error::Unavailable`] (the
/// request may have been applied, or may be applied if retried); anything
/// else the server refused (a permission, a wrong password, out of memory,
/// a script error) is [`lease_core::Error::Backend`].
pub(crate) fn map(op: &'static str, e: RedisError) -> lease_core::Error {
    if unknown_outcome(&e) {
        lease_core::Error::unavailable(format!("lease-redis: {op}"), e)
    } else {
        lease_core::Error::Backend(format!("lease-redis: {op}: {e}").into())
    }
}

/// Whether `e` leaves the connection unusable: it is then closed, never
/// used again.
pub(crate) fn breaks_connection(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() || e.is_timeout()
}

fn unknown_outcome(e: &RedisError) -> bool {
    // Refused credentials end the connection too, but nothing ran.
    if refused(e) {
        return false;
    }
    if breaks_connection(e) {
        return true;
    }
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
        )
    ) || matches!(
        e.code(),
        Some("BUSY" | "LOADING" | "MASTERDOWN" | "READONLY")
    )
}

/// Whether the server refused who we are: a wrong user or password, or a
/// permission the user lacks.
fn refused(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm)
    ) || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
}

/// The outcome of a request that did not answer in time.
pub(crate) fn timed_out(op: &'static str, after: Duration) -> lease_core::Error {
    lease_core::Error::no_answer(format_args!("lease-redis: {op}"), after)
}

/// Whether `e` is the server's `NOSCRIPT`: the script is not in its cache
/// (a restart, a failover, `SCRIPT FLUSH`), so nothing ran.
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Server(ServerErrorKind::NoScript)) || e.code() == Some("NOSCRIPT")
}
