//! Creating the statements' functions, and checking them before the
//! operations call them (see `function`).

use lease_core::Error;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use crate::backend::PostgresBackend;
use crate::function::{qualifier, Functions};

/// What a check of a table's functions found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// No table of that name yet.
    NoTable,
    /// All present and ours, in the table's schema (this qualifier).
    Ours(String),
    /// At least one missing (and none foreign) from the table's schema
    /// (this qualifier).
    Missing(String),
    /// Functions of these names that this crate did not create for this
    /// table (another definition, or an owner that is neither the table's
    /// nor this role).
    Foreign(Vec<String>),
}

/// Checks the functions of one table, as the calls will name them: in the
/// schema the table is found in. Every function and operator it uses is
/// `pg_catalog`'s, named so or with arguments of exactly its types, so none
/// created on the search path can stand in for one.
const CHECK: &str = "\
    WITH tbl AS (\
      SELECT c.relowner, n.nspname::text AS schema \
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
      WHERE c.oid = pg_catalog.to_regclass($3)::oid) \
    SELECT tbl.schema, f.name, p.oid IS NOT NULL AS present, \
           coalesce(p.prosrc = f.source \
                    AND p.proowner IN (tbl.relowner, r.oid) \
                    AND p.prolang = l.oid \
                    AND NOT p.prosecdef \
                    AND p.proconfig IS NULL \
                    AND p.pronargdefaults = 0::smallint, false) AS ours \
    FROM tbl CROSS JOIN ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS f(name, source) \
    LEFT JOIN pg_catalog.pg_proc p ON p.oid = pg_catalog.to_regprocedure(\
        pg_catalog.quote_ident(tbl.schema) || '.'::text || f.name)::oid \
    LEFT JOIN pg_catalog.pg_language l ON l.lanname = 'plpgsql'::name \
    LEFT JOIN pg_catalog.pg_roles r ON r.rolname = current_user";

impl PostgresBackend {
    /// Creates the statements' functions where missing, in the table's
    /// schema, then checks them. A server that cannot create them (no
    /// PL/pgSQL, no right to create in the schema) leaves the statements'
    /// text in use; a function of one of their names that is not ours is an
    /// error.
    pub(crate) async fn create_functions(&self) -> Result<(), Error> {
        let sql = &self.inner.sql;
        let schema = match self.check_functions("migrate").await? {
            Found::Missing(schema) => schema,
            found => return self.judged(found),
        };
        let all: Vec<String> = sql
            .statements()
            .iter()
            .map(|s| s.create_in(&schema))
            .collect();
        let (client, left) = self.client("migrate").await?;
        let result = tokio::time::timeout(left, client.batch_execute(&all.join("\n"))).await;
        match self.settle("migrate", client, result) {
            Ok(()) => {}
            Err(e) if refused_to_create(&e) => {
                self.inner.functions.set(Functions::Text);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let found = self.check_functions("migrate").await?;
        self.judged(found)
    }

    /// A migration's verdict on what it found after creating the functions.
    fn judged(&self, found: Found) -> Result<(), Error> {
        let Found::Foreign(names) = found else {
            return Ok(());
        };
        let one = names.len() == 1;
        Err(Error::Backend(
            format!(
                "lease-postgres: {} already exist{} but {} not created by this crate for \
                 table {} (another definition, or an owner that is neither the table's nor \
                 this role): drop {} and migrate again; until then the statements are sent \
                 as text",
                names.join(", "),
                if one { "s" } else { "" },
                if one { "was" } else { "were" },
                self.inner.sql.table,
                if one { "it" } else { "them" },
            )
            .into(),
        ))
    }

    /// Checks the statements' functions in the schema the table is found
    /// in, and records whether, and there, the operations may call them.
    pub(crate) async fn check_functions(&self, op: &'static str) -> Result<Found, Error> {
        let statements = self.inner.sql.statements();
        let names: Vec<String> = statements.iter().map(|s| s.signature()).collect();
        let sources: Vec<&str> = statements.iter().map(|s| s.source.as_str()).collect();
        let table = self.inner.sql.table.as_str();
        let rows = self
            .query(
                op,
                CHECK,
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&sources, Type::TEXT_ARRAY),
                    (&table, Type::TEXT),
                ],
            )
            .await?;
        let bad = |e: tokio_postgres::Error| {
            Error::Backend(format!("lease-postgres: checking the functions: {e}").into())
        };
        let mut schema = None;
        let mut foreign = Vec::new();
        let mut missing = false;
        for row in &rows {
            let s: String = row.try_get("schema").map_err(bad)?;
            let name: String = row.try_get("name").map_err(bad)?;
            let present: bool = row.try_get("present").map_err(bad)?;
            let ours: bool = row.try_get("ours").map_err(bad)?;
            schema = Some(qualifier(&s));
            if !present {
                missing = true;
            } else if !ours {
                foreign.push(format!("{s}.{name}"));
            }
        }
        let found = match schema {
            None => Found::NoTable,
            Some(_) if !foreign.is_empty() => Found::Foreign(foreign),
            Some(s) if missing || rows.len() != statements.len() => Found::Missing(s),
            Some(s) => Found::Ours(s),
        };
        self.inner.functions.set(match &found {
            Found::Ours(s) => Functions::Ours(s.as_str().into()),
            _ => Functions::Text,
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
