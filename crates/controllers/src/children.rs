//! Children a custom resource owns beside its Deployment (a Service, a PodDisruptionBudget):
//! created when missing, server-side applied again when somebody else changed them, deleted
//! when no longer wanted, and never taken over from somebody else.
//!
//! The shared cache of the child type (managed objects only) says what exists. Like
//! [`crate::owned::OwnedDeployments`], this remembers what it last wrote to each child and the
//! `resourceVersion` the API server answered with: while the cache shows that version and the
//! desired object is the same, nothing is written. Any other version (a hand edit) or none at
//! all (a deletion) makes it write again, which puts back every field the controller sets.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams};
use kube::core::NamespaceResourceScope;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::builder::Builder;
use crate::events::Events;
use crate::watches::WatchSpec;
use crate::workload;

/// How long a create of ours may go unseen by the cache before it counts as lost and is made
/// again.
const UNSEEN_FOR: Duration = Duration::from_secs(30);

/// What [`OwnedChildren::ensure`] came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Child {
    /// The child exists as desired (or was just written and the cache will show it shortly).
    Current,
    /// An object of that name exists that is not ours: it was left untouched, and a Warning
    /// Event says so.
    Foreign,
    /// The namespace is being deleted: the child goes with it.
    NamespaceTerminating,
}

/// The children of one type that one controller writes, as `field_manager`.
pub struct OwnedChildren<C: Resource<DynamicType = ()> + 'static> {
    client: kube::Client,
    cache: Store<C>,
    field_manager: &'static str,
    written: Mutex<HashMap<ObjectRef<C>, Written>>,
}

impl<C: Resource<DynamicType = ()> + 'static> Debug for OwnedChildren<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedChildren")
            .field("kind", &C::kind(&()))
            .field("field_manager", &self.field_manager)
            .finish_non_exhaustive()
    }
}

/// What was last written to one child.
#[derive(Clone, Debug)]
struct Written {
    desired_hash: u64,
    resource_version: Option<String>,
    at: Instant,
    /// The cache has shown the write since, or the write was an apply to an object the cache
    /// showed: its absence now means it was deleted.
    seen: bool,
}

impl<C> OwnedChildren<C>
where
    C: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    /// Declares that the custom resources of `builder` own children of type `C`, watched as
    /// `spec` says (it must select only objects these controllers label as managed): a change
    /// to one triggers the custom resource that controls it. Returns the builder and what
    /// writes those children as `field_manager`.
    pub fn declare<K>(
        builder: Builder<K>,
        spec: WatchSpec<C>,
        field_manager: &'static str,
    ) -> (Builder<K>, Self)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let ctx = builder.context();
        let children = ctx.watches.watch(spec);
        let writer = Self {
            client: ctx.client.clone(),
            cache: children.store(),
            field_manager,
            written: Mutex::default(),
        };
        (builder.owns(&children), writer)
    }

    /// Makes the child `desired` names exist as desired: created when missing, applied again
    /// when changed since our last write. A `Created` Normal Event (or, for a name somebody
    /// else holds, a Warning) goes to `regarding`.
    ///
    /// # Errors
    /// [`Error::MissingField`] without a namespace; [`Error::Serialize`]; [`Error::Kube`] when
    /// the API server refuses.
    pub async fn ensure(
        &self,
        desired: &C,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
        events: &Events,
    ) -> Result<Child, Error> {
        let namespace = desired.namespace().ok_or(Error::MissingField {
            kind: C::kind(&()),
            field: "metadata.namespace",
        })?;
        let key = ObjectRef::from_obj(desired);
        let desired_hash = hash_of(desired)?;
        let cached = self.cache.get(&key);
        if self.is_current(&key, cached.as_deref(), desired_hash) {
            return Ok(Child::Current);
        }
        let kind = C::kind(&());
        let name = desired.name_any();
        let written = if cached.is_some() {
            workload::apply_owned(&self.client, &namespace, self.field_manager, desired).await
        } else {
            let created =
                workload::create_owned(&self.client, &namespace, self.field_manager, desired).await;
            if created.is_ok() {
                let note = format!("Created {kind} {name}");
                events.normal(regarding, "Created", "Create", note);
            }
            created
        };
        match written {
            Ok(written) => {
                // An apply was to an object the cache showed: should the cache lose it, it was
                // deleted, not still on its way.
                let seen = cached.is_some();
                self.remember(key, desired_hash, written.resource_version(), seen);
                Ok(Child::Current)
            }
            Err(e) if e.is_namespace_terminating() => Ok(Child::NamespaceTerminating),
            Err(e) if e.is_already_exists() && self.controlled(desired, regarding).await? => {
                // Ours after all, made by another process (a manager before a restart, another
                // replica) and not in this cache yet: bring it up to date.
                let applied =
                    workload::apply_owned(&self.client, &namespace, self.field_manager, desired)
                        .await?;
                self.remember(key, desired_hash, applied.resource_version(), true);
                Ok(Child::Current)
            }
            Err(e) if e.is_already_exists() => {
                let note = format!(
                    "{kind} {namespace}/{name} exists and is not controlled by this {}; it is \
                     left untouched",
                    regarding.kind.as_deref().unwrap_or("object")
                );
                tracing::warn!("{note}");
                events.warning(regarding, "NotOwned", "Reconcile", note);
                Ok(Child::Foreign)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the object of `desired`'s name, read from the API server, is controlled by the
    /// object `regarding` names.
    async fn controlled(
        &self,
        desired: &C,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
    ) -> Result<bool, Error> {
        let (Some(namespace), Some(uid)) = (desired.namespace(), regarding.uid.as_deref()) else {
            return Ok(false);
        };
        let api = Api::<C>::namespaced(self.client.clone(), &namespace);
        let existing = api.get_opt(&desired.name_any()).await?;
        Ok(existing.is_some_and(|obj| workload::is_controlled_by(&obj, uid)))
    }

    /// Deletes the child `namespace/name` if the cache has it and the owner with `owner_uid`
    /// controls it; returns whether it did.
    ///
    /// # Errors
    /// [`Error::Kube`] when the API server refuses (a child already gone is no error).
    pub async fn remove(
        &self,
        namespace: &str,
        name: &str,
        owner_uid: &str,
    ) -> Result<bool, Error> {
        let key = ObjectRef::new(name).within(namespace);
        lock(&self.written).remove(&key);
        // Only a child this owner controls: one of that name made by another owner stays.
        let controlled = self
            .cache
            .get(&key)
            .is_some_and(|child| workload::is_controlled_by(child.as_ref(), owner_uid));
        if !controlled {
            return Ok(false);
        }
        let api = Api::<C>::namespaced(self.client.clone(), namespace);
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the cache shows what we last wrote for this same desired object, or our create
    /// is still on its way to the cache. Notes when the cache has shown a write.
    fn is_current(&self, key: &ObjectRef<C>, cached: Option<&C>, desired_hash: u64) -> bool {
        let mut written = lock(&self.written);
        let Some(last) = written.get_mut(key) else {
            return false;
        };
        match cached {
            Some(cached) if cached.meta().resource_version == last.resource_version => {
                last.seen = true;
                last.desired_hash == desired_hash
            }
            Some(_) => false,
            None => !last.seen && last.at.elapsed() < UNSEEN_FOR,
        }
    }

    fn remember(
        &self,
        key: ObjectRef<C>,
        desired_hash: u64,
        resource_version: Option<String>,
        seen: bool,
    ) {
        let mut written = lock(&self.written);
        written.insert(
            key,
            Written {
                desired_hash,
                resource_version,
                at: Instant::now(),
                seen,
            },
        );
        // Owners deleted with their children leave entries nobody asks for again.
        if written.len() > 2 * self.cache.len() + 1024 {
            written.retain(|key, w| !w.seen || self.cache.get(key).is_some());
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another reconcile panicked mid-insert; the map is valid.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A hash of what the controller wants an object to be.
pub(crate) fn hash_of<C: Resource + Serialize>(desired: &C) -> Result<u64, Error> {
    let text = serde_json::to_string(desired).map_err(|source| Error::Serialize {
        kind: "child object",
        source,
    })?;
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    Ok(hasher.finish())
}
