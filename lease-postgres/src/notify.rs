//! `LISTEN`/`NOTIFY`, behind the watch: one extra connection per backend
//! that `LISTEN`s on the table's channel; acquire (a new grant or a
//! takeover), release, break and a renewal that stores a new payload
//! `NOTIFY` it with the key, in the same statement (delivered at commit); a
//! renewal that keeps the payload does not, so waiting acquirers are not
//! woken by every renewal. Expiry sends nothing, so a waiter (see `watch`)
//! also wakes when the grant it saw runs out on the server's clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;

use crate::tls::Tls;

/// Longest wait while the watch connection is down (the waiter polls
/// instead), and the pause before connecting again.
pub(crate) const DOWN_BOUND: Duration = Duration::from_millis(100);

pub(crate) struct Notifier {
    config: tokio_postgres::Config,
    tls: Tls,
    channel: String,
    tx: broadcast::Sender<String>,
    listening: Arc<AtomicBool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Notifier {
    pub(crate) fn new(config: tokio_postgres::Config, tls: Tls, channel: String) -> Notifier {
        let (tx, _) = broadcast::channel(1024);
        Notifier {
            config,
            tls,
            channel,
            tx,
            listening: Arc::new(AtomicBool::new(false)),
            task: Mutex::new(None),
        }
    }

    /// A receiver of changed keys; starts the listener on first use.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<String> {
        let rx = self.tx.subscribe();
        if let Ok(mut task) = self.task.lock() {
            if task.as_ref().is_none_or(JoinHandle::is_finished) {
                *task = Some(tokio::spawn(listen(
                    self.config.clone(),
                    self.tls.clone(),
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

/// Keeps one `LISTEN` connection up, reconnecting after a short pause, and
/// forwards each notified key.
async fn listen(
    config: tokio_postgres::Config,
    tls: Tls,
    channel: String,
    tx: broadcast::Sender<String>,
    listening: Arc<AtomicBool>,
) {
    loop {
        let _ = match &tls {
            Tls::Plain => {
                listen_once(&config, tokio_postgres::NoTls, &channel, &tx, &listening).await
            }
            #[cfg(feature = "tls")]
            Tls::Rustls(t) => listen_once(&config, t.clone(), &channel, &tx, &listening).await,
        };
        listening.store(false, Ordering::SeqCst);
        // Whatever changed while the connection was down: wake every waiter.
        let _ = tx.send(String::new());
        tokio::time::sleep(DOWN_BOUND).await;
    }
}

async fn listen_once<T>(
    config: &tokio_postgres::Config,
    tls: T,
    channel: &str,
    tx: &broadcast::Sender<String>,
    listening: &AtomicBool,
) -> Result<(), tokio_postgres::Error>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut conn) = config.connect(tls).await?;
    let (msg_tx, mut msg_rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if msg_tx.send(n.payload().to_string()).is_err() {
                        break;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
    });
    let result = async {
        client
            .batch_execute(&format!("LISTEN \"{channel}\""))
            .await?;
        listening.store(true, Ordering::SeqCst);
        while let Some(key) = msg_rx.recv().await {
            let _ = tx.send(key);
        }
        Ok(())
    }
    .await;
    driver.abort();
    result
}
