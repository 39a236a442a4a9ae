//! What a controller last wrote to each child of one kind, until its cache shows it: the
//! "expectations" of kube-controller-manager's controllers, in one store per kind of child.
//!
//! Each entry is the last write to one child: a create or apply with the uid, generation and
//! resourceVersion the API server answered it with, or a deletion with the uid it deleted. It
//! answers two questions:
//! - does a watch event only show that write? Then it triggers nothing: the reconcile that
//!   wrote has accounted for it;
//! - is the child, as the cache shows it, as last written, still behind that write, or changed
//!   by somebody else since? A reconcile writes only in the last case.
//!
//! The memory is per process: a restarted manager writes once per child, which changes nothing
//! on the server. One pruning rule keeps it within a constant of the cache: once it holds more
//! than twice the cache, the entries of children the cache no longer shows are dropped, except
//! writes still on their way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use kube::Resource;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

/// How long a create of ours may go unseen by the cache before it counts as lost (the object
/// deleted before the watch ever showed it) and is made again.
pub const UNSEEN_FOR: Duration = Duration::from_secs(30);

/// Entries beyond twice the cache before the store is pruned.
const PRUNE_SLACK: usize = 1024;

/// The last writes to the children in one cache of `V`s, shared by the controller's writer and
/// the trigger of the children's watch.
pub(crate) struct OwnWrites<V: Resource<DynamicType = ()> + 'static> {
    cache: Store<V>,
    writes: Arc<Mutex<HashMap<ObjectRef<V>, LastWrite>>>,
}

impl<V: Resource<DynamicType = ()> + 'static> Clone for OwnWrites<V> {
    fn clone(&self) -> Self {
        Self {
            cache: self.cache.clone(),
            writes: self.writes.clone(),
        }
    }
}

/// What we last did to one child.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LastWrite {
    /// A create or apply, and what the API server answered it with.
    Written(Written),
    /// A deletion of the child with this uid: every later event of that object (its
    /// deletion, a finalizer's last steps) is the echo of our own write.
    Removed { uid: String },
    /// Nothing: the name is held by an object that is not ours, and that was reported.
    Foreign,
}

/// A create or apply of one child, as the API server answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Written {
    /// The hash of the desired object written.
    desired_hash: u64,
    uid: Option<String>,
    /// The `metadata.generation` the write was answered with, for kinds that count spec
    /// changes in it (a Deployment or a PodDisruptionBudget does, a Service does not).
    generation: Option<i64>,
    resource_version: Option<String>,
    /// When the write was answered.
    pub(crate) at: Instant,
    /// The cache has shown the write since, or the write was an apply to an object the cache
    /// showed: its absence now means it was deleted.
    seen: bool,
}

impl Written {
    /// Whether `cached` is the object this write went to, not one made again under its name.
    fn same_object(&self, cached: &ObjectMeta) -> bool {
        self.uid.is_none() || cached.uid.is_none() || self.uid == cached.uid
    }

    /// Whether the cache, showing `cached`, is still behind this write: nothing yet after a
    /// create, or an older generation of the same object.
    fn ahead_of(&self, cached: Option<&ObjectMeta>) -> bool {
        match cached {
            None => !self.seen && self.at.elapsed() < UNSEEN_FOR,
            Some(cached) => {
                self.same_object(cached)
                    && self.generation.is_some()
                    && cached.generation < self.generation
            }
        }
    }
}

/// What the cache shows of a child, against the last write to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Judged {
    /// The cache shows the last write, and it was of the same desired object.
    Current(Written),
    /// The last write was of the same desired object, and the cache is still behind it.
    OnItsWay,
    /// Nothing written yet, something else desired, or changed by somebody else since: write.
    Stale,
}

impl<V: Resource<DynamicType = ()> + Clone + 'static> OwnWrites<V> {
    /// An empty store for the children in `cache`.
    pub(crate) fn new(cache: Store<V>) -> Self {
        Self {
            cache,
            writes: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ObjectRef<V>, LastWrite>> {
        // A poisoned lock only means another reconcile panicked mid-insert; the map is valid.
        self.writes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the child `key`, which the cache shows as `cached`, stands against our last write
    /// to it, when `desired_hash` is what the controller wants now. Notes when the cache has
    /// shown the write.
    ///
    /// A newer version than our write is current too when its generation is still the one our
    /// write left and `holds` says it keeps what we set that the cache can show (the metadata):
    /// the API server's own controllers write to our children (the Deployment controller the
    /// status of every Deployment, the disruption controller every PodDisruptionBudget's), and
    /// writing again for that would be a request per child for nothing. An edit of the spec
    /// (which bumps the generation) or of our labels is not. A kind without a generation (a
    /// Service) is written again after any write but ours.
    pub(crate) fn judge(
        &self,
        key: &ObjectRef<V>,
        cached: Option<&V>,
        desired_hash: u64,
        holds: impl FnOnce(&V) -> bool,
    ) -> Judged {
        let mut writes = self.lock();
        let Some(LastWrite::Written(last)) = writes.get_mut(key) else {
            return Judged::Stale;
        };
        let Some(cached) = cached else {
            return if last.desired_hash == desired_hash && last.ahead_of(None) {
                Judged::OnItsWay
            } else {
                Judged::Stale
            };
        };
        let meta = cached.meta();
        if !last.same_object(meta) {
            // Deleted and made again by somebody else since: what we wrote is history.
            writes.remove(key);
            return Judged::Stale;
        }
        let our_version =
            meta.resource_version.is_some() && meta.resource_version == last.resource_version;
        if our_version || (last.generation.is_some() && meta.generation >= last.generation) {
            last.seen = true;
        }
        if last.desired_hash != desired_hash {
            return Judged::Stale;
        }
        if last.ahead_of(Some(meta)) {
            return Judged::OnItsWay;
        }
        if our_version {
            return Judged::Current(last.clone());
        }
        if last.generation.is_some() && meta.generation == last.generation && holds(cached) {
            last.resource_version.clone_from(&meta.resource_version);
            return Judged::Current(last.clone());
        }
        Judged::Stale
    }

    /// Notes what a create or apply of `desired_hash` was answered with: `answer`, the
    /// metadata it left. `seen` when it went to an object the cache showed.
    pub(crate) fn remember(
        &self,
        key: ObjectRef<V>,
        desired_hash: u64,
        answer: &ObjectMeta,
        seen: bool,
    ) {
        let write = Written {
            desired_hash,
            uid: answer.uid.clone(),
            generation: answer.generation,
            resource_version: answer.resource_version.clone(),
            at: Instant::now(),
            seen,
        };
        self.note(key, LastWrite::Written(write));
    }

    /// Notes that we deleted the child `key`, which had `uid`.
    pub(crate) fn remember_removal(&self, key: ObjectRef<V>, uid: String) {
        self.note(key, LastWrite::Removed { uid });
    }

    /// Notes that the name `key` is held by an object that is not ours; returns whether that
    /// is news (the last write to it was not already this), for the report to be made once.
    pub(crate) fn foreign(&self, key: ObjectRef<V>) -> bool {
        let mut writes = self.lock();
        writes.insert(key, LastWrite::Foreign) != Some(LastWrite::Foreign)
    }

    /// Forgets the last write to `key`: what comes next is written afresh.
    pub(crate) fn forget(&self, key: &ObjectRef<V>) {
        self.lock().remove(key);
    }

    fn note(&self, key: ObjectRef<V>, write: LastWrite) {
        let mut writes = self.lock();
        writes.insert(key, write);
        // Owners deleted with their children leave entries nobody asks for again, and so do
        // removals once the cache no longer shows what was removed. Dropping them once the
        // store is twice the cache costs a constant per write.
        if writes.len() > 2 * self.cache.len() + PRUNE_SLACK {
            writes.retain(|key, last| {
                matches!(last, LastWrite::Written(w) if !w.seen) || self.cache.get(key).is_some()
            });
        }
    }

    /// Whether `obj`, as its watch shows it, is exactly what our last write to it left (the
    /// resourceVersion the API server answered with), or the object we last deleted; if the
    /// former, notes that the cache has shown it.
    pub(crate) fn shows_own_write(&self, obj: &V) -> bool {
        let meta = obj.meta();
        let Some(version) = meta.resource_version.as_deref() else {
            return false;
        };
        let mut writes = self.lock();
        match writes.get_mut(&crate::object_key(obj)) {
            Some(LastWrite::Removed { uid }) => Some(uid.as_str()) == meta.uid.as_deref(),
            // The name was not ours: whatever happens to it now is news.
            Some(LastWrite::Foreign) => false,
            Some(LastWrite::Written(last)) if last.resource_version.as_deref() == Some(version) => {
                last.seen = true;
                true
            }
            _ => false,
        }
    }

    /// [`OwnWrites::shows_own_write`], for the trigger of the children's watch to skip.
    pub(crate) fn filter(&self) -> impl Fn(&V) -> bool + Send + 'static
    where
        V: Send + Sync,
    {
        let writes = self.clone();
        move |obj: &V| writes.shows_own_write(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta_view::MetaView;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    type Child = MetaView<Deployment>;

    fn meta(uid: &str, generation: i64, version: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some("d".into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            generation: Some(generation),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        }
    }

    fn store() -> OwnWrites<Child> {
        let mut cache = Writer::<Child>::default();
        cache.apply_watcher_event(&Event::InitDone);
        OwnWrites::new(cache.as_reader())
    }

    fn key() -> ObjectRef<Child> {
        ObjectRef::new("d").within("ns")
    }

    #[test]
    fn a_create_is_on_its_way_until_the_cache_shows_it_then_current() {
        let writes = store();
        writes.remember(key(), 1, &meta("u1", 1, "5"), false);
        let judge = |cached: Option<&Child>, hash| writes.judge(&key(), cached, hash, |_| true);
        assert_eq!(judge(None, 1), Judged::OnItsWay, "not yet in the cache");
        assert_eq!(
            judge(None, 2),
            Judged::Stale,
            "something else is wanted now"
        );
        let shown = MetaView::new(meta("u1", 1, "5"));
        assert!(matches!(judge(Some(&shown), 1), Judged::Current(_)));
        assert_eq!(
            judge(None, 1),
            Judged::Stale,
            "seen, then gone: it was deleted"
        );
    }

    #[test]
    fn an_older_generation_is_behind_and_a_newer_one_is_a_change() {
        let writes = store();
        writes.remember(key(), 1, &meta("u1", 3, "9"), true);
        let judge = |m: ObjectMeta| writes.judge(&key(), Some(&MetaView::new(m)), 1, |_| true);
        assert_eq!(judge(meta("u1", 2, "8")), Judged::OnItsWay);
        assert!(
            matches!(judge(meta("u1", 3, "10")), Judged::Current(_)),
            "a status write by somebody else"
        );
        assert_eq!(judge(meta("u1", 4, "11")), Judged::Stale, "a spec edit");
        let later = writes.judge(&key(), Some(&MetaView::new(meta("u1", 3, "12"))), 1, |_| {
            false
        });
        assert_eq!(later, Judged::Stale, "our metadata edited");
    }

    #[test]
    fn another_object_of_that_name_forgets_the_write() {
        let writes = store();
        writes.remember(key(), 1, &meta("u1", 3, "9"), true);
        let other = MetaView::new(meta("u2", 1, "20"));
        assert_eq!(
            writes.judge(&key(), Some(&other), 1, |_| true),
            Judged::Stale
        );
        assert!(writes.lock().is_empty());
    }

    #[test]
    fn only_the_version_a_write_was_answered_with_is_its_own() {
        let writes = store();
        writes.remember(key(), 1, &meta("u1", 1, "5"), false);
        assert!(
            !writes.shows_own_write(&MetaView::new(meta("u1", 1, "6"))),
            "a later change"
        );
        let mut unversioned = meta("u1", 1, "5");
        unversioned.resource_version = None;
        assert!(!writes.shows_own_write(&MetaView::new(unversioned)));
        let mut other = meta("u1", 1, "5");
        other.name = Some("e".into());
        assert!(
            !writes.shows_own_write(&MetaView::new(other)),
            "another child"
        );
        assert!(writes.shows_own_write(&MetaView::new(meta("u1", 1, "5"))));
        let seen = |w: &LastWrite| matches!(w, LastWrite::Written(w) if w.seen);
        assert!(writes.lock().values().all(seen), "the cache has shown it");
    }

    #[test]
    fn every_event_of_an_object_we_deleted_is_our_own() {
        let writes = store();
        writes.remember_removal(key(), "u1".into());
        assert!(writes.shows_own_write(&MetaView::new(meta("u1", 1, "7"))));
        assert!(!writes.shows_own_write(&MetaView::new(meta("u2", 1, "8"))));
        assert_eq!(
            writes.judge(&key(), None, 1, |_| true),
            Judged::Stale,
            "a later create is not held"
        );
    }

    #[test]
    fn a_name_held_by_somebody_else_is_news_once_until_we_write_it() {
        let writes = store();
        assert!(writes.foreign(key()));
        assert!(!writes.foreign(key()), "reported already");
        assert_eq!(writes.judge(&key(), None, 1, |_| true), Judged::Stale);
        writes.remember(key(), 1, &meta("u1", 1, "5"), false);
        assert!(
            writes.foreign(key()),
            "ours for a while, then somebody else's again"
        );
    }

    #[test]
    fn entries_of_children_gone_from_the_cache_are_pruned() {
        let writes = store();
        for i in 0..=PRUNE_SLACK {
            let key = ObjectRef::new(&format!("d{i}")).within("ns");
            writes.remember(key, 1, &meta("u", 1, "1"), true);
        }
        let on_its_way = ObjectRef::new("new").within("ns");
        writes.remember(on_its_way.clone(), 1, &meta("u", 1, "1"), false);
        let left = writes.lock();
        assert_eq!(left.len(), 1, "only the write still on its way");
        assert!(left.contains_key(&on_its_way));
    }
}
