//! The schemes of backend URLs, and the backend each names.

use std::fmt;

/// The backends a URL can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// `etcd://`, `etcds://`
    Etcd,
    /// `nats://`, `natss://`
    Nats,
    /// `mongodb://`, `mongodb+srv://`
    Mongo,
    /// `s3://`
    S3,
    /// `memory://`
    Memory,
    /// `postgres://`, `postgresql://`
    Postgres,
    /// `redis://`, `rediss://`, `valkey://`, `valkeys://`
    Redis,
}

/// The schemes, for messages.
pub const SCHEMES: &str =
    "etcd://, etcds://, nats://, natss://, mongodb://, s3://, memory://, postgres://, redis://, rediss://";

/// Every scheme: the backend it names, and whether it asks for TLS.
const TABLE: [(&str, BackendKind, bool); 14] = [
    ("etcd", BackendKind::Etcd, false),
    ("etcds", BackendKind::Etcd, true),
    ("nats", BackendKind::Nats, false),
    ("natss", BackendKind::Nats, true),
    ("mongodb", BackendKind::Mongo, false),
    ("mongodb+srv", BackendKind::Mongo, false),
    ("s3", BackendKind::S3, false),
    ("memory", BackendKind::Memory, false),
    ("postgres", BackendKind::Postgres, false),
    ("postgresql", BackendKind::Postgres, false),
    ("redis", BackendKind::Redis, false),
    ("rediss", BackendKind::Redis, true),
    ("valkey", BackendKind::Redis, false),
    ("valkeys", BackendKind::Redis, true),
];

impl BackendKind {
    /// The backend `scheme` names, and whether the scheme asks for TLS.
    pub(crate) fn of_scheme(scheme: &str) -> Option<(BackendKind, bool)> {
        TABLE
            .iter()
            .find(|(s, _, _)| *s == scheme)
            .map(|&(_, kind, tls)| (kind, tls))
    }

    /// The backend's name: `etcd`, `nats`, `mongodb`, `s3`, `memory`,
    /// `postgres` or `redis`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Etcd => "etcd",
            BackendKind::Nats => "nats",
            BackendKind::Mongo => "mongodb",
            BackendKind::S3 => "s3",
            BackendKind::Memory => "memory",
            BackendKind::Postgres => "postgres",
            BackendKind::Redis => "redis",
        }
    }

    /// The cargo feature of this crate that brings the backend in.
    pub fn feature(self) -> &'static str {
        match self {
            BackendKind::Etcd => "etcd",
            BackendKind::Nats => "nats",
            BackendKind::Mongo => "mongo",
            BackendKind::S3 => "s3",
            BackendKind::Memory => "fake",
            BackendKind::Postgres => "postgres",
            BackendKind::Redis => "redis",
        }
    }

    /// Whether this build has the backend's feature.
    pub fn is_enabled(self) -> bool {
        match self {
            BackendKind::Etcd => cfg!(feature = "etcd"),
            BackendKind::Nats => cfg!(feature = "nats"),
            BackendKind::Mongo => cfg!(feature = "mongo"),
            BackendKind::S3 => cfg!(feature = "s3"),
            BackendKind::Memory => cfg!(feature = "fake"),
            BackendKind::Postgres => cfg!(feature = "postgres"),
            BackendKind::Redis => cfg!(feature = "redis"),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scheme of the table is in the list messages show, and the
    /// other way round (`mongodb+srv`, `postgresql`, `valkey` and `valkeys`
    /// are spelled out in the URL grammar instead).
    #[test]
    fn the_table_and_the_list_agree() {
        for (scheme, _, _) in TABLE {
            assert!(
                SCHEMES.contains(&format!("{scheme}://"))
                    || ["mongodb+srv", "postgresql", "valkey", "valkeys"].contains(&scheme),
                "{scheme}"
            );
        }
        for listed in SCHEMES.split(", ") {
            let scheme = listed.trim_end_matches("://");
            assert!(BackendKind::of_scheme(scheme).is_some(), "{scheme}");
        }
    }
}
