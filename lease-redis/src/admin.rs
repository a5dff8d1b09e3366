//! Administrative operations: [`break_lease`](lease_core::LeaseBackend::break_lease)
//! and [`last_break`](lease_core::LeaseBackend::last_break).
//!
//! A break is one script (see `scripts`): it ends whatever is at the lease
//! key (a live grant, or a value that is not a lease record), keeps the
//! fence counter above every fence the key was granted (for a corrupt
//! value, at least the server's clock in microseconds), appends the audit
//! record to `{prefix}{key}:audit` (a list, oldest first; the shared schema
//! of [`lease_core::audit`] with `format: "lease-redis-audit/1"` and `seq`,
//! the record's position in the list from 1) and publishes the change. The
//! server runs it whole or not at all; a break that timed out may or may
//! not have run: read the key and its last break before breaking again.

use lease_core::audit::{self, AuditRecord};
use lease_core::{BreakNote, Broken, Error, LastBreak, LeaseKey};
use redis::Value;

use crate::backend::RedisBackend;
use crate::record::{unexpected, Answer};

/// The `format` of this backend's audit records.
pub(crate) const AUDIT_FORMAT: &str = "lease-redis-audit/1";

impl RedisBackend {
    pub(crate) async fn break_lease(
        &self,
        key: &LeaseKey,
        note: &BreakNote,
    ) -> Result<Broken, Error> {
        let keys = self.keys(key);
        let head = audit_head(key, note);
        let v = self
            .inner
            .client
            .eval(
                &self.inner.scripts.break_lease,
                &[
                    keys.lease.as_bytes(),
                    keys.counter.as_bytes(),
                    keys.audit.as_bytes(),
                ],
                &[
                    self.inner.channel.as_bytes(),
                    key.as_str().as_bytes(),
                    head.as_bytes(),
                ],
            )
            .await?;
        let answer = Answer::of(key, &v)?;
        if answer.outcome != "broken" {
            return Err(unexpected("break", answer.outcome));
        }
        let seq = answer.text(0).unwrap_or("?");
        let previous = if answer.has(1) {
            Some(answer.holding(key, 1)?)
        } else {
            None
        };
        Ok(Broken::new(previous, format!("{} #{seq}", keys.audit)))
    }

    pub(crate) async fn last_break(&self, key: &LeaseKey) -> Result<Option<LastBreak>, Error> {
        let keys = self.keys(key);
        let mut cmd = redis::cmd("LINDEX");
        cmd.arg(&keys.audit).arg(-1);
        let deadline = tokio::time::Instant::now() + self.inner.client.request_timeout();
        match self
            .inner
            .client
            .run("last break", &cmd, deadline, true)
            .await?
        {
            Ok(Value::Nil) => Ok(None),
            Ok(Value::BulkString(record)) => AuditRecord::from_json(&record, AUDIT_FORMAT, key)
                .map(|r| Some(r.last_break()))
                .map_err(|detail| {
                    Error::corrupt(key, format!("its newest audit record: {detail}"))
                }),
            Ok(other) => Err(Error::corrupt(
                key,
                format!("its audit key answered {other:?}, not a record"),
            )),
            Err(e) if e.code() == Some("WRONGTYPE") => Err(Error::corrupt(
                key,
                format!("its audit key {} is not a list", keys.audit),
            )),
            Err(e) => Err(crate::errors::map("last break", e)),
        }
    }
}

/// The audit record's members the breaker knows (format, action, key and
/// the note), as JSON object members without the braces, for the script
/// to complete with what it finds at the key.
fn audit_head(key: &LeaseKey, note: &BreakNote) -> String {
    let head = serde_json::json!({
        audit::FORMAT: AUDIT_FORMAT,
        audit::ACTION: audit::ACTION_BREAK,
        audit::KEY: key.as_str(),
        audit::BY: note.by,
        audit::REASON: note.reason,
        audit::AT_UNIX_MS: note.at_unix_ms,
    })
    .to_string();
    head.strip_prefix('{')
        .and_then(|h| h.strip_suffix('}'))
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_and_the_scripts_members_make_a_shared_record() {
        let key = LeaseKey::new("jobs/a").unwrap();
        let note = BreakNote::new("ops \"x\" {y}", "stuck}").with_at_unix_ms(17);
        let head = audit_head(&key, &note);
        // What the script appends for a free key.
        let json = format!(
            "{{{head},\"seq\":1,\"previous\":null,\"removed_corrupt_record\":false,\"removed\":null}}"
        );
        let record = AuditRecord::from_json(json.as_bytes(), AUDIT_FORMAT, &key).unwrap();
        assert_eq!(record.note, note);
        assert_eq!(record.seq, Some(1));
        assert_eq!(
            record,
            AuditRecord::new(Some(AUDIT_FORMAT), &key, &note, None, None).with_seq(1)
        );
    }
}
