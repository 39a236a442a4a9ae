//! The Memcached controller: for every `Memcached`, a Deployment of `spec.size` memcached pods,
//! a Service in front of them, a PodDisruptionBudget when there is more than one, and a status
//! that lists them.
//!
//! # Watches
//! - `Memcached` objects (its own watch): new ones, spec changes and deletions; a change of
//!   status alone, almost always our own write, triggers nothing;
//! - Deployments, from the shared caches, mapped to the `Memcached` that controls them (or, for
//!   a Deployment nobody of ours controls, to the `Memcached` of the same name, which reports it
//!   and takes the name as soon as that Deployment is gone);
//! - Pod metadata, from the shared cache, mapped to their `Memcached` by the `memcached_cr`
//!   label, so `status.nodes` follows pods as they come and go (a pod is gone once its
//!   deletion starts); the cache indexes them by that label, so a reconcile reads only its own
//!   pods. While the Deployment's rollout is in motion a pod change triggers nothing: the
//!   rollout's end triggers through the Deployment and lists the pods then;
//! - managed Services and PodDisruptionBudgets, mapped to the `Memcached` that controls them;
//!   a budget's status alone (the disruption controller's, as pods come and go) triggers
//!   nothing.
//!
//! A change to a child that only shows this controller's own write (the resourceVersion its
//! create or apply was answered with), or the removal of a child it deleted itself, triggers
//! nothing either: the reconcile that wrote it has already accounted for it.
//!
//! # Reconcile
//! 0. The Service (same name, port `memcached`) is created when missing and applied again when
//!    edited; it is named in `status.service`. The PodDisruptionBudget (`maxUnavailable: 1`)
//!    follows the same rules while `size` > 1 and is deleted otherwise. One of that name owned
//!    by somebody else is left alone, with a `ServiceNotOwned` (`PodDisruptionBudgetNotOwned`)
//!    Warning Event.
//! 1. A Deployment of the same name that this `Memcached` does not control is left untouched:
//!    the status says `Degraded` (`DeploymentNotOwned`), a `DeploymentNotOwned` Warning Event
//!    says why (once, until the name is ours), and the check repeats every
//!    [`owned::FOREIGN_RECHECK`] (or on any change to the `Memcached` or that Deployment).
//! 2. Otherwise the desired Deployment is server-side applied (field manager
//!    [`FIELD_MANAGER`], forced): created when missing, put back when scaled or edited by hand.
//!    Events: `Created`, `Scaled`, `Updated`; `ReconcileFailed` when anything fails.
//! 3. The status (`nodes`, `readyReplicas`, `observedGeneration`, conditions) is computed from
//!    the Deployment and the cached pods, and written only when it changed; a state the rollout
//!    passes through is held back a moment (see [`kube_operator_runtime::status_writer::StatusWriter`]).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use apis::{Memcached, MemcachedSpec, MemcachedStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use kube_operator_runtime::children;
use kube_operator_runtime::deployment_view::DeploymentView;
use kube_operator_runtime::index::Index;
use kube_operator_runtime::meta_view::MetaView;
use kube_operator_runtime::status::{self, WorkloadOwner};
use kube_operator_runtime::status_writer::StatusWrite;
use kube_operator_runtime::watches::{self, PodMeta};
use kube_operator_runtime::{Builder, Child, Error, Outcome, PolicyRule, Registration, RunContext};
use kube_operator_runtime::{StatusWriter, Tools, labels, owned, rbac};

/// The controller's name: metrics label, configuration key, log field.
pub const NAME: &str = "memcached";
/// The server-side apply field manager of the objects this controller writes (the runtime's
/// `operator-manager/<controller>`).
pub const FIELD_MANAGER: &str = concat!(product::name!(), "/memcached");
/// Label on the Deployment and its pods: `app: memcached`.
pub const LABEL_APP: &str = "app";
/// The value of [`LABEL_APP`] (also `app.kubernetes.io/name`).
pub const APP: &str = "memcached";
/// Label on the Deployment and its pods naming the `Memcached` (as a [`labels::label_value`]).
pub const LABEL_CR: &str = "memcached_cr";
/// The memcached container's name.
pub const CONTAINER: &str = "memcached";
/// memcached's port.
pub const PORT: i32 = 11211;
/// The name of [`PORT`].
pub const PORT_NAME: &str = "memcached";
/// The user memcached runs as: the `memcache` user of the official image, by number because the
/// kubelet can only verify a numeric user against `runAsNonRoot`.
pub const RUN_AS_USER: i64 = 11211;
/// The memcached program, the command line's first word.
pub const PROGRAM: &str = "memcached";

/// The item memory when `spec.memory` is not set, in MiB: the seed's `-m=64`.
pub const DEFAULT_MEMORY_MIB: u64 = 64;

/// The memcached command line: `memory_mib` of memory for items, modern defaults, verbose.
///
/// `-m 64`, not the tutorial's `-m=64`: memcached reads short options with getopt, which hands
/// it `=64`; that parses as 0 MB and memcached 1.6 refuses to start.
pub fn command(memory_mib: u64) -> Vec<String> {
    [PROGRAM, "-m", &memory_mib.to_string(), "-o", "modern", "-v"]
        .map(str::to_owned)
        .to_vec()
}

/// The item memory `spec.memory` asks for, in whole MiB (rounded down).
///
/// # Errors
/// [`Error::InvalidSpec`] when it is no quantity or less than 1Mi.
pub fn memory_mib(spec: &MemcachedSpec) -> Result<u64, Error> {
    let Some(memory) = &spec.memory else {
        return Ok(DEFAULT_MEMORY_MIB);
    };
    let invalid = |reason: String| Error::InvalidSpec {
        field: "spec.memory",
        reason,
    };
    match kube_operator_runtime::quantity::mebibytes(&memory.0).map_err(invalid)? {
        0 => Err(invalid(format!("{:?} is less than 1Mi", memory.0))),
        mib => Ok(mib),
    }
}

/// The Memcached controller, as registered in [`crate::all`].
pub const CONTROLLER: Registration = Registration::new(NAME, &RULES, |ctx| Box::pin(run(ctx)))
    .with_webhooks(crate::admission::memcached::webhooks)
    .with_conversion(crate::admission::memcached::conversion)
    .with_samples(crate::samples::memcached);

static RULES: [PolicyRule; 8] = kube_operator_runtime::controller_rules!(
    product::group!(cache),
    "memcacheds",
    rbac::DEPLOYMENTS,
    rbac::PODS_READ,
    SERVICES,
    POD_DISRUPTION_BUDGETS
);

/// The Service in front of each `Memcached`'s pods, owned and applied.
const SERVICES: PolicyRule = rbac::owns::<Service>();

/// The PodDisruptionBudget of each `Memcached` of more than one pod, owned and applied, and
/// deleted when the `Memcached` shrinks to one.
const POD_DISRUPTION_BUDGETS: PolicyRule = rbac::owns_and_deletes::<PodDisruptionBudget>();

/// What every reconcile of this controller uses: the runtime's tools, its status writer, and
/// the pods by `Memcached`.
struct Context {
    tools: Tools<Memcached>,
    statuses: StatusWriter<Memcached>,
    pods: Index<PodMeta>,
}

async fn run(ctx: RunContext) -> Result<(), Error> {
    let pods = ctx.watches.pods();
    let deployments = ctx.watches.deployments().store();
    let budgets = watches::managed_by_generation::<PodDisruptionBudget>();
    let context = |tools: Tools<Memcached>| Context {
        statuses: StatusWriter::new(tools.client.clone(), tools.own_writes.clone()),
        pods: pods.index(PODS_BY_MEMCACHED, pod_index_key),
        tools,
    };
    Builder::<Memcached>::new(NAME, &ctx)
        .owns_one_as::<Deployment, DeploymentView>(watches::managed_deployments())
        .owns_kind::<Service>()
        .owns_kind_as::<PodDisruptionBudget, MetaView<PodDisruptionBudget>>(budgets)
        .uses::<PodDisruptionBudget>(&["delete"])
        .watches(
            &pods,
            move |memcacheds: &Store<Memcached>, pod: &PodMeta| {
                for_pod_news(memcacheds, &deployments, pod)
            },
        )
        .run(context, reconcile)
        .await
}

/// The name of the pod index of this controller: pods by [`pod_index_key`].
const PODS_BY_MEMCACHED: &str = "memcached-pods";

/// A memcached pod's key in [`PODS_BY_MEMCACHED`]: `<namespace>/<memcached_cr label>`.
fn pod_index_key(pod: &PodMeta) -> Option<String> {
    if pod.labels.get(LABEL_APP) != Some(APP) {
        return None;
    }
    let namespace = pod.metadata.namespace.as_deref()?;
    Some(format!("{namespace}/{}", pod.labels.get(LABEL_CR)?))
}

/// The [`PODS_BY_MEMCACHED`] key of the pods of the `Memcached` `namespace/name`.
fn pods_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{}", labels::label_value(name))
}

/// The `Memcached` a pod belongs to, by its labels. The `memcached_cr` value is the name itself
/// unless the name is longer than a label value allows; then (a value of the shortened shape)
/// the `Memcached`s are searched for the one whose shortened name it is.
fn pod_owner(memcacheds: &Store<Memcached>, pod: &PodMeta) -> Option<Arc<Memcached>> {
    if pod.labels.get(LABEL_APP) != Some(APP) {
        return None;
    }
    let value = pod.labels.get(LABEL_CR)?;
    let namespace = pod.metadata.namespace.as_deref()?;
    if let Some(direct) = memcacheds.get(&ObjectRef::new(value).within(namespace)) {
        return Some(direct);
    }
    // Only a shortened name is searched for: a pod of a `Memcached` that is gone (thousands of
    // them, as a namespace is deleted) must not scan the whole cache.
    if !labels::may_be_shortened(value) {
        return None;
    }
    memcacheds.find(|mc| {
        mc.metadata.namespace.as_deref() == Some(namespace)
            && labels::label_value(&mc.name_any()) == value
    })
}

/// The `Memcached` a pod change is news to: its own ([`pod_owner`]), unless that one's
/// Deployment, in `deployments`, is in a rollout in motion, whose end brings the pod's change
/// along ([`owned::rollout_in_motion`]).
fn for_pod_news(
    memcacheds: &Store<Memcached>,
    deployments: &Store<DeploymentView>,
    pod: &PodMeta,
) -> Option<ObjectRef<Memcached>> {
    let mc = pod_owner(memcacheds, pod)?;
    (!owned::rollout_in_motion(deployments, mc.as_ref(), mc.spec.size))
        .then(|| kube_operator_runtime::object_key(mc.as_ref()))
}

/// The labels that select a `Memcached`'s pods: `app: memcached`, `memcached_cr: <name>`.
pub fn selector_labels(memcached_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_APP.to_owned(), APP.to_owned()),
        (LABEL_CR.to_owned(), labels::label_value(memcached_name)),
    ])
}

/// Every label of the Deployment and its pods: the selector plus the recommended
/// `app.kubernetes.io/*` labels.
pub fn object_labels(memcached_name: &str) -> BTreeMap<String, String> {
    let mut all = selector_labels(memcached_name);
    all.insert(labels::NAME.to_owned(), APP.to_owned());
    let instance = labels::label_value(memcached_name);
    all.insert(labels::INSTANCE.to_owned(), instance);
    labels::managed(all)
}

/// The Deployment a `Memcached` asks for.
///
/// # Errors
/// [`Error::MissingField`] when `mc` lacks a namespace or uid (it was not read from the server).
pub fn desired_deployment(mc: &Memcached) -> Result<Deployment, Error> {
    let name = mc.name_any();
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(mc.spec.image.clone()),
        command: Some(command(memory_mib(&mc.spec)?)),
        resources: mc.spec.resources.clone(),
        ports: Some(vec![ContainerPort {
            container_port: PORT,
            name: Some(PORT_NAME.to_owned()),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        ..Container::default()
    };
    owned::desired_deployment(
        mc,
        mc.spec.size,
        object_labels(&name),
        selector_labels(&name),
        container,
        RUN_AS_USER,
    )
}

/// The sorted names of a `Memcached`'s pods among `pods`, leaving out pods being deleted.
pub fn pod_names<'a>(
    pods: impl IntoIterator<Item = &'a PodMeta>,
    namespace: &str,
    memcached_name: &str,
) -> Vec<String> {
    let selector = selector_labels(memcached_name);
    let mut names: Vec<String> = pods
        .into_iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.deletion_timestamp.is_none()
        })
        .filter(|p| p.labels.contains_all(&selector))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    names
}

/// The name of a `Memcached`'s Service: its own, unless that is no DNS label (Service names
/// must be), then a [`labels::dns_label`] for it.
pub fn service_name(memcached_name: &str) -> String {
    labels::dns_label(memcached_name)
}

/// The Service a `Memcached` asks for: named by [`service_name`], port `memcached` (11211) to
/// its pods.
///
/// # Errors
/// [`Error::MissingField`] when `mc` lacks a namespace or uid (it was not read from the server).
pub fn desired_service(mc: &Memcached) -> Result<Service, Error> {
    let name = mc.name_any();
    let mut metadata = children::child_metadata(mc, object_labels(&name))?;
    metadata.name = Some(service_name(&name));
    Ok(Service {
        metadata,
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(&name)),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_owned()),
                port: PORT,
                target_port: Some(IntOrString::String(PORT_NAME.to_owned())),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    })
}

/// The PodDisruptionBudget of a `Memcached` of more than one pod: a voluntary disruption (a
/// node drain) takes at most one memcached pod, and so at most its share of the cache, at a
/// time.
///
/// # Errors
/// [`Error::MissingField`] when `mc` lacks a namespace or uid (it was not read from the server).
pub fn desired_budget(mc: &Memcached) -> Result<PodDisruptionBudget, Error> {
    let name = mc.name_any();
    Ok(PodDisruptionBudget {
        metadata: children::child_metadata(mc, object_labels(&name))?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&name)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    })
}

/// The status a `Memcached` should report, given its Deployment (`None` when it is blocked by a
/// foreign one), its pods and its Service (`None` while it has none of its own). Conditions
/// whose status holds keep their transition time.
pub fn desired_status(
    mc: &Memcached,
    deployment: Option<&DeploymentView>,
    nodes: Vec<String>,
    service: Option<String>,
    now: &Time,
) -> MemcachedStatus {
    let reported = status::report(mc, mc.spec.size, deployment, now);
    MemcachedStatus {
        nodes,
        service,
        ready_replicas: reported.ready,
        observed_generation: reported.observed_generation,
        conditions: reported.conditions,
    }
}

async fn reconcile(mc: Arc<Memcached>, ctx: Arc<Context>) -> Result<Outcome, Error> {
    let (tools, statuses) = (&ctx.tools, &ctx.statuses);
    let mc = &*statuses.latest(&mc);
    if mc.metadata.deletion_timestamp.is_some() {
        // Being deleted: the garbage collector removes the Deployment; applying now would only
        // recreate what it deletes.
        return Ok(Outcome::Done);
    }
    let (namespace, name) = (mc.namespace().unwrap_or_default(), mc.name_any());
    let service = match tools.ensure(mc, &desired_service(mc)?).await? {
        Child::Current | Child::Written => Some(service_name(&name)),
        Child::Foreign => None,
        Child::NamespaceTerminating => return Ok(Outcome::Done),
    };
    if mc.spec.size > 1 {
        tools.ensure(mc, &desired_budget(mc)?).await?;
    } else if tools
        .remove::<PodDisruptionBudget>(mc, &namespace, &name)
        .await?
    {
        tracing::debug!("deleted the PodDisruptionBudget of a single pod");
    }
    let desired = desired_deployment(mc)?;
    let deployment: Option<Arc<DeploymentView>> =
        match owned::ensure_workload(tools, mc, &desired).await? {
            ControlFlow::Continue(deployment) => deployment,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };

    let pods = ctx.pods.get(&pods_key(&namespace, &name));
    let nodes = pod_names(pods.iter().map(Arc::as_ref), &namespace, &name);
    let now = kube_operator_runtime::conditions::now();
    let status = desired_status(mc, deployment.as_deref(), nodes, service, &now);
    let progress = status::progress(mc.spec.size, deployment.as_deref(), mc.current_conditions());
    let (nodes, ready) = (status.nodes.len(), status.ready_replicas);
    let written = statuses.write(mc, status, progress).await?;
    if written == StatusWrite::Written {
        tracing::debug!(nodes, ready, "status changed");
    }
    Ok(owned::after_status(written, deployment.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_operator_runtime::testing;

    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher;
    use kube_operator_runtime::conditions::{AVAILABLE, DEGRADED};

    fn memcached(name: &str, size: i32) -> Memcached {
        let mut mc = Memcached::new(
            name,
            MemcachedSpec {
                size,
                image: apis::memcached::DEFAULT_IMAGE.into(),
                ..Default::default()
            },
        );
        mc.metadata.namespace = Some("ns".into());
        mc.metadata.uid = Some("uid-1".into());
        mc.metadata.generation = Some(2);
        mc
    }

    fn pod(name: &str, namespace: &str, labels: BTreeMap<String, String>) -> PodMeta {
        PodMeta::new(ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        })
    }

    fn time(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).expect("valid time"))
    }

    #[test]
    fn desired_deployment_matches_the_design() {
        let d = desired_deployment(&memcached("memcached-sample", 3)).expect("desired deployment");
        assert_eq!(d.metadata.name.as_deref(), Some("memcached-sample"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("ns"));
        testing::assert_controlled_by(&d.metadata, "Memcached", "uid-1");
        testing::assert_selects_its_pods(&d.spec.selector, &d.spec.template);

        let labels = d.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["app"], "memcached");
        assert_eq!(labels["memcached_cr"], "memcached-sample");
        assert_eq!(labels["app.kubernetes.io/name"], "memcached");
        assert_eq!(labels["app.kubernetes.io/instance"], "memcached-sample");
        assert_eq!(labels["app.kubernetes.io/managed-by"], labels::manager());

        let spec = &d.spec;
        assert_eq!(spec.replicas, Some(3));
        let selector = spec.selector.match_labels.clone().unwrap_or_default();
        assert_eq!(selector, selector_labels("memcached-sample"));

        let pod = spec.template.spec.as_ref().expect("pod spec");
        assert_eq!(pod.containers.len(), 1);
        let c = &pod.containers[0];
        assert_eq!(c.name, "memcached");
        assert_eq!(c.image.as_deref(), Some(apis::memcached::DEFAULT_IMAGE));
        assert_eq!(
            c.command.clone().unwrap_or_default(),
            ["memcached", "-m", "64", "-o", "modern", "-v"]
        );
        let port = &c.ports.as_ref().expect("ports")[0];
        assert_eq!(
            (port.container_port, port.name.as_deref()),
            (11211, Some("memcached"))
        );
        assert_eq!(
            c.security_context.as_ref().and_then(|s| s.run_as_user),
            Some(11211)
        );
        testing::assert_restricted(&d.spec.template);
    }

    #[test]
    fn desired_deployment_serializes_for_server_side_apply() {
        let d = desired_deployment(&memcached("m", 1)).expect("desired deployment");
        let json = serde_json::to_value(&d).expect("serializes");
        assert_eq!(json["apiVersion"], "apps/v1");
        assert_eq!(json["kind"], "Deployment");
        assert!(
            json.get("status").is_none(),
            "apply must not claim status fields"
        );
    }

    #[test]
    fn long_names_get_valid_labels_and_a_matching_selector() {
        let name = format!("m{}", "x".repeat(99));
        assert_eq!(name.len(), 100);
        let d = desired_deployment(&memcached(&name, 1)).expect("desired deployment");
        assert_eq!(
            d.metadata.name.as_deref(),
            Some(name.as_str()),
            "the Deployment keeps the full name"
        );
        for (key, value) in d.metadata.labels.iter().flatten() {
            assert!(labels::is_valid_label_value(value), "{key}={value}");
        }
        let selector = d.spec.selector.match_labels.clone().unwrap_or_default();
        assert!(
            selector
                .values()
                .all(|v| v.len() <= 63 && labels::is_valid_label_value(v))
        );
    }

    #[test]
    fn pod_names_are_the_cr_pods_sorted() {
        let mine = selector_labels("mc");
        let pods = [
            pod("mc-b", "ns", mine.clone()),
            pod("mc-a", "ns", mine.clone()),
            pod("other", "ns", selector_labels("other")),
            pod("mc-elsewhere", "ns2", mine.clone()),
            pod("unlabelled", "ns", BTreeMap::new()),
        ];
        let mut terminating = pod("mc-c", "ns", mine);
        terminating.metadata.deletion_timestamp = Some(time(1));
        let all: Vec<&PodMeta> = pods.iter().chain([&terminating]).collect();
        assert_eq!(pod_names(all, "ns", "mc"), ["mc-a", "mc-b"]);
    }

    fn store_of(memcacheds: Vec<Memcached>) -> Store<Memcached> {
        let mut writer = kube::runtime::reflector::store::Writer::default();
        for mc in memcacheds {
            writer.apply_watcher_event(&watcher::Event::Apply(mc));
        }
        writer.as_reader()
    }

    #[test]
    fn pods_map_to_their_memcached_even_with_long_names() {
        let long = format!("m{}", "y".repeat(99));
        let store = store_of(vec![memcached("short", 1), memcached(&long, 1)]);
        let owner = |pod: &PodMeta| {
            pod_owner(&store, pod).map(|mc| kube_operator_runtime::object_key(&*mc))
        };
        assert_eq!(
            owner(&pod("p1", "ns", object_labels("short"))),
            Some(ObjectRef::new("short").within("ns"))
        );
        assert_eq!(
            owner(&pod("p2", "ns", object_labels(&long))),
            Some(ObjectRef::new(&long).within("ns"))
        );
        assert_eq!(owner(&pod("p3", "other", object_labels("short"))), None);
        assert_eq!(owner(&pod("p4", "ns", BTreeMap::new())), None);
    }

    /// A cache of one Deployment: `mc`'s own, with `ready` of its pods ready and available.
    fn deployment_cache(mc: &Memcached, ready: i32) -> Store<DeploymentView> {
        let desired = desired_deployment(mc).expect("desired deployment");
        let mut deployment = DeploymentView::from(desired);
        deployment.metadata.generation = Some(1);
        deployment.status = ready_deployment(ready).status;
        let mut writer = kube::runtime::reflector::store::Writer::default();
        writer.apply_watcher_event(&watcher::Event::Apply(deployment));
        writer.as_reader()
    }

    #[test]
    fn a_pod_change_waits_for_a_rollout_in_motion() {
        let mc = memcached("mc", 3);
        let memcacheds = store_of(vec![mc.clone()]);
        let p = pod("mc-a", "ns", object_labels("mc"));
        let own = Some(ObjectRef::new("mc").within("ns"));

        let settled = deployment_cache(&mc, 3);
        assert_eq!(
            for_pod_news(&memcacheds, &settled, &p),
            own,
            "a pod of a settled Deployment (replaced by hand) is news"
        );
        let moving = deployment_cache(&mc, 2);
        assert_eq!(
            for_pod_news(&memcacheds, &moving, &p),
            None,
            "the rollout's end brings it"
        );
        let mut predecessor = mc.clone();
        predecessor.metadata.uid = Some("uid-0".into());
        let not_its_own = deployment_cache(&predecessor, 2);
        assert_eq!(for_pod_news(&memcacheds, &not_its_own, &p), own);

        let mut failed = mc.clone();
        failed.status = Some(MemcachedStatus {
            conditions: vec![Condition {
                type_: DEGRADED.into(),
                status: "True".into(),
                reason: "ReplicaFailure".into(),
                message: String::new(),
                last_transition_time: time(1),
                observed_generation: None,
            }],
            ..MemcachedStatus::default()
        });
        assert_eq!(
            for_pod_news(&store_of(vec![failed]), &moving, &p),
            own,
            "leaving a reported failure is news at once"
        );
    }

    #[test]
    fn pods_are_indexed_under_their_memcacheds_key() {
        let long = "m".repeat(80);
        for name in ["short", long.as_str()] {
            let p = pod("p", "ns", object_labels(name));
            assert_eq!(pod_index_key(&p), Some(pods_key("ns", name)), "{name}");
        }
        let mut other_app = object_labels("short");
        other_app.insert(LABEL_APP.into(), "other".into());
        assert_eq!(pod_index_key(&pod("p", "ns", other_app)), None);
        assert_eq!(pod_index_key(&pod("p", "ns", BTreeMap::new())), None);
    }

    #[test]
    fn deployments_map_to_their_controller_or_namesake() {
        let store = store_of(vec![memcached("a", 1)]);
        let owned = desired_deployment(&memcached("a", 1)).expect("desired deployment");
        assert_eq!(
            kube_operator_runtime::builder::controller_or_namesake(&store, &owned),
            Some(ObjectRef::new("a").within("ns"))
        );
        let metadata_only =
            kube_operator_runtime::watches::DeploymentMeta::new(owned.metadata.clone());
        assert_eq!(
            kube_operator_runtime::builder::controller_or_namesake(&store, &metadata_only),
            Some(ObjectRef::new("a").within("ns"))
        );
        let mut foreign = Deployment::default();
        foreign.metadata.name = Some("a".into());
        foreign.metadata.namespace = Some("ns".into());
        assert_eq!(
            kube_operator_runtime::builder::controller_or_namesake(&store, &foreign),
            Some(ObjectRef::new("a").within("ns"))
        );
        foreign.metadata.name = Some("b".into());
        assert_eq!(
            kube_operator_runtime::builder::controller_or_namesake(&store, &foreign),
            None
        );
    }

    fn ready_deployment(n: i32) -> DeploymentView {
        DeploymentView {
            metadata: ObjectMeta {
                generation: Some(1),
                ..ObjectMeta::default()
            },
            status: Some(DeploymentStatus {
                observed_generation: Some(1),
                replicas: Some(n),
                updated_replicas: Some(n),
                ready_replicas: Some(n),
                available_replicas: Some(n),
                ..DeploymentStatus::default()
            }),
            ..DeploymentView::default()
        }
    }

    #[test]
    fn status_reports_nodes_readiness_and_generation() {
        let mc = memcached("mc", 3);
        let nodes = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let status = desired_status(
            &mc,
            Some(&ready_deployment(3)),
            nodes.clone(),
            Some("mc".into()),
            &time(10),
        );
        assert_eq!(status.nodes, nodes);
        assert_eq!(status.service.as_deref(), Some("mc"));
        assert_eq!(status.ready_replicas, 3);
        assert_eq!(status.observed_generation, Some(2));
        let available = status
            .conditions
            .iter()
            .find(|c| c.type_ == AVAILABLE)
            .expect("Available");
        assert_eq!(available.status, "True");
    }

    #[test]
    fn status_is_unchanged_when_nothing_changed() {
        let mut mc = memcached("mc", 3);
        let first = desired_status(
            &mc,
            Some(&ready_deployment(3)),
            vec!["a".into()],
            None,
            &time(10),
        );
        mc.status = Some(first.clone());
        let again = desired_status(
            &mc,
            Some(&ready_deployment(3)),
            vec!["a".into()],
            None,
            &time(20),
        );
        assert_eq!(
            mc.status.as_ref(),
            Some(&again),
            "no write when nothing changed"
        );
        let moved = desired_status(
            &mc,
            Some(&ready_deployment(3)),
            vec!["b".into()],
            None,
            &time(30),
        );
        assert_ne!(
            mc.status.as_ref(),
            Some(&moved),
            "a new pod name is a change"
        );
        assert!(
            moved
                .conditions
                .iter()
                .all(|c| c.last_transition_time == time(10))
        );
    }

    #[test]
    fn status_reports_a_foreign_deployment_as_degraded() {
        let status = desired_status(&memcached("mc", 3), None, Vec::new(), None, &time(10));
        let degraded = status
            .conditions
            .iter()
            .find(|c| c.type_ == DEGRADED)
            .expect("Degraded");
        assert_eq!(degraded.status, "True");
        assert_eq!(degraded.reason, "DeploymentNotOwned");
        assert_eq!(status.ready_replicas, 0);
    }

    #[test]
    fn the_service_and_the_budget_select_the_pods_and_are_owned() {
        let mc = memcached("mc", 3);
        let service = desired_service(&mc).expect("desired service");
        assert_eq!(service.metadata.name.as_deref(), Some("mc"));
        let spec = service.spec.expect("service spec");
        assert_eq!(spec.selector, Some(selector_labels("mc")));
        let port = &spec.ports.expect("ports")[0];
        assert_eq!(
            (port.port, port.name.as_deref()),
            (11211, Some("memcached"))
        );
        assert_eq!(
            port.target_port,
            Some(IntOrString::String("memcached".into()))
        );
        assert!(spec.type_.is_none(), "a ClusterIP Service by default");

        let budget = desired_budget(&mc).expect("desired budget");
        let spec = budget.spec.expect("budget spec");
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(
            spec.selector.and_then(|s| s.match_labels),
            Some(selector_labels("mc"))
        );
        for metadata in [&service.metadata, &budget.metadata] {
            let owner = &metadata.owner_references.as_ref().expect("owner")[0];
            assert_eq!(
                (owner.kind.as_str(), owner.controller),
                ("Memcached", Some(true))
            );
            assert_eq!(
                metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(labels::MANAGED_BY)),
                Some(&labels::manager().to_owned()),
                "the shared watch of managed children sees it"
            );
        }
    }

    #[test]
    fn rbac_rules_cover_what_the_controller_does() {
        let rules = CONTROLLER.rbac_rules;
        crate::testing::assert_deployment_owner_rules(rules, product::group!(cache), "memcacheds");
        for verb in ["list", "watch"] {
            assert!(rbac::allows(rules, "", "pods", verb), "pods {verb}");
        }
        assert!(
            !rbac::allows(rules, "", "pods", "get"),
            "pods are only cached"
        );
        for verb in rbac::MANAGE {
            assert!(rbac::allows(rules, "", "services", verb), "services {verb}");
            let budgets = "poddisruptionbudgets";
            assert!(
                rbac::allows(rules, "policy", budgets, verb),
                "{budgets} {verb}"
            );
        }
    }
}
