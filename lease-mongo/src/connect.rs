//! Opening the lease collection: connecting (failing at once, with the
//! driver's reason, when no host answers), checking the collection's
//! indexes, and building [`MongoBackend`]; its accessors and
//! [`shutdown`](MongoBackend::shutdown).
//!
//! # Failing a connect at once
//!
//! The driver checks each host in the background and keeps an operation
//! waiting for a usable server until the server-selection timeout, then
//! reports only that the selection timed out (the reason is buried in the
//! topology description, if at all). [`Probe`] listens to those background
//! checks instead: once every host named in the URI has failed its check and
//! none has succeeded, the reason is known and waiting longer is pointless.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{AcquireRequest, Error, HolderId, LeaseKey};
use mongodb::bson::{doc, Document};
use mongodb::event::sdam::SdamEvent;
use mongodb::event::EventHandler;
use mongodb::options::{
    Acknowledgment, ClientOptions, CollectionOptions, ReadConcern, ReadPreference,
    SelectionCriteria, ServerAddress, WriteConcern,
};
use mongodb::{Client, Collection, IndexModel};
use tokio::sync::Notify;

use crate::backend::{MongoBackend, CAPABILITIES};
use crate::config::{check_request_timeout, MongoConfig};
use crate::errors::{bounded, map};
use crate::record::field;

/// Name of the index this crate creates on the lease collection.
const EXPIRY_INDEX: &str = "lease_expires_ms";

impl MongoBackend {
    /// A backend on `client`, after checking the collection: its indexes are
    /// created if missing, and a TTL index on it is refused.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`] for a default TTL over 1 day;
    /// [`Error::InvalidTiming`] for a zero or over-an-hour request timeout;
    /// [`Error::Backend`] when the collection has a TTL index (it would delete
    /// lease documents and with them the fence counter, letting fences go
    /// backwards); [`Error::Unavailable`] when the server cannot be reached
    /// within the request timeout.
    pub async fn new(client: Client, config: MongoConfig) -> Result<Self, Error> {
        CAPABILITIES.ttl.effective(config.default_ttl)?;
        check_request_timeout(config.request_timeout)?;
        let coll = client
            .database(&config.database)
            .collection_with_options::<Document>(
                &config.collection,
                durable(config.request_timeout),
            );
        bounded(
            "checking the lease collection's indexes",
            config.request_timeout,
            ensure_indexes(&coll),
        )
        .await?;
        Ok(MongoBackend { coll, config })
    }

    /// Connects to `uri` (a `mongodb://` connection string) and calls [`new`](Self::new).
    ///
    /// Server selection waits at most the request timeout (unless the URI
    /// sets `serverSelectionTimeoutMS`), and when every host named in the URI
    /// has refused or failed its first check, this fails at once with the
    /// driver's reason (a refused connection, an unknown host, a TLS
    /// failure) instead of waiting for the timeout.
    ///
    /// # Errors
    /// As [`new`](Self::new); a malformed URI is [`Error::Backend`].
    pub async fn connect(uri: &str, config: MongoConfig) -> Result<Self, Error> {
        check_request_timeout(config.request_timeout)?;
        let timeout = config.request_timeout;
        connect(uri, timeout, |client| Self::new(client, config)).await
    }

    /// As [`connect`](Self::connect), with options already parsed (by
    /// [`ClientOptions::parse`](mongodb::options::ClientOptions::parse), say,
    /// to read the URI's database first).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub async fn connect_with_options(
        options: mongodb::options::ClientOptions,
        config: MongoConfig,
    ) -> Result<Self, Error> {
        check_request_timeout(config.request_timeout)?;
        let timeout = config.request_timeout;
        connect_with(options, timeout, |client| Self::new(client, config)).await
    }

    /// Ends the driver's server sessions and closes its connections, while the
    /// async runtime still runs.
    ///
    /// Call it before the tokio runtime that used this backend shuts down
    /// (the end of `main`, of a `#[tokio::test]`). Without it, the driver's
    /// own clean-up of a dropped client is a task spawned at drop time; when
    /// the runtime is tearing down its tasks at that moment, that task can
    /// panic inside the driver (a harmless but alarming backtrace on stderr).
    ///
    /// It shuts down the [`Client`] this backend was built on, and with it
    /// every clone of that client: use it when the client is no longer
    /// needed. Held leases are not released; they expire by their TTL.
    /// Operations after it fail with [`Error::Unavailable`].
    pub async fn shutdown(&self) {
        self.coll.client().clone().shutdown().immediate(true).await;
    }

    /// An acquire request for `key` by `holder` with the configured default TTL.
    pub fn request(&self, key: LeaseKey, holder: HolderId) -> AcquireRequest {
        AcquireRequest::new(key, holder).ttl(self.config.default_ttl)
    }

    /// The configuration in force.
    pub fn config(&self) -> &MongoConfig {
        &self.config
    }

    /// The lease collection (for inspection and administration; writing to it
    /// by hand can break the contract).
    pub fn collection(&self) -> &Collection<Document> {
        &self.coll
    }
}

/// How every lease collection is used, whatever the connection string says:
///
/// * writes wait for a majority **and the journal**: an acknowledged grant
///   (and its fence) must survive a crash and a failover, or a restarted
///   server could hand the same fence out again. With `w: 1` and no journal
///   wait, MongoDB acknowledges before the journal is flushed (and the test
///   server was seen to lose acknowledged fences on `kill -9`);
/// * reads see only majority-committed data, so a read never reports a
///   grant that a failover may roll back;
/// * everything goes to the primary, never to a lagging secondary.
///
/// `timeout` is the server's `wtimeout`: a write that a majority does not
/// acknowledge in time ends with a write concern error (an unknown outcome).
pub(crate) fn durable(timeout: Duration) -> CollectionOptions {
    CollectionOptions::builder()
        .write_concern(
            WriteConcern::builder()
                .w(Acknowledgment::Majority)
                .journal(true)
                .w_timeout(timeout)
                .build(),
        )
        .read_concern(ReadConcern::majority())
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        .build()
}

/// Creates the collection's index if missing, and refuses a TTL index.
async fn ensure_indexes(coll: &Collection<Document>) -> Result<(), Error> {
    let mut have_expiry = false;
    match coll.list_indexes().await {
        Ok(mut cursor) => {
            while cursor
                .advance()
                .await
                .map_err(|e| map("listing indexes", e))?
            {
                let index: IndexModel = cursor
                    .deserialize_current()
                    .map_err(|e| map("listing indexes", e))?;
                let options = index.options.unwrap_or_default();
                if options.expire_after.is_some() {
                    return Err(Error::Backend(
                        format!(
                            "lease-mongo: collection {} has a TTL index ({}); it would delete lease documents and with them the fence counter, so fences could go backwards. Drop it.",
                            coll.name(),
                            options.name.unwrap_or_default()
                        )
                        .into(),
                    ));
                }
                have_expiry |= options.name.as_deref() == Some(EXPIRY_INDEX);
            }
        }
        // NamespaceNotFound: the collection does not exist yet.
        Err(e) if matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == 26) =>
            {}
        Err(e) => return Err(map("listing indexes", e)),
    }
    if !have_expiry {
        // For operators' queries ("which leases expire next"); never a TTL index.
        let options = mongodb::options::IndexOptions::builder()
            .name(EXPIRY_INDEX.to_string())
            .build();
        let model = IndexModel::builder()
            .keys(doc! { field::EXPIRES_MS: 1 })
            .options(options)
            .build();
        coll.create_index(model)
            .await
            .map_err(|e| map("creating the expiry index", e))?;
    }
    Ok(())
}

/// Connects to `uri` and runs `setup` (the first requests) on the client,
/// failing at once — with the driver's reasons — when every host named in
/// the URI failed its first check. Server selection waits at most `timeout`
/// unless the URI sets `serverSelectionTimeoutMS`.
pub(crate) async fn connect<T, E, F, Fut>(uri: &str, timeout: Duration, setup: F) -> Result<T, E>
where
    E: From<lease_core::Error>,
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let options = ClientOptions::parse(uri)
        .await
        .map_err(|e| E::from(map("connect", e)))?;
    connect_with(options, timeout, setup).await
}

/// As [`connect`], with options the caller already parsed.
pub(crate) async fn connect_with<T, E, F, Fut>(
    mut options: ClientOptions,
    timeout: Duration,
    setup: F,
) -> Result<T, E>
where
    E: From<lease_core::Error>,
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    if options.server_selection_timeout.is_none() {
        options.server_selection_timeout = Some(timeout);
    }
    let probe = Probe::new(&options.hosts);
    options.sdam_event_handler = Some(probe.handler());
    let client = Client::with_options(options).map_err(|e| E::from(map("connect", e)))?;
    tokio::select! {
        r = setup(client.clone()) => r,
        cause = probe.all_failed() => {
            client.shutdown().immediate(true).await;
            Err(E::from(lease_core::Error::unavailable(
                "lease-mongo: connect: no server named in the URI can be reached",
                cause,
            )))
        }
    }
}

/// Watches the driver's server checks during a connect.
pub(crate) struct Probe {
    state: Arc<State>,
}

struct State {
    seeds: HashSet<String>,
    seen: Mutex<Seen>,
    changed: Notify,
}

#[derive(Default)]
struct Seen {
    /// The last failure of each host, by address.
    failed: HashMap<String, String>,
    /// Whether any check succeeded (then the driver's own waiting applies).
    succeeded: bool,
}

impl Probe {
    /// A probe for the hosts named in the connection string.
    pub(crate) fn new(hosts: &[ServerAddress]) -> Probe {
        Probe {
            state: Arc::new(State {
                seeds: hosts.iter().map(ToString::to_string).collect(),
                seen: Mutex::default(),
                changed: Notify::new(),
            }),
        }
    }

    /// The handler to install in the client's options.
    pub(crate) fn handler(&self) -> EventHandler<SdamEvent> {
        let state = self.state.clone();
        EventHandler::callback(move |event: SdamEvent| {
            let mut seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
            match event {
                SdamEvent::ServerHeartbeatFailed(e) => {
                    seen.failed
                        .insert(e.server_address.to_string(), e.failure.to_string());
                }
                SdamEvent::ServerHeartbeatSucceeded(_) => seen.succeeded = true,
                _ => return,
            }
            drop(seen);
            state.changed.notify_one();
        })
    }

    /// Resolves, with the reasons, once every named host failed its check
    /// and none succeeded; never resolves otherwise.
    pub(crate) async fn all_failed(&self) -> String {
        loop {
            if let Some(reason) = self.state.reason() {
                return reason;
            }
            self.state.changed.notified().await;
        }
    }
}

impl State {
    fn reason(&self) -> Option<String> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.succeeded
            || self.seeds.is_empty()
            || !self.seeds.iter().all(|s| seen.failed.contains_key(s))
        {
            return None;
        }
        let mut reasons: Vec<String> = self
            .seeds
            .iter()
            .filter_map(|s| seen.failed.get(s).map(|why| format!("{s}: {why}")))
            .collect();
        reasons.sort();
        Some(reasons.join("; "))
    }
}
