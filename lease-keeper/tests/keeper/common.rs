//! A recording, hangable wrapper around the fake for the keeper's tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{
    Acquire, AcquireRequest, BoxFuture, Capabilities, Error, Grant, LeaseBackend, LeaseKey,
    LeaseLayer, LeaseState, Payload, Renewal,
};
use lease_fake::Fake;
use tokio::time::Instant;

/// The fake, plus: renew send instants per key (tokio's clock), request
/// counts, switches that make acquires, renewals, reads or releases hang forever, and a switch that
/// hides the watch capability.
pub struct Rec {
    pub fake: Fake,
    pub renews: Mutex<HashMap<LeaseKey, Vec<Instant>>>,
    pub hang: AtomicBool,
    pub hang_reads: AtomicBool,
    pub hang_releases: AtomicBool,
    pub hang_acquires: AtomicBool,
    /// Releases take this many milliseconds before they are sent on.
    pub slow_releases_ms: AtomicU64,
    /// Reads take this many milliseconds before they are answered.
    pub slow_reads_ms: AtomicU64,
    /// Granted acquires count from this many milliseconds before the call,
    /// as a grant resting on an earlier request does (an etcd session lease
    /// kept alive before the call).
    pub backdate_grants_ms: AtomicU64,
    pub no_watch: AtomicBool,
    /// The watch wakes at once, every time, changed or not
    /// ([`restless_wake`]).
    pub restless_watch: AtomicBool,
    pub acquires: AtomicU64,
    pub renew_count: AtomicU64,
    pub releases: AtomicU64,
    pub reads: AtomicU64,
    pub waits: AtomicU64,
}

impl Rec {
    pub fn new(fake: Fake) -> Arc<Self> {
        crate::observability::install();
        Arc::new(Rec {
            fake,
            renews: Mutex::default(),
            hang: AtomicBool::new(false),
            hang_reads: AtomicBool::new(false),
            hang_releases: AtomicBool::new(false),
            hang_acquires: AtomicBool::new(false),
            slow_releases_ms: AtomicU64::new(0),
            slow_reads_ms: AtomicU64::new(0),
            backdate_grants_ms: AtomicU64::new(0),
            no_watch: AtomicBool::new(false),
            restless_watch: AtomicBool::new(false),
            acquires: AtomicU64::new(0),
            renew_count: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        })
    }

    pub fn renew_times(&self, key: &LeaseKey) -> Vec<Instant> {
        self.renews
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .unwrap_or_default()
    }
}

impl LeaseLayer for Rec {
    fn inner(&self) -> &dyn LeaseBackend {
        &self.fake
    }
    fn capabilities(&self) -> Capabilities {
        let mut c = self.fake.capabilities();
        if self.no_watch.load(Ordering::SeqCst) {
            c.watch = false;
        }
        c
    }
    fn try_acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Acquire, Error>> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        if self.hang_acquires.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        let back = Duration::from_millis(self.backdate_grants_ms.load(Ordering::SeqCst));
        Box::pin(async move {
            match self.fake.try_acquire(req).await? {
                Acquire::Granted(g) if !back.is_zero() => {
                    let from = g.sent_at().checked_sub(back).unwrap_or(g.sent_at());
                    Ok(Acquire::Granted(g.with_sent_at(from)))
                }
                other => Ok(other),
            }
        })
    }
    fn renew<'a>(
        &'a self,
        grant: &'a Grant,
        payload: Option<Payload>,
    ) -> BoxFuture<'a, Result<Renewal, Error>> {
        self.renew_count.fetch_add(1, Ordering::Relaxed);
        self.renews
            .lock()
            .unwrap()
            .entry(grant.key().clone())
            .or_default()
            .push(Instant::now());
        if self.hang.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        self.fake.renew(grant, payload)
    }
    fn release<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<(), Error>> {
        self.releases.fetch_add(1, Ordering::Relaxed);
        if self.hang_releases.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        let slow = self.slow_releases_ms.load(Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(slow)).await;
            self.fake.release(grant).await
        })
    }
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, Error>> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self.hang_reads.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        let slow = self.slow_reads_ms.load(Ordering::SeqCst);
        Box::pin(async move {
            if slow > 0 {
                tokio::time::sleep(Duration::from_millis(slow)).await;
            }
            self.fake.read(key).await
        })
    }
    fn wait_for_change<'a>(
        &'a self,
        key: &'a LeaseKey,
        seen: &'a LeaseState,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        if self.no_watch.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Error::Unsupported { operation: "watch" }) });
        }
        if self.restless_watch.load(Ordering::SeqCst) {
            return restless_wake();
        }
        self.fake.wait_for_change(key, seen)
    }
}

/// A watch's wake-up that comes at once, changed or not; it yields first,
/// so that a caller spinning on it still lets other tasks run.
pub fn restless_wake<'a>() -> BoxFuture<'a, Result<(), Error>> {
    Box::pin(async {
        tokio::task::yield_now().await;
        Ok(())
    })
}

pub fn key(s: &str) -> LeaseKey {
    LeaseKey::new(s).unwrap()
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
