//! The contract's grant operations on etcd: [`Conn::try_acquire`],
//! [`Conn::renew`], [`Conn::release`] and [`Conn::read`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use lease_core::{
    Acquire, AcquireRequest, Error, Grant, LeaseKey, LeaseState, Payload, Renewal,
    CONTENTION_ATTEMPTS,
};

use crate::conn::{granted_at, Conn};
use crate::errors::{convert, is_lease_not_found};
use crate::keepalive::KeepAlive;
use crate::mirror::Seen;
use crate::record::{self, first_kv, holding, Handle, Stored};
use crate::session::InSession;
use crate::session_leases::Sessions;

impl Conn {
    /// Acquire: grants an etcd lease with the TTL, then one transaction puts
    /// the key bound to it iff the key does not exist, and otherwise reads
    /// the holder; with sessions, [binds the key to the session lease of the
    /// TTL](Conn::acquire_in_session) instead.
    pub(crate) async fn try_acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        let acquired = self.acquire(req).await;
        if let (Ok(Acquire::Granted(g)), Some(mirror)) = (&acquired, &self.mirror) {
            mirror.adopt(g.key(), record::revision(g.fence()));
        }
        acquired
    }

    /// The acquire itself; [`Conn::try_acquire`] then gives the mirror the
    /// grant's copy of the key.
    async fn acquire(&self, req: AcquireRequest) -> Result<Acquire, Error> {
        let sent = Instant::now();
        let ttl = self.capabilities().ttl.effective(req.ttl)?;
        if let Some(sessions) = &self.sessions {
            match self.acquire_in_session(sessions, &req, ttl, sent).await? {
                InSession::Done(a) => return Ok(a),
                InSession::Elsewhere => {}
            }
        }
        let mut lease = self.grant_lease(ttl).await?;
        match self.acquire_with_lease(&req, ttl, sent, &mut lease).await {
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
    }

    /// The acquire after the lease grant: `lease` is ours and fresh (and
    /// replaced by a longer one when our own live grant has a longer TTL).
    async fn acquire_with_lease(
        &self,
        req: &AcquireRequest,
        mut ttl: Duration,
        sent: Instant,
        lease: &mut i64,
    ) -> Result<Acquire, Error> {
        let ekey = self.etcd_key(&req.key);
        // A lease of the key's that a keep-alive found gone: the key goes
        // with it, so it is not kept on it.
        let mut gone = 0;
        for _ in 0..CONTENTION_ATTEMPTS {
            let value = record::encode(&req.holder, ttl, &req.payload, false);
            let bound = *lease;
            let put = || {
                TxnOp::put(
                    ekey.as_str(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(bound)),
                )
            };
            let create = Txn::new()
                .when([Compare::create_revision(ekey.as_str(), CompareOp::Equal, 0)])
                .and_then([put()])
                .or_else([TxnOp::get(ekey.as_str(), None)]);
            // The read that may find our own grant is sent after this.
            let read_sent = Instant::now();
            let resp = self.txn("acquire transaction", create).await?;
            if resp.succeeded() {
                // The put is the transaction's only write, so the revision
                // after it is the key's create revision: our fence.
                let (rev, fence) = granted_at(&resp)?;
                let handle = Handle {
                    lease: bound,
                    mod_revision: rev,
                    ttl,
                    session: false,
                };
                return Ok(Acquire::Granted(handle.grant(req, fence, ttl, sent)));
            }
            let Some(kv) = first_kv(&resp) else {
                // The key vanished between compare and read: impossible in one
                // transaction, but harmless to retry.
                continue;
            };
            let stored = record::decode(&req.key, &kv)?;
            if stored.holder == req.holder
                && !stored.session
                && stored.ttl >= ttl
                && stored.lease != gone
            {
                // Our own live grant, on a lease of its own at least as long
                // as asked: keep the key on it (see `keep_own_lease`) and
                // give our fresh lease back.
                match self
                    .keep_own_lease(req, &ekey, &kv, &stored, read_sent, sent)
                    .await?
                {
                    Kept::Granted(grant) => {
                        self.revoke_quietly(*lease).await;
                        return Ok(Acquire::Granted(grant));
                    }
                    // The key goes (or went) with its lease: look again,
                    // and create it, or rebind it if it is still there.
                    Kept::Gone => gone = stored.lease,
                    Kept::Changed => {}
                }
                continue;
            }
            if stored.holder == req.holder && stored.ttl > ttl {
                // Our own live grant has a longer TTL (on a session lease, or
                // on a lease found gone). A grant of this term whose answer
                // did arrive counts its deadline, and its keep-alives, from
                // it: rebinding the key to our shorter lease would end the
                // term before that deadline. Bind it to a lease of the longer
                // TTL instead.
                let longer = self.grant_lease(stored.ttl).await?;
                self.revoke_quietly(std::mem::replace(lease, longer)).await;
                ttl = stored.ttl;
                continue;
            }
            if stored.holder == req.holder {
                // Our own live grant, to be lengthened (or moved off a
                // session lease, or off a lease found gone): hand it back
                // with the same fence, bound to our lease, with this
                // request's payload; guarded by the revision we just read so
                // nothing in between is overwritten.
                //
                // Other copies of this grant may have renewed the key's
                // current lease just before the rebind lands, and count
                // their deadlines from that: so our lease is kept alive
                // right before the rebind goes out, and the grant counts
                // from that keep-alive, not from the lease's grant at the
                // start of the call (a slow link or a pause in between
                // would otherwise move the key to a lease that runs out
                // first).
                let (alive, from) = self.extend(bound, Instant::now()).await?;
                if alive == KeepAlive::Gone {
                    // Our lease ran out before we used it: take another.
                    *lease = self.grant_lease(ttl).await?;
                    continue;
                }
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
                    // A copy that renewed the old lease just before the
                    // rebind landed may write until two thirds of a TTL
                    // after that. If the rebind took long, our lease's last
                    // keep-alive may be too old to outlive that: keep it
                    // alive again at once. Answered alive, the lease never
                    // ran out (an expired lease does not come back), so the
                    // key lived on and now lives a TTL from this keep-alive.
                    if self.extend(bound, Instant::now()).await?.0 == KeepAlive::Gone {
                        return Err(Error::Unavailable {
                            detail: format!(
                                "etcd re-acquire of {ekey:?}: the key's new lease ran out right after the key was moved to it"
                            ),
                            source: None,
                        });
                    }
                    // A session lease may carry other keys: only a lease of
                    // the key's own is revoked.
                    if stored.lease != bound && !stored.session {
                        self.revoke_quietly(stored.lease).await;
                    }
                    let mod_revision = resp.header().map(|h| h.revision()).unwrap_or(0);
                    let handle = Handle {
                        lease: bound,
                        mod_revision,
                        ttl,
                        session: false,
                    };
                    return Ok(Acquire::Granted(handle.grant(req, stored.fence, ttl, from)));
                }
                continue;
            }
            // Someone else holds it: give our lease back and report them.
            let (remaining, ()) =
                tokio::join!(self.remaining(stored.lease), self.revoke_quietly(bound));
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

    /// A re-acquire of our own live grant `stored` (read as `kv` by a read
    /// sent at `read_sent`), bound to a lease of the key's own whose TTL is
    /// at least the request's: the key stays on that lease, never rebound.
    /// Other copies of the grant renew that lease and count their deadlines
    /// from their keep-alives; moving the key to another lease would let it
    /// run out on the other lease's clock.
    ///
    /// One keep-alive of the key's lease, and, when the request's payload
    /// differs from the stored one, beside it a put of the payload guarded
    /// by the revisions we read and that lease (the lease stays); the
    /// keep-alive may be one another caller sent after our read. The grant
    /// must count, as a renewal does, from no later than the read that found
    /// the key ours (a keep-alive sent after a delete from outside must not
    /// stretch the deadline past it); it counts from `start`, the send of
    /// the call's first request (its lease grant, one round trip earlier
    /// still), as a fresh acquire's grant does: the conformance suite's
    /// `deadline_counts_from_the_send_instant` holds a re-acquire to that.
    /// It has the stored TTL, the stored lease and the key's current mod
    /// revision.
    async fn keep_own_lease(
        &self,
        req: &AcquireRequest,
        ekey: &str,
        kv: &KeyValue,
        stored: &Stored,
        read_sent: Instant,
        start: Instant,
    ) -> Result<Kept, Error> {
        let handle = Handle::read(stored);
        if stored.payload == req.payload {
            let (alive, _) = self.extend(stored.lease, read_sent).await?;
            return Ok(match alive {
                KeepAlive::Alive => {
                    Kept::Granted(handle.grant(req, stored.fence, stored.ttl, start))
                }
                KeepAlive::Gone => Kept::Gone,
            });
        }
        let value = record::encode(&req.holder, stored.ttl, &req.payload, false);
        let txn = Txn::new()
            .when([
                Compare::create_revision(ekey, CompareOp::Equal, kv.create_revision()),
                Compare::mod_revision(ekey, CompareOp::Equal, kv.mod_revision()),
                Compare::lease(ekey, CompareOp::Equal, stored.lease),
            ])
            .and_then([TxnOp::put(
                ekey,
                value,
                Some(PutOptions::new().with_lease(stored.lease)),
            )]);
        let (alive, written) = tokio::join!(
            self.extend(stored.lease, read_sent),
            self.txn_raw("re-acquire transaction", txn)
        );
        let mod_revision = match written? {
            Ok(resp) if resp.succeeded() => resp.header().map(|h| h.revision()).unwrap_or(0),
            // Written since we read it: look again.
            Ok(_) => return Ok(Kept::Changed),
            // The key's lease is gone, and the key with it.
            Err(e) if is_lease_not_found(&e) => return Ok(Kept::Gone),
            Err(e) => return Err(convert("re-acquire transaction", e)),
        };
        Ok(match alive? {
            (KeepAlive::Alive, _) => Kept::Granted(
                Handle {
                    mod_revision,
                    ..handle
                }
                .grant(req, stored.fence, stored.ttl, start),
            ),
            (KeepAlive::Gone, _) => Kept::Gone,
        })
    }

    /// Renew: one keep-alive and, at the same time, a read that checks the
    /// key is still ours (or, with a payload, a put guarded by the revision
    /// we last wrote). Renewed only if both say so: the key is ours and
    /// bound to the lease the keep-alive found alive. With sessions, a
    /// keep-alive of the key's session sent lately for another key stands in
    /// for this one's, and the read goes alone (one request).
    ///
    /// A key this client bound to one of its session leases is renewed
    /// only while its [sweep](crate::sweep) has not begun: after that it is
    /// `Lost` without a request, as it would have expired on a lease of its
    /// own. A grant the client keeps on a lease outside its sessions renews
    /// meanwhile: the sweep cannot reach that lease.
    pub(crate) async fn renew(
        &self,
        grant: &Grant,
        payload: Option<Payload>,
    ) -> Result<Renewal, Error> {
        let handle = Handle::of(grant.version());
        let Some(sessions) = &self.sessions else {
            return self.renew_uncounted(grant, handle, payload, None).await;
        };
        // Every renewal is counted, whatever lease its version names: the
        // key may be on one of this client's sessions all the same.
        let Some(claim) = sessions.bindings.begin_renew(
            grant.key(),
            || Arc::from(self.etcd_key(grant.key())),
            std::time::Instant::now(),
            grant.ttl(),
            self.timeout,
        ) else {
            // This client is sweeping the key from its session leases. A
            // grant kept on a lease outside them (one it holds with another
            // client under the same holder id) is out of the sweep's reach,
            // which deletes only from those leases: it renews as without
            // sessions, and only while the key stays outside them.
            if handle.session || sessions.is_session(handle.lease) {
                return Ok(Renewal::Lost);
            }
            return self
                .renew_uncounted(grant, handle, payload, Some(sessions))
                .await;
        };
        match self.renew_key(grant, handle, payload, None).await? {
            Some((g, now)) => {
                if sessions.is_session(now.lease) {
                    let fence = record::revision(g.fence());
                    claim.granted(now.lease, (fence, now.mod_revision), g.sent_at(), g.ttl());
                } else {
                    claim.moved_away();
                }
                Ok(Renewal::Renewed(g))
            }
            None => {
                claim.unbound();
                Ok(Renewal::Lost)
            }
        }
    }

    /// A renewal the session bindings do not count: without sessions, or
    /// of a grant kept outside them while its key is swept from them
    /// (`outside`, see [`Conn::renew_key`]).
    async fn renew_uncounted(
        &self,
        grant: &Grant,
        handle: Handle,
        payload: Option<Payload>,
        outside: Option<&Sessions>,
    ) -> Result<Renewal, Error> {
        let renewed = self.renew_key(grant, handle, payload, outside).await?;
        Ok(renewed.map_or(Renewal::Lost, |(g, _)| Renewal::Renewed(g)))
    }

    /// The renewal of `grant`, starting from `handle` (the one its version
    /// names): the renewed grant and its handle, or `None` when the grant is
    /// lost. With `outside`, the grant is also lost when its key is found
    /// on one of those sessions' leases (which are being swept of it).
    async fn renew_key(
        &self,
        grant: &Grant,
        mut handle: Handle,
        payload: Option<Payload>,
        outside: Option<&Sessions>,
    ) -> Result<Option<(Grant, Handle)>, Error> {
        let given = handle;
        // A renewal that finds the key as the grant left it keeps the
        // grant's version text (most renewals, and no string to build).
        let renewed = |from: Instant, done: Handle| {
            let version = if done == given {
                grant.version().clone()
            } else {
                done.version()
            };
            Some((grant.renewed(from, version), done))
        };
        // Whether the mirror may stand in for the read: not once it
        // answered for this renewal and the keep-alive disagreed.
        let mut watched = true;
        for _ in 0..CONTENTION_ATTEMPTS {
            // The deadline counts from no later than this instant: the
            // read (or put) that finds the key ours is sent after it, and a
            // keep-alive queued behind another key's may go out later than
            // that read. Counting from the keep-alive alone would stretch
            // the deadline past a break or outside delete that landed
            // between the read and the keep-alive.
            let since = Instant::now();
            let (alive, verified) = match self.borrowed_keep_alive(grant, handle) {
                // Another key's keep-alive of this session went out lately:
                // the key lives a TTL from it if the read finds it there.
                Some(sent) => (
                    Ok((KeepAlive::Alive, sent)),
                    self.verify(grant, handle, payload.as_ref(), since, watched)
                        .await,
                ),
                None => tokio::join!(
                    Box::pin(self.extend(handle.lease, since)),
                    self.verify(grant, handle, payload.as_ref(), since, watched)
                ),
            };
            let kv = match verified? {
                Verified::Ours(mod_revision, ttl) => {
                    let done = Handle {
                        mod_revision,
                        ttl,
                        ..handle
                    };
                    match alive? {
                        (KeepAlive::Alive, sent) => return Ok(renewed(sent.min(since), done)),
                        // Ours, but on a lease that is gone: the key goes
                        // (or went) with it, though the mirror may not have
                        // seen that yet; read what is there.
                        (KeepAlive::Gone, _) => {
                            handle = done;
                            watched = false;
                            continue;
                        }
                    }
                }
                Verified::Read(kv) => kv,
            };
            // A key that is gone or another's is a loss whatever the
            // keep-alive answered.
            let Some(kv) = kv else {
                return Ok(None);
            };
            let stored = record::decode(grant.key(), &kv)?;
            if stored.fence != grant.fence() || stored.holder != *grant.holder() {
                return Ok(None);
            }
            if outside.is_some_and(|s| s.is_session(stored.lease)) {
                return Ok(None);
            }
            let current = Handle::read(&stored);
            let (alive, sent) = alive?;
            if stored.lease == handle.lease && alive == KeepAlive::Alive && payload.is_none() {
                return Ok(renewed(sent.min(since), current));
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
                "etcd key {:?} kept changing during {CONTENTION_ATTEMPTS} renew attempts",
                self.etcd_key(grant.key())
            ),
            source: None,
        })
    }

    /// The verifying half of a renewal: a read of the key, or, with a
    /// payload, a put iff the key is exactly as we last wrote it (the put
    /// keeps the create revision, so the fence stays). The put never
    /// writes a TTL shorter than the record's: a re-acquire of this term
    /// may have lengthened it, and the next re-acquire keeps the key's
    /// lease only while the record says it is the longer one. Without the
    /// record's TTL in the handle the key is read first.
    ///
    /// Without a payload and with sessions, the [mirror](crate::mirror)
    /// stands in for the read (`watched`) when it has caught up to a
    /// progress request sent at or after `since` and holds the key exactly
    /// as the handle says: no request for the key at all.
    async fn verify(
        &self,
        grant: &Grant,
        handle: Handle,
        payload: Option<&Payload>,
        since: Instant,
        watched: bool,
    ) -> Result<Verified, Error> {
        let Some(p) = payload.filter(|_| handle.mod_revision > 0 && !handle.ttl.is_zero()) else {
            if let Some(mirror) = self.mirror.as_ref().filter(|_| {
                watched && payload.is_none() && handle.mod_revision > 0 && handle.lease != 0
            }) {
                let fence = record::revision(grant.fence());
                // Boxed, as the requests below are (see the test
                // `a_renewal_future_stays_small`).
                if Box::pin(mirror.caught_up(since, self.timeout / 2)).await
                    && mirror.seen(grant.key(), fence, handle.mod_revision, handle.lease)
                        == Seen::Unchanged
                {
                    return Ok(Verified::Ours(handle.mod_revision, handle.ttl));
                }
            }
            let ekey = self.etcd_key(grant.key());
            if self.sessions() {
                // Many keys of a session renew at once: their reads share
                // requests as their keep-alives do.
                let kv = Box::pin(self.reads.get(&self.client, &ekey, self.timeout)).await?;
                return Ok(Verified::Read(kv));
            }
            return Ok(Verified::Read(Box::pin(self.get(&ekey)).await?.0));
        };
        let ekey = self.etcd_key(grant.key());
        let ekey = ekey.as_str();
        let ttl = grant.ttl().max(handle.ttl);
        let value = record::encode(grant.holder(), ttl, p, handle.session);
        let fence = record::revision(grant.fence());
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
        match Box::pin(self.txn_raw("renew transaction", txn)).await? {
            Ok(resp) if resp.succeeded() => {
                return Ok(Verified::Ours(
                    resp.header().map(|h| h.revision()).unwrap_or(0),
                    ttl,
                ))
            }
            Ok(resp) => return Ok(Verified::Read(first_kv(&resp))),
            // The key's lease is gone (the key with it, or about to go): see
            // what is there now (below, once the error is dropped: the
            // future would hold it across the read).
            Err(e) if is_lease_not_found(&e) => {}
            Err(e) => return Err(convert("renew transaction", e)),
        }
        Ok(Verified::Read(Box::pin(self.get(ekey)).await?.0))
    }

    /// Release: deletes the key iff its create revision is still our fence,
    /// then revokes the key's own etcd lease (never a session lease).
    pub(crate) async fn release(&self, grant: &Grant) -> Result<(), Error> {
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
        // The record the guard deletes exactly: its etcd lease, and whether
        // that is a session lease. Known from the guard, so the delete needs
        // no copy of what it removed.
        let mut target = (handle.lease, handle.session);
        for _ in 0..CONTENTION_ATTEMPTS {
            let txn = Txn::new()
                .when(guard.clone())
                .and_then([TxnOp::delete(ekey.as_str(), None)])
                .or_else([TxnOp::get(ekey.as_str(), None)]);
            let resp = self.txn("release transaction", txn).await?;
            if resp.succeeded() {
                if let Some(s) = &self.sessions {
                    s.bindings.released(grant.key(), fence);
                }
                // The deleted key's etcd lease is revoked when it was the
                // key's own; a session lease, which other keys may share, is
                // left to expire (or to carry this client's other keys).
                let (deleted_lease, session) = target;
                if !session {
                    self.revoke_quietly(deleted_lease).await;
                }
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
                    target = (s.lease, s.session);
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

    /// Read: the holder, and the remaining time etcd reports for its lease;
    /// never writes.
    pub(crate) async fn read(&self, key: &LeaseKey) -> Result<LeaseState, Error> {
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

/// What [`Conn::keep_own_lease`] did.
enum Kept {
    /// The key stays on its lease, kept alive: our grant back.
    Granted(Grant),
    /// The key's lease is gone (the key with it, or about to go).
    Gone,
    /// The key was written since we read it.
    Changed,
}

/// What the verifying half of a renewal found.
enum Verified {
    /// The key is ours, with this mod revision and the TTL its record says:
    /// the guarded put replaced the payload, or the mirror, caught up to
    /// after the renewal began, holds the key exactly as the handle last
    /// left it.
    Ours(i64, Duration),
    /// The key as read (absent: `None`).
    Read(Option<KeyValue>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, B, C, F>(_: &impl Fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A renewal's future is boxed once per renewal, and a group renews
    /// thousands a second. glibc's malloc serves a request of up to 1,000
    /// bytes from its small bins; a larger one first consolidates every
    /// small chunk freed since the last (at 100,000 leases that took a
    /// third more client CPU per renewal). So the requests a renewal rarely sends (a guarded
    /// put, a read, a keep-alive of its own) and the wait on the mirror are
    /// boxed where they happen, and no error is held across an await.
    #[test]
    fn a_renewal_future_stays_small() {
        let renew = |c: &'static Conn, g: &'static Grant, p: Option<Payload>| c.renew(g, p);
        let size = future_size(&renew);
        assert!(size <= 900, "the renewal future takes {size} bytes");
    }
}
