//! The lifecycle: start in a fixed order, run controllers only while leading, shut down in
//! reverse.
//!
//! Start: signal handlers, metrics registry, HTTP endpoints, cluster connection (readiness
//! turns on), leader election, controllers. Stop on SIGTERM/SIGINT: readiness turns off,
//! controllers finish in-flight reconciles (bounded by the shutdown timeout), the Lease is
//! released, the HTTP endpoints close; exit 0. A second signal exits at once with status 1.
//! Lost leadership or a failed controller ends the process with status 1.

use std::sync::Arc;
use std::time::Duration;

use controllers::{ManagedController, RunOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::leader::{self, LeaderElector, LeaderStatus, LeadershipEnd, Settings};
use crate::server::{Health, Servers};
use crate::{Error, telemetry};

/// How long HTTP connections get to finish once the manager stops.
const HTTP_GRACE: Duration = Duration::from_secs(1);

/// How long releasing the Lease may take at shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the manager until a signal (`Ok`) or a failure (`Err`).
///
/// # Errors
/// See [`Error`]; every variant but [`Error::Config`] can come from here.
pub async fn run(
    config: Config,
    controllers: Vec<Box<dyn ManagedController>>,
) -> Result<(), Error> {
    let shutdown = install_signal_handlers()?;
    log_configuration(&config, &controllers);

    let registry = telemetry::registry()?;
    let metrics = Arc::new(controllers::Metrics::register(&registry)?);
    let leader_status = if config.leader_elect {
        let gauge = telemetry::leader_gauge(&registry)?
            .with_label_values(&[config.leader_election_id.as_str()]);
        Some(Arc::new(LeaderStatus::new(gauge, config.renew_deadline)))
    } else {
        None
    };
    let health = Arc::new(Health::new(leader_status.clone()));
    let servers = Servers::start(
        config.metrics_bind_address.socket_addr(),
        config.health_probe_bind_address.socket_addr(),
        registry,
        health.clone(),
    )
    .await?;
    {
        // Readiness drops the moment shutdown starts.
        let (health, shutdown) = (health.clone(), shutdown.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            health.set_ready(false);
        });
    }

    let result = run_connected(
        &config,
        controllers,
        metrics,
        leader_status,
        &health,
        &shutdown,
    )
    .await;
    health.set_ready(false);
    servers.shutdown(HTTP_GRACE).await;
    match &result {
        Ok(()) => tracing::info!("stopped"),
        Err(error) => tracing::error!(error = %error.report(), "stopped with an error"),
    }
    result
}

async fn run_connected(
    config: &Config,
    controllers: Vec<Box<dyn ManagedController>>,
    metrics: Arc<controllers::Metrics>,
    leader_status: Option<Arc<LeaderStatus>>,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let Some(client) = connect(shutdown).await? else {
        return Ok(());
    };
    health.set_ready(!shutdown.is_cancelled());
    let identity = leader::default_identity();
    let options = RunOptions {
        max_concurrent_reconciles: config.max_concurrent_reconciles,
        instance: identity.clone(),
    };
    let runner = Runner {
        client: client.clone(),
        controllers,
        options,
        metrics,
        shutdown_timeout: config.shutdown_timeout,
    };

    let Some(status) = leader_status else {
        return runner.run_unelected(shutdown).await;
    };
    let namespace = config
        .leader_election_namespace
        .clone()
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|ns| !ns.trim().is_empty())
        })
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let settings = Settings {
        lease_name: config.leader_election_id.clone(),
        namespace,
        identity,
        lease_duration: config.lease_duration,
        renew_deadline: config.renew_deadline,
        retry_period: config.retry_period,
    };
    let elector = LeaderElector::new(client, settings, status);
    runner.run_elected(elector, shutdown).await
}

/// Connects the way kubectl does (in-cluster service account, else `KUBECONFIG`, else
/// `~/.kube/config`) and waits until the API server answers. `None` when shutdown came first.
async fn connect(shutdown: &CancellationToken) -> Result<Option<kube::Client>, Error> {
    let client = kube::Client::try_default().await.map_err(Error::Client)?;
    let mut delay = Duration::from_millis(250);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
            Ok(Ok(info)) => {
                tracing::info!(version = %info.git_version, namespace = %client.default_namespace(), "connected to the API server");
                return Ok(Some(client));
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "the API server is not reachable yet; retrying")
            }
            Err(_) => tracing::warn!("the API server did not answer within 10s; retrying"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

type ControllersTask = JoinHandle<Result<(), controllers::Error>>;

/// What it takes to start the controllers.
struct Runner {
    client: kube::Client,
    controllers: Vec<Box<dyn ManagedController>>,
    options: RunOptions,
    metrics: Arc<controllers::Metrics>,
    shutdown_timeout: Duration,
}

impl Runner {
    fn start(self, stop: CancellationToken) -> (ControllersTask, Duration) {
        let names: Vec<&str> = self.controllers.iter().map(|c| c.name()).collect();
        tracing::info!(controllers = ?names, "starting controllers");
        let task = tokio::spawn(controllers::run(
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
                stop_controllers(task, timeout).await
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
    /// held, and release it at shutdown.
    async fn run_elected(
        self,
        mut elector: LeaderElector,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        if !elector.acquire(shutdown).await {
            tracing::info!("shutdown before becoming leader");
            return Ok(());
        }
        let stop = CancellationToken::new();
        let (mut task, timeout) = self.start(stop.clone());
        let mut returned: Option<Result<(), Error>> = None;
        let end = loop {
            tokio::select! {
                end = elector.hold(shutdown) => break end,
                joined = &mut task, if returned.is_none() => {
                    match flatten(joined) {
                        Ok(()) => {
                            tracing::info!("controllers returned; holding the lease until shutdown");
                            returned = Some(Ok(()));
                        }
                        Err(error) => {
                            returned = Some(Err(error));
                            break LeadershipEnd::Stopped;
                        }
                    }
                }
            }
        };
        stop.cancel();
        match (end, returned) {
            (_, Some(Err(error))) => {
                // The controllers failed: hand over to a standby at once.
                release(&mut elector).await;
                Err(error)
            }
            (LeadershipEnd::Lost(reason), returned) => {
                if returned.is_none()
                    && let Err(error) = stop_controllers(task, timeout).await
                {
                    tracing::warn!(error = %error.report(), "while stopping controllers after losing the lease");
                }
                Err(Error::LeadershipLost(reason))
            }
            (LeadershipEnd::Stopped, returned) => {
                tracing::info!("shutting down: stopping controllers");
                let result = match returned {
                    Some(result) => result,
                    None => stop_controllers(task, timeout).await,
                };
                // Controllers that did not stop may still be writing: then the Lease is kept
                // and expires on its own, so no standby starts alongside them.
                if !matches!(result, Err(Error::ShutdownTimeout(_))) {
                    release(&mut elector).await;
                }
                result
            }
        }
    }
}

async fn release(elector: &mut LeaderElector) {
    match tokio::time::timeout(RELEASE_TIMEOUT, elector.release()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "could not release the lease; it expires on its own")
        }
        Err(_) => tracing::warn!("releasing the lease timed out; it expires on its own"),
    }
}

fn flatten(
    joined: Result<Result<(), controllers::Error>, tokio::task::JoinError>,
) -> Result<(), Error> {
    match joined {
        Ok(result) => result.map_err(Error::from),
        Err(error) => Err(Error::ControllersCrashed(error.to_string())),
    }
}

/// Waits for cancelled controllers to return, at most `timeout`.
async fn stop_controllers(task: ControllersTask, timeout: Duration) -> Result<(), Error> {
    let abort = task.abort_handle();
    match tokio::time::timeout(timeout, task).await {
        Ok(joined) => {
            let result = flatten(joined);
            if result.is_ok() {
                tracing::info!("controllers stopped");
            }
            result
        }
        Err(_) => {
            abort.abort();
            Err(Error::ShutdownTimeout(timeout))
        }
    }
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
        leader_elect = config.leader_elect,
        leader_election_id = %config.leader_election_id,
        leader_election_namespace = config.leader_election_namespace.as_deref().unwrap_or("(auto)"),
        lease_duration = %show(config.lease_duration),
        renew_deadline = %show(config.renew_deadline),
        retry_period = %show(config.retry_period),
        log_format = ?config.log_format,
        controllers = ?enabled,
        max_concurrent_reconciles = config.max_concurrent_reconciles,
        shutdown_timeout = %show(config.shutdown_timeout),
        version = env!("CARGO_PKG_VERSION"),
        "effective configuration"
    );
    if controllers.is_empty() {
        tracing::warn!("no controller is enabled");
    }
}
