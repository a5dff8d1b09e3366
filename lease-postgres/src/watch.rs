//! Waiting for a key to change: woken by the key's notification on the
//! `LISTEN` connection (see `notify`), and at the latest when the grant seen
//! runs out on the server's clock (expiry sends nothing) or after a bound,
//! then answering from a fresh read.

use std::time::Duration;

use lease_core::{Error, LeaseKey, LeaseState};

use crate::backend::PostgresBackend;
use crate::notify::DOWN_BOUND;

/// Longest wait without a notification while the watch connection is up.
const IDLE_BOUND: Duration = Duration::from_secs(1);

impl PostgresBackend {
    pub(crate) async fn wait_for_change(
        &self,
        key: &LeaseKey,
        seen: &LeaseState,
    ) -> Result<(), Error> {
        let notifier = &self.inner.notifier;
        let mut rx = notifier.subscribe();
        let now = self.read(key).await?;
        if !now.same_state(seen) {
            return Ok(());
        }
        let mut bound = now.recheck_within(IDLE_BOUND);
        if !notifier.listening() {
            bound = bound.min(DOWN_BOUND);
        }
        let wait = async {
            loop {
                match rx.recv().await {
                    Ok(k) if k == key.as_str() || k.is_empty() => return,
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        };
        let _ = tokio::time::timeout(bound, wait).await;
        Ok(())
    }
}
