//! The keys of a lease, the TTL rule, and the scripts' answers read back
//! into the contract's types (the record itself is written and judged by
//! the scripts: see `scripts`).

use std::time::Duration;

use lease_core::{Error, Fence, HolderId, Holding, LeaseKey, Payload, TtlRule};
use redis::Value;

use crate::config::RedisConfig;
use crate::scripts::MAX_FENCE;

/// The TTLs accepted, in milliseconds (the scripts check the same range).
pub(crate) const MIN_TTL_MS: u64 = 1_000;
pub(crate) const MAX_TTL_MS: u64 = 86_400_000;

/// TTLs in whole milliseconds (the unit of `PX`), from 1 s to 1 day.
pub(crate) const TTL_RULE: TtlRule =
    TtlRule::new(Duration::from_millis(MIN_TTL_MS)..=Duration::from_millis(MAX_TTL_MS))
        .rounded_to(Duration::from_millis(1));

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The Redis keys of one lease.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) lease: String,
    pub(crate) counter: String,
    pub(crate) audit: String,
}

impl Keys {
    pub(crate) fn of(config: &RedisConfig, key: &LeaseKey) -> Keys {
        Keys {
            lease: config.lease_key(key),
            counter: config.counter_key(key),
            audit: config.audit_key(key),
        }
    }
}

/// An outcome no script of this crate answers `op` with.
pub(crate) fn unexpected(op: &str, outcome: &str) -> Error {
    Error::Backend(
        format!("lease-redis: {op}: unexpected outcome {outcome:?} from the script").into(),
    )
}

/// A script's answer: its outcome tag and the values after it.
#[derive(Debug)]
pub(crate) struct Answer<'a> {
    pub(crate) outcome: &'a str,
    rest: &'a [Value],
}

impl<'a> Answer<'a> {
    /// The answer `v` of a script for `key`: an array whose first element
    /// is the outcome. `corrupt`, `refused` and `denied` answers are the
    /// error they report.
    pub(crate) fn of(key: &LeaseKey, v: &'a Value) -> Result<Answer<'a>, Error> {
        let unexpected = || Error::Backend(format!("lease-redis: unexpected answer {v:?}").into());
        let Value::Array(items) = v else {
            return Err(unexpected());
        };
        let (first, rest) = items.split_first().ok_or_else(unexpected)?;
        let outcome = text(first).ok_or_else(unexpected)?;
        let detail = rest
            .first()
            .and_then(text)
            .unwrap_or("a stored value is not valid");
        match outcome {
            "corrupt" => Err(Error::corrupt(
                key,
                format!(
                    "{detail}; it is left as it is: break the lease to replace it \
                     (lease-redis/1 records)"
                ),
            )),
            // The script's own advice: a break would not mend these.
            "refused" => Err(Error::corrupt(key, detail)),
            // The server would refuse a command the script runs (ACL): the
            // script stopped before its first write.
            "denied" => Err(Error::Backend(
                format!("lease-redis: {key}: {detail}; nothing was changed").into(),
            )),
            _ => Ok(Answer { outcome, rest }),
        }
    }

    /// The holding the values from `at` on describe: holder, fence, TTL,
    /// payload, remaining milliseconds.
    pub(crate) fn holding(&self, key: &LeaseKey, at: usize) -> Result<Holding, Error> {
        let bad = |what: &str| {
            Error::Backend(format!("lease-redis: unexpected {what} in the answer for {key}").into())
        };
        let field = |i: usize| self.rest.get(at + i);
        let holder = field(0).and_then(text).ok_or_else(|| bad("holder"))?;
        let holder = HolderId::new(holder)
            .map_err(|e| Error::corrupt(key, format!("the record's holder: {e}")))?;
        let fence = field(1)
            .and_then(text)
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|f| (1..=MAX_FENCE).contains(f))
            .ok_or_else(|| bad("fence"))?;
        let ttl = field(2)
            .and_then(text)
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_millis)
            .ok_or_else(|| bad("TTL"))?;
        let payload = match field(3) {
            Some(Value::BulkString(b)) => b.clone(),
            _ => return Err(bad("payload")),
        };
        let payload = Payload::new(payload)
            .map_err(|e| Error::corrupt(key, format!("the record's payload: {e}")))?;
        let remaining = match field(4) {
            Some(Value::Int(ms)) => u64::try_from(*ms).ok().map(Duration::from_millis),
            _ => return Err(bad("remaining time")),
        };
        Ok(Holding::new(holder, Fence(fence), ttl, payload)
            .with_remaining(remaining.map(|r| r.min(ttl))))
    }

    /// Value `i` after the outcome, as text.
    pub(crate) fn text(&self, i: usize) -> Option<&'a str> {
        self.rest.get(i).and_then(text)
    }

    /// Whether there are values from `i` on.
    pub(crate) fn has(&self, i: usize) -> bool {
        self.rest.len() > i
    }
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LeaseKey {
        LeaseKey::new("jobs/a").unwrap()
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn answers_read_back_as_holdings_and_errors() {
        let v = Value::Array(vec![
            bulk("held"),
            bulk("h-1"),
            bulk("1760000000000000"),
            bulk("5000"),
            bulk("pay"),
            Value::Int(4000),
        ]);
        let a = Answer::of(&key(), &v).unwrap();
        assert_eq!(a.outcome, "held");
        let h = a.holding(&key(), 0).unwrap();
        assert_eq!(h.holder.as_str(), "h-1");
        assert_eq!(h.fence, Fence(1_760_000_000_000_000));
        assert_eq!(h.ttl, Duration::from_secs(5));
        assert_eq!(h.payload.as_bytes(), b"pay");
        assert_eq!(h.remaining, Some(Duration::from_secs(4)));

        let v = Value::Array(vec![bulk("corrupt"), bulk("the lease key holds a hash")]);
        match Answer::of(&key(), &v) {
            Err(Error::CorruptRecord { key, detail }) => {
                assert_eq!(key, "jobs/a");
                assert!(detail.starts_with("the lease key holds a hash"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        for bad in [Value::Nil, Value::Array(vec![]), Value::Int(1)] {
            assert!(matches!(Answer::of(&key(), &bad), Err(Error::Backend(_))));
        }
        let v = Value::Array(vec![bulk("refused"), bulk("move it away")]);
        match Answer::of(&key(), &v) {
            Err(Error::CorruptRecord { detail, .. }) => assert_eq!(detail, "move it away"),
            other => panic!("{other:?}"),
        }
        let v = Value::Array(vec![
            bulk("denied"),
            bulk("the user may not run PUBLISH on p:changed (ACL)"),
        ]);
        match Answer::of(&key(), &v) {
            Err(Error::Backend(e)) => assert!(e.to_string().contains("nothing was changed")),
            other => panic!("{other:?}"),
        }
        let v = Value::Array(vec![bulk("held"), bulk("h"), bulk("0")]);
        assert!(Answer::of(&key(), &v).unwrap().holding(&key(), 0).is_err());
    }
}
