//! Small helpers: durations, identities, clocks, one-line errors.

use std::error::Error as StdError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Writes `line` and a newline to stdout, for the commands that hold
/// nothing (`status`, `watch`, `leader`, `break`).
///
/// A reader that went away (`lease watch … | head -1`) ends this process by
/// SIGPIPE, quietly, as it ends `cat` or `grep`. Only a write to stdout
/// does: SIGPIPE stays ignored for the process, so a backend connection
/// the server closed is an error to handle, never a silent death. Any other
/// failure to write ends it with a message and exit code 69.
pub fn out(line: &str) {
    if let Err(e) = try_out(line) {
        stdout_failed(e);
    }
}

/// Writes `line` and a newline to stdout, and returns how that went: for a
/// command that must give something back (a lease) before it ends by
/// [`stdout_failed`].
pub fn try_out(line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").and_then(|()| stdout.flush())
}

/// Writes `bytes` to stdout as [`out`] does (completion scripts, the man
/// page).
pub fn print_all(bytes: &[u8]) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_all(bytes).and_then(|()| stdout.flush());
    drop(stdout);
    if let Err(e) = written {
        stdout_failed(e);
    }
}

/// Ends the process after a failed write to stdout (see [`out`]): by
/// SIGPIPE, quietly, for a reader that went away; else with a message and
/// exit code 69.
pub fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // SAFETY: restoring SIGPIPE's default disposition and raising it
        // ends the process at once, as the kernel would for a reader that
        // went away; the callers hold nothing that needs cleaning up.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
        // Were SIGPIPE blocked, the shell's code for it.
        std::process::exit(128 + libc::SIGPIPE);
    }
    eprintln!("lease: cannot write to stdout: {e}");
    std::process::exit(i32::from(crate::EXIT_BACKEND));
}

/// Parses a duration as humantime does (`10s`, `500ms`, `1.5s`, `2m`,
/// `1h 30m`), or a bare number of seconds; a negative one gets an error of
/// its own (rather than clap's advice to put it after `--`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!(
            "{s:?} is negative: a duration is 0 or more (like 10s, 500ms)"
        ));
    }
    let d = match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs <= MAX_DURATION_SECS => Duration::from_secs_f64(secs),
        Ok(_) => return Err(format!("duration {s:?} is out of range")),
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| format!("{s:?} is not a duration (like 10s, 500ms, 2m, 1h): {e}"))?,
    };
    if d.as_secs_f64() > MAX_DURATION_SECS {
        return Err(format!("duration {s:?} is out of range"));
    }
    Ok(d)
}

/// The longest duration accepted (about 31 years): far beyond any TTL or
/// wait, and small enough that no deadline arithmetic overflows.
const MAX_DURATION_SECS: f64 = 1.0e9;

/// The host name, or `localhost` when it cannot be read.
pub fn hostname() -> String {
    let uname = rustix::system::uname();
    let name: String = uname
        .nodename()
        .to_string_lossy()
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

/// The user name from the environment, else `uid<N>`.
pub fn user() -> String {
    for var in ["USER", "LOGNAME"] {
        if let Ok(u) = std::env::var(var) {
            let u: String = u.chars().filter(|c| c.is_ascii_graphic()).collect();
            if !u.is_empty() {
                return u;
            }
        }
    }
    format!("uid{}", rustix::process::getuid().as_raw())
}

/// The default holder id: `user@host:pid:random`, unique per run.
pub fn default_holder() -> String {
    let rand = lease::HolderId::random();
    let mut id = format!(
        "{}@{}:{}:{}",
        user(),
        hostname(),
        std::process::id(),
        &rand.as_str()[..8]
    );
    id.truncate(lease::MAX_HOLDER_LEN);
    id
}

/// Milliseconds since the Unix epoch on this machine's clock.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a Unix time in milliseconds; a time past
/// year 9999 (only a corrupt record holds one) is shown as raw milliseconds.
pub fn rfc3339_ms(ms: u64) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let t = UNIX_EPOCH.checked_add(Duration::from_millis(ms));
    match t.map(|t| write!(out, "{}", humantime::format_rfc3339_millis(t))) {
        Some(Ok(())) => out,
        _ => format!("{ms} ms after the Unix epoch"),
    }
}

/// A human duration: `850ms`, `4.2s`, `3m05s`.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        let s = d.as_secs();
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// An error and its causes on one line ([`lease::ErrorChain`]), with the
/// line breaks some client libraries put in their messages folded away.
///
/// Some clients put their cause's `Debug` into their message (tonic's
/// `source: tonic::transport::Error(Transport, ConnectError(… Os { code:
/// 111, … }))`, the MongoDB driver's `labels: {…}, source: None`): that is
/// replaced by the cause in words (`: Connection refused (os error 111)`),
/// and empty fields are left out.
pub fn one_line(e: &(dyn StdError + 'static)) -> String {
    let text = lease::ErrorChain::new(e)
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    plain_words(&text)
}

/// [`one_line`]'s rewording of clients' `Debug` output.
fn plain_words(text: &str) -> String {
    let mut text = text.to_owned();
    for empty in [", source: None", ", server response: None"] {
        text = text.replace(empty, "");
    }
    // `, labels: {"A", "B"}`: the driver's retry bookkeeping.
    while let Some(at) = text.find(", labels: {") {
        match text[at..].find('}') {
            Some(end) => text.replace_range(at..=at + end, ""),
            None => break,
        }
    }
    // `, source: Path::To::Error(…)`: a Debug value, up to its closing
    // parenthesis.
    while let Some(at) = text.find(", source: ") {
        let start = at + ", source: ".len();
        let Some(open) = text[start..].find('(').map(|o| start + o) else {
            break;
        };
        if !text[start..open]
            .chars()
            .all(|c| c.is_alphanumeric() || c == ':' || c == '_')
        {
            break;
        }
        let mut depth = 0usize;
        let mut quoted = false;
        let mut end = None;
        for (i, c) in text[open..].char_indices() {
            match c {
                '"' => quoted = !quoted,
                '(' if !quoted => depth += 1,
                ')' if !quoted => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let cause = debug_cause(&text[open..=end]);
        let words = cause.map(|c| format!(": {c}")).unwrap_or_default();
        text.replace_range(at..=end, &words);
    }
    text
}

/// The innermost cause in a `Debug` value, in words: its last `message:
/// "…"`, with ` (os error N)` when it is an `Os { code: N, … }`.
fn debug_cause(debug: &str) -> Option<String> {
    let from = debug.rfind("message: \"")? + "message: \"".len();
    let message = &debug[from..from + debug[from..].find('"')?];
    let code = debug.rfind("Os { code: ").and_then(|at| {
        let rest = &debug[at + "Os { code: ".len()..];
        rest.split(|c: char| !c.is_ascii_digit()).next()
    });
    Some(match code {
        Some(code) if !code.is_empty() => format!("{message} (os error {code})"),
        _ => message.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("1e99").unwrap_err().contains("out of range"));
        assert!(parse_duration("100000y")
            .unwrap_err()
            .contains("out of range"));
        assert!(parse_duration("-1s").unwrap_err().contains("negative"));
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339_ms(951_868_799_999), "2000-02-29T23:59:59.999Z");
        assert_eq!(
            rfc3339_ms(u64::MAX),
            format!("{} ms after the Unix epoch", u64::MAX)
        );
    }

    /// Clients' Debug output in error messages becomes the cause in words.
    #[test]
    fn client_debug_becomes_words() {
        let etcd =
            "backend unavailable, outcome unknown: etcd first request to http://127.0.0.1:9: \
                    grpc request error: code: 'The service is currently unavailable', message: \
                    \"tcp connect error\", source: tonic::transport::Error(Transport, \
                    ConnectError(ConnectError(\"tcp connect error\", 127.0.0.1:9, Os { code: 111, \
                    kind: ConnectionRefused, message: \"Connection refused\" })))";
        assert_eq!(
            plain_words(etcd),
            "backend unavailable, outcome unknown: etcd first request to http://127.0.0.1:9: \
             grpc request error: code: 'The service is currently unavailable', message: \
             \"tcp connect error\": Connection refused (os error 111)"
        );
        let mongo = "lease-mongo: connect: 127.0.0.1:9: Kind: I/O error: Connection refused \
                     (os error 111), labels: {\"RetryableError\", \"SystemOverloadedError\"}, \
                     source: None, server response: None";
        assert_eq!(
            plain_words(mongo),
            "lease-mongo: connect: 127.0.0.1:9: Kind: I/O error: Connection refused (os error 111)"
        );
        let plain = "lease k is held by x (fence 3), source: the holder";
        assert_eq!(plain_words(plain), plain);
    }

    #[test]
    fn holder_ids_are_valid() {
        lease::HolderId::new(default_holder()).unwrap();
    }
}
