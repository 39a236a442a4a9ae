//! One watch per resource type, shared by every controller that needs it.
//!
//! Memcached and MyApp both own Deployments, and Memcached follows its Pods. Instead of a watch
//! per controller (what `Controller::owns` does), [`SharedWatches`] runs one watch per type and
//! keeps one cache ([`Store`]) of it, like controller-runtime's shared informers. Each change is
//! broadcast to every subscribed controller, which maps it to the custom resources to reconcile.
//!
//! kube-runtime's own shared streams (`Writer::new_shared`) do not broadcast deletions, and a
//! deleted Deployment or Pod must trigger its owner, so the fan-out here is a small loop of ours
//! over the plain watcher, feeding the store and a broadcast channel:
//!
//! - every added or changed object is broadcast (Pods only when their labels or deletion state
//!   change: a metadata watch sees every status update, which the controllers do not need);
//! - a deleted object is broadcast as last seen, after it left the cache;
//! - after a re-list, objects that vanished meanwhile are broadcast as deletions and only
//!   changed ones as updates;
//! - a subscriber that falls behind by more than the channel holds gets every cached object
//!   again (a re-list for that subscriber alone), instead of silently missing changes.
//!
//! The Deployment and Pod watches select `app.kubernetes.io/managed-by=operator-manager`, so those
//! caches hold only the workloads these controllers manage. Every other Deployment is watched as
//! metadata only ([`SharedWatches::unmanaged_deployments`]): a custom resource must never take
//! over a Deployment of its name that it does not control, and must notice at once when such a
//! Deployment goes away. Pods are watched as metadata only too.
//!
//! What a controller never reads is dropped before it is cached (managed fields, annotations,
//! most of a Deployment's pod template): on a cluster with thousands of workloads, the caches
//! are most of the manager's heap. Each cache can carry secondary indexes ([`Index`]).

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::index::{Index, KeyFn};
use crate::{Error, labels};

/// Changes buffered per subscriber before it counts as lagging (and gets a full resync).
const CHANNEL_CAPACITY: usize = 4096;

/// The metadata of a Pod: all the controllers need (names, labels, deletion).
pub type PodMeta = PartialObjectMeta<Pod>;
/// The metadata of a Deployment that no controller of ours manages (name and owners).
pub type DeploymentMeta = PartialObjectMeta<Deployment>;

/// The watches shared by the controllers of one [`crate::run`]; each starts on first use and
/// stops with [`SharedWatches::stop`].
#[derive(Clone)]
pub struct SharedWatches {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    stop: CancellationToken,
    deployments: OnceLock<Shared<Deployment>>,
    unmanaged_deployments: OnceLock<Shared<DeploymentMeta>>,
    pods: OnceLock<Shared<PodMeta>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Debug for SharedWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWatches")
            .field("deployments", &self.inner.deployments.get().is_some())
            .field("pods", &self.inner.pods.get().is_some())
            .finish_non_exhaustive()
    }
}

impl SharedWatches {
    /// Watches through `client`, until `stop` is cancelled or [`SharedWatches::stop`] is called.
    pub fn new(client: kube::Client, stop: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                stop,
                deployments: OnceLock::new(),
                unmanaged_deployments: OnceLock::new(),
                pods: OnceLock::new(),
                tasks: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The managed Deployments of every namespace. Must be called within a tokio runtime.
    pub fn deployments(&self) -> Shared<Deployment> {
        self.inner
            .deployments
            .get_or_init(|| {
                let api = Api::<Deployment>::all(self.inner.client.clone());
                self.start(
                    "deployments",
                    api,
                    &labels::managed_selector(),
                    |old, new| {
                        old.is_none_or(|old| {
                            old.metadata.resource_version != new.metadata.resource_version
                        })
                    },
                    strip_deployment,
                )
            })
            .clone()
    }

    /// The metadata of every Deployment these controllers do not manage. Must be called within
    /// a tokio runtime.
    pub fn unmanaged_deployments(&self) -> Shared<DeploymentMeta> {
        self.inner
            .unmanaged_deployments
            .get_or_init(|| {
                let api = Api::<DeploymentMeta>::all(self.inner.client.clone());
                self.start(
                    "unmanaged deployments",
                    api,
                    &labels::unmanaged_selector(),
                    // Only its existence and its owners matter to a controller.
                    |old, new| {
                        old.is_none_or(|old| {
                            old.metadata.owner_references != new.metadata.owner_references
                        })
                    },
                    |meta: &mut DeploymentMeta| {
                        strip_metadata(&mut meta.metadata);
                        meta.metadata.labels = None;
                    },
                )
            })
            .clone()
    }

    /// The metadata of the managed Pods of every namespace. Must be called within a tokio
    /// runtime.
    pub fn pods(&self) -> Shared<PodMeta> {
        self.inner
            .pods
            .get_or_init(|| {
                let api = Api::<PodMeta>::all(self.inner.client.clone());
                self.start(
                    "pods",
                    api,
                    &labels::managed_selector(),
                    |old, new| {
                        old.is_none_or(|old| {
                            old.metadata.labels != new.metadata.labels
                                || old.metadata.deletion_timestamp
                                    != new.metadata.deletion_timestamp
                        })
                    },
                    |pod: &mut PodMeta| {
                        strip_metadata(&mut pod.metadata);
                        pod.metadata.owner_references = None;
                    },
                )
            })
            .clone()
    }

    fn start<K>(
        &self,
        resource: &'static str,
        api: Api<K>,
        selector: &str,
        changed: fn(Option<&K>, &K) -> bool,
        strip: fn(&mut K),
    ) -> Shared<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let writer = Writer::<K>::default();
        let store = writer.as_reader();
        let (tx, _) = broadcast::channel(CHANNEL_CAPACITY);
        let indexes: Arc<Mutex<Vec<Index<K>>>> = Arc::default();
        let config = watcher::Config::default().labels(selector);
        let events = kube::runtime::watcher(api, config)
            .backoff(crate::backoff::watch_backoff())
            .modify(strip);
        let task = tokio::spawn(fan_out(
            resource,
            events,
            Cache {
                writer,
                indexes: indexes.clone(),
            },
            tx.clone(),
            changed,
            self.inner.stop.clone(),
        ));
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(task);
        Shared {
            resource,
            store,
            tx,
            indexes,
        }
    }

    /// Stops every watch and waits for them to end.
    pub async fn stop(&self) {
        self.inner.stop.cancel();
        let tasks = std::mem::take(
            &mut *self
                .inner
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in tasks {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "a shared watch task failed");
            }
        }
    }
}

/// One shared watch: its cache, and a way to follow its changes.
pub struct Shared<K: Resource<DynamicType = ()> + 'static> {
    resource: &'static str,
    store: Store<K>,
    tx: broadcast::Sender<Arc<K>>,
    indexes: Arc<Mutex<Vec<Index<K>>>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for Shared<K> {
    fn clone(&self) -> Self {
        Self {
            resource: self.resource,
            store: self.store.clone(),
            tx: self.tx.clone(),
            indexes: self.indexes.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + 'static> Debug for Shared<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("resource", &self.resource)
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

    /// Waits until the cache holds a complete list, or `cancel` fires (then returns `Ok(false)`).
    ///
    /// # Errors
    /// [`Error::WatchStopped`] when the watch ended before its first list.
    pub async fn ready(&self, cancel: &CancellationToken) -> Result<bool, Error> {
        tokio::select! {
            biased;
            () = cancel.cancelled() => Ok(false),
            ready = self.store.wait_until_ready() => match ready {
                Ok(()) => Ok(true),
                // The watch stops with the shutdown that cancels us: that is no failure.
                Err(_) if cancel.is_cancelled() => Ok(false),
                Err(_) => Err(Error::WatchStopped { resource: self.resource }),
            },
        }
    }

    /// The secondary index called `name`, keying objects by `key_of`: created (from what the
    /// cache holds now) by the first controller that asks, and shared by every later one. The
    /// name is what identifies it: ask for one name with one key function.
    pub fn index(&self, name: &'static str, key_of: KeyFn<K>) -> Index<K> {
        let mut indexes = self
            .indexes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
        let state = Subscriber {
            resource: self.resource,
            rx: self.tx.subscribe(),
            store: self.store.clone(),
            backlog: Vec::new(),
        };
        futures::stream::unfold(state, |mut s| async move {
            loop {
                if let Some(obj) = s.backlog.pop() {
                    return Some((obj, s));
                }
                match s.rx.recv().await {
                    Ok(obj) => return Some((obj, s)),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            resource = s.resource,
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
    resource: &'static str,
    rx: broadcast::Receiver<Arc<K>>,
    store: Store<K>,
    backlog: Vec<Arc<K>>,
}

/// A shared cache and its secondary indexes, written only by the watch that fills them.
struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    writer: Writer<K>,
    indexes: Arc<Mutex<Vec<Index<K>>>>,
}

/// Applies watch events to the cache and broadcasts what changed, until `stop`.
async fn fan_out<K>(
    resource: &'static str,
    events: impl Stream<Item = watcher::Result<Event<K>>> + Send,
    mut cache: Cache<K>,
    tx: broadcast::Sender<Arc<K>>,
    changed: fn(Option<&K>, &K) -> bool,
    stop: CancellationToken,
) where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let mut events = std::pin::pin!(events);
    tracing::debug!(resource, "shared watch started");
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => break,
            event = events.next() => event,
        };
        let event = match event {
            None => break,
            Some(Err(e)) => {
                tracing::warn!(resource, error = %e, "shared watch failed; retrying with backoff");
                continue;
            }
            Some(Ok(event)) => event,
        };
        for obj in cache.apply(&event, changed) {
            // An error only means nobody subscribes right now.
            let _ = tx.send(obj);
        }
    }
    tracing::debug!(resource, "shared watch stopped");
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// Applies one event to the cache and its indexes, and returns the objects to broadcast.
    fn apply(&mut self, event: &Event<K>, changed: fn(Option<&K>, &K) -> bool) -> Vec<Arc<K>> {
        let store = self.writer.as_reader();
        let indexes = self
            .indexes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match event {
            Event::Apply(obj) => {
                let key = ObjectRef::from_obj(obj);
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
                self.writer.apply_watcher_event(event);
                for index in indexes.iter() {
                    index.remove(obj);
                }
                vec![Arc::new(obj.clone())]
            }
            Event::Init | Event::InitApply(_) => {
                self.writer.apply_watcher_event(event);
                Vec::new()
            }
            Event::InitDone => {
                let mut before: HashMap<ObjectRef<K>, Arc<K>> = store
                    .state()
                    .into_iter()
                    .map(|o| (ObjectRef::from_obj(o.as_ref()), o))
                    .collect();
                self.writer.apply_watcher_event(event);
                let now = store.state();
                for index in indexes.iter() {
                    index.rebuild(now.iter().cloned());
                }
                let mut out: Vec<Arc<K>> = now
                    .into_iter()
                    .filter(|o| {
                        changed(
                            before.remove(&ObjectRef::from_obj(o.as_ref())).as_deref(),
                            o,
                        )
                    })
                    .collect();
                out.extend(before.into_values());
                out
            }
        }
    }
}

/// Drops what no controller reads from a cached object's metadata: managed fields (often the
/// largest part of an object) and annotations (`kubectl apply` keeps a whole copy there).
fn strip_metadata(meta: &mut kube::api::ObjectMeta) {
    meta.managed_fields = None;
    meta.annotations = None;
}

/// Keeps of a managed Deployment what the controllers read: its metadata, replicas, status, and
/// the name and image of each container (for the Events that say what changed).
fn strip_deployment(deployment: &mut Deployment) {
    strip_metadata(&mut deployment.metadata);
    let spec = &mut deployment.spec;
    spec.selector = Default::default();
    spec.strategy = None;
    spec.template.metadata = None;
    if let Some(pod) = spec.template.spec.as_mut() {
        let containers = std::mem::take(&mut pod.containers);
        *pod = k8s_openapi::api::core::v1::PodSpec {
            containers: containers
                .into_iter()
                .map(|c| k8s_openapi::api::core::v1::Container {
                    name: c.name,
                    image: c.image,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn rv_changed(old: Option<&Deployment>, new: &Deployment) -> bool {
        old.is_none_or(|old| old.metadata.resource_version != new.metadata.resource_version)
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
        let shared = Shared {
            resource: "deployments",
            store: store.clone(),
            tx: broadcast::channel(1).0,
            indexes: cache.indexes.clone(),
        };
        let by_rv = shared.index("rv", |d: &Deployment| d.metadata.resource_version.clone());
        let mut step = |event: Event<Deployment>| names(&cache.apply(&event, rv_changed));

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

    #[tokio::test]
    async fn lagging_subscribers_resync_from_the_cache() {
        let mut writer = Writer::<Deployment>::default();
        let store = writer.as_reader();
        writer.apply_watcher_event(&Event::InitDone);
        writer.apply_watcher_event(&Event::Apply(deployment("cached", "1")));
        let (tx, _) = broadcast::channel(2);
        let shared = Shared {
            resource: "deployments",
            store,
            tx: tx.clone(),
            indexes: Arc::default(),
        };
        let mut sub = std::pin::pin!(shared.subscribe());
        for i in 0..5 {
            let _ = tx.send(Arc::new(deployment(&format!("x{i}"), "1")));
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
}
