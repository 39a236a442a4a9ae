//! The HTTP endpoints: `/metrics` on the metrics address, `/healthz` and `/readyz` on the
//! probe address, the admission webhooks on theirs. They run on every replica, leader or not.
//!
//! With `--metrics-secure`, `/metrics` is served over TLS ([`crate::tls`]) to scrapers whose
//! token the API server authenticates and authorizes ([`crate::metrics_auth`]); the probes stay
//! plain HTTP on their own port, as the kubelet probes them. Every endpoint is served within the
//! bounds of [`crate::serving`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{Encoder as _, Registry, TextEncoder};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::leader::LeaderStatus;
use crate::metrics_auth::{MetricsAuth, require_metrics_reader};
use crate::serving::{self, Limits};
use crate::tls::{self, ServingCert};

/// What the probes report.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    leader: Option<Arc<LeaderStatus>>,
    /// A warm standby's or a sharded replica's controllers, until whose caches have synced it
    /// is not ready.
    caches: std::sync::Mutex<Option<kube_operator_runtime::Warmth>>,
}

impl Health {
    /// Not ready yet; `/healthz` consults `leader` when leader election is on.
    pub fn new(leader: Option<Arc<LeaderStatus>>) -> Self {
        Self {
            ready: AtomicBool::new(false),
            leader,
            caches: std::sync::Mutex::default(),
        }
    }

    /// Keeps `/readyz` failing until every controller of `warmth` has synced its caches: a
    /// warm standby is ready once it could take over at once, a sharded replica once it could
    /// reconcile its share.
    pub fn wait_for_caches(&self, warmth: kube_operator_runtime::Warmth) {
        *self.caches_lock() = Some(warmth);
    }

    fn caches_lock(&self) -> std::sync::MutexGuard<'_, Option<kube_operator_runtime::Warmth>> {
        // A poisoned lock only means a panic elsewhere; the value stays valid.
        self.caches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks start-up as finished (`true`) or shutdown as started (`false`).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.not_ready().is_none()
    }

    /// Why `/readyz` does not answer 200: start-up not finished or shutdown begun, a leader
    /// Lease the API server refuses (a replica that can never lead should not look healthy
    /// while it stands by), or the caches of a warm standby or a sharded replica still filling.
    pub fn not_ready(&self) -> Option<String> {
        if !self.ready.load(Ordering::SeqCst) {
            return Some("not ready".to_owned());
        }
        if let Some(refused) = (self.leader.as_ref()).and_then(|status| status.lease_refused()) {
            return Some(refused);
        }
        let cold = self.caches_lock().as_ref().map(|w| w.cold())?;
        (!cold.is_empty()).then(|| {
            format!(
                "warming up: the caches of the controllers {} have not synced yet",
                cold.join(", ")
            )
        })
    }

    /// `None` when live, else why the process is wedged.
    pub fn wedged(&self) -> Option<String> {
        self.leader
            .as_ref()
            .and_then(|status| status.wedged(Instant::now()))
    }
}

/// Where and how `/metrics` is served.
#[derive(Debug)]
pub struct MetricsEndpoint {
    /// The address to listen on.
    pub address: SocketAddr,
    /// TLS and authorization, when served securely.
    pub secure: Option<Secure>,
}

/// What secure serving takes.
#[derive(Debug, Clone)]
pub struct Secure {
    /// The serving certificate (reloaded in the background when it comes from files).
    pub cert: Arc<ServingCert>,
    /// Checks each scraper's token.
    pub auth: Arc<MetricsAuth>,
}

/// The running endpoints; stop them with [`Servers::shutdown`].
#[derive(Debug)]
pub struct Servers {
    /// Where `/metrics` listens, when enabled (the actual port when `:0` was asked for).
    pub metrics: Option<SocketAddr>,
    /// Where the probes listen, when enabled.
    pub probes: Option<SocketAddr>,
    /// Where the admission webhooks listen, once served ([`Servers::serve_webhooks`]).
    pub webhooks: Option<SocketAddr>,
    /// Where the webhooks' metrics go.
    registry: Registry,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Servers {
    /// Binds both addresses (a disabled one is skipped) and serves in the background.
    ///
    /// # Errors
    /// [`Error::Bind`] when an address cannot be bound.
    pub async fn start(
        metrics: Option<MetricsEndpoint>,
        probes: Option<SocketAddr>,
        registry: Registry,
        health: Arc<Health>,
    ) -> Result<Self, Error> {
        let stop = CancellationToken::new();
        let mut servers = Self {
            metrics: None,
            probes: None,
            webhooks: None,
            registry: registry.clone(),
            stop: stop.clone(),
            tasks: Vec::new(),
        };
        if let Some(endpoint) = metrics {
            let router = Router::new()
                .route("/metrics", get(serve_metrics))
                .with_state(Arc::new(registry));
            let router = match &endpoint.secure {
                Some(secure) => router.route_layer(axum::middleware::from_fn_with_state(
                    secure.auth.clone(),
                    require_metrics_reader,
                )),
                None => router,
            };
            let cert = endpoint.secure.map(|secure| secure.cert);
            servers.metrics = Some(
                servers
                    .serve("metrics", endpoint.address, router, cert)
                    .await?,
            );
        }
        if let Some(address) = probes {
            let router = Router::new()
                .route("/healthz", get(serve_healthz))
                .route("/readyz", get(serve_readyz))
                .with_state(health);
            servers.probes = Some(
                servers
                    .serve("health probes", address, router, None)
                    .await?,
            );
        }
        Ok(servers)
    }

    /// Serves the admission `webhooks` over HTTPS with `cert` on `address` (see
    /// [`crate::webhooks`]), with controller-runtime's webhook metrics
    /// ([`crate::webhook_metrics`]); returns where it listens.
    ///
    /// # Errors
    /// [`Error::Bind`] when the address cannot be bound, [`Error::Tls`] when the TLS
    /// configuration is refused, [`Error::Metrics`] when the webhooks are served twice.
    pub async fn serve_webhooks(
        &mut self,
        address: SocketAddr,
        webhooks: crate::webhooks::DeclaredWebhooks,
        cert: Arc<ServingCert>,
    ) -> Result<SocketAddr, Error> {
        let metrics = crate::webhook_metrics::WebhookMetrics::register(&self.registry)?;
        let local = self
            .serve(
                "webhooks",
                address,
                crate::webhooks::router(webhooks, &metrics),
                Some(cert),
            )
            .await?;
        self.webhooks = Some(local);
        Ok(local)
    }

    /// Keeps the webhook server's provisioned certificates current until the servers stop.
    pub fn maintain_webhook_certs(&mut self, certs: crate::webhook_certs::WebhookCerts) {
        self.tasks
            .push(tokio::spawn(certs.maintain(self.stop.clone())));
    }

    async fn serve(
        &mut self,
        endpoint: &'static str,
        address: SocketAddr,
        router: Router,
        cert: Option<Arc<ServingCert>>,
    ) -> Result<SocketAddr, Error> {
        let bind_error = |source| Error::Bind {
            endpoint,
            address,
            source,
        };
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        let stop = self.stop.clone();
        let tls = match cert {
            Some(cert) => {
                tracing::info!(%endpoint, address = %local, "serving over HTTPS");
                self.tasks.extend(cert.watch(stop.clone()));
                Some(TlsAcceptor::from(tls::server_config(cert)?))
            }
            None => {
                tracing::info!(%endpoint, address = %local, "serving over HTTP");
                None
            }
        };
        self.tasks.push(tokio::spawn(serving::serve(
            endpoint,
            listener,
            tls,
            router,
            Limits::DEFAULT,
            stop,
        )));
        Ok(local)
    }

    /// Stops serving; open connections get `grace` to finish.
    pub async fn shutdown(self, grace: Duration) {
        self.stop.cancel();
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(grace, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

async fn serve_metrics(State(registry): State<Arc<Registry>>) -> Response {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => (
            [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
            body,
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode metrics: {error}\n"),
        )
            .into_response(),
    }
}

async fn serve_healthz(State(health): State<Arc<Health>>) -> Response {
    match health.wedged() {
        None => (StatusCode::OK, "ok\n").into_response(),
        Some(reason) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{reason}\n")).into_response(),
    }
}

async fn serve_readyz(State(health): State<Arc<Health>>) -> Response {
    match health.not_ready() {
        None => (StatusCode::OK, "ok\n").into_response(),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn get(address: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, response)
    }

    #[tokio::test]
    async fn probes_and_metrics() {
        let registry = crate::telemetry::registry().unwrap();
        let gauge = crate::telemetry::leader_gauge(&registry).unwrap();
        let status = Arc::new(LeaderStatus::new(
            gauge.with_label_values(&["lease"]),
            Duration::from_secs(10),
            crate::leader::LeaseRole::Leader,
        ));
        let health = Arc::new(Health::new(Some(status.clone())));
        let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
        let endpoint = MetricsEndpoint {
            address: loopback,
            secure: None,
        };
        let servers = Servers::start(Some(endpoint), Some(loopback), registry, health.clone())
            .await
            .unwrap();
        let (metrics, probes) = (servers.metrics.unwrap(), servers.probes.unwrap());

        assert_eq!(get(probes, "/healthz").await.0, 200);
        assert_eq!(get(probes, "/readyz").await.0, 503);
        health.set_ready(true);
        assert_eq!(get(probes, "/readyz").await.0, 200);
        status.set_lease_refused(Some(
            "the API server refuses the Lease: forbidden".to_owned(),
        ));
        let (code, body) = get(probes, "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("refuses the Lease: forbidden"), "{body}");
        assert_eq!(get(probes, "/healthz").await.0, 200, "alive all the same");
        status.set_lease_refused(None);
        assert_eq!(get(probes, "/readyz").await.0, 200);
        assert_eq!(get(probes, "/metrics").await.0, 404);

        // A warm standby is ready once every controller's caches have synced.
        let (_lead, standby) = kube_operator_runtime::Leadership::standby();
        let _memcached = standby.for_controller("memcached");
        let _myapp = standby.for_controller("myapp");
        health.wait_for_caches(standby.warmth());
        let (code, body) = get(probes, "/readyz").await;
        assert_eq!(code, 503);
        assert!(
            body.contains("the caches of the controllers memcached, myapp have not synced yet"),
            "{body}"
        );
        health.wait_for_caches(kube_operator_runtime::Warmth::default());
        assert_eq!(get(probes, "/readyz").await.0, 200, "every cache synced");

        let (code, body) = get(metrics, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            body.contains("leader_election_master_status{name=\"lease\"} 0"),
            "{body}"
        );
        assert!(body.contains("process_resident_memory_bytes"), "{body}");

        servers.shutdown(Duration::from_secs(1)).await;
        assert!(tokio::net::TcpStream::connect(probes).await.is_err());
    }

    #[tokio::test]
    async fn webhooks_are_served_over_tls_with_the_given_certificate() {
        use rustls::pki_types::ServerName;

        let registry = crate::telemetry::registry().unwrap();
        let mut servers = Servers::start(None, None, registry, Arc::new(Health::default()))
            .await
            .unwrap();
        let cert = ServingCert::self_signed(&["localhost".to_owned()]).unwrap();
        let webhooks =
            crate::webhooks::DeclaredWebhooks::of(&controllers::all()).expect("webhooks");
        let address = servers
            .serve_webhooks(([127, 0, 0, 1], 0).into(), webhooks, cert.clone())
            .await
            .unwrap();
        assert_eq!(servers.webhooks, Some(address));

        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.chain()[0].clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        let request = format!(
            "POST /validate-{group}-v1beta1-memcached HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len(),
            group = product::group!(cache).replace('.', "-")
        );
        tls.write_all(request.as_bytes()).await.unwrap();
        tls.write_all(body).await.unwrap();
        let mut response = Vec::new();
        // The server closes without a TLS close_notify when it shuts the connection; what
        // arrived before is the answer.
        let _ = tls.read_to_end(&mut response).await;
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 400"), "{response}");
        assert!(response.contains("has no request"), "{response}");

        servers.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn disabled_endpoints_bind_nothing() {
        let registry = crate::telemetry::registry().unwrap();
        let servers = Servers::start(None, None, registry, Arc::new(Health::default()))
            .await
            .unwrap();
        assert_eq!(
            (servers.metrics, servers.probes, servers.webhooks),
            (None, None, None)
        );
        servers.shutdown(Duration::from_secs(1)).await;
    }
}
