//! The parts of a connection URL every backend reads the same way (feature
//! `url`): the URL cut at its marks ([`Parts`]), a list of hosts in the
//! authority (`etcd://h1,h2:2380/…`, which no URL parser reads, since a
//! standard authority names one host) and the query's options.
//!
//! Each backend's `…Config::from_url` uses these, so a host without a port,
//! an IPv6 host or a percent-encoded option means the same on every
//! backend.
//!
//! ```
//! use lease_core::url::{flag, hosts, query_params, Parts};
//!
//! let url = Parts::of("etcd://a,b:2380/ops/?sessions=true").unwrap();
//! assert_eq!((url.scheme, url.authority, url.path), ("etcd", "a,b:2380", "ops"));
//! assert!(flag(&query_params(url.query), "sessions").unwrap());
//!
//! assert_eq!(
//!     hosts("a,b:2380,[::1]", 2379).unwrap(),
//!     ["a:2379", "b:2380", "[::1]:2379"]
//! );
//! let q = query_params("bucket=locks&sessions=true&name=a%2Fb");
//! assert_eq!(q["name"], "a/b");
//! ```

use std::collections::BTreeMap;

/// A connection URL cut at its marks, `scheme://authority/path?query`,
/// nothing decoded; the path without its leading and trailing slashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts<'a> {
    /// Before `://`.
    pub scheme: &'a str,
    /// Between `://` and the first `/` (or `?`): host(s), maybe a port.
    pub authority: &'a str,
    /// After the authority's `/`, up to `?`, slashes trimmed at both ends.
    pub path: &'a str,
    /// Authority and path as written (everything between `://` and `?`),
    /// for a URL handed on to a client's own parser.
    pub address: &'a str,
    /// After the first `?` (empty without one).
    pub query: &'a str,
}

impl<'a> Parts<'a> {
    /// `url` cut at its marks; `None` without a `://`.
    pub fn of(url: &'a str) -> Option<Self> {
        let (scheme, rest) = url.split_once("://")?;
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match before_query.split_once('/') {
            Some((a, p)) => (a, p.trim_matches('/')),
            None => (before_query, ""),
        };
        Some(Parts {
            scheme,
            authority,
            path,
            address: before_query,
            query,
        })
    }
}

/// Refuses an option not in `allowed`, naming the allowed ones.
///
/// # Errors
/// `unknown option "x" (allowed: a, b)`.
pub fn allow(params: &BTreeMap<String, String>, allowed: &[&str]) -> Result<(), String> {
    match params.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "unknown option {k:?} (allowed: {})",
            allowed.join(", ")
        )),
        None => Ok(()),
    }
}

/// A `true`/`false` option, false when absent.
///
/// # Errors
/// `name="x": use name=true or name=false` for any other value.
pub fn flag(params: &BTreeMap<String, String>, name: &str) -> Result<bool, String> {
    match params.get(name).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(format!("{name}={other:?}: use {name}=true or {name}=false")),
    }
}

/// The `host:port` list of a URL's `authority`; a host without a port gets
/// `default_port`, the one the backend's own tools assume.
///
/// # Errors
/// A description of what is wrong: no host, an empty one in the list,
/// credentials (`user@host`: give them as options instead), a port that is
/// not a number.
pub fn hosts(authority: &str, default_port: u16) -> Result<Vec<String>, String> {
    if authority.is_empty() {
        return Err("no host".into());
    }
    let mut out = Vec::new();
    for h in authority.split(',') {
        let h = h.trim();
        if h.is_empty() {
            return Err("empty host in the host list".into());
        }
        if h.contains('@') {
            return Err("credentials in the URL are not supported".into());
        }
        // `[::1]` is an IPv6 host without a port; `[::1]:2379` has one.
        match h.rsplit_once(':') {
            Some((_, port)) if !h.ends_with(']') => {
                if port.parse::<u16>().is_err() {
                    return Err(format!("bad port in {h:?}"));
                }
                out.push(h.to_owned());
            }
            _ => out.push(format!("{h}:{default_port}")),
        }
    }
    Ok(out)
}

/// A URL query's options by name, percent-decoded (`+` stays `+`, as in a
/// URL's path and unlike a form); of a repeated name the last counts.
pub fn query_params(query: &str) -> BTreeMap<String, String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_outside_the_list_and_flags_that_are_not_booleans_are_refused() {
        let q = query_params("a=true&b=yes");
        assert_eq!(
            allow(&q, &["a"]).unwrap_err(),
            r#"unknown option "b" (allowed: a)"#
        );
        assert!(allow(&q, &["a", "b"]).is_ok());
        assert!(flag(&q, "a").unwrap());
        assert!(!flag(&q, "c").unwrap());
        assert_eq!(
            flag(&q, "b").unwrap_err(),
            r#"b="yes": use b=true or b=false"#
        );
        let p = Parts::of("mongodb://u@h/db/?x=1").unwrap();
        assert_eq!((p.path, p.address, p.query), ("db", "u@h/db/", "x=1"));
        assert_eq!(Parts::of("no-scheme"), None);
    }
}
