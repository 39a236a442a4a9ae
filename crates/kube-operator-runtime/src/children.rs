//! What a custom resource owns: who controls an object (its controller owner reference), the
//! metadata, create and apply of an owned object, and the children of one kind in
//! [`OwnedChildren`]: created when missing, server-side applied again when somebody else changed
//! them, deleted when no longer wanted, and never taken over from somebody else.
//!
//! The shared cache of the child type (managed objects only) says what exists, and
//! [`crate::own_writes`] what was last written to each child: while the cache shows that write
//! (or a later one that leaves its generation and our metadata alone) and the desired object is
//! the same, nothing is written. A hand edit or a deletion makes it write again, which puts back
//! every field the controller sets.

use std::any::{Any, TypeId};

use futures::future::BoxFuture;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hasher};
use std::marker::PhantomData;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::events::Events;
use crate::meta_view::MetaView;
use crate::own_writes::{ChildWrites, Judged, OwnWrites, Written};
use crate::scope::ScopedApi;
use crate::writes;

/// A kind of object a custom resource can own and write, namespaced (a Service) or cluster-wide
/// (a Namespace): sent and read as JSON.
pub trait ChildObject:
    Resource<DynamicType = (), Scope: ScopedApi> + Clone + DeserializeOwned + Serialize + Debug
{
}

impl<C> ChildObject for C where
    C: Resource<DynamicType = (), Scope: ScopedApi> + Clone + DeserializeOwned + Serialize + Debug
{
}

/// How a cache holds a child of kind `C`, and so how a controller reads it back: its metadata
/// alone ([`MetaView`], the default and the cheapest), the whole object (`C` itself: a
/// StatefulSet whose status the owner reports), or a compact view of the controller's own
/// (as [`crate::deployment_view::DeploymentView`] is of a Deployment). The view must be the same
/// API resource as `C`.
pub trait ChildView<C>:
    Resource<DynamicType = (), Scope: ScopedApi>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// Whether the object carries every label of `labels`, with the same values.
    fn has_labels(&self, labels: &BTreeMap<String, String>) -> bool;

    /// Whether the controller that acts on the object (the Deployment controller for a
    /// Deployment) has seen its current spec. Until it has, for at most [`OBSERVE_GRACE`] after
    /// our write, a child just written reads as [`Child::Written`]: its status still tells of
    /// the spec before. A kind nothing acts on is always observed.
    fn observed(&self) -> bool {
        true
    }

    /// The Normal Events for what writing `desired` over this object changes: a workload's
    /// replica count or images. None by default.
    fn changes(&self, _desired: &C) -> Vec<Change> {
        Vec::new()
    }

    /// The note of the `Created` Event for `desired`.
    fn created_note(desired: &C) -> String
    where
        C: Resource<DynamicType = ()>,
    {
        format!("Created {} {}", C::kind(&()), desired.name_any())
    }
}

/// A Normal Event for what a write changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The Event's reason (`Scaled`).
    pub reason: &'static str,
    /// Its action (`ScaleDeployment`).
    pub action: &'static str,
    /// What changed, for people.
    pub note: String,
}

/// How long the controller of a workload (the Deployment controller) gets to pick up a spec we
/// wrote before the child reads as [`Child::Current`] anyway. On a quiet cluster it takes
/// milliseconds, on a busy one (a thousand owners scaled at once) seconds: an owner that
/// reported the state in between would write a status per change for a state that ends on its
/// own, so only a controller stalled for as long as a rollout's status is ever held
/// ([`crate::status_writer::PROGRESS_MAX_HOLD`]) is reported.
pub const OBSERVE_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

impl<C> ChildView<C> for MetaView<C>
where
    C: Resource<DynamicType = (), Scope: ScopedApi> + Send + Sync + 'static,
{
    fn has_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.contains_all(labels)
    }
}

/// Whether every label of `wanted` is among `labels`.
fn labels_hold(
    labels: Option<&BTreeMap<String, String>>,
    wanted: &BTreeMap<String, String>,
) -> bool {
    wanted
        .iter()
        .all(|(key, value)| labels.and_then(|l| l.get(key)) == Some(value))
}

/// The Kubernetes kinds a controller may cache whole as their own view.
macro_rules! whole_object_views {
    ($($kind:ty),* $(,)?) => {
        $(
            impl ChildView<$kind> for $kind {
                fn has_labels(&self, labels: &BTreeMap<String, String>) -> bool {
                    labels_hold(self.metadata.labels.as_ref(), labels)
                }
            }
        )*
    };
}

/// The workload kinds a controller may cache whole: their controllers act on them (see
/// [`ChildView::observed`]).
macro_rules! whole_workload_views {
    ($($kind:ty),* $(,)?) => {
        $(
            impl ChildView<$kind> for $kind {
                fn has_labels(&self, labels: &BTreeMap<String, String>) -> bool {
                    labels_hold(self.metadata.labels.as_ref(), labels)
                }

                fn observed(&self) -> bool {
                    crate::workload::Workload::observed(self)
                }
            }
        )*
    };
}

whole_workload_views!(
    k8s_openapi::api::apps::v1::Deployment,
    k8s_openapi::api::apps::v1::StatefulSet,
    k8s_openapi::api::apps::v1::DaemonSet,
    k8s_openapi::api::batch::v1::Job,
);

whole_object_views!(
    k8s_openapi::api::core::v1::ConfigMap,
    k8s_openapi::api::core::v1::Secret,
    k8s_openapi::api::core::v1::Service,
    k8s_openapi::api::core::v1::PersistentVolumeClaim,
    k8s_openapi::api::core::v1::Namespace,
);

/// Whether `owner_uid` is `obj`'s controller.
pub fn is_controlled_by(obj: &impl Resource, owner_uid: &str) -> bool {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == owner_uid)
}

/// The controller of `obj` when it is of kind `kind` in `api_version`.
pub fn controller_of<'a>(
    obj: &'a impl Resource,
    api_version: &str,
    kind: &str,
) -> Option<&'a OwnerReference> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == kind && o.api_version == api_version)
}

/// The metadata of an object `owner` controls: the owner's name and namespace, `labels`, and a
/// controller owner reference.
///
/// # Errors
/// [`Error::MissingField`] when `owner` lacks a namespace or uid (it was not read from the API
/// server).
pub fn child_metadata<K: Resource<DynamicType = ()>>(
    owner: &K,
    labels: BTreeMap<String, String>,
) -> Result<ObjectMeta, Error> {
    let namespace = owner.namespace().ok_or(Error::MissingField {
        kind: K::kind(&()),
        field: "metadata.namespace",
    })?;
    owned_metadata(owner, owner.name_any(), Some(namespace), labels)
}

/// The metadata of an object called `name` in `namespace` (`None` for a cluster-scoped kind)
/// that `owner` controls, with `labels`: for an owner whose children live elsewhere than it
/// does, as a cluster-scoped owner's do. Kubernetes lets a namespaced object be owned by a
/// cluster-scoped one, not the reverse, nor across namespaces.
///
/// # Errors
/// [`Error::MissingField`] when `owner` has no uid (it was not read from the API server).
pub fn owned_metadata<K: Resource<DynamicType = ()>>(
    owner: &K,
    name: String,
    namespace: Option<String>,
    labels: BTreeMap<String, String>,
) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name),
        namespace,
        labels: Some(labels),
        owner_references: Some(vec![owner_reference(owner)?]),
        ..ObjectMeta::default()
    })
}

/// The desired object of kind `C`: `metadata` (from [`owned_metadata`]) and the rest written
/// as JSON (`serde_json::json!({"spec": ...})`), which reads shortest for the nested objects of
/// a pod template. A field `C` does not have would be dropped without a word by the parse;
/// it is an error that names it instead.
///
/// # Errors
/// [`Error::InvalidObject`] when `fields` is not an object of kind `C`, or names a field `C`
/// does not have.
pub fn desired<C>(metadata: ObjectMeta, fields: serde_json::Value) -> Result<C, Error>
where
    C: Resource<DynamicType = ()> + DeserializeOwned + Serialize,
{
    let invalid = |reason: String| Error::InvalidObject {
        kind: C::kind(&()).into_owned(),
        reason,
    };
    let serde_json::Value::Object(mut fields) = fields else {
        return Err(invalid(format!("{fields} is not a JSON object")));
    };
    fields.insert("apiVersion".into(), C::api_version(&()).into());
    fields.insert("kind".into(), C::kind(&()).into());
    let written = serde_json::Value::Object(fields);
    let mut object: C =
        serde_json::from_value(written.clone()).map_err(|e| invalid(e.to_string()))?;
    let read = serde_json::to_value(&object).map_err(|e| invalid(e.to_string()))?;
    if let Some(path) = dropped(&written, &read, String::new()) {
        return Err(invalid(format!("it has no field {path}")));
    }
    *object.meta_mut() = metadata;
    Ok(object)
}

/// The first field of `written` (as a JSON path) that `read` lacks; nulls count as absent.
fn dropped(written: &serde_json::Value, read: &serde_json::Value, path: String) -> Option<String> {
    use serde_json::Value;
    match (written, read) {
        (Value::Object(written), Value::Object(read)) => written.iter().find_map(|(key, value)| {
            let path = format!("{path}.{key}");
            match read.get(key) {
                None if !value.is_null() => Some(path),
                None => None,
                Some(read) => dropped(value, read, path),
            }
        }),
        (Value::Array(written), Value::Array(read)) => written
            .iter()
            .zip(read)
            .enumerate()
            .find_map(|(i, (w, r))| dropped(w, r, format!("{path}[{i}]"))),
        _ => None,
    }
}

/// A controller owner reference to `owner` that blocks its foreground deletion until the owned
/// object is gone.
///
/// # Errors
/// [`Error::MissingField`] when `owner` has no name or uid (it was not read from the API server).
pub fn owner_reference<K: Resource<DynamicType = ()>>(owner: &K) -> Result<OwnerReference, Error> {
    let mut reference = owner.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: K::kind(&()),
        field: "metadata.uid",
    })?;
    reference.block_owner_deletion = Some(true);
    Ok(reference)
}

/// Creates `object` in `namespace` (empty for a cluster-scoped kind), recording `field_manager`
/// as the writer of its fields. Unlike an apply, a create fails when the name is taken, so an
/// object that the caches had not seen yet is never taken over. Returns the metadata the object
/// was stored with.
///
/// # Errors
/// [`Error::Kube`] when the API server refuses ([`Error::is_already_exists`] when the name is
/// taken).
pub async fn create_owned<C>(
    client: &kube::Client,
    namespace: &str,
    field_manager: &str,
    object: &C,
) -> Result<ObjectMeta, Error>
where
    C: ChildObject,
{
    let params = PostParams {
        field_manager: Some(field_manager.to_owned()),
        ..PostParams::default()
    };
    writes::create(client, namespace, &params, object).await
}

/// Server-side applies `object` in `namespace` (empty for a cluster-scoped kind) under
/// `field_manager`, forcing conflicts (the controller is the authority on every field it sets;
/// a hand edit of one of them is undone). Returns the metadata the object has after the apply.
///
/// # Errors
/// [`Error::Kube`] when the API server refuses.
pub async fn apply_owned<C>(
    client: &kube::Client,
    namespace: &str,
    field_manager: &str,
    object: &C,
) -> Result<ObjectMeta, Error>
where
    C: ChildObject,
{
    let name = object.name_any();
    let params = PatchParams::apply(field_manager).force();
    writes::patch::<C, _>(
        client,
        namespace,
        &name,
        None,
        &params,
        &Patch::Apply(object),
    )
    .await
}

/// Whether `found` still has every label, annotation and owner reference `desired` sets, with
/// the same values: what of our writes a metadata-only cache can check. Labels and owners that
/// others add do not count. The cache keeps no annotations, so one that `desired` sets is never
/// seen to hold.
fn metadata_holds<C, V: ChildView<C>>(desired: &ObjectMeta, found: &V) -> bool {
    let found_owners = found.meta().owner_references.iter().flatten();
    desired
        .labels
        .as_ref()
        .is_none_or(|labels| found.has_labels(labels))
        && desired.annotations.as_ref().is_none_or(BTreeMap::is_empty)
        && desired
            .owner_references
            .iter()
            .flatten()
            .all(|owner| found_owners.clone().any(|o| o == owner))
}

/// What [`OwnedChildren::ensure`] came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Child {
    /// The cache shows the child as desired.
    Current,
    /// The child was just written as desired and the cache does not show it yet: a rollout
    /// read from the cache now would still be the previous one.
    Written,
    /// An object of that name exists that is not ours (another owner controls it, or somebody
    /// else made it): it was left untouched, and a Warning Event says so.
    Foreign,
    /// The namespace is being deleted: the child goes with it.
    NamespaceTerminating,
}

/// The children of one type that one controller writes, as `field_manager`.
///
/// Whether a child is as we wrote it is told by the version, generation and metadata our write
/// was answered with ([`crate::own_writes`]), never by comparing specs: the cache may keep no
/// more than the metadata.
pub struct OwnedChildren<C: Resource<DynamicType = ()> + 'static, V = MetaView<C>>
where
    V: Resource<DynamicType = ()> + 'static,
{
    client: kube::Client,
    cache: Store<V>,
    /// The objects of kind `C` the cache's selector leaves out (somebody else's, or ours
    /// stripped of our label by hand), by name: a name one of them holds is taken, and is
    /// found so without a request. `None`: found out by a create refused.
    namesakes: Option<Store<MetaView<C>>>,
    field_manager: String,
    /// Shared with the trigger of the children's watch, which skips our own writes.
    written: ChildWrites<V>,
    /// Whether each child is labelled with its owner's slot ([`crate::labels::SHARD_SLOT`]):
    /// in a sharded manager, where each replica watches the children of its slots only.
    slot_labels: bool,
    kind: PhantomData<fn() -> C>,
}

impl<C, V> Debug for OwnedChildren<C, V>
where
    C: Resource<DynamicType = ()> + 'static,
    V: Resource<DynamicType = ()> + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedChildren")
            .field("kind", &C::kind(&()))
            .field("field_manager", &self.field_manager)
            .finish_non_exhaustive()
    }
}

/// What writing one child came to, before any Event is sent for it.
#[derive(Clone, Debug)]
pub(crate) enum Wrote<V> {
    /// The cache shows our last write, of the same desired object, as `cached`; `written` says
    /// when it was made.
    Current { cached: Arc<V>, written: Written },
    /// Our write of the same desired object is on its way to the cache.
    OnItsWay,
    /// Created now.
    Created,
    /// Applied now, to what the cache showed as `before` (`None`: to one it did not show).
    /// `changed` is false when the object was as desired already.
    Applied {
        before: Option<Arc<V>>,
        changed: bool,
    },
    /// The name is held by an object that is not ours: nothing was written.
    Foreign,
    /// The namespace is being deleted: the child goes with it.
    NamespaceTerminating,
}

impl<C, V> OwnedChildren<C, V>
where
    C: ChildObject + Send + Sync + 'static,
    V: ChildView<C>,
{
    /// The children in `cache`, written as `field_manager`: see
    /// [`Builder::owns_kind_as`](crate::builder::Builder::owns_kind_as), remembered in
    /// `own_writes`, the controller's.
    pub(crate) fn new(
        client: kube::Client,
        cache: Store<V>,
        field_manager: String,
        own_writes: &OwnWrites,
    ) -> Self {
        Self {
            client,
            written: own_writes.children(cache.clone()),
            cache,
            namesakes: None,
            field_manager,
            slot_labels: false,
            kind: PhantomData,
        }
    }

    /// The same, labelling each child with its owner's slot when `on` (a sharded manager).
    pub(crate) fn labelling_slots(self, on: bool) -> Self {
        Self {
            slot_labels: on,
            ..self
        }
    }

    /// The same, knowing from `namesakes` which names the objects outside the cache hold.
    pub(crate) fn with_namesakes(self, namesakes: Store<MetaView<C>>) -> Self {
        Self {
            namesakes: Some(namesakes),
            ..self
        }
    }

    /// Whether a child, as its watch shows it, only shows a write of ours: what the trigger of
    /// the children's watch skips.
    pub(crate) fn own_writes(&self) -> impl Fn(&V) -> bool + Send + 'static {
        self.written.filter()
    }

    /// Makes the child `desired` names exist as desired: created when missing, applied again
    /// when changed since our last write. Normal Events go to `regarding`, the owner: `Created`,
    /// and what else the view says a write changed ([`ChildView::changes`]). A name somebody
    /// else holds gets one Warning, `<Kind>NotOwned`, until it is ours again.
    ///
    /// A workload the controller of its kind has not yet seen as written
    /// ([`ChildView::observed`]) reads as [`Child::Written`] for up to [`OBSERVE_GRACE`].
    ///
    /// # Errors
    /// [`Error::Serialize`]; [`Error::Kube`] when the API server refuses.
    pub async fn ensure(
        &self,
        desired: &C,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
        events: &Events,
    ) -> Result<Child, Error> {
        let owner_uid = regarding.uid.as_deref().unwrap_or_default();
        let kind = C::kind(&());
        Ok(match self.write(desired, owner_uid).await? {
            Wrote::Current { cached, written } => {
                let unobserved = !cached.observed() && written.at.elapsed() < OBSERVE_GRACE;
                if unobserved {
                    Child::Written
                } else {
                    Child::Current
                }
            }
            Wrote::Applied { changed: false, .. } => Child::Current,
            Wrote::OnItsWay => Child::Written,
            Wrote::Applied { before, .. } => {
                for change in before.iter().flat_map(|before| before.changes(desired)) {
                    events.normal(regarding, change.reason, change.action, change.note);
                }
                Child::Written
            }
            Wrote::Created => {
                // An action per kind: client-go counts Events of one action, reason and
                // object as repeats of the first, whose note would then be all that shows.
                let note = V::created_note(desired);
                events.normal(regarding, "Created", format!("Create{kind}"), note);
                Child::Written
            }
            Wrote::Foreign => {
                let key = key_of(desired.meta().name.as_deref(), desired.namespace());
                if self.written.foreign(key) {
                    let note = self.foreign_note(desired, regarding.kind.as_deref());
                    tracing::warn!("{note}");
                    events.warning(regarding, format!("{kind}NotOwned"), "Reconcile", note);
                }
                Child::Foreign
            }
            Wrote::NamespaceTerminating => Child::NamespaceTerminating,
        })
    }

    /// [`OwnedChildren::ensure`] without its Events, for the owner of the child with
    /// `owner_uid`: for a writer that says more of what it changed.
    ///
    /// # Errors
    /// As [`OwnedChildren::ensure`].
    pub(crate) async fn write(&self, desired: &C, owner_uid: &str) -> Result<Wrote<V>, Error> {
        let labelled;
        let desired = if self.slot_labels && !owner_uid.is_empty() {
            labelled = with_slot_label(desired, owner_uid)?;
            &labelled
        } else {
            desired
        };
        let key = key_of(desired.meta().name.as_deref(), desired.namespace());
        let desired_hash = hash_of(desired)?;
        let cached = self.cache.get(&key);
        if let Some(cached) = &cached {
            if controlled_by_other(cached.as_ref(), owner_uid) {
                return Ok(Wrote::Foreign);
            }
            let holds = |c: &V| metadata_holds(desired.meta(), c);
            match self.written.judge(&key, Some(cached), desired_hash, holds) {
                Judged::Current(written) => {
                    let cached = cached.clone();
                    return Ok(Wrote::Current { cached, written });
                }
                Judged::OnItsWay => return Ok(Wrote::OnItsWay),
                Judged::Stale => {}
            }
        } else {
            if self.written.judge(&key, None, desired_hash, |_| true) == Judged::OnItsWay {
                return Ok(Wrote::OnItsWay);
            }
            let namesake = self.namesakes.as_ref().and_then(|namesakes| {
                namesakes.get(&key_of(desired.meta().name.as_deref(), desired.namespace()))
            });
            match namesake {
                // Ours, stripped of the label the cache selects: the apply puts it back.
                Some(ours) if is_controlled_by(ours.as_ref(), owner_uid) => {}
                Some(_) => return Ok(Wrote::Foreign),
                None => return self.create(key, desired, desired_hash, owner_uid).await,
            }
        }
        self.apply(key, desired, desired_hash, cached, owner_uid)
            .await
    }

    /// Creates the child the cache does not show.
    async fn create(
        &self,
        key: ObjectRef<V>,
        desired: &C,
        desired_hash: u64,
        owner_uid: &str,
    ) -> Result<Wrote<V>, Error> {
        let namespace = desired.namespace().unwrap_or_default();
        match create_owned(&self.client, &namespace, &self.field_manager, desired).await {
            Ok(created) => {
                let owner = Some(owner_uid).filter(|uid| !uid.is_empty());
                (self.written).remember(key, desired_hash, &created, false, owner);
                Ok(Wrote::Created)
            }
            Err(e) if e.is_namespace_terminating() => Ok(Wrote::NamespaceTerminating),
            Err(e) if e.is_already_exists() && self.controlled(desired, owner_uid).await? => {
                // Ours after all, made by another process (a manager before a restart, another
                // replica) and not in this cache yet: bring it up to date.
                self.apply(key, desired, desired_hash, None, owner_uid)
                    .await
            }
            Err(e) if e.is_already_exists() => Ok(Wrote::Foreign),
            Err(e) => Err(e),
        }
    }

    /// Applies `desired` over what the cache showed as `before`, for the owner with
    /// `owner_uid`.
    async fn apply(
        &self,
        key: ObjectRef<V>,
        desired: &C,
        desired_hash: u64,
        before: Option<Arc<V>>,
        owner_uid: &str,
    ) -> Result<Wrote<V>, Error> {
        let namespace = desired.namespace().unwrap_or_default();
        match apply_owned(&self.client, &namespace, &self.field_manager, desired).await {
            Ok(applied) => {
                let shown = before.as_ref().map(|b| &b.meta().resource_version);
                let changed = shown != Some(&applied.resource_version);
                // Applied over an object the cache showed (or an object that exists): should
                // the cache lose it, it was deleted, not still on its way.
                let owner = Some(owner_uid).filter(|uid| changed && !uid.is_empty());
                (self.written).remember(key, desired_hash, &applied, true, owner);
                Ok(Wrote::Applied { before, changed })
            }
            Err(e) if e.is_namespace_terminating() => {
                tracing::debug!("namespace is being deleted; nothing to do");
                Ok(Wrote::NamespaceTerminating)
            }
            Err(e) => Err(e),
        }
    }

    /// Says that the name `desired` asks for is held by an object that is not ours.
    fn foreign_note(&self, desired: &C, owner_kind: Option<&str>) -> String {
        let name = match desired.namespace() {
            Some(namespace) => format!("{namespace}/{}", desired.name_any()),
            None => desired.name_any(),
        };
        format!(
            "{} {name} exists and is not controlled by this {}; it is left untouched",
            C::kind(&()),
            owner_kind.unwrap_or("object")
        )
    }

    /// The child called `name` in `namespace` (`None` for a cluster-scoped kind), as the
    /// cache shows it (its metadata, or the view the controller chose).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<V>> {
        self.cache
            .get(&key_of(Some(name), namespace.map(str::to_owned)))
    }

    /// Whether the object of `desired`'s name, read from the API server, is controlled by the
    /// owner with `owner_uid`. Read with a list selecting that one name, as metadata: `list` is
    /// granted for the cache already, so owning a kind needs no `get`.
    async fn controlled(&self, desired: &C, owner_uid: &str) -> Result<bool, Error> {
        let api = C::Scope::api::<C>(self.client.clone(), desired.namespace().as_deref());
        let by_name = format!("metadata.name={}", desired.name_any());
        let found = api
            .list_metadata(&kube::api::ListParams::default().fields(&by_name))
            .await?;
        Ok(found
            .items
            .iter()
            .any(|obj| is_controlled_by(obj, owner_uid)))
    }

    /// Deletes the child `namespace/name` (`name` when `namespace` is empty: a cluster-scoped
    /// kind) if the cache has it and the owner with `owner_uid` controls it; returns whether it
    /// did. Owning a kind does not grant `delete`: declare it with
    /// [`Builder::uses`](crate::builder::Builder::uses) and `rbac::uses::<C>(&["delete"])`.
    ///
    /// # Errors
    /// [`Error::Kube`] when the API server refuses (a child already gone is no error).
    pub async fn remove(
        &self,
        namespace: &str,
        name: &str,
        owner_uid: &str,
    ) -> Result<bool, Error> {
        let namespace = Some(namespace).filter(|n| !n.is_empty());
        let key = key_of(Some(name), namespace.map(str::to_owned));
        self.written.forget(&key);
        // Only a child this owner controls: one of that name made by another owner stays.
        let Some(child) = self
            .cache
            .get(&key)
            .filter(|child| is_controlled_by(child.as_ref(), owner_uid))
        else {
            return Ok(false);
        };
        let api = C::Scope::api::<C>(self.client.clone(), namespace);
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                // Its watch event is our own write: the owner knows it is gone.
                if let Some(uid) = child.meta().uid.clone() {
                    self.written.remember_removal(key, uid);
                }
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// `desired` labelled with the slot of its owner's uid ([`crate::labels::SHARD_SLOT`]), and so
/// is the pod template of an `apps` workload (a Deployment, StatefulSet, DaemonSet or
/// ReplicaSet), so that its pods can be watched by slot too ([`crate::watches::managed_pods`]).
/// A Job's template is left alone: it cannot change once the Job exists.
fn with_slot_label<C: ChildObject>(desired: &C, owner_uid: &str) -> Result<C, Error> {
    let mut labelled = desired.clone();
    let slot = crate::slots::slot_of_uid(owner_uid).to_string();
    (labelled.meta_mut().labels.get_or_insert_default())
        .insert(crate::labels::SHARD_SLOT.to_owned(), slot.clone());
    if C::group(&()) != "apps" {
        return Ok(labelled);
    }
    let serialize = |source| Error::Serialize {
        kind: "child object",
        source,
    };
    let mut object = serde_json::to_value(&labelled).map_err(serialize)?;
    let Some(template) = object
        .pointer_mut("/spec/template")
        .and_then(serde_json::Value::as_object_mut)
    else {
        return Ok(labelled);
    };
    let metadata = template
        .entry("metadata")
        .or_insert_with(|| serde_json::json!({}));
    let Some(metadata) = metadata.as_object_mut() else {
        return Ok(labelled);
    };
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| serde_json::json!({}));
    let Some(labels) = labels.as_object_mut() else {
        return Ok(labelled);
    };
    labels.insert(crate::labels::SHARD_SLOT.to_owned(), slot.into());
    serde_json::from_value(object).map_err(serialize)
}

/// The cache key of the child called `name` in `namespace`.
fn key_of<V: Resource<DynamicType = ()>>(
    name: Option<&str>,
    namespace: Option<String>,
) -> ObjectRef<V> {
    let mut key = ObjectRef::new(name.unwrap_or_default());
    key.namespace = namespace;
    key
}

/// Whether an owner other than the one with `owner_uid` controls `child`. A child nobody
/// controls may be adopted, as controller-runtime's `SetControllerReference` does.
fn controlled_by_other<C: Resource>(child: &C, owner_uid: &str) -> bool {
    child
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid != owner_uid)
}

/// The children of every kind one controller declared with
/// [`Builder::owns_kind`](crate::builder::Builder::owns_kind), by kind.
#[derive(Clone, Default)]
pub struct Children {
    /// By the kind's `TypeId`: an `Arc<dyn KindWriter<C>>`.
    kinds: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl Debug for Children {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Children")
            .field("kinds", &self.kinds.len())
            .finish()
    }
}

/// What writing the children of one kind needs, whatever view their cache keeps.
pub(crate) trait KindWriter<C>: Send + Sync {
    fn ensure<'a>(
        &'a self,
        desired: &'a C,
        regarding: &'a k8s_openapi::api::core::v1::ObjectReference,
        events: &'a Events,
    ) -> BoxFuture<'a, Result<Child, Error>>;

    fn remove<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        owner_uid: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn as_any(&self) -> &dyn Any;
}

impl<C, V> KindWriter<C> for OwnedChildren<C, V>
where
    C: ChildObject + Send + Sync + 'static,
    V: ChildView<C>,
{
    fn ensure<'a>(
        &'a self,
        desired: &'a C,
        regarding: &'a k8s_openapi::api::core::v1::ObjectReference,
        events: &'a Events,
    ) -> BoxFuture<'a, Result<Child, Error>> {
        Box::pin(OwnedChildren::ensure(self, desired, regarding, events))
    }

    fn remove<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        owner_uid: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(OwnedChildren::remove(self, namespace, name, owner_uid))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Children {
    pub(crate) fn insert<C, V>(&mut self, of: OwnedChildren<C, V>)
    where
        C: ChildObject + Send + Sync + 'static,
        V: ChildView<C>,
    {
        let writer: Arc<dyn KindWriter<C>> = Arc::new(of);
        self.kinds.insert(TypeId::of::<C>(), Arc::new(writer));
    }

    /// The writer of the children of kind `C`.
    pub(crate) fn writer<C>(&self) -> Result<&dyn KindWriter<C>, Error>
    where
        C: Resource<DynamicType = ()> + 'static,
    {
        self.kinds
            .get(&TypeId::of::<C>())
            .and_then(|of| of.downcast_ref::<Arc<dyn KindWriter<C>>>())
            .map(AsRef::as_ref)
            .ok_or(Error::UndeclaredChild { kind: C::kind(&()) })
    }

    /// The children of kind `C`, cached as `V` (see [`ChildView`]).
    ///
    /// # Errors
    /// [`Error::UndeclaredChild`] when the controller did not declare that kind with that view.
    pub fn of<C, V>(&self) -> Result<&OwnedChildren<C, V>, Error>
    where
        C: ChildObject + Send + Sync + 'static,
        V: ChildView<C>,
    {
        self.writer::<C>()?
            .as_any()
            .downcast_ref()
            .ok_or(Error::UndeclaredChild { kind: C::kind(&()) })
    }
}

/// A hash of what the controller wants an object to be: of its JSON, written straight into
/// the hasher rather than into a string first (one allocation less per reconcile).
pub(crate) fn hash_of<C: Resource + Serialize>(desired: &C) -> Result<u64, Error> {
    let mut hasher = HashingWriter(DefaultHasher::new());
    serde_json::to_writer(&mut hasher, desired).map_err(|source| Error::Serialize {
        kind: "child object",
        source,
    })?;
    Ok(hasher.0.finish())
}

/// Feeds what is written to it into a hasher. The same object is always written in the same
/// pieces, so it always hashes the same.
struct HashingWriter(DefaultHasher);

impl std::io::Write for HashingWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;

    fn owned_by(uid: &str, controller: bool) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                owner_references: Some(vec![OwnerReference {
                    api_version: "cache.example.com/v1alpha1".into(),
                    kind: "Memcached".into(),
                    name: "m".into(),
                    uid: uid.into(),
                    controller: Some(controller),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            ..Deployment::default()
        }
    }

    #[test]
    fn the_same_desired_object_hashes_the_same_and_a_change_does_not() {
        let deployment = |replicas| {
            let mut d = Deployment::default();
            d.spec.replicas = Some(replicas);
            d
        };
        let a = hash_of(&deployment(3)).expect("hashes");
        assert_eq!(a, hash_of(&deployment(3)).expect("hashes"));
        assert_ne!(a, hash_of(&deployment(4)).expect("hashes"));
    }

    #[test]
    fn control_is_by_uid_and_controller_flag() {
        assert!(is_controlled_by(&owned_by("u1", true), "u1"));
        assert!(
            !is_controlled_by(&owned_by("u1", true), "u2"),
            "a namesake from an older object"
        );
        assert!(
            !is_controlled_by(&owned_by("u1", false), "u1"),
            "an owner that is not the controller"
        );
        assert!(!is_controlled_by(&Deployment::default(), "u1"));
        assert!(
            controller_of(
                &owned_by("u1", true),
                "cache.example.com/v1alpha1",
                "Memcached"
            )
            .is_some()
        );
        assert!(controller_of(&owned_by("u1", true), "myscheme.example.com/v1", "MyApp").is_none());
    }
}

#[cfg(test)]
mod holds_tests {
    use super::*;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;

    fn meta(labels: &[(&str, &str)], owner_uid: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some("m".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            owner_references: Some(vec![OwnerReference {
                api_version: "cache.example.com/v1alpha1".into(),
                kind: "Memcached".into(),
                name: "m".into(),
                uid: owner_uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        }
    }

    /// `metadata` as the cache of a kind of child keeps it.
    fn cached(metadata: ObjectMeta) -> MetaView<PodDisruptionBudget> {
        MetaView::new(metadata)
    }

    #[test]
    fn what_others_add_to_the_metadata_is_ignored_and_a_change_of_ours_is_not() {
        let desired = meta(&[("app", "memcached")], "u1");
        let mut found = meta(&[("app", "memcached"), ("team", "blue")], "u1");
        found.resource_version = Some("7".into());
        found.generation = Some(1);
        let another = OwnerReference {
            uid: "u9".into(),
            controller: None,
            ..meta(&[], "u1").owner_references.unwrap_or_default()[0].clone()
        };
        found.owner_references.get_or_insert_default().push(another);
        assert!(
            metadata_holds(&desired, &cached(found)),
            "another's label and owner"
        );

        let relabelled = meta(&[("app", "other")], "u1");
        assert!(
            !metadata_holds(&desired, &cached(relabelled)),
            "a label we set, changed"
        );
        assert!(
            !metadata_holds(&desired, &cached(meta(&[], "u1"))),
            "a label we set, removed"
        );
        assert!(
            !metadata_holds(&desired, &cached(meta(&[("app", "memcached")], "u2"))),
            "our owner reference replaced"
        );
        let mut annotated = desired.clone();
        annotated.annotations = Some([("a".to_owned(), "1".to_owned())].into());
        assert!(
            !metadata_holds(&annotated, &cached(annotated.clone())),
            "an annotation of ours the cache does not show"
        );
    }
}

#[cfg(test)]
mod desired_tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    fn metadata() -> ObjectMeta {
        ObjectMeta {
            name: Some("kv".into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn an_object_written_as_json_gets_its_metadata() {
        let service: Service = desired(
            metadata(),
            json!({"spec": {"clusterIP": "None", "ports": [{"name": "redis", "port": 6379}]}}),
        )
        .expect("a Service");
        assert_eq!(service.metadata, metadata());
        let spec = service.spec.expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.ports.expect("ports")[0].port, 6379);
    }

    #[test]
    fn a_field_the_kind_does_not_have_is_named() {
        let error = desired::<Service>(
            metadata(),
            json!({"spec": {"ports": [{"name": "redis", "prot": 6379}], "selector": null}}),
        )
        .expect_err("no field prot");
        assert!(matches!(error, Error::InvalidObject { .. }), "{error}");
        assert!(error.to_string().contains(".spec.ports[0].prot"), "{error}");
        let error = desired::<Service>(metadata(), json!(["not", "an", "object"]))
            .expect_err("not an object");
        assert!(error.to_string().contains("not a JSON object"), "{error}");
    }
}

#[cfg(test)]
mod ensure_tests {
    use super::*;
    use crate::fake::ApiServer;
    use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use std::time::Duration;

    /// The budget a controller wants, and the metadata the fake API server answers its
    /// writes with.
    fn desired() -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some("m".into()),
                namespace: Some("ns".into()),
                labels: Some([("app".to_owned(), "m".to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                min_available: None,
                ..PodDisruptionBudgetSpec::default()
            }),
            ..PodDisruptionBudget::default()
        }
    }

    fn cached(rv: &str, generation: i64) -> MetaView<PodDisruptionBudget> {
        MetaView::new(ObjectMeta {
            resource_version: Some(rv.into()),
            generation: Some(generation),
            ..desired().metadata
        })
    }

    #[tokio::test]
    async fn writes_again_only_for_a_change_the_metadata_shows() {
        let server = ApiServer::answering(|_| {
            let metadata = serde_json::json!({
                "name": "m", "namespace": "ns", "resourceVersion": "1", "generation": 1,
            });
            (
                200,
                serde_json::json!({"kind": "PartialObjectMetadata", "metadata": metadata}),
            )
        });
        let mut cache = Writer::<MetaView<PodDisruptionBudget>>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let children = OwnedChildren::new(
            server.client(),
            cache.as_reader(),
            "test".into(),
            &OwnWrites::default(),
        );
        let (events, _publisher) = Events::start(server.client(), "test", "test");
        let regarding = k8s_openapi::api::core::v1::ObjectReference::default();
        let mut ensure = async |cache_shows: Option<MetaView<PodDisruptionBudget>>| {
            if let Some(obj) = cache_shows {
                cache.apply_watcher_event(&Event::Apply(obj));
            }
            let before = server.requests().len();
            let child = children
                .ensure(&desired(), &regarding, &events)
                .await
                .expect("the API server answers");
            let methods = server.requests()[before..]
                .iter()
                .filter(|r| r.path.contains("/poddisruptionbudgets"))
                .map(|r| r.method.clone())
                .collect::<Vec<_>>();
            (child, methods)
        };
        let (written, none) = (Child::Written, Vec::<String>::new());
        assert_eq!(
            ensure(None).await,
            (written, vec!["POST".to_owned()]),
            "created when missing"
        );
        assert_eq!(ensure(None).await, (written, none.clone()), "on its way");
        assert_eq!(
            ensure(Some(cached("1", 1))).await,
            (Child::Current, none.clone()),
            "our own write"
        );
        assert_eq!(
            ensure(Some(cached("2", 1))).await,
            (Child::Current, none),
            "a status write by somebody else"
        );
        assert_eq!(
            ensure(Some(cached("3", 2))).await,
            (written, vec!["PATCH".to_owned()]),
            "a spec edit bumps the generation"
        );
        let mut relabelled = cached("4", 1);
        relabelled.labels = [("app", "x")].into_iter().collect();
        assert_eq!(
            ensure(Some(relabelled)).await.1,
            ["PATCH"],
            "a label of ours edited"
        );
    }

    #[tokio::test]
    async fn a_child_another_owner_controls_is_foreign_and_untouched() {
        let server = ApiServer::answering(|_| (500, serde_json::json!({})));
        let mut cache = Writer::<MetaView<PodDisruptionBudget>>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let mut theirs = cached("1", 1);
        theirs.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                uid: "other-owner".into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        cache.apply_watcher_event(&Event::Apply(theirs));
        let children = OwnedChildren::new(
            server.client(),
            cache.as_reader(),
            "test".into(),
            &OwnWrites::default(),
        );
        let (events, _publisher) = Events::start(server.client(), "test", "test");
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            uid: Some("owner".into()),
            ..Default::default()
        };
        let child = children
            .ensure(&desired(), &regarding, &events)
            .await
            .expect("no request is made");
        assert_eq!(child, Child::Foreign);
        assert!(
            !server
                .requests()
                .iter()
                .any(|r| r.path.contains("/poddisruptionbudgets")),
            "nothing written"
        );
    }

    #[tokio::test]
    async fn a_child_cached_whole_is_read_back_whole_through_its_declared_view() {
        use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
        let server = ApiServer::answering(|_| (500, serde_json::json!({})));
        let mut cache = Writer::<StatefulSet>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let set = StatefulSet {
            metadata: ObjectMeta {
                name: Some("kv".into()),
                namespace: Some("ns".into()),
                labels: Some([("app".to_owned(), "kv".to_owned())].into()),
                resource_version: Some("3".into()),
                ..ObjectMeta::default()
            },
            status: Some(StatefulSetStatus {
                ready_replicas: Some(2),
                ..StatefulSetStatus::default()
            }),
            ..StatefulSet::default()
        };
        cache.apply_watcher_event(&Event::Apply(set.clone()));
        let mut children = Children::default();
        children.insert(OwnedChildren::<StatefulSet, StatefulSet>::new(
            server.client(),
            cache.as_reader(),
            "test".into(),
            &OwnWrites::default(),
        ));
        let whole = children
            .of::<StatefulSet, StatefulSet>()
            .expect("declared whole");
        let read = whole.get(Some("ns"), "kv").expect("cached");
        assert_eq!(read.status, set.status, "the status comes back");
        assert!(read.has_labels(&[("app".to_owned(), "kv".to_owned())].into()));
        let error = children
            .of::<StatefulSet, MetaView<StatefulSet>>()
            .expect_err("not declared as metadata");
        assert!(matches!(error, Error::UndeclaredChild { .. }), "{error}");
        assert!(
            children.writer::<StatefulSet>().is_ok(),
            "written whatever the view"
        );
        assert!(children.writer::<PodDisruptionBudget>().is_err());
    }

    /// A Deployment as the fake API server answers a write of it, and as its cache shows it.
    fn deployment(generation: i64, observed: Option<i64>, replicas: i32) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "uid": "d1",
                         "resourceVersion": format!("{generation}"), "generation": generation},
            "spec": {"replicas": replicas, "selector": {},
                     "template": {"spec": {"containers": [{"name": "app", "image": "nginx"}]}}},
            "status": {"observedGeneration": observed},
        })
    }

    fn desired_deployment(replicas: i32) -> k8s_openapi::api::apps::v1::Deployment {
        let mut desired: k8s_openapi::api::apps::v1::Deployment =
            serde_json::from_value(deployment(1, None, replicas)).expect("a Deployment");
        desired.metadata = ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        };
        desired.status = None;
        desired
    }

    #[tokio::test]
    async fn a_workload_reads_as_written_until_its_controller_has_seen_the_spec() {
        use crate::deployment_view::DeploymentView;
        use k8s_openapi::api::apps::v1::Deployment;
        let server = ApiServer::answering(|request| match request.method.as_str() {
            "PATCH" => (200, deployment(2, Some(1), 3)),
            _ => (201, deployment(1, None, 2)),
        });
        let mut cache = Writer::<DeploymentView>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let children: OwnedChildren<Deployment, DeploymentView> = OwnedChildren::new(
            server.client(),
            cache.as_reader(),
            "test".into(),
            &OwnWrites::default(),
        );
        let (events, publisher) = Events::start(server.client(), "test", "test");
        let regarding = k8s_openapi::api::core::v1::ObjectReference::default();
        let mut ensure = async |shown: Option<serde_json::Value>, replicas| {
            if let Some(shown) = shown {
                let view: DeploymentView = serde_json::from_value(shown).expect("a view");
                cache.apply_watcher_event(&Event::Apply(view));
            }
            let desired = desired_deployment(replicas);
            children
                .ensure(&desired, &regarding, &events)
                .await
                .expect("answered")
        };
        assert_eq!(ensure(None, 2).await, Child::Written, "created");
        assert_eq!(
            ensure(Some(deployment(1, None, 2)), 2).await,
            Child::Written,
            "in the cache, not yet seen by the Deployment controller"
        );
        assert_eq!(
            ensure(Some(deployment(1, Some(1), 2)), 2).await,
            Child::Current
        );
        assert_eq!(ensure(None, 3).await, Child::Written, "scaled");
        drop(events);
        publisher.finish(Duration::from_secs(5)).await;
        let reasons: Vec<String> = server
            .requests()
            .iter()
            .filter(|r| r.path.contains("/events"))
            .filter_map(|r| r.body["reason"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(reasons, ["Created", "Scaled"]);
    }

    #[tokio::test]
    async fn a_name_held_outside_the_cache_is_foreign_without_a_request_and_reported_once() {
        use crate::deployment_view::DeploymentView;
        use k8s_openapi::api::apps::v1::Deployment;
        let server = ApiServer::answering(|_| (500, serde_json::json!({})));
        let mut cache = Writer::<DeploymentView>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let mut namesakes = Writer::<MetaView<Deployment>>::default();
        namesakes.apply_watcher_event(&Event::InitDone);
        namesakes.apply_watcher_event(&Event::Apply(MetaView::new(ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns".into()),
            uid: Some("theirs".into()),
            ..ObjectMeta::default()
        })));
        let children: OwnedChildren<Deployment, DeploymentView> = OwnedChildren::new(
            server.client(),
            cache.as_reader(),
            "test".into(),
            &OwnWrites::default(),
        )
        .with_namesakes(namesakes.as_reader());
        let (events, publisher) = Events::start(server.client(), "test", "test");
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            uid: Some("owner".into()),
            kind: Some("MyApp".into()),
            ..Default::default()
        };
        for _ in 0..3 {
            let child = children
                .ensure(&desired_deployment(2), &regarding, &events)
                .await;
            assert_eq!(child.expect("no request"), Child::Foreign);
        }
        drop(events);
        publisher.finish(Duration::from_secs(5)).await;
        let requests = server.requests();
        assert!(
            requests.iter().all(|r| r.path.contains("/events")),
            "nothing but Events sent: {requests:?}"
        );
        let reasons: Vec<&str> = requests
            .iter()
            .filter_map(|r| r.body["reason"].as_str())
            .collect();
        assert_eq!(reasons, ["DeploymentNotOwned"], "one Warning");
    }

    #[tokio::test]
    async fn a_cluster_scoped_child_is_created_without_a_namespace() {
        use k8s_openapi::api::core::v1::Namespace;
        let server = ApiServer::answering(|_| {
            let metadata = serde_json::json!({"name": "team-a", "resourceVersion": "1"});
            (
                201,
                serde_json::json!({"kind": "PartialObjectMetadata", "metadata": metadata}),
            )
        });
        let mut cache = Writer::<MetaView<Namespace>>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let children = OwnedChildren::new(
            server.client(),
            cache.as_reader(),
            "test".into(),
            &OwnWrites::default(),
        );
        let (events, _publisher) = Events::start(server.client(), "test", "test");
        let regarding = k8s_openapi::api::core::v1::ObjectReference::default();
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some("team-a".into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let child = children
            .ensure(&namespace, &regarding, &events)
            .await
            .expect("created");
        assert_eq!(child, Child::Written);
        let requests = server.requests();
        let create = requests
            .iter()
            .find(|r| r.method == "POST" && !r.path.contains("/events"))
            .expect("a create");
        assert_eq!(create.path, "/api/v1/namespaces");
        cache.apply_watcher_event(&Event::Apply(MetaView::new(ObjectMeta {
            resource_version: Some("1".into()),
            ..namespace.metadata.clone()
        })));
        assert!(children.get(None, "team-a").is_some());
        let again = children.ensure(&namespace, &regarding, &events).await;
        assert_eq!(again.expect("no write"), Child::Current);
    }

    #[tokio::test]
    async fn a_sharded_manager_labels_each_child_with_its_owners_slot() {
        let server = ApiServer::answering(|request| {
            let mut metadata = request.body["metadata"].clone();
            metadata["resourceVersion"] = "1".into();
            (
                201,
                serde_json::json!({"kind": "PartialObjectMetadata", "metadata": metadata}),
            )
        });
        let mut cache = Writer::<MetaView<PodDisruptionBudget>>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let children = OwnedChildren::new(
            server.client(),
            cache.as_reader(),
            "test".into(),
            &OwnWrites::default(),
        )
        .labelling_slots(true);
        let (events, _publisher) = Events::start(server.client(), "test", "test");
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            uid: Some("u1".into()),
            ..Default::default()
        };
        let child = children
            .ensure(&desired(), &regarding, &events)
            .await
            .expect("created");
        assert_eq!(child, Child::Written);
        let requests = server.requests();
        let create = requests
            .iter()
            .find(|r| r.method == "POST" && !r.path.contains("/events"))
            .expect("a create");
        let slot = crate::slots::slot_of_uid("u1").to_string();
        assert_eq!(
            create.body["metadata"]["labels"][crate::labels::SHARD_SLOT],
            serde_json::json!(slot)
        );
        // What the controller asked for is kept beside it.
        assert_eq!(create.body["metadata"]["labels"]["app"], "m");
    }

    #[test]
    fn a_workloads_pods_carry_their_owners_slot_and_a_jobs_template_is_left_alone() {
        let slot = serde_json::json!(crate::slots::slot_of_uid("u1").to_string());
        let mut deployment = desired_deployment(2);
        (deployment
            .spec
            .template
            .metadata
            .get_or_insert_default()
            .labels)
            .get_or_insert_default()
            .insert("app".into(), "web".into());
        let labelled = with_slot_label(&deployment, "u1").expect("labelled");
        let labelled = serde_json::to_value(&labelled).expect("serializes");
        assert_eq!(
            labelled["metadata"]["labels"][crate::labels::SHARD_SLOT],
            slot
        );
        let pod_labels = &labelled["spec"]["template"]["metadata"]["labels"];
        assert_eq!(pod_labels[crate::labels::SHARD_SLOT], slot);
        assert_eq!(
            pod_labels["app"], "web",
            "the template's own labels are kept"
        );

        let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "once", "namespace": "ns"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
        }))
        .expect("a Job");
        let labelled = with_slot_label(&job, "u1").expect("labelled");
        let labelled = serde_json::to_value(&labelled).expect("serializes");
        assert_eq!(
            labelled["metadata"]["labels"][crate::labels::SHARD_SLOT],
            slot
        );
        assert!(
            labelled["spec"]["template"].get("metadata").is_none(),
            "a Job's template cannot change once it exists"
        );
    }

    #[tokio::test]
    async fn a_removal_of_ours_is_its_own_write_and_a_later_create_is_not_held() {
        let server = ApiServer::answering(|request| {
            let metadata = serde_json::json!({
                "name": "m", "namespace": "ns", "uid": "u-new", "resourceVersion": "9",
                "generation": 1,
            });
            if request.method == "DELETE" {
                let status = serde_json::json!({"kind": "Status", "status": "Success"});
                return (200, status);
            }
            (
                200,
                serde_json::json!({"kind": "PartialObjectMetadata", "metadata": metadata}),
            )
        });
        let mut cache = Writer::<MetaView<PodDisruptionBudget>>::default();
        cache.apply_watcher_event(&Event::InitDone);
        let owned = |uid: &str| {
            let mut child = cached("5", 1);
            child.metadata.uid = Some(uid.into());
            child.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    uid: "owner".into(),
                    controller: Some(true),
                    ..Default::default()
                },
            ]);
            child
        };
        cache.apply_watcher_event(&Event::Apply(owned("u-old")));
        let children = OwnedChildren::new(
            server.client(),
            cache.as_reader(),
            "test".into(),
            &OwnWrites::default(),
        );
        let removed = children
            .remove("ns", "m", "owner")
            .await
            .expect("the API server answers");
        assert!(removed);
        let mut gone = owned("u-old");
        gone.metadata.resource_version = Some("6".into());
        assert!(
            children.written.shows_own_write(&gone),
            "the deletion we asked for"
        );
        assert!(
            !children.written.shows_own_write(&owned("u-other")),
            "another object of that name"
        );

        cache.apply_watcher_event(&Event::Delete(gone));
        let (events, _publisher) = Events::start(server.client(), "test", "test");
        let regarding = k8s_openapi::api::core::v1::ObjectReference::default();
        children
            .ensure(&desired(), &regarding, &events)
            .await
            .expect("the API server answers");
        let methods: Vec<String> = server
            .requests()
            .iter()
            .filter(|r| r.path.contains("/poddisruptionbudgets"))
            .map(|r| r.method.clone())
            .collect();
        assert_eq!(methods, ["DELETE", "POST"], "created again at once");
    }
}
