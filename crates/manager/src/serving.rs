//! Serving HTTP within bounds. The webhook port is open to every pod in the cluster, so what a
//! client can make the process hold is limited here, for every endpoint:
//!
//! - at most [`Limits::max_connections`] connections at once, counted from accept through the
//!   TLS handshake to close. A connection past the limit is not turned away: the oldest open
//!   connection of the peer (IP address) holding the most is asked to close (at once when idle
//!   or still in its handshake, after the request it is serving otherwise), and the new one is
//!   served as soon as it has. Idle connections cannot lock the API server out, a flood from
//!   one pod closes that pod's own connections first, and no request in progress is cut off;
//! - at most [`Limits::max_connections_per_peer`] from one peer: its next connection closes its
//!   own oldest;
//! - a TLS handshake gets [`Limits::handshake_timeout`];
//! - a request's headers get [`Limits::header_timeout`], counted from when the connection starts
//!   waiting for them: a client that trickles them, or leaves a keep-alive connection idle, is
//!   disconnected after as long;
//! - headers and the read buffer are capped at [`Limits::max_header_bytes`] (431 beyond).
//!
//! Bodies, and the work a request starts, are bounded by the handlers that read them (see
//! [`crate::webhooks`]). On stop, every connection finishes the request it is serving and
//! closes.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// What one endpoint lets its clients hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one IP address.
    pub max_connections_per_peer: usize,
    /// How long a client may take to finish its TLS handshake.
    pub handshake_timeout: Duration,
    /// How long a client may take to send a request's headers, idle time before them included.
    pub header_timeout: Duration,
    /// The largest request head, and the read buffer of a connection.
    pub max_header_bytes: usize,
}

impl Limits {
    /// Room for the API servers' connection pools and a few scrapers and probes, at about
    /// 100 KiB each (TLS records and the read buffer): 256 connections hold some 25 MiB. One
    /// peer may hold half: an API server's pool rarely holds more than a few dozen. The
    /// header timeout is hyper's own default, which idle keep-alive connections from the API
    /// server outlive rarely enough not to race its next request often.
    pub const DEFAULT: Self = Self {
        max_connections: 256,
        max_connections_per_peer: 128,
        handshake_timeout: Duration::from_secs(10),
        header_timeout: Duration::from_secs(30),
        max_header_bytes: 64 << 10,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Serves `router` on `listener` (over TLS when `tls` is given) within `limits` until `stop`,
/// then waits for the open connections to finish their requests.
pub async fn serve(
    endpoint: &'static str,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let open = OpenConnections::default();
    let mut connections = JoinSet::new();
    let mut next_id = 0_u64;
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: try again shortly rather than spin.
                    tracing::debug!(%endpoint, %error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // A peer at its share makes room itself; otherwise, when full, the busiest peer does.
        let at_share = open.count_of(peer.ip()) >= limits.max_connections_per_peer;
        if at_share {
            open.close_oldest_of(Some(peer.ip()));
        }
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                // Full: one connection makes room, and this one waits for it.
                if !at_share {
                    open.close_oldest_of(None);
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                }
            }
        };
        next_id += 1;
        let connection = Connection {
            endpoint,
            peer,
            limits,
            close: open.register(next_id, peer.ip(), &stop),
            _registration: Registration {
                open: open.clone(),
                id: next_id,
            },
            _slot: slot,
        };
        connections.spawn(connection.serve(stream, tls.clone(), router.clone()));
        // Reap the finished ones, so the set holds only open connections.
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
}

/// The open connections of one endpoint, oldest first, each with its peer and the token that
/// asks it to close.
#[derive(Clone, Debug, Default)]
struct OpenConnections(Arc<Mutex<BTreeMap<u64, (IpAddr, CancellationToken)>>>);

impl OpenConnections {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, (IpAddr, CancellationToken)>> {
        // A poisoned lock only means a connection task panicked mid-insert; the map is valid.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers connection `id`; it is asked to close by the returned token, which `stop`
    /// cancels too.
    fn register(&self, id: u64, peer: IpAddr, stop: &CancellationToken) -> CancellationToken {
        let close = stop.child_token();
        self.lock().insert(id, (peer, close.clone()));
        close
    }

    fn count_of(&self, peer: IpAddr) -> usize {
        self.lock().values().filter(|(ip, _)| *ip == peer).count()
    }

    /// Asks the oldest connection of `peer` to close, or, for `None`, the oldest of the peer
    /// with the most open (the one whose oldest is oldest among equals).
    fn close_oldest_of(&self, peer: Option<IpAddr>) {
        let mut open = self.lock();
        let peer = peer.or_else(|| {
            let mut counts: BTreeMap<IpAddr, (usize, std::cmp::Reverse<u64>)> = BTreeMap::new();
            for (id, (ip, _)) in open.iter() {
                let entry = counts.entry(*ip).or_insert((0, std::cmp::Reverse(*id)));
                entry.0 += 1;
            }
            counts
                .into_iter()
                .max_by_key(|(_, rank)| *rank)
                .map(|(ip, _)| ip)
        });
        let oldest = open
            .iter()
            .find(|(_, (ip, _))| Some(*ip) == peer)
            .map(|(id, _)| *id);
        if let Some((_, close)) = oldest.and_then(|id| open.remove(&id)) {
            close.cancel();
        }
    }
}

/// Removes a connection from [`OpenConnections`] when it ends.
struct Registration {
    open: OpenConnections,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.open.lock().remove(&self.id);
    }
}

/// One accepted connection, holding its slot until it closes.
struct Connection {
    endpoint: &'static str,
    peer: SocketAddr,
    limits: Limits,
    /// Asks the connection to close: the endpoint stops, or it is the oldest when full.
    close: CancellationToken,
    _registration: Registration,
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    async fn serve(self, stream: TcpStream, tls: Option<TlsAcceptor>, router: Router) {
        let Some(acceptor) = tls else {
            return self.serve_http(TokioIo::new(stream), router).await;
        };
        let handshake = acceptor.accept(stream);
        let handshaken = tokio::select! {
            handshaken = tokio::time::timeout(self.limits.handshake_timeout, handshake) => handshaken,
            () = self.close.cancelled() => return,
        };
        match handshaken {
            Ok(Ok(tls)) => self.serve_http(TokioIo::new(tls), router).await,
            Ok(Err(error)) => {
                tracing::debug!(endpoint = %self.endpoint, peer = %self.peer, %error, "TLS handshake failed");
            }
            Err(_) => {
                tracing::debug!(endpoint = %self.endpoint, peer = %self.peer, "TLS handshake timed out");
            }
        }
    }

    async fn serve_http<I>(self, io: I, router: Router)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(self.limits.max_header_bytes)
            .max_header_size(self.limits.max_header_bytes);
        let connection = builder.serve_connection(io, TowerToHyperService::new(router));
        tokio::pin!(connection);
        let result = tokio::select! {
            result = connection.as_mut() => result,
            () = self.close.cancelled() => {
                // Closes an idle connection at once, a busy one after its request; a client
                // that will not take its answer gets as long as it had for its headers.
                connection.as_mut().graceful_shutdown();
                match tokio::time::timeout(self.limits.header_timeout, connection).await {
                    Ok(result) => result,
                    Err(_) => Ok(()),
                }
            }
        };
        if let Err(error) = result {
            // Timeouts, resets and malformed requests: the client's doing, not ours.
            tracing::debug!(endpoint = %self.endpoint, peer = %self.peer, %error, "connection ended");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// Serves `/`, answering `ok`, and `/slow`, answering after 300 ms, on loopback within
    /// `limits`.
    async fn start(limits: Limits) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let address = listener.local_addr().unwrap();
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            "slow"
        };
        let router = Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/slow", get(slow));
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve("test", listener, None, router, limits, stop.clone()));
        (address, stop, task)
    }

    /// Sends a GET of `path` on `stream` and reads the answer within `within`.
    async fn get_path(stream: &mut TcpStream, path: &str, within: Duration) -> Option<String> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut buffer = [0; 256];
        let read = tokio::time::timeout(within, stream.read(&mut buffer))
            .await
            .ok()?
            .ok()?;
        (read > 0).then(|| String::from_utf8_lossy(&buffer[..read]).into_owned())
    }

    /// The first line of the answer to a GET of `/`.
    async fn get_on(stream: &mut TcpStream, within: Duration) -> Option<String> {
        let answer = get_path(stream, "/", within).await?;
        answer.lines().next().map(str::to_owned)
    }

    /// Whether the server has closed `stream` (within 5 s).
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut rest = Vec::new();
        let read = stream.read_to_end(&mut rest);
        matches!(
            tokio::time::timeout(Duration::from_secs(5), read).await,
            Ok(Ok(_))
        )
    }

    #[tokio::test]
    async fn a_connection_past_the_limit_closes_the_oldest_after_its_request() {
        let limits = Limits {
            max_connections: 2,
            ..Limits::DEFAULT
        };
        let (address, stop, task) = start(limits).await;
        let ok = Some("HTTP/1.1 200 OK".to_owned());

        // Two idle keep-alive connections fill the endpoint; a third is served at once, and
        // the oldest is closed for it.
        let mut first = TcpStream::connect(address).await.unwrap();
        assert_eq!(get_on(&mut first, Duration::from_secs(5)).await, ok);
        let mut second = TcpStream::connect(address).await.unwrap();
        assert_eq!(get_on(&mut second, Duration::from_secs(5)).await, ok);
        let mut third = TcpStream::connect(address).await.unwrap();
        assert_eq!(get_on(&mut third, Duration::from_secs(5)).await, ok);
        assert!(closed(&mut first).await, "the oldest connection was closed");

        // The oldest is now busy: it gets its whole answer before it is closed.
        let slow = "GET /slow HTTP/1.1\r\nHost: test\r\n\r\n";
        second.write_all(slow.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut fourth = TcpStream::connect(address).await.unwrap();
        assert_eq!(get_on(&mut fourth, Duration::from_secs(5)).await, ok);
        let mut answer = Vec::new();
        let read = second.read_to_end(&mut answer);
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("closed after its answer")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("slow"),
            "{answer}"
        );

        stop.cancel();
        drop((third, fourth));
        task.await.unwrap();
    }

    /// A connection to `address` from the loopback address `source`.
    async fn connect_from(source: [u8; 4], address: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        socket.connect(address).await.unwrap()
    }

    #[tokio::test]
    async fn a_flood_from_one_peer_closes_its_own_connections_first() {
        let limits = Limits {
            max_connections: 4,
            max_connections_per_peer: 3,
            ..Limits::DEFAULT
        };
        let (address, stop, task) = start(limits).await;
        let ok = Some("HTTP/1.1 200 OK".to_owned());
        let within = Duration::from_secs(5);

        // The API server's connection, then a peer that opens more than its share.
        let mut api_server = connect_from([127, 0, 0, 1], address).await;
        assert_eq!(get_on(&mut api_server, within).await, ok);
        let mut flood = Vec::new();
        for _ in 0..3 {
            let mut stream = connect_from([127, 0, 0, 2], address).await;
            assert_eq!(get_on(&mut stream, within).await, ok);
            flood.push(stream);
        }
        // Full, and the flooding peer at its share: each new one closes its own oldest.
        for _ in 0..3 {
            let mut stream = connect_from([127, 0, 0, 2], address).await;
            assert_eq!(get_on(&mut stream, within).await, ok);
            assert!(
                closed(&mut flood.remove(0)).await,
                "the peer's oldest closed"
            );
            flood.push(stream);
        }
        // A third peer when full: the busiest peer (the flood) makes room.
        let mut third = connect_from([127, 0, 0, 3], address).await;
        assert_eq!(get_on(&mut third, within).await, ok);
        assert!(
            closed(&mut flood.remove(0)).await,
            "the busiest peer's oldest closed"
        );
        assert_eq!(
            get_on(&mut api_server, within).await,
            ok,
            "never the API server's"
        );
        for stream in &mut flood {
            assert_eq!(
                get_on(stream, within).await,
                ok,
                "one closed per new connection"
            );
        }

        stop.cancel();
        drop((api_server, flood, third));
        task.await.unwrap();
    }

    #[tokio::test]
    async fn idle_and_trickling_clients_are_disconnected() {
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            ..Limits::DEFAULT
        };
        let (address, stop, task) = start(limits).await;

        // Idle after a request: closed once the header timeout has passed.
        let mut idle = TcpStream::connect(address).await.unwrap();
        assert!(get_on(&mut idle, Duration::from_secs(5)).await.is_some());
        let started = Instant::now();
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the idle connection was closed");
        assert!(started.elapsed() >= Duration::from_millis(200));

        // Headers a byte at a time, never finished: closed as well.
        let mut slow = TcpStream::connect(address).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let trickle = async {
            loop {
                if slow.write_all(b"X").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), trickle)
            .await
            .expect("a trickling client is cut off");

        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn oversized_headers_are_refused() {
        let limits = Limits {
            max_header_bytes: 8 << 10,
            ..Limits::DEFAULT
        };
        let (address, stop, task) = start(limits).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let request = format!(
            "GET / HTTP/1.1\r\nHost: test\r\nX-Padding: {}\r\n\r\n",
            "a".repeat(16 << 10)
        );
        // The server may stop reading and answer before the whole head is sent.
        let _ = stream.write_all(request.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );
        assert!(!answer.contains("200 OK"), "{answer}");
        stop.cancel();
        task.await.unwrap();
    }
}
