//! The operations' statements stored on the server as PL/pgSQL functions.
//!
//! A statement sent as text (the unnamed statement, as a pooler in
//! transaction mode requires) is parsed and planned on every call, and ours
//! are long: that costs two to three times what the smallest single-row
//! `UPDATE` costs in all. A PL/pgSQL function keeps the plan of each
//! statement it runs for the life of the server session, whichever client
//! the session serves, so the call — a short text, cheap to plan — runs
//! the long statement from a cached plan, and nothing is tied to a client's
//! session (unlike a prepared statement).
//!
//! A function's name carries a hash of its whole definition (the table's
//! name and the statement included): clients of different versions of this
//! crate on one table each call the function of their own statement, and
//! creating one is idempotent. A function is called only once it is known
//! to be the one this crate creates (its source, and an owner that is the
//! table's or the migrating role): a function of that name planted by
//! another role with the right to create in the schema is never run. A table
//! whose functions are missing (created by an older migration, or by hand,
//! or on a server without PL/pgSQL) is served by the statements' text.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};

/// One operation's statement: its text, and the call of the function that
/// runs it.
#[derive(Debug)]
pub(crate) struct Statement {
    /// The statement, with its parameters `$1…`.
    pub(crate) text: String,
    /// `SELECT * FROM <function>($1, …)`.
    pub(crate) call: String,
    /// Creates the function unless it exists; safe to run from many clients
    /// at once.
    pub(crate) create: String,
    /// The function's name and argument types, as `to_regprocedure` reads
    /// them.
    pub(crate) signature: String,
    /// The function's source, as `pg_proc.prosrc` holds it.
    pub(crate) source: String,
}

/// The columns every statement answers with, as a function's result.
const ANSWER: &str = "outcome text, failed_check integer, holder text, fence bigint, \
                      ttl_ms bigint, payload bytea, remaining_ms bigint, live boolean";

impl Statement {
    /// `text` (answering with the columns of [`ANSWER`]) for operation `op`
    /// on `table`, whose parameters `$1…` have the SQL types `params`.
    pub(crate) fn new(table: &str, op: &str, params: &[&str], text: String) -> Statement {
        Statement::with_volatility(table, op, params, text, "VOLATILE")
    }

    /// Like [`new`](Self::new), for a statement that writes nothing: the
    /// function runs it in its caller's snapshot, as the text would run.
    pub(crate) fn reading(table: &str, op: &str, params: &[&str], text: String) -> Statement {
        Statement::with_volatility(table, op, params, text, "STABLE")
    }

    fn with_volatility(
        table: &str,
        op: &str,
        params: &[&str],
        text: String,
        volatility: &str,
    ) -> Statement {
        let args = params.join(", ");
        // `#variable_conflict use_column`: the result's column names are
        // also the table's; in the statement they name the table's columns.
        let body = format!("#variable_conflict use_column\nBEGIN\nRETURN QUERY {text};\nEND");
        let signature = format!("({args}) RETURNS TABLE ({ANSWER}) LANGUAGE plpgsql {volatility}");
        let source = format!("\n{body}\n");
        let name = format!(
            "{schema}lease_{op}_{hash:016x}",
            schema = table
                .split_once('.')
                .map_or(String::new(), |(s, _)| format!("{s}.")),
            hash = fnv1a(format!("{signature}\n{body}").as_bytes()),
        );
        let mut placeholders = String::new();
        for i in 1..=params.len() {
            let sep = if i == 1 { "" } else { ", " };
            let _ = write!(placeholders, "{sep}${i}");
        }
        // Two clients creating the same function at once: the second waits
        // on the catalog's unique index and then finds it taken.
        let create = format!(
            "DO $lease_do$ BEGIN\n\
             CREATE FUNCTION {name}{signature} AS $lease_fn${source}$lease_fn$;\n\
             EXCEPTION WHEN duplicate_function OR unique_violation THEN NULL;\n\
             END $lease_do$;"
        );
        Statement {
            call: format!("SELECT * FROM {name}({placeholders})"),
            text,
            create,
            signature: format!("{name}({args})"),
            source,
        }
    }
}

/// Whether the operations call the statements' functions.
#[derive(Debug)]
pub(crate) struct Use(AtomicU8);

/// What is known of a table's functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Functions {
    /// Not checked yet: the next operation checks them first.
    Unchecked,
    /// Every one is present and ours: the operations call them.
    Ours,
    /// One is missing, not ours, or cannot run: the operations send the
    /// statements' text, until a migration creates and checks them again.
    Text,
}

impl Use {
    pub(crate) fn new() -> Use {
        Use(AtomicU8::new(Functions::Unchecked as u8))
    }

    pub(crate) fn get(&self) -> Functions {
        match self.0.load(Ordering::Relaxed) {
            1 => Functions::Ours,
            2 => Functions::Text,
            _ => Functions::Unchecked,
        }
    }

    pub(crate) fn set(&self, f: Functions) {
        self.0.store(f as u8, Ordering::Relaxed);
    }
}

/// The 64-bit FNV-1a hash: stable across builds and platforms, which a
/// name stored on the server needs (std's hashers promise neither).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_is_named_for_its_whole_definition() {
        let a = Statement::new("ops.leases", "read", &["text"], "SELECT 1".into());
        let same = Statement::new("ops.leases", "read", &["text"], "SELECT 1".into());
        let other = Statement::new("ops.leases", "read", &["text"], "SELECT 2".into());
        let unqualified = Statement::new("leases", "read", &["text"], "SELECT 1".into());
        assert_eq!(a.call, same.call);
        assert_ne!(a.call, other.call);
        assert!(
            a.call.starts_with("SELECT * FROM ops.lease_read_"),
            "{}",
            a.call
        );
        assert!(unqualified.call.starts_with("SELECT * FROM lease_read_"));
        assert!(a.call.ends_with("($1)"), "{}", a.call);
    }

    #[test]
    fn a_call_passes_every_parameter_in_order() {
        let s = Statement::new(
            "t",
            "renew",
            &["text", "text", "bigint", "bytea"],
            "X".into(),
        );
        assert!(s.call.ends_with("($1, $2, $3, $4)"), "{}", s.call);
        assert!(s
            .create
            .contains("(text, text, bigint, bytea) RETURNS TABLE"));
    }

    #[test]
    fn names_fit_postgres_identifiers() {
        // PostgreSQL truncates identifiers beyond 63 bytes, which would
        // make two operations' functions one.
        let s = Statement::new("s.t", "release", &["text"], "X".into());
        let name = s
            .call
            .trim_start_matches("SELECT * FROM s.")
            .split('(')
            .next()
            .unwrap_or_default();
        assert!(name.len() <= 63, "{name}");
    }
}
