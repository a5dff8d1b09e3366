//! Keep-alive streams held open per etcd lease.
//!
//! etcd renews leases only over a bidirectional gRPC stream. Opening a fresh
//! stream for every renewal costs the client far more than the renewal (a
//! new HTTP/2 stream, its headers and tasks), which matters for a process
//! holding thousands of leases; so the stream of each lease stays open and a
//! renewal is one message each way on it.
//!
//! One request and its answer are exchanged at a time per stream (etcd
//! answers a stream's keep-alives in order), and a stream whose exchange
//! failed, timed out or was cancelled is dropped, never reused: a late
//! answer must not be taken for the answer to a later request, whose send
//! instant would then overstate the lease.
//!
//! Callers that want the same lease kept alive at the same time share one
//! keep-alive (a session lease renewed for many keys at once): a call waits
//! for the exchange in flight, and then takes the answer of the next one if
//! that was sent after the call began — an extension counted from a send
//! before the call would claim more than the caller may — or sends one
//! itself. So many concurrent renewals cost one or two keep-alives, and
//! every answer handed out was sent during the call that receives it.
//!
//! # Cancel safety
//! [`KeepAlives::keep_alive`] is cancel safe: a dropped call drops the
//! stream it was using, and the next call opens a new one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use lease_core::Error;

use crate::errors::{convert, is_lease_not_found, timed_raw};

/// A stream unused this long is closed at the next sweep.
const IDLE: Duration = Duration::from_secs(300);
/// Sweeps run at most this often (when a new lease's stream is opened).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What a keep-alive learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeepAlive {
    /// The lease lives on, extended from the request.
    Alive,
    /// etcd has no such lease (expired or revoked).
    Gone,
}

type Stream = (LeaseKeeper, LeaseKeepAliveStream);

struct Slot {
    /// The open stream, if any; the lock also serialises exchanges.
    stream: tokio::sync::Mutex<Option<Stream>>,
    last_used: Mutex<Instant>,
    /// The last completed exchange: when its keep-alive was sent, and what
    /// it learned (or why it failed). Written under the stream's lock.
    last: Mutex<Option<(Instant, Result<KeepAlive, String>)>>,
}

struct Slots {
    map: HashMap<i64, Arc<Slot>>,
    last_sweep: Instant,
}

/// The open keep-alive streams of one client.
pub(crate) struct KeepAlives {
    slots: Mutex<Slots>,
}

impl KeepAlives {
    pub(crate) fn new() -> Self {
        KeepAlives {
            slots: Mutex::new(Slots {
                map: HashMap::new(),
                last_sweep: Instant::now(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // Every critical section is a map operation that cannot leave the
        // map half-changed, so a poisoned lock is safe to keep using.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn slot(&self, lease: i64) -> Arc<Slot> {
        let mut slots = self.lock();
        if !slots.map.contains_key(&lease) && slots.last_sweep.elapsed() > SWEEP_EVERY {
            slots.last_sweep = Instant::now();
            // Close streams nobody renewed for a while (abandoned grants);
            // a busy slot is left alone.
            slots.map.retain(|_, s| {
                let idle = s
                    .last_used
                    .lock()
                    .map(|t| t.elapsed() > IDLE)
                    .unwrap_or(true);
                !(idle && s.stream.try_lock().is_ok())
            });
        }
        slots
            .map
            .entry(lease)
            .or_insert_with(|| {
                Arc::new(Slot {
                    stream: tokio::sync::Mutex::new(None),
                    last_used: Mutex::new(Instant::now()),
                    last: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Closes the stream of a lease we are done with.
    pub(crate) fn forget(&self, lease: i64) {
        self.lock().map.remove(&lease);
    }

    /// How many streams are open (for tests and diagnostics).
    pub(crate) fn open(&self) -> usize {
        self.lock().map.len()
    }

    /// A keep-alive for `lease` sent at or after `since`: the answer of one
    /// another caller sent after `since`, or one sent now, on the lease's
    /// open stream when there is one, else on a new stream that then stays
    /// open. Returns what etcd answered and when that keep-alive was sent.
    /// The whole call, waiting included, is bounded by `timeout`.
    pub(crate) async fn keep_alive(
        &self,
        client: &Client,
        lease: i64,
        timeout: Duration,
        since: Instant,
    ) -> Result<(KeepAlive, Instant), Error> {
        if lease == 0 {
            return Ok((KeepAlive::Gone, since));
        }
        let slot = self.slot(lease);
        let shared = async {
            let mut stream = slot.stream.lock().await;
            let last = slot.last.lock().map(|l| l.clone()).unwrap_or(None);
            if let Some((sent, outcome)) = last.filter(|(sent, _)| *sent >= since) {
                return match outcome {
                    Ok(k) => Ok((k, sent)),
                    Err(detail) => Err(Error::Unavailable {
                        detail,
                        source: None,
                    }),
                };
            }
            let sent = Instant::now();
            let outcome = self
                .exchange(&slot, &mut stream, client, lease, timeout)
                .await;
            if let Ok(mut l) = slot.last.lock() {
                *l = Some((
                    sent,
                    outcome.as_ref().map(|k| *k).map_err(ToString::to_string),
                ));
            }
            outcome.map(|k| (k, sent))
        };
        match tokio::time::timeout(timeout, shared).await {
            Ok(r) => r,
            Err(_) => Err(Error::no_answer("etcd lease keep-alive", timeout)),
        }
    }

    /// One keep-alive exchange, under the slot's lock.
    async fn exchange(
        &self,
        slot: &Slot,
        stream: &mut Option<Stream>,
        client: &Client,
        lease: i64,
        timeout: Duration,
    ) -> Result<KeepAlive, Error> {
        if let Ok(mut t) = slot.last_used.lock() {
            *t = Instant::now();
        }
        // The stream is taken out of its slot for the exchange and put back
        // only once its answer was read: an exchange dropped half-way (the
        // caller's timeout, a cancelled renewal) drops the stream with it, so
        // its late answer can never be read as the answer to a later request.
        if let Some((mut keeper, mut answers)) = stream.take() {
            let exchange = async {
                keeper.keep_alive().await?;
                answers.message().await
            };
            match tokio::time::timeout(timeout, exchange).await {
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                    *stream = Some((keeper, answers));
                    return Ok(KeepAlive::Alive);
                }
                Ok(Ok(Some(_))) => {
                    self.forget(lease);
                    return Ok(KeepAlive::Gone);
                }
                // The stream broke (a severed connection, a leader change):
                // whether that keep-alive was applied is unknown, and
                // sending another on a new stream is harmless.
                Ok(Ok(None)) | Ok(Err(_)) => {}
                Err(_) => {
                    return Err(Error::no_answer("etcd lease keep-alive", timeout));
                }
            }
        }
        let mut lc = client.lease_client();
        // etcd-client sends the first keep-alive on the new stream and waits
        // for its answer.
        match timed_raw("lease keep-alive", timeout, lc.keep_alive(lease)).await? {
            Ok(opened) => {
                *stream = Some(opened);
                Ok(KeepAlive::Alive)
            }
            Err(e) if is_lease_not_found(&e) => {
                self.forget(lease);
                Ok(KeepAlive::Gone)
            }
            Err(e) => Err(convert("lease keep-alive", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared test etcd; a missing server fails the test unless
    /// `LEASE_TEST_SKIP` names etcd.
    async fn client() -> Option<Client> {
        match lease_testkit::servers::etcd() {
            Ok(etcd) => Some(
                Client::connect(etcd.endpoints.clone(), None)
                    .await
                    .expect("connect to the test etcd"),
            ),
            Err(e) if lease_conformance::skip_allowed("etcd") => {
                eprintln!("SKIPPED: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// A renewal cancelled after its keep-alive went out (the keeper bounds
    /// every renewal with a timeout) must not leave that keep-alive's answer
    /// to be read as the answer to the next one: here the lease is revoked in
    /// between, and the next keep-alive must see it gone, not the stale
    /// "alive" of the cancelled exchange.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_exchange_does_not_answer_the_next_one() {
        let Some(client) = client().await else { return };
        let mut lc = client.lease_client();
        let lease = lc.grant(30, None).await.expect("grant").id();
        let kas = KeepAlives::new();
        let limit = Duration::from_secs(5);
        assert!(matches!(
            kas.keep_alive(&client, lease, limit, Instant::now())
                .await
                .map(|(k, _)| k),
            Ok(KeepAlive::Alive)
        ));
        // Poll one exchange until it has sent its keep-alive and waits for
        // the answer, then drop it. On a loaded machine the answer can
        // arrive within that one poll (the stream runs on another worker):
        // that exchange is simply done, so try again.
        let mut cancelled = false;
        for _ in 0..20 {
            tokio::select! {
                biased;
                _ = kas.keep_alive(&client, lease, limit, Instant::now()) => {}
                _ = std::future::ready(()) => {
                    cancelled = true;
                    break;
                }
            }
        }
        assert!(cancelled, "every exchange was answered within one poll");
        lc.revoke(lease).await.expect("revoke");
        // Let the cancelled exchange's answer arrive.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let next = kas
            .keep_alive(&client, lease, limit, Instant::now())
            .await
            .map(|(k, _)| k);
        assert!(
            matches!(next, Ok(KeepAlive::Gone)),
            "a keep-alive of a revoked lease was answered as alive (the answer of the \
             cancelled exchange): {:?}",
            next.map(|k| matches!(k, KeepAlive::Alive))
        );
    }
}
