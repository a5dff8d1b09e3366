//! The subscription behind the watch: one extra connection per backend
//! that `SUBSCRIBE`s to the prefix's channel; acquire, release, break and
//! a renewal that stores a new payload `PUBLISH` the key there from their
//! scripts. Expiry publishes nothing, so a waiter (see `watch`) also wakes
//! when the grant it saw runs out on the server's clock. The connection is
//! pinged every second: one that stops answering (a dead network path
//! sends no close) is dropped and opened again, and while it is down the
//! waiters poll.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSub;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::client::Dialer;

/// Longest wait while the subscription is down (the waiter polls
/// instead), and the pause before connecting again.
pub(crate) const DOWN_BOUND: Duration = Duration::from_millis(100);

/// How often the subscription is pinged, and how long the answer may take.
const PING_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct Notifier {
    dialer: Arc<Dialer>,
    channel: String,
    tx: broadcast::Sender<Vec<u8>>,
    listening: Arc<AtomicBool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Notifier {
    pub(crate) fn new(dialer: Arc<Dialer>, channel: String) -> Notifier {
        let (tx, _) = broadcast::channel(1024);
        Notifier {
            dialer,
            channel,
            tx,
            listening: Arc::new(AtomicBool::new(false)),
            task: Mutex::new(None),
        }
    }

    /// A receiver of changed keys (an empty one: anything may have
    /// changed); starts the subscriber on first use.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Vec<u8>> {
        let rx = self.tx.subscribe();
        if let Ok(mut task) = self.task.lock() {
            if task.as_ref().is_none_or(JoinHandle::is_finished) {
                *task = Some(tokio::spawn(listen(
                    self.dialer.clone(),
                    self.channel.clone(),
                    self.tx.clone(),
                    self.listening.clone(),
                )));
            }
        }
        rx
    }

    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::SeqCst)
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Ok(mut task) = self.task.lock() {
            if let Some(task) = task.take() {
                task.abort();
            }
        }
    }
}

/// Keeps one subscription up, reconnecting after a short pause, and
/// forwards each published key.
async fn listen(
    dialer: Arc<Dialer>,
    channel: String,
    tx: broadcast::Sender<Vec<u8>>,
    listening: Arc<AtomicBool>,
) {
    loop {
        listen_once(&dialer, &channel, &tx, &listening).await;
        listening.store(false, Ordering::SeqCst);
        // Whatever changed while the subscription was down: wake every
        // waiter.
        let _ = tx.send(Vec::new());
        tokio::time::sleep(DOWN_BOUND).await;
    }
}

/// One subscription, until its connection fails or stops answering.
async fn listen_once(
    dialer: &Dialer,
    channel: &str,
    tx: &broadcast::Sender<Vec<u8>>,
    listening: &AtomicBool,
) {
    let open = async {
        let stream = dialer.stream().await.ok()?;
        let mut pubsub = PubSub::new(&dialer.info, stream).await.ok()?;
        pubsub.subscribe(channel).await.ok()?;
        Some(pubsub)
    };
    let Ok(Some(pubsub)) = tokio::time::timeout(dialer.connect_timeout, open).await else {
        return;
    };
    let (mut sink, mut messages) = pubsub.split();
    listening.store(true, Ordering::SeqCst);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = messages.next() => match msg {
                Some(msg) => {
                    let _ = tx.send(msg.get_payload_bytes().to_vec());
                }
                None => return,
            },
            _ = ping.tick() => {
                // Any answer will do: a subscribed connection answers
                // PING with an array, not `PONG`.
                let pong = tokio::time::timeout(PING_EVERY, sink.ping::<redis::Value>()).await;
                if !matches!(pong, Ok(Ok(_))) {
                    return;
                }
            }
        }
    }
}
