//! The platform's controllers and the one list of them.
//!
//! Every controller implements [`ManagedController`]: its name, the RBAC rules it needs, and how
//! to run it. [`all`] is the single registration list: the manager runs what it lists (minus what
//! configuration switches off), and `cargo xtask manifests` renders the ClusterRole from the same
//! list, so the permissions in a user's cluster can never drift from what the code does.

pub mod error;
pub mod metrics;
pub mod rbac;

pub use error::Error;
pub use metrics::Metrics;
pub use rbac::PolicyRule;

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

/// Settings the manager passes to every controller it runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Upper bound on concurrent reconciles per controller (controller-runtime's
    /// `MaxConcurrentReconciles`).
    pub max_concurrent_reconciles: u16,
    /// Reported as the Event source instance (the pod name in-cluster).
    pub instance: String,
}

/// What a controller gets when it runs: the client, the watches shared with the other
/// controllers, the metrics and the shutdown signal. Built by [`run`].
#[derive(Clone)]
pub struct RunContext {
    /// Client with the manager's identity.
    pub client: kube::Client,
    /// Options from the manager's configuration.
    pub options: RunOptions,
    /// Reconcile and work-queue metrics, labelled by controller.
    pub metrics: Arc<Metrics>,
    /// Cancelled when the manager stops leading or shuts down.
    pub shutdown: CancellationToken,
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext").field("options", &self.options).finish_non_exhaustive()
    }
}

/// Runs `controllers` together (sharing one watch per resource type) until `shutdown` is
/// cancelled and every controller has stopped.
///
/// # Errors
/// The first controller error that is not a per-object reconcile failure (those are retried).
pub async fn run(
    client: kube::Client,
    controllers: Vec<Box<dyn ManagedController>>,
    options: RunOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let ctx = RunContext { client, options, metrics, shutdown };
    let runs = controllers.iter().map(|c| c.run(ctx.clone()));
    futures::future::try_join_all(runs).await.map(|_| ())
}

/// A controller the manager can run.
///
/// Implementations are cheap descriptors; the work happens in the future returned by `run`.
pub trait ManagedController: Send + Sync {
    /// Stable name: the `controller` label on metrics, the key in the `controllers`
    /// configuration list, the span field in logs. Lower-case, no spaces.
    fn name(&self) -> &'static str;

    /// The cluster-wide permissions this controller needs. The generated ClusterRole is the
    /// union of these over [`all`].
    fn rbac_rules(&self) -> &'static [PolicyRule];

    /// Runs the controller until `shutdown` is cancelled, then lets in-flight reconciles finish
    /// and returns. Returns early only on an unrecoverable error.
    fn run(&self, ctx: RunContext) -> BoxFuture<'static, Result<(), Error>>;
}

/// Every controller in the workspace, in a stable order.
pub fn all() -> Vec<Box<dyn ManagedController>> {
    Vec::new()
}
