//! Waiting for a key to change ([`Conn::wait_for_change`]) with an etcd
//! watch.

use etcd_client::WatchOptions;
use lease_core::{Error, LeaseKey, LeaseState};

use crate::conn::Conn;
use crate::errors::{convert, timed};
use crate::record;

impl Conn {
    /// Returns once the key may no longer show `seen`: at once if a read
    /// already shows another state (another holder, fence or payload, or a
    /// value this crate did not write), else when a watch from that read
    /// reports any event on the key. The caller reads again to see what
    /// changed.
    pub(crate) async fn wait_for_change(
        &self,
        key: &LeaseKey,
        seen: &LeaseState,
    ) -> Result<(), Error> {
        let ekey = self.etcd_key(key);
        let (kv, rev) = self.get(&ekey).await?;
        // A new payload is a change too (a leader's proclaim); so is a
        // corrupt record, which the caller's next read reports.
        let same = record::state(key, kv.as_ref()).is_ok_and(|now| now.same_state(seen));
        if !same {
            return Ok(());
        }
        // Watching from just after the revision we read misses nothing
        // that happened in between.
        let mut wc = self.client.watch_client();
        let opts = WatchOptions::new().with_start_revision(rev.saturating_add(1));
        let mut stream = timed("watch", self.timeout, wc.watch(ekey.as_str(), Some(opts))).await?;
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
    }
}
