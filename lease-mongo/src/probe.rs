//! Failing a connect at once, with the driver's reason, when no host answers.
//!
//! The driver checks each host in the background and keeps an operation
//! waiting for a usable server until the server-selection timeout, then
//! reports only that the selection timed out (the reason is buried in the
//! topology description, if at all). [`Probe`] listens to those background
//! checks instead: once every host named in the URI has failed its check and
//! none has succeeded, the reason is known and waiting longer is pointless.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use std::future::Future;
use std::time::Duration;

use mongodb::event::sdam::SdamEvent;
use mongodb::event::EventHandler;
use mongodb::options::{ClientOptions, ServerAddress};
use mongodb::Client;
use tokio::sync::Notify;

use crate::errors::map;

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
