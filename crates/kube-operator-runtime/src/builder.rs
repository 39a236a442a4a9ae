//! What a controller declares, in the spirit of controller-runtime's builder: the custom
//! resource it is `for`, the children it [`owns`](Builder::owns), other caches it
//! [`watches`](Builder::watches) with a mapping to its resources, and one reconcile function.
//! Everything else is the same for every controller and happens in [`Builder::run`]: waiting
//! for the shared caches to fill, the custom resources' own watch and cache, the driver (metrics,
//! backoff, concurrency, shutdown), the Event recorder, and a `ReconcileFailed` Warning Event on
//! the object whenever a reconcile fails.
//!
//! ```ignore
//! Builder::<Memcached>::new(NAME, &ctx)
//!     .owns(&ctx.watches.deployments())
//!     .watches(&ctx.watches.pods(), for_pod)
//!     .run(|tools| Context { .. }, reconcile)
//!     .await
//! ```

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::children::{Child, ChildObject, ChildView, Children, OwnedChildren};
use crate::driver::{Driver, Outcome, Reconciled};
use crate::events::{EVENTS_FLUSH, Events};
use crate::meta_view::MetaView;
use crate::own_writes::OwnWrites;
use crate::priority::Priority;
use crate::scope::ScopedApi;
use crate::status_writer::{StatusWriter, WithStatus};
use crate::watches::{Shared, WatchSpec};
use crate::{Error, RunContext, children, finalizer, rbac};

/// Maps an object of a watched cache to the custom resource it concerns, given the cache of
/// those custom resources; `None` when it concerns none (or when the change can bring that
/// resource's reconcile nothing). A plain `fn`, or a closure over other caches.
pub trait MapFn<K: Resource<DynamicType = ()>, C>:
    Fn(&Store<K>, &C) -> Option<ObjectRef<K>> + Send + 'static
{
}

impl<K, C, F> MapFn<K, C> for F
where
    K: Resource<DynamicType = ()>,
    F: Fn(&Store<K>, &C) -> Option<ObjectRef<K>> + Send + 'static,
{
}

/// Whether a changed child only shows the controller's own write, which the reconcile that
/// made it has already accounted for: see [`Builder::owns_except`].
pub trait OwnWrite<C>: Fn(&C) -> bool + Send + 'static {}

impl<C, F: Fn(&C) -> bool + Send + 'static> OwnWrite<C> for F {}

/// A controller for the custom resources of type `K`, being declared.
pub struct Builder<K: Resource<DynamicType = ()> + Clone + 'static> {
    name: &'static str,
    ctx: RunContext,
    store: Store<K>,
    writer: Writer<K>,
    /// Waits for each watched cache's first list: `Ok(false)` when shutdown came first.
    caches: Vec<BoxFuture<'static, Result<bool, Error>>>,
    triggers: Vec<BoxStream<'static, (ObjectRef<K>, Priority)>>,
    /// What the declarations need that the controller's RBAC rules do not allow.
    missing_rbac: Vec<String>,
    /// The finalizer declared with [`Builder::run_with_finalizer`].
    finalizer: Option<&'static str>,
    /// The kinds of child declared with [`Builder::owns_kind`].
    children: Children,
    /// What the controller wrote and has not yet seen.
    own_writes: OwnWrites,
    /// In a sharded replica, the assignment each cache of children has listed for.
    children_listed: Vec<tokio::sync::watch::Receiver<u64>>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Debug for Builder<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("watches", &self.triggers.len())
            .finish_non_exhaustive()
    }
}

/// What a controller's context is built from when it starts.
#[derive(Clone)]
pub struct Tools<K: Resource<DynamicType = ()> + 'static> {
    /// Client with the manager's identity.
    pub client: kube::Client,
    /// The controller's Event recorder.
    pub events: Events,
    /// The cache of the custom resources.
    pub store: Store<K>,
    /// The children of the kinds declared with [`Builder::owns_kind`].
    pub children: Children,
    /// What the controller wrote and its caches have not yet shown: shared by its children's
    /// writers, its Event recorder and the [`StatusWriter`] of [`with_status_writer`].
    pub own_writes: OwnWrites,
}

/// What most reconciles work with: the [`Tools`], and a [`StatusWriter`] for the resource's
/// status. Built by [`with_status_writer`].
pub type Context<K> = (Tools<K>, StatusWriter<K>);

/// The [`Context`] of `tools`: pass it to [`Builder::run`] as the context to build.
pub fn with_status_writer<K: WithStatus>(tools: Tools<K>) -> Context<K> {
    let statuses = StatusWriter::new(tools.client.clone(), tools.own_writes.clone());
    (tools, statuses)
}

impl<K: Resource<DynamicType = ()> + 'static> Tools<K> {
    /// Makes the child `desired` exist as desired, `owner`'s: created when missing, applied
    /// again when changed since the last write, never taken from another owner. See
    /// [`OwnedChildren::ensure`].
    ///
    /// # Errors
    /// [`Error::UndeclaredChild`] when `C` was not declared with [`Builder::owns_kind`]; as
    /// [`OwnedChildren::ensure`].
    pub async fn ensure<C>(&self, owner: &K, desired: &C) -> Result<Child, Error>
    where
        C: ChildObject + Send + Sync + 'static,
    {
        let regarding = owner.object_ref(&());
        let children = self.children.writer::<C>()?;
        children.ensure(desired, &regarding, &self.events).await
    }

    /// `owner`'s child of kind `C` called `name` in `namespace` (`None` for a cluster-scoped
    /// kind) as the cache shows it, in the view declared with [`Builder::owns_kind_as`] (or
    /// [`MetaView`](crate::meta_view::MetaView), its metadata, for [`Builder::owns_kind`]).
    /// `None` when the cache has no such child, or one that `owner` does not control.
    ///
    /// # Errors
    /// [`Error::UndeclaredChild`] when `C` was not declared with that view.
    pub fn get<C, V>(
        &self,
        owner: &K,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<V>>, Error>
    where
        C: ChildObject + Send + Sync + 'static,
        V: ChildView<C>,
    {
        let uid = owner.meta().uid.as_deref().unwrap_or_default();
        let child = self.children.of::<C, V>()?.get(namespace, name);
        Ok(child.filter(|child| children::is_controlled_by(child.as_ref(), uid)))
    }

    /// Deletes every object of kind `C` in `namespace` (empty for a cluster-scoped kind) that
    /// carries the labels `selector` and is not being deleted already; returns how many of
    /// them exist still (those just deleted, and those finalizers hold). For what no owner
    /// reference removes, such as the volume claims a StatefulSet leaves behind: a finalizer's
    /// cleanup is done once this returns 0. Declare the `list` and `delete` it needs with
    /// [`Builder::uses`].
    ///
    /// # Errors
    /// [`Error::Kube`] when the API server refuses.
    pub async fn delete_labelled<C>(
        &self,
        namespace: &str,
        selector: &std::collections::BTreeMap<String, String>,
    ) -> Result<usize, Error>
    where
        C: ChildObject,
    {
        let api = C::Scope::api::<C>(
            self.client.clone(),
            Some(namespace).filter(|n| !n.is_empty()),
        );
        let selector = crate::labels::selector(selector);
        let found = api
            .list_metadata(&kube::api::ListParams::default().labels(&selector))
            .await?;
        for object in &found.items {
            if object.metadata.deletion_timestamp.is_none() {
                let name = object.metadata.name.as_deref().unwrap_or_default();
                match api
                    .delete(name, &kube::api::DeleteParams::background())
                    .await
                {
                    // Gone already: nothing left to do for it.
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(e) => return Err(e.into()),
                    Ok(_) => {}
                }
            }
        }
        Ok(found.items.len())
    }

    /// Deletes `owner`'s child of kind `C` called `name` in `namespace` (empty for a
    /// cluster-scoped kind), if there is one; returns whether it did. Declare the `delete` it
    /// needs with [`Builder::uses`].
    ///
    /// # Errors
    /// [`Error::UndeclaredChild`] when `C` was not declared with [`Builder::owns_kind`]; as
    /// [`OwnedChildren::remove`].
    pub async fn remove<C>(&self, owner: &K, namespace: &str, name: &str) -> Result<bool, Error>
    where
        C: ChildObject + Send + Sync + 'static,
    {
        let uid = owner.meta().uid.as_deref().unwrap_or_default();
        self.children
            .writer::<C>()?
            .remove(namespace, name, uid)
            .await
    }
}

impl<K: Resource<DynamicType = ()> + 'static> Debug for Tools<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tools").finish_non_exhaustive()
    }
}

/// The driver's context: the controller's own, and the recorder for failure Events.
struct Scoped<C> {
    context: Arc<C>,
    events: Events,
}

impl<K: Reconciled> Builder<K> {
    /// The controller called `name` (its metrics label, configuration key and log field), for
    /// the custom resources of type `K`, run with what `ctx` provides.
    pub fn new(name: &'static str, ctx: &RunContext) -> Self {
        let writer = Writer::default();
        let mut builder = Self {
            name,
            ctx: ctx.clone(),
            store: writer.as_reader(),
            writer,
            caches: Vec::new(),
            triggers: Vec::new(),
            missing_rbac: Vec::new(),
            finalizer: None,
            children: Children::default(),
            own_writes: OwnWrites::default(),
            children_listed: Vec::new(),
        };
        builder.require::<K>("", rbac::READ);
        builder.require::<K>("/status", &["patch"]);
        builder
    }

    /// Notes the `verbs` on `C`'s resource (with `subresource`) that the rules do not allow.
    fn require<C: Resource<DynamicType = ()>>(&mut self, subresource: &str, verbs: &[&str]) {
        let resource = format!("{}{subresource}", C::plural(&()));
        let group = C::group(&());
        self.missing_rbac
            .extend(rbac::missing(self.ctx.rules, &group, &resource, verbs));
    }

    /// The server-side apply field manager of what this controller writes:
    /// `<manager>/<controller>` ([`crate::labels::manager`]).
    fn field_manager(&self) -> String {
        format!("{}/{}", crate::labels::manager(), self.name)
    }

    /// The count of the triggers that changes of `C` give this controller.
    fn triggers_from<C: Resource<DynamicType = ()>>(&self) -> prometheus::IntCounter {
        self.ctx
            .metrics
            .reconcile_triggers
            .with_label_values(&[self.name, &C::kind(&())])
    }

    /// The cache of the custom resources (filled once the controller runs).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// What the controller runs with: the client, the shared watches, the options.
    pub fn context(&self) -> &RunContext {
        &self.ctx
    }

    /// Declares the `verbs` the controller calls directly on `C`'s resource, outside the shared
    /// caches and its owned children (a cleanup that lists and deletes PersistentVolumeClaims:
    /// `.uses::<PersistentVolumeClaim>(&["list", "delete"])`). Like every declaration, it is
    /// checked against the controller's rules at start, where `rbac::uses` grants it.
    #[must_use]
    pub fn uses<C: Resource<DynamicType = ()>>(mut self, verbs: &[&str]) -> Self {
        self.require::<C>("", verbs);
        self
    }

    /// Reconciles the custom resource that `map` names for every change `cache` broadcasts.
    #[must_use]
    pub fn watches<C>(self, cache: &Shared<C>, map: impl MapFn<K, C>) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.watches_except(cache, map, |_: &C| false)
    }

    /// Like [`Builder::watches`], except for the changes that `own_write` says only show the
    /// controller's own write.
    #[must_use]
    pub fn watches_except<C>(
        mut self,
        cache: &Shared<C>,
        map: impl MapFn<K, C>,
        own_write: impl OwnWrite<C>,
    ) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.require::<C>("", rbac::READ);
        // A cache that follows a sharded replica's slots holds the objects of gained slots
        // back until it has listed them.
        self.children_listed.extend(cache.assignment_listed());
        let (ready, shutdown) = (cache.clone(), self.ctx.shutdown.clone());
        self.caches
            .push(async move { ready.ready(&shutdown).await }.boxed());
        let store = self.store.clone();
        let counted = self.triggers_from::<C>();
        let triggers = cache.subscribe_changes().filter_map(move |change| {
            let obj = change.object;
            let trigger = if own_write(&obj) {
                None
            } else {
                map(&store, &obj)
            };
            if trigger.is_some() {
                counted.inc();
            }
            // A child a list brought catches up with its owner; a change seen live goes first.
            let priority = if change.listed {
                Priority::CatchUp
            } else {
                Priority::Live
            };
            std::future::ready(trigger.map(|key| (key, priority)))
        });
        self.triggers.push(triggers.boxed());
        self
    }

    /// Reconciles the custom resource that controls each changed child in `children`: the
    /// owner reference marked `controller` that names a `K`.
    #[must_use]
    pub fn owns<C>(self, children: &Shared<C>) -> Self
    where
        K::Scope: ScopedApi,
        C: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.owns_except(children, |_: &C| false)
    }

    /// Like [`Builder::owns`], except for the changes that `own_write` says only show the
    /// controller's own write (the resourceVersion its create or apply was answered with).
    /// The reconcile that wrote already knows what such a change shows, and the next change
    /// by anybody else triggers as usual; controller-runtime users know this as the
    /// "expectations" of kube-controller-manager's controllers.
    #[must_use]
    pub fn owns_except<C>(mut self, children: &Shared<C>, own_write: impl OwnWrite<C>) -> Self
    where
        K::Scope: ScopedApi,
        C: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.require::<C>("", rbac::MANAGE);
        self.watches_except(children, controller_of::<K, C>, own_write)
    }

    /// Declares that the custom resources own children of kind `C`, namespaced or
    /// cluster-scoped, written through [`Tools::ensure`] as the field manager
    /// `<manager>/<controller>`. Their metadata is watched in a cache shared with every
    /// controller (the objects labelled as managed: [`crate::labels::managed`]); a change to one
    /// by anybody else triggers the resource that controls it. The rules must allow managing
    /// `C`.
    #[must_use]
    pub fn owns_kind<C>(self) -> Self
    where
        K::Scope: ScopedApi,
        C: ChildObject + Send + Sync + 'static,
    {
        self.owns_kind_as::<C, MetaView<C>>(crate::watches::managed_metadata::<C>())
    }

    /// Like [`Builder::owns_kind`], with the children cached whole: for an owner that reads
    /// more of them than their metadata, such as a StatefulSet's status. Read them back with
    /// `tools.get::<C, C>(..)`.
    #[must_use]
    pub fn owns_whole<C>(self) -> Self
    where
        K::Scope: ScopedApi,
        C: ChildObject + ChildView<C> + Send + Sync + 'static,
    {
        self.owns_kind_as::<C, C>(WatchSpec::labelled(crate::labels::managed_selector()))
    }

    /// Like [`Builder::owns_kind`], with the children cached as `V` and watched as `spec`
    /// says (it must select the managed objects: `WatchSpec::labelled(labels::managed_selector())`;
    /// it is taken as [`WatchSpec::of_children`]):
    /// the whole object (`C` itself) when the owner reads more than metadata, such as a
    /// StatefulSet's status, or a compact view (see [`ChildView`]). Read them back with
    /// [`Tools::get`].
    #[must_use]
    pub fn owns_kind_as<C, V>(self, spec: WatchSpec<V>) -> Self
    where
        K::Scope: ScopedApi,
        C: ChildObject + Send + Sync + 'static,
        V: ChildView<C>,
    {
        let field_manager = self.field_manager();
        let (mut builder, children) = self.owns_children::<C, V>(spec, field_manager);
        builder.children.insert(children);
        builder
    }

    /// Like [`Builder::owns_kind_as`], for one child of kind `C` per custom resource, named after
    /// it (a Deployment of the resource's name). The objects of kind `C` that the cache of the
    /// managed ones leaves out are watched too, as metadata in a cache shared by every
    /// controller ([`crate::watches::unmanaged_metadata`]): a name one of them holds is found
    /// taken without a request, and a change to one triggers the resource of that name, which
    /// reports the clash ([`Child::Foreign`]) and takes the name once it is free. So does a
    /// change to a managed child that another resource controls.
    #[must_use]
    pub fn owns_one_as<C, V>(mut self, spec: WatchSpec<V>) -> Self
    where
        K::Scope: ScopedApi,
        C: ChildObject + Send + Sync + 'static,
        V: ChildView<C>,
    {
        self.require::<C>("", rbac::MANAGE);
        let field_manager = self.field_manager();
        let managed = self.ctx.watches.watch(spec.of_children());
        let others = self
            .ctx
            .watches
            .watch(crate::watches::unmanaged_metadata::<C>());
        let children = OwnedChildren::new(
            self.ctx.client.clone(),
            managed.store(),
            field_manager,
            &self.own_writes,
        )
        .with_namesakes(others.store())
        .labelling_slots(self.ctx.options.shards.is_some());
        let own_writes = children.own_writes();
        let mut builder = self
            .watches_except(&managed, controller_or_namesake, own_writes)
            .watches(&others, controller_or_namesake);
        builder.children.insert(children);
        builder
    }

    /// Watches the children of kind `C`, cached as `V` as `spec` says (it must select only
    /// objects these controllers label as managed): a change to one by anybody else triggers
    /// the custom resource that controls it. Returns the builder and what writes those children
    /// as `field_manager`.
    fn owns_children<C, V>(
        self,
        spec: WatchSpec<V>,
        field_manager: impl Into<String>,
    ) -> (Self, OwnedChildren<C, V>)
    where
        K::Scope: ScopedApi,
        C: ChildObject + Send + Sync + 'static,
        V: ChildView<C>,
    {
        let cached = self.ctx.watches.watch(spec.of_children());
        let children = OwnedChildren::new(
            self.ctx.client.clone(),
            cached.store(),
            field_manager.into(),
            &self.own_writes,
        )
        .labelling_slots(self.ctx.options.shards.is_some());
        let own_writes = children.own_writes();
        (self.owns_except(&cached, own_writes), children)
    }

    /// What a reconcile of this controller gets ([`Tools`]), without running it: for a unit
    /// test that calls the reconcile against the [`fake`](crate::fake) API server and checks
    /// what it sent. Its Events are sent by a task of their own, as when running.
    pub fn tools(&self) -> Tools<K> {
        let client = self.ctx.client.clone();
        let (events, _publisher) =
            Events::remembering(client.clone(), self.name, "", self.own_writes.clone());
        Tools {
            client,
            events,
            store: self.store.clone(),
            children: self.children.clone(),
            own_writes: self.own_writes.clone(),
        }
    }

    /// Runs the controller as [`Builder::run`] does, behind the finalizer `finalizer` (a
    /// qualified name, `<group>/<what it guards>`): `reconcile` runs while the object lives, with
    /// the finalizer added first, and `cleanup` while it is being deleted, until it returns
    /// [`Outcome::Done`] and the finalizer is removed. See [`crate::finalizer`].
    ///
    /// # Errors
    /// As [`Builder::run`]; [`Error::RbacMissing`] also when the rules do not allow `patch` on
    /// the resource, which adding and removing the finalizer needs.
    pub async fn run_with_finalizer<C, F, Fut, G, GFut>(
        mut self,
        finalizer: &'static str,
        context: impl FnOnce(Tools<K>) -> C,
        reconcile: F,
        cleanup: G,
    ) -> Result<(), Error>
    where
        K: serde::Serialize,
        K::Scope: ScopedApi,
        C: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome, Error>> + Send + 'static,
        G: Fn(Arc<K>, Arc<C>) -> GFut + Clone + Send + Sync + 'static,
        GFut: Future<Output = Result<Outcome, Error>> + Send + 'static,
    {
        self.require::<K>("", &["patch"]);
        self.finalizer = Some(finalizer);
        let (client, own_writes) = (self.ctx.client.clone(), self.own_writes.clone());
        let finalized = move |obj: Arc<K>, context: Arc<C>| {
            let (client, reconcile, cleanup) = (client.clone(), reconcile.clone(), cleanup.clone());
            let own_writes = own_writes.clone();
            async move {
                let (reconcile, cleanup) = (&reconcile, &cleanup);
                finalizer::reconcile(
                    &client,
                    &own_writes,
                    finalizer,
                    obj,
                    context,
                    reconcile,
                    cleanup,
                )
                .await
            }
        };
        self.run(context, finalized).await
    }

    /// Runs the controller until shutdown: waits for every watched cache, builds the context
    /// with `context`, and reconciles with `reconcile`. A failed reconcile is retried with
    /// backoff and reported as a `ReconcileFailed` Warning Event on the object.
    ///
    /// # Errors
    /// [`Error::RbacMissing`] when the controller's rules do not cover what it declared; when
    /// a watched cache cannot be filled ([`Error::WatchRefused`], [`Error::WatchStopped`]).
    pub async fn run<C, F, Fut>(
        self,
        context: impl FnOnce(Tools<K>) -> C,
        reconcile: F,
    ) -> Result<(), Error>
    where
        K::Scope: ScopedApi,
        C: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome, Error>> + Send + 'static,
    {
        let counted = self.triggers_from::<K>();
        if !self.missing_rbac.is_empty() {
            let mut missing = self.missing_rbac;
            missing.sort();
            missing.dedup();
            return Err(Error::RbacMissing { missing });
        }
        for ready in self.caches {
            if !ready.await? {
                return Ok(());
            }
        }
        let client = self.ctx.client.clone();
        let mut driver = Driver::<K>::new(self.name, &self.ctx)
            .with_finalizer(self.finalizer)
            .with_own_writes(self.own_writes.clone())
            .with_children_listed(self.children_listed);
        let resources = driver.watch_resources(
            &client,
            &self.ctx.options.namespaces,
            &self.ctx.watches.initial_lists(),
            self.writer,
        );
        let mut triggers = self.triggers;
        triggers.insert(0, resources.inspect(move |_| counted.inc()).boxed());
        let instance = &self.ctx.options.instance;
        let own_writes = self.own_writes;
        let (events, publisher) =
            Events::remembering(client.clone(), self.name, instance, own_writes.clone());
        let scoped = Arc::new(Scoped {
            context: Arc::new(context(Tools {
                client,
                events: events.clone(),
                store: self.store.clone(),
                children: self.children,
                own_writes,
            })),
            events,
        });
        let reconcile_reporting = move |obj: Arc<K>, scoped: Arc<Scoped<C>>| {
            let reconcile = reconcile.clone();
            async move {
                let result = reconcile(obj.clone(), scoped.context.clone()).await;
                if let Err(e) = &result {
                    let note = format!("Reconciling failed, will retry: {e}");
                    scoped.events.warning(
                        &obj.object_ref(&()),
                        "ReconcileFailed",
                        "Reconcile",
                        note,
                    );
                }
                result
            }
        };
        let refused = driver.refused();
        let result = tokio::select! {
            result = driver.run(triggers, self.store, reconcile_reporting, scoped) => result,
            // Refused before its first list, nothing has been reconciled yet.
            refusal = refused => Err(refusal),
        };
        publisher.finish(EVENTS_FLUSH).await;
        result
    }
}

/// The `K` that controls `child`, by its controller owner reference: in the child's namespace,
/// or cluster-wide when `K` is a cluster-scoped kind.
pub fn controller_of<K, C>(_: &Store<K>, child: &C) -> Option<ObjectRef<K>>
where
    K: Resource<DynamicType = (), Scope: ScopedApi>,
    C: Resource,
{
    let owner = children::controller_of(child, &K::api_version(&()), &K::kind(&()))?;
    let owner = ObjectRef::new(&owner.name);
    if K::Scope::NAMESPACED {
        Some(owner.within(&child.namespace()?))
    } else {
        Some(owner)
    }
}

/// The `K` that controls `child` ([`controller_of`]), or for a child that no `K` controls, the
/// `K` of the same name if there is one: it reports the clash, and takes the name once the child
/// is gone.
pub fn controller_or_namesake<K, C>(owners: &Store<K>, child: &C) -> Option<ObjectRef<K>>
where
    K: Resource<DynamicType = (), Scope: ScopedApi> + Clone,
    C: Resource,
{
    if let Some(owner) = controller_of(owners, child) {
        return Some(owner);
    }
    let mut namesake = ObjectRef::new(&child.name_any());
    if K::Scope::NAMESPACED {
        namesake = namesake.within(&child.namespace()?);
    }
    owners.get(&namesake).map(|_| namesake)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::ApiServer;
    use crate::test_resource::Memcached;
    use crate::{Metrics, Namespaces, PolicyRule, RunOptions, SharedWatches};
    use tokio_util::sync::CancellationToken;

    /// Rules for a Memcached controller that owns and watches nothing.
    static ONLY_ITS_OWN: [PolicyRule; 4] =
        crate::controller_rules!("cache.example.com", "memcacheds");

    fn context(server: &ApiServer, rules: &'static [PolicyRule]) -> RunContext {
        let client = server.client();
        RunContext {
            watches: SharedWatches::new(
                client.clone(),
                Namespaces::all(),
                CancellationToken::new(),
            ),
            client,
            options: RunOptions::default(),
            metrics: Arc::new(Metrics::new().expect("metrics")),
            shutdown: CancellationToken::new(),
            rules,
        }
    }

    fn declared(ctx: &RunContext) -> Builder<Memcached> {
        Builder::<Memcached>::new("memcached", ctx)
            .owns(&ctx.watches.deployments())
            .watches(&ctx.watches.pods(), |_, _| None)
    }

    #[tokio::test]
    async fn a_controller_whose_rules_miss_what_it_declares_does_not_start() {
        let server = ApiServer::failing(500, "unavailable");
        let ctx = context(&server, &ONLY_ITS_OWN);
        let error = declared(&ctx)
            .run(|_| (), |_, _: Arc<()>| async { Ok(Outcome::Done) })
            .await
            .expect_err("refused");
        let message = error.to_string();
        assert!(matches!(error, Error::RbacMissing { .. }), "{message}");
        for expected in [
            "create apps/deployments",
            "patch apps/deployments",
            "list pods",
            "watch pods",
            "rbac::owns::<K>()",
        ] {
            assert!(message.contains(expected), "{expected:?} in {message}");
        }
        assert!(!message.contains("memcacheds"), "{message}");
        assert!(
            !message.contains("create pods"),
            "pods are only read: {message}"
        );
        ctx.watches.stop().await;
    }

    #[tokio::test]
    async fn direct_calls_are_checked_against_the_rules_naming_the_verbs() {
        use k8s_openapi::api::core::v1::PersistentVolumeClaim;
        static RULES: [PolicyRule; 7] = crate::controller_rules!(
            "cache.example.com",
            "memcacheds",
            crate::rbac::DEPLOYMENTS,
            crate::rbac::PODS_READ,
            crate::rbac::uses::<PersistentVolumeClaim>(&["list"])
        );
        let server = ApiServer::failing(500, "unavailable");
        let ctx = context(&server, &RULES);
        let builder = declared(&ctx).uses::<PersistentVolumeClaim>(&["list", "delete"]);
        assert_eq!(builder.missing_rbac, ["delete persistentvolumeclaims"]);
        let message = builder
            .run(|_| (), |_, _: Arc<()>| async { Ok(Outcome::Done) })
            .await
            .expect_err("refuses to start")
            .to_string();
        assert!(
            message.contains("delete persistentvolumeclaims"),
            "{message}"
        );
        assert!(message.contains("rbac::uses::<K>(verbs)"), "{message}");
        ctx.watches.stop().await;
    }

    #[tokio::test]
    async fn each_trigger_is_counted_by_the_kind_that_changed() {
        use futures::StreamExt as _;
        use k8s_openapi::api::core::v1::ConfigMap;
        let server = ApiServer::answering(|request| {
            if request.query.contains("watch=true") {
                return crate::fake::failure(500, "InternalError", "no watch in this test");
            }
            let item = |name: &str| serde_json::json!({"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"}});
            let list = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "1"},
                "items": [item("a"), item("unrelated"), item("b")],
            });
            (200, list)
        });
        let ctx = context(&server, &ONLY_ITS_OWN);
        let config_maps = ctx
            .watches
            .watch(crate::watches::WatchSpec::<ConfigMap>::labelled(
                "team=blue",
            ));
        let mut builder = Builder::<Memcached>::new("memcached", &ctx).watches(
            &config_maps,
            |_, cm: &ConfigMap| {
                let name = cm.name_any();
                (name != "unrelated").then(|| ObjectRef::new(&name).within("ns"))
            },
        );
        let mut triggers = builder.triggers.pop().expect("one watch declared");
        let two = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            (&mut triggers).take(2).collect::<Vec<_>>(),
        )
        .await
        .expect("the list's objects trigger");
        assert!(
            two.iter().all(|(_, p)| *p == Priority::CatchUp),
            "a list's objects catch up: {two:?}"
        );
        let mut names: Vec<String> = two.into_iter().map(|(r, _)| r.name).collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        let counted = |source: &str| {
            ctx.metrics
                .reconcile_triggers
                .with_label_values(&["memcached", source])
                .get()
        };
        assert_eq!(
            counted("ConfigMap"),
            2,
            "what maps to nothing is no trigger"
        );
        assert_eq!(counted("Memcached"), 0);
        ctx.watches.stop().await;
    }

    #[tokio::test]
    async fn rules_for_what_is_declared_cover_it() {
        static RULES: [PolicyRule; 6] = crate::controller_rules!(
            "cache.example.com",
            "memcacheds",
            crate::rbac::DEPLOYMENTS,
            crate::rbac::PODS_READ
        );
        let server = ApiServer::failing(500, "unavailable");
        let ctx = context(&server, &RULES);
        assert_eq!(declared(&ctx).missing_rbac, Vec::<String>::new());
        ctx.watches.stop().await;
    }
}
