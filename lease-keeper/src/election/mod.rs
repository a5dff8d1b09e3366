//! Leader election on one key, for every backend: [`Election`] and its
//! [`Campaign`]; the leader's side in `leadership` and `work`, everyone's
//! view of the leader in `leader` and `observe`.

mod leader;
mod leadership;
mod observe;
mod work;

use std::fmt;
use std::future::IntoFuture;
use std::time::Duration;

use lease_core::{Error, LeaseKey, Payload};

use crate::acquire::AcquireFuture;
use crate::error::AcquireError;
use crate::keeper::Keeper;

pub use leader::Leader;
pub use leadership::{Leadership, ProclaimError, Resigner};
pub use observe::Observer;

/// The shortest default poll interval of observers on backends without a watch.
const MIN_POLL: Duration = Duration::from_millis(50);
/// The longest default poll interval.
const MAX_POLL: Duration = Duration::from_secs(1);

/// A leader election for one key; every campaign is a term of its keeper's
/// holder.
///
/// An election is a lease used as a leadership: the leader holds the key, and
/// advertises a value (the lease's payload: an address, a name) for everyone
/// else to read.
///
/// * [`Election::campaign`] waits to become leader — a waiting
///   [`Keeper::acquire`] carrying the value, woken by the backend's watch
///   where it has one — and returns a [`Leadership`]: the kept lease, with its
///   fence, its write deadline and its loss.
/// * [`Leadership::proclaim`] replaces the advertised value now;
///   [`Leadership::resign`] hands over at once (the next waiting candidate is
///   woken by the release, not by the expiry); dropping a `Leadership`
///   resigns in the background.
/// * [`Leadership::run`] runs work only while this process leads: it drops
///   the work no later than the write deadline, even if the backend hangs,
///   and says why it ended ([`WorkEnded`](crate::WorkEnded)). A [`Resigner`] resigns from
///   another task while `run` is under way ([`WorkEnded::Resigned`](crate::WorkEnded::Resigned)).
/// * [`Election::leader`] reads who leads now; [`Election::observe`] follows
///   every change, including "no leader" after a resign or an expiry.
///
/// Graceful handover: let the work return, then [`resign`](Leadership::resign);
/// the next candidate's campaign is woken by the release (one watch round
/// trip on backends with a watch, one poll otherwise).
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use lease_core::{LeaseKey, Payload};
/// use lease_keeper::{Keeper, WorkEnded};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let keeper = Keeper::new(Arc::new(lease_fake::Fake::new())).with_ttl(Duration::from_secs(10));
/// let election = keeper.election(&LeaseKey::new("svc/scheduler")?);
/// let leadership = election.campaign(Payload::new("10.0.0.7:8080")?).await?;
/// let leader = election.leader().await?.expect("we lead");
/// assert_eq!(leader.fence, leadership.fence());
/// match leadership.run(async { /* work, stamped with the fence */ 42 }).await {
///     WorkEnded::Finished(n) => assert_eq!(n, 42),
///     other => println!("work cut short: {other:?}"),
/// }
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(())
/// # }
/// ```
///
/// Cheap to clone; clones are the same election. Every campaign is a term
/// of its own (see [`Keeper`]'s *Terms*): two campaigns on one keeper never
/// both lead, a resign or a dropped leadership never ends a later term, and
/// each new term's fence is above the last.
///
/// Unless set, campaigns ask for the keeper's TTL, and observers re-read the
/// key at least every tenth of it, between 50 ms and 1 s.
#[derive(Clone)]
pub struct Election {
    keeper: Keeper,
    key: LeaseKey,
    ttl: Option<Duration>,
    poll: Option<Duration>,
}

impl Keeper {
    /// A leader election for `key` among this backend's holders, campaigning
    /// each campaign a term of this keeper's holder: [`Election::new`] with a
    /// clone of this keeper.
    pub fn election(&self, key: &LeaseKey) -> Election {
        Election::new(self.clone(), key.clone())
    }
}

impl Election {
    /// An election for `key` among the holders of `keeper`'s backend,
    /// each campaign a term of `keeper`'s holder. [`Keeper::election`] does the same.
    pub fn new(keeper: Keeper, key: LeaseKey) -> Election {
        Election {
            keeper,
            key,
            ttl: None,
            poll: None,
        }
    }

    /// The TTL campaigns ask for (default: the keeper's
    /// [`ttl()`](Keeper::ttl)). A leader that stops renewing — crashed,
    /// partitioned — is replaced at most this long after its last renewal.
    pub fn with_ttl(mut self, ttl: Duration) -> Election {
        self.ttl = Some(ttl);
        self
    }

    /// How often observers re-read the key: on backends without a watch,
    /// every interval; on backends with one, at least every interval as well,
    /// since a watch wakes on a new holder, a release or an expiry but not
    /// necessarily on a new value. At least 1 ms; default a tenth of the TTL,
    /// between 50 ms and 1 s.
    pub fn with_poll_interval(mut self, every: Duration) -> Election {
        self.poll = Some(every.max(Duration::from_millis(1)));
        self
    }

    /// The key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// The keeper campaigns run on.
    pub fn keeper(&self) -> &Keeper {
        &self.keeper
    }

    /// The TTL campaigns ask for.
    pub fn ttl(&self) -> Duration {
        self.ttl.unwrap_or_else(|| self.keeper.ttl())
    }

    /// How often observers re-read the key.
    pub fn poll_interval(&self) -> Duration {
        self.poll
            .unwrap_or_else(|| (self.ttl() / 10).clamp(MIN_POLL, MAX_POLL))
    }

    /// Campaigns to lead, advertising `value`: waits until this keeper's
    /// holder holds the key (for ever, unless [`Campaign::wait`] bounds it),
    /// then keeps it. `.await` the returned [`Campaign`].
    ///
    /// Where the backend can watch, the wait is woken by the leader's
    /// resign or expiry; otherwise it polls with the keeper's [`Backoff`](crate::Backoff).
    ///
    /// # Errors
    /// As [`Keeper::acquire`]: [`AcquireError::Timeout`] when the wait ended
    /// with another leader; [`AcquireError::Backend`] for errors retrying
    /// cannot fix (transport errors are retried until the wait ends).
    ///
    /// # Cancel safety
    ///
    /// As [`Keeper::acquire`]: a campaign dropped while an acquire attempt
    /// is in flight is settled by the keeper in the background (a grant the
    /// attempt left is taken back and released). A campaign dropped while it
    /// only waits leaves nothing behind.
    pub fn campaign(&self, value: Payload) -> Campaign {
        Campaign {
            election: self.clone(),
            value,
            wait: Duration::MAX,
        }
    }

    /// The current leader as the backend reports it now: `None` when nobody
    /// leads (the key is free, released or expired).
    ///
    /// # Errors
    /// The backend's read errors, e.g. [`Error::Unavailable`] or
    /// [`Error::CorruptRecord`].
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        let state = self.keeper.backend().read(&self.key).await?;
        Ok(Leader::of(&state))
    }

    /// Follows the leader from now on: a background task reads the key,
    /// publishes every change it sees, then waits for the next one (by watch
    /// where the backend has one, and at least every
    /// [`poll_interval()`](Election::poll_interval)). Dropping the
    /// [`Observer`] stops it. Needs a tokio runtime; outside one the
    /// observer never sees anything.
    pub fn observe(&self) -> Observer {
        Observer::start(self)
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("key", &self.key)
            .field("holder", self.keeper.holder())
            .field("ttl", &self.ttl())
            .field("poll_interval", &self.poll_interval())
            .finish()
    }
}

/// A campaign, set up by [`Election::campaign`]; `.await` it to run it.
///
/// Unless [`wait`](Campaign::wait) bounds it, it waits for ever. It holds a
/// clone of the election, so its future is `'static` and can be spawned.
#[must_use = "a campaign does nothing until it is awaited"]
pub struct Campaign {
    election: Election,
    value: Payload,
    wait: Duration,
}

impl Campaign {
    /// How long to wait while another candidate leads; then the campaign
    /// fails with [`AcquireError::Timeout`]. `Duration::MAX` (the default)
    /// waits for ever.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

impl fmt::Debug for Campaign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Campaign")
            .field("key", &self.election.key)
            .field("holder", self.election.keeper.holder())
            .field("value", &self.value)
            .field("wait", &self.wait)
            .finish()
    }
}

impl IntoFuture for Campaign {
    type Output = Result<Leadership, AcquireError>;
    type IntoFuture = AcquireFuture<'static, Leadership>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let election = self.election;
            let lease = election
                .keeper
                .acquire(&election.key)
                .ttl(election.ttl())
                .wait(self.wait)
                .payload(self.value)
                .await?;
            tracing::info!(key = %election.key, holder = %lease.holder(), fence = %lease.fence(), "became leader");
            Ok(Leadership::new(lease, election.keeper.backend().clone()))
        })
    }
}
