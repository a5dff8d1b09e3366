//! The fault proxy does what each control says, at the TCP level, against
//! an echo server that counts what reaches it. (The same controls in front
//! of a real etcd, and process faults on a launched one, are checked where
//! the test servers are started: `lease-testkit`.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::faults::FaultProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// An echo server counting the bytes that reach it.
struct Echo {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
}

async fn echo() -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let r = received.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let r = r.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            r.fetch_add(n as u64, Ordering::SeqCst);
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    Echo { addr, received }
}

/// Sends `msg` and reads exactly its echo, or fails after `wait`.
async fn exchange(s: &mut TcpStream, msg: &[u8], wait: Duration) -> Result<Vec<u8>, String> {
    s.write_all(msg).await.map_err(|e| format!("write: {e}"))?;
    let mut got = vec![0u8; msg.len()];
    match timeout(wait, s.read_exact(&mut got)).await {
        Err(_) => Err("no answer".into()),
        Ok(Err(e)) => Err(format!("read: {e}")),
        Ok(Ok(_)) => Ok(got),
    }
}

/// Whether the peer closed the connection within `wait` (EOF or reset).
async fn closed(s: &mut TcpStream, wait: Duration) -> bool {
    let mut b = [0u8; 64];
    matches!(timeout(wait, s.read(&mut b)).await, Ok(Ok(0)) | Ok(Err(_)))
}

const WAIT: Duration = Duration::from_secs(2);

#[tokio::test]
async fn forwards_both_ways_and_counts() {
    let e = echo().await;
    let p = FaultProxy::start(e.addr).await.unwrap();
    assert!(p.addr().ip().is_loopback());
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    assert_eq!(exchange(&mut s, b"ping", WAIT).await.unwrap(), b"ping");
    assert_eq!(exchange(&mut s, b"pong!", WAIT).await.unwrap(), b"pong!");
    let st = p.stats();
    assert_eq!((st.up_bytes, st.down_bytes), (9, 9), "{st:?}");
    assert_eq!(st.requests, 2, "one request per exchange: {st:?}");
    assert_eq!((st.connections, st.live), (1, 1), "{st:?}");
    assert_eq!(e.received.load(Ordering::SeqCst), 9);
}

#[tokio::test]
async fn latency_delays_each_direction() {
    let e = echo().await;
    let p = FaultProxy::start(e.addr).await.unwrap();
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    exchange(&mut s, b"warm", WAIT).await.unwrap();
    p.set_latency(Duration::from_millis(100));
    let t = Instant::now();
    exchange(&mut s, b"slow", WAIT).await.unwrap();
    let slow = t.elapsed();
    assert!(slow >= Duration::from_millis(200), "round trip {slow:?}");
    p.set_latency(Duration::ZERO);
    let t = Instant::now();
    exchange(&mut s, b"fast", WAIT).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    eprintln!("round trip with 100 ms latency: {slow:?}");
}

#[tokio::test]
async fn blackhole_accepts_but_never_answers_until_lifted() {
    let e = echo().await;
    let p = FaultProxy::start(e.addr).await.unwrap();
    let mut old = TcpStream::connect(p.addr()).await.unwrap();
    exchange(&mut old, b"before", WAIT).await.unwrap();
    let before = e.received.load(Ordering::SeqCst);

    p.blackhole(true);
    // A new connection is accepted...
    let mut new = timeout(WAIT, TcpStream::connect(p.addr()))
        .await
        .expect("accepted while blackholed")
        .unwrap();
    // ...but neither it nor the old one gets anything through.
    let quiet = Duration::from_millis(300);
    assert_eq!(
        exchange(&mut new, b"lost?", quiet).await,
        Err("no answer".into())
    );
    assert_eq!(
        exchange(&mut old, b"held", quiet).await,
        Err("no answer".into())
    );
    assert_eq!(
        e.received.load(Ordering::SeqCst),
        before,
        "bytes reached the server"
    );

    // Lifted: the held bytes go through, and both answers arrive.
    p.blackhole(false);
    let mut b = [0u8; 5];
    timeout(WAIT, new.read_exact(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&b, b"lost?");
    let mut b = [0u8; 4];
    timeout(WAIT, old.read_exact(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&b, b"held");
}

#[tokio::test]
async fn sever_closes_open_connections_only() {
    let e = echo().await;
    let p = FaultProxy::start(e.addr).await.unwrap();
    let mut a = TcpStream::connect(p.addr()).await.unwrap();
    let mut b = TcpStream::connect(p.addr()).await.unwrap();
    exchange(&mut a, b"a", WAIT).await.unwrap();
    exchange(&mut b, b"b", WAIT).await.unwrap();
    p.sever();
    assert!(closed(&mut a, WAIT).await, "a still open");
    assert!(closed(&mut b, WAIT).await, "b still open");
    let mut c = TcpStream::connect(p.addr()).await.unwrap();
    assert_eq!(exchange(&mut c, b"again", WAIT).await.unwrap(), b"again");
    let st = p.stats();
    assert_eq!(st.severed, 2, "{st:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(p.stats().live, 1);
}

/// A server that answers each request with `ok` once the test says so (one
/// permit per answer, first come first served), counting the chunks that
/// reach it; chunks that arrive while a request waits belong to it, and a
/// client closing meanwhile closes the connection.
struct Gated {
    addr: SocketAddr,
    answer: Arc<tokio::sync::Semaphore>,
    received: Arc<AtomicU64>,
}

async fn gated() -> Gated {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = Arc::new(tokio::sync::Semaphore::new(0));
    let received = Arc::new(AtomicU64::new(0));
    let (a, r) = (answer.clone(), received.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let (a, r) = (a.clone(), r.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => loop {
                            r.fetch_add(1, Ordering::SeqCst);
                            tokio::select! {
                                permit = a.acquire() => {
                                    let Ok(permit) = permit else { return };
                                    permit.forget();
                                    if s.write_all(b"ok").await.is_err() {
                                        return;
                                    }
                                    break;
                                }
                                more = s.read(&mut buf) => match more {
                                    Ok(0) | Err(_) => return,
                                    Ok(_) => {}
                                },
                            }
                        },
                    }
                }
            });
        }
    });
    Gated {
        addr,
        answer,
        received,
    }
}

/// Polls the proxy's `awaiting` gauge until it equals `want`.
async fn awaiting_becomes(p: &FaultProxy, want: u64) -> u64 {
    let t = Instant::now();
    loop {
        let now = p.stats().awaiting;
        if now == want || t.elapsed() > WAIT {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Polls until `want` connections are open through the proxy.
async fn live_becomes(p: &FaultProxy, want: u64) -> u64 {
    let t = Instant::now();
    loop {
        let now = p.stats().live;
        if now == want || t.elapsed() > WAIT {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Polls until `want` chunks reached the gated server.
async fn received_becomes(g: &Gated, want: u64) -> u64 {
    let t = Instant::now();
    loop {
        let now = g.received.load(Ordering::SeqCst);
        if now == want || t.elapsed() > WAIT {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn awaiting_counts_unanswered_requests_until_answered_or_closed() {
    let g = gated().await;
    let p = FaultProxy::start(g.addr).await.unwrap();
    let mut a = TcpStream::connect(p.addr()).await.unwrap();
    let mut b = TcpStream::connect(p.addr()).await.unwrap();
    // Open but idle: nothing awaits, and a waiter is not woken.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(p.stats().awaiting, 0, "{:?}", p.stats());
    assert!(
        timeout(Duration::from_millis(100), p.request_forwarded())
            .await
            .is_err(),
        "woken with nothing in flight"
    );

    // A request held by the server: awaiting until its answer starts. The
    // waiter started before the request is woken by it, the request already
    // counted as awaiting.
    let waiter = async {
        timeout(WAIT, p.request_forwarded())
            .await
            .expect("not woken by the request");
        p.stats().awaiting
    };
    let send = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        a.write_all(b"req-a").await.unwrap();
    };
    let (seen, ()) = tokio::join!(waiter, send);
    assert_eq!(seen, 1);
    // A second chunk on the same connection is the same exchange.
    a.write_all(b"more").await.unwrap();
    assert_eq!(received_becomes(&g, 2).await, 2);
    assert_eq!(p.stats().awaiting, 1, "{:?}", p.stats());
    b.write_all(b"req-b").await.unwrap();
    assert_eq!(awaiting_becomes(&p, 2).await, 2, "{:?}", p.stats());
    // Edge-triggered: requests already awaiting do not wake a new waiter.
    assert!(
        timeout(Duration::from_millis(100), p.request_forwarded())
            .await
            .is_err(),
        "woken by requests sent before the wait"
    );

    // The answer falls it…
    g.answer.add_permits(1);
    let mut ok = [0u8; 2];
    timeout(WAIT, a.read_exact(&mut ok)).await.unwrap().unwrap();
    assert_eq!(&ok, b"ok");
    assert_eq!(awaiting_becomes(&p, 1).await, 1, "{:?}", p.stats());

    // …and so does the connection closing with its request unanswered.
    drop(b);
    assert_eq!(awaiting_becomes(&p, 0).await, 0, "{:?}", p.stats());
    assert_eq!(live_becomes(&p, 1).await, 1, "{:?}", p.stats());

    // A sever cuts a request in flight, and says so.
    a.write_all(b"cut").await.unwrap();
    assert_eq!(awaiting_becomes(&p, 1).await, 1, "{:?}", p.stats());
    p.sever();
    assert!(closed(&mut a, WAIT).await, "a still open");
    assert_eq!(awaiting_becomes(&p, 0).await, 0, "{:?}", p.stats());
    let st = p.stats();
    assert_eq!((st.severed, st.severed_awaiting), (1, 1), "{st:?}");
    assert!(g.received.load(Ordering::SeqCst) >= 3, "{st:?}");

    // An idle connection severed is not counted as cut mid-exchange.
    let mut c = TcpStream::connect(p.addr()).await.unwrap();
    g.answer.add_permits(1);
    c.write_all(b"x").await.unwrap();
    timeout(WAIT, c.read_exact(&mut ok)).await.unwrap().unwrap();
    assert_eq!(awaiting_becomes(&p, 0).await, 0, "{:?}", p.stats());
    p.sever();
    assert!(closed(&mut c, WAIT).await, "c still open");
    let st = p.stats();
    assert_eq!((st.severed, st.severed_awaiting), (2, 1), "{st:?}");
}

#[tokio::test]
async fn a_drop_window_keeps_the_request_awaiting_until_it_severs() {
    let e = echo().await;
    let p = FaultProxy::start(e.addr).await.unwrap();
    // Long enough that a loaded machine still sees the window open.
    p.set_drop_window(Duration::from_secs(1));
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    p.drop_responses(1);
    s.write_all(b"lost").await.unwrap();
    // The echo answers at once, but the answer is discarded: still awaiting.
    let t = Instant::now();
    while p.stats().dropped_bytes == 0 && t.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let st = p.stats();
    assert!(st.dropped_bytes > 0 && st.awaiting == 1, "{st:?}");
    assert!(closed(&mut s, WAIT).await, "no close after the drop window");
    assert_eq!(awaiting_becomes(&p, 0).await, 0, "{:?}", p.stats());
    let st = p.stats();
    assert_eq!((st.severed, st.severed_awaiting), (1, 1), "{st:?}");
}

#[tokio::test]
async fn drop_responses_forwards_the_request_and_drops_the_answer() {
    let e = echo().await;
    let p = FaultProxy::start(e.addr).await.unwrap();
    p.set_drop_window(Duration::from_millis(150));
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    exchange(&mut s, b"fine", WAIT).await.unwrap();

    p.drop_responses(1);
    assert_eq!(p.drops_pending(), 1);
    let t = Instant::now();
    s.write_all(b"applied").await.unwrap();
    // The client sees no byte of the answer, only the connection closing
    // at the end of the drop window.
    assert!(closed(&mut s, WAIT).await, "no close after the drop window");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(140),
        "closed after {waited:?}"
    );
    // The server did get the request.
    assert_eq!(e.received.load(Ordering::SeqCst), 4 + 7);
    let st = p.stats();
    assert_eq!(st.dropped_exchanges, 1, "{st:?}");
    assert_eq!(st.dropped_bytes, 7, "{st:?}");
    assert_eq!(p.drops_pending(), 0);

    // Only that one: the next request is answered.
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    assert_eq!(exchange(&mut s, b"next", WAIT).await.unwrap(), b"next");
}

#[tokio::test]
async fn dropping_the_proxy_closes_everything() {
    let e = echo().await;
    let p = FaultProxy::start(e.addr).await.unwrap();
    let addr = p.addr();
    let mut s = TcpStream::connect(addr).await.unwrap();
    exchange(&mut s, b"x", WAIT).await.unwrap();
    drop(p);
    assert!(closed(&mut s, WAIT).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(TcpStream::connect(addr).await.is_err(), "still listening");
}
