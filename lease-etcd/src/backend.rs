//! [`EtcdBackend`]: the lease contract on etcd's leases and transactions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue, PutOptions,
    Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use lease_core::{
    Acquire, AcquireRequest, BoxFuture, BreakNote, Broken, Capabilities, Error, Exclusion, Fence,
    FenceScope, Grant, Holding, LastBreak, LeaseBackend, LeaseKey, LeaseState, Payload, Renewal,
    TimeAuthority, TtlRule, Version, MAX_PAYLOAD_LEN,
};

use crate::errors::{convert, is_lease_not_found, timed, timed_raw};
use crate::keepalive::{KeepAlive, KeepAlives};
use crate::reads::Reads;
use crate::record::{self, Stored};
use crate::session::Sessions;
use crate::{tls, EtcdConfig};

/// The longest TTL accepted: one day. etcd itself allows centuries, but a
/// holder that dies without releasing blocks the key for a whole TTL, and a
/// lease that long is a configuration mistake, not a lease.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// How many times one operation re-reads a key that changed under it, and
/// tries again, before it gives up with [`Error::Unavailable`]. Each retry
/// means another writer won a race in between (another client, or etcd expiring a lease), and
/// the next attempt normally sees the winner and answers from it, so two
/// suffice under ordinary contention; the same value in every backend of
/// the workspace.
pub(crate) const CONTENTION_ATTEMPTS: usize = 4;

/// Leases with fencing tokens on an etcd cluster.
///
/// * **Acquire** grants an etcd lease with the TTL, then one transaction puts
///   the key bound to that lease iff the key does not exist (`create_revision
///   == 0`), and otherwise reads the holder. etcd deletes the key when the
///   lease expires, so "free or expired" is exactly "absent". 2 round trips
///   when the key is free.
/// * The **fence** is the key's create revision: cluster-wide monotonic, so it
///   never goes backwards across release, expiry, takeover or restart
///   ([`FenceScope::Global`]).
/// * **Renew** sends one keep-alive for the grant's etcd lease and, at the
///   same time, reads the key to check that it still carries our (holder,
///   fence): a keep-alive on its own could keep a lease alive whose key is
///   gone, and must never make a lost key look held. Renewed only when both
///   say so; the deadline counts from the keep-alive's send. 1 round trip
///   (2 requests); renewals of one lease at the same time share a keep-alive.
/// * **Release** deletes the key iff its create revision is still our fence,
///   then revokes the lease.
/// * With [sessions](crate::EtcdConfig::sessions), the keys of one TTL share
///   one etcd lease instead: acquire is one transaction beside a shared
///   keep-alive (1 round trip), release one guarded delete that leaves the
///   session lease alone, and the loss of the session lease ends all its
///   keys. See the crate docs for the trade-off.
/// * **Read** returns the holder and the remaining time etcd reports for the
///   lease; it never writes.
///
/// Dropping the backend never revokes a held lease: an abandoned lease
/// simply expires after its TTL.
///
/// Clones share one connection pool.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    default_ttl: Duration,
    endpoints: Vec<String>,
    keep_alives: KeepAlives,
    /// The session leases, when sessions are on.
    sessions: Option<Sessions>,
    /// Verifying reads, batched (used with sessions).
    reads: Arc<Reads>,
    /// The shortest lease the server grants, in seconds, as it answered a
    /// 1 s grant at connect: etcd raises every TTL below
    /// ⌈1.5 × election timeout⌉ to that (2 s with the default 1 s election
    /// timeout).
    min_ttl_secs: AtomicU64,
}

impl EtcdBackend {
    /// Connects to the cluster and checks that it answers within the dial
    /// timeout. Touches no lease key.
    ///
    /// # Errors
    /// [`Error::Backend`] for an invalid configuration or a refused request
    /// (e.g. bad credentials), [`Error::Unavailable`] when no member answered
    /// in time (including TLS handshakes that fail).
    pub async fn connect(config: EtcdConfig) -> Result<Self, Error> {
        config.validate()?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.dial_timeout)
            // etcd answers pings more often than every 5 s with GOAWAY; this
            // still notices a silently dead connection within 15 s.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from the quorum answers at once instead of
            // hanging, so a holder learns it cannot renew.
            .with_require_leader(true);
        if let Some(t) = &config.tls {
            #[cfg(feature = "tls")]
            {
                opts = opts.with_tls(tls::options(t)?);
            }
            #[cfg(not(feature = "tls"))]
            return Err(tls::refuse(t));
        }
        if let Some((user, password)) = &config.user {
            opts = opts.with_user(user.clone(), password.clone());
        }
        let dial = config.dial_timeout;
        let where_ = config.endpoints.join(", ");
        let client = match tokio::time::timeout(
            dial,
            Client::connect(&config.endpoints, Some(opts)),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(convert(&format!("connect to {where_}"), e)),
            Err(_) => {
                return Err(Error::Unavailable {
                    detail: format!("no etcd member at {where_} answered within {dial:?}"),
                    source: None,
                })
            }
        };
        let backend = EtcdBackend {
            inner: Arc::new(Inner {
                client,
                prefix: config.key_prefix.clone(),
                timeout: config.request_timeout,
                default_ttl: config.default_ttl,
                endpoints: config.endpoints.clone(),
                keep_alives: KeepAlives::new(),
                sessions: config.sessions.then(Sessions::default),
                reads: Reads::new(),
                min_ttl_secs: AtomicU64::new(1),
            }),
        };
        backend.probe(dial, &config).await?;
        backend.learn_min_ttl().await?;
        Ok(backend)
    }

    /// One cheap read, so that a wrong address, certificate or password shows
    /// up here rather than on the first acquire. The probe key cannot collide
    /// with a lease key (no lease-key segment starts with `.`).
    async fn probe(&self, dial: Duration, config: &EtcdConfig) -> Result<(), Error> {
        let mut kv = self.inner.client.kv_client();
        let key = format!("{}.probe", self.inner.prefix);
        let where_ = self.inner.endpoints.join(", ");
        match tokio::time::timeout(dial, kv.get(key, Some(GetOptions::new().with_count_only())))
            .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                let what = match closed_hint(&e, config) {
                    Some(hint) => format!("first request to {where_} ({hint})"),
                    None => format!("first request to {where_}"),
                };
                Err(convert(&what, e))
            }
            Err(_) => Err(Error::Unavailable {
                detail: format!("no etcd member at {where_} answered within {dial:?}"),
                source: None,
            }),
        }
    }

    /// Asks the server for a 1 s lease and records the TTL it really granted
    /// (then revokes it), so the capabilities report the minimum the server
    /// enforces rather than etcd's nominal 1 s.
    async fn learn_min_ttl(&self) -> Result<(), Error> {
        let mut lc = self.inner.client.lease_client();
        let granted = timed("lease grant", self.inner.timeout, lc.grant(1, None)).await?;
        let secs = u64::try_from(granted.ttl()).unwrap_or(1).max(1);
        self.inner.min_ttl_secs.store(secs, Ordering::Relaxed);
        self.revoke_quietly(granted.id()).await;
        Ok(())
    }

    /// The etcd key under which `key` is stored.
    pub fn etcd_key(&self, key: &LeaseKey) -> String {
        format!("{}{}", self.inner.prefix, key)
    }

    /// The underlying etcd client, for what this crate does not cover (e.g.
    /// watching many keys). Writing to lease keys through it breaks the
    /// guarantees of this crate.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The default TTL from the configuration.
    pub fn default_ttl(&self) -> Duration {
        self.inner.default_ttl
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<i64, Error> {
        let mut lc = self.inner.client.lease_client();
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let resp = timed("lease grant", self.inner.timeout, lc.grant(secs, None)).await?;
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
        self.inner.keep_alives.forget(lease);
        let mut lc = self.inner.client.lease_client();
        let _ = tokio::time::timeout(self.inner.timeout, lc.revoke(lease)).await;
    }

    /// The lease's remaining time as etcd reports it; `None` once it is gone.
    pub(crate) async fn remaining(&self, lease: i64) -> Result<Option<Duration>, Error> {
        let mut lc = self.inner.client.lease_client();
        match timed_raw(
            "lease time-to-live",
            self.inner.timeout,
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
    async fn extend(&self, lease: i64, since: Instant) -> Result<(KeepAlive, Instant), Error> {
        let r = self
            .inner
            .keep_alives
            .keep_alive(&self.inner.client, lease, self.inner.timeout, since)
            .await;
        if let Some(sessions) = &self.inner.sessions {
            match &r {
                Ok((KeepAlive::Alive, sent)) => sessions.alive(lease, *sent),
                Ok((KeepAlive::Gone, _)) => sessions.gone(lease),
                Err(_) => {}
            }
        }
        r
    }

    /// Whether this client binds its keys to session leases.
    pub fn sessions(&self) -> bool {
        self.inner.sessions.is_some()
    }

    /// How many keep-alive streams this client holds open (one per lease it
    /// renewed and has not seen end; with sessions, one per session).
    pub fn open_keep_alive_streams(&self) -> usize {
        self.inner.keep_alives.open()
    }

    /// The key-value at `ekey` (if any) and the store revision of the read.
    pub(crate) async fn get(&self, ekey: &str) -> Result<(Option<KeyValue>, i64), Error> {
        let mut kv = self.inner.client.kv_client();
        let mut resp = timed("get", self.inner.timeout, kv.get(ekey, None)).await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        Ok((resp.take_kvs().into_iter().next(), rev))
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, Error> {
        let mut kv = self.inner.client.kv_client();
        timed(what, self.inner.timeout, kv.txn(txn)).await
    }

    /// A transaction whose etcd error is kept, so that "lease not found"
    /// (a put bound to a lease that is gone) can be told apart.
    async fn txn_raw(
        &self,
        what: &str,
        txn: Txn,
    ) -> Result<Result<TxnResponse, etcd_client::Error>, Error> {
        let mut kv = self.inner.client.kv_client();
        timed_raw(what, self.inner.timeout, kv.txn(txn)).await
    }

    /// The acquire after the lease grant: `lease` is ours and fresh.
    async fn acquire_with_lease(
        &self,
        req: &AcquireRequest,
        ttl: Duration,
        sent: Instant,
        lease: i64,
    ) -> Result<Acquire, Error> {
        let ekey = self.etcd_key(&req.key);
        let value = record::encode(&req.holder, ttl, &req.payload, false);
        let put = || {
            TxnOp::put(
                ekey.as_str(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )
        };
        for _ in 0..CONTENTION_ATTEMPTS {
            let create = Txn::new()
                .when([Compare::create_revision(ekey.as_str(), CompareOp::Equal, 0)])
                .and_then([put()])
                .or_else([TxnOp::get(ekey.as_str(), None)]);
            let resp = self.txn("acquire transaction", create).await?;
            if resp.succeeded() {
                // The put is the transaction's only write, so the revision
                // after it is the key's create revision: our fence.
                let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
                let fence = u64::try_from(rev).ok().filter(|f| *f > 0).ok_or_else(|| {
                    Error::Unavailable {
                        detail: "etcd answered the acquire without a revision".into(),
                        source: None,
                    }
                })?;
                return Ok(Acquire::Granted(self.grant(
                    req,
                    Fence(fence),
                    ttl,
                    sent,
                    Handle {
                        lease,
                        mod_revision: rev,
                        session: false,
                    },
                )));
            }
            let Some(kv) = first_kv(&resp) else {
                // The key vanished between compare and read: impossible in one
                // transaction, but harmless to retry.
                continue;
            };
            let stored = record::decode(&req.key, &kv)?;
            if stored.holder == req.holder {
                // Our own live grant, whose answer was lost. Hand it back with
                // the same fence, bound to the fresh lease so that the backend's
                // expiry is at least `sent + ttl`, with this request's payload;
                // guarded by the revision we just read so nothing in between
                // is overwritten.
                let rebind = Txn::new()
                    .when([
                        Compare::create_revision(
                            ekey.as_str(),
                            CompareOp::Equal,
                            kv.create_revision(),
                        ),
                        Compare::mod_revision(ekey.as_str(), CompareOp::Equal, kv.mod_revision()),
                    ])
                    .and_then([put()]);
                let resp = self.txn("re-acquire transaction", rebind).await?;
                if resp.succeeded() {
                    // A session lease may carry other keys: only a lease of
                    // the key's own is revoked.
                    if stored.lease != lease && !stored.session {
                        self.revoke_quietly(stored.lease).await;
                    }
                    let mod_revision = resp.header().map(|h| h.revision()).unwrap_or(0);
                    return Ok(Acquire::Granted(self.grant(
                        req,
                        stored.fence,
                        ttl,
                        sent,
                        Handle {
                            lease,
                            mod_revision,
                            session: false,
                        },
                    )));
                }
                continue;
            }
            // Someone else holds it: give our lease back and report them.
            let (remaining, ()) =
                tokio::join!(self.remaining(stored.lease), self.revoke_quietly(lease));
            return Ok(Acquire::Held(holding(
                stored,
                remaining?.unwrap_or(Duration::ZERO),
            )));
        }
        Err(Error::Unavailable {
            detail: format!(
                "etcd key {ekey:?} kept changing during {CONTENTION_ATTEMPTS} acquire attempts"
            ),
            source: None,
        })
    }

    /// Acquire with sessions on: one transaction binds the key to the
    /// session lease of its TTL. On a fresh session (kept alive a moment
    /// ago) that is the only request, and the grant counts from the
    /// session's last answered keep-alive, sent before this call. On an
    /// older one a keep-alive (shared with every other operation keeping it
    /// alive at the same time) goes out beside the transaction, and the
    /// grant counts from it. Without a live session lease, one is granted
    /// first; a key refused to this client last time is tried with the
    /// transaction alone, and only a win sends the keep-alive after it.
    async fn acquire_in_session(
        &self,
        sessions: &Sessions,
        req: &AcquireRequest,
        ttl: Duration,
        start: Instant,
    ) -> Result<Acquire, Error> {
        let ekey = self.etcd_key(&req.key);
        let secs = ttl.as_secs();
        let value = record::encode(&req.holder, ttl, &req.payload, true);
        for _ in 0..CONTENTION_ATTEMPTS {
            // `known_from`: the instant the key would live a TTL from without
            // a keep-alive in this call (the grant just made, or a fresh
            // session's last keep-alive).
            let (lease, known_from) = match sessions.current(secs) {
                Some(current) => current,
                None => {
                    let _one_at_a_time = sessions.create.lock().await;
                    match sessions.current(secs) {
                        Some(current) => current,
                        None => {
                            let at = Instant::now();
                            let id = self.grant_lease(ttl).await?;
                            sessions.insert(secs, id, at);
                            (id, Some(at))
                        }
                    }
                }
            };
            let put = || {
                TxnOp::put(
                    ekey.as_str(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )
            };
            let create = Txn::new()
                .when([Compare::create_revision(ekey.as_str(), CompareOp::Equal, 0)])
                .and_then([put()])
                .or_else([TxnOp::get(ekey.as_str(), None)]);
            let lone = known_from.is_some() || sessions.was_refused(&ekey);
            let (resp, alive) = if lone {
                (self.txn_raw("acquire transaction", create).await?, None)
            } else {
                let (resp, alive) = tokio::join!(
                    self.txn_raw("acquire transaction", create),
                    self.extend(lease, start)
                );
                (resp?, Some(alive))
            };
            let resp = match resp {
                Ok(r) => r,
                // The session lease is gone (expired or revoked): so are its
                // keys. Start a new session.
                Err(e) if is_lease_not_found(&e) => {
                    sessions.gone(lease);
                    continue;
                }
                Err(e) => return Err(convert("acquire transaction", e)),
            };
            if resp.succeeded() {
                // The put is the transaction's only write, so the revision
                // after it is the key's create revision: our fence.
                let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
                let fence = u64::try_from(rev).ok().filter(|f| *f > 0).ok_or_else(|| {
                    Error::Unavailable {
                        detail: "etcd answered the acquire without a revision".into(),
                        source: None,
                    }
                })?;
                let Some(from) = self.session_life(lease, known_from, alive, start).await? else {
                    return Err(session_ran_out(&ekey));
                };
                sessions.note_refused(&ekey, false);
                let handle = Handle {
                    lease,
                    mod_revision: rev,
                    session: true,
                };
                return Ok(Acquire::Granted(self.grant(
                    req,
                    Fence(fence),
                    ttl,
                    from,
                    handle,
                )));
            }
            let Some(kv) = first_kv(&resp) else {
                continue;
            };
            let stored = record::decode(&req.key, &kv)?;
            if stored.holder != req.holder {
                // Someone else holds it. The remaining time would cost a
                // second request; a read reports it.
                sessions.note_refused(&ekey, true);
                return Ok(Acquire::Held(Holding::new(
                    stored.holder,
                    stored.fence,
                    stored.ttl,
                    stored.payload,
                )));
            }
            // Our own live grant, whose answer was lost: hand it back with the
            // same fence, bound to the session lease kept alive from this call,
            // with this request's payload, guarded by the revision just read.
            let rebind = Txn::new()
                .when([
                    Compare::create_revision(ekey.as_str(), CompareOp::Equal, kv.create_revision()),
                    Compare::mod_revision(ekey.as_str(), CompareOp::Equal, kv.mod_revision()),
                ])
                .and_then([put()]);
            let (resp, from) = tokio::join!(
                self.txn_raw("re-acquire transaction", rebind),
                self.session_life(lease, known_from, alive, start)
            );
            let resp = match resp? {
                Ok(r) => r,
                Err(e) if is_lease_not_found(&e) => {
                    sessions.gone(lease);
                    continue;
                }
                Err(e) => return Err(convert("re-acquire transaction", e)),
            };
            let from = from?;
            if !resp.succeeded() {
                continue;
            }
            let Some(from) = from else {
                return Err(session_ran_out(&ekey));
            };
            if stored.lease != lease && !stored.session && !sessions.is_session(stored.lease) {
                self.revoke_quietly(stored.lease).await;
            }
            sessions.note_refused(&ekey, false);
            let handle = Handle {
                lease,
                mod_revision: resp.header().map(|h| h.revision()).unwrap_or(0),
                session: true,
            };
            return Ok(Acquire::Granted(self.grant(
                req,
                stored.fence,
                ttl,
                from,
                handle,
            )));
        }
        Err(Error::Unavailable {
            detail: format!(
                "etcd key {ekey:?} kept changing during {CONTENTION_ATTEMPTS} acquire attempts"
            ),
            source: None,
        })
    }

    /// The instant from which a key just bound to session lease `lease` is
    /// known to live a TTL: `known_from` (the send of the grant that created
    /// the lease in this call, or of a fresh session's last keep-alive), or
    /// the send of a keep-alive sent during this call (`alive`, if one went
    /// out beside the transaction, else one now). `None` when the lease
    /// turned out gone.
    async fn session_life(
        &self,
        lease: i64,
        known_from: Option<Instant>,
        alive: Option<Result<(KeepAlive, Instant), Error>>,
        start: Instant,
    ) -> Result<Option<Instant>, Error> {
        if let Some(at) = known_from {
            return Ok(Some(at));
        }
        let alive = match alive {
            Some(a) => a,
            None => self.extend(lease, start).await,
        };
        match alive? {
            (KeepAlive::Alive, sent) => Ok(Some(sent)),
            (KeepAlive::Gone, _) => Ok(None),
        }
    }

    fn grant(
        &self,
        req: &AcquireRequest,
        fence: Fence,
        ttl: Duration,
        sent: Instant,
        handle: Handle,
    ) -> Grant {
        Grant::new(
            req.key.clone(),
            req.holder.clone(),
            fence,
            ttl,
            sent,
            handle.version(),
        )
    }

    /// Renew: one keep-alive and, at the same time, a read that checks the
    /// key is still ours (or, with a payload, a put guarded by the revision
    /// we last wrote). Renewed only if both say so: the key is ours and
    /// bound to the lease the keep-alive found alive. With sessions, a
    /// keep-alive of the key's session sent lately for another key stands in
    /// for this one's, and the read goes alone (one request).
    pub(crate) async fn renew_grant(
        &self,
        grant: &Grant,
        payload: Option<Payload>,
    ) -> Result<Renewal, Error> {
        let ekey = self.etcd_key(grant.key());
        let mut handle = Handle::of(grant.version());
        for _ in 0..CONTENTION_ATTEMPTS {
            let since = Instant::now();
            let kept_alive = self.inner.sessions.as_ref().and_then(|s| {
                s.kept_alive_since(grant.ttl().as_secs(), handle.lease, grant.sent_at())
            });
            let (alive, verified) = match kept_alive.filter(|_| handle.session) {
                // Another key's keep-alive of this session went out lately:
                // the key lives a TTL from it if the read finds it there.
                Some(sent) => (
                    Ok((KeepAlive::Alive, sent)),
                    self.verify(grant, &ekey, handle, payload.as_ref()).await,
                ),
                None => tokio::join!(
                    self.extend(handle.lease, since),
                    self.verify(grant, &ekey, handle, payload.as_ref())
                ),
            };
            let kv = match verified? {
                Verified::Written(mod_revision) => {
                    let done = Handle {
                        mod_revision,
                        ..handle
                    };
                    match alive? {
                        (KeepAlive::Alive, sent) => {
                            return Ok(Renewal::Renewed(grant.renewed(sent, done.version())))
                        }
                        // Written, but to a key whose lease is gone: it goes
                        // (or went) with the lease; look again.
                        (KeepAlive::Gone, _) => {
                            handle = done;
                            continue;
                        }
                    }
                }
                Verified::Read(kv) => kv,
            };
            // A key that is gone or another's is a loss whatever the
            // keep-alive answered.
            let Some(kv) = kv else {
                return Ok(Renewal::Lost);
            };
            let stored = record::decode(grant.key(), &kv)?;
            if stored.fence != grant.fence() || stored.holder != *grant.holder() {
                return Ok(Renewal::Lost);
            }
            let current = Handle::read(&stored);
            let (alive, sent) = alive?;
            if stored.lease == handle.lease && alive == KeepAlive::Alive && payload.is_none() {
                return Ok(Renewal::Renewed(grant.renewed(sent, current.version())));
            }
            // Still ours, but: written since this handle was made (an older
            // copy of the grant), so the guarded put retries on what we read;
            // or bound to another lease (a re-acquire by this holder rebound
            // it); or the keep-alive found no lease yet the key was there.
            // Keep the key's lease alive, measuring the deadline from that
            // new request.
            handle = current;
        }
        Err(Error::Unavailable {
            detail: format!(
                "etcd key {ekey:?} kept changing during {CONTENTION_ATTEMPTS} renew attempts"
            ),
            source: None,
        })
    }

    /// The verifying half of a renewal: a read of the key, or, with a
    /// payload, a put iff the key is exactly as we last wrote it (the put
    /// keeps the create revision, so the fence stays).
    async fn verify(
        &self,
        grant: &Grant,
        ekey: &str,
        handle: Handle,
        payload: Option<&Payload>,
    ) -> Result<Verified, Error> {
        let Some(p) = payload.filter(|_| handle.mod_revision > 0) else {
            if self.sessions() {
                // Many keys of a session renew at once: their reads share
                // requests as their keep-alives do.
                let kv = self
                    .inner
                    .reads
                    .get(&self.inner.client, ekey, self.inner.timeout)
                    .await?;
                return Ok(Verified::Read(kv));
            }
            return Ok(Verified::Read(self.get(ekey).await?.0));
        };
        let value = record::encode(grant.holder(), grant.ttl(), p, handle.session);
        let fence = i64::try_from(grant.fence().get()).unwrap_or(i64::MAX);
        let txn = Txn::new()
            .when([
                Compare::create_revision(ekey, CompareOp::Equal, fence),
                Compare::lease(ekey, CompareOp::Equal, handle.lease),
                Compare::mod_revision(ekey, CompareOp::Equal, handle.mod_revision),
            ])
            .and_then([TxnOp::put(
                ekey,
                value,
                Some(PutOptions::new().with_lease(handle.lease)),
            )])
            .or_else([TxnOp::get(ekey, None)]);
        match self.txn_raw("renew transaction", txn).await? {
            Ok(resp) if resp.succeeded() => Ok(Verified::Written(
                resp.header().map(|h| h.revision()).unwrap_or(0),
            )),
            Ok(resp) => Ok(Verified::Read(first_kv(&resp))),
            // The key's lease is gone (the key with it, or about to go): see
            // what is there now.
            Err(e) if is_lease_not_found(&e) => Ok(Verified::Read(self.get(ekey).await?.0)),
            Err(e) => Err(convert("renew transaction", e)),
        }
    }

    async fn release_grant(&self, grant: &Grant) -> Result<(), Error> {
        let ekey = self.etcd_key(grant.key());
        let Ok(fence) = i64::try_from(grant.fence().get()) else {
            // No etcd revision is that large: not a grant of ours.
            return Ok(());
        };
        // Fast path: the key exactly as we last wrote it (create revision,
        // lease and last write all ours).
        let handle = Handle::of(grant.version());
        let lease = handle.lease;
        let mut guard = vec![
            Compare::create_revision(ekey.as_str(), CompareOp::Equal, fence),
            Compare::lease(ekey.as_str(), CompareOp::Equal, handle.lease),
            Compare::mod_revision(ekey.as_str(), CompareOp::Equal, handle.mod_revision),
        ];
        for _ in 0..CONTENTION_ATTEMPTS {
            let txn = Txn::new()
                .when(guard.clone())
                .and_then([TxnOp::delete(
                    ekey.as_str(),
                    Some(DeleteOptions::new().with_prev_key()),
                )])
                .or_else([TxnOp::get(ekey.as_str(), None)]);
            let resp = self.txn("release transaction", txn).await?;
            if resp.succeeded() {
                // The deleted key's etcd lease is revoked when it was the
                // key's own; a session lease, which other keys may share, is
                // left to expire (or to carry this client's other keys).
                let deleted = resp.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Delete(d) => d
                        .prev_kvs()
                        .first()
                        .map(|kv| (kv.lease(), record::decode(grant.key(), kv))),
                    _ => None,
                });
                let deleted_lease = match deleted {
                    Some((lease, Ok(s))) if !s.session => {
                        self.revoke_quietly(lease).await;
                        lease
                    }
                    Some((lease, _)) => lease,
                    None => 0,
                };
                if lease != deleted_lease && !handle.session && !self.sessions() {
                    self.revoke_quietly(lease).await;
                }
                return Ok(());
            }
            // Released, expired, taken over, or not a lease record: nothing
            // of ours to touch. Only our own record written since this handle
            // was made (a re-acquire rebound it, or a newer copy of the grant
            // replaced the payload) is still ours: delete exactly the revision
            // we read.
            let Some(kv) = first_kv(&resp) else {
                return Ok(());
            };
            match record::decode(grant.key(), &kv) {
                Ok(s) if s.fence == grant.fence() && s.holder == *grant.holder() => {
                    guard = vec![
                        Compare::create_revision(ekey.as_str(), CompareOp::Equal, fence),
                        Compare::mod_revision(ekey.as_str(), CompareOp::Equal, s.mod_revision),
                    ];
                }
                _ => return Ok(()),
            }
        }
        Err(Error::Unavailable {
            detail: format!(
                "etcd key {ekey:?} kept changing during {CONTENTION_ATTEMPTS} release attempts"
            ),
            source: None,
        })
    }

    async fn observe(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
        let ekey = self.etcd_key(key);
        for _ in 0..CONTENTION_ATTEMPTS {
            let (kv, _) = self.get(&ekey).await?;
            let Some(kv) = kv else {
                return Ok(LeaseState::Free);
            };
            let stored = record::decode(key, &kv)?;
            if let Some(left) = self.remaining(stored.lease).await? {
                return Ok(LeaseState::Held(holding(stored, left)));
            }
            // The lease ran out between the two requests, and etcd deleted
            // the key with it; another holder may have taken the key since,
            // so look again rather than answer "free".
        }
        Err(Error::Unavailable {
            detail: format!("etcd key {ekey:?} kept changing during {CONTENTION_ATTEMPTS} reads"),
            source: None,
        })
    }
}

/// When the server hangs up on the first request, the client library only
/// says "broken pipe" or "connection closed"; with TLS that almost always
/// means the server refused our client certificate (or its absence), and
/// without TLS that we spoke plaintext to a TLS port. Say so.
fn closed_hint(e: &etcd_client::Error, config: &EtcdConfig) -> Option<&'static str> {
    let text = format!("{e:?}").to_lowercase();
    let hung_up = [
        "broken pipe",
        "connection closed",
        "connection reset",
        "brokenpipe",
        "connectionreset",
        "fatal alert",
    ]
    .iter()
    .any(|w| text.contains(w));
    if !hung_up {
        return None;
    }
    Some(match &config.tls {
        Some(t) if t.client_cert_pem.is_none() => {
            "the server closed the TLS connection: it probably requires a client certificate (--client-cert-auth) and none is configured"
        }
        Some(_) => {
            "the server closed the TLS connection: it probably does not accept this client certificate (is it signed by the CA in the server's --trusted-ca-file?)"
        }
        None => {
            "the server closed the connection: if it serves TLS, use an https:// endpoint and a TlsConfig"
        }
    })
}

/// A holding as reported to callers. etcd may enforce a longer minimum TTL
/// than we asked for (about 1.5 × its election timeout, 2 s by default), so
/// the remaining time is capped at the grant's TTL: callers see the TTL they
/// were promised, never more.
pub(crate) fn holding(stored: Stored, remaining: Duration) -> Holding {
    Holding::new(stored.holder, stored.fence, stored.ttl, stored.payload)
        .with_remaining(Some(remaining.min(stored.ttl)))
}

/// What a grant's [`Version`] carries: the etcd lease its key is bound to,
/// the revision of our last write to the key, and whether that lease is a
/// session lease (shared with other keys), as `"<lease>:<mod revision>"`
/// or `"<lease>:<mod revision>:s"`. A version that does not parse (or
/// `Version::default()`) gives zeros, which match no key: renew and release
/// then find the key's lease themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Handle {
    lease: i64,
    mod_revision: i64,
    session: bool,
}

impl Handle {
    fn of(v: &Version) -> Handle {
        let mut parts = v.as_str().splitn(3, ':');
        let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let (lease, mod_revision) = (next(), next());
        Handle {
            lease,
            mod_revision,
            session: v.as_str().ends_with(":s"),
        }
    }

    fn version(self) -> Version {
        let tag = if self.session { ":s" } else { "" };
        Version::new(format!("{}:{}{tag}", self.lease, self.mod_revision))
    }

    /// The handle of a record as read.
    fn read(stored: &Stored) -> Handle {
        Handle {
            lease: stored.lease,
            mod_revision: stored.mod_revision,
            session: stored.session,
        }
    }
}

/// The key was bound to a session lease that turned out gone in the same
/// call: etcd may have answered the transaction before it deleted the
/// lease's keys, so for a while the key was held for this holder under a
/// fence nobody was told. An unknown outcome, which the caller retries with
/// the same holder id (the next attempt starts a new session).
fn session_ran_out(ekey: &str) -> Error {
    Error::Unavailable {
        detail: format!(
            "etcd acquire of {ekey:?}: the session lease ran out during the call (retry with the same holder id)"
        ),
        source: None,
    }
}

/// What the verifying half of a renewal found.
enum Verified {
    /// The guarded put replaced the payload; the key's new mod revision.
    Written(i64),
    /// The key as read (absent: `None`).
    Read(Option<KeyValue>),
}

fn first_kv(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
        _ => None,
    })
}

impl LeaseBackend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        let min = Duration::from_secs(self.inner.min_ttl_secs.load(Ordering::Relaxed));
        Capabilities::new(
            TimeAuthority::BackendClock,
            TtlRule::new(min..=MAX_TTL).rounded_to(Duration::from_secs(1)),
        )
        .with_watch(true)
        .with_exclusion(Exclusion::Atomic)
        .with_fence_scope(FenceScope::Global)
        .with_max_payload(MAX_PAYLOAD_LEN)
    }

    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        Box::pin(async move {
            let sent = Instant::now();
            let ttl = self.capabilities().ttl.effective(req.ttl)?;
            if let Some(sessions) = &self.inner.sessions {
                return self.acquire_in_session(sessions, &req, ttl, sent).await;
            }
            let lease = self.grant_lease(ttl).await?;
            match self.acquire_with_lease(&req, ttl, sent, lease).await {
                Ok(a) => Ok(a),
                // A known failure left the key alone: our lease is unused. After
                // an unknown outcome the key may be bound to it, and a retry by
                // the same holder must find it alive.
                Err(e) if !e.is_unknown_outcome() => {
                    self.revoke_quietly(lease).await;
                    Err(e)
                }
                Err(e) => Err(e),
            }
        })
    }

    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        Box::pin(self.renew_grant(grant, payload))
    }

    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.release_grant(grant))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        Box::pin(self.observe(key))
    }

    fn break_lease<'a>(
        &'a self,
        key: &'a LeaseKey,
        note: &'a BreakNote,
    ) -> BoxFuture<'a, Result<Broken, Error>> {
        Box::pin(self.break_key(key, note))
    }

    fn last_break<'a>(
        &'a self,
        key: &'a LeaseKey,
    ) -> BoxFuture<'a, Result<Option<LastBreak>, Error>> {
        Box::pin(self.read_last_break(key))
    }

    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let ekey = self.etcd_key(key);
            let (kv, rev) = self.get(&ekey).await?;
            let same = match (&kv, seen) {
                (None, LeaseState::Free) => true,
                (Some(kv), LeaseState::Held(h)) => match record::decode(key, kv) {
                    // A new payload is a change too (a leader's proclaim).
                    Ok(s) => s.holder == h.holder && s.fence == h.fence && s.payload == h.payload,
                    Err(_) => false,
                },
                _ => false,
            };
            if !same {
                return Ok(());
            }
            // Watching from just after the revision we read misses nothing
            // that happened in between.
            let mut wc = self.inner.client.watch_client();
            let opts = WatchOptions::new().with_start_revision(rev.saturating_add(1));
            let mut stream = timed(
                "watch",
                self.inner.timeout,
                wc.watch(ekey.as_str(), Some(opts)),
            )
            .await?;
            loop {
                match stream.message().await {
                    // A cancelled watch (e.g. the revision was compacted) is a
                    // possible change: the caller re-reads.
                    Ok(Some(resp)) if resp.canceled() || !resp.events().is_empty() => return Ok(()),
                    Ok(Some(_)) => {}
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(convert("watch", e)),
                }
            }
        })
    }
}
