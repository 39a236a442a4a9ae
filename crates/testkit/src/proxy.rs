//! A loopback TCP proxy that a test can cut, to show how a client behaves when the network to
//! the API server fails (rather than the API server itself, which refuses connections when it
//! is down).

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs as _};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::config::Kubeconfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::{Error, Result};

/// A TCP proxy on 127.0.0.1 that forwards every connection to one upstream address, byte for
/// byte (TLS passes through, so clients still verify the upstream's certificate), until the
/// test cuts it.
///
/// While cut, the proxy behaves like a network that drops packets: open connections are
/// closed at once, and new ones are accepted but never answered, so clients run into their
/// timeouts instead of getting a quick "connection refused". [`TcpProxy::restore`] closes the
/// connections held during the cut and forwards new ones again.
///
/// Dropping the proxy closes its listener and every connection.
///
/// # Caveats
/// The proxy's tasks run on the runtime that started it: a test on a single-threaded runtime
/// that blocks it (say, waiting for a `kubectl` child process with
/// [`std::process::Command::output`]) stalls the proxy too; use `spawn_blocking` or a
/// multi-threaded runtime.
///
/// ```no_run
/// # async fn demo(cluster: &testkit::TestCluster) -> testkit::Result<()> {
/// let proxy = testkit::TcpProxy::start(testkit::server_addr(&cluster.state.server)?).await?;
/// let kubeconfig = std::env::temp_dir().join("via-proxy.kubeconfig");
/// testkit::kubeconfig_via(&cluster.kubeconfig, &proxy.url(), &kubeconfig)?;
/// // ... start a client with `kubeconfig` ...
/// proxy.cut().await;
/// // ... the client loses the API server ...
/// proxy.restore().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Mutex<Connections>>,
    accept: JoinHandle<()>,
}

/// The proxy's connections, and whether it is cut; one lock, so a connection is either
/// accepted before a cut (and closed by it) or after (and held).
#[derive(Debug, Default)]
struct Connections {
    cut: bool,
    /// One task per connection: forwarding when accepted while not cut, holding otherwise.
    tasks: JoinSet<()>,
}

impl TcpProxy {
    /// Listens on 127.0.0.1 at a free port and forwards to `upstream`.
    ///
    /// # Errors
    /// [`Error::Network`] when no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(Error::network("binding a loopback port for the proxy"))?;
        let addr = listener
            .local_addr()
            .map_err(Error::network("reading the proxy's address"))?;
        let shared = Arc::new(Mutex::new(Connections::default()));
        let accept = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&shared)));
        Ok(Self {
            addr,
            shared,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://` and [`TcpProxy::addr`], the server URL of a kubeconfig that goes through the
    /// proxy (see [`kubeconfig_via`]).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Closes every open connection (both sides) and holds new ones silently until
    /// [`TcpProxy::restore`]. Returns once the connections are closed, so nothing sent after
    /// this returns reaches the upstream. Cutting a cut proxy changes nothing.
    pub async fn cut(&self) {
        let mut closing = {
            let mut connections = self.lock();
            if connections.cut {
                return;
            }
            connections.cut = true;
            std::mem::take(&mut connections.tasks)
        };
        close_all(&mut closing).await;
    }

    /// Ends a cut: closes the connections held during it (their clients see the connection
    /// drop, as when a partition heals and the peer has forgotten them) and forwards new ones
    /// again. Returns once the held connections are closed. Restoring a proxy that is not cut
    /// changes nothing.
    pub async fn restore(&self) {
        let mut closing = {
            let mut connections = self.lock();
            if !connections.cut {
                return;
            }
            connections.cut = false;
            std::mem::take(&mut connections.tasks)
        };
        close_all(&mut closing).await;
    }

    /// Whether the proxy is cut.
    pub fn is_cut(&self) -> bool {
        self.lock().cut
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connections> {
        lock(&self.shared)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.lock().tasks.abort_all();
    }
}

/// A poisoned lock still holds consistent data here (a flag and a set of tasks), so it is used
/// as is rather than turned into a panic.
fn lock(shared: &Mutex<Connections>) -> std::sync::MutexGuard<'_, Connections> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Aborts every task and waits until each has been dropped, which closes its sockets.
async fn close_all(tasks: &mut JoinSet<()>) {
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Mutex<Connections>>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            // Out of file descriptors, or a connection reset before it was accepted: the
            // listener itself is fine, so try again shortly.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let mut connections = lock(&shared);
        // Forget connections that have ended, so the set does not grow with every connection.
        while connections.tasks.try_join_next().is_some() {}
        if connections.cut {
            // Accepted (the kernel has completed the handshake anyway) but never answered.
            connections.tasks.spawn(async move {
                let _held = client;
                std::future::pending::<()>().await;
            });
        } else {
            connections.tasks.spawn(forward(client, upstream));
        }
    }
}

/// Copies bytes both ways until either side closes; an upstream that cannot be reached closes
/// the client's connection.
async fn forward(mut client: TcpStream, upstream: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    // Small TLS records and HTTP/2 frames should not wait for Nagle's algorithm; failing to
    // set it only costs latency.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

/// The socket address of the API server at `server`, a kubeconfig's server URL such as
/// `https://127.0.0.1:6443` (port 443 when it has none), to point a [`TcpProxy`] at.
///
/// # Errors
/// [`Error::Network`] when the URL names no host or the host does not resolve.
pub fn server_addr(server: &str) -> Result<SocketAddr> {
    let invalid = |message: &str| Error::Network {
        action: format!("finding the address of the API server {server}"),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, message.to_owned()),
    };
    let (scheme, rest) = server
        .split_once("://")
        .ok_or_else(|| invalid("not a URL"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // Userinfo never belongs in a server URL, but would otherwise be taken for the host.
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    if host_port.is_empty() {
        return Err(invalid("no host"));
    }
    let has_port = match host_port.rsplit_once(':') {
        // An IPv6 literal without a port ends in `]`.
        Some((_, port)) => !port.contains(']'),
        None => false,
    };
    let with_port = if has_port {
        host_port.to_owned()
    } else {
        let port = if scheme.eq_ignore_ascii_case("http") {
            80
        } else {
            443
        };
        format!("{host_port}:{port}")
    };
    with_port
        .to_socket_addrs()
        .map_err(|source| Error::Network {
            action: format!("finding the address of the API server {server}"),
            source,
        })?
        .next()
        .ok_or_else(|| invalid("the host has no address"))
}

/// Writes a copy of the kubeconfig `original` to `out` with every cluster's server URL set to
/// `server` (say, [`TcpProxy::url`]), so a client using it goes through a proxy.
///
/// Everything else is kept, certificates included: the local API server's certificate covers
/// 127.0.0.1, so TLS through a proxy on loopback still verifies. Relative file references are
/// made absolute, so `out` may live anywhere.
///
/// # Errors
/// [`Error::Kubeconfig`] when `original` cannot be read or parsed; [`Error::Io`] when `out`
/// cannot be written.
pub fn kubeconfig_via(original: &Path, server: &str, out: &Path) -> Result<()> {
    let invalid = |message: String| Error::Kubeconfig {
        path: original.to_owned(),
        message,
    };
    let mut config = Kubeconfig::read_from(original).map_err(|e| invalid(e.to_string()))?;
    if config.clusters.is_empty() {
        return Err(invalid("it has no clusters".to_owned()));
    }
    for named in &mut config.clusters {
        named.cluster.get_or_insert_with(Default::default).server = Some(server.to_owned());
    }
    let yaml = yaml_serde::to_string(&config).map_err(|e| invalid(e.to_string()))?;
    std::fs::write(out, yaml).map_err(Error::io("writing", out))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    const QUIET: Duration = Duration::from_millis(300);
    const ANSWER: Duration = Duration::from_secs(5);

    /// An echo server: writes back whatever each connection sends.
    async fn echo_server() -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                connections.spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        (addr, task)
    }

    /// Sends `message` and reads its echo.
    async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(message).await?;
        let mut echo = vec![0; message.len()];
        stream.read_exact(&mut echo).await?;
        Ok(echo)
    }

    /// Whether the stream ends (EOF or an error) within [`ANSWER`].
    async fn ends(stream: &mut TcpStream) -> bool {
        let mut buf = [0; 16];
        matches!(
            tokio::time::timeout(ANSWER, stream.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn forwards_cuts_holds_and_restores() {
        let (upstream, _echo) = echo_server().await;
        let proxy = TcpProxy::start(upstream).await.expect("proxy");
        assert!(proxy.addr().ip().is_loopback());
        assert_ne!(proxy.addr(), upstream);

        let mut before = TcpStream::connect(proxy.addr()).await.expect("connect");
        let echo = tokio::time::timeout(ANSWER, round_trip(&mut before, b"hello"))
            .await
            .expect("answered")
            .expect("echo");
        assert_eq!(echo, b"hello");

        proxy.cut().await;
        assert!(proxy.is_cut());
        assert!(ends(&mut before).await, "the cut left a connection open");

        // Accepted, but silent: no answer, no close.
        let mut during = TcpStream::connect(proxy.addr()).await.expect("connect");
        during.write_all(b"anyone?").await.expect("write");
        let mut buf = [0; 16];
        assert!(
            tokio::time::timeout(QUIET, during.read(&mut buf))
                .await
                .is_err(),
            "a connection made during the cut was answered or closed"
        );

        proxy.restore().await;
        assert!(!proxy.is_cut());
        assert!(
            ends(&mut during).await,
            "restore left a held connection open"
        );

        let mut after = TcpStream::connect(proxy.addr()).await.expect("connect");
        let echo = tokio::time::timeout(ANSWER, round_trip(&mut after, b"again"))
            .await
            .expect("answered")
            .expect("echo");
        assert_eq!(echo, b"again");
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_its_connections_and_listener() {
        let (upstream, _echo) = echo_server().await;
        let proxy = TcpProxy::start(upstream).await.expect("proxy");
        let addr = proxy.addr();
        let mut open = TcpStream::connect(addr).await.expect("connect");
        round_trip(&mut open, b"x").await.expect("echo");
        drop(proxy);
        assert!(ends(&mut open).await, "a connection outlived the proxy");
        let refused = tokio::time::timeout(ANSWER, async {
            loop {
                if TcpStream::connect(addr).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(refused.is_ok(), "the listener outlived the proxy");
    }

    #[tokio::test]
    async fn an_unreachable_upstream_closes_the_client() {
        // A port that was free a moment ago: nothing listens there.
        let free = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let upstream = free.local_addr().expect("addr");
        drop(free);
        let proxy = TcpProxy::start(upstream).await.expect("proxy");
        let mut client = TcpStream::connect(proxy.addr()).await.expect("connect");
        assert!(ends(&mut client).await);
    }

    #[test]
    fn server_addresses_from_urls() {
        let addr = |url| server_addr(url).expect(url);
        assert_eq!(
            addr("https://127.0.0.1:6443"),
            "127.0.0.1:6443".parse().expect("addr")
        );
        assert_eq!(
            addr("https://127.0.0.1:6443/"),
            "127.0.0.1:6443".parse().expect("addr")
        );
        assert_eq!(
            addr("https://127.0.0.1"),
            "127.0.0.1:443".parse().expect("addr")
        );
        assert_eq!(
            addr("https://[::1]:8443"),
            "[::1]:8443".parse().expect("addr")
        );
        assert_eq!(addr("https://[::1]"), "[::1]:443".parse().expect("addr"));
        assert!(server_addr("127.0.0.1:6443").is_err());
        assert!(server_addr("https://").is_err());
    }

    #[test]
    fn kubeconfig_via_replaces_only_the_server() {
        let dir = std::env::temp_dir().join(crate::unique_name("kubeconfig-via"));
        std::fs::create_dir_all(&dir).expect("dir");
        let original = dir.join("admin.kubeconfig");
        std::fs::write(
            &original,
            "\
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: pki/ca.crt
    certificate-authority-data: Q0EgREFUQQ==
    tls-server-name: kubernetes
    x-unmodelled: kept
users:
- name: admin
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
contexts:
- name: local
  context:
    cluster: local
    user: admin
    namespace: demo
current-context: local
",
        )
        .expect("write");
        let out = dir.join("via.kubeconfig");
        kubeconfig_via(&original, "https://127.0.0.1:40000", &out).expect("kubeconfig_via");

        let copy = Kubeconfig::read_from(&out).expect("copy parses");
        let was = Kubeconfig::read_from(&original).expect("original parses");
        let cluster = copy.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:40000"));
        let ca = dir.join("pki/ca.crt");
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some(ca.to_string_lossy().as_ref())
        );
        assert_eq!(
            cluster.certificate_authority_data.as_deref(),
            Some("Q0EgREFUQQ==")
        );
        assert_eq!(cluster.tls_server_name.as_deref(), Some("kubernetes"));
        assert_eq!(cluster.other["x-unmodelled"], "kept");
        let user = copy.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(user.client_certificate_data.as_deref(), Some("Q0VSVA=="));
        // Secret data is written out, not redacted.
        let text = std::fs::read_to_string(&out).expect("read");
        assert!(text.contains("S0VZ"), "{text}");
        assert_eq!(copy.current_context.as_deref(), Some("local"));
        assert_eq!(copy.contexts.len(), was.contexts.len());
        let context = copy.contexts[0].context.as_ref().expect("context");
        assert_eq!(context.namespace.as_deref(), Some("demo"));

        assert!(kubeconfig_via(&dir.join("missing"), "https://x", &out).is_err());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
