//! One watch and cache per (type, label selector), shared by every controller that asks for it.
//!
//! Memcached and MyApp both own Deployments, and Memcached follows its Pods. Instead of a watch
//! per controller (what `Controller::owns` does), [`SharedWatches`] runs one watch per type and
//! selector, created by whichever controller asks first ([`SharedWatches::watch`]) and keeps one
//! cache ([`Store`]) of it, like controller-runtime's shared informers. Any type can be watched,
//! whole or as metadata only ([`MetaView<K>`] is a type of its own). Each change is
//! broadcast to every subscribed controller, which maps it to the custom resources to reconcile.
//!
//! kube-runtime's own shared streams (`Writer::new_shared`) do not broadcast deletions, and a
//! deleted Deployment or Pod must trigger its owner, so the fan-out here is a small loop of ours
//! over the plain watcher, feeding the store and a broadcast channel:
//!
//! - every added or changed object is broadcast when its [`WatchSpec`] says the change matters
//!   (Pods only when their labels or deletion state change: a metadata watch sees every status
//!   update, which the controllers do not need);
//! - a deleted object is broadcast as last seen, after it left the cache, unless its
//!   [`WatchSpec`] says the deletion no longer matters (a pod whose deletion started earlier);
//! - after a re-list, objects that vanished meanwhile are broadcast as deletions and only
//!   changed ones as updates;
//! - a subscriber that falls behind by more than the channel holds gets every cached object
//!   again (a re-list for that subscriber alone), instead of silently missing changes.
//!
//! The Deployment and Pod watches select `app.kubernetes.io/managed-by=<manager>` (the name
//! given to [`crate::labels::set_product`]), so those caches hold only the workloads these
//! controllers manage. Every other Deployment is watched as
//! metadata only ([`unmanaged_deployments`]): a custom resource must never take over a Deployment
//! of its name that it does not control, and must notice at once when such a Deployment goes
//! away. Pods are watched as metadata only too.
//!
//! What a controller never reads is dropped before it is cached (managed fields, annotations),
//! a managed Deployment is read as a [`DeploymentView`], without its pod template, and metadata
//! as a [`MetaView`], its labels in one compact set: on a cluster with thousands of workloads,
//! the caches are most of the manager's heap. Each cache can carry secondary indexes
//! ([`Index`]).
//!
//! In a sharded manager ([`SharedWatches::sharded`]), a watch of children
//! ([`WatchSpec::of_children`]: the managed ones of [`managed`], [`managed_metadata`] and
//! [`managed_pods`]) selects only the children of the objects the replica owns, by the slot
//! label their owner's uid gives them ([`crate::labels::SHARD_SLOT`]; the pod templates of
//! owned Deployments, StatefulSets and DaemonSets carry it too), and starts again with each new
//! assignment: a replica caches its share of the children and of their pods, whether or not the
//! API server can select the owners by shard.
//!
//! A watch the API server refuses before its first list (a malformed selector, a type it does
//! not serve, RBAC that does not allow listing it) stops, and [`Shared::ready`] says why, instead
//! of retrying forever behind a cache that never fills.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::deployment_view::DeploymentView;
use crate::index::{Index, KeyFn};
use crate::initial_lists::InitialLists;
use crate::meta_view::{Labels, MetaView};
use crate::scope::{self, Namespaces, ScopedApi};
use crate::shard_watch;
use crate::shards::{Assignment, Shards};
use crate::slots::Slots;
use crate::status::Rollout;
use crate::{Error, labels};

/// Live changes buffered per subscriber before it counts as lagging (and gets a full resync).
/// Every slot is allocated up front, for every watched kind; a first list, however long, takes
/// one ([`Broadcast::Listed`]).
const CHANNEL_CAPACITY: usize = 1024;

/// The metadata of a Pod: all the controllers need (names, labels, deletion).
pub type PodMeta = MetaView<Pod>;
/// The metadata of a Deployment that no controller of ours manages (name and owners).
pub type DeploymentMeta = MetaView<Deployment>;

/// What one shared watch covers, what its cache keeps of each object, and which changes its
/// subscribers hear about.
///
/// One watch exists per type and selector: the first controller to ask for it decides what is
/// kept and broadcast, so every controller should take the spec of a type from one place (the
/// functions of this module, or the controller module that alone watches that type).
#[derive(Clone, Debug)]
pub struct WatchSpec<K> {
    selector: String,
    broadcasts: Broadcasts<K>,
    strip: fn(&mut K),
    /// Whether the objects are children that carry their owner's slot.
    children: bool,
}

/// Which changes of a shared watch its subscribers hear about.
#[derive(Debug)]
struct Broadcasts<K> {
    /// Whether an added or changed object matters, given its cached version (`None` if new).
    changed: fn(Option<&K>, &K) -> bool,
    /// Whether the deletion of an object matters, given its cached version.
    deleted: fn(&K) -> bool,
}

// Not derived: a derive would ask `K` to be `Clone` and `Copy` too.
impl<K> Clone for Broadcasts<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Broadcasts<K> {}

impl<K: Resource> WatchSpec<K> {
    /// Every object of the type, kept whole; every new `resourceVersion` is broadcast.
    pub fn all() -> Self {
        Self {
            selector: String::new(),
            broadcasts: Broadcasts {
                changed: new_version,
                deleted: |_| true,
            },
            strip: |_| {},
            children: false,
        }
    }

    /// Only the objects that match a label `selector` (`key=value,other!=x`, as `kubectl -l`).
    pub fn labelled(selector: impl Into<String>) -> Self {
        Self {
            selector: selector.into(),
            ..Self::all()
        }
    }

    /// Drops what no controller reads before an object is cached.
    #[must_use]
    pub fn keeping(self, strip: fn(&mut K)) -> Self {
        Self { strip, ..self }
    }

    /// Broadcasts a change only when `changed(cached, new)` says it matters (`cached` is `None`
    /// for a new object).
    #[must_use]
    pub fn broadcasting(self, changed: fn(Option<&K>, &K) -> bool) -> Self {
        let broadcasts = Broadcasts {
            changed,
            ..self.broadcasts
        };
        Self { broadcasts, ..self }
    }

    /// Broadcasts a deletion only when `deleted(cached)` says it matters (every deletion
    /// matters unless this says otherwise). A deletion seen only in a re-list is always
    /// broadcast: nothing is known of what came before it.
    #[must_use]
    pub fn broadcasting_deletions(self, deleted: fn(&K) -> bool) -> Self {
        let broadcasts = Broadcasts {
            deleted,
            ..self.broadcasts
        };
        Self { broadcasts, ..self }
    }

    /// The objects are children written through the runtime ([`crate::Tools::ensure`]), which
    /// labels them with their owner's slot in a sharded manager: each replica then watches only
    /// the children of the objects it owns.
    #[must_use]
    pub fn of_children(self) -> Self {
        Self {
            children: true,
            ..self
        }
    }

    /// The label selector (empty for every object).
    pub fn selector(&self) -> &str {
        &self.selector
    }
}

/// Whether `new` is a new object or a new version of `old`.
fn new_version<K: Resource>(old: Option<&K>, new: &K) -> bool {
    old.is_none_or(|old| old.meta().resource_version != new.meta().resource_version)
}

/// Whether `new` is a new object, or differs from the cached `old` in more than its
/// resourceVersion. Once a watch has dropped what no controller reads (annotations, managed
/// fields), a change to those alone leaves nothing anybody could act on: the Deployment
/// controller's revision annotation, for one, is a write of its own to every new Deployment.
fn changed_beyond_version<K: Resource + Clone + PartialEq>(old: Option<&K>, new: &K) -> bool {
    old.is_none_or(|old| {
        if old.meta().resource_version == new.meta().resource_version {
            return false;
        }
        let mut old = old.clone();
        old.meta_mut()
            .resource_version
            .clone_from(&new.meta().resource_version);
        old != *new
    })
}

/// The objects of type `K` these controllers manage, in every namespace, without what no
/// controller reads of their metadata: the watch of a kind of child a controller owns.
pub fn managed<K: Resource + Clone + PartialEq>() -> WatchSpec<K> {
    WatchSpec::labelled(labels::managed_selector())
        .of_children()
        .keeping(|obj: &mut K| strip_metadata(obj.meta_mut()))
        .broadcasting(changed_beyond_version)
}

/// The metadata of the objects of type `K` these controllers manage, in every namespace, as a
/// [`MetaView`] (which never reads their annotations): the watch of a kind of child whose writes
/// are checked by their metadata alone ([`crate::children::OwnedChildren`]). Every new version
/// is broadcast: for a kind without a generation (a Service), an edit of its spec shows as
/// nothing else.
pub fn managed_metadata<K: Resource<DynamicType = ()>>() -> WatchSpec<MetaView<K>> {
    WatchSpec::labelled(labels::managed_selector()).of_children()
}

/// Like [`managed_metadata`], for a kind whose `metadata.generation` counts its spec changes (as
/// a PodDisruptionBudget's does): a change matters when it is to the spec, the labels, the
/// owners or the deletion, not to the status alone. The API server's own controllers write the
/// status of such children (the disruption controller a budget's, as its pods come and go), and
/// each write would otherwise reconcile the owner for nothing.
pub fn managed_by_generation<K: Resource<DynamicType = ()>>() -> WatchSpec<MetaView<K>> {
    managed_metadata().broadcasting(|old, new| {
        old.is_none_or(|old| {
            old.labels != new.labels
                || old.metadata.generation != new.metadata.generation
                || old.metadata.owner_references != new.metadata.owner_references
                || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        })
    })
}

/// The managed Deployments of every namespace, as the controllers read them
/// ([`DeploymentView`]), without their labels: the watch's selector has matched them, and no
/// controller reads them after (a label map costs half a kilobyte however few it holds).
pub fn managed_deployments() -> WatchSpec<DeploymentView> {
    managed()
        .keeping(|deployment: &mut DeploymentView| {
            strip_metadata(&mut deployment.metadata);
            deployment.metadata.labels = None;
        })
        .broadcasting(owners_read_a_change)
}

/// Whether a managed Deployment changed in what its owner reads: its metadata, its spec as the
/// view keeps it, or its rollout as [`Rollout`] reads the status, when that is news to the
/// owner's status ([`Rollout::is_news_after`]). The Deployment controller also writes what no
/// owner reads (`unavailableReplicas` on its own, a condition's times and messages) and steps
/// that change no condition (a new pod counted before it is ready): in a scale event of one
/// pod, two of its four status writes are such, and each would reconcile the owner to find
/// nothing to write. On a busy cluster those steps come further apart than the queue's
/// debounce, and each was a reconcile of its own.
fn owners_read_a_change(old: Option<&DeploymentView>, new: &DeploymentView) -> bool {
    old.is_none_or(|old| {
        if old.metadata.resource_version == new.metadata.resource_version {
            return false;
        }
        let mut old_metadata = old.metadata.clone();
        old_metadata
            .resource_version
            .clone_from(&new.metadata.resource_version);
        // Read against the replicas the Deployment asks for: its owner asks for the same, or
        // is about to change the spec, which is news of its own.
        let desired = new.desired_replicas();
        old_metadata != new.metadata
            || old.replicas != new.replicas
            || old.containers != new.containers
            || Rollout::of(desired, new).is_news_after(&Rollout::of(desired, old))
    })
}

/// The metadata of every object of type `K` these controllers do not manage, without its
/// labels: only its name and its owners matter, to the owner of a child of that kind named after
/// it ([`crate::builder::Builder::owns_one_as`]), which finds the name taken.
pub fn unmanaged_metadata<K: Resource<DynamicType = ()>>() -> WatchSpec<MetaView<K>> {
    WatchSpec::labelled(labels::unmanaged_selector())
        .keeping(|meta: &mut MetaView<K>| meta.labels = Labels::default())
        .broadcasting(|old, new| {
            old.is_none_or(|old| old.metadata.owner_references != new.metadata.owner_references)
        })
}

/// The metadata of every Deployment these controllers do not manage ([`unmanaged_metadata`]).
pub fn unmanaged_deployments() -> WatchSpec<DeploymentMeta> {
    unmanaged_metadata()
}

/// The metadata of the managed Pods of every namespace; a change matters when it moves a pod
/// between owners or starts its deletion. After that nothing of it matters: a pod being
/// deleted already counts as gone to the controllers. When its containers take longer to stop
/// than the queue's debounce, a shorter grace period (which moves its deletion timestamp) and
/// its removal would each reconcile its owner once more for nothing.
///
/// In a sharded manager a replica takes only the pods of its own objects' workloads, whose
/// templates the runtime labels with their owner's slot: turning sharding on or off rolls the
/// pods of every owned Deployment, StatefulSet and DaemonSet once. Pods of a workload written
/// otherwise, without the label, are not seen by a sharded replica.
pub fn managed_pods() -> WatchSpec<PodMeta> {
    WatchSpec::labelled(labels::managed_selector())
        .of_children()
        .keeping(|pod: &mut PodMeta| {
            // Of a pod, the controllers read its name, labels and deletion only. Its uid and
            // version would be kept twice (the cache's key copies both).
            let meta = &mut pod.metadata;
            (meta.owner_references, meta.uid) = (None, None);
            (meta.resource_version, meta.generate_name) = (None, None);
        })
        .broadcasting(|old, new| {
            let deleting = |pod: &PodMeta| pod.metadata.deletion_timestamp.is_some();
            // Only the start of a deletion: a shorter grace period moves the timestamp again.
            old.is_none_or(|old| old.labels != new.labels || deleting(old) != deleting(new))
        })
        .broadcasting_deletions(|cached| cached.metadata.deletion_timestamp.is_none())
}

/// The watches shared by the controllers of one [`crate::run`]; each starts on first use and
/// stops with [`SharedWatches::stop`].
#[derive(Clone)]
pub struct SharedWatches {
    inner: Arc<Inner>,
}

/// A watch's identity: the type it caches, its label selector, and whether it follows the
/// replica's slots ([`WatchSpec::of_children`]).
type WatchKey = (TypeId, String, bool);

struct Inner {
    client: kube::Client,
    namespaces: Namespaces,
    /// A sharded replica's assignments, which its watches of children follow.
    assignments: Option<watch::Receiver<Assignment>>,
    /// Whether the watches stream their initial lists, found by the first.
    initial_lists: InitialLists,
    stop: CancellationToken,
    /// Each a `Shared<K>` of the key's type.
    watches: Mutex<HashMap<WatchKey, Box<dyn Any + Send + Sync>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Debug for SharedWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = lock(&self.inner.watches).len();
        f.debug_struct("SharedWatches")
            .field("watches", &count)
            .finish_non_exhaustive()
    }
}

/// Locks `mutex`; a poisoned lock only means a panic elsewhere, and what it guards stays valid.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SharedWatches {
    /// Watches `namespaces` through `client`, until `stop` is cancelled or
    /// [`SharedWatches::stop`] is called.
    pub fn new(client: kube::Client, namespaces: Namespaces, stop: CancellationToken) -> Self {
        Self::following(client, namespaces, None, stop)
    }

    /// Like [`SharedWatches::new`], for a replica of a sharded manager: its watches of
    /// children ([`WatchSpec::of_children`]) take only the children of the objects it owns.
    pub fn sharded(
        client: kube::Client,
        namespaces: Namespaces,
        shards: &Shards,
        stop: CancellationToken,
    ) -> Self {
        Self::following(client, namespaces, Some(shards.assignments()), stop)
    }

    fn following(
        client: kube::Client,
        namespaces: Namespaces,
        assignments: Option<watch::Receiver<Assignment>>,
        stop: CancellationToken,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                namespaces,
                assignments,
                initial_lists: InitialLists::detect(),
                stop,
                watches: Mutex::default(),
                tasks: Mutex::default(),
            }),
        }
    }

    /// Whether the watches stream their initial lists: found out by the first to start (see
    /// [`crate::initial_lists`]), and shared with every other watch of the run.
    pub fn initial_lists(&self) -> InitialLists {
        self.inner.initial_lists.clone()
    }

    /// The shared watch of the objects of type `K` that `spec` selects, started now by the
    /// first caller and shared with every later one. Must be called within a tokio runtime.
    pub fn watch<K>(&self, spec: WatchSpec<K>) -> Shared<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::Scope: ScopedApi,
    {
        let key = (TypeId::of::<K>(), spec.selector.clone(), spec.children);
        let mut watches = lock(&self.inner.watches);
        if let Some(shared) = watches
            .get(&key)
            .and_then(|w| w.downcast_ref::<Shared<K>>())
        {
            return shared.clone();
        }
        let shared = self.start(spec);
        watches.insert(key, Box::new(shared.clone()));
        shared
    }

    /// The managed Deployments ([`managed_deployments`]).
    pub fn deployments(&self) -> Shared<DeploymentView> {
        self.watch(managed_deployments())
    }

    /// The Deployments nobody of ours manages ([`unmanaged_deployments`]).
    pub fn unmanaged_deployments(&self) -> Shared<DeploymentMeta> {
        self.watch(unmanaged_deployments())
    }

    /// The managed Pods ([`managed_pods`]).
    pub fn pods(&self) -> Shared<PodMeta> {
        self.watch(managed_pods())
    }

    fn start<K>(&self, spec: WatchSpec<K>) -> Shared<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::Scope: ScopedApi,
    {
        let resource: Arc<str> = K::plural(&()).into();
        let writer = Writer::<K>::default();
        let store = writer.as_reader();
        let (tx, _) = broadcast::channel(CHANNEL_CAPACITY);
        let indexes: Arc<Mutex<Vec<Index<K>>>> = Arc::default();
        let refusal = Arc::new(Refusal::default());
        let (client, namespaces) = (self.inner.client.clone(), self.inner.namespaces.clone());
        let (lists, cached) = (self.inner.initial_lists.clone(), store.clone());
        let (selector, strip) = (spec.selector.clone(), spec.strip);
        let start = move |slots: Option<Slots>| {
            let by_slot = slots.and_then(Slots::label_selector);
            let selector = match (selector.as_str(), by_slot) {
                (selector, Some(by_slot)) if !selector.is_empty() => {
                    format!("{selector},{by_slot}")
                }
                (_, Some(by_slot)) => by_slot,
                (selector, None) => selector.to_owned(),
            };
            let mut config = watcher::Config::default();
            if !selector.is_empty() {
                config = config.labels(&selector);
            }
            scope::watch(&client, &namespaces, &config, &lists, cached.clone()).modify(strip)
        };
        let following = self.inner.assignments.clone().filter(|_| spec.children);
        let (listed, assignment_listed) = match following {
            Some(_) => {
                let (listed, receiver) = watch::channel(0);
                (Some(listed), Some(receiver))
            }
            None => (None, None),
        };
        // Label selectors work on every API server: a watch of children always selects by slot.
        let events = match following {
            Some(assignments) => shard_watch::restarting(assignments, || true, start),
            None => start(None).map(|event| (0, event)).boxed(),
        };
        let shared = Shared {
            resource,
            selector: spec.selector.into(),
            store,
            tx,
            indexes: indexes.clone(),
            refusal,
            assignment_listed,
        };
        let task = tokio::spawn(fan_out(
            shared.clone(),
            events,
            Cache { writer, indexes },
            spec.broadcasts,
            listed,
            self.inner.stop.clone(),
        ));
        lock(&self.inner.tasks).push(task);
        shared
    }

    /// Stops every watch and waits for them to end.
    pub async fn stop(&self) {
        self.inner.stop.cancel();
        let tasks = std::mem::take(&mut *lock(&self.inner.tasks));
        for task in tasks {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "a shared watch task failed");
            }
        }
    }
}

/// Why the API server refused a watch before its first list, once it has.
#[derive(Default)]
pub(crate) struct Refusal {
    refused: CancellationToken,
    reason: Mutex<String>,
}

impl Refusal {
    /// Fires when the watch is refused.
    pub(crate) async fn refused(&self) {
        self.refused.cancelled().await;
    }

    pub(crate) fn refuse(&self, reason: String) {
        *lock(&self.reason) = reason;
        self.refused.cancel();
    }

    pub(crate) fn reason(&self) -> String {
        lock(&self.reason).clone()
    }
}

/// Why a watch can never succeed as asked, judged from an error before its first list: the API
/// server calls the request malformed (400, a bad selector), unauthorized (403) or for a type
/// it does not serve (404). Anything else (it is unreachable, restarting, overloaded) is worth
/// retrying.
pub(crate) fn refusal_reason(error: &watcher::Error) -> Option<String> {
    let watcher::Error::InitialListFailed(kube::Error::Api(status)) = error else {
        return None;
    };
    let why = match status.code {
        400 => "the API server calls the request malformed",
        403 => {
            "the manager's RBAC does not allow listing it (see the generated ClusterRole, or the Roles of a namespaced install)"
        }
        404 => "the API server does not serve this type (is its CRD or API group installed?)",
        _ => return None,
    };
    Some(format!("{why}: {}", status.message))
}

/// One change a shared watch broadcasts: the object (a deleted one as last seen), and whether
/// the watch's first list brought it rather than a live event (what a later list finds changed
/// was missed live, and counts as live).
#[derive(Clone, Debug)]
pub struct Change<K> {
    /// The object as the cache shows it now, or as last seen when deleted.
    pub object: Arc<K>,
    /// The first list's catch-up, not a change.
    pub listed: bool,
}

/// What a shared watch sends its subscribers.
#[derive(Clone, Debug)]
enum Broadcast<K> {
    /// An object changed (a deleted one as last seen): live, or as a list of a new assignment
    /// found it (`listed`).
    Changed { object: Arc<K>, listed: bool },
    /// The first list is in the cache: each subscriber takes the whole cache, as listed. One
    /// message however long the list, so a first list never outruns the channel.
    Listed,
}

/// One shared watch: its cache, and a way to follow its changes.
pub struct Shared<K: Resource<DynamicType = ()> + 'static> {
    resource: Arc<str>,
    selector: Arc<str>,
    store: Store<K>,
    tx: broadcast::Sender<Broadcast<K>>,
    indexes: Arc<Mutex<Vec<Index<K>>>>,
    refusal: Arc<Refusal>,
    /// For a watch that follows a sharded replica's assignments, the generation of the one
    /// whose list the cache holds.
    assignment_listed: Option<watch::Receiver<u64>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for Shared<K> {
    fn clone(&self) -> Self {
        Self {
            resource: self.resource.clone(),
            selector: self.selector.clone(),
            store: self.store.clone(),
            tx: self.tx.clone(),
            indexes: self.indexes.clone(),
            refusal: self.refusal.clone(),
            assignment_listed: self.assignment_listed.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + 'static> Debug for Shared<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("resource", &self.resource)
            .field("selector", &self.selector)
            .finish_non_exhaustive()
    }
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The cache (read-only).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// For a watch of children in a sharded replica, the generation of the assignment whose
    /// list the cache holds: the children of the slots it gained are cached once it reaches that
    /// assignment's. `None` for a watch that does not follow the assignments.
    pub(crate) fn assignment_listed(&self) -> Option<watch::Receiver<u64>> {
        self.assignment_listed.clone()
    }

    /// Waits until the cache holds a complete list, or `cancel` fires (then returns `Ok(false)`).
    ///
    /// # Errors
    /// [`Error::WatchRefused`] when the API server refused the watch before its first list;
    /// [`Error::WatchStopped`] when it ended before its first list for another reason.
    pub async fn ready(&self, cancel: &CancellationToken) -> Result<bool, Error> {
        tokio::select! {
            biased;
            () = cancel.cancelled() => Ok(false),
            () = self.refusal.refused.cancelled() => Err(Error::WatchRefused {
                resource: self.resource.to_string(),
                selector: self.selector.to_string(),
                reason: self.refusal.reason(),
            }),
            ready = self.store.wait_until_ready() => match ready {
                Ok(()) => Ok(true),
                // The watch stops with the shutdown that cancels us: that is no failure.
                Err(_) if cancel.is_cancelled() => Ok(false),
                Err(_) => Err(Error::WatchStopped { resource: self.resource.to_string() }),
            },
        }
    }

    /// The secondary index called `name`, keying objects by `key_of`: created (from what the
    /// cache holds now) by the first controller that asks, and shared by every later one. The
    /// name is what identifies it: ask for one name with one key function.
    pub fn index(&self, name: &'static str, key_of: KeyFn<K>) -> Index<K> {
        let mut indexes = lock(&self.indexes);
        if let Some(index) = indexes.iter().find(|i| i.name() == name) {
            return index.clone();
        }
        let index = Index::new(name, key_of);
        // The watch applies events under the same lock, so nothing falls between this
        // snapshot of the cache and the next event.
        index.rebuild(self.store.state());
        indexes.push(index.clone());
        index
    }

    /// Every change from now on: objects added, changed or deleted (deleted ones as last seen).
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.subscribe_changes().map(|change| change.object)
    }

    /// [`Shared::subscribe`], with whether each change came from a list ([`Change`]). A
    /// subscriber that fell behind is sent the whole cache again, as listed.
    pub fn subscribe_changes(&self) -> impl Stream<Item = Change<K>> + Send + 'static {
        let state = Subscriber {
            resource: self.resource.clone(),
            rx: self.tx.subscribe(),
            store: self.store.clone(),
            backlog: Vec::new(),
        };
        futures::stream::unfold(state, |mut s| async move {
            loop {
                if let Some(object) = s.backlog.pop() {
                    let change = Change {
                        object,
                        listed: true,
                    };
                    return Some((change, s));
                }
                match s.rx.recv().await {
                    Ok(Broadcast::Changed { object, listed }) => {
                        return Some((Change { object, listed }, s));
                    }
                    Ok(Broadcast::Listed) => s.backlog = s.store.state(),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            resource = &*s.resource,
                            missed,
                            "subscriber fell behind; resyncing it from the cache"
                        );
                        s.backlog = s.store.state();
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }
}

struct Subscriber<K: Resource<DynamicType = ()> + 'static> {
    resource: Arc<str>,
    rx: broadcast::Receiver<Broadcast<K>>,
    store: Store<K>,
    backlog: Vec<Arc<K>>,
}

/// A shared cache and its secondary indexes, written only by the watch that fills them.
struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    writer: Writer<K>,
    indexes: Arc<Mutex<Vec<Index<K>>>>,
}

/// Applies watch events to the cache and broadcasts what changed, until `stop`, or until the
/// API server refuses the watch before its first list. Each event comes with the assignment
/// its watch started for; a watch that follows the assignments says in `assignment_listed`
/// which one's list the cache holds.
async fn fan_out<K>(
    shared: Shared<K>,
    events: impl Stream<Item = (u64, watcher::Result<Event<K>>)> + Send,
    mut cache: Cache<K>,
    broadcasts: Broadcasts<K>,
    assignment_listed: Option<watch::Sender<u64>>,
    stop: CancellationToken,
) where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let (resource, selector) = (&*shared.resource, &*shared.selector);
    let mut events = std::pin::pin!(events);
    let mut listed = false;
    // The assignment of the last list: the list of a newer one catches up with gained slots.
    let mut listed_generation = 0;
    tracing::debug!(resource, selector, "shared watch started");
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => break,
            event = events.next() => event,
        };
        let (generation, event) = match event {
            None => break,
            Some((generation, event)) => (generation, event),
        };
        let event = match event {
            Err(e) => {
                if !listed && let Some(reason) = refusal_reason(&e) {
                    tracing::error!(resource, selector, %reason, "shared watch refused; stopping it");
                    shared.refusal.refuse(reason);
                    break;
                }
                tracing::warn!(resource, selector, error = %e, "shared watch failed; retrying with backoff");
                continue;
            }
            Ok(event) => event,
        };
        // The first list's objects catch up, as do those the list of a new assignment brings
        // (the children of gained slots); what a later list (after the watch broke) finds
        // changed are changes missed live, and count as live.
        let done = matches!(event, Event::InitDone);
        let first_list = done && !listed;
        let assignment_list = done && listed && generation != listed_generation;
        if done {
            listed = true;
            listed_generation = generation;
        }
        let changed = cache.apply(&event, broadcasts);
        // An error only means nobody subscribes right now.
        if first_list {
            let _ = shared.tx.send(Broadcast::Listed);
        } else {
            for object in changed {
                let _ = shared.tx.send(Broadcast::Changed {
                    object,
                    listed: assignment_list,
                });
            }
        }
        if let Some(assignment_listed) = assignment_listed.as_ref().filter(|_| done) {
            assignment_listed.send_replace(generation);
        }
    }
    tracing::debug!(resource, selector, "shared watch stopped");
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// Applies one event to the cache and its indexes, and returns the objects to broadcast.
    fn apply(&mut self, event: &Event<K>, broadcasts: Broadcasts<K>) -> Vec<Arc<K>> {
        let Broadcasts { changed, deleted } = broadcasts;
        let store = self.writer.as_reader();
        let indexes = lock(&self.indexes);
        match event {
            Event::Apply(obj) => {
                let key = crate::object_key(obj);
                let old = store.get(&key);
                self.writer.apply_watcher_event(event);
                let Some(new) = store.get(&key) else {
                    return Vec::new();
                };
                for index in indexes.iter() {
                    index.update(old.as_deref(), new.clone());
                }
                if changed(old.as_deref(), &new) {
                    vec![new]
                } else {
                    Vec::new()
                }
            }
            Event::Delete(obj) => {
                let cached = store.get(&crate::object_key(obj));
                self.writer.apply_watcher_event(event);
                for index in indexes.iter() {
                    index.remove(obj);
                }
                if cached.as_deref().is_none_or(deleted) {
                    vec![Arc::new(obj.clone())]
                } else {
                    Vec::new()
                }
            }
            Event::Init | Event::InitApply(_) => {
                self.writer.apply_watcher_event(event);
                Vec::new()
            }
            Event::InitDone => {
                let mut before: HashMap<ObjectRef<K>, Arc<K>> = store
                    .state()
                    .into_iter()
                    .map(|o| (crate::object_key(o.as_ref()), o))
                    .collect();
                self.writer.apply_watcher_event(event);
                let now = store.state();
                for index in indexes.iter() {
                    index.rebuild(now.iter().cloned());
                }
                let mut out: Vec<Arc<K>> = now
                    .into_iter()
                    .filter(|o| {
                        changed(before.remove(&crate::object_key(o.as_ref())).as_deref(), o)
                    })
                    .collect();
                out.extend(before.into_values());
                out
            }
        }
    }
}

/// Drops what no controller reads from a cached object's metadata: its annotations (`kubectl
/// apply` keeps a whole copy of the object there). Managed fields are not even parsed (see
/// [`crate::managed_fields`]).
fn strip_metadata(meta: &mut kube::api::ObjectMeta) {
    meta.annotations = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::ApiServer;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    fn deployment(name: &str, rv: &str) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            ..Deployment::default()
        }
    }

    /// A shared watch of Deployments without a watch behind it.
    fn shared(
        store: Store<Deployment>,
        tx: broadcast::Sender<Broadcast<Deployment>>,
        indexes: Arc<Mutex<Vec<Index<Deployment>>>>,
    ) -> Shared<Deployment> {
        Shared {
            resource: "deployments".into(),
            selector: "".into(),
            store,
            tx,
            indexes,
            refusal: Arc::default(),
            assignment_listed: None,
        }
    }

    fn names(objs: &[Arc<Deployment>]) -> Vec<String> {
        let mut names: Vec<String> = objs
            .iter()
            .filter_map(|o| o.metadata.name.clone())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn broadcasts_changes_deletions_and_relist_differences() {
        let mut cache = Cache {
            writer: Writer::<Deployment>::default(),
            indexes: Arc::default(),
        };
        let store = cache.writer.as_reader();
        let shared = shared(
            store.clone(),
            broadcast::channel(1).0,
            cache.indexes.clone(),
        );
        let by_rv = shared.index("rv", |d: &Deployment| d.metadata.resource_version.clone());
        let mut step = |event: Event<Deployment>| {
            names(&cache.apply(&event, WatchSpec::<Deployment>::all().broadcasts))
        };

        assert!(step(Event::Init).is_empty());
        assert!(step(Event::InitApply(deployment("a", "1"))).is_empty());
        assert!(step(Event::InitApply(deployment("b", "1"))).is_empty());
        assert_eq!(step(Event::InitDone), ["a", "b"]);

        assert_eq!(step(Event::Apply(deployment("a", "2"))), ["a"]);
        assert!(
            step(Event::Apply(deployment("a", "2"))).is_empty(),
            "unchanged objects are not broadcast"
        );
        assert_eq!(step(Event::Delete(deployment("b", "1"))), ["b"]);
        assert_eq!(store.len(), 1);

        // A re-list where `a` is unchanged, `c` is new and `d` was seen before but is gone.
        assert_eq!(step(Event::Apply(deployment("d", "1"))), ["d"]);
        assert!(step(Event::Init).is_empty());
        assert!(step(Event::InitApply(deployment("a", "2"))).is_empty());
        assert!(step(Event::InitApply(deployment("c", "1"))).is_empty());
        assert_eq!(step(Event::InitDone), ["c", "d"]);
        assert_eq!(store.len(), 2);

        // The index followed every step, the re-list included.
        assert_eq!(names(&by_rv.get("2")), ["a"]);
        assert_eq!(names(&by_rv.get("1")), ["c"]);
        let again = shared.index("rv", |_| None);
        assert_eq!(names(&again.get("1")), ["c"], "one index per name, shared");
        let late = shared.index("name", |d: &Deployment| d.metadata.name.clone());
        assert_eq!(
            names(&late.get("a")),
            ["a"],
            "a late index starts from the cache"
        );
    }

    #[test]
    fn a_change_to_what_the_cache_drops_is_not_broadcast() {
        let mut cache = Cache {
            writer: Writer::<DeploymentView>::default(),
            indexes: Arc::default(),
        };
        let spec = managed_deployments();
        let mut step = |obj: Deployment| {
            let mut obj = DeploymentView::from(obj);
            (spec.strip)(&mut obj);
            let changed = cache.apply(&Event::Apply(obj), spec.broadcasts);
            let mut names: Vec<_> = changed
                .iter()
                .filter_map(|o| o.metadata.name.clone())
                .collect();
            names.sort();
            names
        };
        assert_eq!(step(deployment("a", "1")), ["a"], "a new object");
        let mut annotated = deployment("a", "2");
        annotated.metadata.annotations = Some(
            [(
                "deployment.kubernetes.io/revision".to_owned(),
                "1".to_owned(),
            )]
            .into(),
        );
        assert!(
            step(annotated).is_empty(),
            "only a dropped annotation changed"
        );
        let mut relabelled = deployment("a", "3");
        relabelled.metadata.labels = Some([("team".to_owned(), "blue".to_owned())].into());
        assert!(step(relabelled).is_empty(), "only a dropped label changed");
        let mut scaled = deployment("a", "4");
        scaled.spec.replicas = Some(2);
        assert_eq!(step(scaled), ["a"], "a change the cache keeps");
    }

    /// The Deployment controller's status writes in one scale event from one pod to two, as a
    /// real kube-controller-manager made them.
    #[test]
    fn only_the_status_writes_an_owner_reads_are_broadcast() {
        use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
        let changed = managed_deployments().broadcasts.changed;
        let condition = |type_: &str, status: &str, updated: &str| DeploymentCondition {
            type_: Some(type_.into()),
            status: Some(status.into()),
            last_update_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                updated.parse().expect("a timestamp"),
            )),
            ..DeploymentCondition::default()
        };
        let view = |rv: &str, status: DeploymentStatus| {
            let mut d = deployment("a", rv);
            d.metadata.generation = Some(2);
            d.spec.replicas = Some(2);
            d.status = Some(status);
            DeploymentView::from(d)
        };
        let counts =
            |observed, replicas, updated, ready, available, unavailable| DeploymentStatus {
                observed_generation: Some(observed),
                replicas: Some(replicas),
                updated_replicas: Some(updated),
                ready_replicas: Some(ready),
                available_replicas: Some(available),
                unavailable_replicas: unavailable,
                conditions: Some(vec![condition(
                    "Available",
                    "False",
                    "2026-01-01T00:00:00Z",
                )]),
                ..DeploymentStatus::default()
            };
        let unobserved = view("320", counts(1, 1, 1, 1, 1, None));
        let observed = view("321", counts(2, 1, 1, 1, 1, None));
        assert!(
            changed(Some(&unobserved), &observed),
            "the Deployment controller saw the new spec"
        );
        let unavailable_counted = view("328", counts(2, 1, 1, 1, 1, Some(1)));
        assert!(
            !changed(Some(&observed), &unavailable_counted),
            "unavailableReplicas alone"
        );
        let mut condition_touched = unavailable_counted.clone();
        condition_touched.metadata.resource_version = Some("329".into());
        if let Some(status) = condition_touched.status.as_mut() {
            status.conditions = Some(vec![condition(
                "Available",
                "False",
                "2026-01-01T00:00:09Z",
            )]);
        }
        assert!(
            !changed(Some(&unavailable_counted), &condition_touched),
            "a condition's update time alone"
        );
        let scaled = view("330", counts(2, 2, 2, 1, 1, Some(1)));
        assert!(
            !changed(Some(&condition_touched), &scaled),
            "a new pod, not ready yet: a detail until the rollout settles"
        );
        let ready = view("333", counts(2, 2, 2, 2, 2, None));
        assert!(changed(Some(&scaled), &ready), "the new pod ready");
        let mut settled_scaled = ready.clone();
        settled_scaled.metadata.resource_version = Some("336".into());
        if let Some(status) = settled_scaled.status.as_mut() {
            status.replicas = Some(3);
        }
        assert!(
            changed(Some(&ready), &settled_scaled),
            "a pod more than asked for leaves the settled state"
        );
        let mut failed = ready.clone();
        failed.metadata.resource_version = Some("334".into());
        if let Some(status) = failed.status.as_mut() {
            status.conditions = Some(vec![condition(
                "ReplicaFailure",
                "True",
                "2026-01-01T00:01:00Z",
            )]);
        }
        assert!(changed(Some(&ready), &failed), "a failure");
        let mut respecified = ready.clone();
        respecified.metadata.resource_version = Some("335".into());
        respecified.metadata.generation = Some(3);
        assert!(changed(Some(&ready), &respecified), "a new generation");
        assert!(!changed(Some(&ready), &ready), "the same version again");
        assert!(changed(None, &ready), "a new Deployment");
    }

    #[test]
    fn a_pod_is_broadcast_when_its_deletion_starts_not_again_when_it_is_gone() {
        let mut cache = Cache {
            writer: Writer::<PodMeta>::default(),
            indexes: Arc::default(),
        };
        let broadcasts = managed_pods().broadcasts;
        let pod = |name: &str, rv: &str, terminating: bool| {
            MetaView::new(ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                deletion_timestamp: terminating.then(crate::conditions::now),
                ..ObjectMeta::default()
            })
        };
        let mut step = |event: Event<PodMeta>| {
            let mut names: Vec<_> = cache
                .apply(&event, broadcasts)
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            names.sort();
            names
        };
        assert_eq!(step(Event::Apply(pod("a", "1", false))), ["a"]);
        assert_eq!(step(Event::Apply(pod("b", "1", false))), ["b"]);
        assert_eq!(
            step(Event::Apply(pod("a", "2", true))),
            ["a"],
            "its deletion starts"
        );
        let mut sooner = pod("a", "3", true);
        sooner.metadata.deletion_timestamp =
            Some(Time("2026-01-01T00:00:00Z".parse().expect("a timestamp")));
        assert!(
            step(Event::Apply(sooner)).is_empty(),
            "a shorter grace period"
        );
        assert!(
            step(Event::Delete(pod("a", "4", true))).is_empty(),
            "gone after its deletion was told"
        );
        assert_eq!(
            step(Event::Delete(pod("b", "2", true))),
            ["b"],
            "gone at once, never seen terminating"
        );
        assert_eq!(
            step(Event::Delete(pod("c", "1", true))),
            ["c"],
            "gone, never seen at all"
        );
    }

    fn budget(rv: &str, generation: i64) -> MetaView<PodDisruptionBudget> {
        MetaView::new(ObjectMeta {
            name: Some("b".into()),
            resource_version: Some(rv.into()),
            generation: Some(generation),
            ..ObjectMeta::default()
        })
    }

    #[test]
    fn children_by_generation_ignore_status_only_changes() {
        let changed = managed_by_generation::<PodDisruptionBudget>()
            .broadcasts
            .changed;
        let old = budget("1", 1);
        assert!(changed(None, &old), "a new child");
        assert!(!changed(Some(&old), &budget("2", 1)), "the status alone");
        assert!(changed(Some(&old), &budget("3", 2)), "a spec edit");
        let mut relabelled = budget("3", 1);
        relabelled.labels = [("a", "b")].into_iter().collect();
        assert!(changed(Some(&old), &relabelled), "a label edit");
        let mut disowned = budget("3", 1);
        disowned.metadata.owner_references = Some(Vec::new());
        assert!(changed(Some(&old), &disowned), "an owner edit");
        let mut deleting = budget("3", 1);
        deleting.metadata.deletion_timestamp = Some(crate::conditions::now());
        assert!(changed(Some(&old), &deleting), "a deletion");
    }

    #[test]
    fn a_metadata_watch_broadcasts_every_new_version() {
        let spec = managed_metadata::<PodDisruptionBudget>();
        let old = budget("1", 1);
        assert!((spec.broadcasts.changed)(None, &old), "a new child");
        assert!(
            (spec.broadcasts.changed)(Some(&old), &budget("2", 1)),
            "a spec edit without a generation"
        );
        assert!(
            !(spec.broadcasts.changed)(Some(&old), &budget("1", 1)),
            "the same version again"
        );
    }

    #[tokio::test]
    async fn lagging_subscribers_resync_from_the_cache() {
        let mut writer = Writer::<Deployment>::default();
        let store = writer.as_reader();
        writer.apply_watcher_event(&Event::InitDone);
        writer.apply_watcher_event(&Event::Apply(deployment("cached", "1")));
        let (tx, _) = broadcast::channel(2);
        let shared = shared(store, tx.clone(), Arc::default());
        let mut sub = std::pin::pin!(shared.subscribe());
        for i in 0..5 {
            let object = Arc::new(deployment(&format!("x{i}"), "1"));
            let _ = tx.send(Broadcast::Changed {
                object,
                listed: false,
            });
        }
        let first = sub.next().await.and_then(|d| d.metadata.name.clone());
        assert_eq!(
            first.as_deref(),
            Some("cached"),
            "after lagging, the cache is replayed"
        );
        let next = sub.next().await.and_then(|d| d.metadata.name.clone());
        assert_eq!(next.as_deref(), Some("x3"), "then the channel continues");
    }

    #[tokio::test]
    async fn a_first_list_takes_one_slot_and_reaches_subscribers_whole_as_listed() {
        let writer = Writer::<Deployment>::default();
        let store = writer.as_reader();
        let (tx, _) = broadcast::channel(4);
        let indexes: Arc<Mutex<Vec<Index<Deployment>>>> = Arc::default();
        let shared = shared(store, tx, indexes.clone());
        let mut sub = std::pin::pin!(shared.subscribe_changes());
        let listed = (0..10).map(|i| Ok(Event::InitApply(deployment(&format!("d{i}"), "1"))));
        let events = std::iter::once(Ok(Event::Init)).chain(listed).chain([
            Ok(Event::InitDone),
            Ok(Event::Apply(deployment("live", "2"))),
        ]);
        let cache = Cache { writer, indexes };
        let broadcasts = managed::<Deployment>().broadcasts;
        let stop = CancellationToken::new();
        fan_out(
            shared.clone(),
            futures::stream::iter(events.map(|event| (0, event))),
            cache,
            broadcasts,
            None,
            stop,
        )
        .await;
        assert_eq!(
            shared.tx.len(),
            2,
            "the list and the live change, a slot each"
        );

        let mut changes = Vec::new();
        for _ in 0..12 {
            let change = sub.next().await.expect("a change");
            let name = change.object.metadata.name.clone().unwrap_or_default();
            changes.push((name, change.listed));
        }
        let (listed, live): (Vec<_>, Vec<_>) = changes.into_iter().partition(|(_, l)| *l);
        let mut listed: Vec<String> = listed.into_iter().map(|(name, _)| name).collect();
        listed.sort();
        let mut expected: Vec<String> = (0..10).map(|i| format!("d{i}")).collect();
        expected.push("live".into());
        assert_eq!(listed, expected, "the whole cache, as listed");
        assert_eq!(live, [("live".to_string(), false)], "then the live change");
    }

    #[tokio::test]
    async fn the_list_of_a_new_assignment_catches_up_and_says_which_it_was() {
        let writer = Writer::<Deployment>::default();
        let store = writer.as_reader();
        let (tx, _) = broadcast::channel(16);
        let indexes: Arc<Mutex<Vec<Index<Deployment>>>> = Arc::default();
        let shared = shared(store.clone(), tx, indexes.clone());
        let mut sub = std::pin::pin!(shared.subscribe_changes());
        let list = |generation: u64, name: &str| {
            [
                Ok(Event::Init),
                Ok(Event::InitApply(deployment(name, "1"))),
                Ok(Event::InitDone),
            ]
            .map(|event| (generation, event))
        };
        let events = list(1, "kept-then-lost")
            .into_iter()
            .chain(list(2, "gained"))
            .chain([(2, Ok(Event::Apply(deployment("live", "2"))))]);
        let (listed, assignment_listed) = watch::channel(0);
        fan_out(
            shared.clone(),
            futures::stream::iter(events),
            Cache { writer, indexes },
            managed::<Deployment>().broadcasts,
            Some(listed),
            CancellationToken::new(),
        )
        .await;
        assert_eq!(*assignment_listed.borrow(), 2);
        let mut changes = Vec::new();
        for _ in 0..5 {
            let change = sub.next().await.expect("a change");
            let name = change.object.metadata.name.clone().unwrap_or_default();
            changes.push((name, change.listed));
        }
        let (mut listed, live): (Vec<_>, Vec<_>) = changes.into_iter().partition(|(_, l)| *l);
        listed.sort();
        let listed: Vec<String> = listed.into_iter().map(|(name, _)| name).collect();
        // The first list, read from the cache as the subscriber found it (gained, live); then
        // what the list of the new assignment changed (gained added, kept-then-lost gone).
        assert_eq!(listed, ["gained", "gained", "kept-then-lost", "live"]);
        assert_eq!(live, [("live".to_string(), false)], "the live change");
        assert_eq!(names(&store.state()), ["gained", "live"]);
    }

    /// Shared watches through an API server that fails every request with `code`.
    fn watches_answering(code: u16) -> (SharedWatches, ApiServer) {
        let server = ApiServer::failing(
            code,
            "unable to parse requirement: found '!', expected: identifier",
        );
        let watches =
            SharedWatches::new(server.client(), Namespaces::all(), CancellationToken::new());
        (watches, server)
    }

    fn queries(server: &ApiServer) -> Vec<String> {
        server.requests().into_iter().map(|r| r.query).collect()
    }

    #[tokio::test]
    async fn one_watch_per_type_and_selector_shared_by_every_asker() {
        let (watches, _) = watches_answering(500);
        let first = watches.watch(WatchSpec::<ConfigMap>::labelled("team=blue"));
        let again = watches.watch(WatchSpec::<ConfigMap>::labelled("team=blue"));
        assert!(
            Arc::ptr_eq(&first.refusal, &again.refusal),
            "the same type and selector share one watch"
        );
        let other = watches.watch(WatchSpec::<ConfigMap>::labelled("team=red"));
        assert!(!Arc::ptr_eq(&first.refusal, &other.refusal));
        let metadata = watches.watch(WatchSpec::<MetaView<ConfigMap>>::labelled("team=blue"));
        assert!(!Arc::ptr_eq(&first.refusal, &metadata.refusal));
        assert_eq!(&*first.resource, "configmaps");
        assert_eq!(lock(&watches.inner.watches).len(), 3);
        watches.stop().await;
    }

    #[tokio::test]
    async fn pods_are_listed_and_watched_as_metadata_and_cached_as_views() {
        let server = ApiServer::answering(|request| {
            if request.query.contains("watch=true") {
                return crate::fake::failure(500, "InternalError", "no watch in this test");
            }
            let metadata = serde_json::json!({
                "name": "m-6d9f8b7c5d-x7k2p", "generateName": "m-6d9f8b7c5d-",
                "namespace": "ns", "uid": "u-pod", "resourceVersion": "9",
                "labels": {"app": "memcached", "memcached_cr": "m",
                           "app.kubernetes.io/managed-by": crate::labels::manager()},
                "annotations": {"note": "dropped"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                     "name": "m-6d9f8b7c5d", "uid": "u-rs", "controller": true}],
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
            });
            let item = serde_json::json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": metadata,
            });
            let list = serde_json::json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                "metadata": {"resourceVersion": "10"}, "items": [item],
            });
            (200, list)
        });
        let watches =
            SharedWatches::new(server.client(), Namespaces::all(), CancellationToken::new());
        let pods = watches.pods();
        let ready = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            pods.ready(&CancellationToken::new()),
        )
        .await
        .expect("the list fills the cache");
        assert!(matches!(ready, Ok(true)), "{ready:?}");

        let cached = pods.store().state();
        assert_eq!(cached.len(), 1);
        let pod = &cached[0];
        assert_eq!(pod.metadata.name.as_deref(), Some("m-6d9f8b7c5d-x7k2p"));
        assert_eq!(pod.labels.get("memcached_cr"), Some("m"));
        let meta = &pod.metadata;
        assert_eq!((&meta.uid, &meta.resource_version), (&None, &None));
        assert_eq!(
            (&meta.generate_name, &meta.owner_references),
            (&None, &None)
        );
        assert_eq!((&meta.annotations, &meta.managed_fields), (&None, &None));

        // Past the probe for streamed lists, which this server does not serve.
        let probe = |r: &crate::fake::Request| r.query.contains("sendInitialEvents=true");
        assert!(server.requests().iter().any(probe));
        let requests: Vec<_> = server
            .requests()
            .into_iter()
            .filter(|r| !probe(r))
            .collect();
        let list = &requests[0];
        assert_eq!(list.path, "/api/v1/pods");
        assert!(
            list.query.contains(&format!(
                "labelSelector=app.kubernetes.io%2Fmanaged-by%3D{}",
                crate::labels::manager()
            )),
            "{}",
            list.query
        );
        assert_eq!(
            list.accept,
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        );
        for watch in requests.iter().filter(|r| r.query.contains("watch=true")) {
            assert_eq!(
                watch.accept,
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
            );
        }
        watches.stop().await;
    }

    #[tokio::test]
    async fn a_refused_watch_fails_ready_with_the_selector_and_the_reason() {
        let (watches, server) = watches_answering(400);
        let shared = watches.watch(WatchSpec::<ConfigMap>::labelled("team!!=blue"));
        let error = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            shared.ready(&CancellationToken::new()),
        )
        .await
        .expect("a refusal ends the wait")
        .expect_err("the watch was refused");
        let message = error.to_string();
        assert!(matches!(error, Error::WatchRefused { .. }), "{message}");
        for expected in [
            "cannot watch configmaps",
            "label selector \"team!!=blue\"",
            "malformed",
            "unable to parse requirement",
        ] {
            assert!(message.contains(expected), "{expected:?} in {message}");
        }
        assert!(
            queries(&server)
                .iter()
                .any(|q| q.contains("labelSelector=team%21%21%3Dblue")),
            "the selector was sent: {:?}",
            queries(&server)
        );
        watches.stop().await;
    }

    #[tokio::test]
    async fn a_server_error_is_retried_not_refused() {
        let (watches, server) = watches_answering(500);
        let shared = watches.watch(WatchSpec::<ConfigMap>::all());
        let retried = async {
            while server.requests().len() < 2 {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), retried)
            .await
            .expect("the list is retried");
        let cancel = CancellationToken::new();
        let ready = futures::FutureExt::now_or_never(shared.ready(&cancel));
        assert!(ready.is_none(), "still waiting for the first list");
        watches.stop().await;
    }
}
