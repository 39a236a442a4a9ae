//! The one Deployment a workload custom resource (Memcached, MyApp) owns: finding it without
//! taking over somebody else's, applying it only when that changes something, and the Events
//! that say what changed.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::Error;
use crate::events::Events;
use crate::status::{REASON_NOT_OWNED, reports};
use crate::workload::{self, Existing};

/// A custom resource that owns one Deployment of its own name and namespace.
pub trait DeploymentOwner: Resource<DynamicType = ()> {
    /// The kind, for messages and Events.
    const KIND: &'static str;
    /// The container whose image the Events talk about.
    const CONTAINER: &'static str;
    /// The replicas the owner asks for.
    fn desired_replicas(&self) -> i32;
    /// The image the owner asks for.
    fn desired_image(&self) -> &str;
    /// The conditions its status reports now.
    fn current_conditions(&self) -> &[Condition];
}

/// The Deployment `owner` asks for: its own name and namespace, a controller owner reference,
/// [`DeploymentOwner::desired_replicas`] pods labelled `labels` and selected by `selector`, each
/// running `container` as `run_as_user` under the `restricted` Pod Security Standard.
///
/// # Errors
/// [`Error::MissingField`] when `owner` lacks a namespace or uid (it was not read from the
/// server).
pub fn desired_deployment<K: DeploymentOwner>(
    owner: &K,
    labels: BTreeMap<String, String>,
    selector: BTreeMap<String, String>,
    container: Container,
    run_as_user: i64,
) -> Result<Deployment, Error> {
    let namespace = owner.namespace().ok_or(Error::MissingField {
        kind: K::KIND,
        field: "metadata.namespace",
    })?;
    let container = Container {
        security_context: Some(workload::restricted_container_security(run_as_user)),
        ..container
    };
    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(owner.name_any()),
            namespace: Some(namespace),
            labels: Some(labels.clone()),
            owner_references: Some(vec![workload::owner_reference(owner)?]),
            ..ObjectMeta::default()
        },
        spec: DeploymentSpec {
            replicas: Some(owner.desired_replicas()),
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
                    security_context: Some(workload::restricted_pod_security(run_as_user)),
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
    /// The owner's Deployment, as just applied or as found already up to date.
    Ready(Arc<Deployment>),
    /// A Deployment of that name that the owner does not control; it was left untouched and a
    /// Warning Event says so (once, until the owner stops reporting it).
    Foreign,
    /// The namespace is being deleted: nothing to do, the owner goes with it.
    NamespaceTerminating,
}

/// Writes the Deployments one controller owns.
///
/// Every reconcile wants its Deployment to match the desired one, but most reconciles are
/// triggered by pod and status changes that leave the Deployment's spec alone. Applying anyway
/// is one request per reconcile that changes nothing. So this remembers, per Deployment, what it
/// last applied and the `metadata.generation` the API server answered with: while the cached
/// Deployment still has that generation, nobody changed its spec since (every spec change bumps
/// it), and if the desired object is also the same, the apply is skipped. A hand edit, a delete,
/// or a new desired spec all fail that test and are applied as before. The memory is per process:
/// a restarted manager applies once per object, which changes nothing on the server.
pub struct OwnedDeployments {
    client: kube::Client,
    cache: Store<Deployment>,
    field_manager: &'static str,
    applied: Mutex<HashMap<ObjectRef<Deployment>, Applied>>,
}

/// What was last applied to one Deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Applied {
    desired_hash: u64,
    generation: Option<i64>,
}

impl std::fmt::Debug for OwnedDeployments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedDeployments")
            .field("field_manager", &self.field_manager)
            .finish_non_exhaustive()
    }
}

impl OwnedDeployments {
    /// Deployments written under `field_manager`, found through the shared `cache`.
    pub fn new(
        client: kube::Client,
        cache: Store<Deployment>,
        field_manager: &'static str,
    ) -> Self {
        Self {
            client,
            cache,
            field_manager,
            applied: Mutex::default(),
        }
    }

    /// Makes `owner`'s Deployment match `desired`, unless a Deployment of that name belongs to
    /// somebody else.
    ///
    /// # Errors
    /// [`Error::MissingField`] when `owner` was not read from the API server; [`Error::Kube`]
    /// when looking up or applying fails.
    pub async fn ensure<K: DeploymentOwner>(
        &self,
        owner: &K,
        desired: &Deployment,
        events: &Events,
    ) -> Result<Ensured, Error> {
        let missing = |field| Error::MissingField {
            kind: K::KIND,
            field,
        };
        let name = owner.name_any();
        let namespace = owner.namespace().ok_or(missing("metadata.namespace"))?;
        let uid = owner.uid().ok_or(missing("metadata.uid"))?;
        let regarding = owner.object_ref(&());

        let existing =
            workload::find_deployment(&self.client, &self.cache, &namespace, &name, &uid).await?;
        if let Existing::Foreign(_) = existing {
            let note = format!(
                "Deployment {namespace}/{name} exists and is not controlled by this {kind}; it is left \
                 untouched. Delete or rename it, or rename the {kind}.",
                kind = K::KIND
            );
            tracing::warn!("{note}");
            if !reports(
                owner.current_conditions(),
                apis::condition::DEGRADED,
                REASON_NOT_OWNED,
            ) {
                events.warning(&regarding, REASON_NOT_OWNED, "Reconcile", note);
            }
            return Ok(Ensured::Foreign);
        }

        let key = ObjectRef::new(&name).within(&namespace);
        let desired_hash = hash_of(desired)?;
        if let Existing::Owned(current) = &existing
            && self.last_applied(&key)
                == Some(Applied {
                    desired_hash,
                    generation: current.metadata.generation,
                })
        {
            return Ok(Ensured::Ready(current.clone()));
        }

        let applied =
            match workload::apply_deployment(&self.client, &namespace, self.field_manager, desired)
                .await
            {
                Ok(applied) => applied,
                Err(e) if e.is_namespace_terminating() => {
                    tracing::debug!("namespace is being deleted; nothing to do");
                    return Ok(Ensured::NamespaceTerminating);
                }
                Err(e) => return Err(e),
            };
        self.remember(
            key,
            Applied {
                desired_hash,
                generation: applied.metadata.generation,
            },
        );
        announce(events, &regarding, &existing, owner);
        Ok(Ensured::Ready(Arc::new(applied)))
    }

    fn last_applied(&self, key: &ObjectRef<Deployment>) -> Option<Applied> {
        // A poisoned lock only means another reconcile panicked mid-insert; the map is still valid.
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .copied()
    }

    fn remember(&self, key: ObjectRef<Deployment>, applied: Applied) {
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, applied);
    }
}

fn hash_of(desired: &Deployment) -> Result<u64, Error> {
    let text = serde_json::to_string(desired).map_err(|source| Error::Serialize {
        kind: "Deployment",
        source,
    })?;
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    Ok(hasher.finish())
}

/// Passes `result` through, first queueing a `ReconcileFailed` Warning Event on `owner` when
/// it is an error, so a user sees failures with `kubectl describe` as well as in the logs.
pub fn report_failure<K, T>(
    owner: &K,
    events: &Events,
    result: Result<T, Error>,
) -> Result<T, Error>
where
    K: Resource<DynamicType = ()>,
{
    if let Err(e) = &result {
        let note = format!("Reconciling failed, will retry: {e}");
        events.warning(&owner.object_ref(&()), "ReconcileFailed", "Reconcile", note);
    }
    result
}

/// Events for what applying changed: a new Deployment, a new replica count, a new (or restored)
/// image.
fn announce<K: DeploymentOwner>(
    events: &Events,
    regarding: &k8s_openapi::api::core::v1::ObjectReference,
    existing: &Existing,
    owner: &K,
) {
    let name = owner.name_any();
    let (replicas, image) = (owner.desired_replicas(), owner.desired_image());
    match existing {
        Existing::Missing => {
            let note = format!("Created Deployment {name} with {replicas} replicas of {image}");
            events.normal(regarding, "Created", "CreateDeployment", note);
        }
        Existing::Owned(current) => {
            let had = current.spec.replicas.unwrap_or(1);
            if had != replicas {
                let note = format!("Scaled Deployment {name} from {had} to {replicas} replicas");
                events.normal(regarding, "Scaled", "ScaleDeployment", note);
            }
            let had_image = current
                .spec
                .template
                .spec
                .as_ref()
                .and_then(|p| p.containers.iter().find(|c| c.name == K::CONTAINER))
                .and_then(|c| c.image.as_deref());
            if had_image != Some(image) {
                let note = format!("Set the image of Deployment {name} to {image}");
                events.normal(regarding, "Updated", "UpdateDeployment", note);
            }
        }
        Existing::Foreign(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
