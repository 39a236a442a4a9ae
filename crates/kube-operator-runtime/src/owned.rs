//! The one Deployment a workload custom resource (Memcached, MyApp) owns: finding it without
//! taking over somebody else's, applying it only when that changes something, and the Events
//! that say what changed.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::Error;
use crate::builder::{Builder, Tools};
use crate::children::hash_of;
use crate::children::{self as ownership, apply_owned, create_owned, is_controlled_by};
use crate::deployment_view::DeploymentView;
use crate::driver::Outcome;
use crate::events::Events;
use crate::pod_security;
use crate::status::{REASON_NOT_OWNED, WorkloadOwner, reports};
use crate::status_writer::{Progress, StatusWrite, StatusWriter, WithStatus};
use crate::watches::DeploymentMeta;

/// The Deployment a custom resource wants, as it stands.
#[derive(Clone, Debug)]
pub enum Existing {
    /// No Deployment of that name: it will be created.
    Missing,
    /// The custom resource's own Deployment.
    Owned(Arc<DeploymentView>),
    /// The custom resource's own Deployment, stripped of the label the managed cache selects
    /// (by hand): only its metadata is cached, so it must be read before it is put back.
    OwnedUnlabelled,
    /// A Deployment of that name that the custom resource does not control: never touched.
    Foreign,
}

/// Finds the Deployment `namespace/name` in the shared caches, and whether `owner_uid` controls
/// it. Between them, `managed` (full objects) and `unmanaged` (metadata) hold every Deployment.
pub fn find_deployment(
    managed: &Store<DeploymentView>,
    unmanaged: &Store<DeploymentMeta>,
    namespace: &str,
    name: &str,
    owner_uid: &str,
) -> Existing {
    if let Some(d) = managed.get(&ObjectRef::new(name).within(namespace)) {
        return classify(d, owner_uid);
    }
    match unmanaged.get(&ObjectRef::new(name).within(namespace)) {
        Some(d) if is_controlled_by(d.as_ref(), owner_uid) => Existing::OwnedUnlabelled,
        Some(_) => Existing::Foreign,
        None => Existing::Missing,
    }
}

/// Asks the API server for `namespace/name`, for when the caches are behind it.
///
/// # Errors
/// [`Error::Kube`] when the lookup fails.
pub async fn get_deployment(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    owner_uid: &str,
) -> Result<Existing, Error> {
    Ok(
        match Api::<DeploymentView>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await?
        {
            None => Existing::Missing,
            Some(d) => classify(Arc::new(d), owner_uid),
        },
    )
}

fn classify(deployment: Arc<DeploymentView>, owner_uid: &str) -> Existing {
    if is_controlled_by(deployment.as_ref(), owner_uid) {
        Existing::Owned(deployment)
    } else {
        Existing::Foreign
    }
}

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

/// How long a write of ours may go unseen by the cache before it counts as lost (the object
/// deleted before the watch ever showed it) and is made again.
pub const UNSEEN_FOR: Duration = Duration::from_secs(30);

/// How long the Deployment controller gets to pick up a spec we wrote before the owner reports
/// the rollout as it stands (that the Deployment controller has not seen it). On a quiet
/// cluster it takes milliseconds, on a busy one (a thousand owners scaled at once) seconds:
/// reporting that state each time would cost a status write per change for a state that ends
/// on its own, so only a Deployment controller stalled for as long as a rollout's status is
/// ever held ([`crate::status_writer::PROGRESS_MAX_HOLD`]) is reported. Until then the owner's
/// `observedGeneration` stays at the generation whose rollout it last reported.
pub const OBSERVE_GRACE: Duration = Duration::from_secs(30);

/// Writes the Deployments one controller owns, from what the shared caches show, the way
/// kube-controller-manager's controllers use "expectations".
///
/// Every reconcile wants its Deployment to match the desired one, but most reconciles are
/// triggered by pod and status changes that leave the Deployment's spec alone. So this
/// remembers, per Deployment, what it last wrote and the uid and `metadata.generation` the API
/// server answered with:
/// - while the cache shows an older generation (or, after a create, nothing yet), it is behind
///   our write: nothing is written or reported. The watch event that shows the write itself
///   triggers nothing (the reconcile that wrote accounted for it); the Deployment controller's
///   next write to it does, or a look again after [`OBSERVE_GRACE`];
/// - while it shows that generation and the desired object is the same, nobody changed the spec
///   since (every spec change bumps it): nothing to write, and once the Deployment controller
///   has seen it (or [`OBSERVE_GRACE`] has passed), the rollout is worth reporting;
/// - anything else (a hand edit, a delete, a new desired spec) is written again.
///
/// The memory is per process: a restarted manager applies once per object, which changes
/// nothing on the server.
///
/// A Deployment the caches do not know is created, not applied: a create fails when the name
/// is taken, so one made a moment ago by somebody else (not yet in the caches) is never taken
/// over, and no read is spent first. The created object's fields are recorded as written by an
/// update of the same field manager; the applies that follow take them over as they change. (A
/// field a later version stops setting would stay on Deployments created before it; none has
/// been dropped so far.)
pub struct OwnedDeployments {
    client: kube::Client,
    managed: Store<DeploymentView>,
    unmanaged: Store<DeploymentMeta>,
    field_manager: &'static str,
    /// Shared with the trigger of the managed Deployments' watch, which skips our own writes.
    written: Arc<Mutex<HashMap<ObjectRef<DeploymentView>, Written>>>,
}

/// What was last written to one Deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    desired_hash: u64,
    uid: Option<String>,
    generation: Option<i64>,
    /// The resourceVersion the write was answered with.
    resource_version: Option<String>,
    at: Instant,
    /// The cache has shown the object since (so its absence now means it was deleted).
    seen: bool,
}

impl Written {
    /// Whether the cache, showing `current`, is still behind this write.
    fn ahead_of(&self, current: Option<&DeploymentView>) -> bool {
        match current {
            None => !self.seen && self.at.elapsed() < UNSEEN_FOR,
            Some(current) => {
                self.uid == current.metadata.uid && current.metadata.generation < self.generation
            }
        }
    }
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

/// What creating a Deployment came to.
enum Created {
    /// Created, with the metadata it was stored with.
    Done(Box<ObjectMeta>),
    NamespaceTerminating,
    /// A Deployment of that name exists after all.
    NameTaken,
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
            .field("field_manager", &self.field_manager)
            .finish_non_exhaustive()
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
        let writer = Self::new(
            ctx.client.clone(),
            managed.store(),
            unmanaged.store(),
            field_manager,
        );
        let written = writer.written.clone();
        let own_write =
            move |deployment: &DeploymentView| ownership::shows_own_write(&written, deployment);
        let builder = builder
            .watches_except(&managed, owner_of, own_write)
            .watches(&unmanaged, owner_of);
        (builder, writer)
    }

    /// Deployments written under `field_manager`, found through the shared caches of the
    /// `managed` Deployments and the `unmanaged` rest.
    pub fn new(
        client: kube::Client,
        managed: Store<DeploymentView>,
        unmanaged: Store<DeploymentMeta>,
        field_manager: &'static str,
    ) -> Self {
        Self {
            client,
            managed,
            unmanaged,
            field_manager,
            written: Arc::default(),
        }
    }

    /// Makes `owner`'s Deployment match `desired`, unless a Deployment of that name belongs to
    /// somebody else.
    ///
    /// # Errors
    /// [`Error::MissingField`] when `owner` was not read from the API server; [`Error::Kube`]
    /// when creating, reading or applying fails; [`Error::Changed`] when the Deployment vanished
    /// between two of those.
    pub async fn ensure<K: WorkloadOwner>(
        &self,
        owner: &K,
        desired: &Deployment,
        events: &Events,
    ) -> Result<Ensured, Error> {
        let missing = |field| Error::MissingField {
            kind: K::kind(&()),
            field,
        };
        let name = owner.name_any();
        let namespace = owner.namespace().ok_or(missing("metadata.namespace"))?;
        let uid = owner.uid().ok_or(missing("metadata.uid"))?;
        let regarding = owner.object_ref(&());
        let key = ObjectRef::new(&name).within(&namespace);
        let desired_hash = hash_of(desired)?;

        let mut existing = find_deployment(&self.managed, &self.unmanaged, &namespace, &name, &uid);
        if let Existing::OwnedUnlabelled = existing {
            existing = get_deployment(&self.client, &namespace, &name, &uid).await?;
        }
        if let Existing::Missing = existing {
            if self.last_written(&key).is_some_and(|w| w.ahead_of(None)) {
                return Ok(Ensured::Pending {
                    recheck: UNSEEN_FOR,
                });
            }
            match self.create(&namespace, desired).await? {
                Created::Done(created) => {
                    self.remember(key, desired_hash, &created);
                    announce(events, &regarding, &existing, desired);
                    return Ok(Ensured::Pending {
                        recheck: OBSERVE_GRACE,
                    });
                }
                Created::NamespaceTerminating => return Ok(Ensured::NamespaceTerminating),
                Created::NameTaken => {
                    // The caches had not seen it yet: ask the API server whose it is.
                    existing = get_deployment(&self.client, &namespace, &name, &uid).await?;
                }
            }
        }

        let current = match existing {
            Existing::Owned(current) => current,
            Existing::Foreign => {
                report_foreign(owner, events);
                return Ok(Ensured::Foreign);
            }
            Existing::Missing | Existing::OwnedUnlabelled => {
                // Gone (or unlabelled) again since it was looked up: the next event retries.
                return Err(Error::Changed {
                    kind: "Deployment",
                    namespace,
                    name,
                });
            }
        };
        if let Some(written) = self.saw(&key, &current) {
            if written.ahead_of(Some(&current)) {
                return Ok(Ensured::Pending {
                    recheck: UNSEEN_FOR,
                });
            }
            if written.generation == current.metadata.generation
                && written.desired_hash == desired_hash
            {
                if !crate::workload::Workload::observed(current.as_ref())
                    && let Some(left) = OBSERVE_GRACE.checked_sub(written.at.elapsed())
                {
                    return Ok(Ensured::Pending { recheck: left });
                }
                return Ok(Ensured::Ready(current));
            }
        }

        let applied = match apply_owned(&self.client, &namespace, self.field_manager, desired).await
        {
            Ok(applied) => applied,
            Err(e) if e.is_namespace_terminating() => {
                tracing::debug!("namespace is being deleted; nothing to do");
                return Ok(Ensured::NamespaceTerminating);
            }
            Err(e) => return Err(e),
        };
        let unchanged = applied.resource_version == current.metadata.resource_version;
        self.remember(key.clone(), desired_hash, &applied);
        if unchanged {
            // Nothing changed on the server, so no watch event will come: the cache is current.
            self.saw(&key, &current);
            return Ok(Ensured::Ready(current));
        }
        announce(events, &regarding, &Existing::Owned(current), desired);
        Ok(Ensured::Pending {
            recheck: OBSERVE_GRACE,
        })
    }

    /// Creates the Deployment the caches do not know.
    async fn create(&self, namespace: &str, desired: &Deployment) -> Result<Created, Error> {
        match create_owned(&self.client, namespace, self.field_manager, desired).await {
            Ok(created) => Ok(Created::Done(Box::new(created))),
            Err(e) if e.is_namespace_terminating() => {
                tracing::debug!("namespace is being deleted; nothing to do");
                Ok(Created::NamespaceTerminating)
            }
            Err(e) if e.is_already_exists() => Ok(Created::NameTaken),
            Err(e) => Err(e),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<DeploymentView>, Written>> {
        // A poisoned lock only means another reconcile panicked mid-insert; the map is valid.
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn last_written(&self, key: &ObjectRef<DeploymentView>) -> Option<Written> {
        self.lock().get(key).cloned()
    }

    /// Notes that the cache shows `current` (our write, once it has its uid and generation),
    /// and returns what was last written to it, if that was this same object.
    fn saw(&self, key: &ObjectRef<DeploymentView>, current: &DeploymentView) -> Option<Written> {
        let mut written = self.lock();
        let entry = written.get_mut(key)?;
        if entry.uid != current.metadata.uid {
            // Deleted and made again by somebody else since: what we wrote is history.
            written.remove(key);
            return None;
        }
        if current.metadata.generation >= entry.generation {
            entry.seen = true;
        }
        Some(entry.clone())
    }

    /// Notes what a write of ours was answered with: `written`, the metadata it left.
    fn remember(&self, key: ObjectRef<DeploymentView>, desired_hash: u64, written: &ObjectMeta) {
        let mut map = self.lock();
        map.insert(
            key,
            Written {
                desired_hash,
                uid: written.uid.clone(),
                generation: written.generation,
                resource_version: written.resource_version.clone(),
                at: Instant::now(),
                seen: false,
            },
        );
        // Owners deleted with their Deployments leave entries nobody asks for again: drop
        // those of Deployments the cache no longer has, now and then (the map stays within
        // twice the cache, so this costs a constant per write).
        if map.len() > 2 * self.managed.len() + PRUNE_SLACK {
            map.retain(|key, w| !w.seen || self.managed.get(key).is_some());
        }
    }
}

impl ownership::RememberedWrite for Written {
    fn answered_with(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    fn mark_seen(&mut self) {
        self.seen = true;
    }
}

/// Entries of [`OwnedDeployments`]'s memory beyond twice the cache before it is pruned.
const PRUNE_SLACK: usize = 1024;

/// Events for what applying changed: a new Deployment, a new replica count, a new (or restored)
/// image.
fn announce(
    events: &Events,
    regarding: &k8s_openapi::api::core::v1::ObjectReference,
    existing: &Existing,
    desired: &Deployment,
) {
    let name = desired.name_any();
    let replicas = desired.spec.replicas.unwrap_or(1);
    let wanted: Vec<(&str, Option<&str>)> = desired
        .spec
        .template
        .spec
        .iter()
        .flat_map(|pod| &pod.containers)
        .map(|c| (c.name.as_str(), c.image.as_deref()))
        .collect();
    let image = wanted
        .iter()
        .filter_map(|(_, image)| *image)
        .collect::<Vec<_>>()
        .join(", ");
    match existing {
        Existing::Missing => {
            let note = format!("Created Deployment {name} with {replicas} replicas of {image}");
            events.normal(regarding, "Created", "CreateDeployment", note);
        }
        Existing::Owned(current) => {
            let had = current.desired_replicas();
            if had != replicas {
                let note = format!("Scaled Deployment {name} from {had} to {replicas} replicas");
                events.normal(regarding, "Scaled", "ScaleDeployment", note);
            }
            let runs = |&(name, image): &(&str, Option<&str>)| {
                current
                    .containers
                    .iter()
                    .any(|c| c.name == name && c.image.as_deref() == image)
            };
            if !wanted.iter().all(runs) {
                let note = format!("Set the image of Deployment {name} to {image}");
                events.normal(regarding, "Updated", "UpdateDeployment", note);
            }
        }
        Existing::OwnedUnlabelled | Existing::Foreign => {}
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
    fn a_write_is_ahead_of_the_cache_until_the_cache_shows_it() {
        let written = Written {
            desired_hash: 1,
            uid: Some("u1".into()),
            generation: Some(2),
            resource_version: Some("7".into()),
            at: Instant::now(),
            seen: false,
        };
        assert!(written.ahead_of(None), "created, not yet in the cache");
        let seen = Written {
            seen: true,
            ..written.clone()
        };
        assert!(!seen.ahead_of(None), "seen, then gone: it was deleted");

        let mut cached = DeploymentView::from(deployment(3));
        cached.metadata.uid = Some("u1".into());
        cached.metadata.generation = Some(1);
        assert!(written.ahead_of(Some(&cached)), "an older generation");
        cached.metadata.generation = Some(2);
        assert!(!written.ahead_of(Some(&cached)), "the written generation");
        cached.metadata.uid = Some("u2".into());
        cached.metadata.generation = Some(1);
        assert!(
            !written.ahead_of(Some(&cached)),
            "another object of that name"
        );
    }

    #[test]
    fn the_same_desired_object_hashes_the_same_and_a_change_does_not() {
        let a = hash_of(&deployment(3)).expect("hashes");
        assert_eq!(a, hash_of(&deployment(3)).expect("hashes"));
        assert_ne!(a, hash_of(&deployment(4)).expect("hashes"));
    }
}
