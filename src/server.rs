//! Serving the router over TCP, hardened against slow clients: HTTP/1.1 with a bound on
//! how long a client may take to send its request headers (an idle keep-alive connection
//! counts as reading the next request's headers, so it is closed after the same bound), a
//! cap on open connections (at the cap, new connections wait in the listen backlog
//! instead of taking descriptors), and graceful shutdown. Handlers can extract
//! `ConnectInfo<SocketAddr>`.
//!
//! A client that closes its connection while its request is in flight ends it: hyper's
//! dispatcher keeps reading while the handler runs (half-closed connections are not
//! allowed), so it sees the end of the stream, the connection ends with an error, and
//! dropping the connection drops the handler's future — a checkout waiting for its
//! payment's event gives up its place at once.
//!
//! HTTP/2 is not offered: hyper has no header-read or idle timeout for HTTP/2 connections,
//! so an idle HTTP/2 client could hold a connection slot for ever. TLS and HTTP/2 belong
//! to the proxy in front.
//!
//! When `max_connections_per_address` is set, one client address may hold at most that
//! many of the connections (the trusted proxies' peers excepted): a client that opens
//! connections and sends nothing is then bounded per address, not only in total.
//!
//! It knows axum and hyper, and of the application only how a client address is counted
//! (`domain::ClientAddress`).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::middleware::AddExtension;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use ipnet::IpNet;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower_service::Service;

use crate::domain::ClientAddress;

/// Set once shutdown has begun; `/readyz` answers 503 from then on (the router carries it
/// as an extension).
#[derive(Debug, Clone, Default)]
pub struct ShuttingDown(Arc<AtomicBool>);

impl ShuttingDown {
    pub fn begin(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Limits on what clients may hold.
#[derive(Debug, Clone)]
pub struct Limits {
    /// How long a client may take to send a request's headers (and how long a keep-alive
    /// connection may stay idle).
    pub header_read_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections one client address (`ClientAddress`: an IPv6 /64 counts as one) may
    /// hold at once; a new one beyond it is closed at once, so one address cannot take
    /// every connection from the others. 0: no such limit.
    pub max_connections_per_address: usize,
    /// Peers not counted per address: the trusted proxies, behind which every client
    /// arrives from the proxy's address.
    pub exempt: Vec<IpNet>,
}

/// The connections each client address holds; an entry leaves with its last connection,
/// so the table never holds more than `max_connections` entries.
#[derive(Debug, Default)]
struct PerAddress(Mutex<HashMap<ClientAddress, usize>>);

/// One connection counted against its address; uncounted when dropped.
struct AddressSlot {
    table: Arc<PerAddress>,
    address: ClientAddress,
}

/// A connection its address may not open: it holds `max_connections_per_address`.
struct AddressFull;

impl PerAddress {
    /// Counts a connection from `peer` (`None`: not counted — no limit is set, or the peer
    /// is a trusted proxy), unless its address holds the most it may already.
    fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        limits: &Limits,
    ) -> Result<Option<AddressSlot>, AddressFull> {
        let max = limits.max_connections_per_address;
        let peer = peer.to_canonical();
        if max == 0 || limits.exempt.iter().any(|net| net.contains(&peer)) {
            return Ok(None);
        }
        let address = ClientAddress::of(peer);
        let mut table = self.0.lock().expect("the table's lock is never poisoned");
        let held = table.entry(address).or_insert(0);
        if *held >= max {
            return Err(AddressFull);
        }
        *held += 1;
        Ok(Some(AddressSlot {
            table: Arc::clone(self),
            address,
        }))
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut table = self
            .table
            .0
            .lock()
            .expect("the table's lock is never poisoned");
        if let Some(held) = table.get_mut(&self.address) {
            *held -= 1;
            if *held == 0 {
                table.remove(&self.address);
            }
        }
    }
}

/// How often "connection limit reached" may be logged.
const SATURATION_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Serves `router` on `listener` until `shutdown` resolves; then stops accepting (the
/// listener is closed), asks every open connection to finish (an idle one closes at once,
/// a busy one after its response) and returns once all are closed. Bounding that wait is
/// the caller's business.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let mut make_service = router.into_make_service_with_connect_info::<SocketAddr>();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let per_address = Arc::new(PerAddress::default());
    // `stop` tells connections to finish; every connection holds an `open` receiver, so
    // `open_tx.closed()` resolves once the last one is gone.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (open_tx, open_rx) = watch::channel(());
    let mut last_saturation_log: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if last_saturation_log.is_none_or(|at| at.elapsed() >= SATURATION_LOG_INTERVAL) {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "connection limit reached; new connections wait until one closes"
                    );
                    last_saturation_log = Some(Instant::now());
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => {
                        permit.expect("the semaphore is never closed")
                    }
                    () = &mut shutdown => break,
                }
            }
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    if !is_connection_error(&err) {
                        // Most likely out of descriptors: back off instead of spinning.
                        tracing::error!(error = %err, "accept failed; retrying in 1 s");
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                            () = &mut shutdown => break,
                        }
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = per_address.admit(remote.ip(), &limits) else {
            // Closed unanswered: at this many connections the client is not waiting for
            // one more, and an answer would cost what it spends.
            tracing::debug!(peer = %remote.ip(), "connection limit per address reached; connection closed");
            continue;
        };
        let service = match make_service.call(remote).await {
            Ok(service) => service,
            Err(never) => match never {},
        };
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        tokio::spawn(serve_connection(
            connection,
            stop_rx.clone(),
            open_rx.clone(),
            (permit, slot),
        ));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(open_rx);
    open_tx.closed().await;
}

/// The service of one connection: the router, with the peer address as `ConnectInfo`.
type ConnectionService = TowerToHyperService<AddExtension<Router, ConnectInfo<SocketAddr>>>;

/// Drives one connection to its end, finishing gracefully once `stop` turns true.
async fn serve_connection(
    connection: http1::Connection<TokioIo<TcpStream>, ConnectionService>,
    mut stop: watch::Receiver<bool>,
    _open: watch::Receiver<()>,
    _held: (OwnedSemaphorePermit, Option<AddressSlot>),
) {
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(err) = result {
                    // Header-read timeouts, resets, malformed requests: the client's doing.
                    tracing::debug!(error = %err, "connection ended with an error");
                }
                break;
            }
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Errors of one incoming connection (not of the listener), after which accepting the
/// next one is fine at once.
fn is_connection_error(err: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        err.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(limits: Limits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let router = Router::new().route(
            "/peer",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, router, limits, async move {
            let _ = rx.await;
        }));
        (address, tx)
    }

    /// Sends a GET of `path` on `stream` and reads the whole response (Connection: close).
    async fn get_on(stream: &mut TcpStream, path: &str) -> String {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    fn limits() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 16,
            max_connections_per_address: 16,
            exempt: Vec::new(),
        }
    }

    /// A connection to `address` from the loopback address `from` (127.0.0.2, …).
    async fn connect_from(from: &str, address: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        socket.connect(address).await.unwrap()
    }

    #[tokio::test]
    async fn one_address_holds_at_most_its_connections_and_others_are_served() {
        let (address, _stop) = start(Limits {
            max_connections_per_address: 3,
            ..limits()
        })
        .await;
        // An abuser's address opens three idle connections: its fourth is closed unanswered.
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(connect_from("127.0.0.2", address).await);
        }
        // Give the server the time to have counted the three.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut fourth = connect_from("127.0.0.2", address).await;
        let request = "GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let _ = fourth.write_all(request.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), fourth.read_to_end(&mut answer))
            .await
            .expect("the server closes the fourth connection");
        assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
        // A shopper at another address is served meanwhile.
        let mut shopper = connect_from("127.0.0.3", address).await;
        assert!(
            get_on(&mut shopper, "/peer")
                .await
                .starts_with("HTTP/1.1 200")
        );
        // Once one of the abuser's connections closes, its address may open another.
        drop(held.pop());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut again = connect_from("127.0.0.2", address).await;
        assert!(
            get_on(&mut again, "/peer")
                .await
                .starts_with("HTTP/1.1 200")
        );
    }

    #[tokio::test]
    async fn a_trusted_proxy_is_not_counted_per_address() {
        let (address, _stop) = start(Limits {
            max_connections_per_address: 1,
            exempt: vec!["127.0.0.4/32".parse().unwrap()],
            ..limits()
        })
        .await;
        let _first = connect_from("127.0.0.4", address).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut second = connect_from("127.0.0.4", address).await;
        assert!(
            get_on(&mut second, "/peer")
                .await
                .starts_with("HTTP/1.1 200")
        );
    }

    #[tokio::test]
    async fn handlers_see_the_peer_address() {
        let (address, _stop) = start(limits()).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let local = stream.local_addr().unwrap();
        let response = get_on(&mut stream, "/peer").await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with(&local.to_string()), "{response}");
    }

    /// Reads until the server closes the connection; returns how long after `since`.
    async fn closed_after(stream: &mut TcpStream, since: Instant) -> Duration {
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut sink))
            .await
            .expect("the server closes the connection");
        since.elapsed()
    }

    #[tokio::test]
    async fn slow_and_silent_clients_are_closed_after_the_header_timeout() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            ..limits()
        };
        let (address, _stop) = start(limits).await;
        // Timed from before the connections exist, so never shorter than the server's.
        let since = Instant::now();
        // Half a request line, then nothing.
        let mut slow = TcpStream::connect(address).await.unwrap();
        slow.write_all(b"GET /pe").await.unwrap();
        // Nothing at all.
        let mut silent = TcpStream::connect(address).await.unwrap();
        let slow_took = closed_after(&mut slow, since).await;
        let silent_took = closed_after(&mut silent, since).await;
        assert!(slow_took >= Duration::from_millis(300), "{slow_took:?}");
        assert!(silent_took < Duration::from_secs(5), "{silent_took:?}");
        // A prompt client is still served.
        let mut prompt = TcpStream::connect(address).await.unwrap();
        assert!(
            get_on(&mut prompt, "/peer")
                .await
                .starts_with("HTTP/1.1 200")
        );
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_for_a_free_slot() {
        let limits = Limits {
            max_connections: 2,
            ..limits()
        };
        let (address, _stop) = start(limits).await;
        let first = TcpStream::connect(address).await.unwrap();
        let _second = TcpStream::connect(address).await.unwrap();
        // The third is accepted by the kernel (backlog) but not served while two are open.
        let mut third = TcpStream::connect(address).await.unwrap();
        third
            .write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf)).await;
        assert!(early.is_err(), "served beyond the connection cap");
        // One closes: the third gets its slot and its answer.
        drop(first);
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(10), third.read_to_string(&mut response))
            .await
            .expect("served once a slot is free")
            .unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }

    /// A request whose client is gone must not run on: hyper's HTTP/1 dispatcher reads
    /// the connection while the handler is busy (half-close is not allowed), sees the end
    /// of the stream, and the connection task drops the handler's future — which is what
    /// frees a waiting checkout's place.
    #[tokio::test]
    async fn a_request_whose_client_disconnects_is_dropped() {
        struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                if let Some(tx) = self.0.take() {
                    let _ = tx.send(());
                }
            }
        }
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        let hooks = Arc::new(std::sync::Mutex::new(Some((started_tx, dropped_tx))));
        let router = Router::new().route(
            "/forever",
            get(move || {
                let hooks = hooks.clone();
                async move {
                    let (started, dropped) = hooks.lock().unwrap().take().expect("one request");
                    let _guard = Dropped(Some(dropped));
                    let _ = started.send(());
                    std::future::pending::<()>().await;
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, router, limits(), std::future::pending()));
        let mut client = TcpStream::connect(address).await.unwrap();
        client
            .write_all(b"GET /forever HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), started_rx)
            .await
            .expect("the handler runs")
            .unwrap();
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), dropped_rx)
            .await
            .expect("the handler's future is dropped once its client is gone")
            .unwrap();
    }

    #[tokio::test]
    async fn shutdown_closes_idle_connections_and_returns() {
        let router = Router::new().route("/", get(|| async { "ok" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router, limits(), async move {
            let _ = rx.await;
        }));
        let mut idle = TcpStream::connect(address).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("serve returns once connections are closed")
            .unwrap();
        assert!(closed_after(&mut idle, Instant::now()).await < Duration::from_secs(5));
        assert!(
            TcpStream::connect(address).await.is_err(),
            "still accepting"
        );
    }
}
