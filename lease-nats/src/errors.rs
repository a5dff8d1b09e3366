//! How async-nats errors become [`lease_core::Error`]s: a refusal the server
//! answered is a definite error, a lost or unanswered request has an unknown
//! outcome.

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::stream::{LastRawMessageError, LastRawMessageErrorKind};
use lease_core::{BoxError, Error, LeaseKey, CONTENTION_ATTEMPTS};

pub(crate) fn refused(reason: String) -> Error {
    Error::Backend(reason.into())
}

/// The server stored a message at `seq`, not above the sequence `floor` this
/// client had seen before sending it: the bucket's stream sequence went
/// backwards (data restored from an older copy, the bucket deleted and made
/// again, or a server that lost it). Fences from it could repeat earlier ones.
/// `applied`: whether what was stored stays (the outcome is then reported
/// unknown) or was taken back.
pub(crate) fn rewound(key: &LeaseKey, op: &str, seq: u64, floor: u64, applied: bool) -> Error {
    let detail = format!(
        "{op} of lease key {key}: the stream sequence went backwards (stored at {seq}, \
         but sequence {floor} was seen before): fences from this bucket could repeat earlier \
         ones, so none is given. Move the stream's sequence above {floor} (e.g. purge the \
         stream up to a sequence above it once no lease is held) or use a new bucket"
    );
    if applied {
        Error::Unavailable {
            detail,
            source: None,
        }
    } else {
        Error::Backend(detail.into())
    }
}

pub(crate) fn contended(key: &LeaseKey, op: &str) -> Error {
    Error::Unavailable {
        detail: format!(
            "{op} of lease key {key}: the key changed under {CONTENTION_ATTEMPTS} attempts in a row"
        ),
        source: None,
    }
}

pub(crate) fn connect_error(url: &str, e: async_nats::ConnectError) -> Error {
    use async_nats::ConnectErrorKind as K;
    match e.kind() {
        K::ServerParse | K::Authentication | K::AuthorizationViolation | K::Tls => {
            Error::Backend(Box::new(e) as BoxError)
        }
        _ => Error::unavailable(format!("cannot connect to NATS at {url}"), e),
    }
}

pub(crate) fn publish_error(key: &LeaseKey, e: PublishError) -> Error {
    match e.kind() {
        // Refused before sending.
        PublishErrorKind::MaxPayloadExceeded => Error::Backend(Box::new(e)),
        PublishErrorKind::Other => match js_error(&e) {
            // The server answered with a refusal: nothing was stored.
            Some(code) if code < 500 => Error::Backend(Box::new(e)),
            _ => Error::unavailable(format!("write of lease key {key}"), e),
        },
        // Timed out, connection lost, no responders (stream leader being
        // elected), too many acks pending: the outcome is unknown.
        _ => Error::unavailable(format!("write of lease key {key}"), e),
    }
}

pub(crate) fn read_error(key: &LeaseKey, e: LastRawMessageError) -> Error {
    match e.kind() {
        LastRawMessageErrorKind::InvalidSubject => Error::InvalidKey {
            key: key.to_string(),
            reason: "not a valid NATS subject token sequence",
        },
        LastRawMessageErrorKind::JetStream(js) if js.code() < 500 => Error::Backend(Box::new(e)),
        _ => Error::unavailable(format!("read of lease key {key}"), e),
    }
}

/// The JetStream API error behind `e`, if that is what it is.
pub(crate) fn js_source(e: &PublishError) -> Option<&async_nats::jetstream::Error> {
    std::error::Error::source(e)?.downcast_ref::<async_nats::jetstream::Error>()
}

/// The status code (HTTP-like) of the JetStream API error behind `e`.
pub(crate) fn js_error(e: &PublishError) -> Option<usize> {
    js_source(e).map(|js| js.code())
}

/// The JetStream error code (`err_code`) behind `e`.
pub(crate) fn js_error_code(e: &PublishError) -> Option<u64> {
    js_source(e).map(|js| js.error_code().0)
}
