//! Creating the statements' functions, and checking them before the
//! operations call them (see `function`).

use lease_core::Error;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use crate::backend::PostgresBackend;
use crate::function::Functions;

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
