//! Which namespaces the manager watches: every one (the default), or only those named with
//! `--namespace`, so a team can run it with Roles in its own namespaces instead of a ClusterRole.
//!
//! Every watch of a namespaced type goes through [`watch`]: one watch of the whole cluster, one
//! of the single namespace, or one per namespace merged into a single stream of watcher events
//! that a cache ([`kube::runtime::reflector::store::Writer`]) takes as if it were one watch.
//! Merging needs care because each namespace lists (and, after a lost watch, re-lists) on its
//! own, while a cache's `Init`…`InitDone` replaces everything it holds:
//!
//! - the first list is one `Init`…`InitDone` over every namespace, ending when the last
//!   namespace has listed; changes a namespace sees after its own list are held until then;
//! - a later re-list of one namespace becomes `Apply` for each object listed, then `Delete` for
//!   each cached object of that namespace the list no longer has.
//!
//! Cluster-scoped types are always watched cluster-wide.

use std::collections::{HashSet, VecDeque};
use std::fmt;

use futures::stream::{self, BoxStream, SelectAll};
use futures::{Stream, StreamExt, TryStreamExt};
use kube::Resource;
use kube::api::Api;
use kube::core::{ClusterResourceScope, NamespaceResourceScope};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use crate::initial_lists::InitialLists;
use crate::managed_fields::{self, WithoutManagedFields};
use crate::reconnect::reconnecting;

/// The namespaces the manager watches; none named means every namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespaces(Vec<String>);

impl Namespaces {
    /// Every namespace.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only `names` (sorted, each once); an empty list means every namespace.
    pub fn only<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        let mut names: Vec<String> = names.into_iter().map(Into::into).collect();
        names.sort();
        names.dedup();
        Self(names)
    }

    /// Whether every namespace is watched.
    pub fn is_all(&self) -> bool {
        self.0.is_empty()
    }

    /// The namespaces named (none when every namespace is watched).
    pub fn names(&self) -> &[String] {
        &self.0
    }

    /// Whether objects of `namespace` are watched.
    pub fn contains(&self, namespace: &str) -> bool {
        self.is_all() || self.0.iter().any(|n| n == namespace)
    }
}

impl fmt::Display for Namespaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_all() {
            f.write_str("every namespace")
        } else {
            f.write_str(&self.0.join(","))
        }
    }
}

/// How the objects of a scope (namespaced or cluster-wide) are reached.
pub trait ScopedApi: Sized {
    /// Whether objects of this scope live in namespaces.
    const NAMESPACED: bool;

    /// The API of the objects in `namespace`, or of the whole cluster.
    fn api<K>(client: kube::Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>;
}

impl ScopedApi for NamespaceResourceScope {
    const NAMESPACED: bool = true;

    fn api<K>(client: kube::Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>,
    {
        match namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::all(client),
        }
    }
}

impl ScopedApi for ClusterResourceScope {
    const NAMESPACED: bool = false;

    fn api<K>(client: kube::Client, _: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = Self, DynamicType = ()>,
    {
        Api::all(client)
    }
}

/// The watcher events of every object of type `K` in `namespaces` that `config` selects, each
/// namespace's watch reconnecting as [`crate::reconnect`] describes, its initial lists streamed
/// or paged as `lists` finds ([`crate::initial_lists`]). `cache` is the store the events are
/// written to: a merged re-list reads it to find what was deleted meanwhile.
pub fn watch<K>(
    client: &kube::Client,
    namespaces: &Namespaces,
    config: &watcher::Config,
    lists: &InitialLists,
    cache: Store<K>,
) -> BoxStream<'static, watcher::Result<Event<K>>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::Scope: ScopedApi,
{
    let one = |namespace: Option<&str>| {
        let api = K::Scope::api::<WithoutManagedFields<K>>(client.clone(), namespace);
        let probed = K::Scope::api::<K>(client.clone(), namespace);
        let (config, lists) = (config.clone(), lists.clone());
        futures::stream::once(async move { lists.streamed(probed).await })
            .flat_map(move |streamed| {
                let (api, config) = (api.clone(), InitialLists::config(config.clone(), streamed));
                reconnecting(
                    move || kube::runtime::watcher(api.clone(), config.clone()),
                    crate::backoff::watch_backoff(),
                )
            })
            .map_ok(managed_fields::into_inner)
            .boxed()
    };
    match namespaces.names() {
        _ if !K::Scope::NAMESPACED => one(None),
        [] => one(None),
        [namespace] => one(Some(namespace)),
        many => merge(
            many.iter()
                .map(|namespace| (namespace.clone(), one(Some(namespace))))
                .collect(),
            cache,
        )
        .boxed(),
    }
}

/// What the merged stream emits next.
enum Out<K: Resource<DynamicType = ()>> {
    Event(Event<K>),
    /// Deletions of the cached objects (of one namespace, or of all) that are not in `listed`,
    /// found when every event before this one has reached the cache.
    Prune {
        namespace: Option<String>,
        listed: HashSet<ObjectRef<K>>,
    },
}

/// The first list, until every namespace has listed.
struct FirstList<K: Resource<DynamicType = ()>> {
    /// Per namespace, what its latest complete list held (`None` until it has listed).
    listed: Vec<Option<HashSet<ObjectRef<K>>>>,
    /// Changes of namespaces that have listed, with their namespace's index.
    held: Vec<(usize, Event<K>)>,
}

struct Merge<K: Resource<DynamicType = ()> + 'static> {
    namespaces: Vec<String>,
    watches: SelectAll<BoxStream<'static, (usize, watcher::Result<Event<K>>)>>,
    cache: Store<K>,
    /// Per namespace, what its list in progress has shown so far.
    listing: Vec<Option<HashSet<ObjectRef<K>>>>,
    first: Option<FirstList<K>>,
    out: VecDeque<Out<K>>,
}

/// One stream of the watches of several namespaces (see the module documentation).
fn merge<K>(
    watches: Vec<(String, BoxStream<'static, watcher::Result<Event<K>>>)>,
    cache: Store<K>,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let count = watches.len();
    let mut namespaces = Vec::with_capacity(count);
    let mut tagged = stream::SelectAll::new();
    for (index, (namespace, events)) in watches.into_iter().enumerate() {
        namespaces.push(namespace);
        tagged.push(events.map(move |event| (index, event)).boxed());
    }
    let merge = Merge {
        namespaces,
        watches: tagged,
        cache,
        listing: (0..count).map(|_| None).collect(),
        first: Some(FirstList {
            listed: (0..count).map(|_| None).collect(),
            held: Vec::new(),
        }),
        out: VecDeque::from([Out::Event(Event::Init)]),
    };
    stream::unfold(merge, |mut merge| async move {
        loop {
            match merge.out.pop_front() {
                Some(Out::Event(event)) => return Some((Ok(event), merge)),
                Some(Out::Prune { namespace, listed }) => {
                    merge.prune(namespace.as_deref(), &listed);
                    continue;
                }
                None => {}
            }
            match merge.watches.next().await? {
                (_, Err(error)) => return Some((Err(error), merge)),
                (index, Ok(event)) => merge.take(index, event),
            }
        }
    })
}

impl<K> Merge<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// Takes one event of the namespace at `index`.
    fn take(&mut self, index: usize, event: Event<K>) {
        match event {
            Event::Init => {
                self.listing[index] = Some(HashSet::new());
                if let Some(first) = &mut self.first {
                    // The new list supersedes what the namespace saw since its last one.
                    first.held.retain(|(from, _)| *from != index);
                }
            }
            Event::InitApply(obj) => {
                self.listing[index]
                    .get_or_insert_with(HashSet::new)
                    .insert(crate::object_key(&obj));
                self.out.push_back(Out::Event(if self.first.is_some() {
                    Event::InitApply(obj)
                } else {
                    Event::Apply(obj)
                }));
            }
            Event::InitDone => {
                let listed = self.listing[index].take().unwrap_or_default();
                match &mut self.first {
                    Some(first) => {
                        first.listed[index] = Some(listed);
                        if first.listed.iter().all(Option::is_some) {
                            self.finish_first_list();
                        }
                    }
                    None => self.out.push_back(Out::Prune {
                        namespace: Some(self.namespaces[index].clone()),
                        listed,
                    }),
                }
            }
            change @ (Event::Apply(_) | Event::Delete(_)) => match &mut self.first {
                Some(first) => first.held.push((index, change)),
                None => self.out.push_back(Out::Event(change)),
            },
        }
    }

    /// Every namespace has listed: the cache takes the lists, drops what an interrupted list
    /// left behind, then sees the changes held meanwhile.
    fn finish_first_list(&mut self) {
        let Some(first) = self.first.take() else {
            return;
        };
        self.out.push_back(Out::Event(Event::InitDone));
        self.out.push_back(Out::Prune {
            namespace: None,
            listed: first.listed.into_iter().flatten().flatten().collect(),
        });
        self.out
            .extend(first.held.into_iter().map(|(_, e)| Out::Event(e)));
    }

    /// Queues, at the front, a deletion of each cached object (of `namespace`, or of any) that
    /// `listed` does not hold.
    fn prune(&mut self, namespace: Option<&str>, listed: &HashSet<ObjectRef<K>>) {
        let gone = self.cache.state().into_iter().filter(|obj| {
            namespace.is_none_or(|n| obj.meta().namespace.as_deref() == Some(n))
                && !listed.contains(&crate::object_key(obj.as_ref()))
        });
        for obj in gone {
            self.out
                .push_front(Out::Event(Event::Delete(obj.as_ref().clone())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::store::Writer;
    use tokio::sync::mpsc;

    fn config_map(namespace: &str, name: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    /// Two namespaces' watches fed by hand, merged into a cache.
    struct Harness {
        a: mpsc::UnboundedSender<watcher::Result<Event<ConfigMap>>>,
        b: mpsc::UnboundedSender<watcher::Result<Event<ConfigMap>>>,
        merged: BoxStream<'static, watcher::Result<Event<ConfigMap>>>,
        writer: Writer<ConfigMap>,
    }

    impl Harness {
        fn new() -> Self {
            let (a, a_events) = mpsc::unbounded_channel();
            let (b, b_events) = mpsc::unbounded_channel();
            let writer = Writer::default();
            let merged = merge(
                vec![
                    ("a".to_owned(), tokio_stream_of(a_events)),
                    ("b".to_owned(), tokio_stream_of(b_events)),
                ],
                writer.as_reader(),
            )
            .boxed();
            Self {
                a,
                b,
                merged,
                writer,
            }
        }

        /// Applies to the cache every merged event available now, and returns their names.
        async fn drain(&mut self) -> Vec<String> {
            let mut seen = Vec::new();
            while let Ok(Some(event)) =
                tokio::time::timeout(std::time::Duration::from_millis(50), self.merged.next()).await
            {
                let Ok(event) = event else {
                    seen.push("error".to_owned());
                    continue;
                };
                seen.push(describe(&event));
                self.writer.apply_watcher_event(&event);
            }
            seen
        }

        fn cached(&self) -> Vec<String> {
            let mut names: Vec<String> = self
                .writer
                .as_reader()
                .state()
                .iter()
                .map(|o| {
                    format!(
                        "{}/{}@{}",
                        o.metadata.namespace.as_deref().unwrap_or_default(),
                        o.metadata.name.as_deref().unwrap_or_default(),
                        o.metadata.resource_version.as_deref().unwrap_or_default()
                    )
                })
                .collect();
            names.sort();
            names
        }
    }

    fn tokio_stream_of<T: Send + 'static>(
        mut rx: mpsc::UnboundedReceiver<T>,
    ) -> BoxStream<'static, T> {
        stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
    }

    fn describe(event: &Event<ConfigMap>) -> String {
        let name = |o: &ConfigMap| {
            format!(
                "{}/{}",
                o.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.name.as_deref().unwrap_or_default()
            )
        };
        match event {
            Event::Init => "Init".to_owned(),
            Event::InitApply(o) => format!("InitApply {}", name(o)),
            Event::InitDone => "InitDone".to_owned(),
            Event::Apply(o) => format!("Apply {}", name(o)),
            Event::Delete(o) => format!("Delete {}", name(o)),
        }
    }

    fn send(
        to: &mpsc::UnboundedSender<watcher::Result<Event<ConfigMap>>>,
        events: Vec<Event<ConfigMap>>,
    ) {
        for event in events {
            assert!(to.send(Ok(event)).is_ok());
        }
    }

    #[tokio::test]
    async fn the_first_list_ends_when_every_namespace_has_listed() {
        let mut h = Harness::new();
        send(
            &h.a,
            vec![
                Event::Init,
                Event::InitApply(config_map("a", "one", "1")),
                Event::InitDone,
                // After its own list, while `b` still lists: held until `b` is done.
                Event::Apply(config_map("a", "one", "2")),
                Event::Apply(config_map("a", "two", "3")),
            ],
        );
        send(
            &h.b,
            vec![Event::Init, Event::InitApply(config_map("b", "x", "1"))],
        );
        let mut listed = h.drain().await;
        listed.sort();
        assert_eq!(
            listed,
            ["Init", "InitApply a/one", "InitApply b/x"],
            "no InitDone, no changes, until both have listed"
        );
        send(&h.b, vec![Event::InitDone]);
        assert_eq!(h.drain().await, ["InitDone", "Apply a/one", "Apply a/two"]);
        assert_eq!(h.cached(), ["a/one@2", "a/two@3", "b/x@1"]);
    }

    #[tokio::test]
    async fn a_later_relist_of_one_namespace_keeps_the_others_and_deletes_what_went() {
        let mut h = Harness::new();
        send(
            &h.a,
            vec![
                Event::Init,
                Event::InitApply(config_map("a", "stays", "1")),
                Event::InitApply(config_map("a", "goes", "1")),
                Event::InitDone,
            ],
        );
        send(
            &h.b,
            vec![
                Event::Init,
                Event::InitApply(config_map("b", "x", "1")),
                Event::InitDone,
            ],
        );
        h.drain().await;
        assert_eq!(h.cached(), ["a/goes@1", "a/stays@1", "b/x@1"]);

        send(
            &h.a,
            vec![
                Event::Init,
                Event::InitApply(config_map("a", "stays", "5")),
                Event::InitApply(config_map("a", "new", "6")),
                Event::InitDone,
            ],
        );
        assert_eq!(
            h.drain().await,
            ["Apply a/stays", "Apply a/new", "Delete a/goes"]
        );
        assert_eq!(h.cached(), ["a/new@6", "a/stays@5", "b/x@1"]);
    }

    #[tokio::test]
    async fn an_interrupted_first_list_leaves_nothing_stale() {
        let mut h = Harness::new();
        send(
            &h.a,
            vec![
                Event::Init,
                Event::InitApply(config_map("a", "gone-meanwhile", "1")),
                // The list failed; the watcher starts over.
                Event::Init,
                Event::InitApply(config_map("a", "kept", "2")),
                Event::InitDone,
                Event::Apply(config_map("a", "kept", "3")),
                // And again, after its list but before `b`'s: the change above is superseded.
                Event::Init,
                Event::InitApply(config_map("a", "kept", "4")),
                Event::InitDone,
            ],
        );
        assert_eq!(
            h.drain().await,
            [
                "Init",
                "InitApply a/gone-meanwhile",
                "InitApply a/kept",
                "InitApply a/kept"
            ],
            "the held change was superseded by the next list"
        );
        assert!(h.b.send(Err(watcher::Error::NoResourceVersion)).is_ok());
        send(&h.b, vec![Event::Init, Event::InitDone]);
        assert_eq!(
            h.drain().await,
            ["error", "InitDone", "Delete a/gone-meanwhile"],
            "errors pass through; what the interrupted list left is deleted"
        );
        assert_eq!(h.cached(), ["a/kept@4"]);
    }

    #[test]
    fn namespaces_are_sorted_once_and_empty_means_all() {
        let some = Namespaces::only(["b", "a", "b"]);
        assert_eq!(some.names(), ["a", "b"]);
        assert_eq!(some.to_string(), "a,b");
        assert!(some.contains("a") && !some.contains("c"));
        let all = Namespaces::only(Vec::<String>::new());
        assert!(all.is_all() && all.contains("anything"));
        assert_eq!(all.to_string(), "every namespace");
    }
}
