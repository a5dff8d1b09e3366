//! Connecting: the connection (opened at once, so a wrong address fails
//! here with its cause), the server's persistence settings, the watch's
//! subscription (opened on first wait); and what the backend was built
//! with.

use std::sync::Arc;

use lease_core::{AcquireRequest, Error, HolderId, LeaseKey};

use crate::backend::{Inner, RedisBackend};
use crate::client::{Client, Dialer};
use crate::config::{Address, RedisConfig};
use crate::notify::Notifier;
use crate::persistence::Persistence;
use crate::scripts::Scripts;
use crate::tls::tls_for;
use crate::unsettled::Unsettled;

impl RedisBackend {
    /// Connects to `url` (`redis://[user[:password]@]host[:port][/db]`, or
    /// `rediss://…` for TLS; read a `lease` URL with its `?prefix=` by
    /// [`RedisConfig::from_url`]) and reads the server's persistence and
    /// eviction settings ([`persistence`](Self::persistence)). Fails at once, with
    /// the cause, when no connection can be made within the connect timeout
    /// (refused, unreachable, a certificate the CAs do not vouch for:
    /// [`Error::Unavailable`]) or the server refuses the credentials
    /// ([`Error::Backend`]).
    ///
    /// Nothing is created on the server: each lease's keys are written by
    /// its first acquire.
    pub async fn connect(url: &str, config: RedisConfig) -> Result<Self, Error> {
        config.check()?;
        let address = Address::from_url(url)?;
        let tls = tls_for(&config, &address)?;
        let dialer = Arc::new(Dialer::new(address, tls, &config));
        let client = Client::new(dialer.clone(), config.request_timeout);
        let persistence = Persistence::read(&client).await?;
        let channel = config.channel();
        let notifier = Notifier::new(dialer, channel.clone());
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                client,
                scripts: Scripts::new(),
                config,
                channel,
                notifier,
                persistence,
                unsettled: Unsettled::default(),
            }),
        })
    }

    /// An acquire request for `key` with the configured default TTL.
    pub fn request(&self, key: LeaseKey, holder: HolderId) -> AcquireRequest {
        AcquireRequest::new(key, holder).ttl(self.inner.config.default_ttl)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.config.prefix
    }

    /// The server's persistence and eviction settings as read at connect:
    /// what a restart, or a full memory, does to acknowledged grants (see
    /// the README, *Durability*).
    pub fn persistence(&self) -> &Persistence {
        &self.inner.persistence
    }
}
