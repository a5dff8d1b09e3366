//! Waiting for a key to change: a JetStream KV watch on the key, which
//! delivers every write, release and the server's expiry marker.

use async_nats::jetstream::kv::Operation;
use futures_util::StreamExt;
use lease_core::{Error, LeaseKey, LeaseState};

use crate::backend::NatsBackend;
use crate::cache::Seen;
use crate::record::{self, holding};

impl NatsBackend {
    pub(crate) async fn wait_for_change(
        &self,
        key: &LeaseKey,
        seen: &LeaseState,
    ) -> Result<(), Error> {
        // Watch first, then look: a change between the look and the wait is
        // still delivered by the watch.
        self.count();
        let mut watch = self
            .inner
            .kv
            .watch(key.as_str())
            .await
            .map_err(|e| Error::unavailable(format!("watching lease key {key} failed"), e))?;
        match self.read(key).await {
            Ok(now) if now.same_state(seen) => {}
            Ok(_) | Err(Error::CorruptRecord { .. }) => return Ok(()),
            Err(e) => return Err(e),
        }
        while let Some(entry) = watch.next().await {
            let entry = entry
                .map_err(|e| Error::unavailable(format!("watch of lease key {key} failed"), e))?;
            self.saw_seq(entry.revision);
            let now = match entry.operation {
                Operation::Delete | Operation::Purge => {
                    self.inner.cache.saw(key, Seen::Free(entry.revision));
                    LeaseState::Free
                }
                Operation::Put => match record::decode(key, entry.revision, &entry.value) {
                    Ok(r) => {
                        self.inner.cache.saw(key, Seen::Held);
                        LeaseState::Held(holding(r))
                    }
                    Err(_) => return Ok(()),
                },
            };
            // Every renewal is a put: wake for a new holder, a release or
            // a new payload, not for a renewal that only extended the grant.
            if !now.same_state(seen) {
                return Ok(());
            }
        }
        // The watch ended (connection closed): wake the caller to re-read.
        Ok(())
    }
}
