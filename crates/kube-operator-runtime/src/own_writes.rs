//! What a controller wrote and has not yet seen, in one store per controller: the
//! "expectations" of kube-controller-manager's controllers, shared by the controller's
//! children's writers, its [`StatusWriter`](crate::StatusWriter) and its Event recorder.
//!
//! It holds four kinds of memory, each in a table of its own:
//! - the last write to each child (`ChildWrites`): a create or apply with the uid, generation
//!   and resourceVersion the API server answered it with, or a deletion with the uid it deleted.
//!   It answers whether a watch event only shows that write (then it triggers nothing: the
//!   reconcile that wrote has accounted for it), and whether the child, as the cache shows it,
//!   is as last written, still behind that write, or changed by somebody else since (a
//!   reconcile writes only in the last case);
//! - the last status written to each custom resource, until its cache shows it;
//! - each Event sent, for a repeat to count up its series;
//! - by the uid of each custom resource, the writes for it that no cache has shown yet: to the
//!   object itself (its status, its finalizers) and to its children. The driver asks
//!   [`OwnWrites::behind`] before each reconcile, so that none starts from a cache older than
//!   the controller's own last write (see [`crate::driver`]).
//!
//! The memory is per process: a restarted manager writes once per child, which changes nothing
//! on the server. One pruning rule keeps it bounded: once the store has doubled since it was
//! last pruned, every entry that can no longer change what the controller does is dropped (a
//! child's write the cache has shown, once the cache no longer shows the child; a status or an
//! Event past the time it is kept for), and of the Events, at most [`MAX_EVENT_SERIES`] stay,
//! the most recently repeated. A burst of writes costs a constant per write.

use std::any::{Any, TypeId};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use kube::Resource;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

/// How long a create of ours may go unseen by the cache before it counts as lost (the object
/// deleted before the watch ever showed it) and is made again.
pub const UNSEEN_FOR: Duration = Duration::from_secs(30);

/// Entries remembered before the store is first pruned.
const PRUNE_AFTER: usize = 1024;

/// The most Event series remembered, however many objects the controller has: client-go's
/// recorder keeps an LRU cache of 4096. Past it, the less recently repeated half is forgotten
/// (their repeats become new Events).
pub const MAX_EVENT_SERIES: usize = 4096;

/// What the controller wrote and has not yet seen: one store per controller, shared by its
/// children's writers, its status writer and its Event recorder (see the [module](self)).
/// Cloning it shares the store.
#[derive(Clone, Default)]
pub struct OwnWrites {
    memory: Arc<Mutex<Memory>>,
}

impl std::fmt::Debug for OwnWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnWrites")
            .field("entries", &self.lock().len())
            .finish()
    }
}

/// The four kinds of memory, each in a table of its own so that each entry costs only what
/// its kind needs: an Event series is a number and a time, not an object's name and a write.
#[derive(Default)]
struct Memory {
    /// The last write to each child.
    children: HashMap<ObjectKey, LastWrite>,
    /// The last status written to each custom resource, until its cache shows it.
    statuses: HashMap<ObjectKey, Kept>,
    /// Each Event series sent, by what makes two Events the same.
    series: HashMap<u64, Kept>,
    /// By the uid of a custom resource, the writes for it its caches have not shown yet.
    pending: HashMap<String, Pending>,
    /// For each kind of child, what its cache shows of an object.
    caches: HashMap<TypeId, CacheLookup>,
    prune_at: usize,
}

type CacheLookup = Box<dyn Fn(&ObjectKey) -> Option<Shown> + Send>;

/// What a cache shows of an object: its resourceVersion and generation.
struct Shown {
    version: Option<String>,
    generation: Option<i64>,
}

/// What is kept until a time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Subject {
    /// A custom resource's status written.
    Object(ObjectKey),
    /// A series of Events, by what makes two Events the same.
    EventSeries(u64),
}

impl Subject {
    /// The object `key` of type `K`.
    pub(crate) fn object<K: Resource<DynamicType = ()> + 'static>(key: &ObjectRef<K>) -> Self {
        Self::Object(ObjectKey::of(key))
    }
}

/// An object of the Rust type with this `TypeId` (a child's cached view, or a custom
/// resource), by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ObjectKey {
    kind: TypeId,
    namespace: Option<Box<str>>,
    name: Box<str>,
}

impl ObjectKey {
    /// The object `key` of type `K`.
    pub(crate) fn of<K: Resource<DynamicType = ()> + 'static>(key: &ObjectRef<K>) -> Self {
        Self {
            kind: TypeId::of::<K>(),
            namespace: key.namespace.as_deref().map(Box::from),
            name: Box::from(key.name.as_str()),
        }
    }
}

/// The writes for one custom resource that its caches have not shown yet.
#[derive(Debug, Default)]
struct Pending {
    /// The object's resourceVersions older than our last write to it (what each write of ours
    /// found, and what each but the last was answered with): while its cache shows one of
    /// them, it is behind.
    passed: Vec<String>,
    /// What our last write to the object was answered with.
    answered: Option<String>,
    /// Its children written since, whose write their cache has not shown.
    children: HashSet<ObjectKey>,
    /// The last write.
    at: Option<Instant>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.passed.is_empty() && self.children.is_empty()
    }
}

/// Something kept until a time: a status written, an Event's series.
struct Kept {
    value: Box<dyn Any + Send>,
    until: Instant,
}

impl OwnWrites {
    fn lock(&self) -> MutexGuard<'_, Memory> {
        // A poisoned lock only means another reconcile panicked mid-insert; the map is valid.
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The part of the store that remembers writes to the children in `cache`.
    pub(crate) fn children<V: Resource<DynamicType = ()> + Clone + Send + Sync + 'static>(
        &self,
        cache: Store<V>,
    ) -> ChildWrites<V> {
        let lookup = cache.clone();
        let shows = move |object: &ObjectKey| {
            let key = ObjectRef::<V>::new(&object.name);
            let key = match &object.namespace {
                Some(namespace) => key.within(namespace),
                None => key,
            };
            lookup.get(&key).map(|cached| Shown {
                version: cached.meta().resource_version.clone(),
                generation: cached.meta().generation,
            })
        };
        self.lock()
            .caches
            .insert(TypeId::of::<V>(), Box::new(shows));
        ChildWrites {
            memory: self.clone(),
            kind: std::marker::PhantomData,
        }
    }

    /// Keeps `value` about `subject` until `until`, in place of what was kept about it.
    pub(crate) fn keep<T: Any + Send>(&self, subject: Subject, value: T, until: Instant) {
        let kept = Kept {
            value: Box::new(value),
            until,
        };
        let mut memory = self.lock();
        match subject {
            Subject::Object(object) => memory.statuses.insert(object, kept),
            Subject::EventSeries(series) => memory.series.insert(series, kept),
        };
        memory.pruned_if_grown();
    }

    /// Calls `f` with what is kept about `subject` (a `T`) and until when, if it still is.
    pub(crate) fn recall<T: Any + Send, R>(
        &self,
        subject: &Subject,
        f: impl FnOnce(&mut T, &mut Instant) -> R,
    ) -> Option<R> {
        let mut memory = self.lock();
        let kept = match subject {
            Subject::Object(object) => memory.statuses.get_mut(object),
            Subject::EventSeries(series) => memory.series.get_mut(series),
        };
        match kept {
            Some(Kept { value, until }) if *until > Instant::now() => {
                value.downcast_mut::<T>().map(|value| f(value, until))
            }
            _ => None,
        }
    }

    /// Forgets what was kept about `subject`.
    pub(crate) fn forget(&self, subject: &Subject) {
        let mut memory = self.lock();
        match subject {
            Subject::Object(object) => memory.statuses.remove(object),
            Subject::EventSeries(series) => memory.series.remove(series),
        };
    }

    /// Notes that the object with `uid` was written (its status, its metadata) over the
    /// resourceVersion `before`, and the write answered with `answered`: while its cache
    /// shows `before`, or what an earlier write of ours was answered with, it is behind.
    pub(crate) fn wrote_object(&self, uid: &str, before: Option<String>, answered: Option<String>) {
        if before.is_none() || before == answered {
            // Nothing changed on the server: there is nothing for the cache to show.
            return;
        }
        let mut memory = self.lock();
        let pending = memory.pending.entry(uid.to_owned()).or_default();
        let older = [before, std::mem::replace(&mut pending.answered, answered)];
        for version in older.into_iter().flatten() {
            if !pending.passed.contains(&version) {
                pending.passed.push(version);
            }
        }
        pending.at = Some(Instant::now());
    }

    /// Whether the caches are behind a write of ours for the object with `uid`, which its
    /// cache shows at resourceVersion `version`: to the object itself, or to one of its
    /// children, made less than [`UNSEEN_FOR`] ago.
    pub fn behind(&self, uid: &str, version: Option<&str>) -> bool {
        let mut memory = self.lock();
        memory.look_at_children(uid);
        let Some(pending) = memory.pending.get_mut(uid) else {
            return false;
        };
        if !version.is_some_and(|version| pending.passed.iter().any(|v| v == version)) {
            // The cache shows a newer version: ours, or one made after it.
            pending.passed.clear();
            pending.answered = None;
        }
        let lost = pending.at.is_none_or(|at| at.elapsed() >= UNSEEN_FOR);
        if lost || pending.is_empty() {
            memory.pending.remove(uid);
            return false;
        }
        true
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Memory {
    /// Entries of every kind.
    fn len(&self) -> usize {
        self.children.len() + self.statuses.len() + self.series.len()
    }

    fn pruned_if_grown(&mut self) {
        if self.len() >= self.prune_at.max(PRUNE_AFTER) {
            self.prune();
        }
    }

    fn insert_child(&mut self, child: ObjectKey, write: LastWrite) {
        let replaced = self.children.insert(child.clone(), write);
        self.settled(&child, replaced);
        self.pruned_if_grown();
    }

    fn remove_child(&mut self, child: &ObjectKey) {
        let removed = self.children.remove(child);
        self.settled(child, removed);
    }

    /// `write`, the last write to `child`, is no longer remembered: if it was still on its
    /// way, it no longer keeps its owner waiting.
    fn settled(&mut self, child: &ObjectKey, write: Option<LastWrite>) {
        if let Some(LastWrite::Written(Written {
            owner: Some(owner), ..
        })) = write
        {
            self.child_shown(&owner, child);
        }
    }

    /// Notes the writes of the children of the owner with uid `owner` that their caches show,
    /// though their watch did not say so (a list after a broken watch shows the latest
    /// version only): the version written, or for a kind that counts its spec changes, the
    /// generation written or a later one.
    fn look_at_children(&mut self, owner: &str) {
        let Some(pending) = self.pending.get(owner) else {
            return;
        };
        let shown: Vec<ObjectKey> = (pending.children.iter())
            .filter(|child| {
                let Some(LastWrite::Written(written)) = self.children.get(child) else {
                    return false;
                };
                let Some(cached) = self.caches.get(&child.kind).and_then(|f| f(child)) else {
                    return false;
                };
                let ours = cached.version.is_some() && cached.version == written.resource_version;
                ours || (written.generation.is_some() && cached.generation >= written.generation)
            })
            .cloned()
            .collect();
        for child in shown {
            if let Some(LastWrite::Written(written)) = self.children.get_mut(&child) {
                written.seen = true;
                written.owner = None;
            }
            self.child_shown(owner, &child);
        }
    }

    /// The write of `child` for the owner with uid `owner` is no longer on its way.
    fn child_shown(&mut self, owner: &str, child: &ObjectKey) {
        if let Some(pending) = self.pending.get_mut(owner) {
            pending.children.remove(child);
            if pending.is_empty() {
                self.pending.remove(owner);
            }
        }
    }

    /// Notes that the write of `child` for the owner with uid `owner` is on its way to the
    /// cache.
    fn child_on_its_way(&mut self, owner: &str, child: ObjectKey) {
        let pending = self.pending.entry(owner.to_owned()).or_default();
        pending.children.insert(child);
        pending.at = Some(Instant::now());
    }

    /// The store's one pruning rule (see the [module](self)).
    fn prune(&mut self) {
        let now = Instant::now();
        let caches = &self.caches;
        self.children.retain(|child, last| {
            let cached = || caches.get(&child.kind).and_then(|f| f(child)).is_some();
            matches!(last, LastWrite::Written(w) if !w.seen) || cached()
        });
        self.statuses.retain(|_, kept| kept.until > now);
        self.series.retain(|_, kept| kept.until > now);
        if self.series.len() > MAX_EVENT_SERIES {
            let mut untils: Vec<Instant> = self.series.values().map(|kept| kept.until).collect();
            let middle = untils.len() / 2;
            let (_, median, _) = untils.select_nth_unstable(middle);
            let median = *median;
            self.series.retain(|_, kept| kept.until > median);
        }
        (self.pending).retain(|_, pending| pending.at.is_some_and(|at| at.elapsed() < UNSEEN_FOR));
        self.prune_at = 2 * self.len();
    }
}

/// The last writes to the children in one cache of `V`s: a part of the controller's
/// [`OwnWrites`], shared by its writer and the trigger of the children's watch.
pub(crate) struct ChildWrites<V: Resource<DynamicType = ()> + 'static> {
    memory: OwnWrites,
    kind: std::marker::PhantomData<fn() -> V>,
}

impl<V: Resource<DynamicType = ()> + 'static> Clone for ChildWrites<V> {
    fn clone(&self) -> Self {
        Self {
            memory: self.memory.clone(),
            kind: std::marker::PhantomData,
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
    /// The uid of the owner whose next reconcile waits for the cache to show this write.
    owner: Option<String>,
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

impl<V: Resource<DynamicType = ()> + Clone + 'static> ChildWrites<V> {
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
        let child = ObjectKey::of(key);
        let mut memory = self.memory.lock();
        let Some(LastWrite::Written(last)) = memory.children.get_mut(&child) else {
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
            memory.remove_child(&child);
            return Judged::Stale;
        }
        let our_version =
            meta.resource_version.is_some() && meta.resource_version == last.resource_version;
        let mut shown_to = None;
        if our_version || (last.generation.is_some() && meta.generation >= last.generation) {
            last.seen = true;
            shown_to = last.owner.take();
        }
        let judged = Self::judge_shown(last, cached, desired_hash, our_version, holds);
        if let Some(owner) = shown_to {
            memory.child_shown(&owner, &child);
        }
        judged
    }

    /// [`ChildWrites::judge`] of `last`, a write to the object the cache shows as `cached`.
    fn judge_shown(
        last: &mut Written,
        cached: &V,
        desired_hash: u64,
        our_version: bool,
        holds: impl FnOnce(&V) -> bool,
    ) -> Judged {
        let meta = cached.meta();
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
    /// metadata it left. `seen` when it went to an object the cache showed. `on_its_way_for`:
    /// the uid of the owner whose next reconcile is to wait for the cache to show the write,
    /// when it changed the object.
    pub(crate) fn remember(
        &self,
        key: ObjectRef<V>,
        desired_hash: u64,
        answer: &ObjectMeta,
        seen: bool,
        on_its_way_for: Option<&str>,
    ) {
        let write = Written {
            desired_hash,
            uid: answer.uid.clone(),
            generation: answer.generation,
            resource_version: answer.resource_version.clone(),
            at: Instant::now(),
            seen,
            owner: on_its_way_for.map(str::to_owned),
        };
        let child = ObjectKey::of(&key);
        let mut memory = self.memory.lock();
        memory.insert_child(child.clone(), LastWrite::Written(write));
        if let Some(owner) = on_its_way_for {
            memory.child_on_its_way(owner, child);
        }
    }

    /// Notes that we deleted the child `key`, which had `uid`.
    pub(crate) fn remember_removal(&self, key: ObjectRef<V>, uid: String) {
        self.note(key, LastWrite::Removed { uid });
    }

    /// Notes that the name `key` is held by an object that is not ours; returns whether that
    /// is news (the last write to it was not already this), for the report to be made once.
    pub(crate) fn foreign(&self, key: ObjectRef<V>) -> bool {
        let child = ObjectKey::of(&key);
        let mut memory = self.memory.lock();
        let news = !matches!(memory.children.get(&child), Some(LastWrite::Foreign));
        memory.insert_child(child, LastWrite::Foreign);
        news
    }

    /// Forgets the last write to `key`: what comes next is written afresh.
    pub(crate) fn forget(&self, key: &ObjectRef<V>) {
        self.memory.lock().remove_child(&ObjectKey::of(key));
    }

    fn note(&self, key: ObjectRef<V>, write: LastWrite) {
        self.memory.lock().insert_child(ObjectKey::of(&key), write);
    }

    /// Whether `obj`, as its watch shows it, is exactly what our last write to it left (the
    /// resourceVersion the API server answered with), or the object we last deleted; if the
    /// former, notes that the cache has shown it.
    pub(crate) fn shows_own_write(&self, obj: &V) -> bool {
        let meta = obj.meta();
        let Some(version) = meta.resource_version.as_deref() else {
            return false;
        };
        let child = ObjectKey::of(&crate::object_key(obj));
        let mut memory = self.memory.lock();
        let Some(last) = memory.children.get_mut(&child) else {
            return false;
        };
        let (own, shown_to) = match last {
            LastWrite::Removed { uid } => (Some(uid.as_str()) == meta.uid.as_deref(), None),
            // The name was not ours: whatever happens to it now is news.
            LastWrite::Foreign => (false, None),
            LastWrite::Written(last) if last.resource_version.as_deref() == Some(version) => {
                last.seen = true;
                (true, last.owner.take())
            }
            LastWrite::Written(_) => (false, None),
        };
        if let Some(owner) = shown_to {
            memory.child_shown(&owner, &child);
        }
        own
    }

    /// [`ChildWrites::shows_own_write`], for the trigger of the children's watch to skip.
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

    fn store_cache() -> Store<Child> {
        let mut cache = Writer::<Child>::default();
        cache.apply_watcher_event(&Event::InitDone);
        cache.as_reader()
    }

    fn store() -> ChildWrites<Child> {
        OwnWrites::default().children(store_cache())
    }

    fn entries(writes: &ChildWrites<Child>) -> Vec<(ObjectKey, LastWrite)> {
        let memory = writes.memory.lock();
        (memory.children.iter())
            .map(|(child, last)| (child.clone(), last.clone()))
            .collect()
    }

    fn key() -> ObjectRef<Child> {
        ObjectRef::new("d").within("ns")
    }

    #[test]
    fn a_create_is_on_its_way_until_the_cache_shows_it_then_current() {
        let writes = store();
        writes.remember(key(), 1, &meta("u1", 1, "5"), false, None);
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
        writes.remember(key(), 1, &meta("u1", 3, "9"), true, None);
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
        writes.remember(key(), 1, &meta("u1", 3, "9"), true, None);
        let other = MetaView::new(meta("u2", 1, "20"));
        assert_eq!(
            writes.judge(&key(), Some(&other), 1, |_| true),
            Judged::Stale
        );
        assert!(writes.memory.is_empty());
    }

    #[test]
    fn only_the_version_a_write_was_answered_with_is_its_own() {
        let writes = store();
        writes.remember(key(), 1, &meta("u1", 1, "5"), false, None);
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
        let seen = |(_, w): &(ObjectKey, LastWrite)| matches!(w, LastWrite::Written(w) if w.seen);
        assert!(entries(&writes).iter().all(seen), "the cache has shown it");
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
        writes.remember(key(), 1, &meta("u1", 1, "5"), false, None);
        assert!(
            writes.foreign(key()),
            "ours for a while, then somebody else's again"
        );
    }

    #[test]
    fn one_pruning_rule_for_children_statuses_and_events() {
        let mut cache = Writer::<Child>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let shown = MetaView::new(meta("u1", 1, "5"));
        cache.apply_watcher_event(&Event::Apply(shown));
        let own_writes = OwnWrites::default();
        let children = own_writes.children(cache.as_reader());
        children.remember(key(), 1, &meta("u1", 1, "5"), true, None);
        let gone = ObjectRef::new("gone").within("ns");
        children.remember(gone, 1, &meta("u2", 1, "6"), true, None);
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let status = |name: &str| Subject::object(&ObjectRef::<Deployment>::new(name).within("ns"));
        own_writes.keep(status("written"), "status", later);
        own_writes.keep(status("expired"), "status", now);
        own_writes.keep(Subject::EventSeries(1), 1_u32, later);
        own_writes.keep(Subject::EventSeries(2), 2_u32, now);
        own_writes.lock().prune();
        let memory = own_writes.lock();
        let kept = (
            memory.children.keys().cloned().collect::<Vec<_>>(),
            memory.statuses.keys().cloned().collect::<Vec<_>>(),
            memory.series.keys().copied().collect::<Vec<_>>(),
        );
        drop(memory);
        let expected = (
            vec![ObjectKey::of(&key())],
            vec![ObjectKey::of(
                &ObjectRef::<Deployment>::new("written").within("ns"),
            )],
            vec![1],
        );
        assert_eq!(kept, expected, "what can still change what is done next");
        let recalled = own_writes.recall(&status("written"), |s: &mut &str, _| *s);
        assert_eq!(recalled, Some("status"));
        let wrong_type = own_writes.recall(&status("written"), |n: &mut u32, _| *n);
        assert_eq!(wrong_type, None);
    }

    #[test]
    fn an_object_is_behind_until_its_cache_shows_the_last_write_for_it() {
        let own_writes = OwnWrites::default();
        assert!(!own_writes.behind("u", Some("1")), "nothing written");
        own_writes.wrote_object("u", Some("1".into()), Some("1".into()));
        assert!(
            !own_writes.behind("u", Some("1")),
            "a write that changed nothing"
        );
        // A finalizer added over version 1, then a status written over what the reconcile
        // read: version 1 still.
        own_writes.wrote_object("u", Some("1".into()), Some("2".into()));
        own_writes.wrote_object("u", Some("1".into()), Some("3".into()));
        assert!(own_writes.behind("u", Some("1")));
        assert!(own_writes.behind("u", Some("2")), "the first write only");
        assert!(!own_writes.behind("u", Some("3")));
        assert!(
            !own_writes.behind("u", Some("1")),
            "forgotten once caught up"
        );
    }

    #[test]
    fn an_owner_is_behind_until_the_cache_shows_its_children_written() {
        let own_writes = OwnWrites::default();
        let children = own_writes.children(store_cache());
        children.remember(key(), 1, &meta("c1", 1, "5"), false, Some("owner"));
        let other = ObjectRef::new("e").within("ns");
        let mut other_meta = meta("c2", 1, "6");
        other_meta.name = Some("e".into());
        children.remember(other.clone(), 1, &other_meta, true, Some("owner"));
        assert!(own_writes.behind("owner", Some("9")));
        assert!(children.shows_own_write(&MetaView::new(meta("c1", 1, "5"))));
        assert!(
            own_writes.behind("owner", Some("9")),
            "one child still on its way"
        );
        // Written again, unchanged: the earlier write no longer keeps the owner waiting.
        children.remember(other, 1, &other_meta, true, None);
        assert!(!own_writes.behind("owner", Some("9")));
    }

    #[test]
    fn a_child_the_cache_shows_at_a_later_generation_no_longer_holds_its_owner() {
        let mut cache = Writer::<Child>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let own_writes = OwnWrites::default();
        let children = own_writes.children(cache.as_reader());
        children.remember(key(), 1, &meta("c1", 2, "5"), true, Some("owner"));
        assert!(own_writes.behind("owner", None));
        // A list after a broken watch: the write's own event never came.
        cache.apply_watcher_event(&Event::Apply(MetaView::new(meta("c1", 2, "8"))));
        assert!(!own_writes.behind("owner", None));
    }

    #[test]
    fn entries_of_children_gone_from_the_cache_are_pruned() {
        let writes = store();
        for i in 0..PRUNE_AFTER {
            let key = ObjectRef::new(&format!("d{i}")).within("ns");
            writes.remember(key, 1, &meta("u", 1, "1"), true, None);
        }
        let on_its_way = ObjectRef::new("new").within("ns");
        writes.remember(on_its_way.clone(), 1, &meta("u", 1, "1"), false, None);
        let left = entries(&writes);
        assert_eq!(left.len(), 1, "only the write still on its way");
        assert_eq!(left[0].0, ObjectKey::of(&on_its_way));
    }
}
