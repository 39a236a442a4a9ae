//! The lifecycle: start in a fixed order, run controllers only while leading, shut down in
//! reverse.
//!
//! Start: signal handlers, metrics registry, HTTP endpoints, cluster connection, the webhook
//! server (readiness turns on once it serves), leader election, controllers. Stop on
//! SIGTERM/SIGINT: readiness turns off, controllers finish in-flight reconciles (bounded by
//! the shutdown timeout, then aborted) while the Lease is still renewed, the fence closes to new
//! writes, and the Lease is released once every controller task has returned and every write
//! in flight has been answered (at most [`WRITE_DRAIN`], then the rest are abandoned), the
//! webhooks keep answering until [`WEBHOOK_DRAIN`]
//! after the signal, the HTTP endpoints close; exit 0. A second signal exits at once with
//! status 1.
//! Lost leadership aborts the controllers at once (a standby may lead already) and, like a
//! failed controller, ends the process with status 1.
//!
//! The controllers' client carries the write fence ([`crate::fence`]); every request of the
//! process names the manager's version and leader identity in its user agent.

use std::sync::Arc;
use std::time::Duration;

use kube_operator_runtime::{ManagedController, RunOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client_metrics::RequestMetrics;
use crate::config::Config;
use crate::duties::{self, Duty};
use crate::fence::WriteFence;
use crate::leader::{self, LeaderElector, LeaderStatus, LeadershipEnd, LeaseRole, Settings};
use crate::leader_thread::ElectorThread;
use crate::metrics_auth::MetricsAuth;
use crate::server::{Health, MetricsEndpoint, Secure, Servers};
use crate::sharding::{self, ShardCoordinator, ShardMetrics, ShardSettings};
use crate::tls::{CertFiles, ServingCert};
use crate::webhook_certs::{CertSettings, InjectionTargets, WebhookCerts, service_names};
use crate::webhooks::DeclaredWebhooks;
use crate::{Error, telemetry};

/// How long HTTP connections get to finish once the manager stops.
const HTTP_GRACE: Duration = Duration::from_secs(1);

/// How long the webhook server keeps answering after shutdown starts (readiness is off by
/// then), so requests still routed to this pod are answered rather than refused.
pub const WEBHOOK_DRAIN: Duration = Duration::from_secs(5);

/// How long releasing the Lease may take, retries included.
const RELEASE_BUDGET: Duration = Duration::from_secs(5);

/// How long the controllers' writes in flight get to be answered at shutdown, after the
/// controllers have stopped or were aborted, before those left are abandoned and the Lease is
/// released.
pub const WRITE_DRAIN: Duration = Duration::from_secs(3);

/// Runs the manager until a signal (`Ok`) or a failure (`Err`).
///
/// # Errors
/// See [`Error`]; every variant but [`Error::Config`] can come from here.
pub async fn run(
    config: Config,
    controllers: Vec<Box<dyn ManagedController>>,
    webhooks: DeclaredWebhooks,
) -> Result<(), Error> {
    let shutdown = install_signal_handlers()?;
    log_configuration(&config, &controllers);

    let registry = telemetry::registry()?;
    let metrics = Arc::new(kube_operator_runtime::Metrics::register(&registry)?);
    let cert_reads = crate::tls::CertReads::register(&registry)?;
    let identity = leader::default_identity();
    let fence = if config.sharding {
        // A sharded replica's writes are fenced by its member Lease.
        let member = sharding::member_lease_name(&config.leader_election_id, &identity);
        let gauge = telemetry::shard_member_gauge(&registry)?;
        let status = Arc::new(LeaderStatus::new(
            gauge,
            config.renew_deadline,
            LeaseRole::Member,
        ));
        let fenced = telemetry::fenced_writes(&registry)?.with_label_values(&[member.as_str()]);
        Some(WriteFence::new(status, fenced))
    } else if config.leader_elect {
        let lease = [config.leader_election_id.as_str()];
        let gauge = telemetry::leader_gauge(&registry)?.with_label_values(&lease);
        let status = Arc::new(LeaderStatus::new(
            gauge,
            config.renew_deadline,
            LeaseRole::Leader,
        ));
        let fenced = telemetry::fenced_writes(&registry)?.with_label_values(&lease);
        Some(WriteFence::new(status, fenced))
    } else {
        None
    };
    let health = Arc::new(Health::new(fence.as_ref().map(|f| f.status().clone())));
    // A bad certificate directory is reported before anything else can fail.
    let cert = match config.metrics_bind_address.socket_addr() {
        Some(_) if config.metrics_secure => Some(serving_cert(&config, &cert_reads)?),
        _ => None,
    };
    // Without a certificate of its own, the metrics endpoint serves the provisioned webhook
    // certificate once there is one (it carries the metrics Service's names), which scrapers
    // verify with the Secret's `ca.crt`; until then, and without webhooks, a self-signed one.
    let metrics_cert = cert.clone().filter(|_| config.metrics_cert_path.is_none());
    let webhook_files = match (
        config.webhook_bind_address.socket_addr(),
        &config.webhook_cert_path,
    ) {
        (Some(_), Some(dir)) if !webhooks.is_empty() => Some(ServingCert::from_files(
            &CertFiles::in_dir(dir, &config.webhook_cert_name, &config.webhook_cert_key),
            &cert_reads,
        )?),
        _ => None,
    };
    let sharded = if config.sharding {
        let lease = duties::lease_name(&config.leader_election_id);
        let gauge = telemetry::leader_gauge(&registry)?.with_label_values(&[lease.as_str()]);
        Some(Sharded {
            metrics: ShardMetrics::register(&registry)?,
            duties: Arc::new(LeaderStatus::new(
                gauge,
                config.renew_deadline,
                LeaseRole::Duties,
            )),
        })
    } else {
        None
    };
    let connection = Connection::new(&identity, &registry).await?;
    // Scrapers' tokens are reviewed on a client of their own: a flood of them queues there,
    // not in front of the controllers' requests.
    let reviews_client = kube::client::ClientBuilder::try_from(connection.config.clone())
        .map_err(Error::Client)?
        .with_layer(&connection.requests)
        .build();
    let metrics_endpoint =
        config
            .metrics_bind_address
            .socket_addr()
            .map(|address| MetricsEndpoint {
                address,
                secure: cert.map(|cert| Secure {
                    cert,
                    auth: Arc::new(MetricsAuth::new(reviews_client)),
                }),
            });
    let mut servers = Servers::start(
        metrics_endpoint,
        config.health_probe_bind_address.socket_addr(),
        registry.clone(),
        health.clone(),
    )
    .await?;
    // When shutdown started, for the webhooks' drain.
    let shutdown_started = Arc::new(std::sync::OnceLock::new());
    {
        // Readiness drops the moment shutdown starts.
        let (health, shutdown) = (health.clone(), shutdown.clone());
        let started = shutdown_started.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            let _ = started.set(tokio::time::Instant::now());
            health.set_ready(false);
        });
    }

    let webhooks = Webhooks {
        list: webhooks,
        files: webhook_files,
        metrics: metrics_cert,
    };
    let result = run_connected(
        &config,
        identity,
        connection,
        controllers,
        webhooks,
        &mut servers,
        metrics,
        fence.clone(),
        sharded,
        &health,
        &shutdown,
    )
    .await;
    if let Some(fence) = fence.filter(|f| f.refused() > 0) {
        let refused = fence.refused();
        match fence.status().role() {
            LeaseRole::Member => tracing::warn!(
                refused,
                "the shard-membership fence refused controller writes while this replica could not be sure it held its member Lease"
            ),
            LeaseRole::Leader | LeaseRole::Duties => tracing::warn!(
                refused,
                "the leader-election fence refused controller writes while this replica could not be sure it led"
            ),
        }
    }
    health.set_ready(false);
    if let Some(address) = servers.webhooks {
        // The Service's endpoints follow readiness only as fast as the endpoint controller and
        // every node's proxy do: until then the API server may still be sent here, and a closed
        // port fails its admission requests. The controllers' shutdown counts towards it.
        let started = *shutdown_started.get_or_init(tokio::time::Instant::now);
        tracing::info!(%address, drain = ?WEBHOOK_DRAIN, "still answering webhooks while the endpoints catch up");
        tokio::time::sleep_until(started + WEBHOOK_DRAIN).await;
    }
    servers.shutdown(HTTP_GRACE).await;
    match &result {
        Ok(()) => tracing::info!("stopped"),
        Err(error) => tracing::error!(error = %error.report(), "stopped with an error"),
    }
    result
}

/// The admission webhooks to serve, and their certificate from `--webhook-cert-path` (none
/// when the manager provisions its own, or serves no webhooks).
struct Webhooks {
    list: DeclaredWebhooks,
    files: Option<Arc<ServingCert>>,
    /// The secure metrics' certificate, to serve the provisioned one with (none when the
    /// metrics have a certificate of their own, or are not secure).
    metrics: Option<Arc<ServingCert>>,
}

/// What a sharded replica holds beside its member Lease's fence.
struct Sharded {
    metrics: ShardMetrics,
    /// Whether it holds the cluster-wide duties ([`duties`]).
    duties: Arc<LeaderStatus>,
}

/// The election for the cluster-wide duties, running until `stop`.
struct DutiesElection {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl DutiesElection {
    /// Ends the election, releasing the Lease if held.
    async fn finish(election: Option<Self>) {
        if let Some(Self { stop, task }) = election {
            stop.cancel();
            if let Err(error) = task.await {
                tracing::warn!(%error, "the election for the cluster-wide duties failed");
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_connected(
    config: &Config,
    identity: String,
    connection: Connection,
    controllers: Vec<Box<dyn ManagedController>>,
    webhooks: Webhooks,
    servers: &mut Servers,
    metrics: Arc<kube_operator_runtime::Metrics>,
    fence: Option<WriteFence>,
    sharded: Option<Sharded>,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let Connection {
        client,
        config: client_config,
        requests,
    } = connection;
    if !wait_for_api_server(&client, shutdown).await {
        return Ok(());
    }
    let namespace = own_namespace(config, &client);
    // A sharded group's cluster-wide duties (the webhook certificates) have one writer, elected
    // among the replicas; without sharding, any replica writes and resourceVersions settle it.
    let duties = sharded.as_ref().map(|sharded| {
        let settings = Settings {
            role: LeaseRole::Duties,
            lease_name: duties::lease_name(&config.leader_election_id),
            namespace: namespace.clone(),
            identity: identity.clone(),
            lease_duration: config.lease_duration,
            renew_deadline: config.renew_deadline,
            retry_period: config.retry_period,
        };
        let stop = shutdown.child_token();
        let task = tokio::spawn(duties::elect(
            client.clone(),
            settings,
            sharded.duties.clone(),
            stop.clone(),
        ));
        DutiesElection { stop, task }
    });
    let duty = sharded.as_ref().map_or(Duty::Anyone, |sharded| {
        Duty::Elected(sharded.duties.clone())
    });
    match config.webhook_bind_address.socket_addr() {
        Some(_) if webhooks.list.is_empty() => {
            tracing::info!("no controller declares a webhook: no webhook server");
        }
        Some(address) => {
            let cert = match webhooks.files {
                Some(cert) => cert,
                None => {
                    let also_metrics = webhooks.metrics.is_some();
                    let settings =
                        webhook_cert_settings(config, &namespace, &webhooks.list, also_metrics);
                    let provisioned = tokio::select! {
                        () = shutdown.cancelled() => {
                            DutiesElection::finish(duties).await;
                            return Ok(());
                        }
                        provisioned = WebhookCerts::provision_as(client.clone(), settings, duty) => provisioned,
                    };
                    let mut certs = provisioned?;
                    if let Some(metrics) = webhooks.metrics {
                        certs.serve_also(metrics);
                        tracing::info!("serving the secure metrics with the webhook certificate");
                    }
                    let cert = certs.serving();
                    servers.maintain_webhook_certs(certs);
                    cert
                }
            };
            servers.serve_webhooks(address, webhooks.list, cert).await?;
        }
        None => {}
    }
    let leadership = kube_operator_runtime::Leadership::always();
    if config.sharding {
        // A sharded replica is ready once its caches have synced: a rolling update then stops
        // the next old replica only when this one could reconcile its share at once.
        let warmth = leadership.warmth();
        warmth.expect(controllers.iter().map(|c| c.name()));
        health.wait_for_caches(warmth);
    }
    health.set_ready(!shutdown.is_cancelled());
    let options = RunOptions {
        max_concurrent_reconciles: config.max_concurrent_reconciles,
        instance: identity.clone(),
        debounce: config.reconcile_debounce,
        namespaces: kube_operator_runtime::Namespaces::only(config.namespace.0.iter().cloned()),
        reconcile_timeout: Some(config.reconcile_timeout).filter(|t| !t.is_zero()),
        // A warm standby's run is handed its own (`Runner::run_elected`), as is a sharded
        // one its shards (`Runner::run_sharded`).
        leadership,
        shards: None,
        wait_for_own_writes: config.wait_for_own_writes,
    };
    let mut runner = Runner {
        client: client.clone(),
        controllers,
        options,
        metrics,
        shutdown_timeout: config.shutdown_timeout,
    };

    let Some(fence) = fence else {
        return runner.run_unelected(shutdown).await;
    };
    // Leader election's Events about the Lease come from a user agent of their own: like the
    // Lease writes, they are the elector's bookkeeping, and "stopped leading" is sent after
    // leadership ended; an audit of the controllers' writes tells them apart this way.
    let mut events_config = client_config.clone();
    events_config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    let agent = http::HeaderValue::try_from(leader_election_user_agent(&identity))
        .map_err(|e| Error::Client(kube::Error::HttpError(e.into())))?;
    events_config
        .headers
        .push((http::header::USER_AGENT, agent));
    let events_client = kube::client::ClientBuilder::try_from(events_config)
        .map_err(Error::Client)?
        .with_layer(&requests)
        .build();
    let elector_config = client_config.clone();
    runner.client = kube::client::ClientBuilder::try_from(client_config)
        .map_err(Error::Client)?
        .with_layer(&requests)
        .with_layer(&fence)
        .build();
    if let Some(sharded) = sharded {
        // Renewed on a thread of its own, as the leader Lease is.
        let member = Settings {
            role: LeaseRole::Member,
            lease_name: sharding::member_lease_name(&config.leader_election_id, &identity),
            namespace: namespace.clone(),
            identity: identity.clone(),
            lease_duration: config.lease_duration,
            renew_deadline: config.renew_deadline,
            retry_period: config.retry_period,
        };
        let status = fence.status().clone();
        let elector = ElectorThread::start(move || {
            let client = kube::client::ClientBuilder::try_from(elector_config)
                .map_err(Error::Client)?
                .with_layer(&requests)
                .build();
            Ok(LeaderElector::new(client, member, status))
        })?;
        let settings = ShardSettings {
            group: config.leader_election_id.clone(),
            namespace,
            identity,
            lease_duration: config.lease_duration,
            retry_period: config.retry_period,
        };
        let result = runner
            .run_sharded(elector, &fence, settings, sharded.metrics, shutdown)
            .await;
        DutiesElection::finish(duties).await;
        return result;
    }
    let settings = Settings {
        role: LeaseRole::Leader,
        lease_name: config.leader_election_id.clone(),
        namespace,
        identity,
        lease_duration: config.lease_duration,
        renew_deadline: config.renew_deadline,
        retry_period: config.retry_period,
    };
    let (events, publisher) = kube_operator_runtime::events::Events::start(
        events_client,
        "leader-election",
        &settings.identity,
    );
    // The Lease is renewed on a thread of its own, with a client of its own (the same
    // configuration and user agent as `client`), so no load on this runtime can delay it.
    let status = fence.status().clone();
    let elector = ElectorThread::start(move || {
        let client = kube::client::ClientBuilder::try_from(elector_config)
            .map_err(Error::Client)?
            .with_layer(&requests)
            .build();
        Ok(LeaderElector::new(client, settings, status).with_events(events))
    })?;
    let result = runner
        .run_elected(
            elector,
            &fence,
            config.warm_standby.then_some(config.lease_duration),
            health,
            shutdown,
        )
        .await;
    publisher
        .finish(kube_operator_runtime::events::EVENTS_FLUSH)
        .await;
    result
}

/// The manager's own namespace, where its Lease and webhook certificates live:
/// `leader_election_namespace`, else `$POD_NAMESPACE`, else the client's default namespace.
fn own_namespace(config: &Config, client: &kube::Client) -> String {
    config
        .leader_election_namespace
        .clone()
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|ns| !ns.trim().is_empty())
        })
        .unwrap_or_else(|| client.default_namespace().to_owned())
}

/// Where the provisioned webhook certificates live, what they name, and which configurations
/// get their CA: those named in the generated manifests, for the kinds of webhook declared.
fn webhook_cert_settings(
    config: &Config,
    namespace: &str,
    webhooks: &DeclaredWebhooks,
    also_metrics: bool,
) -> CertSettings {
    use kube_operator_runtime::webhook::AdmissionKind;
    use product::{
        METRICS_SERVICE, MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION, WEBHOOK_CERT_SECRET,
        WEBHOOK_SERVICE,
    };
    let mut names = service_names(WEBHOOK_SERVICE, namespace);
    if also_metrics {
        for name in service_names(METRICS_SERVICE, namespace) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    let declares = |kind: AdmissionKind| webhooks.admission.iter().any(|hook| hook.kind == kind);
    let named = |kind: AdmissionKind, name: &str| {
        if declares(kind) {
            vec![name.to_owned()]
        } else {
            Vec::new()
        }
    };
    CertSettings {
        secret_name: WEBHOOK_CERT_SECRET.to_owned(),
        namespace: namespace.to_owned(),
        names,
        validity: config.webhook_cert_validity,
        targets: InjectionTargets {
            mutating: named(AdmissionKind::Defaulting, MUTATING_CONFIGURATION),
            validating: named(AdmissionKind::Validating, VALIDATING_CONFIGURATION),
            crds: webhooks
                .conversions
                .iter()
                .map(|conversion| conversion.crd_name.clone())
                .collect(),
        },
    }
}

/// The user agent of leader election's Events: `<product>-leader-election/<version>
/// (<identity>)`.
pub fn leader_election_user_agent(identity: &str) -> String {
    format!(
        "{}-leader-election/{}",
        product::NAME,
        user_agent(identity).trim_start_matches(concat!(product::name!(), "/"))
    )
}

/// The user agent of every request: `<product>/<version> (<identity>)`, so the API
/// server's audit log attributes each request to a replica. Characters a header cannot carry
/// become `_`.
pub fn user_agent(identity: &str) -> String {
    let identity: String = identity
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    format!(
        "{}/{} ({identity})",
        product::NAME,
        env!("CARGO_PKG_VERSION")
    )
}

/// The certificate secure metrics are served with: from `metrics_cert_path`'s files (their
/// reads counted in `reads`), or self-signed for this host.
fn serving_cert(config: &Config, reads: &crate::tls::CertReads) -> Result<Arc<ServingCert>, Error> {
    match &config.metrics_cert_path {
        Some(dir) => ServingCert::from_files(
            &CertFiles::in_dir(dir, &config.metrics_cert_name, &config.metrics_cert_key),
            reads,
        ),
        None => {
            let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
            if let Some(host) = hostname::get().ok().and_then(|h| h.into_string().ok()) {
                names.push(host);
            }
            ServingCert::self_signed(&names)
        }
    }
}

/// The manager's client, configured the way kubectl finds a cluster (in-cluster service
/// account, else `KUBECONFIG`, else `~/.kube/config`), with its identity in the user agent and
/// every request counted in `registry`. Nothing is sent yet.
struct Connection {
    client: kube::Client,
    config: kube::Config,
    requests: RequestMetrics,
}

impl Connection {
    async fn new(identity: &str, registry: &prometheus::Registry) -> Result<Self, Error> {
        let mut config = kube::Config::infer()
            .await
            .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?;
        let agent = http::HeaderValue::try_from(user_agent(identity))
            .map_err(|e| Error::Client(kube::Error::HttpError(e.into())))?;
        config.headers.push((http::header::USER_AGENT, agent));
        let requests =
            RequestMetrics::register(registry, &RequestMetrics::host_of(&config.cluster_url))?;
        let client = kube::client::ClientBuilder::try_from(config.clone())
            .map_err(Error::Client)?
            .with_layer(&requests)
            .build();
        Ok(Self {
            client,
            config,
            requests,
        })
    }
}

/// Waits until the API server answers `client`; `false` when shutdown came first.
async fn wait_for_api_server(client: &kube::Client, shutdown: &CancellationToken) -> bool {
    let mut delay = Duration::from_millis(250);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
            Ok(Ok(info)) => {
                tracing::info!(version = %info.git_version, namespace = %client.default_namespace(), "connected to the API server");
                return true;
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "the API server is not reachable yet; retrying")
            }
            Err(_) => tracing::warn!("the API server did not answer within 10s; retrying"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

type ControllersTask = JoinHandle<Result<(), kube_operator_runtime::Error>>;

/// A replica waiting for the Lease: with its controllers started and reconciling nothing
/// until [`kube_operator_runtime::Lead::start`], or not started yet.
enum Standby {
    /// The controllers running, the switch that lets them reconcile, and the lease duration.
    Warm(
        (ControllersTask, Duration),
        kube_operator_runtime::Lead,
        Duration,
    ),
    Cold(Box<Runner>),
}

/// What it takes to start the controllers.
struct Runner {
    client: kube::Client,
    controllers: Vec<Box<dyn ManagedController>>,
    options: RunOptions,
    metrics: Arc<kube_operator_runtime::Metrics>,
    shutdown_timeout: Duration,
}

impl Runner {
    fn start(self, stop: CancellationToken) -> (ControllersTask, Duration) {
        let names: Vec<&str> = self.controllers.iter().map(|c| c.name()).collect();
        tracing::info!(controllers = ?names, "starting controllers");
        let task = tokio::spawn(kube_operator_runtime::run(
            self.client,
            self.controllers,
            self.options,
            self.metrics,
            stop,
        ));
        (task, self.shutdown_timeout)
    }

    /// Without leader election: controllers run from now until shutdown.
    async fn run_unelected(self, shutdown: &CancellationToken) -> Result<(), Error> {
        let stop = CancellationToken::new();
        let (mut task, timeout) = self.start(stop.clone());
        tokio::select! {
            () = shutdown.cancelled() => {
                stop.cancel();
                stop_controllers(&mut task, timeout).await
            }
            joined = &mut task => {
                flatten(joined)?;
                tracing::info!("controllers returned; waiting for shutdown");
                shutdown.cancelled().await;
                Ok(())
            }
        }
    }

    /// With leader election: stand by until the Lease is won, run the controllers while it is
    /// held, keep renewing it while they drain at shutdown, and release it once they and their
    /// writes are gone.
    async fn run_elected(
        mut self,
        mut elector: ElectorThread,
        fence: &WriteFence,
        warm_standby: Option<Duration>,
        health: &Health,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let stop = CancellationToken::new();
        // A warm standby starts its controllers now: their caches fill and follow every change
        // while it waits, and nothing is reconciled until it leads.
        let mut standby = if let Some(lease_duration) = warm_standby {
            let (lead, leadership) = kube_operator_runtime::Leadership::standby();
            let warmth = leadership.warmth();
            // Cold from now, not from when the spawned run is first polled: never ready between.
            warmth.expect(self.controllers.iter().map(|c| c.name()));
            health.wait_for_caches(warmth);
            self.options.leadership = leadership;
            tracing::info!("standing by with the controllers' caches warm");
            Standby::Warm(self.start(stop.clone()), lead, lease_duration)
        } else {
            Standby::Cold(Box::new(self))
        };
        // `Some` once the controllers have returned (none to run) while standing by.
        let mut returned = None;
        let acquired = match &mut standby {
            Standby::Cold(_) => elector.acquire(shutdown).await,
            Standby::Warm((task, _), _, _) => tokio::select! {
                acquired = elector.acquire(shutdown) => acquired,
                joined = task => {
                    if let Err(error) = flatten(joined) {
                        // The controllers failed before leading (a watch refused, say).
                        elector.release(RELEASE_BUDGET, None).await;
                        return Err(error);
                    }
                    returned = Some(Ok(()));
                    elector.acquire(shutdown).await
                }
            },
        };
        let acquired = match acquired {
            Some(acquired) if !shutdown.is_cancelled() => acquired,
            _ => {
                // An attempt cut short by the signal may have taken the Lease: release finds
                // out.
                tracing::info!("shutdown before leading");
                if let (Standby::Warm((mut task, timeout), _, _), None) = (standby, &returned) {
                    stop.cancel();
                    stop_controllers(&mut task, timeout).await?;
                }
                elector.release(RELEASE_BUDGET, None).await;
                return Ok(());
            }
        };
        let (mut task, timeout) = match standby {
            Standby::Warm(started, lead, lease_duration) => {
                tracing::info!("leading: the warm controllers start reconciling");
                // Whoever led before renewed its Lease until a lease duration ago at the
                // latest, and worked through what it had queued then for a while: what it
                // settled before two lease durations ago is left to the resync. What it had in
                // hand until it was last seen acting is checked after what changes from now on.
                lead.take_over(kube_operator_runtime::Takeover {
                    settled_before: std::time::Instant::now().checked_sub(lease_duration * 2),
                    acted_until: acquired.previous_acted_until,
                });
                started
            }
            Standby::Cold(runner) => runner.start(stop.clone()),
        };
        let end = loop {
            tokio::select! {
                end = elector.hold(shutdown) => break end,
                joined = &mut task, if returned.is_none() => {
                    let result = flatten(joined);
                    if result.is_err() {
                        // The controllers failed: hand over to a standby as soon as their
                        // writes are answered.
                        stop.cancel();
                        returned = Some(result);
                        break LeadershipEnd::Stopped;
                    }
                    tracing::info!("controllers returned; holding the lease until shutdown");
                    returned = Some(result);
                }
            }
        };
        stop.cancel();
        // From here no reconcile starts: the Lease's release says so to the next leader.
        let stopped_acting = k8s_openapi::jiff::Timestamp::now();
        if let LeadershipEnd::Lost(reason) = end {
            // A standby may lead already, and the fence is closed: stop everything now.
            abort_controllers(task).await;
            return Err(Error::LeadershipLost(reason));
        }
        if returned.is_none() {
            tracing::info!("shutting down: stopping controllers while renewing the lease");
        }
        // Renew while the controllers stop and their writes are answered: until the Lease is
        // released, this replica is the one that may write.
        let stopping = async {
            match returned {
                Some(result) => result,
                None => stop_controllers(&mut task, timeout).await,
            }
        };
        match drain_and_release(&mut elector, fence, stopping, Some(stopped_acting)).await {
            Ok(result) => result,
            Err(end) => {
                abort_controllers(task).await;
                Err(lost_while_draining(end))
            }
        }
    }

    /// Sharded: join the group with a member Lease, reconcile the slots the coordinator takes,
    /// and at shutdown let go of them (their reconciles ended) before the controllers stop and
    /// the member Lease is released.
    async fn run_sharded(
        mut self,
        mut elector: ElectorThread,
        fence: &WriteFence,
        settings: ShardSettings,
        metrics: ShardMetrics,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        if elector.acquire(shutdown).await.is_none() || shutdown.is_cancelled() {
            tracing::info!("shutdown before joining the shard group");
            elector.release(RELEASE_BUDGET, None).await;
            return Ok(());
        }
        let (control, shards) = kube_operator_runtime::Shards::new();
        self.options.shards = Some(shards);
        let coordinator = ShardCoordinator::new(self.client.clone(), settings, control, metrics);
        let stop = CancellationToken::new();
        let leaving = CancellationToken::new();
        tracing::info!("joined the shard group: the controllers reconcile the slots it takes");
        let (mut task, timeout) = self.start(stop.clone());
        let mut coordinating = tokio::spawn(coordinator.run(leaving.clone()));
        let mut returned = None;
        let end = loop {
            tokio::select! {
                end = elector.hold(shutdown) => break end,
                joined = &mut task, if returned.is_none() => {
                    let result = flatten(joined);
                    let failed = result.is_err();
                    returned = Some(result);
                    if failed {
                        break LeadershipEnd::Stopped;
                    }
                    tracing::info!("controllers returned; holding the member lease until shutdown");
                }
                ended = &mut coordinating => {
                    let error = match ended {
                        Ok(Ok(())) => Error::Sharding("the coordinator stopped".to_owned()),
                        Ok(Err(error)) => error,
                        Err(panic) => Error::Sharding(format!("the coordinator failed: {panic}")),
                    };
                    abort_controllers(task).await;
                    elector.release(RELEASE_BUDGET, None).await;
                    return Err(error);
                }
            }
        };
        if let LeadershipEnd::Lost(reason) = end {
            // Others take this replica's slots once its member Lease expires: stop now.
            coordinating.abort();
            abort_controllers(task).await;
            return Err(Error::LeadershipLost(reason));
        }
        tracing::info!("shutting down: letting go of the slots while renewing the member lease");
        // Renewed until every slot is free and every write answered: until then, this replica
        // is the one that may write for them.
        let stopping = async {
            leaving.cancel();
            let left = match (&mut coordinating).await {
                Ok(left) => left,
                Err(panic) => Err(Error::Sharding(format!("the coordinator failed: {panic}"))),
            };
            stop.cancel();
            let stopped = match returned {
                Some(result) => result,
                None => stop_controllers(&mut task, timeout).await,
            };
            left.and(stopped)
        };
        // Reconciles go on until the slots are let go of: it stops acting after the drain.
        match drain_and_release(&mut elector, fence, stopping, None).await {
            Ok(result) => result,
            Err(end) => {
                coordinating.abort();
                abort_controllers(task).await;
                Err(lost_while_draining(end))
            }
        }
    }
}

/// Renews the Lease while `stopping` stops the controllers, then closes the fence, waits for
/// the writes in flight and releases the Lease, naming when this replica stopped acting (`None`:
/// now). The controllers' result, or how the renewal ended before the drain did.
async fn drain_and_release(
    elector: &mut ElectorThread,
    fence: &WriteFence,
    stopping: impl Future<Output = Result<(), Error>>,
    stopped_acting: Option<k8s_openapi::jiff::Timestamp>,
) -> Result<Result<(), Error>, LeadershipEnd> {
    let renewing = CancellationToken::new();
    let drain = async {
        let result = stopping.await;
        fence.close_to_new_writes();
        (result, fence.writes_ended(WRITE_DRAIN).await)
    };
    let (result, writes) = tokio::select! {
        drained = drain => drained,
        end = elector.hold(&renewing) => return Err(end),
    };
    if writes > 0 {
        // Released anyway: the Lease must not outlive the process, and the API server's fence
        // refuses what lands once another replica leads.
        tracing::warn!(
            in_flight = writes,
            "writes still unanswered at the end of the drain are abandoned"
        );
    }
    let stopped_acting = stopped_acting.unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
    elector.release(RELEASE_BUDGET, Some(stopped_acting)).await;
    Ok(result)
}

/// The error of a Lease whose renewal ended while the controllers drained.
fn lost_while_draining(end: LeadershipEnd) -> Error {
    Error::LeadershipLost(match end {
        LeadershipEnd::Lost(reason) => reason,
        LeadershipEnd::Stopped => "stopped renewing while draining".to_owned(),
    })
}

fn flatten(
    joined: Result<Result<(), kube_operator_runtime::Error>, tokio::task::JoinError>,
) -> Result<(), Error> {
    match joined {
        Ok(result) => result.map_err(Error::from),
        Err(error) => Err(Error::ControllersCrashed(error.to_string())),
    }
}

/// Waits for cancelled controllers to return, at most `timeout`; then aborts them and waits
/// until the abort has taken effect, so nothing of theirs runs once this returns.
async fn stop_controllers(task: &mut ControllersTask, timeout: Duration) -> Result<(), Error> {
    match tokio::time::timeout(timeout, &mut *task).await {
        Ok(joined) => {
            let result = flatten(joined);
            if result.is_ok() {
                tracing::info!("controllers stopped");
            }
            result
        }
        Err(_) => {
            tracing::warn!(
                timeout = %crate::duration::Display(timeout),
                "controllers did not stop within the shutdown timeout; aborting them"
            );
            task.abort();
            let _ = task.await;
            Err(Error::ShutdownTimeout(timeout))
        }
    }
}

/// Aborts the controllers and waits until the abort has taken effect. Dropping their runner
/// also cancels every reconcile it spawned.
async fn abort_controllers(task: ControllersTask) {
    // A task that has finished (and may have been awaited already) has nothing left to stop.
    if task.is_finished() {
        return;
    }
    task.abort();
    let _ = task.await;
    tracing::info!("controllers aborted");
}

/// One cancellation token for the whole process, cancelled by the first SIGTERM or SIGINT.
/// A second signal exits at once with status 1.
fn install_signal_handlers() -> Result<CancellationToken, Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutdown requested");
        cancel.cancel();
        tokio::select! {
            _ = terminate.recv() => {},
            _ = interrupt.recv() => {},
        }
        tracing::warn!("second signal: exiting at once");
        std::process::exit(1);
    });
    Ok(token)
}

fn log_configuration(config: &Config, controllers: &[Box<dyn ManagedController>]) {
    let show = |d| crate::duration::Display(d);
    let enabled: Vec<&str> = controllers.iter().map(|c| c.name()).collect();
    tracing::info!(
        metrics_bind_address = %config.metrics_bind_address,
        health_probe_bind_address = %config.health_probe_bind_address,
        webhook_bind_address = %config.webhook_bind_address,
        webhook_cert_path = config.webhook_cert_path.as_ref().map_or("(provisioned)".into(), |p| p.display().to_string()),
        webhook_cert_validity = %show(config.webhook_cert_validity),
        sharding = config.sharding,
        leader_elect = config.leader_elect && !config.sharding,
        warm_standby = config.warm_standby,
        leader_election_id = %config.leader_election_id,
        leader_election_namespace = config.leader_election_namespace.as_deref().unwrap_or("(auto)"),
        lease_duration = %show(config.lease_duration),
        renew_deadline = %show(config.renew_deadline),
        retry_period = %show(config.retry_period),
        log_format = ?config.log_format,
        log_level = config.log_level.directive(),
        log_keys = ?config.log_keys,
        controllers = ?enabled,
        max_concurrent_reconciles = config.max_concurrent_reconciles,
        shutdown_timeout = %show(config.shutdown_timeout),
        reconcile_debounce = %show(config.reconcile_debounce),
        reconcile_timeout = %show(config.reconcile_timeout),
        wait_for_own_writes = config.wait_for_own_writes,
        namespace = %kube_operator_runtime::Namespaces::only(config.namespace.0.iter().cloned()),
        version = env!("CARGO_PKG_VERSION"),
        revision = env!("MANAGER_GIT_REVISION"),
        built = env!("MANAGER_BUILD_DATE"),
        "effective configuration"
    );
    if controllers.is_empty() {
        tracing::warn!("no controller is enabled");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_agent_names_version_and_identity() {
        assert_eq!(
            user_agent("manager-7d9f-x2"),
            format!(
                "{}/{} (manager-7d9f-x2)",
                product::NAME,
                env!("CARGO_PKG_VERSION")
            )
        );
        // Whatever a host name holds, the header stays valid.
        let odd = user_agent("host\tname\u{e9}");
        assert!(odd.ends_with("(host_name_)"), "{odd}");
        assert!(http::HeaderValue::try_from(odd).is_ok());
        assert_eq!(
            leader_election_user_agent("manager-7d9f-x2"),
            format!(
                "{}-leader-election/{} (manager-7d9f-x2)",
                product::NAME,
                env!("CARGO_PKG_VERSION")
            )
        );
    }
}
