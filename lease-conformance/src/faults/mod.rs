//! Fault injection and fault runs: safety under failure, checked on
//! recorded histories.
//!
//! # How a backend plugs in
//!
//! A backend's conformance harness (its [`Harness`]) overrides
//! [`Harness::fault_hooks`] to return a [`FaultHooks`] — usually itself —
//! implementing only the hooks it can honour; every other fault kind is then
//! reported "not applicable" instead of passing silently:
//!
//! * a real server behind TCP: [`FaultHooks::upstream`] (the server's
//!   address) and [`FaultHooks::client_via`] (a client of the same store
//!   that connects to another address). [`run`] then starts a
//!   [`FaultProxy`] in front of the server and gives every contender a
//!   client through it: lost responses, latency, severed connections and
//!   blackholes apply.
//! * a server process the harness launched: [`FaultHooks::server`], e.g.
//!   [`Launched`] around `servers::spawn_etcd(..)`: pause/resume, and
//!   kill/restart when [`ServerControl::durable`].
//! * an in-process backend (the fake): the clock and fault hooks
//!   ([`FaultHooks::advance_clock`], [`jump_clock`](FaultHooks::jump_clock),
//!   [`lose_next_responses`](FaultHooks::lose_next_responses),
//!   [`fail_next`](FaultHooks::fail_next)); `FakeHarness` implements them.
//!
//! Then one test per fault kind:
//!
//! ```ignore
//! let report = faults::run(&harness, &FaultPlan::new(FaultKind::Sever).ttl(Duration::from_secs(2))).await?;
//! ```
//!
//! [`run`] starts `contenders` holders that acquire, renew, write to a
//! [`FencedResource`] while `may_write()` holds, release and retry on one or
//! a few keys for `duration`, while an injector applies the fault; every
//! operation is recorded in a [`History`] and [`check`]ed. Paused holders
//! work on every backend (the holder's own task freezes).

mod fake;
mod process;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{BoxFuture, Error, LeaseBackend};

pub use process::{Launched, PidProcess, ServerControl};

#[allow(unused_imports)] // for the docs
use crate::Harness;

/// The faults a backend's harness can let [`run`] inject. Every method
/// defaults to "unsupported" (`false` / `None`).
pub trait FaultHooks: Send + Sync {
    /// Moves a backend clock that does not run by itself (the fake's) forward
    /// by `by`; returns whether this backend has such a clock. [`run`] then
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

    /// The TCP address of the server, for a [`FaultProxy`] in front of it.
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
