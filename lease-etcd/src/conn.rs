//! The open client every clone of an [`EtcdBackend`](crate::EtcdBackend)
//! shares: the etcd client with this crate's settings, the state kept per
//! client (keep-alive streams, session leases, batched reads), and the
//! requests every operation is made of.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, KeyValue, Txn, TxnResponse};
use lease_core::{
    Capabilities, Error, Exclusion, FenceScope, LeaseKey, TimeAuthority, TtlRule, MAX_PAYLOAD_LEN,
};

use crate::errors::{convert, is_lease_not_found, timed, timed_raw};
use crate::keepalive::{KeepAlive, KeepAlives};
use crate::mirror::Mirror;
use crate::reads::Reads;
use crate::session_leases::Sessions;

/// The longest TTL accepted: one day. etcd itself allows centuries, but a
/// holder that dies without releasing blocks the key for a whole TTL, and a
/// lease that long is a configuration mistake, not a lease.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// One client of the cluster and what its operations share.
pub(crate) struct Conn {
    pub(crate) client: Client,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) default_ttl: Duration,
    pub(crate) endpoints: Vec<String>,
    pub(crate) keep_alives: KeepAlives,
    /// The session leases, when sessions are on.
    pub(crate) sessions: Option<Sessions>,
    /// Verifying reads, batched (used with sessions where the mirror is
    /// off or does not know the key).
    pub(crate) reads: Arc<Reads>,
    /// The watch-kept view of the prefix that verifies renewals (with
    /// sessions).
    pub(crate) mirror: Option<Arc<Mirror>>,
    /// The shortest lease the server grants, in seconds, as it answered a
    /// 1 s grant at connect: etcd raises every TTL below
    /// ⌈1.5 × election timeout⌉ to that (2 s with the default 1 s election
    /// timeout).
    pub(crate) min_ttl_secs: AtomicU64,
}

impl Conn {
    /// What the backend offers, with the shortest TTL the server grants.
    pub(crate) fn capabilities(&self) -> Capabilities {
        let min = Duration::from_secs(self.min_ttl_secs.load(Ordering::Relaxed));
        Capabilities::new(
            TimeAuthority::BackendClock,
            TtlRule::new(min..=MAX_TTL).rounded_to(Duration::from_secs(1)),
        )
        .with_watch(true)
        .with_exclusion(Exclusion::Atomic)
        .with_fence_scope(FenceScope::Global)
        .with_max_payload(MAX_PAYLOAD_LEN)
    }

    /// The etcd key under which `key` is stored.
    pub(crate) fn etcd_key(&self, key: &LeaseKey) -> String {
        // Built by hand: every renewal makes one, and `format!` grows the
        // string in steps where this allocates once.
        let key = key.as_str();
        let mut ekey = String::with_capacity(self.prefix.len().saturating_add(key.len()));
        ekey.push_str(&self.prefix);
        ekey.push_str(key);
        ekey
    }

    /// Whether this client binds its keys to session leases.
    pub(crate) fn sessions(&self) -> bool {
        self.sessions.is_some()
    }

    pub(crate) async fn grant_lease(&self, ttl: Duration) -> Result<i64, Error> {
        let mut lc = self.client.lease_client();
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let resp = timed("lease grant", self.timeout, lc.grant(secs, None)).await?;
        if !resp.error().is_empty() {
            return Err(Error::Backend(
                format!("etcd refused a lease grant: {}", resp.error()).into(),
            ));
        }
        Ok(resp.id())
    }

    /// Revokes a lease we no longer need. Failures are ignored: an unrevoked
    /// lease with no key expires on its own after its TTL.
    pub(crate) async fn revoke_quietly(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        self.keep_alives.forget(lease);
        let mut lc = self.client.lease_client();
        let _ = tokio::time::timeout(self.timeout, lc.revoke(lease)).await;
    }

    /// The lease's remaining time as etcd reports it; `None` once it is gone.
    pub(crate) async fn remaining(&self, lease: i64) -> Result<Option<Duration>, Error> {
        let mut lc = self.client.lease_client();
        match timed_raw(
            "lease time-to-live",
            self.timeout,
            lc.time_to_live(lease, None),
        )
        .await?
        {
            // etcd truncates to whole seconds: 0 means under a second left,
            // still alive; a lease that is gone reports -1.
            Ok(resp) if resp.ttl() >= 0 => Ok(Some(Duration::from_secs(resp.ttl().unsigned_abs()))),
            Ok(_) => Ok(None),
            Err(e) if is_lease_not_found(&e) => Ok(None),
            Err(e) => Err(convert("lease time-to-live", e)),
        }
    }

    /// A keep-alive for `lease` sent at or after `since` (shared with other
    /// callers keeping the same lease alive at the same time), and when it
    /// was sent: the key bound to `lease` lives a TTL from that instant.
    ///
    /// A keep-alive of a session lease first sweeps the keys that are due
    /// (see [`sweep`](crate::sweep)), and is not sent while a key of that
    /// lease nobody renews could not be deleted: it would keep that key
    /// alive past its due.
    pub(crate) async fn extend(
        &self,
        lease: i64,
        since: Instant,
    ) -> Result<(KeepAlive, Instant), Error> {
        if let Some(sessions) = self.sessions.as_ref().filter(|s| s.is_session(lease)) {
            sessions
                .bindings
                .before_keep_alive(&self.client, lease, self.timeout)
                .await?;
        }
        let r = self
            .keep_alives
            .keep_alive(&self.client, lease, self.timeout, since)
            .await;
        if let Some(sessions) = &self.sessions {
            match &r {
                Ok((KeepAlive::Alive, sent)) => sessions.alive(lease, *sent),
                Ok((KeepAlive::Gone, _)) => sessions.gone(lease),
                Err(_) => {}
            }
        }
        r
    }

    /// The key-value at `ekey` (if any) and the store revision of the read.
    pub(crate) async fn get(&self, ekey: &str) -> Result<(Option<KeyValue>, i64), Error> {
        let mut kv = self.client.kv_client();
        let mut resp = timed("get", self.timeout, kv.get(ekey, None)).await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        Ok((resp.take_kvs().into_iter().next(), rev))
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, Error> {
        let mut kv = self.client.kv_client();
        timed(what, self.timeout, kv.txn(txn)).await
    }

    /// A transaction whose etcd error is kept, so that "lease not found"
    /// (a put bound to a lease that is gone) can be told apart.
    pub(crate) async fn txn_raw(
        &self,
        what: &str,
        txn: Txn,
    ) -> Result<Result<TxnResponse, etcd_client::Error>, Error> {
        let mut kv = self.client.kv_client();
        timed_raw(what, self.timeout, kv.txn(txn)).await
    }
}

impl Drop for Conn {
    /// The sweeper of the session leases' abandoned keys sweeps what is
    /// left at its due, then ends; the mirror's watch ends.
    fn drop(&mut self) {
        if let Some(s) = &self.sessions {
            s.bindings.close();
        }
        if let Some(m) = &self.mirror {
            m.close();
        }
    }
}

/// The revision of a granting transaction, which is the new key's create
/// revision (the put is its only write) and so its fence.
///
/// # Errors
/// [`Error::Unavailable`] when etcd answered without a positive revision:
/// the put may have happened, under a fence nobody was told.
pub(crate) fn granted_at(resp: &TxnResponse) -> Result<(i64, lease_core::Fence), Error> {
    let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
    let fence = u64::try_from(rev)
        .ok()
        .filter(|f| *f > 0)
        .ok_or_else(|| Error::Unavailable {
            detail: "etcd answered the acquire without a revision".into(),
            source: None,
        })?;
    Ok((rev, lease_core::Fence(fence)))
}
