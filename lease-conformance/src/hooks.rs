//! What a backend's harness lets a fault run inject: the hooks a
//! [`Harness`](crate::Harness) returns and [`faults::run`](crate::faults::run)
//! drives.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{BoxFuture, Error, LeaseBackend};

use crate::process::ServerControl;

/// The faults a backend's harness can let [`run`](crate::faults::run) inject. Every method
/// defaults to "unsupported" (`false` / `None`).
pub trait FaultHooks: Send + Sync {
    /// Moves a backend clock that does not run by itself (the fake's) forward
    /// by `by`; returns whether this backend has such a clock. [`run`](crate::faults::run) then
    /// advances it with real time while the run lasts.
    fn advance_clock(&self, by: Duration) -> bool {
        let _ = by;
        false
    }

    /// Makes the backend's clock jump by `by`, forward or backward; returns
    /// whether it can.
    fn jump_clock(&self, by: Duration, forward: bool) -> bool {
        let _ = (by, forward);
        false
    }

    /// Whether the backend may now and then read the true time instead of
    /// the clock [`jump_clock`](FaultHooks::jump_clock) stepped (a threaded
    /// server under libfaketime 0.9.10 does; see
    /// [`server_clock_steps_kind`](crate::faults::server_clock_steps_kind)).
    /// The small clock steps then keep its clock within the deadline slack
    /// of the true time.
    fn clock_reads_true_time(&self) -> bool {
        false
    }

    /// The next `n` operations are applied but their answers lost (the
    /// caller sees an unknown outcome); returns whether it can.
    fn lose_next_responses(&self, n: u32) -> bool {
        let _ = n;
        false
    }

    /// The next `n` operations fail before being applied; returns whether it can.
    fn fail_next(&self, n: u32) -> bool {
        let _ = n;
        false
    }

    /// The TCP address of the server, for a [`FaultProxy`](crate::faults::FaultProxy) in front of it.
    fn upstream(&self) -> Option<SocketAddr> {
        None
    }

    /// A new client of the same store that connects to `addr` (a proxy)
    /// instead of the server itself.
    fn client_via(
        &self,
        addr: SocketAddr,
    ) -> Option<BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>>> {
        let _ = addr;
        None
    }

    /// The server process, for pause/resume and kill/restart.
    fn server(&self) -> Option<&dyn ServerControl> {
        None
    }
}
