//! A TCP fault proxy on loopback: put it between a client and a server and
//! inject latency, blackholes, severed connections and lost responses.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// How long [`FaultProxy::drop_responses`] keeps discarding a connection's
/// answers before severing it, unless changed with
/// [`FaultProxy::set_drop_window`]: long enough for a loopback server to
/// apply the request and answer.
pub const DEFAULT_DROP_WINDOW: Duration = Duration::from_millis(200);

/// Counters of what went through a [`FaultProxy`]. All monotonic except
/// the gauges `live` and `awaiting`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Client connections accepted.
    pub connections: u64,
    /// Connections currently open (a gauge).
    pub live: u64,
    /// Connections currently awaiting an answer (a gauge): a client → server
    /// chunk was forwarded and no server → client byte has been forwarded
    /// since. It falls when the answer starts, when the server closes its
    /// side, and when the connection closes (EOF, sever, end of a drop
    /// window). While a drop window discards the answer, the connection
    /// stays awaiting until it is severed. The same request/response
    /// heuristic as `requests`: protocol chatter (HTTP/2 pings, window
    /// updates) can count as an exchange.
    pub awaiting: u64,
    /// Bytes forwarded client → server.
    pub up_bytes: u64,
    /// Reads forwarded client → server (one `read` = one chunk).
    pub up_chunks: u64,
    /// Bytes forwarded server → client.
    pub down_bytes: u64,
    /// Reads forwarded server → client.
    pub down_chunks: u64,
    /// Requests: client → server chunks that start a new exchange (the first
    /// on a connection, or the first after the server last sent bytes back).
    /// A heuristic that counts one per round trip for request/response
    /// protocols (HTTP/1, NATS, Mongo wire, unary gRPC); protocol chatter
    /// (HTTP/2 settings, pings) counts too, so compare against a baseline.
    pub requests: u64,
    /// Server → client bytes discarded by `drop_responses`.
    pub dropped_bytes: u64,
    /// Exchanges whose response was dropped (requests taken by `drop_responses`).
    pub dropped_exchanges: u64,
    /// Connections closed by `sever` or at the end of a drop window.
    pub severed: u64,
    /// Of `severed`, those cut while awaiting an answer: exchanges in
    /// flight whose client saw the connection close instead of the answer
    /// (the server may or may not have applied the request).
    pub severed_awaiting: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    live: AtomicU64,
    awaiting: AtomicU64,
    up_bytes: AtomicU64,
    up_chunks: AtomicU64,
    down_bytes: AtomicU64,
    down_chunks: AtomicU64,
    requests: AtomicU64,
    dropped_bytes: AtomicU64,
    dropped_exchanges: AtomicU64,
    severed: AtomicU64,
    severed_awaiting: AtomicU64,
}

struct Shared {
    upstream: SocketAddr,
    latency_us: AtomicU64,
    drop_window_us: AtomicU64,
    drop_pending: AtomicU32,
    blackhole: watch::Sender<bool>,
    sever: watch::Sender<u64>,
    counters: Counters,
    /// Wakes every waiter of `request_forwarded` each time a client →
    /// server chunk has been forwarded.
    request_sent: Notify,
}

/// One proxied connection's state shared by its two pumps.
#[derive(Default)]
struct Conn {
    /// Server → client bytes are being discarded (a drop window is open).
    dropping: AtomicBool,
    /// The next client chunk starts a new exchange.
    fresh: AtomicBool,
    /// A request awaits its answer (counted in `Counters::awaiting`).
    awaiting: AtomicBool,
    /// Wakes the connection when a drop window opens.
    drop_started: Notify,
}

impl Conn {
    /// A request is about to leave: the connection awaits an answer.
    fn start_awaiting(&self, c: &Counters) {
        // Counted before the flag is set and undone if it was already set:
        // the gauge never drops below the number of flags set, and never
        // wraps below zero when the answer's `stop_awaiting` races this.
        c.awaiting.fetch_add(1, Ordering::SeqCst);
        if self.awaiting.swap(true, Ordering::SeqCst) {
            c.awaiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The answer started, the server closed its side, or the connection
    /// closed: nothing awaits an answer any more. Returns whether it did.
    fn stop_awaiting(&self, c: &Counters) -> bool {
        let was = self.awaiting.swap(false, Ordering::SeqCst);
        if was {
            c.awaiting.fetch_sub(1, Ordering::SeqCst);
        }
        was
    }
}

/// Clears a connection's awaiting flag however its task ends (the
/// connection's sockets close with it).
struct ClearAwaiting<'a>(&'a Conn, &'a Counters);

impl Drop for ClearAwaiting<'_> {
    fn drop(&mut self) {
        self.0.stop_awaiting(self.1);
    }
}

/// A TCP proxy listening on `127.0.0.1:<ephemeral>` that forwards every
/// connection to one upstream address, with faults controllable from the
/// test while connections are open:
///
/// * [`set_latency`](FaultProxy::set_latency): every chunk waits `d` before
///   being forwarded, in both directions (a request/response round trip
///   gains `2d`).
/// * [`blackhole`](FaultProxy::blackhole): while on, new connections are
///   accepted but never connected upstream, and open connections forward
///   nothing in either direction (bytes already read are held, not lost);
///   turning it off lets held bytes through.
/// * [`sever`](FaultProxy::sever): closes every open connection now (both
///   sides see the socket close); new connections are accepted as usual.
///   [`request_forwarded`](FaultProxy::request_forwarded) waits for a
///   request to leave, so a sever right after it cuts an exchange in
///   flight rather than only idle connections.
/// * [`drop_responses`](FaultProxy::drop_responses)`(n)`: "forward the
///   request, drop the response", `n` times. On a byte stream that means:
///   the next `n` client → server chunks (on any connections) are forwarded
///   to the server; from then on, the connection that carried each one
///   discards everything the server sends back for the drop window
///   ([`DEFAULT_DROP_WINDOW`]), and is then severed. The server applies the
///   request; the client never sees the answer, only a closed connection.
///
/// The proxy runs on the tokio runtime it was started on and stops (closing
/// every connection) when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on `127.0.0.1:0`.
    ///
    /// # Errors
    /// When the listening socket cannot be bound.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            latency_us: AtomicU64::new(0),
            drop_window_us: AtomicU64::new(DEFAULT_DROP_WINDOW.as_micros() as u64),
            drop_pending: AtomicU32::new(0),
            blackhole: watch::channel(false).0,
            sever: watch::channel(0).0,
            counters: Counters::default(),
            request_sent: Notify::new(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(FaultProxy {
            addr,
            shared,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Delay every forwarded chunk by `d` (both directions); zero turns it off.
    pub fn set_latency(&self, d: Duration) {
        self.shared
            .latency_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Turns the blackhole on or off (see the type docs).
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// Closes every open connection.
    pub fn sever(&self) {
        self.shared.sever.send_modify(|g| *g += 1);
    }

    /// Returns when the next client → server chunk has been forwarded to
    /// the server: a request on its way, now awaiting its answer (see
    /// [`ProxyStats::awaiting`]). Woken, not polled, so a
    /// [`sever`](FaultProxy::sever) right after lands within microseconds
    /// of the request leaving, before a loopback server has answered it.
    ///
    /// Edge-triggered on purpose: it waits for a chunk sent after the call
    /// even when `awaiting` is already above zero, because a request the
    /// server holds (a long poll, a stream answered only on events) keeps
    /// some connection awaiting all the time, and a sever then would fall
    /// at a random instant again. Never returns on a proxy nobody uses:
    /// put a timeout around it.
    pub async fn request_forwarded(&self) {
        self.shared.request_sent.notified().await;
    }

    /// Forward the next `n` requests and drop their responses (see the type
    /// docs); replaces any count still pending.
    pub fn drop_responses(&self, n: u32) {
        self.shared.drop_pending.store(n, Ordering::SeqCst);
    }

    /// Requests still to be taken by `drop_responses`.
    pub fn drops_pending(&self) -> u32 {
        self.shared.drop_pending.load(Ordering::SeqCst)
    }

    /// How long a connection discards answers before it is severed.
    pub fn set_drop_window(&self, d: Duration) {
        self.shared
            .drop_window_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Turns every fault off (latency, blackhole, pending drops).
    pub fn heal(&self) {
        self.set_latency(Duration::ZERO);
        self.drop_responses(0);
        self.blackhole(false);
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProxyStats {
            connections: l(&c.connections),
            live: l(&c.live),
            awaiting: l(&c.awaiting),
            up_bytes: l(&c.up_bytes),
            up_chunks: l(&c.up_chunks),
            down_bytes: l(&c.down_bytes),
            down_chunks: l(&c.down_chunks),
            requests: l(&c.requests),
            dropped_bytes: l(&c.dropped_bytes),
            dropped_exchanges: l(&c.dropped_exchanges),
            severed: l(&c.severed),
            severed_awaiting: l(&c.severed_awaiting),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Closes every open connection; their tasks then end.
        self.sever();
        self.blackhole(false);
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                // Subscribed before spawning: a sever right after the accept
                // still reaches this connection.
                let mut sever = shared.sever.subscribe();
                sever.borrow_and_update();
                shared.counters.connections.fetch_add(1, Ordering::Relaxed);
                shared.counters.live.fetch_add(1, Ordering::Relaxed);
                let s = shared.clone();
                tokio::spawn(async move {
                    serve(&s, client, sever).await;
                    s.counters.live.fetch_sub(1, Ordering::Relaxed);
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn serve(shared: &Arc<Shared>, client: TcpStream, mut sever: watch::Receiver<u64>) {
    // Blackholed: accept, never connect, never answer.
    let mut bh = shared.blackhole.subscribe();
    tokio::select! {
        r = bh.wait_for(|on| !*on) => if r.is_err() { return },
        _ = sever.changed() => {
            shared.counters.severed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    let upstream = tokio::select! {
        r = TcpStream::connect(shared.upstream) => match r {
            Ok(s) => s,
            Err(_) => return,
        },
        _ = sever.changed() => {
            shared.counters.severed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let conn = Conn::default();
    conn.fresh.store(true, Ordering::Relaxed);
    let c = &shared.counters;
    let _clear = ClearAwaiting(&conn, c);
    let pumps = async {
        tokio::join!(
            pump(shared, &conn, true, cr, uw),
            pump(shared, &conn, false, ur, cw)
        )
    };
    let drop_timer = async {
        conn.drop_started.notified().await;
        let w = shared.drop_window_us.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_micros(w)).await;
    };
    let severed = tokio::select! {
        _ = pumps => false,
        _ = sever.changed() => true,
        _ = drop_timer => true,
    };
    if severed {
        c.severed.fetch_add(1, Ordering::Relaxed);
        if conn.stop_awaiting(c) {
            c.severed_awaiting.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Dropping the halves closes both sockets.
}

/// Forwards one direction until EOF or an error; `up` is client → server.
async fn pump(
    shared: &Shared,
    conn: &Conn,
    up: bool,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
) {
    let c = &shared.counters;
    let mut buf = vec![0u8; 16 * 1024];
    let mut bh = shared.blackhole.subscribe();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let latency = shared.latency_us.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        if bh.wait_for(|on| !*on).await.is_err() {
            break;
        }
        if up {
            if conn.fresh.swap(false, Ordering::Relaxed) {
                c.requests.fetch_add(1, Ordering::Relaxed);
            }
            // Set before the write: an answer that comes back at once
            // clears it, never the other way round.
            conn.start_awaiting(c);
            // Take one pending drop, decided before the request leaves so
            // no part of its answer can slip through.
            let took = !conn.dropping.load(Ordering::SeqCst)
                && shared
                    .drop_pending
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| p.checked_sub(1))
                    .is_ok();
            if took {
                conn.dropping.store(true, Ordering::SeqCst);
                c.dropped_exchanges.fetch_add(1, Ordering::Relaxed);
                conn.drop_started.notify_one();
            }
        } else if conn.dropping.load(Ordering::SeqCst) {
            c.dropped_bytes.fetch_add(n as u64, Ordering::Relaxed);
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        if up {
            c.up_bytes.fetch_add(n as u64, Ordering::Relaxed);
            c.up_chunks.fetch_add(1, Ordering::Relaxed);
            // The request has left: wake whoever waits to cut it.
            shared.request_sent.notify_waiters();
        } else {
            c.down_bytes.fetch_add(n as u64, Ordering::Relaxed);
            c.down_chunks.fetch_add(1, Ordering::Relaxed);
            conn.fresh.store(true, Ordering::Relaxed);
            conn.stop_awaiting(c);
        }
    }
    if !up {
        // The server closed its side: no answer can come any more.
        conn.stop_awaiting(c);
    }
    // Pass the end of this direction on (half-close), keep the other open.
    let _ = to.shutdown().await;
}
