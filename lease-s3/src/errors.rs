//! How object store client errors become [`lease_core::Error`]s: a known
//! refusal is a definite error, anything else has an unknown outcome.

use lease_core::Error;
use object_store::path::Path;

/// Maps a client error whose meaning is not a precondition outcome.
pub(crate) fn store_error(op: &str, path: &Path, e: object_store::Error) -> Error {
    use object_store::Error as E;
    match e {
        // Known refusals: the request was not applied and retrying will not help.
        E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::InvalidPath { .. }
        | E::UnknownConfigurationKey { .. }
        | E::NotSupported { .. }
        | E::NotImplemented { .. } => Error::Backend(format!("{op} {path}: {e}").into()),
        // Transport failures, timeouts, 5xx after retries: the outcome is unknown.
        other => Error::unavailable(format!("{op} {path}"), other),
    }
}

/// Maps the error of a conditional PUT that is not a precondition outcome.
///
/// Some clients refuse a request before sending it (GCS without an object
/// version, S3 or Azure without an ETag, a store without conditional puts):
/// nothing was applied, and a retry would be refused the same way, so those
/// are definite errors, never "outcome unknown".
pub(crate) fn put_error(path: &Path, e: object_store::Error) -> Error {
    use object_store::Error as E;
    match e {
        E::NotImplemented { .. } | E::NotSupported { .. } => Error::Unsupported {
            operation: "conditional put (PutMode::Create and PutMode::Update)",
        },
        E::Generic { store, source } if refused_locally(&*source) => Error::Backend(
            format!(
                "PUT {path}: the {store} client refused the conditional write before sending it \
                 (nothing was written): {source}"
            )
            .into(),
        ),
        other => store_error("PUT", path, other),
    }
}

/// Whether a client error is one of object_store's own checks of a
/// conditional write, made before any request is sent.
fn refused_locally(source: &(dyn std::error::Error + Send + Sync)) -> bool {
    let msg = source.to_string();
    [
        "Version required for conditional update",
        "ETag required for conditional put",
        "ETag required for conditional update",
    ]
    .iter()
    .any(|m| msg.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(msg: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "GCS",
            source: msg.to_owned().into(),
        }
    }

    #[test]
    fn writes_refused_before_sending_are_definite_errors() {
        let path = Path::from("leases/k");
        for msg in [
            "Version required for conditional update",
            "ETag required for conditional put",
            "ETag required for conditional update",
        ] {
            let e = put_error(&path, generic(msg));
            assert!(
                matches!(e, Error::Backend(_)) && !e.is_unknown_outcome(),
                "{msg}: {e:?}"
            );
        }
        let e = put_error(
            &path,
            object_store::Error::NotImplemented {
                operation: "put_opts Update".into(),
                implementer: "LocalFileSystem".into(),
            },
        );
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        let e = put_error(
            &path,
            object_store::Error::UnknownConfigurationKey {
                store: "S3",
                key: "x".into(),
            },
        );
        assert!(!e.is_unknown_outcome(), "{e:?}");
        // Anything else from the transport may have been applied.
        assert!(put_error(&path, generic("connection reset")).is_unknown_outcome());
    }
}
