//! [`PostgresBackend`] and its [`LeaseBackend`] implementation: each
//! operation is a method of the same name in `operations`, `watch` or
//! `admin`.

use std::sync::Arc;

use deadpool_postgres::Pool;
use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Grant, LastBreak,
    LeaseBackend, LeaseKey, LeaseState, Payload, Renewal, TimeAuthority,
};

use crate::config::PostgresConfig;
use crate::function::Use;
use crate::notify::Notifier;
use crate::record::{Sql, TTL_RULE};

/// Leases with fencing tokens in one PostgreSQL table, judged on the
/// server's clock. Cheap to clone: clones share the pool and the watch
/// connection.
#[derive(Clone)]
pub struct PostgresBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Sql,
    pub(crate) config: PostgresConfig,
    pub(crate) notifier: Notifier,
    /// Whether the operations call the statements' functions (see
    /// `function`).
    pub(crate) functions: Use,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("table", &self.inner.sql.table)
            .field("request_timeout", &self.inner.config.request_timeout)
            .finish_non_exhaustive()
    }
}

impl LeaseBackend for PostgresBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(TimeAuthority::BackendClock, TTL_RULE).with_watch(true)
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(self.try_acquire(req))
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(self.renew(grant, payload))
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.release(grant))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(self.read(key))
    }

    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.wait_for_change(key, seen))
    }

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(self.break_lease(key, note))
    }

    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(self.last_break(key))
    }
}
