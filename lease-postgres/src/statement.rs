//! One statement within the request timeout: a pooled connection, the
//! statement (a call of its function, its text where the function is
//! missing, or with the statement cache on, the connection's prepared
//! statement of its text), and a connection whose answer was lost or whose
//! prepared statements went stale taken out of the pool.

use std::time::{Duration, Instant};

use deadpool_postgres::Object;
use lease_core::Error;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use crate::backend::PostgresBackend;
use crate::errors;
use crate::function::{Functions, Statement};

impl PostgresBackend {
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.config.request_timeout
    }

    /// A pooled connection, within the request timeout; what is left of
    /// the timeout for the operation.
    pub(crate) async fn client(&self, op: &'static str) -> Result<(Object, Duration), Error> {
        let limit = self.timeout();
        let start = Instant::now();
        match tokio::time::timeout(limit, self.inner.pool.get()).await {
            Ok(Ok(c)) => Ok((c, limit.saturating_sub(start.elapsed()))),
            Ok(Err(e)) => Err(errors::map_pool(op, e)),
            Err(_) => Err(errors::timed_out(op, limit)),
        }
    }

    /// The result of a statement run within the timeout on `client`. A
    /// connection whose statement failed without an answer from the server
    /// (or did not answer in time: it may be stuck behind a dead network
    /// path), or whose prepared statement the server no longer runs as it
    /// was prepared, is taken out of the pool and closed, never handed out
    /// again.
    pub(crate) fn settle<T>(
        &self,
        op: &'static str,
        client: Object,
        result: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, Error> {
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if e.code().is_none_or(stale_statement) {
                    drop(Object::take(client));
                }
                Err(errors::map(op, e))
            }
            Err(_) => {
                drop(Object::take(client));
                Err(errors::timed_out(op, self.timeout()))
            }
        }
    }

    /// Runs one operation's statement: as a call of its function, or, with
    /// the statement cache on, as the connection's prepared statement of
    /// its text (a named plan already, which a call would only add to).
    pub(crate) async fn run(
        &self,
        op: &'static str,
        statement: &Statement,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        if self.inner.config.statement_cache {
            return self.query(op, &statement.text, params).await;
        }
        if self.inner.functions.get() == Functions::Unchecked {
            self.check_functions(op).await?;
        }
        if let Functions::Ours(schema) = self.inner.functions.get() {
            match self.query(op, &statement.call_in(&schema), params).await {
                // Refused, so nothing was applied; the text does the same.
                Err(e) if cannot_call(&e) => self.inner.functions.set(Functions::Text),
                result => return result,
            }
        }
        self.query(op, &statement.text, params).await
    }

    pub(crate) async fn query(
        &self,
        op: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        let (client, left) = self.client(op).await?;
        let result = if self.inner.config.statement_cache {
            tokio::time::timeout(left, prepared(&client, sql, params)).await
        } else {
            tokio::time::timeout(left, client.query_typed(sql, params)).await
        };
        self.settle(op, client, result)
    }
}

/// `sql` run as the connection's prepared statement of that text, prepared
/// on its first use on this connection.
async fn prepared(
    client: &Object,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
    let statement = client.prepare_typed_cached(sql, &types).await?;
    let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
    client.query(&statement, &values).await
}

/// The server refused to run a prepared statement of this connection as
/// prepared: it is gone (`DISCARD ALL`, `DEALLOCATE`, a pooler that moved
/// the session), or its result's columns changed type with the table
/// (`cached plan must not change result type`). Every later use on the
/// connection would fail alike, so the connection, and its cache, is
/// dropped; nothing was applied.
fn stale_statement(code: &SqlState) -> bool {
    *code == SqlState::INVALID_SQL_STATEMENT_NAME || *code == SqlState::FEATURE_NOT_SUPPORTED
}

/// The server would not run the function: it is missing (the table was
/// created by an older migration, or by hand), another of that name in its
/// schema makes the call ambiguous, its result no longer matches
/// the table's columns (a column's type was changed), or this role may not
/// execute it. Each is refused before the statement runs.
fn cannot_call(e: &Error) -> bool {
    match e {
        Error::Backend(e) => e
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::code)
            .is_some_and(|c| {
                *c == SqlState::UNDEFINED_FUNCTION
                    || *c == SqlState::AMBIGUOUS_FUNCTION
                    || *c == SqlState::DATATYPE_MISMATCH
                    || *c == SqlState::INSUFFICIENT_PRIVILEGE
            }),
        _ => false,
    }
}
