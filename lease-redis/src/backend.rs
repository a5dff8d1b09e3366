//! [`RedisBackend`] and its [`LeaseBackend`] implementation: each
//! operation is a method of the same name in `operations`, `watch` or
//! `admin`.

use std::sync::Arc;

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Grant, LastBreak,
    LeaseBackend, LeaseKey, LeaseState, Payload, Renewal, TimeAuthority,
};

use crate::client::Client;
use crate::config::RedisConfig;
use crate::notify::Notifier;
use crate::persistence::Persistence;
use crate::record::TTL_RULE;
use crate::scripts::Scripts;
use crate::unsettled::Unsettled;

/// Leases with fencing tokens in Redis (or Valkey), judged on the server's
/// clock. Cheap to clone: clones share the connection and the watch's
/// subscription.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) scripts: Scripts,
    pub(crate) config: RedisConfig,
    pub(crate) channel: String,
    pub(crate) notifier: Notifier,
    pub(crate) persistence: Persistence,
    pub(crate) unsettled: Unsettled,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.config.prefix)
            .field("request_timeout", &self.inner.config.request_timeout)
            .field("persistence", &self.inner.persistence)
            .finish_non_exhaustive()
    }
}

impl LeaseBackend for RedisBackend {
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
