//! What a backend provides to be tested: clients of one store, and time.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{BoxFuture, Error, LeaseBackend, LeaseKey};

/// One backend under test: how to make clients of one store and how to let
/// time pass. Implemented once per backend (in its `tests/conformance.rs`)
/// and handed to [`conformance_tests!`](crate::conformance_tests).
pub trait Harness: Send + Sync + 'static {
    /// Short name used in reports (`"etcd"`, `"nats"`, `"s3-memory"`, …).
    fn name(&self) -> &'static str;

    /// A new, independent client of the same store (its own connection where
    /// that is cheap), so properties can play several processes.
    fn client(&self) -> BoxFuture<'_, Result<Arc<dyn LeaseBackend>, Error>>;

    /// Let at least `d` of backend time pass: the fake advances its clock,
    /// real backends sleep `d` plus whatever slack the server needs to notice
    /// an expiry (timer granularity, sweep intervals).
    fn pass(&self, d: Duration) -> BoxFuture<'_, ()>;

    /// Whether the backend's time is the machine's real clock (a server
    /// process), rather than a simulated clock that only [`pass`](Self::pass)
    /// moves. Where it is, a request a property sends after a whole TTL of
    /// real time has passed (the test stalled on a loaded machine) may find
    /// an unrenewed grant expired, and a property accepts that instead of
    /// reporting a second holder. `false` (the default) judges every such
    /// grant a violation.
    fn real_clock(&self) -> bool {
        false
    }

    /// Stores at `key` a record that is not a lease record, as another program
    /// would. `None` (the default) skips the properties that need it.
    fn write_corrupt<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        let _ = key;
        None
    }

    /// Removes the record at `key` the way an operator, a cleanup script or a
    /// storage lifecycle rule would (`etcdctl del`, `aws s3 rm`,
    /// `deleteOne`, a purge of the subject), bypassing the library. `None`
    /// (the default) skips the properties that need it.
    fn delete_outside<'a>(&'a self, key: &'a LeaseKey) -> Option<BoxFuture<'a, Result<(), Error>>> {
        let _ = key;
        None
    }

    /// Makes every request take at least `latency` between being sent and
    /// being applied; returns whether this harness can. Used to check that
    /// deadlines are measured from the send instant.
    fn set_latency(&self, latency: Duration) -> bool {
        let _ = latency;
        false
    }

    /// What this backend lets a fault run ([`faults::run`](crate::faults::run))
    /// inject: a proxy in front of its server, its server process, its
    /// clock. `None` (the default): only faults that need no hooks (paused
    /// holders) apply; every other kind reports "not applicable".
    fn fault_hooks(&self) -> Option<&dyn crate::hooks::FaultHooks> {
        None
    }

    /// How many random cases the model-based property runs (each a few dozen
    /// operations); real servers may want fewer than the fake.
    fn model_cases(&self) -> u32 {
        48
    }
}
