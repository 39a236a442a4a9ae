//! The shared driver: runs one controller's reconciles with the same queue, metrics, backoff,
//! tracing, concurrency bound and graceful shutdown for every controller.
//!
//! The [`crate::builder::Builder`] gathers the triggers from what a controller declares (its
//! own resources' watch, its children's and other caches' events mapped to its objects), and
//! the controller writes a reconcile function returning [`Outcome`]; [`Driver::run`] does the
//! rest:
//!
//! - every trigger goes through the controller's [`WorkQueue`]: first come first served, each
//!   object queued once however often it is triggered, and never reconciled twice at once (a
//!   trigger while it runs runs it once more afterwards), as client-go's work queue;
//! - live triggers go ahead of catch-up (an initial list, a resync, a takeover's backlog),
//!   except that the last free worker takes a catch-up key while none runs, so that backlog
//!   moves under a steady stream of live changes;
//! - a free worker takes the next key and reads its object from the cache as it is then;
//!   nothing is reconciled before the cache has its first list;
//! - a reconcile never starts from a cache older than the controller's own last write for
//!   that object: to the object itself (its status, its finalizer) or to one of its children
//!   ([`OwnWrites::behind`]). Such a key waits, keeping its priority, until the caches show the
//!   write, checked every [`CATCH_UP_POLL`], for at most [`CATCH_UP_WAIT`]; each wait is
//!   counted in `operator_manager_reconcile_cache_waits_total`. The watch is the faster way
//!   to learn what was written (usually milliseconds), and a read through the API server
//!   would cost a request per reconcile that waits; past the bound (a broken watch) the
//!   reconcile starts anyway, counted as `behind`, rather than stall;
//! - each reconcile runs in a `reconcile` span with `controller`, `namespace` and `name`;
//! - `controller_runtime_reconcile_total{controller,result}`, `..._errors_total`,
//!   `..._reconcile_time_seconds` (a drop-guard timer, so a cancelled reconcile is timed too) and
//!   `..._active_workers` are recorded around it, and the work-queue metrics by the queue;
//! - a failure is retried with per-object exponential backoff ([`crate::backoff`]), reset on the
//!   next success, and counted in `workqueue_retries_total`;
//! - at most `max_concurrent_reconciles` run at once;
//! - cancelling the shutdown token stops new reconciles and lets running ones finish.
//!
//! The driver holds keys, not reconcile futures, until a worker is free: kube's controller
//! runner keeps a future per triggered object and moves what falls due into a hash set once its
//! workers are busy, so under a full queue an object whose key hashed late waited until the
//! queue ran dry, and a queue of thousands cost a poll of each on every wake-up.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt as _, Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use prometheus::IntGauge;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::initial_lists::InitialLists;
use crate::metrics::cache_wait;
use crate::metrics::result;
use crate::own_writes::OwnWrites;
use crate::priority::Priority;
use crate::scope::{self, Namespaces, ScopedApi};
use crate::shard_watch;
use crate::shards::{Assignment, ShardFollower, Shards};
use crate::slots::{Slots, slot_of_uid};
use crate::watches::{Refusal, refusal_reason};
use crate::workqueue::{Deferred, Standing, WorkQueue};
use crate::{Error, Metrics, RunContext};

/// How long a successful reconcile waits before it runs again without any watch event: a
/// safety net against missed events (controller-runtime's `SyncPeriod`, shorter than its 10 h).
pub const RESYNC_PERIOD: Duration = Duration::from_secs(60 * 60);

/// How often a reconcile held back for the cache to show the controller's own write looks
/// again.
pub const CATCH_UP_POLL: Duration = Duration::from_millis(20);

/// How long a reconcile is held back, at most, for the cache to show the controller's own
/// write.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(2);

/// How long the objects of slots a sharded replica gains wait for their children's caches to
/// list those slots' children, at most: a watch that cannot list delays them no longer.
pub const CHILDREN_LIST_WAIT: Duration = Duration::from_secs(10);

/// What a successful reconcile asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing more to do until a watch event (or the periodic resync). Counted as `success`.
    Done,
    /// Run again after this delay: the reconcile is waiting for something no watch reports.
    /// Counted as `requeue_after`.
    RequeueAfter(Duration),
}

impl Outcome {
    /// [`Outcome::Done`] when `done`, else a look again after `recheck`: for a wait on
    /// something no watch reports, such as a finalizer's cleanup.
    pub fn done_or_recheck(done: bool, recheck: Duration) -> Self {
        if done {
            Self::Done
        } else {
            Self::RequeueAfter(recheck)
        }
    }
}

/// Runs one controller with the shared behaviour described in the module documentation.
pub struct Driver<K: Resource<DynamicType = ()> + 'static> {
    name: &'static str,
    concurrency: u16,
    debounce: Duration,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    /// Set when the API server refuses the custom resources' watch before its first list.
    refusal: Arc<Refusal>,
    /// The finalizer the controller declared, if any.
    finalizer: Option<&'static str>,
    /// How long a reconcile may run ([`crate::RunOptions::reconcile_timeout`]).
    timeout: Option<Duration>,
    /// When reconciling may start ([`crate::RunOptions::leadership`]).
    leadership: crate::Leadership,
    /// What the controller wrote and its caches have not yet shown.
    own_writes: OwnWrites,
    /// Whether a reconcile waits for the cache to show the controller's own last write
    /// ([`crate::RunOptions::wait_for_own_writes`]).
    wait_for_own_writes: bool,
    /// In a sharded manager, the slots whose objects this replica reconciles
    /// ([`crate::RunOptions::shards`]); every object otherwise.
    shards: Option<ShardFollower>,
    /// In a sharded replica, the assignment each cache that follows the assignments has listed
    /// for: the caches of the controller's children ([`Driver::with_children_listed`]) and,
    /// once [`Driver::watch_resources`] made it, the cache of the custom resources themselves.
    caches_listed: Vec<watch::Receiver<u64>>,
    _resource: std::marker::PhantomData<fn() -> K>,
}

impl<K: Resource<DynamicType = ()> + 'static> Debug for Driver<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.name)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// A resource a controller reconciles: a custom resource type (`#[derive(CustomResource)]`)
/// or any other kind with a static type, readable through its JSON form.
pub trait Reconciled:
    Resource<DynamicType = ()>
    + Clone
    + DeserializeOwned
    + serde::Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Reconciled for K where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// A reconcile in progress: it yields its key and what it returned.
type Running<K> = futures::future::BoxFuture<'static, (ObjectRef<K>, Result<Outcome, Error>)>;

impl<K: Reconciled> Driver<K> {
    /// A driver for the controller `name`, with the options, metrics and shutdown of `ctx`.
    ///
    /// `max_concurrent_reconciles` of 0 is taken as 1 (as controller-runtime does): nothing
    /// would ever run otherwise, which is never what a configuration means.
    pub fn new(name: &'static str, ctx: &RunContext) -> Self {
        let concurrency = ctx.options.max_concurrent_reconciles.max(1);
        ctx.metrics.init_controller(name, concurrency);
        Self {
            name,
            concurrency,
            debounce: ctx.options.debounce,
            metrics: ctx.metrics.clone(),
            shutdown: ctx.shutdown.clone(),
            refusal: Arc::default(),
            finalizer: None,
            timeout: ctx.options.reconcile_timeout,
            leadership: ctx.options.leadership.clone(),
            own_writes: OwnWrites::default(),
            wait_for_own_writes: ctx.options.wait_for_own_writes,
            shards: ctx.options.shards.as_ref().map(Shards::follow),
            caches_listed: Vec::new(),
            _resource: std::marker::PhantomData,
        }
    }

    /// The same driver for a sharded controller whose caches of children follow the
    /// assignments, each saying through `listed` which one it has listed for: the objects of
    /// gained slots wait for their children to be cached (for up to [`CHILDREN_LIST_WAIT`]), so
    /// that no reconcile takes a child not yet listed for missing.
    #[must_use]
    pub fn with_children_listed(mut self, listed: Vec<watch::Receiver<u64>>) -> Self {
        self.caches_listed.extend(listed);
        self
    }

    /// The same driver for a controller whose writes `own_writes` remembers: see
    /// [`OwnWrites::behind`].
    #[must_use]
    pub fn with_own_writes(self, own_writes: OwnWrites) -> Self {
        Self { own_writes, ..self }
    }

    /// The same driver for a controller that declared `finalizer`: see [`asks_for_reconcile`].
    #[must_use]
    pub fn with_finalizer(self, finalizer: Option<&'static str>) -> Self {
        Self { finalizer, ..self }
    }

    /// The watch of the custom resources themselves, as a trigger stream: every object added,
    /// or changed in a way that asks for a reconcile ([`asks_for_reconcile`]). Every change
    /// reaches the cache `writer` fills. Watch errors are logged here and retried with backoff
    /// by the watcher.
    ///
    /// In a sharded replica this cache follows the assignments too (where the API server
    /// selects by shard, each assignment starts a new watch of its slots): the objects of
    /// gained slots then wait for its list of them, as for their children's, so that they are
    /// queued from a cache that holds them (see [`Driver::run`]).
    pub fn watch_resources(
        &mut self,
        client: &kube::Client,
        namespaces: &Namespaces,
        lists: &InitialLists,
        mut writer: kube::runtime::reflector::store::Writer<K>,
    ) -> impl Stream<Item = (ObjectRef<K>, Priority)> + Send + 'static
    where
        K::Scope: ScopedApi,
    {
        use kube::runtime::WatchStreamExt;
        let name = self.name;
        let refusal = self.refusal.clone();
        let cached = writer.as_reader();
        let mut listed = false;
        let mut relists = TriggersOfAList {
            pending: Vec::new(),
            finalizer: self.finalizer,
        };
        let config = watcher::Config::default();
        // How many watches a sharded controller has started (one per assignment where the API
        // server selects by shard): the list of each new one catches up, as the first does.
        let starts = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut listed_starts = 0;
        // The assignment the event in hand was listed for, published once the cache holds
        // that list.
        let list_generation = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let listed_for = self.shards.is_some().then(|| {
            let (listed_for, listed) = watch::channel(0);
            self.caches_listed.push(listed);
            listed_for
        });
        let events = match &self.shards {
            // A sharded replica's watch asks the API server for its slots only, where it can.
            Some(follower) => {
                let (client, namespaces, lists, cached) = (
                    client.clone(),
                    namespaces.clone(),
                    lists.clone(),
                    cached.clone(),
                );
                let (starts, list_generation) = (starts.clone(), list_generation.clone());
                let by_shard = follower.by_shard();
                shard_watch::restarting(follower.assignments(), follower.by_shard(), move |slots| {
                    starts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if let Some(slots) = slots {
                        tracing::info!(controller = name, %slots, "watching the objects of these slots only");
                    }
                    let client = slots
                        .map_or_else(|| client.clone(), |s| shard_watch::selecting(&client, s));
                    scope::watch(&client, &namespaces, &config, &lists, cached.clone())
                })
                .map(move |(generation, event)| {
                    // A watch that does not select holds every slot's objects, whatever
                    // the assignment.
                    let listed = if by_shard() { generation } else { u64::MAX };
                    list_generation.store(listed, std::sync::atomic::Ordering::Relaxed);
                    event
                })
                .boxed()
            }
            None => scope::watch(client, namespaces, &config, lists, cached.clone()),
        };
        events
            // `kubectl apply`'s copy of the object is never read, and would be most of what the
            // cache holds (the managed fields are not even parsed: see `scope::watch`).
            .modify(|obj: &mut K| {
                if let Some(annotations) = obj.meta_mut().annotations.as_mut() {
                    annotations.remove(LAST_APPLIED);
                }
            })
            .filter_map(move |event| {
                let triggers = match event {
                    Ok(event) => {
                        // The first list's objects catch up (and those of a new shard watch's,
                        // the slots it gained); a change seen live, or one a later list found
                        // (missed while the watch was down), goes ahead of them.
                        let done = matches!(event, watcher::Event::InitDone);
                        let started = starts.load(std::sync::atomic::Ordering::Relaxed);
                        let first_list = done && (!listed || started != listed_starts);
                        if done {
                            listed = true;
                            listed_starts = started;
                        }
                        let priority = if first_list {
                            Priority::CatchUp
                        } else {
                            Priority::Live
                        };
                        let triggers = relists.triggers(&event, &cached);
                        writer.apply_watcher_event(&event);
                        if let Some(listed_for) = listed_for.as_ref().filter(|_| done) {
                            let generation = list_generation.load(std::sync::atomic::Ordering::Relaxed);
                            listed_for.send_replace(generation);
                        }
                        triggers.into_iter().map(|key| (key, priority)).collect()
                    }
                    Err(e) => {
                        match refusal_reason(&e).filter(|_| !listed) {
                            Some(reason) => {
                                tracing::error!(controller = name, %reason, "watch refused");
                                refusal.refuse(reason);
                            }
                            None => {
                                tracing::warn!(controller = name, error = %e, "watch failed; retrying with backoff");
                            }
                        }
                        Vec::new()
                    }
                };
                std::future::ready((!triggers.is_empty()).then_some(triggers))
            })
            .flat_map(futures::stream::iter)
    }

    /// Fires with the reason when the API server refuses the watch of the custom resources
    /// before its first list (RBAC, an uninstalled CRD): the controller can never work then.
    pub fn refused(&self) -> impl Future<Output = Error> + Send + 'static {
        let refusal = self.refusal.clone();
        async move {
            refusal.refused().await;
            Error::WatchRefused {
                resource: K::plural(&()).into_owned(),
                selector: String::new(),
                reason: refusal.reason(),
            }
        }
    }

    /// Reconciles with `reconcile` the objects of `cache` that `triggers` name, until shutdown;
    /// then waits for the running reconciles. The triggers must include the watch that fills
    /// `cache` ([`Driver::watch_resources`]): it is polled only through them.
    ///
    /// # Errors
    /// None today: per-object failures are retried, and watch failures retried by the watcher.
    /// The `Result` leaves room for a failure that must stop the manager.
    pub async fn run<C, F, Fut>(
        self,
        triggers: Vec<BoxStream<'static, (ObjectRef<K>, Priority)>>,
        cache: Store<K>,
        reconcile: F,
        context: Arc<C>,
    ) -> Result<(), Error>
    where
        C: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome, Error>> + Send + 'static,
    {
        let name = self.name;
        let shared = Arc::new(Shared {
            name,
            context,
            metrics: self.metrics.clone(),
            backoff: Backoff::default(),
            retries: self.metrics.queue(name).retries,
            timeout: self.timeout,
        });
        let mut queue = WorkQueue::new(self.debounce, self.metrics.queue(name));
        let mut triggers = futures::stream::select_all(triggers);
        let mut triggers_open = true;
        let mut running: FuturesUnordered<Running<K>> = FuturesUnordered::new();
        let mut synced = false;
        let mut cache_ready = std::pin::pin!(cache.wait_until_ready());
        let mut timer = std::pin::pin!(tokio::time::sleep_until(Instant::now()));
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut stopping = false;
        let mut shards = self.shards;
        // A sharded controller starts owning nothing, and takes its first assignment as a change.
        let mut owned = if shards.is_some() {
            Slots::NONE
        } else {
            Slots::ALL
        };
        // The assignment whose lost slots still have reconciles running, to report once they end.
        let mut releasing = None;
        // Each running reconcile's key: its object's slot, and the priority it waited with.
        let mut running_keys: HashMap<ObjectRef<K>, (u8, Priority)> = HashMap::new();
        let shard_objects = (self.metrics.shard_objects).with_label_values(&[name]);
        let mut leading = self.leadership.is_leading();
        let standby = !leading;
        let mut lead = std::pin::pin!(self.leadership.clone().leading());
        // The keys held back for a cache to show the controller's own write, since when.
        let mut held_back: HashMap<ObjectRef<K>, Instant> = HashMap::new();
        let mut caches_listed = self.caches_listed;
        // Gained slots whose objects or children the caches have not listed yet: (slots, the
        // assignment that gained them, until when to wait), and the live changes to their
        // objects meanwhile.
        let mut unlisted: Option<(Slots, u64, Instant)> = None;
        let mut held_live: Vec<ObjectRef<K>> = Vec::new();
        let cache_waits =
            |outcome| (self.metrics.reconcile_cache_waits).with_label_values(&[name, outcome]);
        tracing::info!(
            controller = name,
            concurrency = self.concurrency,
            leading,
            "controller starting"
        );
        loop {
            if synced && leading && !stopping {
                while running.len() < usize::from(self.concurrency) {
                    let now = Instant::now();
                    // The last free worker goes to catch-up while none runs, so a takeover's
                    // backlog (the edits nobody acted on first) moves under a steady stream of
                    // live changes, which keep the other workers.
                    let last_worker = running.len() + 1 == usize::from(self.concurrency);
                    let catching_up = running_keys
                        .values()
                        .any(|(_, priority)| *priority == Priority::CatchUp);
                    let preferred = if self.concurrency > 1 && last_worker && !catching_up {
                        Priority::CatchUp
                    } else {
                        Priority::Live
                    };
                    let Some((key, priority)) = queue.pop_preferring(now, preferred) else {
                        break;
                    };
                    let Some(obj) = cache.get(&key) else {
                        // Triggered, then deleted before its turn.
                        queue.gone(&key);
                        shared.backoff.reset(&key);
                        held_back.remove(&key);
                        continue;
                    };
                    let meta = obj.meta();
                    let slot = slot_of(meta);
                    if !owned.contains(slot) {
                        // Triggered, then its slot went to another replica.
                        queue.gone(&key);
                        held_back.remove(&key);
                        continue;
                    }
                    let behind = self.wait_for_own_writes
                        && meta.uid.as_deref().is_some_and(|uid| {
                            (self.own_writes).behind(uid, meta.resource_version.as_deref())
                        });
                    if behind {
                        let since = *held_back.entry(key.clone()).or_insert(now);
                        if now.saturating_duration_since(since) < CATCH_UP_WAIT {
                            queue.postpone(&key, now + CATCH_UP_POLL, priority);
                            continue;
                        }
                        tracing::debug!(controller = name, object = %key, "the cache has not shown the last write; reconciling anyway");
                        cache_waits(cache_wait::BEHIND).inc();
                        held_back.remove(&key);
                    } else if held_back.remove(&key).is_some() {
                        cache_waits(cache_wait::CAUGHT_UP).inc();
                    }
                    running_keys.insert(key.clone(), (slot, priority));
                    let reconciled = reconcile_instrumented(reconcile.clone(), obj, shared.clone());
                    running.push(reconciled.map(move |result| (key, result)).boxed());
                }
            }
            if let (Some(follower), Some(generation)) = (&shards, releasing)
                && running_keys.values().all(|(slot, _)| owned.contains(*slot))
            {
                follower.caught_up(generation);
                releasing = None;
            }
            if stopping && running.is_empty() {
                break;
            }
            let next_timer = queue.next_timer();
            if let Some(at) = next_timer.filter(|at| *at != timer.deadline()) {
                timer.as_mut().reset(at);
            }
            tokio::select! {
                trigger = triggers.next(), if triggers_open && !stopping => match trigger {
                    Some((key, priority)) => {
                        // What another replica owns is not queued here; an object no longer
                        // cached (deleted) is, to be found gone. One of a slot whose children
                        // are being listed is queued with the slot, a live change first.
                        let slot = cache.get(&key).map(|obj| slot_of(obj.meta()));
                        let theirs = shards.is_some() && slot.is_some_and(|s| !owned.contains(s));
                        let waits = unlisted.is_some_and(|(slots, ..)| {
                            slot.is_some_and(|s| slots.contains(s))
                        });
                        if waits {
                            if priority == Priority::Live {
                                held_live.push(key);
                            }
                        } else if !theirs {
                            queue.trigger_with(key, Instant::now(), priority);
                        }
                    }
                    None => triggers_open = false,
                },
                Some((key, result)) = running.next(), if !running.is_empty() => {
                    running_keys.remove(&key);
                    let requeue = match result {
                        Ok(outcome) => Some(requeue_after(outcome)),
                        Err(e) => retry_after(&key, &e, &shared),
                    };
                    if let Some(after) = requeue {
                        tracing::debug!(controller = name, object = %key, requeue_after = ?after, "queued again");
                    }
                    queue.done(&key, requeue.filter(|_| !stopping), Instant::now());
                }
                () = &mut timer, if next_timer.is_some() && !stopping => queue.fire(Instant::now()),
                ready = &mut cache_ready, if !synced => {
                    synced = true;
                    self.leadership.synced();
                    if ready.is_err() {
                        tracing::warn!(controller = name, "the cache's watch ended before its first list");
                    }
                }
                previous = &mut lead, if !leading => {
                    leading = true;
                    // A warm standby that takes over leaves what the previous leader settled to
                    // the resync, and the rest behind the changes made from now on.
                    let deferred = if standby && synced {
                        queue.defer_catch_up(Instant::now(), RESYNC_PERIOD, previous, |key| {
                            cache
                                .get(key)
                                .map_or(Standing::Unsettled, |obj| standing(obj.as_ref()))
                        })
                    } else {
                        Deferred::default()
                    };
                    tracing::info!(
                        controller = name,
                        synced,
                        left_to_the_resync = deferred.to_resync,
                        checked_after_live_changes = deferred.behind_live,
                        "leading: reconciling"
                    );
                }
                assignment = next_assignment(&mut shards) => {
                    let lost = owned.without(assignment.slots);
                    let gained = assignment.slots.without(owned);
                    owned = assignment.slots;
                    let in_lost = |key: &ObjectRef<K>| {
                        cache.get(key).is_some_and(|obj| lost.contains(slot_of(obj.meta())))
                    };
                    let dropped = queue.forget(in_lost);
                    held_back.retain(|key, _| !in_lost(key));
                    releasing = Some(assignment.generation);
                    // Reconciled once their children are cached, if the caches are to list
                    // them first; meanwhile, nothing of those slots is queued.
                    let waiting = unlisted.map_or(Slots::NONE, |(slots, ..)| slots);
                    let waiting = waiting.union(gained).intersection(owned);
                    let listing = !caches_listed.is_empty() && !waiting.is_empty();
                    unlisted = listing.then(|| {
                        let until = Instant::now() + CHILDREN_LIST_WAIT;
                        (waiting, assignment.generation, until)
                    });
                    let queued = if listing {
                        0
                    } else {
                        queue_slots(&mut queue, &cache, gained, Priority::CatchUp)
                    };
                    held_live.retain(|key| !in_lost(key));
                    shard_objects.set(owned_objects(&cache, owned));
                    if !(gained.is_empty() && lost.is_empty()) {
                        tracing::info!(
                            controller = name,
                            slots = %owned,
                            %gained,
                            %lost,
                            queued,
                            dropped,
                            "shards assigned"
                        );
                    }
                }
                listed = caches_caught_up(
                    &mut caches_listed,
                    unlisted.map_or(0, |(_, generation, _)| generation),
                    unlisted.map_or_else(Instant::now, |(.., until)| until),
                ), if unlisted.is_some() => {
                    let slots = unlisted.take().map_or(Slots::NONE, |(slots, ..)| slots);
                    let queued = queue_slots(&mut queue, &cache, slots, Priority::CatchUp);
                    let now = Instant::now();
                    for key in held_live.drain(..) {
                        queue.trigger_with(key, now, Priority::Live);
                    }
                    if listed {
                        tracing::debug!(controller = name, %slots, queued, "children of gained slots cached");
                    } else {
                        tracing::warn!(controller = name, %slots, queued, "the objects or children of gained slots are not all cached yet; reconciling anyway");
                    }
                }
                _ = tick.tick() => {
                    queue.refresh(Instant::now());
                    if shards.is_some() {
                        shard_objects.set(owned_objects(&cache, owned));
                    }
                }
                () = self.shutdown.cancelled(), if !stopping => {
                    stopping = true;
                    // What waits is dropped: a new leader, or the next start, lists it again.
                    queue.clear();
                    if !synced {
                        tracing::info!(controller = name, "stopped before its cache had synced");
                    }
                }
            }
        }
        queue.refresh(Instant::now());
        tracing::info!(controller = name, "controller stopped");
        Ok(())
    }
}

/// Queues with `priority` every cached object of `slots`; returns how many. Those whose spec
/// no reconcile has acted on go first, then those not settled, then the converged: slots taken
/// over from a replica that died hold the changes made while nobody reconciled them, which
/// should not wait behind a share of objects that need nothing.
fn queue_slots<K: Resource<DynamicType = ()> + Clone + serde::Serialize>(
    queue: &mut WorkQueue<ObjectRef<K>>,
    cache: &Store<K>,
    slots: Slots,
    priority: Priority,
) -> usize {
    let now = Instant::now();
    let rank = |standing| match standing {
        Standing::Unobserved => 0,
        Standing::Unsettled => 1,
        Standing::Converged => 2,
    };
    let mut objects: Vec<(u8, ObjectRef<K>)> = (cache.state().iter())
        .filter(|obj| slots.contains(slot_of(obj.meta())))
        .map(|obj| {
            (
                rank(standing(obj.as_ref())),
                ObjectRef::from_obj(obj.as_ref()),
            )
        })
        .collect();
    objects.sort_by_key(|(rank, _)| *rank);
    for (_, key) in &objects {
        queue.trigger_with(key.clone(), now, priority);
    }
    objects.len()
}

/// Completes once every cache in `listed` (the objects' own, their children's) holds the list
/// of the assignment of `generation` (or a later one), with `true`; with `false` at `until`. A
/// cache whose watch has stopped counts as listed.
async fn caches_caught_up(
    listed: &mut [watch::Receiver<u64>],
    generation: u64,
    until: Instant,
) -> bool {
    let all = async {
        for listed in listed.iter_mut() {
            let _ = listed.wait_for(|listed| *listed >= generation).await;
        }
    };
    tokio::select! {
        () = all => true,
        () = tokio::time::sleep_until(until) => false,
    }
}

/// The slot of the object `meta` describes ([`crate::slots`]).
fn slot_of(meta: &kube::api::ObjectMeta) -> u8 {
    slot_of_uid(meta.uid.as_deref().unwrap_or_default())
}

/// How many cached objects belong to `owned`, for `operator_manager_shard_objects`.
fn owned_objects<K: Resource<DynamicType = ()> + Clone>(cache: &Store<K>, owned: Slots) -> i64 {
    let count = cache
        .state()
        .iter()
        .filter(|obj| owned.contains(slot_of(obj.meta())))
        .count();
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// The next assignment of a sharded replica; never, when not sharded.
async fn next_assignment(shards: &mut Option<ShardFollower>) -> Assignment {
    match shards {
        Some(follower) => follower.changed().await,
        None => std::future::pending().await,
    }
}

/// The reconciles a watch event of the custom resources asks for, compared with the cache
/// before it takes the event.
///
/// The cache takes a list's objects all at once, at its end ([`watcher::Event::InitDone`]): a
/// list after a watch broke (an API-server restart) leaves the cache as it was until then. A
/// reconcile started in between would read the old object (a spec changed while the watch was
/// down, say), find nothing to do, and never be asked again. So the objects a list changed are
/// triggered at its end, once the cache shows them.
struct TriggersOfAList<K: Resource<DynamicType = ()>> {
    pending: Vec<ObjectRef<K>>,
    /// The controller's finalizer, whose removal from a live object asks for a reconcile.
    finalizer: Option<&'static str>,
}

impl<K: Resource<DynamicType = ()>> Default for TriggersOfAList<K> {
    fn default() -> Self {
        Self {
            pending: Vec::new(),
            finalizer: None,
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone> TriggersOfAList<K> {
    fn triggers(&mut self, event: &watcher::Event<K>, cached: &Store<K>) -> Vec<ObjectRef<K>> {
        match event {
            watcher::Event::Apply(obj) => {
                if asks_for_reconcile(cached, obj, self.finalizer) {
                    vec![crate::object_key(obj)]
                } else {
                    Vec::new()
                }
            }
            // A list starting again drops what an unfinished one had (the cache does too).
            watcher::Event::Init => {
                self.pending.clear();
                Vec::new()
            }
            watcher::Event::InitApply(obj) => {
                if asks_for_reconcile(cached, obj, self.finalizer) {
                    self.pending.push(crate::object_key(obj));
                }
                Vec::new()
            }
            watcher::Event::InitDone => std::mem::take(&mut self.pending),
            watcher::Event::Delete(_) => Vec::new(),
        }
    }
}

/// Whether a custom resource as the watch shows it asks for a reconcile, compared with the
/// cached one: a new object, a new spec (every spec change bumps `metadata.generation`), or its
/// deletion. A change of status alone (almost always our own write) does not: the status is
/// computed from the children, whose events trigger the reconciles that keep it current. This
/// is controller-runtime's `GenerationChangedPredicate`, which Kubebuilder projects add for the
/// same reason, without a second map of every object.
///
/// The controller's `finalizer` gone from an object that is not being deleted (removed by
/// hand) asks for one too, so the reconcile puts it back at once.
fn asks_for_reconcile<K>(cached: &Store<K>, obj: &K, finalizer: Option<&str>) -> bool
where
    K: Resource<DynamicType = ()> + Clone,
{
    let Some(old) = cached.get(&crate::object_key(obj)) else {
        return true;
    };
    let (old, new) = (old.meta(), obj.meta());
    let holds = |meta: &kube::api::ObjectMeta, finalizer: &str| {
        meta.finalizers.iter().flatten().any(|f| f == finalizer)
    };
    let finalizer_removed = finalizer
        .is_some_and(|f| new.deletion_timestamp.is_none() && holds(old, f) && !holds(new, f));
    old.uid != new.uid
        || old.generation != new.generation
        || old.deletion_timestamp != new.deletion_timestamp
        || finalizer_removed
}

/// The annotation where `kubectl apply` keeps the whole object as last applied.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What every reconcile of one controller shares.
struct Shared<K: Resource<DynamicType = ()> + 'static, C> {
    name: &'static str,
    context: Arc<C>,
    metrics: Arc<Metrics>,
    backoff: Backoff<ObjectRef<K>>,
    /// `workqueue_retries_total`: requeues asked for and retries after failures.
    retries: prometheus::IntCounter,
    /// How long a reconcile may run before it is cancelled; `None` for as long as it takes.
    timeout: Option<Duration>,
}

/// Lowers `controller_runtime_active_workers` when a reconcile ends, however it ends.
struct ActiveWorker(IntGauge);

impl ActiveWorker {
    fn start(gauge: IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for ActiveWorker {
    fn drop(&mut self) {
        self.0.dec();
    }
}

async fn reconcile_instrumented<K, C, F, Fut>(
    reconcile: F,
    obj: Arc<K>,
    shared: Arc<Shared<K, C>>,
) -> Result<Outcome, Error>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Outcome, Error>>,
{
    let controller = shared.name;
    let key = crate::object_key(obj.as_ref());
    let span = tracing::info_span!(
        "reconcile",
        controller,
        namespace = key.namespace.as_deref().unwrap_or_default(),
        name = %key.name,
    );
    let outcome = {
        let _active = ActiveWorker::start(
            shared
                .metrics
                .active_workers
                .with_label_values(&[controller]),
        );
        let _timer = shared
            .metrics
            .reconcile_time_seconds
            .with_label_values(&[controller])
            .start_timer();
        let running = std::panic::AssertUnwindSafe(reconcile(obj, shared.context.clone()))
            .catch_unwind()
            .instrument(span.clone());
        // A reconcile past its timeout is dropped where it waits, as a cancelled context stops
        // a Go reconcile at its next call, and retried with backoff like any failure.
        let outcome = match shared.timeout {
            Some(after) => tokio::time::timeout(after, running)
                .await
                .map_err(|_| after),
            None => Ok(running.await),
        };
        match outcome {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(panic)) => {
                shared
                    .metrics
                    .reconcile_panics_total
                    .with_label_values(&[controller])
                    .inc();
                Err(Error::Panicked {
                    message: panic_message(panic.as_ref()),
                })
            }
            Err(after) => {
                shared
                    .metrics
                    .reconcile_timeouts_total
                    .with_label_values(&[controller])
                    .inc();
                Err(Error::TimedOut { after })
            }
        }
    };
    match outcome {
        Ok(outcome) => {
            shared.backoff.reset(&key);
            let label = match outcome {
                Outcome::Done => result::SUCCESS,
                Outcome::RequeueAfter(_) => {
                    shared.retries.inc();
                    result::REQUEUE_AFTER
                }
            };
            shared
                .metrics
                .reconcile_total
                .with_label_values(&[controller, label])
                .inc();
            span.in_scope(|| tracing::debug!(result = label, "reconciled"));
            Ok(outcome)
        }
        Err(e) => {
            shared
                .metrics
                .reconcile_total
                .with_label_values(&[controller, result::ERROR])
                .inc();
            shared
                .metrics
                .reconcile_errors_total
                .with_label_values(&[controller])
                .inc();
            shared
                .metrics
                .reconcile_errors_by_kind
                .with_label_values(&[controller, e.metric_label()])
                .inc();
            if e.is_terminal() {
                shared
                    .metrics
                    .terminal_reconcile_errors_total
                    .with_label_values(&[controller])
                    .inc();
            }
            span.in_scope(
                || tracing::warn!(error = %e, kind = e.metric_label(), terminal = e.is_terminal(), "reconcile failed"),
            );
            Err(e)
        }
    }
}

/// When a successful reconcile runs again without a trigger.
fn requeue_after(outcome: Outcome) -> Duration {
    match outcome {
        Outcome::Done => RESYNC_PERIOD,
        Outcome::RequeueAfter(after) => after,
    }
}

/// Where `obj` stands as its last reconcile left it: converged when its status has observed
/// its current generation, its `Ready` or `Available` condition (whichever it has) is `True`,
/// and no `Degraded` condition is; unobserved when its generation is ahead of the status's.
/// Read through its JSON form, with the field names of the Kubernetes API conventions, so it
/// works for any kind; a kind without them never looks converged, and is reconciled.
fn standing<K: Resource + serde::Serialize>(obj: &K) -> Standing {
    let Ok(json) = serde_json::to_value(obj) else {
        return Standing::Unsettled;
    };
    let status = &json["status"];
    let generation = obj.meta().generation;
    let observed = status["observedGeneration"].as_i64();
    match (generation, observed) {
        (Some(generation), Some(observed)) if observed < generation => {
            return Standing::Unobserved;
        }
        (Some(generation), Some(observed)) if observed == generation => {}
        _ => return Standing::Unsettled,
    }
    let conditions = status["conditions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let statuses = |wanted: &[&str]| -> Vec<bool> {
        conditions
            .iter()
            .filter(|c| wanted.iter().any(|w| c["type"] == *w))
            .map(|c| c["status"] == "True")
            .collect()
    };
    let ready = statuses(&["Ready", "Available"]);
    if !ready.is_empty() && ready.iter().all(|r| *r) && !statuses(&["Degraded"]).contains(&true) {
        Standing::Converged
    } else {
        Standing::Unsettled
    }
}

/// When a failed reconcile is retried: with backoff, or not at all when a retry would fail
/// the same way (a terminal error waits for the object to change).
fn retry_after<K, C>(key: &ObjectRef<K>, error: &Error, shared: &Shared<K, C>) -> Option<Duration>
where
    K: Resource<DynamicType = ()> + 'static,
{
    if error.is_terminal() {
        shared.backoff.reset(key);
        return None;
    }
    let delay = shared.backoff.next_delay(key.clone());
    shared.retries.inc();
    Some(delay)
}

/// What a panic carried, when it is text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_resource::Memcached;

    fn key(name: &str) -> ObjectRef<Memcached> {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn only_new_objects_specs_and_deletions_ask_for_a_reconcile() {
        let (cached, mut writer) = kube::runtime::reflector::store::<Memcached>();
        let mut mc = Memcached::new(
            "a",
            crate::test_resource::MemcachedSpec {
                size: 1,
                image: "memcached".into(),
                ..Default::default()
            },
        );
        mc.metadata.namespace = Some("ns".into());
        mc.metadata.uid = Some("u1".into());
        mc.metadata.generation = Some(1);
        assert!(asks_for_reconcile(&cached, &mc, None), "a new object");
        writer.apply_watcher_event(&watcher::Event::Apply(mc.clone()));

        let mut status_only = mc.clone();
        status_only.status = Some(crate::test_resource::MemcachedStatus::default());
        status_only.metadata.resource_version = Some("2".into());
        assert!(
            !asks_for_reconcile(&cached, &status_only, None),
            "status alone"
        );

        let mut respec = mc.clone();
        respec.spec.size = 2;
        respec.metadata.generation = Some(2);
        assert!(asks_for_reconcile(&cached, &respec, None), "a new spec");

        let mut deleted = mc.clone();
        deleted.metadata.deletion_timestamp = Some(crate::conditions::now());
        assert!(asks_for_reconcile(&cached, &deleted, None), "deletion");

        let mut recreated = mc.clone();
        recreated.metadata.uid = Some("u2".into());
        assert!(
            asks_for_reconcile(&cached, &recreated, None),
            "a new object, same name"
        );
    }

    #[test]
    fn a_finalizer_removed_from_a_live_object_asks_for_a_reconcile() {
        const FINALIZER: &str = "cache.example.com/cleanup";
        let (cached, mut writer) = kube::runtime::reflector::store::<Memcached>();
        let mut held = Memcached::new("a", crate::test_resource::MemcachedSpec::default());
        held.metadata.namespace = Some("ns".into());
        held.metadata.finalizers = Some(vec![FINALIZER.into(), "other".into()]);
        writer.apply_watcher_event(&watcher::Event::Apply(held.clone()));

        let mut removed = held.clone();
        removed.metadata.finalizers = Some(vec!["other".into()]);
        assert!(asks_for_reconcile(&cached, &removed, Some(FINALIZER)));
        assert!(
            !asks_for_reconcile(&cached, &removed, None),
            "not the controller's finalizer"
        );

        let mut added = held.clone();
        added.metadata.finalizers = Some(vec![FINALIZER.into(), "other".into(), "x".into()]);
        assert!(!asks_for_reconcile(&cached, &added, Some(FINALIZER)));

        held.metadata.deletion_timestamp = Some(crate::conditions::now());
        writer.apply_watcher_event(&watcher::Event::Apply(held.clone()));
        let mut released = held.clone();
        released.metadata.finalizers = Some(vec!["other".into()]);
        assert!(
            !asks_for_reconcile(&cached, &released, Some(FINALIZER)),
            "its own removal at the end of a deletion"
        );
    }

    #[test]
    fn a_relist_triggers_what_it_changed_once_the_cache_shows_it() {
        let (cached, mut writer) = kube::runtime::reflector::store::<Memcached>();
        let mut relists = TriggersOfAList::default();
        let memcached = |name: &str, generation| {
            let mut mc = Memcached::new(name, crate::test_resource::MemcachedSpec::default());
            mc.metadata.namespace = Some("ns".into());
            mc.metadata.uid = Some(name.into());
            mc.metadata.generation = Some(generation);
            mc
        };
        let mut step = |event: watcher::Event<Memcached>| {
            let triggers = relists.triggers(&event, &cached);
            writer.apply_watcher_event(&event);
            triggers
        };
        assert!(step(watcher::Event::Init).is_empty());
        for name in ["a", "b"] {
            assert!(step(watcher::Event::InitApply(memcached(name, 1))).is_empty());
        }
        assert_eq!(step(watcher::Event::InitDone), [key("a"), key("b")]);
        assert_eq!(step(watcher::Event::Apply(memcached("a", 2))), [key("a")]);

        // The watch broke, and b's spec changed meanwhile: a list that is cut short, then one
        // that ends.
        assert!(step(watcher::Event::Init).is_empty());
        assert!(step(watcher::Event::InitApply(memcached("b", 2))).is_empty());
        assert!(step(watcher::Event::Init).is_empty());
        assert!(step(watcher::Event::InitApply(memcached("a", 2))).is_empty());
        assert!(step(watcher::Event::InitApply(memcached("b", 2))).is_empty());
        let cached_b = || cached.get(&key("b")).and_then(|mc| mc.metadata.generation);
        assert_eq!(cached_b(), Some(1), "the cache waits for the list's end");
        assert_eq!(step(watcher::Event::InitDone), [key("b")]);
        assert_eq!(
            cached_b(),
            Some(2),
            "and shows b's new spec when b is triggered"
        );
    }

    /// A test's context: no server behind the client, `concurrency` workers, no debounce.
    fn run_context(concurrency: u16, shutdown: CancellationToken) -> RunContext {
        let server = crate::fake::ApiServer::failing(500, "unused");
        let client = server.client();
        RunContext {
            watches: crate::SharedWatches::new(
                client.clone(),
                crate::Namespaces::all(),
                CancellationToken::new(),
            ),
            client,
            options: crate::RunOptions {
                max_concurrent_reconciles: concurrency,
                debounce: Duration::ZERO,
                ..Default::default()
            },
            metrics: Arc::new(Metrics::new().expect("metrics")),
            shutdown,
            rules: &[],
        }
    }

    /// What a recording reconcile does with each object.
    #[derive(Clone, Copy)]
    enum Then {
        /// Waits for a permit of the release semaphore, then succeeds.
        WaitForRelease,
        /// Fails (not terminally) the first time it sees an object, then succeeds.
        FailOnce,
    }

    /// A driver over a cache of Memcacheds, run in the background, whose reconciles record the
    /// name of each object they start with, then do as [`Then`] says.
    struct Recording {
        triggers: futures::channel::mpsc::UnboundedSender<(ObjectRef<Memcached>, Priority)>,
        seen: Arc<std::sync::Mutex<Vec<String>>>,
        release: Arc<tokio::sync::Semaphore>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
        running: tokio::task::JoinHandle<Result<(), Error>>,
    }

    impl Recording {
        fn start(objects: &[&str], concurrency: u16, then: Then) -> Self {
            Self::start_with(objects, concurrency, then, crate::Leadership::always())
        }

        /// A controller of a sharded replica that owns what `shards` says; each object's uid
        /// is its name.
        fn start_sharded(objects: &[&str], then: Then, shards: crate::Shards) -> Self {
            Self::start_configured(objects, 1, then, |options| options.shards = Some(shards))
        }

        fn start_with(
            objects: &[&str],
            concurrency: u16,
            then: Then,
            leadership: crate::Leadership,
        ) -> Self {
            Self::start_configured(objects, concurrency, then, |options| {
                options.leadership = leadership;
            })
        }

        fn start_configured(
            objects: &[&str],
            concurrency: u16,
            then: Then,
            configure: impl FnOnce(&mut crate::RunOptions),
        ) -> Self {
            Self::start_listing(objects, concurrency, then, configure, Vec::new())
        }

        /// Like [`Recording::start_configured`], for a controller whose caches of children say
        /// in `children_listed` which assignment they have listed for.
        fn start_listing(
            objects: &[&str],
            concurrency: u16,
            then: Then,
            configure: impl FnOnce(&mut crate::RunOptions),
            children_listed: Vec<watch::Receiver<u64>>,
        ) -> Self {
            let shutdown = CancellationToken::new();
            let mut ctx = run_context(concurrency, shutdown.clone());
            let sharded = {
                configure(&mut ctx.options);
                ctx.options.shards.is_some()
            };
            let (cache, mut writer) = kube::runtime::reflector::store::<Memcached>();
            for name in objects {
                let mut mc = (*memcached(name)).clone();
                if sharded {
                    mc.metadata.uid = Some((*name).to_owned());
                }
                // `edited-*` objects have a spec no reconcile has acted on yet.
                if name.starts_with("edited-") {
                    mc.metadata.generation = Some(2);
                    mc.status = Some(crate::test_resource::MemcachedStatus {
                        observed_generation: Some(1),
                        ..Default::default()
                    });
                }
                // `converged-*` objects look as their last reconcile left them, settled.
                if name.starts_with("converged-") {
                    mc.metadata.generation = Some(1);
                    mc.status = Some(crate::test_resource::MemcachedStatus {
                        observed_generation: Some(1),
                        conditions: vec![
                            serde_json::from_value(serde_json::json!({
                                "type": "Available", "status": "True", "reason": "Ready",
                                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                            }))
                            .expect("a condition"),
                        ],
                        ..Default::default()
                    });
                }
                writer.apply_watcher_event(&watcher::Event::InitApply(mc));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
            let (triggers, rx) = futures::channel::mpsc::unbounded();
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let release = Arc::new(tokio::sync::Semaphore::new(0));
            let recording = {
                let (seen, release) = (seen.clone(), release.clone());
                move |obj: Arc<Memcached>, _: Arc<()>| {
                    let (seen, release) = (seen.clone(), release.clone());
                    async move {
                        let name = kube::ResourceExt::name_any(obj.as_ref());
                        let first = {
                            let mut seen = seen.lock().expect("not poisoned");
                            let first = !seen.contains(&name);
                            seen.push(name);
                            first
                        };
                        match then {
                            Then::WaitForRelease => {
                                release.acquire().await.expect("open").forget();
                            }
                            Then::FailOnce if first => {
                                return Err(Error::Panicked {
                                    message: "failing once".into(),
                                });
                            }
                            Then::FailOnce => {}
                        }
                        Ok(Outcome::Done)
                    }
                }
            };
            let driver =
                Driver::<Memcached>::new("test", &ctx).with_children_listed(children_listed);
            let running =
                tokio::spawn(driver.run(vec![rx.boxed()], cache, recording, Arc::new(())));
            Self {
                triggers,
                seen,
                release,
                metrics: ctx.metrics,
                shutdown,
                running,
            }
        }

        fn trigger(&self, name: &str) {
            self.trigger_with(name, Priority::Live);
        }

        fn trigger_with(&self, name: &str, priority: Priority) {
            self.triggers
                .unbounded_send((key(name), priority))
                .expect("running");
        }

        fn seen(&self) -> Vec<String> {
            self.seen.lock().expect("not poisoned").clone()
        }

        /// Waits until the driver has taken `adds` triggers and started `started` reconciles.
        async fn settle(&self, adds: u64, started: usize) {
            let taken = self
                .metrics
                .workqueue_adds_total
                .with_label_values(&["test", "test"]);
            let settled = async {
                while taken.get() < adds || self.seen().len() < started {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(10), settled)
                .await
                .unwrap_or_else(|_| panic!("settled: {} taken, {:?}", taken.get(), self.seen()));
        }

        /// Waits until a sharded driver has taken an assignment that owns `objects` objects.
        async fn owns(&self, objects: i64) {
            let owned = self.metrics.shard_objects.with_label_values(&["test"]);
            let taken = async {
                while owned.get() != objects {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(10), taken)
                .await
                .unwrap_or_else(|_| panic!("owns {objects} objects: {}", owned.get()));
        }

        /// Lets the reconciles go one at a time, each once the one before has let the next start,
        /// until `started` have started; then stops the driver and returns what was seen.
        async fn finish(self, started: usize) -> Vec<String> {
            while self.seen().len() < started {
                let before = self.seen().len();
                self.release.add_permits(1);
                let next = async {
                    while self.seen().len() == before {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                };
                if tokio::time::timeout(Duration::from_secs(10), next)
                    .await
                    .is_err()
                {
                    break;
                }
            }
            self.shutdown.cancel();
            self.release.add_permits(started.max(1));
            tokio::time::timeout(Duration::from_secs(10), self.running)
                .await
                .expect("stops")
                .expect("no panic")
                .expect("runs");
            self.seen.lock().expect("not poisoned").clone()
        }
    }

    #[test]
    fn converged_means_observed_and_ready_and_not_degraded() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Reason".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        };
        let with = |observed: Option<i64>, conditions: Vec<Condition>| {
            let mut mc = (*memcached("m")).clone();
            mc.metadata.generation = Some(2);
            mc.status = Some(crate::test_resource::MemcachedStatus {
                observed_generation: observed,
                conditions,
                ..Default::default()
            });
            mc
        };
        let available = || {
            vec![
                condition("Available", "True"),
                condition("Degraded", "False"),
            ]
        };
        use Standing::{Converged, Unobserved, Unsettled};
        assert_eq!(standing(&with(Some(2), available())), Converged);
        assert_eq!(
            standing(&with(Some(1), available())),
            Unobserved,
            "a spec change no reconcile has acted on"
        );
        assert_eq!(standing(&with(None, available())), Unsettled);
        assert_eq!(
            standing(&with(Some(2), vec![])),
            Unsettled,
            "no readiness reported"
        );
        assert_eq!(
            standing(&with(Some(2), vec![condition("Available", "False")])),
            Unsettled
        );
        assert_eq!(
            standing(&with(
                Some(2),
                vec![condition("Ready", "True"), condition("Degraded", "True")]
            )),
            Unsettled
        );
        assert_eq!(standing(&*memcached("no-status")), Unsettled);
    }

    #[tokio::test]
    async fn a_standby_reconciles_nothing_until_it_leads() {
        let (lead, leadership) = crate::Leadership::standby();
        let r = Recording::start_with(&["a", "b", "c"], 1, Then::FailOnce, leadership);
        for name in ["a", "b"] {
            r.trigger(name);
        }
        r.settle(2, 0).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(r.seen().is_empty(), "a standby reconciles nothing");
        lead.start();
        r.settle(2, 2).await;
        let seen = r.seen();
        assert_eq!(&seen[..2], ["a", "b"]);
        r.shutdown.cancel();
        r.running.await.expect("joined").expect("stopped cleanly");
    }

    #[tokio::test]
    async fn a_standby_is_warm_once_its_cache_has_synced() {
        let shutdown = CancellationToken::new();
        let mut ctx = run_context(1, shutdown.clone());
        let (_lead, leadership) = crate::Leadership::standby();
        let warmth = leadership.warmth();
        ctx.options.leadership = leadership.for_controller("test");
        let (cache, mut writer) = kube::runtime::reflector::store::<Memcached>();
        let (_triggers, rx) =
            futures::channel::mpsc::unbounded::<(ObjectRef<Memcached>, Priority)>();
        let done = |_: Arc<Memcached>, _: Arc<()>| std::future::ready(Ok(Outcome::Done));
        let driver = Driver::<Memcached>::new("test", &ctx);
        let running = tokio::spawn(driver.run(vec![rx.boxed()], cache, done, Arc::new(())));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(warmth.cold(), ["test"], "no list yet");
        writer.apply_watcher_event(&watcher::Event::InitApply((*memcached("a")).clone()));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        tokio::time::timeout(Duration::from_secs(5), async {
            while !warmth.is_warm() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("warm once the cache holds its first list");
        shutdown.cancel();
        running.await.expect("joined").expect("stopped cleanly");
    }

    #[tokio::test]
    async fn a_reconcile_waits_for_the_cache_to_show_the_controllers_own_write() {
        let shutdown = CancellationToken::new();
        let ctx = run_context(2, shutdown.clone());
        let (cache, mut writer) = kube::runtime::reflector::store::<Memcached>();
        let at_version = |name: &str, version: &str| {
            let mut mc = (*memcached(name)).clone();
            mc.metadata.uid = Some(format!("uid-{name}"));
            mc.metadata.resource_version = Some(version.into());
            mc
        };
        for name in ["written", "lost", "other"] {
            writer.apply_watcher_event(&watcher::Event::InitApply(at_version(name, "1")));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let own_writes = OwnWrites::default();
        for name in ["written", "lost"] {
            own_writes.wrote_object(&format!("uid-{name}"), Some("1".into()), Some("2".into()));
        }
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recording = {
            let seen = seen.clone();
            move |obj: Arc<Memcached>, _: Arc<()>| {
                let version = obj.meta().resource_version.clone().unwrap_or_default();
                let name = kube::ResourceExt::name_any(obj.as_ref());
                seen.lock()
                    .expect("not poisoned")
                    .push(format!("{name}@{version}"));
                std::future::ready(Ok(Outcome::Done))
            }
        };
        let (triggers, rx) = futures::channel::mpsc::unbounded();
        let driver = Driver::<Memcached>::new("test", &ctx).with_own_writes(own_writes);
        let running = tokio::spawn(driver.run(vec![rx.boxed()], cache, recording, Arc::new(())));
        for name in ["written", "lost", "other"] {
            triggers
                .unbounded_send((key(name), Priority::Live))
                .expect("running");
        }
        let seen_now = || seen.lock().expect("not poisoned").clone();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(seen_now(), ["other@1"], "the others wait for their write");
        writer.apply_watcher_event(&watcher::Event::Apply(at_version("written", "2")));
        let waits = |outcome| {
            (ctx.metrics.reconcile_cache_waits)
                .with_label_values(&["test", outcome])
                .get()
        };
        let caught_up = async {
            while seen_now().len() < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(CATCH_UP_WAIT * 3, caught_up)
            .await
            .expect("both ran");
        assert_eq!(seen_now(), ["other@1", "written@2", "lost@1"]);
        assert_eq!(waits(cache_wait::CAUGHT_UP), 1);
        assert_eq!(
            waits(cache_wait::BEHIND),
            1,
            "the lost write is given up on"
        );
        shutdown.cancel();
        running.await.expect("joined").expect("stopped cleanly");
    }

    #[tokio::test]
    async fn without_the_wait_a_reconcile_starts_from_the_cache_as_it_is() {
        let shutdown = CancellationToken::new();
        let mut ctx = run_context(1, shutdown.clone());
        ctx.options.wait_for_own_writes = false;
        let (cache, mut writer) = kube::runtime::reflector::store::<Memcached>();
        let mut written = (*memcached("written")).clone();
        written.metadata.uid = Some("uid-written".into());
        written.metadata.resource_version = Some("1".into());
        writer.apply_watcher_event(&watcher::Event::InitApply(written));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let own_writes = OwnWrites::default();
        own_writes.wrote_object("uid-written", Some("1".into()), Some("2".into()));
        let (ran, mut reconciled) = tokio::sync::mpsc::unbounded_channel();
        let recording = move |obj: Arc<Memcached>, _: Arc<()>| {
            let _ = ran.send(obj.meta().resource_version.clone());
            std::future::ready(Ok(Outcome::Done))
        };
        let (triggers, rx) = futures::channel::mpsc::unbounded();
        let driver = Driver::<Memcached>::new("test", &ctx).with_own_writes(own_writes);
        let running = tokio::spawn(driver.run(vec![rx.boxed()], cache, recording, Arc::new(())));
        triggers
            .unbounded_send((key("written"), Priority::Live))
            .expect("running");
        let version = tokio::time::timeout(CATCH_UP_WAIT / 2, reconciled.recv())
            .await
            .expect("reconciled without waiting for the write");
        assert_eq!(version.flatten().as_deref(), Some("1"));
        let waits = (ctx.metrics.reconcile_cache_waits).with_label_values(&["test", "behind"]);
        assert_eq!(waits.get(), 0, "no wait counted");
        shutdown.cancel();
        running.await.expect("joined").expect("stopped cleanly");
    }

    #[tokio::test]
    async fn a_sharded_controller_reconciles_its_slots_and_lets_go_once_their_reconciles_end() {
        // Three objects in three different slots.
        // Uids vary from their first byte, as random ones do: FNV's high bits depend on it.
        let names: Vec<String> = (0..64).map(|i| format!("{i}-object")).collect();
        let mut distinct: Vec<&str> = Vec::new();
        for name in &names {
            if distinct.iter().all(|n| slot_of_uid(n) != slot_of_uid(name)) {
                distinct.push(name);
            }
        }
        let [a, b, c] = [distinct[0], distinct[1], distinct[2]];
        let slot = |name: &str| Slots::one(slot_of_uid(name));
        let (control, shards) = crate::Shards::new();
        let r = Recording::start_sharded(&[a, b, c], Then::WaitForRelease, shards);

        control.assign(slot(a), Default::default());
        r.settle(1, 1).await;
        // Another replica's object: not queued here (it would run, and be seen, below).
        r.trigger(c);

        // a's slot goes while a runs: b's comes, and is caught up once a has ended.
        let generation = control.assign(slot(b), Default::default());
        let released =
            tokio::time::timeout(Duration::from_millis(200), control.released(generation));
        assert!(released.await.is_err(), "a still runs");
        r.trigger(a);
        r.release.add_permits(1);
        tokio::time::timeout(Duration::from_secs(10), control.released(generation))
            .await
            .expect("a ended, and nothing of its slot waits");
        r.settle(2, 2).await;
        assert_eq!(
            r.finish(2).await,
            [a, b],
            "c's slot was never this replica's"
        );
    }

    #[tokio::test]
    async fn of_gained_slots_the_objects_changed_meanwhile_go_first() {
        // Whatever order the cache holds them in, the edited one goes first.
        let (control, shards) = crate::Shards::new();
        let mut names: Vec<String> = (0..8).map(|i| format!("converged-{i}")).collect();
        names.insert(4, "edited-x".to_owned());
        let objects: Vec<&str> = names.iter().map(String::as_str).collect();
        let r = Recording::start_sharded(&objects, Then::WaitForRelease, shards);
        control.assign(Slots::ALL, Default::default());
        r.settle(9, 1).await;
        let seen = r.finish(9).await;
        assert_eq!(
            seen.first().map(String::as_str),
            Some("edited-x"),
            "{seen:?}"
        );
        assert_eq!(seen.len(), 9, "the converged follow");
    }

    #[tokio::test]
    async fn the_objects_of_gained_slots_wait_for_their_children_to_be_cached() {
        let names: Vec<String> = (0..64).map(|i| format!("{i}-object")).collect();
        let Some(b) = names
            .iter()
            .find(|n| slot_of_uid(n) != slot_of_uid(&names[0]))
        else {
            panic!("64 names in one slot");
        };
        let [a, b] = [names[0].as_str(), b.as_str()];
        let (control, shards) = crate::Shards::new();
        let (listed, children_listed) = watch::channel(0);
        let r = Recording::start_listing(
            &[a, b],
            1,
            Then::WaitForRelease,
            |options| options.shards = Some(shards),
            vec![children_listed],
        );
        let slots = Slots::one(slot_of_uid(a)).with(slot_of_uid(b));
        let generation = control.assign(slots, Default::default());
        // A live change meanwhile waits with its slot, and goes first. (One that came before
        // the assignment would not be this replica's, and would be dropped.)
        r.owns(2).await;
        r.trigger(b);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            r.seen().is_empty(),
            "nothing runs before the children are cached"
        );
        listed.send_replace(generation);
        r.settle(3, 1).await;
        assert_eq!(r.finish(2).await, [b, a]);
    }

    /// A server whose lists of Memcacheds hold `names` (each its own uid) and whose watches
    /// show nothing new.
    fn listing(names: &'static [&'static str]) -> crate::fake::ApiServer {
        crate::fake::ApiServer::answering(move |request| {
            if request.query.contains("watch=true") {
                let bookmark = serde_json::json!({
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": "cache.example.com/v1beta1", "kind": "Memcached",
                        "metadata": {"resourceVersion": "2"}
                    }
                });
                return (200, bookmark);
            }
            let items: Vec<_> = names
                .iter()
                .map(|name| {
                    serde_json::json!({
                        "apiVersion": "cache.example.com/v1beta1", "kind": "Memcached",
                        "metadata": {
                            "name": name, "namespace": "default", "uid": name,
                            "resourceVersion": "1", "generation": 1
                        },
                        "spec": {"size": 1}
                    })
                })
                .collect();
            let list = serde_json::json!({
                "apiVersion": "cache.example.com/v1beta1", "kind": "MemcachedList",
                "metadata": {"resourceVersion": "1"}, "items": items
            });
            (200, list)
        })
    }

    #[tokio::test]
    async fn a_sharded_watch_of_the_resources_says_which_assignment_it_has_listed_for() {
        for by_shard in [true, false] {
            let server = listing(&["a", "b"]);
            let (control, shards) = crate::Shards::new();
            control.lists_by_shard(by_shard);
            let mut ctx = run_context(1, CancellationToken::new());
            ctx.options.shards = Some(shards);
            let mut driver = Driver::<Memcached>::new("test", &ctx);
            let (cache, writer) = kube::runtime::reflector::store::<Memcached>();
            let triggers = driver.watch_resources(
                &server.client(),
                &crate::Namespaces::all(),
                &InitialLists::paged(),
                writer,
            );
            let mut listed = driver
                .caches_listed
                .last()
                .cloned()
                .expect("a cache to wait for");
            let watching = tokio::spawn(triggers.for_each(|_| std::future::ready(())));
            let generation = control.assign(Slots::ALL, Default::default());
            let waited = tokio::time::timeout(
                Duration::from_secs(5),
                listed.wait_for(|listed| *listed >= generation),
            );
            let listed_for = *waited.await.expect("listed in time").expect("open");
            // Published only once the cache holds the list.
            assert_eq!(cache.state().len(), 2, "by shard: {by_shard}");
            // A watch that selects by shard lists again for each assignment; one that does not
            // holds every slot's objects for good.
            let expected = if by_shard { generation } else { u64::MAX };
            assert_eq!(listed_for, expected, "by shard: {by_shard}");
            watching.abort();
        }
    }

    #[tokio::test]
    async fn a_takeover_reconciles_what_changed_and_leaves_the_converged_to_the_resync() {
        let (lead, leadership) = crate::Leadership::standby();
        let objects = ["converged-a", "converged-b", "pending", "edited"];
        let r = Recording::start_with(&objects, 1, Then::FailOnce, leadership);
        // The standby's first list, then a change seen live.
        for name in ["converged-a", "converged-b", "pending"] {
            r.trigger_with(name, Priority::CatchUp);
        }
        r.trigger_with("converged-b", Priority::CatchUp);
        r.trigger("edited");
        r.settle(5, 0).await;
        lead.start();
        r.settle(5, 2).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Each fails once and is retried: what matters is who ran, and who first.
        let mut seen = r.seen();
        let mut first = std::collections::HashSet::new();
        seen.retain(|name| first.insert(name.clone()));
        assert_eq!(
            seen,
            ["edited", "pending"],
            "the live change first; the converged wait for the resync"
        );
        r.shutdown.cancel();
        r.running.await.expect("joined").expect("stopped cleanly");
    }

    #[tokio::test]
    async fn the_last_free_worker_takes_catch_up_while_live_changes_wait() {
        let (lead, leadership) = crate::Leadership::standby();
        let objects = ["backlog-1", "backlog-2", "live-1", "live-2", "live-3"];
        let r = Recording::start_with(&objects, 2, Then::WaitForRelease, leadership);
        for name in ["backlog-1", "backlog-2"] {
            r.trigger_with(name, Priority::CatchUp);
        }
        for name in ["live-1", "live-2", "live-3"] {
            r.trigger(name);
        }
        r.settle(5, 0).await;
        lead.start();
        r.settle(5, 2).await;
        assert_eq!(
            r.seen(),
            ["live-1", "backlog-1"],
            "one worker for the live changes, the last one for the backlog"
        );
        let mut seen = r.finish(5).await;
        seen.sort_unstable();
        assert_eq!(
            seen,
            ["backlog-1", "backlog-2", "live-1", "live-2", "live-3"]
        );
    }

    #[tokio::test]
    async fn a_busy_controller_reconciles_in_the_order_objects_were_triggered() {
        // kube's runner picked what was due from a hash set once all its workers were busy, so
        // an unlucky object could wait until the queue ran dry.
        let names: Vec<String> = (0..200).map(|i| format!("m{i:03}")).collect();
        let objects: Vec<&str> = names.iter().map(String::as_str).collect();
        let recording = Recording::start(&objects, 2, Then::WaitForRelease);
        for name in &objects {
            recording.trigger(name);
        }
        // Triggered again while waiting: still one reconcile each.
        for name in objects.iter().skip(50).step_by(10) {
            recording.trigger(name);
        }
        recording.settle(215, 2).await;
        let seen = recording.finish(objects.len()).await;
        assert_eq!(seen, names);
    }

    #[tokio::test]
    async fn an_object_triggered_while_it_runs_runs_once_more_afterwards() {
        let recording = Recording::start(&["a", "b"], 2, Then::WaitForRelease);
        recording.trigger("a");
        recording.settle(1, 1).await;
        recording.trigger("a");
        recording.trigger("a");
        recording.trigger("b");
        recording.settle(4, 2).await;
        assert_eq!(
            recording.seen(),
            ["a", "b"],
            "never two of one object at once"
        );
        let seen = recording.finish(3).await;
        assert_eq!(seen, ["a", "b", "a"], "once more, not twice");
    }

    #[tokio::test]
    async fn a_failed_reconcile_is_retried_and_a_deleted_object_skipped() {
        let recording = Recording::start(&["a"], 1, Then::FailOnce);
        recording.trigger("gone");
        recording.trigger("a");
        recording.settle(2, 2).await;
        let seen = recording.finish(2).await;
        assert_eq!(seen, ["a", "a"], "retried after the first backoff");
    }

    #[tokio::test]
    async fn shutdown_drops_what_waits_and_lets_running_reconciles_finish() {
        let recording = Recording::start(&["a", "b", "c"], 1, Then::WaitForRelease);
        for name in ["a", "b", "c"] {
            recording.trigger(name);
        }
        recording.settle(3, 1).await;
        recording.shutdown.cancel();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!recording.running.is_finished(), "a is still running");
        let seen = recording.finish(1).await;
        assert_eq!(seen, ["a"], "only the running reconcile finishes");
    }

    #[tokio::test]
    async fn nothing_runs_before_the_cache_has_its_first_list() {
        let ctx = run_context(1, CancellationToken::new());
        let (cache, mut writer) = kube::runtime::reflector::store::<Memcached>();
        writer.apply_watcher_event(&watcher::Event::InitApply((*memcached("a")).clone()));
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reconcile = {
            let ran = ran.clone();
            move |_: Arc<Memcached>, _: Arc<()>| {
                ran.store(true, std::sync::atomic::Ordering::SeqCst);
                async { Ok(Outcome::Done) }
            }
        };
        let driver = Driver::<Memcached>::new("test", &ctx);
        let running = tokio::spawn(driver.run(
            vec![futures::stream::iter([(key("a"), Priority::Live)]).boxed()],
            cache,
            reconcile,
            Arc::new(()),
        ));
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
        ctx.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("stops at once")
            .expect("no panic")
            .expect("runs");
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
        drop(writer);
    }

    fn shared(metrics: &Arc<Metrics>) -> Arc<Shared<Memcached, ()>> {
        Arc::new(Shared {
            name: "test",
            context: Arc::new(()),
            metrics: metrics.clone(),
            backoff: Backoff::default(),
            retries: metrics.queue("test").retries,
            timeout: None,
        })
    }

    fn memcached(name: &str) -> Arc<Memcached> {
        let mut mc = Memcached::new(
            name,
            crate::test_resource::MemcachedSpec {
                size: 1,
                image: "memcached".into(),
                ..Default::default()
            },
        );
        mc.metadata.namespace = Some("ns".into());
        Arc::new(mc)
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_past_its_timeout_is_cancelled_counted_and_retried() {
        let metrics = Arc::new(Metrics::new().expect("valid metrics"));
        let timeout = Duration::from_secs(5);
        let shared = Arc::new(Shared {
            name: "test",
            context: Arc::new(()),
            metrics: metrics.clone(),
            backoff: Backoff::default(),
            retries: metrics.queue("test").retries,
            timeout: Some(timeout),
        });
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = finished.clone();
        let stuck = move |_: Arc<Memcached>, _: Arc<()>| {
            let finished = seen.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(60)).await;
                finished.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(Outcome::Done)
            }
        };
        let started = Instant::now();
        let result = reconcile_instrumented(stuck, memcached("a"), shared.clone()).await;
        assert_eq!(started.elapsed(), timeout);
        let error = result.expect_err("timed out");
        assert!(matches!(error, Error::TimedOut { after } if after == timeout));
        let key = crate::object_key(memcached("a").as_ref());
        assert!(
            retry_after(&key, &error, &shared).is_some(),
            "retried with backoff"
        );
        assert!(
            !finished.load(std::sync::atomic::Ordering::SeqCst),
            "cancelled"
        );
        let count =
            |vec: &prometheus::IntCounterVec, labels: &[&str]| vec.with_label_values(labels).get();
        assert_eq!(count(&metrics.reconcile_timeouts_total, &["test"]), 1);
        assert_eq!(count(&metrics.reconcile_errors_total, &["test"]), 1);

        let quick = |_: Arc<Memcached>, _: Arc<()>| async { Ok(Outcome::Done) };
        let result = reconcile_instrumented(quick, memcached("b"), shared).await;
        assert_eq!(result.ok(), Some(Outcome::Done));
        assert_eq!(count(&metrics.reconcile_timeouts_total, &["test"]), 1);
    }

    #[tokio::test]
    async fn a_panicking_reconcile_is_counted_as_a_panic_and_an_error() {
        let metrics = Arc::new(Metrics::new().expect("valid metrics"));
        let shared = shared(&metrics);
        let panicking = |_: Arc<Memcached>, _: Arc<()>| async {
            if "boom".len() == 4 {
                panic!("boom");
            }
            Ok(Outcome::Done)
        };
        let result = reconcile_instrumented(panicking, memcached("a"), shared.clone()).await;
        assert!(
            matches!(&result, Err(Error::Panicked { message }) if message == "boom"),
            "{result:?}"
        );
        let count =
            |vec: &prometheus::IntCounterVec, labels: &[&str]| vec.with_label_values(labels).get();
        assert_eq!(count(&metrics.reconcile_panics_total, &["test"]), 1);
        assert_eq!(count(&metrics.reconcile_errors_total, &["test"]), 1);
        assert_eq!(count(&metrics.reconcile_total, &["test", "error"]), 1);
        assert_eq!(
            metrics
                .reconcile_time_seconds
                .with_label_values(&["test"])
                .get_sample_count(),
            1
        );
        assert_eq!(metrics.active_workers.with_label_values(&["test"]).get(), 0);
    }

    #[tokio::test]
    async fn a_terminal_error_is_counted_and_waits_for_a_change() {
        let metrics = Arc::new(Metrics::new().expect("valid metrics"));
        let shared = shared(&metrics);
        let missing = |_: Arc<Memcached>, _: Arc<()>| async {
            Err::<Outcome, _>(Error::MissingField {
                kind: "Memcached".into(),
                field: "metadata.uid",
            })
        };
        let obj = memcached("a");
        let error = reconcile_instrumented(missing, obj.clone(), shared.clone())
            .await
            .expect_err("failed");
        assert_eq!(
            metrics
                .terminal_reconcile_errors_total
                .with_label_values(&["test"])
                .get(),
            1
        );
        assert_eq!(retry_after(&key("a"), &error, &shared), None);
        assert_eq!(shared.retries.get(), 0, "not retried");
    }
}
