//! The shared driver: runs a kube [`Controller`] for a custom resource with the same metrics,
//! backoff, tracing, concurrency bound and graceful shutdown for every controller.
//!
//! The [`crate::builder::Builder`] builds the `Controller` from what a controller declares, and
//! the controller writes a reconcile function returning [`Outcome`]; [`Driver::run`] does the
//! rest:
//!
//! - each reconcile runs in a `reconcile` span with `controller`, `namespace` and `name`;
//! - `controller_runtime_reconcile_total{controller,result}`, `..._errors_total`,
//!   `..._reconcile_time_seconds` (a drop-guard timer, so a cancelled reconcile is timed too) and
//!   `..._active_workers` are recorded around it;
//! - a failure is retried with per-object exponential backoff ([`crate::backoff`]), reset on the
//!   next success, and counted in `workqueue_retries_total`;
//! - at most `max_concurrent_reconciles` run at once (never two for the same object);
//! - cancelling the shutdown token stops new reconciles and lets running ones finish.
//!
//! # How `workqueue_depth` is derived
//! kube's scheduler is internal, so the driver keeps a shadow of it: an object enters the queue
//! when a watch event triggers it (also counted in `workqueue_adds_total`) or when a requeue it
//! asked for (or a retry) falls due, and leaves it when its reconcile starts, or when it turns
//! out to be gone. The gauge is the number of such objects, refreshed on every change and every
//! second. Like controller-runtime's queue, an object is counted once however often it is
//! triggered, and a requeue counts only once due.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use prometheus::IntGauge;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::metrics::{QueueMetrics, result};
use crate::scope::{self, Namespaces, ScopedApi};
use crate::watches::{Refusal, refusal_reason};
use crate::{Error, Metrics, RunContext};

/// How long a successful reconcile waits before it runs again without any watch event: a
/// safety net against missed events (controller-runtime's `SyncPeriod`, shorter than its 10 h).
pub const RESYNC_PERIOD: Duration = Duration::from_secs(60 * 60);

/// What a successful reconcile asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing more to do until a watch event (or the periodic resync). Counted as `success`.
    Done,
    /// Run again after this delay: the reconcile is waiting for something no watch reports.
    /// Counted as `requeue_after`.
    RequeueAfter(Duration),
}

/// Runs one controller with the shared behaviour described in the module documentation.
pub struct Driver<K: Resource<DynamicType = ()> + 'static> {
    name: &'static str,
    concurrency: u16,
    debounce: Duration,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    queue: Arc<Queue<K>>,
    /// The cache of the custom resources, once [`Driver::watch_resources`] made it.
    cache: std::sync::OnceLock<kube::runtime::reflector::Store<K>>,
    /// Set when the API server refuses the custom resources' watch before its first list.
    refusal: Arc<Refusal>,
}

impl<K: Resource<DynamicType = ()> + 'static> Debug for Driver<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.name)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl<K> Driver<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// A driver for the controller `name`, with the options, metrics and shutdown of `ctx`.
    ///
    /// `max_concurrent_reconciles` of 0 is taken as 1 (as controller-runtime does): kube reads 0
    /// as "unbounded", which is never what a configuration means.
    pub fn new(name: &'static str, ctx: &RunContext) -> Self {
        let concurrency = ctx.options.max_concurrent_reconciles.max(1);
        ctx.metrics.init_controller(name, concurrency);
        let queue = Arc::new(Queue::new(ctx.metrics.queue(name)));
        Self {
            name,
            concurrency,
            debounce: ctx.options.debounce,
            metrics: ctx.metrics.clone(),
            shutdown: ctx.shutdown.clone(),
            queue,
            cache: std::sync::OnceLock::new(),
            refusal: Arc::default(),
        }
    }

    /// The watch of the custom resources themselves, as a trigger stream: every object added,
    /// or changed in a way that asks for a reconcile ([`asks_for_reconcile`]). Every change
    /// reaches the cache. Watch errors are logged here and retried with backoff by the watcher,
    /// instead of reaching the controller, which would pause every trigger.
    pub fn watch_resources(
        &self,
        client: &kube::Client,
        namespaces: &Namespaces,
        mut writer: kube::runtime::reflector::store::Writer<K>,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
    where
        K::Scope: ScopedApi,
    {
        use kube::runtime::WatchStreamExt;
        let queue = self.queue.clone();
        let name = self.name;
        let refusal = self.refusal.clone();
        let cached = writer.as_reader();
        let _ = self.cache.set(cached.clone());
        let mut listed = false;
        scope::watch(client, namespaces, &watcher::Config::default(), cached.clone())
            // `kubectl apply`'s copy of the object is never read, and would be most of what the
            // cache holds (the managed fields are not even parsed: see `scope::watch`).
            .modify(|obj: &mut K| {
                if let Some(annotations) = obj.meta_mut().annotations.as_mut() {
                    annotations.remove(LAST_APPLIED);
                }
            })
            .filter_map(move |event| {
                let trigger = match event {
                    Ok(event) => {
                        listed |= matches!(event, watcher::Event::InitDone);
                        // Compared with the cached object before the cache takes the new one.
                        let asks = match &event {
                            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                                asks_for_reconcile(&cached, obj)
                            }
                            _ => false,
                        };
                        writer.apply_watcher_event(&event);
                        match event {
                            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)
                                if asks =>
                            {
                                queue.add(crate::object_key(&obj));
                                Some(Ok(obj))
                            }
                            _ => None,
                        }
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
                        None
                    }
                };
                std::future::ready(trigger)
            })
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

    /// Counts the requests of a trigger stream (mapped from a shared watch) into the queue.
    pub fn track(
        &self,
        triggers: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> impl Stream<Item = ObjectRef<K>> + Send + 'static {
        let queue = self.queue.clone();
        triggers.inspect(move |r| queue.add(r.clone()))
    }

    /// Runs `controller` with `reconcile` until shutdown, then waits for running reconciles.
    ///
    /// # Errors
    /// None today: per-object failures are retried, and watch failures retried by the watcher.
    /// The `Result` leaves room for a failure that must stop the manager.
    pub async fn run<C, F, Fut>(
        self,
        controller: Controller<K>,
        reconcile: F,
        context: Arc<C>,
    ) -> Result<(), Error>
    where
        C: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome, Error>> + Send + 'static,
    {
        let name = self.name;
        let queue = self.queue.clone();
        let backoff = Arc::new(Backoff::<ObjectRef<K>>::default());
        let shared = Arc::new(Shared {
            name,
            context,
            metrics: self.metrics.clone(),
            backoff: backoff.clone(),
            queue: queue.clone(),
        });
        tracing::info!(
            controller = name,
            concurrency = self.concurrency,
            "controller starting"
        );
        let results = controller
            .with_config(
                controller::Config::default()
                    .concurrency(self.concurrency)
                    .debounce(self.debounce),
            )
            .graceful_shutdown_on(self.shutdown.clone().cancelled_owned())
            .run(
                move |obj, shared| reconcile_instrumented(reconcile.clone(), obj, shared),
                error_policy,
                shared,
            )
            .for_each(|res| {
                match res {
                    Ok(_) => {}
                    Err(controller::Error::ObjectNotFound(gone)) => {
                        // A trigger for an object that has been deleted meanwhile.
                        let mut key = ObjectRef::<K>::new(&gone.name);
                        key.namespace = gone.namespace.clone();
                        queue.forget(&key);
                        backoff.reset(&key);
                    }
                    // Counted and logged by the driver's reconcile wrapper and error policy.
                    Err(controller::Error::ReconcilerFailed(..)) => {}
                    Err(controller::Error::QueueError(e)) => {
                        tracing::warn!(controller = name, error = %e, "trigger stream failed");
                    }
                    Err(controller::Error::RunnerError(e)) => {
                        tracing::error!(controller = name, error = %e, "controller runner failed");
                    }
                }
                std::future::ready(())
            });
        let mut results = std::pin::pin!(results);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let cache = self.cache.get().cloned();
        let mut stopping = false;
        loop {
            tokio::select! {
                () = &mut results => break,
                _ = tick.tick() => queue.refresh(),
                () = self.shutdown.cancelled(), if !stopping => {
                    stopping = true;
                    // kube's runner holds every reconcile until the cache has its first list,
                    // and stops polling the watch once shutdown starts: stopped before then,
                    // it would wait forever. Nothing can be in flight, so return at once.
                    let synced = cache.as_ref().is_none_or(|c| {
                        futures::FutureExt::now_or_never(c.wait_until_ready()).is_some()
                    });
                    if !synced {
                        tracing::info!(controller = name, "stopped before its cache had synced");
                        break;
                    }
                }
            }
        }
        queue.clear();
        tracing::info!(controller = name, "controller stopped");
        Ok(())
    }
}

/// Whether a custom resource as the watch shows it asks for a reconcile, compared with the
/// cached one: a new object, a new spec (every spec change bumps `metadata.generation`), or its
/// deletion. A change of status alone (almost always our own write) does not: the status is
/// computed from the children, whose events trigger the reconciles that keep it current. This
/// is controller-runtime's `GenerationChangedPredicate`, which Kubebuilder projects add for the
/// same reason, without a second map of every object.
fn asks_for_reconcile<K>(cached: &Store<K>, obj: &K) -> bool
where
    K: Resource<DynamicType = ()> + Clone,
{
    let Some(old) = cached.get(&crate::object_key(obj)) else {
        return true;
    };
    let (old, new) = (old.meta(), obj.meta());
    old.uid != new.uid
        || old.generation != new.generation
        || old.deletion_timestamp != new.deletion_timestamp
}

/// The annotation where `kubectl apply` keeps the whole object as last applied.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What every reconcile of one controller shares.
struct Shared<K: Resource<DynamicType = ()> + 'static, C> {
    name: &'static str,
    context: Arc<C>,
    metrics: Arc<Metrics>,
    backoff: Arc<Backoff<ObjectRef<K>>>,
    queue: Arc<Queue<K>>,
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
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Outcome, Error>>,
{
    let controller = shared.name;
    let key = crate::object_key(obj.as_ref());
    let processing = shared.queue.start(&key);
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
        let running = std::panic::AssertUnwindSafe(reconcile(obj, shared.context.clone()));
        let outcome = running.catch_unwind().instrument(span.clone()).await;
        drop(processing);
        outcome.unwrap_or_else(|panic| {
            shared
                .metrics
                .reconcile_panics_total
                .with_label_values(&[controller])
                .inc();
            Err(Error::Panicked {
                message: panic_message(panic.as_ref()),
            })
        })
    };
    match outcome {
        Ok(outcome) => {
            shared.backoff.reset(&key);
            let (label, after) = match outcome {
                Outcome::Done => (result::SUCCESS, RESYNC_PERIOD),
                Outcome::RequeueAfter(after) => (result::REQUEUE_AFTER, after),
            };
            shared
                .metrics
                .reconcile_total
                .with_label_values(&[controller, label])
                .inc();
            if label == result::REQUEUE_AFTER {
                shared.queue.metrics.retries.inc();
            }
            shared.queue.add_after(key, after);
            span.in_scope(|| tracing::debug!(result = label, requeue_after = ?after, "reconciled"));
            Ok(Action::requeue(after))
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

fn error_policy<K, C>(obj: Arc<K>, error: &Error, shared: Arc<Shared<K, C>>) -> Action
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let key = crate::object_key(obj.as_ref());
    if error.is_terminal() {
        // A retry would fail the same way: wait for the object to change.
        shared.backoff.reset(&key);
        return Action::await_change();
    }
    let delay = shared.backoff.next_delay(key.clone());
    shared.queue.metrics.retries.inc();
    tracing::debug!(controller = shared.name, object = %key, retry_in = ?delay, "retrying with backoff");
    shared.queue.add_after(key, delay);
    Action::requeue(delay)
}

/// A shadow of the controller's queue, for the work-queue metrics (see the module
/// documentation).
struct Queue<K: Resource<DynamicType = ()> + 'static> {
    state: Mutex<QueueState<K>>,
    metrics: QueueMetrics,
}

struct QueueState<K: Resource<DynamicType = ()> + 'static> {
    /// Triggered and not yet started, with when each was first triggered.
    waiting: HashMap<ObjectRef<K>, Instant>,
    /// Asked to run again at a later time, by that time (and a sequence number, for ties).
    delayed: BTreeMap<(Instant, u64), ObjectRef<K>>,
    /// Where each delayed object sits in `delayed`.
    delayed_at: HashMap<ObjectRef<K>, (Instant, u64)>,
    /// Past their time and not waiting: queued like the waiting ones, since their time.
    due: HashMap<ObjectRef<K>, Instant>,
    /// Reconciling now, since when (each reconcile has a number: a key is reconciled once at a
    /// time, but its guard may outlive the next start by a moment).
    processing: HashMap<u64, Instant>,
    sequence: u64,
}

impl<K: Resource<DynamicType = ()> + 'static> QueueState<K> {
    /// Every operation is proportional to what it changes, not to the queue: with thousands of
    /// objects each holding a resync time, a scan per trigger was a visible share of the CPU.
    fn depth(&self) -> usize {
        self.waiting.len() + self.due.len()
    }

    /// Moves the delayed objects whose time has come to `due`.
    fn advance(&mut self, now: Instant) {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let at = entry.key().0;
            let key = entry.remove();
            self.delayed_at.remove(&key);
            if !self.waiting.contains_key(&key) {
                self.due.insert(key, at);
            }
        }
    }

    fn undelay(&mut self, key: &ObjectRef<K>) {
        if let Some(at) = self.delayed_at.remove(key) {
            self.delayed.remove(&at);
        }
        self.due.remove(key);
    }
}

impl<K: Resource<DynamicType = ()> + 'static> Queue<K> {
    fn new(metrics: QueueMetrics) -> Self {
        let state = QueueState {
            waiting: HashMap::new(),
            delayed: BTreeMap::new(),
            delayed_at: HashMap::new(),
            due: HashMap::new(),
            processing: HashMap::new(),
            sequence: 0,
        };
        Self {
            state: Mutex::new(state),
            metrics,
        }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut QueueState<K>) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = f(&mut state);
        state.advance(Instant::now());
        self.metrics
            .depth
            .set(i64::try_from(state.depth()).unwrap_or(i64::MAX));
        out
    }

    fn add(&self, key: ObjectRef<K>) {
        self.metrics.adds.inc();
        self.with_state(|s| {
            let since = s.due.remove(&key).unwrap_or_else(Instant::now);
            s.waiting.entry(key).or_insert(since);
        });
    }

    fn add_after(&self, key: ObjectRef<K>, after: Duration) {
        let now = Instant::now();
        let at = now
            .checked_add(after)
            .unwrap_or_else(|| now + RESYNC_PERIOD);
        self.with_state(|s| {
            s.undelay(&key);
            s.sequence += 1;
            let slot = (at, s.sequence);
            s.delayed.insert(slot, key.clone());
            s.delayed_at.insert(key, slot);
        });
    }

    /// The reconcile of `key` starts: it leaves the queue (its time there is observed) and
    /// counts as processing until the returned guard drops (its time is observed then).
    fn start(self: &Arc<Self>, key: &ObjectRef<K>) -> Processing<K> {
        let now = Instant::now();
        let number = self.with_state(|s| {
            let queued = [s.waiting.remove(key), s.due.remove(key)]
                .into_iter()
                .flatten()
                .min();
            s.undelay(key);
            if let Some(since) = queued {
                self.metrics
                    .queue_duration
                    .observe(now.saturating_duration_since(since).as_secs_f64());
            }
            s.sequence += 1;
            s.processing.insert(s.sequence, now);
            s.sequence
        });
        Processing {
            queue: self.clone(),
            number,
            since: now,
        }
    }

    fn forget(&self, key: &ObjectRef<K>) {
        self.with_state(|s| {
            s.waiting.remove(key);
            s.undelay(key);
        });
    }

    /// Refreshes the depth, and the gauges of the reconciles in progress.
    fn refresh(&self) {
        let now = Instant::now();
        let running: Vec<Duration> = self.with_state(|s| {
            s.processing
                .values()
                .map(|since| now.saturating_duration_since(*since))
                .collect()
        });
        let total: Duration = running.iter().sum();
        let longest = running.iter().max().copied().unwrap_or_default();
        self.metrics.unfinished_work.set(total.as_secs_f64());
        self.metrics.longest_running.set(longest.as_secs_f64());
    }

    fn clear(&self) {
        self.with_state(|s| {
            s.waiting.clear();
            s.delayed.clear();
            s.delayed_at.clear();
            s.due.clear();
        });
        self.refresh();
    }

    #[cfg(test)]
    fn depth(&self) -> i64 {
        self.metrics.depth.get()
    }
}

/// A reconcile in progress, until dropped (however the reconcile ends).
struct Processing<K: Resource<DynamicType = ()> + 'static> {
    queue: Arc<Queue<K>>,
    number: u64,
    since: Instant,
}

impl<K: Resource<DynamicType = ()> + 'static> Drop for Processing<K> {
    fn drop(&mut self) {
        self.queue
            .metrics
            .work_duration
            .observe(self.since.elapsed().as_secs_f64());
        self.queue.with_state(|s| s.processing.remove(&self.number));
    }
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
    use apis::Memcached;

    fn queue() -> Arc<Queue<Memcached>> {
        let metrics = Metrics::new().expect("valid metrics");
        Arc::new(Queue::new(metrics.queue("test")))
    }

    fn key(name: &str) -> ObjectRef<Memcached> {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn only_new_objects_specs_and_deletions_ask_for_a_reconcile() {
        let (cached, mut writer) = kube::runtime::reflector::store::<Memcached>();
        let mut mc = Memcached::new(
            "a",
            apis::MemcachedSpec {
                size: 1,
                image: "memcached".into(),
                ..Default::default()
            },
        );
        mc.metadata.namespace = Some("ns".into());
        mc.metadata.uid = Some("u1".into());
        mc.metadata.generation = Some(1);
        assert!(asks_for_reconcile(&cached, &mc), "a new object");
        writer.apply_watcher_event(&watcher::Event::Apply(mc.clone()));

        let mut status_only = mc.clone();
        status_only.status = Some(apis::MemcachedStatus::default());
        status_only.metadata.resource_version = Some("2".into());
        assert!(!asks_for_reconcile(&cached, &status_only), "status alone");

        let mut respec = mc.clone();
        respec.spec.size = 2;
        respec.metadata.generation = Some(2);
        assert!(asks_for_reconcile(&cached, &respec), "a new spec");

        let mut deleted = mc.clone();
        deleted.metadata.deletion_timestamp = Some(crate::status::now());
        assert!(asks_for_reconcile(&cached, &deleted), "deletion");

        let mut recreated = mc.clone();
        recreated.metadata.uid = Some("u2".into());
        assert!(
            asks_for_reconcile(&cached, &recreated),
            "a new object, same name"
        );
    }

    #[test]
    fn depth_counts_waiting_objects_once_and_due_requeues() {
        let q = queue();
        q.add(key("a"));
        q.add(key("a"));
        q.add(key("b"));
        assert_eq!(
            q.depth(),
            2,
            "an object is queued once however often it is triggered"
        );
        assert_eq!(q.metrics.adds.get(), 3);
        drop(q.start(&key("a")));
        assert_eq!(q.depth(), 1);
        q.add_after(key("a"), Duration::from_secs(3600));
        assert_eq!(q.depth(), 1, "a requeue counts only once due");
        q.add_after(key("d"), Duration::ZERO);
        assert_eq!(q.depth(), 2, "a due requeue counts");
        q.add(key("d"));
        assert_eq!(q.depth(), 2, "due and triggered is still one item");
        q.forget(&key("d"));
        drop(q.start(&key("b")));
        assert_eq!(q.depth(), 0);
        q.add(key("c"));
        q.clear();
        assert_eq!(q.depth(), 0);
    }

    #[test]
    fn a_requeue_counts_once_its_time_has_come() {
        let q = queue();
        q.add_after(key("a"), Duration::from_millis(1));
        q.add_after(key("b"), Duration::from_secs(3600));
        std::thread::sleep(Duration::from_millis(5));
        q.refresh();
        assert_eq!(q.depth(), 1, "a is due, b is not");
        q.add_after(key("a"), Duration::from_secs(3600));
        assert_eq!(q.depth(), 0, "a new time replaces the old one");
        q.add(key("b"));
        drop(q.start(&key("b")));
        q.refresh();
        assert_eq!(q.depth(), 0, "a started object leaves no requeue behind");
    }

    #[tokio::test(start_paused = true)]
    async fn time_in_the_queue_and_at_work_is_observed() {
        let q = queue();
        q.add(key("a"));
        tokio::time::advance(Duration::from_secs(2)).await;
        q.add(key("a"));
        let a = q.start(&key("a"));
        let waited = &q.metrics.queue_duration;
        assert_eq!(waited.get_sample_count(), 1);
        assert!(
            (waited.get_sample_sum() - 2.0).abs() < 0.01,
            "from the first trigger: {}",
            waited.get_sample_sum()
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        q.add(key("b"));
        let b = q.start(&key("b"));
        tokio::time::advance(Duration::from_secs(1)).await;
        q.refresh();
        assert!((q.metrics.unfinished_work.get() - 5.0).abs() < 0.01);
        assert!((q.metrics.longest_running.get() - 4.0).abs() < 0.01);
        drop(a);
        let worked = &q.metrics.work_duration;
        assert_eq!(worked.get_sample_count(), 1);
        assert!((worked.get_sample_sum() - 4.0).abs() < 0.01);
        q.refresh();
        assert!((q.metrics.longest_running.get() - 1.0).abs() < 0.01);
        drop(b);
        q.refresh();
        assert_eq!(q.metrics.unfinished_work.get(), 0.0);
        assert_eq!(q.metrics.longest_running.get(), 0.0);
    }

    fn shared(metrics: &Arc<Metrics>) -> Arc<Shared<Memcached, ()>> {
        Arc::new(Shared {
            name: "test",
            context: Arc::new(()),
            metrics: metrics.clone(),
            backoff: Arc::default(),
            queue: Arc::new(Queue::new(metrics.queue("test"))),
        })
    }

    fn memcached(name: &str) -> Arc<Memcached> {
        let mut mc = Memcached::new(
            name,
            apis::MemcachedSpec {
                size: 1,
                image: "memcached".into(),
                ..Default::default()
            },
        );
        mc.metadata.namespace = Some("ns".into());
        Arc::new(mc)
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
        assert_eq!(shared.queue.metrics.work_duration.get_sample_count(), 1);
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
        assert_eq!(
            error_policy(obj, &error, shared.clone()),
            Action::await_change()
        );
        assert_eq!(shared.queue.metrics.retries.get(), 0, "not retried");
    }
}
