//! `lease leader`: who leads a key's election now, and with `--watch`
//! every change of leader.

use std::time::Duration;

use clap::Args;
use lease::{Election, Keeper, Leader, LeaseKey};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::clients::Clients;
use crate::commands::{open, timed};
use crate::run::Signals;
use crate::util::{self, now_unix_ms, parse_duration, rfc3339_ms};
use crate::{Fail, KeyArgs};

#[derive(Args, Debug)]
pub struct LeaderArgs {
    #[command(flatten)]
    pub target: KeyArgs,
    /// After the current leader, print every change (a new leader, a new
    /// value, no leader) until interrupted or --for runs out.
    #[arg(long)]
    pub watch: bool,
    /// Print one JSON object per line (see the fields below).
    #[arg(long)]
    pub json: bool,
    /// With --watch: stop after this long (default: until interrupted).
    #[arg(long = "for", requires = "watch", allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    pub for_: Option<Duration>,
    /// With --watch: how often backends that cannot watch (MongoDB, S3) are
    /// read (default: a tenth of 10 s, between 50 ms and 1 s).
    #[arg(long, requires = "watch", allow_negative_numbers = true, value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Option<Duration>,
}

/// The leader's value for people and JSON: its UTF-8 text when it is valid
/// UTF-8, else standard padded base64.
fn value_text(bytes: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (s.to_owned(), "utf8"),
        Err(_) => (base64(bytes), "base64"),
    }
}

/// Standard base64 (RFC 4648, with padding).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sym = |i: u32| char::from(ALPHABET[(i & 63) as usize]);
    let mut out = String::with_capacity(bytes.len().div_ceil(3).saturating_mul(4));
    for chunk in bytes.chunks(3) {
        let b = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let n = (b(0) << 16) | (b(1) << 8) | b(2);
        out.push(sym(n >> 18));
        out.push(sym(n >> 12));
        out.push(if chunk.len() > 1 { sym(n >> 6) } else { '=' });
        out.push(if chunk.len() > 2 { sym(n) } else { '=' });
    }
    out
}

/// One JSON object: `backend`, `key`, `leader` (true or false) and, when
/// there is a leader, `holder`, `fence`, `value`, `value_encoding`
/// (`utf8` or `base64`) and `value_bytes`.
fn leader_json(backend: &str, key: &LeaseKey, leader: Option<&Leader>) -> Value {
    match leader {
        None => json!({ "backend": backend, "key": key.as_str(), "leader": false }),
        Some(l) => {
            let (value, encoding) = value_text(l.value.as_bytes());
            json!({
                "backend": backend,
                "key": key.as_str(),
                "leader": true,
                "holder": l.holder.as_str(),
                "fence": l.fence.get(),
                "value": value,
                "value_encoding": encoding,
                "value_bytes": l.value.len(),
            })
        }
    }
}

fn leader_line(key: &LeaseKey, leader: Option<&Leader>) -> String {
    match leader {
        None => format!("{key}: no leader"),
        Some(l) => {
            let value = match value_text(l.value.as_bytes()) {
                // Quoted and escaped: a value cannot forge terminal output.
                (text, "utf8") => format!("value {text:?}"),
                (text, _) => format!("value (base64) {text}"),
            };
            format!("{key}: led by {} with fence {}, {value}", l.holder, l.fence)
        }
    }
}

fn print(json: bool, backend: &str, key: &LeaseKey, leader: Option<&Leader>, at: Option<u64>) {
    if json {
        let mut v = leader_json(backend, key, leader);
        if let (Some(at), Some(obj)) = (at, v.as_object_mut()) {
            obj.insert("at".into(), json!(rfc3339_ms(at)));
        }
        util::out(&v.to_string());
    } else {
        match at {
            Some(at) => util::out(&format!("{} {}", rfc3339_ms(at), leader_line(key, leader))),
            None => util::out(&leader_line(key, leader)),
        }
    }
}

/// `lease leader`.
pub async fn leader(args: LeaderArgs, timeout: Duration, clients: &Clients) -> Result<u8, Fail> {
    let mut signals = Signals::new()?;
    let (kind, key, backend) = tokio::select! {
        opened = open(&args.target, timeout, clients) => opened?,
        _ = signals.next() => return Ok(0),
    };
    // Observing needs no holder of its own: the keeper's random one never
    // campaigns.
    let keeper = Keeper::new(backend).with_backend_label(kind.name());
    let mut election = Election::new(keeper, key.clone());
    if let Some(every) = args.interval {
        election = election.with_poll_interval(every);
    }
    let now = tokio::select! {
        r = timed(timeout, "read", election.leader()) => r.map_err(|e| Fail::backend(&e))?,
        _ = signals.next() => return Ok(0),
    };
    if !args.watch {
        print(args.json, kind.name(), &key, now.as_ref(), None);
        return Ok(0);
    }
    print(
        args.json,
        kind.name(),
        &key,
        now.as_ref(),
        Some(now_unix_ms()),
    );
    let end = args.for_.map(|d| Instant::now() + d);
    let mut observer = election.observe();
    let mut last = now;
    loop {
        let change = tokio::select! {
            c = observer.changed() => c,
            _ = signals.next() => return Ok(0),
            _ = sleep_until(end) => return Ok(0),
        };
        // The observer's first report may be the state already printed.
        if change == last {
            continue;
        }
        // Never a leader older than one already printed.
        if let (Some(new), Some(old)) = (&change, &last) {
            if new.fence < old.fence {
                continue;
            }
        }
        print(
            args.json,
            kind.name(),
            &key,
            change.as_ref(),
            Some(now_unix_ms()),
        );
        last = change;
    }
}

async fn sleep_until(end: Option<Instant>) {
    match end {
        Some(end) => tokio::time::sleep_until(end).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_rfc_4648() {
        // RFC 4648 section 10.
        for (input, output) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), output);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn values_are_text_when_utf8_else_base64() {
        assert_eq!(
            value_text(b"10.0.0.7:8080"),
            ("10.0.0.7:8080".into(), "utf8")
        );
        assert_eq!(value_text("grüße".as_bytes()), ("grüße".into(), "utf8"));
        assert_eq!(value_text(&[0xc3, 0x28]), ("wyg=".into(), "base64"));
    }
}
