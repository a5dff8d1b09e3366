//! Waiting for a key to change ([`Conn::wait_for_change`]) with an etcd
//! watch.

use etcd_client::WatchStream;
use lease_core::{Error, LeaseKey, LeaseState};

use crate::conn::Conn;
use crate::errors::{convert, timed};
use crate::record;

impl Conn {
    /// Returns once the key may no longer show `seen`: at once if a read
    /// already shows another state (another holder, fence or payload, or a
    /// value this crate did not write), else when a watch reports an event
    /// on the key after that read. The caller reads again to see what
    /// changed.
    ///
    /// The watch is created, and its creation confirmed, before the read.
    /// A watch from a past revision (the read's, say) is caught up by
    /// etcd's background sync, which runs every 100 ms: a change landing
    /// between the read and the watch's creation was seen up to 100 ms
    /// late. A watch from the current revision is served as its events
    /// are written, and the read after it covers everything before.
    pub(crate) async fn wait_for_change(
        &self,
        key: &LeaseKey,
        seen: &LeaseState,
    ) -> Result<(), Error> {
        let ekey = self.etcd_key(key);
        let mut wc = self.client.watch_client();
        let mut stream = timed("watch", self.timeout, wc.watch(ekey.as_str(), None)).await?;
        if !timed("watch", self.timeout, created(&mut stream)).await? {
            return Ok(());
        }
        let (kv, rev) = self.get(&ekey).await?;
        // A new payload is a change too (a leader's proclaim); so is a
        // corrupt record, which the caller's next read reports.
        let same = record::state(key, kv.as_ref()).is_ok_and(|now| now.same_state(seen));
        if !same {
            return Ok(());
        }
        loop {
            match stream.message().await {
                // A cancelled watch is a possible change: the caller re-reads.
                Ok(Some(resp)) if resp.canceled() => return Ok(()),
                // An event at or below the read's revision is in what the
                // read showed.
                Ok(Some(resp))
                    if resp
                        .events()
                        .iter()
                        .any(|e| e.kv().is_none_or(|kv| kv.mod_revision() > rev)) =>
                {
                    return Ok(())
                }
                Ok(Some(_)) => {}
                Ok(None) => return Ok(()),
                Err(e) => return Err(convert("watch", e)),
            }
        }
    }
}

/// Waits for the server's answer to the watch's creation: true once the
/// watch is registered (every later write is sent on it), false for any
/// other answer, or none (the caller treats that as a possible change).
async fn created(stream: &mut WatchStream) -> Result<bool, etcd_client::Error> {
    Ok(stream
        .message()
        .await?
        .is_some_and(|resp| resp.created() && !resp.canceled() && resp.events().is_empty()))
}
