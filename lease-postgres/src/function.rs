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

use lease_core::Error;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use crate::backend::PostgresBackend;

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
    signature: String,
    /// The function's source, as `pg_proc.prosrc` holds it.
    source: String,
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

/// What a check of a table's functions found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// All present and ours.
    Ours,
    /// At least one missing (and none foreign).
    Missing,
    /// Functions of these names that this crate did not create for this
    /// table, or whose owner is neither the table's nor this role.
    Foreign(Vec<String>),
}

impl PostgresBackend {
    /// Creates the statements' functions where missing, then checks them.
    /// A server that cannot create them (no PL/pgSQL, no right to create
    /// in the schema) leaves the statements' text in use; a function of one
    /// of their names that is not ours is an error.
    pub(crate) async fn create_functions(&self) -> Result<(), Error> {
        let sql = &self.inner.sql;
        let all: String = sql
            .statements()
            .iter()
            .map(|s| s.create.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let (client, left) = self.client("migrate").await?;
        let result = tokio::time::timeout(left, client.batch_execute(&all)).await;
        match self.settle("migrate", client, result) {
            Ok(()) => {}
            Err(e) if refused_to_create(&e) => {
                self.inner.functions.set(Functions::Text);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        match self.check_functions("migrate").await? {
            Found::Foreign(names) => Err(Error::Backend(
                format!(
                    "lease-postgres: {} already exist{} but {} not created by this crate for \
                     table {} (another source, or an owner that is neither the table's nor \
                     this role): drop {} and migrate again; until then the statements are \
                     sent as text",
                    names.join(", "),
                    if names.len() == 1 { "s" } else { "" },
                    if names.len() == 1 { "was" } else { "were" },
                    sql.table,
                    if names.len() == 1 { "it" } else { "them" },
                )
                .into(),
            )),
            Found::Ours | Found::Missing => Ok(()),
        }
    }

    /// Checks the statements' functions as a call would find them (through
    /// the search path), and records whether the operations may call them.
    pub(crate) async fn check_functions(&self, op: &'static str) -> Result<Found, Error> {
        let statements = self.inner.sql.statements();
        let names: Vec<&str> = statements.iter().map(|s| s.signature.as_str()).collect();
        let sources: Vec<&str> = statements.iter().map(|s| s.source.as_str()).collect();
        let table = self.inner.sql.table.as_str();
        let rows = self
            .query(
                op,
                "SELECT f.name, p.oid IS NOT NULL AS present, \
                        coalesce(p.prosrc = f.source AND p.proowner IN (c.relowner, r.oid), \
                                 false) AS ours \
                 FROM unnest($1::text[], $2::text[]) AS f(name, source) \
                 LEFT JOIN pg_proc p ON p.oid = to_regprocedure(f.name) \
                 LEFT JOIN pg_class c ON c.oid = to_regclass($3) \
                 LEFT JOIN pg_roles r ON r.rolname = current_user",
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&sources, Type::TEXT_ARRAY),
                    (&table, Type::TEXT),
                ],
            )
            .await?;
        let mut foreign = Vec::new();
        let mut missing = rows.len() != statements.len();
        for row in &rows {
            let bad = |e: tokio_postgres::Error| {
                Error::Backend(format!("lease-postgres: checking the functions: {e}").into())
            };
            let name: String = row.try_get("name").map_err(bad)?;
            let present: bool = row.try_get("present").map_err(bad)?;
            let ours: bool = row.try_get("ours").map_err(bad)?;
            if !present {
                missing = true;
            } else if !ours {
                foreign.push(name);
            }
        }
        let found = if !foreign.is_empty() {
            Found::Foreign(foreign)
        } else if missing {
            Found::Missing
        } else {
            Found::Ours
        };
        self.inner.functions.set(if found == Found::Ours {
            Functions::Ours
        } else {
            Functions::Text
        });
        Ok(found)
    }
}

/// The server would not create the functions: no PL/pgSQL (or no right to
/// use it), no right to create in the schema, or a server without `DO`.
fn refused_to_create(e: &Error) -> bool {
    match e {
        Error::Backend(e) => e
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::code)
            .is_some_and(|c| {
                let class = c.code().get(..2).unwrap_or("");
                class == "42" || class == "0A" || *c == SqlState::UNDEFINED_OBJECT
            }),
        _ => false,
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
