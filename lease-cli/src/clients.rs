//! The connections opened, to shut down while the runtime still runs.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use lease::Connection;

/// Connections to shut down before the runtime ends.
///
/// The MongoDB driver cleans up a dropped client in a task it spawns at drop
/// time; when that happens as the runtime tears down, the task can panic
/// inside the driver and print a backtrace on the command's stderr. Shutting
/// the client down first leaves nothing to clean up.
#[derive(Debug, Default)]
pub struct Clients {
    opened: Mutex<Vec<Connection>>,
}

impl Clients {
    /// Notes a connection to shut down at the end.
    pub fn note(&self, connection: Connection) {
        self.opened
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(connection);
    }

    /// Shuts every noted connection down, giving up after `limit` (a frozen
    /// server must not hold up the exit).
    pub async fn shutdown(&self, limit: Duration) {
        let opened =
            std::mem::take(&mut *self.opened.lock().unwrap_or_else(PoisonError::into_inner));
        if opened.is_empty() {
            return;
        }
        let all = async {
            for c in &opened {
                c.shutdown().await;
            }
        };
        if tokio::time::timeout(limit, all).await.is_err() {
            tracing::debug!(?limit, "client shutdown did not finish");
        }
    }
}
