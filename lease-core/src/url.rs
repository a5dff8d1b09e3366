//! The parts of a connection URL every backend reads the same way (feature
//! `url`): a list of hosts in the authority (`etcd://h1,h2:2380/…`, which
//! no URL parser reads, since a standard authority names one host) and
//! the query's options.
//!
//! Each backend's `…Config::from_url` uses these, so a host without a port,
//! an IPv6 host or a percent-encoded option means the same on every
//! backend.
//!
//! ```
//! use lease_core::url::{hosts, query_params};
//!
//! assert_eq!(
//!     hosts("a,b:2380,[::1]", 2379).unwrap(),
//!     ["a:2379", "b:2380", "[::1]:2379"]
//! );
//! let q = query_params("bucket=locks&sessions=true&name=a%2Fb");
//! assert_eq!(q["name"], "a/b");
//! ```

use std::collections::BTreeMap;

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
