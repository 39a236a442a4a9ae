//! The manager: runs every enabled controller in one process behind leader election, serves
//! Prometheus metrics and health probes, and shuts down cleanly.
//!
//! The binary (`src/main.rs`) only parses flags and maps the outcome to an exit status; the
//! modules here do the work, one concept each:
//!
//! - [`config`]: defaults < file < `MANAGER_*` environment < flags, checked as a whole.
//! - [`leader`]: leader election on a `coordination.k8s.io/v1` Lease.
//! - [`fence`]: the check every controller write passes: this replica leads, on time.
//! - [`server`]: `/metrics`, `/healthz`, `/readyz`, and the listeners of the webhooks.
//! - [`webhooks`]: the admission webhook endpoints.
//! - [`webhook_certs`]: their certificates, kept in a Secret ([`cert_authority`] decides when
//!   each is renewed).
//! - [`telemetry`]: logs and the metrics registry.
//! - [`manager`]: the start-up and shutdown order.

pub mod boot_clock;
pub mod cert_authority;
pub mod client_metrics;
pub mod config;
pub mod duration;
pub mod duties;
pub mod error;
pub mod fence;
pub mod json_log;
pub mod leader;
pub mod leader_thread;
pub mod manager;
pub mod metrics_auth;
pub mod server;
pub mod serving;
pub mod sharding;
pub mod telemetry;
pub mod tls;
pub mod webhook_certs;
pub mod webhook_metrics;
pub mod webhooks;

pub use config::Config;
pub use error::Error;

use kube_operator_runtime::ManagedController;

/// The controllers of `all` that `config` enables, in registration order. With `namespace`
/// set, those that need the whole cluster ([`ManagedController::cluster_wide`]) are left out
/// unless named, which is an error: a namespace-scoped install grants nothing cluster-wide.
///
/// # Errors
/// When the configuration names an unknown controller ([`config::load`] already checks this),
/// or names a controller that needs the whole cluster while `namespace` is set.
pub fn enabled_controllers(
    config: &Config,
    all: Vec<Box<dyn ManagedController>>,
) -> Result<Vec<Box<dyn ManagedController>>, String> {
    let names: Vec<&str> = all.iter().map(|c| c.name()).collect();
    let enabled: Vec<String> = config
        .controllers
        .resolve(&names)?
        .into_iter()
        .map(str::to_owned)
        .collect();
    let scoped = !config.namespace.0.is_empty();
    let mut chosen = Vec::new();
    for controller in all {
        let name = controller.name();
        if !enabled.iter().any(|enabled| enabled == name) {
            continue;
        }
        if scoped && controller.cluster_wide() {
            if config.controllers.0.iter().any(|entry| entry == name) {
                return Err(format!(
                    "{name} needs the whole cluster and cannot run with namespace set \
                     (--namespace {}); leave it out",
                    config.namespace.0.join(",")
                ));
            }
            tracing::info!(
                controller = name,
                "not run: it needs the whole cluster and namespace is set"
            );
            continue;
        }
        chosen.push(controller);
    }
    Ok(chosen)
}
