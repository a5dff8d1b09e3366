//! Sessions: one etcd lease shared by every key a client holds with the
//! same TTL, as etcd's own `concurrency.Session` shares one.
//!
//! With sessions on ([`EtcdConfig::sessions`](crate::EtcdConfig::sessions)),
//! an acquire binds its key to the session lease of its TTL instead of
//! granting a lease of its own, and a release deletes the key without
//! revoking anything. The session lease is kept alive only by the
//! keep-alives that acquires and renewals send (never by a background
//! task), so a client that stops renewing lets all its keys expire one TTL
//! later.
//!
//! This module holds the acquire with sessions on, and what a renewal of a
//! session's key may take from the session; [`session_leases`](crate::session_leases)
//! remembers which lease serves which TTL and until when it is known to live.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lease_core::{Acquire, AcquireRequest, Error, Grant, Holding, CONTENTION_ATTEMPTS};

use crate::conn::{granted_at, Conn};
use crate::errors::{convert, is_lease_not_found};
use crate::keepalive::KeepAlive;
use crate::record::{self, first_kv, Handle};
use crate::session_leases::Sessions;

impl Conn {
    /// Acquire with sessions on: one transaction binds the key to the
    /// session lease of its TTL. On a fresh session (kept alive a moment
    /// ago) that is the only request, and the grant counts from the
    /// session's last answered keep-alive, sent before this call. On an
    /// older one a keep-alive (shared with every other operation keeping it
    /// alive at the same time) goes out beside the transaction, and the
    /// grant counts from it. Without a live session lease, one is granted
    /// first; a key refused to this client last time is tried with the
    /// transaction alone, and only a win sends the keep-alive after it.
    ///
    /// Our own live grant bound to a lease that is not one of this client's
    /// sessions (another client of the same holder id holds it too, as the
    /// holders of a shared phase do) is [`InSession::Elsewhere`]: it is
    /// kept as without sessions, on a lease of its own, never on this
    /// client's session (whose keep-alives would then carry another
    /// client's grant, and whose sweep would not know that client's
    /// renewals), nor another client's.
    pub(crate) async fn acquire_in_session(
        &self,
        sessions: &Sessions,
        req: &AcquireRequest,
        mut ttl: Duration,
        start: Instant,
    ) -> Result<InSession, Error> {
        let ekey = self.etcd_key(&req.key);
        // Counted before any request goes out, so that whatever this call
        // binds is swept one TTL on if nobody renews it, the call dropped
        // or failed included.
        let claim = sessions
            .bindings
            .begin_acquire(&req.key, &ekey, start, ttl, self.timeout)
            .await?;
        for _ in 0..CONTENTION_ATTEMPTS {
            let secs = ttl.as_secs();
            let value = record::encode(&req.holder, ttl, &req.payload, true);
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
            claim.may_bind(lease);
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
                let (rev, fence) = granted_at(&resp)?;
                let Some(from) = self.session_life(lease, known_from, alive, start).await? else {
                    return Err(session_ran_out(&ekey));
                };
                sessions.note_refused(&ekey, false);
                let handle = Handle {
                    lease,
                    mod_revision: rev,
                    ttl,
                    session: true,
                };
                claim.granted(lease, (rev, rev), from, ttl);
                return Ok(InSession::Done(Acquire::Granted(
                    handle.grant(req, fence, ttl, from),
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
                claim.unbound();
                return Ok(InSession::Done(Acquire::Held(Holding::new(
                    stored.holder,
                    stored.fence,
                    stored.ttl,
                    stored.payload,
                ))));
            }
            if !sessions.is_session(stored.lease) {
                // Whatever this client bound of the key is gone from its
                // sessions: the key is on another client's lease now.
                claim.moved_away();
                return Ok(InSession::Elsewhere);
            }
            if stored.ttl > ttl {
                // Our own live grant has a longer TTL, which a grant of this
                // term whose answer did arrive counts its deadline from:
                // bind the key to the session of that TTL, never a shorter.
                ttl = stored.ttl;
                continue;
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
            sessions.note_refused(&ekey, false);
            let handle = Handle {
                lease,
                mod_revision: resp.header().map(|h| h.revision()).unwrap_or(0),
                ttl,
                session: true,
            };
            claim.granted(
                lease,
                (kv.create_revision(), handle.mod_revision),
                from,
                ttl,
            );
            return Ok(InSession::Done(Acquire::Granted(handle.grant(
                req,
                stored.fence,
                ttl,
                from,
            ))));
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

    /// The renewal of a key bound to a session lease may count from a
    /// keep-alive of that lease sent lately for another key instead of
    /// sending its own (see [`Sessions::kept_alive_since`]): that
    /// keep-alive's send, if there is one. The key then lives a TTL from it
    /// if the renewal's read finds it there.
    pub(crate) fn borrowed_keep_alive(&self, grant: &Grant, handle: Handle) -> Option<Instant> {
        if !handle.session {
            return None;
        }
        self.sessions.as_ref()?.kept_alive_since(
            grant.ttl().as_secs(),
            handle.lease,
            grant.sent_at(),
        )
    }
}

/// What an acquire with sessions on came to.
pub(crate) enum InSession {
    /// Granted or refused.
    Done(Acquire),
    /// Our own live grant, bound to a lease that is not one of this
    /// client's sessions: to be kept as without sessions.
    Elsewhere,
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
