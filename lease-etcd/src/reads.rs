//! Verifying reads of many keys in one request.
//!
//! With sessions, one keep-alive serves every key of the session renewing at
//! the same time, and the per-key reads that verify each key are the rest of
//! the cost. Reads asked for while another batch is in flight wait for it
//! and go out together in the next one: one transaction of up to
//! [`BATCH_MAX`] gets, all served from one revision. Every read is sent
//! after it was asked for, so a renewal never trusts a read older than its
//! own call.
//!
//! The batches run on a task of their own, so a caller that gives up (its
//! timeout, a cancelled renewal) takes no other caller's read with it; its
//! own read, if not yet sent, is dropped from the queue instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, KeyValue, Txn, TxnOp, TxnOpResponse};
use lease_core::Error;
use tokio::sync::oneshot;

use crate::errors::timed;

/// The most gets in one transaction: etcd refuses more than 128 operations
/// by default, and 32 records of the largest payload stay below the
/// client's 4 MiB message limit.
const BATCH_MAX: usize = 32;

/// What a batch hands back to one reader: the key-value (if any), or why
/// the batch failed and whether its outcome is unknown.
type Answer = Result<Option<KeyValue>, (String, bool)>;

struct Waiter {
    key: String,
    answer: oneshot::Sender<Answer>,
}

/// The batched reads of one client.
pub(crate) struct Reads {
    queue: Mutex<Vec<Waiter>>,
    /// Whether a task is draining the queue.
    running: AtomicBool,
    /// How many keys the batches asked etcd for.
    #[cfg(test)]
    keys_sent: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads").finish_non_exhaustive()
    }
}

impl Reads {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Reads {
            queue: Mutex::new(Vec::new()),
            running: AtomicBool::new(false),
            #[cfg(test)]
            keys_sent: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        // Pushes and drains cannot leave the queue half-changed.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key-value at `key`, read by a request sent after this call began,
    /// in a batch with the other reads asked for meanwhile.
    pub(crate) async fn get(
        self: &Arc<Self>,
        client: &Client,
        key: &str,
        timeout: Duration,
    ) -> Result<Option<KeyValue>, Error> {
        let (tx, rx) = oneshot::channel();
        self.queue().push(Waiter {
            key: key.to_string(),
            answer: tx,
        });
        if self
            .running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let (reads, client) = (self.clone(), client.clone());
            tokio::spawn(async move { reads.drain(client, timeout).await });
        }
        let gone = |detail: String| Error::Unavailable {
            detail,
            source: None,
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(kv))) => Ok(kv),
            Ok(Ok(Err((detail, true)))) => Err(gone(detail)),
            Ok(Ok(Err((detail, false)))) => Err(Error::Backend(detail.into())),
            Ok(Err(_)) => Err(gone("etcd get: the batched read was dropped".into())),
            Err(_) => Err(gone(format!("etcd get: no answer within {timeout:?}"))),
        }
    }

    /// Sends batches until the queue is empty.
    async fn drain(self: Arc<Self>, client: Client, timeout: Duration) {
        loop {
            let batch: Vec<Waiter> = {
                let mut q = self.queue();
                // A caller that gave up (its timeout, a renewal dropped at
                // the keeper's limit) no longer listens: its read is not
                // sent. During a stall such reads pile up faster than
                // batches drain them, and sending them would push every
                // live read past its deadline.
                q.retain(|w| !w.answer.is_closed());
                let n = q.len().min(BATCH_MAX);
                q.drain(..n).collect()
            };
            if batch.is_empty() {
                self.running.store(false, Ordering::Release);
                // A reader may have queued after the drain and before the
                // flag fell, and seen it still up: take its read too.
                let more = !self.queue().is_empty();
                if more
                    && self
                        .running
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    continue;
                }
                return;
            }
            #[cfg(test)]
            self.keys_sent.fetch_add(batch.len(), Ordering::Relaxed);
            let answers = read_batch(&client, &batch, timeout).await;
            for (w, a) in batch.into_iter().zip(answers) {
                // A reader that gave up no longer listens.
                let _ = w.answer.send(a);
            }
        }
    }
}

/// One request for the keys of `batch`: a plain get for one, else one
/// transaction of gets (all read at one revision).
async fn read_batch(client: &Client, batch: &[Waiter], timeout: Duration) -> Vec<Answer> {
    let failed = |e: Error| {
        let unknown = e.is_unknown_outcome();
        let detail = e.to_string();
        batch
            .iter()
            .map(|_| Err((detail.clone(), unknown)))
            .collect()
    };
    let mut kv = client.kv_client();
    if let [one] = batch {
        return match timed("get", timeout, kv.get(one.key.as_str(), None)).await {
            Ok(mut resp) => vec![Ok(resp.take_kvs().into_iter().next())],
            Err(e) => failed(e),
        };
    }
    let ops: Vec<TxnOp> = batch
        .iter()
        .map(|w| TxnOp::get(w.key.as_str(), None))
        .collect();
    match timed("batched get", timeout, kv.txn(Txn::new().and_then(ops))).await {
        Ok(resp) => {
            let mut kvs: Vec<Option<KeyValue>> = resp
                .op_responses()
                .into_iter()
                .map(|r| match r {
                    TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
                    _ => None,
                })
                .collect();
            if kvs.len() != batch.len() {
                return failed(Error::Unavailable {
                    detail: format!(
                        "etcd answered a batch of {} gets with {} results",
                        batch.len(),
                        kvs.len()
                    ),
                    source: None,
                });
            }
            kvs.drain(..).map(Ok).collect()
        }
        Err(e) => failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads whose callers gave up while etcd stalled (a renewal dropped at
    /// the keeper's limit) are not sent once it answers again: only the
    /// reads someone still waits for are.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_of_callers_that_gave_up_are_not_sent() {
        let server = lease_testkit::servers::spawn_etcd(None).expect("a private etcd");
        let client = Client::connect(server.endpoints.clone(), None)
            .await
            .expect("connect");
        let reads = Reads::new();
        let long = Duration::from_secs(10);
        reads
            .get(&client, "warm", long)
            .await
            .expect("a first read");
        let before = reads.keys_sent.load(Ordering::Relaxed);

        server.pause().expect("pause etcd");
        // One read in flight on the stalled server, waited for to the end.
        let first = {
            let (reads, client) = (reads.clone(), client.clone());
            tokio::spawn(async move { reads.get(&client, "first", long).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Callers that give up meanwhile.
        let gave_up: Vec<_> = (0..200)
            .map(|i| {
                let (reads, client) = (reads.clone(), client.clone());
                tokio::spawn(async move {
                    reads
                        .get(&client, &format!("dropped/{i}"), Duration::from_millis(50))
                        .await
                })
            })
            .collect();
        for t in gave_up {
            assert!(
                t.await.expect("task").is_err(),
                "answered by a stalled server"
            );
        }
        server.resume().expect("resume etcd");
        first.await.expect("task").expect("the read waited for");
        reads
            .get(&client, "last", long)
            .await
            .expect("a read after");
        let sent = reads.keys_sent.load(Ordering::Relaxed) - before;
        assert_eq!(
            sent, 2,
            "{sent} keys read after the stall, for 2 callers still waiting"
        );
    }
}
