//! One multiplexed connection to the server, opened by this crate (TCP,
//! TLS, then redis-rs' handshake: `AUTH` and `SELECT`), every request
//! within the request timeout, a connection that failed or did not answer
//! in time closed and opened again by the next request; and the scripts
//! run by `EVALSHA`, with `EVAL` when the server lost its script cache.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_core::Error;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, RedisConnectionInfo, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::{Address, RedisConfig};
use crate::errors;
use crate::scripts::Script;
use crate::tls::Tls;

/// A byte stream to the server: TCP or TLS over TCP.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// How to reach the server; shared by the request connection and the
/// watch's subscription.
#[derive(Clone)]
pub(crate) struct Dialer {
    pub(crate) address: Address,
    pub(crate) info: RedisConnectionInfo,
    tls: Tls,
    pub(crate) connect_timeout: Duration,
}

impl Dialer {
    pub(crate) fn new(address: Address, tls: Tls, config: &RedisConfig) -> Dialer {
        let mut info = RedisConnectionInfo::default()
            .set_db(address.db)
            .set_lib_name("lease-redis", env!("CARGO_PKG_VERSION"));
        if let Some(user) = &address.username {
            info = info.set_username(user);
        }
        if let Some(pw) = &address.password {
            info = info.set_password(pw);
        }
        Dialer {
            address,
            info,
            tls,
            connect_timeout: config.connect_timeout,
        }
    }

    /// Where the server is, for errors.
    fn target(&self) -> String {
        format!(
            "lease-redis: connect to {}:{}",
            self.address.host, self.address.port
        )
    }

    /// A connected stream (TCP, then TLS where asked); the cause of a
    /// failure (refused, unreachable, a certificate the CAs do not vouch
    /// for) is the error's source. Unbounded: callers bound it, with what
    /// follows it on the connection, by the connect timeout.
    pub(crate) async fn stream(&self) -> Result<Box<dyn Io>, Error> {
        let tcp = TcpStream::connect((self.address.host.as_str(), self.address.port))
            .await
            .map_err(|e| Error::unavailable(self.target(), e))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Tls::Plain => Ok(Box::new(tcp)),
            #[cfg(feature = "tls")]
            Tls::Rustls { connector, name } => connector
                .connect(name.clone(), tcp)
                .await
                .map(|s| Box::new(s) as Box<dyn Io>)
                .map_err(|e| Error::unavailable(format!("{}: TLS", self.target()), e)),
        }
    }

    /// A multiplexed connection with its handshake done (`AUTH`, `SELECT`),
    /// its driver spawned: all of it within the connect timeout.
    async fn connection(&self) -> Result<MultiplexedConnection, Error> {
        let open = async {
            let stream = self.stream().await?;
            // The request timeout is kept by `Client`, around the whole
            // operation: none here.
            let config = AsyncConnectionConfig::new()
                .set_response_timeout(None)
                .set_connection_timeout(None);
            MultiplexedConnection::new_with_config(&self.info, stream, config)
                .await
                .map_err(|e| errors::map("connect", e))
        };
        match tokio::time::timeout(self.connect_timeout, open).await {
            Ok(Ok((conn, driver))) => {
                tokio::spawn(driver);
                Ok(conn)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::no_answer(self.target(), self.connect_timeout)),
        }
    }
}

/// The request connection: opened on first use, replaced after a failure.
pub(crate) struct Client {
    dialer: Arc<Dialer>,
    request_timeout: Duration,
    /// The open connection and its number; a failure closes only the
    /// connection it happened on, never a newer one.
    conn: tokio::sync::Mutex<Option<(u64, MultiplexedConnection)>>,
    opened: AtomicU64,
}

impl Client {
    pub(crate) fn new(dialer: Arc<Dialer>, request_timeout: Duration) -> Client {
        Client {
            dialer,
            request_timeout,
            conn: tokio::sync::Mutex::new(None),
            opened: AtomicU64::new(0),
        }
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The open connection, or a new one; and whether it was open before
    /// (it may have died since: the server restarted, a proxy closed it).
    async fn connection(&self) -> Result<(u64, MultiplexedConnection, bool), Error> {
        let mut slot = self.conn.lock().await;
        if let Some((n, c)) = slot.as_ref() {
            return Ok((*n, c.clone(), true));
        }
        let conn = self.dialer.connection().await?;
        let n = self.opened.fetch_add(1, Ordering::SeqCst) + 1;
        *slot = Some((n, conn.clone()));
        Ok((n, conn, false))
    }

    /// Closes connection `n` if it is still the open one: the next request
    /// opens another. A connection whose request failed without an answer
    /// (or did not answer in time: it may sit behind a dead network path)
    /// is never used again.
    async fn close(&self, n: u64) {
        let mut slot = self.conn.lock().await;
        if slot.as_ref().is_some_and(|(open, _)| *open == n) {
            *slot = None;
        }
    }

    /// Runs `script` with `keys` and `args` by `EVALSHA`, and by `EVAL`
    /// (which also caches it) when the server answers `NOSCRIPT`: after a
    /// restart or a failover the script cache is empty, and `NOSCRIPT`
    /// means nothing ran. All of it, connecting included, within the
    /// request timeout.
    pub(crate) async fn eval(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, Error> {
        let op = script.name;
        let deadline = Instant::now() + self.request_timeout;
        let by_hash = script.invocation(true, keys, args);
        match self.run(op, &by_hash, deadline, script.retry).await? {
            Err(e) if errors::is_noscript(&e) => {
                let by_body = script.invocation(false, keys, args);
                match self.run(op, &by_body, deadline, script.retry).await? {
                    Ok(v) => Ok(v),
                    Err(e) => Err(errors::map(op, e)),
                }
            }
            Ok(v) => Ok(v),
            Err(e) => Err(errors::map(op, e)),
        }
    }

    /// Runs one command before `deadline`: the server's answer (a value or
    /// the server's own error), or the error that left the outcome unknown
    /// (the connection is then closed).
    ///
    /// With `retry`, for commands whose repetition is harmless (every
    /// operation but a break: a retried acquire gets the same grant back, a
    /// retried renewal or release finds its own grant or none), a command
    /// that failed on a connection that was open before it (a server
    /// restarted since, a peer that closed it) is sent once more on a new
    /// connection, within the same deadline, instead of failing the
    /// operation for a connection nobody could have known was dead.
    pub(crate) async fn run(
        &self,
        op: &'static str,
        cmd: &Cmd,
        deadline: Instant,
        retry: bool,
    ) -> Result<Result<Value, redis::RedisError>, Error> {
        let mut retry = retry;
        loop {
            let used = AtomicU64::new(0);
            let attempt = async {
                let (n, mut conn, reused) = self.connection().await?;
                used.store(n, Ordering::SeqCst);
                // The server's own error comes as a value: an error here.
                let answer = conn
                    .send_packed_command(cmd)
                    .await
                    .and_then(Value::extract_error);
                Ok::<_, Error>((n, reused, answer))
            };
            match tokio::time::timeout_at(deadline, attempt).await {
                Ok(Ok((n, reused, Err(e)))) if errors::breaks_connection(&e) => {
                    self.close(n).await;
                    if retry && reused && !e.is_timeout() {
                        retry = false;
                        continue;
                    }
                    return Err(errors::map(op, e));
                }
                Ok(Ok((_, _, answer))) => return Ok(answer),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    // A later request must not queue behind an answer that
                    // is not coming (0: the time ran out while connecting).
                    let n = used.load(Ordering::SeqCst);
                    if n != 0 {
                        self.close(n).await;
                    }
                    return Err(errors::timed_out(op, self.request_timeout));
                }
            }
        }
    }
}
