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
use std::sync::{Arc, Mutex};

/// One operation's statement: its text, and the function that runs it.
#[derive(Debug)]
pub(crate) struct Statement {
    /// The statement, with its parameters `$1…`.
    pub(crate) text: String,
    /// The function's name, without a schema.
    pub(crate) name: String,
    /// The function's argument types, as SQL lists them.
    args: String,
    /// `$1, …`: the call's arguments.
    placeholders: String,
    /// The function's definition after its name and arguments.
    definition: String,
    /// The function's source, as `pg_proc.prosrc` holds it.
    pub(crate) source: String,
}

/// The columns every statement answers with, as a function's result.
const ANSWER: &str = "outcome text, failed_check integer, holder text, fence bigint, \
                      ttl_ms bigint, payload bytea, remaining_ms bigint, live boolean";

impl Statement {
    /// `text` (answering with the columns of [`ANSWER`]) for operation
    /// `op`, whose parameters `$1…` have the SQL types `params`.
    pub(crate) fn new(op: &str, params: &[&str], text: String) -> Statement {
        Statement::with_volatility(op, params, text, "VOLATILE")
    }

    /// Like [`new`](Self::new), for a statement that writes nothing: the
    /// function runs it in its caller's snapshot, as the text would run.
    pub(crate) fn reading(op: &str, params: &[&str], text: String) -> Statement {
        Statement::with_volatility(op, params, text, "STABLE")
    }

    fn with_volatility(op: &str, params: &[&str], text: String, volatility: &str) -> Statement {
        let args = params.join(", ");
        // `#variable_conflict use_column`: the result's column names are
        // also the table's; in the statement they name the table's columns.
        let body = format!("#variable_conflict use_column\nBEGIN\nRETURN QUERY {text};\nEND");
        let source = format!("\n{body}\n");
        let definition = format!(
            "RETURNS TABLE ({ANSWER}) LANGUAGE plpgsql {volatility} AS $lease_fn${source}$lease_fn$"
        );
        // The table's name is part of the text, so of the hash.
        let name = format!(
            "lease_{op}_{hash:016x}",
            hash = fnv1a(format!("({args}) {definition}").as_bytes()),
        );
        let mut placeholders = String::new();
        for i in 1..=params.len() {
            let sep = if i == 1 { "" } else { ", " };
            let _ = write!(placeholders, "{sep}${i}");
        }
        Statement {
            text,
            name,
            args,
            placeholders,
            definition,
            source,
        }
    }

    /// Creates the function in `schema` (a quoted identifier and a dot, or
    /// nothing: the first schema of the search path) unless it exists;
    /// safe to run from many clients at once.
    pub(crate) fn create_in(&self, schema: &str) -> String {
        // Two clients creating the same function at once: the second waits
        // on the catalog's unique index and then finds it taken.
        format!(
            "DO $lease_do$ BEGIN\n\
             CREATE FUNCTION {schema}{name}({args}) {definition};\n\
             EXCEPTION WHEN duplicate_function OR unique_violation THEN NULL;\n\
             END $lease_do$;",
            name = self.name,
            args = self.args,
            definition = self.definition,
        )
    }

    /// The call of the function in `schema` (as for [`create_in`](Self::create_in)).
    pub(crate) fn call_in(&self, schema: &str) -> String {
        format!("SELECT * FROM {schema}{}({})", self.name, self.placeholders)
    }

    /// The function's name and argument types, as `to_regprocedure` reads
    /// them, without a schema.
    pub(crate) fn signature(&self) -> String {
        format!("{}({})", self.name, self.args)
    }
}

/// `schema` as a quoted identifier followed by a dot.
pub(crate) fn qualifier(schema: &str) -> String {
    format!("\"{}\".", schema.replace('"', "\"\""))
}

/// Whether the operations call the statements' functions.
#[derive(Debug)]
pub(crate) struct Use(Mutex<Functions>);

/// What is known of a table's functions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Functions {
    /// Not checked yet: the next operation checks them first.
    Unchecked,
    /// Every one is present, in the table's schema (this qualifier), and
    /// ours: the operations call them there.
    Ours(Arc<str>),
    /// One is missing, not ours, or cannot run: the operations send the
    /// statements' text, until a migration creates and checks them again.
    Text,
}

impl Use {
    pub(crate) fn new() -> Use {
        Use(Mutex::new(Functions::Unchecked))
    }

    pub(crate) fn get(&self) -> Functions {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set(&self, f: Functions) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = f;
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
        let a = Statement::new("read", &["text"], "SELECT 1".into());
        let same = Statement::new("read", &["text"], "SELECT 1".into());
        let other = Statement::new("read", &["text"], "SELECT 2".into());
        let reading = Statement::reading("read", &["text"], "SELECT 1".into());
        assert_eq!(a.name, same.name);
        assert_ne!(a.name, other.name);
        assert_ne!(a.name, reading.name);
        assert!(a.name.starts_with("lease_read_"), "{}", a.name);
        assert_eq!(
            a.call_in("\"ops\"."),
            format!("SELECT * FROM \"ops\".{}($1)", a.name)
        );
    }

    #[test]
    fn a_call_passes_every_parameter_in_order() {
        let s = Statement::new("renew", &["text", "text", "bigint", "bytea"], "X".into());
        assert!(
            s.call_in("").ends_with("($1, $2, $3, $4)"),
            "{}",
            s.call_in("")
        );
        assert!(s
            .create_in("")
            .contains("(text, text, bigint, bytea) RETURNS TABLE"));
        assert_eq!(
            s.signature(),
            format!("{}(text, text, bigint, bytea)", s.name)
        );
    }

    #[test]
    fn names_fit_postgres_identifiers() {
        // PostgreSQL truncates identifiers beyond 63 bytes, which would
        // make two operations' functions one.
        let s = Statement::new("release", &["text"], "X".into());
        assert!(s.name.len() <= 63, "{}", s.name);
    }

    #[test]
    fn schemas_are_quoted() {
        assert_eq!(qualifier("public"), "\"public\".");
        assert_eq!(qualifier("a\"b"), "\"a\"\"b\".");
    }
}
