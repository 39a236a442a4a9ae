//! Secondary indexes of a shared cache: the cached objects grouped by a key computed from each
//! (for example pods by the custom resource they belong to), so a lookup costs what its answer
//! holds, not what the cache holds. controller-runtime calls these field indexers.
//!
//! An index is kept by the shared watch that owns the cache ([`crate::watches`]): every change
//! it applies to the cache it applies to each index in the same step, and after a re-list it
//! rebuilds them, so an index never disagrees with its cache for longer than one event.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, RwLock};

use kube::Resource;

/// How an index keys an object: `None` leaves it out of the index.
pub type KeyFn<K> = fn(&K) -> Option<String>;

/// The objects of one key, each once (by namespace and name). A group holds what one lookup
/// answers, a handful of objects, so a vector searched in place costs less than a map: an
/// index of two pods for each of 10,000 custom resources held a hash table and two copied
/// keys per group.
type Group<K> = Vec<Arc<K>>;
/// Every group, by key.
type Groups<K> = HashMap<Box<str>, Group<K>>;

/// One secondary index of a shared cache. Cloning it shares it.
pub struct Index<K: Resource<DynamicType = ()> + 'static> {
    inner: Arc<Inner<K>>,
}

struct Inner<K: Resource<DynamicType = ()> + 'static> {
    name: &'static str,
    key_of: KeyFn<K>,
    groups: RwLock<Groups<K>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for Index<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + 'static> Debug for Index<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl<K: Resource<DynamicType = ()> + 'static> Index<K> {
    /// An empty index called `name`, keyed by `key_of`.
    pub(crate) fn new(name: &'static str, key_of: KeyFn<K>) -> Self {
        Self {
            inner: Arc::new(Inner {
                name,
                key_of,
                groups: RwLock::default(),
            }),
        }
    }

    /// The index's name, unique per cache.
    pub fn name(&self) -> &'static str {
        self.inner.name
    }

    /// The cached objects whose key is `key`, in no particular order.
    pub fn get(&self, key: &str) -> Vec<Arc<K>> {
        self.read().get(key).cloned().unwrap_or_default()
    }

    /// Files `new` under its key, and takes `old` (the same object as cached before) out of its
    /// own if that differs.
    pub(crate) fn update(&self, old: Option<&K>, new: Arc<K>) {
        let new_key = (self.inner.key_of)(&new);
        let old_key = old.and_then(self.inner.key_of);
        let mut groups = self.write();
        if let Some(old_key) = old_key.filter(|k| Some(k) != new_key.as_ref()) {
            remove_from(&mut groups, &old_key, new.as_ref());
        }
        if let Some(new_key) = new_key {
            file_under(&mut groups, new_key, new);
        }
    }

    /// Takes a deleted object out of the index.
    pub(crate) fn remove(&self, obj: &K) {
        if let Some(key) = (self.inner.key_of)(obj) {
            remove_from(&mut self.write(), &key, obj);
        }
    }

    /// Replaces everything with `objects` (after a re-list).
    pub(crate) fn rebuild(&self, objects: impl IntoIterator<Item = Arc<K>>) {
        let mut groups: Groups<K> = HashMap::new();
        for obj in objects {
            if let Some(key) = (self.inner.key_of)(&obj) {
                file_under(&mut groups, key, obj);
            }
        }
        *self.write() = groups;
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Groups<K>> {
        // A poisoned lock only means a panic elsewhere mid-update of one group; the map is valid.
        self.inner
            .groups
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Groups<K>> {
        self.inner
            .groups
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether `a` and `b` are the same object: the same namespace and name.
fn same_object<K: Resource>(a: &K, b: &K) -> bool {
    a.meta().name == b.meta().name && a.meta().namespace == b.meta().namespace
}

/// Files `obj` under `key`, in place of the same object if the group has it.
fn file_under<K: Resource>(groups: &mut Groups<K>, key: String, obj: Arc<K>) {
    let group = groups.entry(key.into_boxed_str()).or_default();
    match group
        .iter_mut()
        .find(|cached| same_object(cached.as_ref(), obj.as_ref()))
    {
        Some(cached) => *cached = obj,
        None => group.push(obj),
    }
}

/// Takes `obj` out of the group `key`, and drops the group once it is empty.
fn remove_from<K: Resource>(groups: &mut Groups<K>, key: &str, obj: &K) {
    if let Some(group) = groups.get_mut(key) {
        group.retain(|cached| !same_object(cached.as_ref(), obj));
        if group.is_empty() {
            groups.remove(key);
        } else if group.len() * 4 <= group.capacity() {
            // A group that shrank a lot (a scale down) gives its room back.
            group.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn config_map(name: &str, team: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: team.map(|t| [("team".to_owned(), t.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn by_team(cm: &ConfigMap) -> Option<String> {
        cm.metadata.labels.as_ref()?.get("team").cloned()
    }

    fn names(index: &Index<ConfigMap>, key: &str) -> Vec<String> {
        let mut names: Vec<String> = index
            .get(key)
            .iter()
            .filter_map(|cm| cm.metadata.name.clone())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn objects_follow_their_key() {
        let index = Index::new("team", by_team as KeyFn<ConfigMap>);
        let a = config_map("a", Some("blue"));
        index.update(None, Arc::new(a.clone()));
        index.update(None, Arc::new(config_map("b", Some("blue"))));
        index.update(None, Arc::new(config_map("unlabelled", None)));
        assert_eq!(names(&index, "blue"), ["a", "b"]);

        // A new version of a filed object replaces it, under the same key.
        index.update(Some(&a), Arc::new(a.clone()));
        assert_eq!(names(&index, "blue"), ["a", "b"]);

        let moved = config_map("a", Some("red"));
        index.update(Some(&a), Arc::new(moved.clone()));
        assert_eq!(names(&index, "blue"), ["b"]);
        assert_eq!(names(&index, "red"), ["a"]);

        index.update(Some(&moved), Arc::new(config_map("a", None)));
        assert!(names(&index, "red").is_empty());
        assert!(
            index.read().get("red").is_none(),
            "empty groups are dropped"
        );

        index.remove(&config_map("b", Some("blue")));
        assert!(names(&index, "blue").is_empty());
        assert!(index.read().is_empty());
    }

    #[test]
    fn a_rebuild_replaces_everything() {
        let index = Index::new("team", by_team as KeyFn<ConfigMap>);
        index.update(None, Arc::new(config_map("gone", Some("blue"))));
        index.rebuild([
            Arc::new(config_map("a", Some("blue"))),
            Arc::new(config_map("b", Some("red"))),
        ]);
        assert_eq!(names(&index, "blue"), ["a"]);
        assert_eq!(names(&index, "red"), ["b"]);
        assert_eq!(index.name(), "team");
    }
}
