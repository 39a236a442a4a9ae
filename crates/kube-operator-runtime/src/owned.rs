//! What the owner of a workload (a Deployment, a StatefulSet: any kind with a [`ChildView`]
//! that tells when it is [observed](ChildView::observed)) does with it: the Deployment it asks
//! for, its reconcile's way on from [`Tools::ensure`], and what a change to the workload's pods
//! is worth while its rollout moves.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::Error;
use crate::builder::Tools;
use crate::children::{
    self as ownership, Child, ChildObject, ChildView, OBSERVE_GRACE, is_controlled_by,
};
use crate::deployment_view::DeploymentView;
use crate::driver::Outcome;
use crate::pod_security;
use crate::status::WorkloadOwner;
use crate::status_writer::{Progress, StatusWrite};

/// How often an owner blocked by a foreign Deployment checks again, besides on every change to
/// it or to that Deployment.
pub const FOREIGN_RECHECK: Duration = Duration::from_secs(120);

/// The Deployment `owner` asks for: its own name and namespace, a controller owner reference,
/// `replicas` pods labelled `labels` and selected by `selector`, each
/// running `container` as `run_as_user` under the `restricted` Pod Security Standard.
///
/// # Errors
/// [`Error::MissingField`] when `owner` lacks a namespace or uid (it was not read from the
/// server).
pub fn desired_deployment<K: Resource<DynamicType = ()>>(
    owner: &K,
    replicas: i32,
    labels: BTreeMap<String, String>,
    selector: BTreeMap<String, String>,
    container: Container,
    run_as_user: i64,
) -> Result<Deployment, Error> {
    let container = Container {
        security_context: Some(pod_security::restricted_container_security(run_as_user)),
        ..container
    };
    Ok(Deployment {
        metadata: ownership::child_metadata(owner, labels.clone())?,
        spec: DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    security_context: Some(pod_security::restricted_pod_security(run_as_user)),
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        ..Deployment::default()
    })
}

/// Ensures `owner`'s workload is `desired` ([`Tools::ensure`]) and reads it back as `V` (as
/// declared with [`crate::Builder::owns_one_as`]): the workload whose rollout the owner's
/// status reports, `None` when somebody else's holds the name; or, when it was just written and
/// the cache or its controller has not caught up, the outcome the reconcile ends with. Until
/// then there is nothing worth reporting, and the workload's next change (its controller's
/// write) triggers the owner again.
///
/// # Errors
/// As [`Tools::ensure`] and [`Tools::get`].
pub async fn ensure_workload<K, C, V>(
    tools: &Tools<K>,
    owner: &K,
    desired: &C,
) -> Result<ControlFlow<Outcome, Option<Arc<V>>>, Error>
where
    K: Resource<DynamicType = ()> + 'static,
    C: ChildObject + Send + Sync + 'static,
    V: ChildView<C>,
{
    let recheck = ControlFlow::Break(Outcome::RequeueAfter(OBSERVE_GRACE));
    Ok(match tools.ensure(owner, desired).await? {
        Child::Current => {
            let namespace = desired.namespace();
            let workload = tools.get::<C, V>(owner, namespace.as_deref(), &desired.name_any())?;
            // Gone from the cache since it was judged current: its watch event is on its way.
            workload.map_or(recheck, |workload| ControlFlow::Continue(Some(workload)))
        }
        Child::Foreign => ControlFlow::Continue(None),
        Child::Written => recheck,
        Child::NamespaceTerminating => ControlFlow::Break(Outcome::Done),
    })
}

/// What an owner's reconcile asks for once its status is written: the end of a held write,
/// else another look at a foreign workload that blocks it (`workload` is `None`), else nothing
/// until the next event.
pub fn after_status<W>(written: StatusWrite, workload: Option<&W>) -> Outcome {
    match (written, workload) {
        (StatusWrite::Held { retry }, _) => Outcome::RequeueAfter(retry),
        (_, None) => Outcome::RequeueAfter(FOREIGN_RECHECK),
        (_, Some(_)) => Outcome::Done,
    }
}

/// Whether `owner`'s own Deployment, as the shared cache `deployments` shows it, is in a rollout
/// that the owner's status reports in motion ([`Progress::Moving`]) against `desired` replicas.
///
/// While it is, a change to the Deployment's pods (one created, one deleted) brings the owner's
/// reconcile nothing to write: its status lists the pods, a detail of a status in motion that
/// the [`crate::StatusWriter`] keeps for the rollout's settled state, and every change of the
/// Deployment that could end the rollout triggers the owner itself, which reads the pods then.
/// A pod change of a settled Deployment (a pod deleted by hand) is news as always.
pub fn rollout_in_motion<K: WorkloadOwner>(
    deployments: &Store<DeploymentView>,
    owner: &K,
    desired: i32,
) -> bool {
    let (Some(namespace), Some(uid)) = (owner.namespace(), owner.uid()) else {
        return false;
    };
    let key = ObjectRef::new(&owner.name_any()).within(&namespace);
    deployments.get(&key).is_some_and(|deployment| {
        is_controlled_by(deployment.as_ref(), &uid)
            && crate::status::progress(
                desired,
                Some(deployment.as_ref()),
                owner.current_conditions(),
            ) == Progress::Moving
    })
}
