//! A runtime for Kubernetes controllers built on kube-rs: what controller-runtime's `pkg/` is to a
//! Kubebuilder project.
//!
//! A controller implements [`ManagedController`] (usually as a [`Registration`]): its name, the
//! RBAC rules it needs, and how to run it. [`run`] runs a list of them together: one watch and
//! cache per resource type and selector shared by all of them ([`watches`]), and one driver
//! ([`driver`]) that gives every controller the same metrics, per-object backoff, tracing span,
//! concurrency bound and graceful shutdown. A controller declares with the [`builder`] what it
//! is for, owns and watches, and how to reconcile; nothing else. Its registration also lists
//! the admission and conversion webhooks of its type ([`webhook`]), which the embedding binary
//! serves and renders into webhook configurations.
//!
//! The crate knows no custom resource type and no controller of its own: those live with the
//! application that registers them. Nor does it know the application's name: the binary gives
//! it once at start ([`labels::set_product`]), and every owned object is labelled
//! `app.kubernetes.io/managed-by=<name>` and written by the field manager `<name>/<controller>`.
//!
//! # A controller
//!
//! A `Greeting` that owns a ConfigMap holding its message: the ConfigMap is created when
//! missing, put back when edited by hand, never taken from another owner, and goes when the
//! `Greeting` goes.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{CustomResource, ResourceExt};
//! use kube_operator_runtime::{Builder, Child, Error, Outcome, PolicyRule, Registration};
//! use kube_operator_runtime::{RunContext, RunOptions, Tools, labels, owned_metadata, rbac};
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//!
//! /// A message to keep in a ConfigMap.
//! #[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
//! #[kube(group = "example.com", version = "v1", kind = "Greeting", namespaced)]
//! pub struct GreetingSpec {
//!     pub message: String,
//! }
//!
//! // What the controller may do: its own resource (with status, finalizers, Events) and
//! // ConfigMaps. The ClusterRole is rendered from this, and the builder refuses to start when
//! // it misses what the controller declares.
//! static RULES: [PolicyRule; 5] =
//!     kube_operator_runtime::controller_rules!("example.com", "greetings", rbac::owns::<ConfigMap>());
//!
//! pub const CONTROLLER: Registration =
//!     Registration::new("greeting", &RULES, |ctx| Box::pin(run(ctx)));
//!
//! async fn run(ctx: RunContext) -> Result<(), Error> {
//!     Builder::<Greeting>::new("greeting", &ctx)
//!         .owns_kind::<ConfigMap>()
//!         .run(|tools| tools, reconcile)
//!         .await
//! }
//!
//! async fn reconcile(greeting: Arc<Greeting>, tools: Arc<Tools<Greeting>>) -> Result<Outcome, Error> {
//!     let name = greeting.name_any();
//!     let labels = labels::managed_instance("greeting", &name);
//!     let desired = ConfigMap {
//!         metadata: owned_metadata(&*greeting, name, greeting.namespace(), labels)?,
//!         data: Some([("message".to_owned(), greeting.spec.message.clone())].into()),
//!         ..ConfigMap::default()
//!     };
//!     // `Child::Foreign` when somebody else's ConfigMap holds the name: nothing is written, and
//!     // a Warning Event on the Greeting says so.
//!     let _child: Child = tools.ensure(&*greeting, &desired).await?;
//!     Ok(Outcome::Done)
//! }
//!
//! # async fn main_() -> Result<(), Box<dyn std::error::Error>> {
//! // The application names itself before anything is labelled, then runs its registrations
//! // together, sharing one watch per resource type.
//! labels::set_product("greeting-operator", "greeting-platform")?;
//! let client = kube::Client::try_default().await?;
//! let metrics = Arc::new(kube_operator_runtime::Metrics::new()?);
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! kube_operator_runtime::run(client, vec![Box::new(CONTROLLER)], RunOptions::default(), metrics, shutdown)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! A reconcile's pure parts (the desired objects, the status) are tested as plain functions;
//! what it sends is tested against the [`fake`] API server.

pub mod backoff;
pub mod builder;
pub mod children;
pub mod conditions;
mod deployment_child;
pub mod deployment_view;
pub mod driver;
pub mod error;
pub mod events;
pub mod fake;
pub mod finalizer;
pub mod index;
pub mod initial_lists;
pub mod labels;
pub mod leadership;
pub mod managed_fields;
pub mod meta_view;
pub mod metrics;
pub mod own_writes;
pub mod owned;
pub mod pod_security;
pub mod priority;
pub mod quantity;
pub mod rbac;
pub mod reconnect;
pub mod scope;
pub mod shard_watch;
pub mod shards;
pub mod slots;
pub mod status;
pub mod status_writer;
#[cfg(test)]
mod test_resource;
pub mod testing;
pub mod watches;
pub mod webhook;
pub mod workload;
pub mod workqueue;
pub mod writes;

pub use builder::{Builder, Context, Tools, with_status_writer};
pub use children::{Child, desired, owned_metadata};
pub use conditions::NewCondition;
pub use driver::{Outcome, Reconciled};
pub use error::Error;
pub use leadership::{Lead, Leadership, Takeover, Warmth};
pub use metrics::Metrics;
pub use priority::Priority;
pub use rbac::PolicyRule;
pub use scope::Namespaces;
pub use shards::{ShardControl, Shards};
pub use slots::Slots;
pub use status::Rollout;
pub use status_writer::{Progress, StatusWriter};
pub use watches::SharedWatches;
pub use workload::Workload;

/// The key of `obj` in a cache, queue or map: its name and namespace. `ObjectRef::from_obj`
/// also copies its uid and resourceVersion, which no lookup compares; a key kept for as long as
/// the object lives need not hold them.
pub fn object_key<K: kube::Resource<DynamicType = ()>>(
    obj: &K,
) -> kube::runtime::reflector::ObjectRef<K> {
    let meta = obj.meta();
    let mut key =
        kube::runtime::reflector::ObjectRef::new(meta.name.as_deref().unwrap_or_default());
    key.namespace.clone_from(&meta.namespace);
    key
}

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
    /// How long the triggers that follow an object's reconcile must pause before the next: an
    /// idle object's first trigger is reconciled at once, and the burst of changes after it (its
    /// Deployment's status, then its pods) becomes one more reconcile (see [`workqueue`]).
    pub debounce: std::time::Duration,
    /// The namespaces every watch covers (`--namespace`); none named means all.
    pub namespaces: Namespaces,
    /// How long a reconcile may run before it is cancelled and retried with backoff
    /// (`--reconcile-timeout`, controller-runtime's `ReconciliationTimeout`); `None`, the
    /// default, lets it run as long as it takes. A registration may set its own
    /// ([`Registration::with_reconcile_timeout`]).
    pub reconcile_timeout: Option<std::time::Duration>,
    /// When reconciling may start: always (the default), or, for a warm standby, once it
    /// leads ([`Leadership::standby`]). Watches and caches start either way.
    pub leadership: Leadership,
    /// In a sharded manager, the slots of the objects this replica reconciles, as its
    /// coordinator assigns them ([`Shards::new`]); `None`, the default, reconciles every
    /// object.
    pub shards: Option<Shards>,
    /// Whether a reconcile waits (up to 2 s) for the cache to show the controller's own last
    /// write to its object or children, so that it never starts from what it has already
    /// changed (the default); `false` reconciles from the cache as it is.
    pub wait_for_own_writes: bool,
}

impl RunOptions {
    /// The default [`RunOptions::debounce`].
    pub const DEFAULT_DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(250);
}

impl Default for RunOptions {
    /// One reconcile at a time per controller (controller-runtime's default), no instance name,
    /// the default debounce, every namespace.
    fn default() -> Self {
        Self {
            max_concurrent_reconciles: 1,
            instance: String::new(),
            debounce: Self::DEFAULT_DEBOUNCE,
            namespaces: Namespaces::all(),
            reconcile_timeout: None,
            leadership: Leadership::always(),
            shards: None,
            wait_for_own_writes: true,
        }
    }
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
    /// Cancelled when the manager stops leading or shuts down (or another controller of the
    /// same run failed).
    pub shutdown: CancellationToken,
    /// The watches shared by every controller of the run.
    pub watches: SharedWatches,
    /// The RBAC rules of the controller being run ([`ManagedController::rbac_rules`]).
    pub rules: &'static [PolicyRule],
}

impl RunContext {
    /// A context for one controller run on its own with `client`, allowed `rules`, with the
    /// default options, metrics of its own and every namespace watched: for a small
    /// application without a manager, and for unit tests of a reconcile against the
    /// [`fake`] API server (with [`builder::Builder::tools`]).
    ///
    /// # Errors
    /// When the metrics cannot be created (a name clash, which the runtime's own never have).
    pub fn new(
        client: kube::Client,
        rules: &'static [PolicyRule],
    ) -> Result<Self, prometheus::Error> {
        let shutdown = CancellationToken::new();
        Ok(Self {
            watches: SharedWatches::new(client.clone(), Namespaces::all(), shutdown.child_token()),
            client,
            options: RunOptions::default(),
            metrics: Arc::new(Metrics::new()?),
            shutdown,
            rules,
        })
    }
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Runs `controllers` together (sharing one watch per resource type) until `shutdown` is
/// cancelled and every controller has stopped.
///
/// Cancelling `shutdown` stops new reconciles; reconciles already running finish before this
/// returns (the caller bounds that with its own timeout). If a controller fails, the others are
/// stopped the same way and the first error is returned.
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
    let stop = shutdown.child_token();
    let (namespaces, watches_stop) = (options.namespaces.clone(), stop.child_token());
    let watches = match &options.shards {
        Some(shards) => SharedWatches::sharded(client.clone(), namespaces, shards, watches_stop),
        None => SharedWatches::new(client.clone(), namespaces, watches_stop),
    };
    let ctx = RunContext {
        client,
        options,
        metrics,
        shutdown: stop.clone(),
        watches: watches.clone(),
        rules: &[],
    };
    let runs = controllers.iter().map(|c| {
        let mut ctx = RunContext {
            rules: c.rbac_rules(),
            ..ctx.clone()
        };
        if let Some(timeout) = c.reconcile_timeout() {
            ctx.options.reconcile_timeout = Some(timeout);
        }
        // Counted cold from here, before anything runs, so the run is never warm too early.
        let leadership = ctx.options.leadership.for_controller(c.name());
        ctx.options.leadership = leadership.clone();
        let (name, run, stop) = (c.name(), c.run(ctx), stop.clone());
        async move {
            let result = run.await.map_err(|source| Error::Controller {
                controller: name,
                source: Box::new(source),
            });
            // A controller that returned waits for no cache.
            leadership.synced();
            if let Err(e) = &result {
                tracing::error!(controller = name, error = %e, "controller failed; stopping the others");
                stop.cancel();
            }
            result
        }
    });
    let results = futures::future::join_all(runs).await;
    watches.stop().await;
    results
        .into_iter()
        .collect::<Result<Vec<()>, Error>>()
        .map(|_| ())
}

/// A controller the manager can run.
///
/// Implementations are cheap descriptors; the work happens in the future returned by `run`.
pub trait ManagedController: Send + Sync {
    /// Stable name: the `controller` label on metrics, the key in the `controllers`
    /// configuration list, the span field in logs. Lower-case, no spaces.
    fn name(&self) -> &'static str;

    /// The cluster-wide permissions this controller needs. A ClusterRole rendered from the
    /// application's list of controllers is the union of these.
    fn rbac_rules(&self) -> &'static [PolicyRule];

    /// Runs the controller until `shutdown` is cancelled, then lets in-flight reconciles finish
    /// and returns. Returns early only on an unrecoverable error.
    fn run(&self, ctx: RunContext) -> BoxFuture<'static, Result<(), Error>>;

    /// The admission webhooks of the type this controller reconciles. The manager serves them
    /// on every replica, whether or not this controller is enabled or leading: the cluster
    /// calls them for every write of the type.
    fn webhooks(&self) -> Vec<webhook::AdmissionWebhook> {
        Vec::new()
    }

    /// The conversion between the versions of the type this controller reconciles, if it has
    /// more than one. Served by every replica, like the admission webhooks.
    fn conversion(&self) -> Option<webhook::conversion::ConversionWebhook> {
        None
    }

    /// This controller's own reconcile timeout, over [`RunOptions::reconcile_timeout`].
    fn reconcile_timeout(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether this controller needs the whole cluster: it reconciles a cluster-scoped type, or
    /// writes cluster-scoped children. Such a controller cannot run in an install limited to
    /// some namespaces (`--namespace`), whose RBAC grants nothing cluster-wide.
    fn cluster_wide(&self) -> bool {
        false
    }

    /// Example objects of the type this controller reconciles, as a user would apply them:
    /// what an application renders as its samples and its OLM bundle's `alm-examples`.
    ///
    /// # Errors
    /// When an example cannot be serialized.
    fn samples(&self) -> Result<Vec<serde_json::Value>, serde_json::Error> {
        Ok(Vec::new())
    }

    /// The kinds of objects this controller creates for each object it reconciles, those its
    /// [`rbac_rules`](Self::rbac_rules) declare with [`rbac::owns`]: what an OLM bundle's
    /// ClusterServiceVersion lists as the owned CRD's `resources`.
    fn owned_kinds(&self) -> Vec<OwnedKind> {
        self.rbac_rules()
            .iter()
            .filter_map(|rule| rule.owns)
            .collect()
    }
}

/// A kind of object a controller creates and owns, by its API version and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OwnedKind {
    /// `Deployment`.
    pub kind: &'static str,
    /// The version, without the group: `v1`.
    pub version: &'static str,
}

impl OwnedKind {
    /// The kind of `K`.
    pub const fn of<K: k8s_openapi::Resource>() -> Self {
        Self {
            kind: K::KIND,
            version: K::VERSION,
        }
    }
}

/// Builds a controller's example objects: see [`ManagedController::samples`].
pub type SamplesFn = fn() -> Result<Vec<serde_json::Value>, serde_json::Error>;

/// A controller as its module declares it: a name, its RBAC rules and how to run it.
#[derive(Clone, Copy, Debug)]
pub struct Registration {
    /// See [`ManagedController::name`].
    pub name: &'static str,
    /// See [`ManagedController::rbac_rules`].
    pub rbac_rules: &'static [PolicyRule],
    /// See [`ManagedController::run`].
    pub run: fn(RunContext) -> BoxFuture<'static, Result<(), Error>>,
    /// See [`ManagedController::webhooks`].
    pub webhooks: fn() -> Vec<webhook::AdmissionWebhook>,
    /// See [`ManagedController::conversion`].
    pub conversion: Option<fn() -> webhook::conversion::ConversionWebhook>,
    /// See [`ManagedController::reconcile_timeout`].
    pub reconcile_timeout: Option<std::time::Duration>,
    /// See [`ManagedController::samples`].
    pub samples: SamplesFn,
    /// See [`ManagedController::cluster_wide`].
    pub cluster_wide: bool,
}

impl Registration {
    /// The controller `name`, needing `rbac_rules`, run by `run`.
    pub const fn new(
        name: &'static str,
        rbac_rules: &'static [PolicyRule],
        run: fn(RunContext) -> BoxFuture<'static, Result<(), Error>>,
    ) -> Self {
        Self {
            name,
            rbac_rules,
            run,
            webhooks: Vec::new,
            conversion: None,
            reconcile_timeout: None,
            samples: || Ok(Vec::new()),
            cluster_wide: false,
        }
    }

    /// The same controller, needing the whole cluster: see [`ManagedController::cluster_wide`].
    pub const fn cluster_wide(self) -> Self {
        Self {
            cluster_wide: true,
            ..self
        }
    }

    /// The same controller, declaring the example objects `samples` returns.
    pub const fn with_samples(self, samples: SamplesFn) -> Self {
        Self { samples, ..self }
    }

    /// The same controller, whose reconciles are cancelled and retried with backoff once they
    /// run longer than `timeout`, whatever `--reconcile-timeout` says.
    pub const fn with_reconcile_timeout(self, timeout: std::time::Duration) -> Self {
        Self {
            reconcile_timeout: Some(timeout),
            ..self
        }
    }

    /// The same controller, declaring the admission webhooks `webhooks` returns.
    pub const fn with_webhooks(self, webhooks: fn() -> Vec<webhook::AdmissionWebhook>) -> Self {
        Self { webhooks, ..self }
    }

    /// The same controller, declaring the conversion `conversion` returns.
    pub const fn with_conversion(
        self,
        conversion: fn() -> webhook::conversion::ConversionWebhook,
    ) -> Self {
        Self {
            conversion: Some(conversion),
            ..self
        }
    }
}

impl ManagedController for Registration {
    fn name(&self) -> &'static str {
        self.name
    }

    fn rbac_rules(&self) -> &'static [PolicyRule] {
        self.rbac_rules
    }

    fn run(&self, ctx: RunContext) -> BoxFuture<'static, Result<(), Error>> {
        (self.run)(ctx)
    }

    fn webhooks(&self) -> Vec<webhook::AdmissionWebhook> {
        (self.webhooks)()
    }

    fn conversion(&self) -> Option<webhook::conversion::ConversionWebhook> {
        self.conversion.map(|conversion| conversion())
    }

    fn reconcile_timeout(&self) -> Option<std::time::Duration> {
        self.reconcile_timeout
    }

    fn samples(&self) -> Result<Vec<serde_json::Value>, serde_json::Error> {
        (self.samples)()
    }

    fn cluster_wide(&self) -> bool {
        self.cluster_wide
    }
}

/// Every conversion `controllers` declare, one per CRD (two controllers of one type declare
/// it once between them).
pub fn conversions(
    controllers: &[Box<dyn ManagedController>],
) -> Vec<webhook::conversion::ConversionWebhook> {
    let mut all: Vec<webhook::conversion::ConversionWebhook> = Vec::new();
    for conversion in controllers.iter().filter_map(|c| c.conversion()) {
        if !all.iter().any(|c| c.crd_name == conversion.crd_name) {
            all.push(conversion);
        }
    }
    all
}

/// Every admission webhook of `controllers`, in their order.
///
/// # Errors
/// When two webhooks share a name or a path: the configurations and the server could not tell
/// them apart.
pub fn webhooks(
    controllers: &[Box<dyn ManagedController>],
) -> Result<Vec<webhook::AdmissionWebhook>, Error> {
    let mut all: Vec<webhook::AdmissionWebhook> = Vec::new();
    for controller in controllers {
        for hook in controller.webhooks() {
            if let Some(twin) = all
                .iter()
                .find(|w| w.name == hook.name || w.path == hook.path)
            {
                return Err(Error::DuplicateWebhook {
                    controller: controller.name(),
                    name: hook.name,
                    path: hook.path,
                    twin: twin.name.clone(),
                });
            }
            all.push(hook);
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_options_default() {
        let options = RunOptions::default();
        assert_eq!(options.max_concurrent_reconciles, 1);
        assert!(options.instance.is_empty());
    }
}
