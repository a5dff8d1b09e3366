//! What the server's persistence and eviction settings promise the grants
//! and fences, read once at connect (`CONFIG GET`), where the server
//! allows it.

use lease_core::Error;
use redis::Value;

use crate::client::Client;

/// The server's persistence and eviction settings, as `CONFIG GET`
/// answered at connect: what a restart of the server, or its memory
/// running full, does to acknowledged grants and fences (see the crate's
/// README, *Durability*). A field is `None` when the server did not say
/// (managed services and restrictive ACLs refuse `CONFIG`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Persistence {
    /// `appendonly`: whether the server keeps an append-only file.
    pub append_only: Option<bool>,
    /// `appendfsync`: `always`, `everysec` or `no`.
    pub append_fsync: Option<String>,
    /// `save`: the RDB snapshot schedule (empty: no snapshots).
    pub save: Option<String>,
    /// `maxmemory`: the memory limit in bytes (0: none).
    pub max_memory: Option<u64>,
    /// `maxmemory-policy`: what the server does at the memory limit
    /// (`noeviction`: refuses writes; any other policy evicts keys).
    pub max_memory_policy: Option<String>,
}

impl Persistence {
    /// Whether every acknowledged write survives a crash of the server
    /// (`appendonly yes` with `appendfsync always`): `None` when the
    /// settings are unknown.
    pub fn keeps_acknowledged_writes(&self) -> Option<bool> {
        match (self.append_only, self.append_fsync.as_deref()) {
            (Some(false), _) => Some(false),
            (Some(true), Some(fsync)) => Some(fsync == "always"),
            _ => None,
        }
    }

    /// Whether the server may evict keys when its memory runs full (a
    /// `maxmemory` with a policy other than `noeviction`): a grant evicted
    /// is a key free while its holder may still write (two holders).
    /// `None` when the settings are unknown.
    pub fn may_evict_grants(&self) -> Option<bool> {
        match (self.max_memory, self.max_memory_policy.as_deref()) {
            (_, Some("noeviction")) | (Some(0), _) => Some(false),
            (Some(_), Some(_)) => Some(true),
            _ => None,
        }
    }

    /// Reads the settings; says on the log what they mean for grants and
    /// fences.
    /// Fails when the server cannot be reached or refuses the connection
    /// (no or wrong credentials); a `CONFIG` the user may not run is an
    /// unknown setting.
    pub(crate) async fn read(client: &Client) -> Result<Persistence, Error> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET")
            .arg("appendonly")
            .arg("appendfsync")
            .arg("save")
            .arg("maxmemory")
            .arg("maxmemory-policy");
        let deadline = tokio::time::Instant::now() + client.request_timeout();
        let found = match client.run("connect", &cmd, deadline, true).await? {
            Ok(v) => Persistence::of(&v),
            // Anything but a `CONFIG` the user may not run (NOPERM) or the
            // server does not offer (renamed or disabled: ERR unknown
            // command) fails the connect: a connection refused its
            // credentials (NOAUTH) would fail every operation.
            Err(e) if !matches!(e.code(), Some("NOPERM" | "ERR")) => {
                return Err(crate::errors::map("connect", e));
            }
            Err(e) => {
                tracing::info!(
                    "lease-redis: the server's persistence settings are unknown (CONFIG GET: {e}); \
                     a restart without `appendonly yes` and `appendfsync always` can lose \
                     acknowledged grants, and a `maxmemory-policy` other than `noeviction` can \
                     evict live ones"
                );
                return Ok(Persistence::default());
            }
        };
        match found.keeps_acknowledged_writes() {
            Some(true) => {}
            Some(false) => tracing::warn!(
                "lease-redis: the server runs with appendonly {:?}, appendfsync {:?}: a crash or \
                 restart can lose acknowledged grants (two holders until their deadlines); fences \
                 keep rising as long as the server's clock does not step back",
                found.append_only,
                found.append_fsync
            ),
            None => tracing::info!(
                "lease-redis: the server's persistence settings are partly unknown: {found:?}"
            ),
        }
        if found.may_evict_grants() == Some(true) {
            tracing::warn!(
                "lease-redis: the server evicts keys at its memory limit (maxmemory {:?}, \
                 maxmemory-policy {:?}): an evicted grant frees its key while its holder may \
                 still write (two holders); run the lease keys with maxmemory-policy noeviction",
                found.max_memory,
                found.max_memory_policy
            );
        }
        Ok(found)
    }

    /// The settings in a `CONFIG GET` answer: name and value pairs, as an
    /// array (RESP2) or a map (RESP3).
    fn of(v: &Value) -> Persistence {
        let text = |v: &Value| match v {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let pairs: Vec<(Option<String>, Option<String>)> = match v {
            Value::Array(items) => items
                .chunks(2)
                .map(|p| (p.first().and_then(text), p.get(1).and_then(text)))
                .collect(),
            Value::Map(items) => items.iter().map(|(k, v)| (text(k), text(v))).collect(),
            _ => Vec::new(),
        };
        let mut found = Persistence::default();
        for (name, value) in pairs {
            match name.as_deref() {
                Some("appendonly") => found.append_only = value.map(|v| v == "yes"),
                Some("appendfsync") => found.append_fsync = value,
                Some("save") => found.save = value,
                Some("maxmemory") => found.max_memory = value.and_then(|v| v.parse().ok()),
                Some("maxmemory-policy") => found.max_memory_policy = value,
                _ => {}
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn config_answers_say_whether_acknowledged_writes_survive() {
        let v = Value::Array(vec![
            bulk("appendonly"),
            bulk("yes"),
            bulk("appendfsync"),
            bulk("always"),
            bulk("save"),
            bulk(""),
        ]);
        let p = Persistence::of(&v);
        assert_eq!(p.append_only, Some(true));
        assert_eq!(p.save.as_deref(), Some(""));
        assert_eq!(p.keeps_acknowledged_writes(), Some(true));
        let v = Value::Map(vec![
            (bulk("appendonly"), bulk("yes")),
            (bulk("appendfsync"), bulk("everysec")),
        ]);
        assert_eq!(Persistence::of(&v).keeps_acknowledged_writes(), Some(false));
        let v = Value::Array(vec![bulk("appendonly"), bulk("no")]);
        assert_eq!(Persistence::of(&v).keeps_acknowledged_writes(), Some(false));
        assert_eq!(
            Persistence::of(&Value::Nil).keeps_acknowledged_writes(),
            None
        );
        assert_eq!(Persistence::of(&Value::Nil).may_evict_grants(), None);
        for (max, policy, evicts) in [
            ("0", "volatile-lru", false),
            ("1048576", "noeviction", false),
            ("1048576", "volatile-lru", true),
            ("1048576", "allkeys-random", true),
        ] {
            let v = Value::Array(vec![
                bulk("maxmemory"),
                bulk(max),
                bulk("maxmemory-policy"),
                bulk(policy),
            ]);
            assert_eq!(
                Persistence::of(&v).may_evict_grants(),
                Some(evicts),
                "{policy}"
            );
        }
    }
}
