//! The one Deployment a workload custom resource (Memcached, MyApp) owns: finding it without
//! taking over somebody else's, applying it only when that changes something, and the Events
//! that say what changed.

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
use crate::builder::{Builder, Tools};
use crate::children::{self as ownership, OwnedChildren, Wrote, is_controlled_by};
use crate::deployment_view::DeploymentView;
use crate::driver::Outcome;
use crate::events::Events;
pub use crate::own_writes::UNSEEN_FOR;
use crate::pod_security;
use crate::status::{REASON_NOT_OWNED, WorkloadOwner, reports};
use crate::status_writer::{Progress, StatusWrite, StatusWriter, WithStatus};
use crate::workload::Workload;

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
pub fn desired_deployment<K: WorkloadOwner>(
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

/// What [`OwnedDeployments::ensure`] came to.
#[derive(Clone, Debug)]
pub enum Ensured {
    /// The owner's Deployment, up to date, as the cache shows it.
    Ready(Arc<DeploymentView>),
    /// The Deployment was just created or changed, and the cache or the Deployment controller
    /// has not caught up yet: the Deployment controller's next write to it triggers the owner
    /// again, and until then there is nothing worth reporting. Reconcile again after `recheck`
    /// if no event comes first.
    Pending {
        /// When to look again regardless.
        recheck: Duration,
    },
    /// A Deployment of that name that the owner does not control; it was left untouched and a
    /// Warning Event says so (once, until the owner stops reporting it).
    Foreign,
    /// The namespace is being deleted: nothing to do, the owner goes with it.
    NamespaceTerminating,
}

impl Ensured {
    /// The Deployment the owner's status reports (`None` when a foreign one blocks it), or what
    /// the reconcile asks for when it ends here.
    pub fn proceed(self) -> ControlFlow<Outcome, Option<Arc<DeploymentView>>> {
        match self {
            Ensured::Ready(deployment) => ControlFlow::Continue(Some(deployment)),
            Ensured::Foreign => ControlFlow::Continue(None),
            // The Deployment's watch event brings the news (and the owner back).
            Ensured::Pending { recheck } => ControlFlow::Break(Outcome::RequeueAfter(recheck)),
            Ensured::NamespaceTerminating => ControlFlow::Break(Outcome::Done),
        }
    }
}

/// What an owner's reconcile asks for once its status is written: the end of a held write,
/// else another look at a foreign Deployment that blocks it (`deployment` is `None`), else
/// nothing until the next event.
pub fn after_status(written: StatusWrite, deployment: Option<&DeploymentView>) -> Outcome {
    match (written, deployment) {
        (StatusWrite::Held { retry }, _) => Outcome::RequeueAfter(retry),
        (_, None) => Outcome::RequeueAfter(FOREIGN_RECHECK),
        (_, Some(_)) => Outcome::Done,
    }
}

/// What every Deployment owner's reconcile uses: its status writer, its Event recorder and the
/// writer of its Deployments.
#[derive(Debug)]
pub struct OwnerTools<K: WithStatus> {
    /// Writes the owner's status once per change.
    pub status: StatusWriter<K>,
    /// The controller's Event recorder.
    pub events: Events,
    /// Writes the owner's Deployment.
    pub deployments: OwnedDeployments,
}

impl<K: WithStatus> OwnerTools<K> {
    /// From what the builder hands a starting controller, and the `deployments` writer from
    /// [`OwnedDeployments::declare`].
    pub fn new(tools: Tools<K>, deployments: OwnedDeployments) -> Self {
        Self {
            status: StatusWriter::new(tools.client),
            events: tools.events,
            deployments,
        }
    }
}

/// How long the Deployment controller gets to pick up a spec we wrote before the owner reports
/// the rollout as it stands (that the Deployment controller has not seen it). On a quiet
/// cluster it takes milliseconds, on a busy one (a thousand owners scaled at once) seconds:
/// reporting that state each time would cost a status write per change for a state that ends
/// on its own, so only a Deployment controller stalled for as long as a rollout's status is
/// ever held ([`crate::status_writer::PROGRESS_MAX_HOLD`]) is reported. Until then the owner's
/// `observedGeneration` stays at the generation whose rollout it last reported.
pub const OBSERVE_GRACE: Duration = Duration::from_secs(30);

/// Writes the Deployments one controller owns, as [`OwnedChildren`] writes any child (see
/// [`crate::own_writes`]), and says more of them:
/// - [`Ensured::Pending`] while the cache is behind our write, and until the Deployment
///   controller has seen a spec we wrote (or [`OBSERVE_GRACE`] has passed): until then the
///   rollout is not worth reporting;
/// - `Created`, `Scaled` and `Updated` Events for what a write changed;
/// - a Deployment of the owner's name that somebody else holds is found in the shared cache of
///   the unmanaged Deployments, without a request, and reported once (see [`Ensured::Foreign`]).
pub struct OwnedDeployments {
    children: OwnedChildren<Deployment, DeploymentView>,
}

/// The custom resource of kind `K` a Deployment change concerns: the Deployment's controller,
/// or for a Deployment that no `K` controls, the `K` of the same name if there is one (it
/// reports the clash, and takes the name once the Deployment is gone).
pub fn owner_of<K, D>(owners: &Store<K>, deployment: &D) -> Option<ObjectRef<K>>
where
    K: WorkloadOwner + Clone,
    D: Resource,
{
    let namespace = deployment.namespace()?;
    if let Some(owner) = ownership::controller_of(deployment, &K::api_version(&()), &K::kind(&())) {
        return Some(ObjectRef::new(&owner.name).within(&namespace));
    }
    let namesake = ObjectRef::new(&deployment.name_any()).within(&namespace);
    owners.get(&namesake).map(|_| namesake)
}

/// Whether `owner`'s own Deployment, as the shared cache `deployments` shows it, is in a rollout
/// that the owner's status reports in motion ([`Progress::Moving`]) against `desired` replicas.
///
/// While it is, a change to the Deployment's pods (one created, one deleted) brings the owner's
/// reconcile nothing to write: its status lists the pods, a detail of a status in motion that
/// the [`StatusWriter`] keeps for the rollout's settled state, and every change of the
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

/// Says, once until the owner stops reporting it, that a Deployment of its name is somebody
/// else's and is left alone.
fn report_foreign<K: WorkloadOwner>(owner: &K, events: &Events) {
    let (namespace, name) = (owner.namespace().unwrap_or_default(), owner.name_any());
    let note = format!(
        "Deployment {namespace}/{name} exists and is not controlled by this {kind}; it is left \
         untouched. Delete or rename it, or rename the {kind}.",
        kind = K::kind(&())
    );
    tracing::warn!("{note}");
    if !reports(
        owner.current_conditions(),
        crate::conditions::DEGRADED,
        REASON_NOT_OWNED,
    ) {
        events.warning(&owner.object_ref(&()), REASON_NOT_OWNED, "Reconcile", note);
    }
}

impl std::fmt::Debug for OwnedDeployments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedDeployments")
            .field("children", &self.children)
            .finish()
    }
}

impl OwnedDeployments {
    /// Declares that each custom resource of `builder` owns one Deployment of its own name:
    /// changes to the managed Deployments, and to the others, trigger their owner (see
    /// [`owner_of`]). Returns the builder and what writes those Deployments as `field_manager`.
    pub fn declare<K>(builder: Builder<K>, field_manager: &'static str) -> (Builder<K>, Self)
    where
        K: WorkloadOwner + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync,
    {
        let ctx = builder.context();
        let (managed, unmanaged) = (
            ctx.watches.deployments(),
            ctx.watches.unmanaged_deployments(),
        );
        let children =
            OwnedChildren::new(ctx.client.clone(), managed.store(), field_manager.into())
                .with_namesakes(unmanaged.store());
        let own_write = children.own_writes();
        let builder = builder
            .watches_except(&managed, owner_of, own_write)
            .watches(&unmanaged, owner_of);
        (builder, Self { children })
    }

    /// Makes `owner`'s Deployment match `desired`, unless a Deployment of that name belongs to
    /// somebody else.
    ///
    /// # Errors
    /// [`Error::MissingField`] when `owner` was not read from the API server; [`Error::Kube`]
    /// when creating, reading or applying fails.
    pub async fn ensure<K: WorkloadOwner>(
        &self,
        owner: &K,
        desired: &Deployment,
        events: &Events,
    ) -> Result<Ensured, Error> {
        let uid = owner.uid().ok_or(Error::MissingField {
            kind: K::kind(&()),
            field: "metadata.uid",
        })?;
        let regarding = owner.object_ref(&());
        let written = Ensured::Pending {
            recheck: OBSERVE_GRACE,
        };
        Ok(match self.children.write(desired, &uid).await? {
            Wrote::Current { cached, written } => {
                match OBSERVE_GRACE.checked_sub(written.at.elapsed()) {
                    Some(left) if !cached.observed() => Ensured::Pending { recheck: left },
                    _ => Ensured::Ready(cached),
                }
            }
            Wrote::OnItsWay => Ensured::Pending {
                recheck: UNSEEN_FOR,
            },
            Wrote::Applied {
                before: Some(current),
                changed: false,
            } => Ensured::Ready(current),
            Wrote::Applied { before, .. } => {
                if let Some(before) = before {
                    announce_changes(events, &regarding, &before, desired);
                }
                written
            }
            Wrote::Created => {
                let (name, replicas) = (desired.name_any(), desired.spec.replicas.unwrap_or(1));
                let image = images(desired).join(", ");
                let note = format!("Created Deployment {name} with {replicas} replicas of {image}");
                events.normal(&regarding, "Created", "CreateDeployment", note);
                written
            }
            Wrote::Foreign => {
                report_foreign(owner, events);
                Ensured::Foreign
            }
            Wrote::NamespaceTerminating => Ensured::NamespaceTerminating,
        })
    }
}

/// The images of `desired`'s containers, in order.
fn images(desired: &Deployment) -> Vec<&str> {
    containers(desired).filter_map(|(_, image)| image).collect()
}

/// The name and image of each of `desired`'s containers.
fn containers(desired: &Deployment) -> impl Iterator<Item = (&str, Option<&str>)> {
    desired
        .spec
        .template
        .spec
        .iter()
        .flat_map(|pod| &pod.containers)
        .map(|c| (c.name.as_str(), c.image.as_deref()))
}

/// Events for what applying to `current` changed: a new replica count, a new (or restored)
/// image.
fn announce_changes(
    events: &Events,
    regarding: &k8s_openapi::api::core::v1::ObjectReference,
    current: &DeploymentView,
    desired: &Deployment,
) {
    let name = desired.name_any();
    let (had, replicas) = (
        current.desired_replicas(),
        desired.spec.replicas.unwrap_or(1),
    );
    if had != replicas {
        let note = format!("Scaled Deployment {name} from {had} to {replicas} replicas");
        events.normal(regarding, "Scaled", "ScaleDeployment", note);
    }
    let runs = |(name, image): (&str, Option<&str>)| {
        current
            .containers
            .iter()
            .any(|c| c.name == name && c.image.as_deref() == image)
    };
    if !containers(desired).all(runs) {
        let image = images(desired).join(", ");
        let note = format!("Set the image of Deployment {name} to {image}");
        events.normal(regarding, "Updated", "UpdateDeployment", note);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::hash_of;

    fn deployment(replicas: i32) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.name = Some("d".into());
        d.spec.replicas = Some(replicas);
        d
    }

    #[test]
    fn the_same_desired_object_hashes_the_same_and_a_change_does_not() {
        let a = hash_of(&deployment(3)).expect("hashes");
        assert_eq!(a, hash_of(&deployment(3)).expect("hashes"));
        assert_ne!(a, hash_of(&deployment(4)).expect("hashes"));
    }
}
