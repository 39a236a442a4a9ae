//! Reconcile and work-queue metrics, with controller-runtime's names.
//!
//! Names, labels and histogram buckets follow controller-runtime
//! (`pkg/internal/controller/metrics` and `pkg/metrics/workqueue.go`) so dashboards and alerts
//! written for Kubebuilder operators work unchanged. They are recorded by the shared driver for
//! every controller, never by hand in a reconcile.

use crate::priority::Priority;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// The `result` label values of `controller_runtime_reconcile_total`, as in controller-runtime.
pub mod result {
    /// The reconcile succeeded and asked for nothing but the periodic resync.
    pub const SUCCESS: &str = "success";
    /// The reconcile failed; the object is retried with backoff.
    pub const ERROR: &str = "error";
    /// The reconcile asked to run again at once (rate-limited). Not used by these controllers
    /// (they never busy-requeue) but exported so the series exists, as in controller-runtime.
    pub const REQUEUE: &str = "requeue";
    /// The reconcile succeeded and asked to run again after a delay (it is waiting on something).
    pub const REQUEUE_AFTER: &str = "requeue_after";
    /// Every value, for initialising the series at zero.
    pub const ALL: [&str; 4] = [SUCCESS, ERROR, REQUEUE, REQUEUE_AFTER];
}

/// Metrics every controller records through the shared driver.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// `controller_runtime_reconcile_total{controller,result}`.
    pub reconcile_total: IntCounterVec,
    /// `controller_runtime_reconcile_errors_total{controller}`.
    pub reconcile_errors_total: IntCounterVec,
    /// `controller_runtime_reconcile_time_seconds{controller}`.
    pub reconcile_time_seconds: HistogramVec,
    /// `controller_runtime_active_workers{controller}`: reconciles running now.
    pub active_workers: IntGaugeVec,
    /// `controller_runtime_max_concurrent_reconciles{controller}`.
    pub max_concurrent_reconciles: IntGaugeVec,
    /// `controller_runtime_reconcile_panics_total{controller}`: reconciles that panicked (each
    /// also counts as an error and is retried).
    pub reconcile_panics_total: IntCounterVec,
    /// `controller_runtime_reconcile_timeouts_total{controller}`: reconciles cancelled for
    /// running past the reconcile timeout (each also counts as an error and is retried).
    pub reconcile_timeouts_total: IntCounterVec,
    /// `controller_runtime_terminal_reconcile_errors_total{controller}`: failures that a retry
    /// cannot fix ([`crate::Error::is_terminal`]); the object waits for its next change.
    pub terminal_reconcile_errors_total: IntCounterVec,
    /// `workqueue_depth{name,controller,priority}`: objects waiting for a reconcile, by
    /// priority as controller-runtime's priority queue labels it: `0` for live changes,
    /// `-100` for the catch-up of a list, a requeue or a retry (see [`crate::workqueue`]).
    pub workqueue_depth: IntGaugeVec,
    /// `workqueue_adds_total{name,controller}`: reconcile requests from watch events.
    pub workqueue_adds_total: IntCounterVec,
    /// `workqueue_retries_total{name,controller}`: objects queued again after a delay (a retry
    /// with backoff or a requested requeue).
    pub workqueue_retries_total: IntCounterVec,
    /// `workqueue_queue_duration_seconds{name,controller}`: from entering the queue to the start
    /// of its reconcile.
    pub workqueue_queue_duration_seconds: HistogramVec,
    /// `workqueue_work_duration_seconds{name,controller}`: how long each reconcile took.
    pub workqueue_work_duration_seconds: HistogramVec,
    /// `workqueue_unfinished_work_seconds{name,controller}`: the time the running reconciles
    /// have taken so far, together.
    pub workqueue_unfinished_work_seconds: GaugeVec,
    /// `workqueue_longest_running_processor_seconds{name,controller}`: how long the oldest
    /// running reconcile has been running.
    pub workqueue_longest_running_processor_seconds: GaugeVec,
    /// `operator_manager_reconcile_errors_total{controller,kind}`: failures by
    /// [`crate::Error::metric_label`], a finer breakdown than controller-runtime's counter.
    pub reconcile_errors_by_kind: IntCounterVec,
    /// `operator_manager_reconcile_triggers_total{controller,source}`: watch events that asked
    /// for a reconcile, by the kind of object that changed (`source`), before the queue folds
    /// them: what makes a controller reconcile as often as it does.
    pub reconcile_triggers: IntCounterVec,
    /// `operator_manager_reconcile_cache_waits_total{controller,outcome}`: reconciles held
    /// back because a cache had not yet shown the controller's own last write for the object
    /// (see [`crate::driver`]): `caught_up` when the cache then showed it, `behind` when the
    /// reconcile started without it after [`crate::driver::CATCH_UP_WAIT`]. `behind` is the
    /// count of reconciles that read a cache older than their own write; it should stay 0.
    pub reconcile_cache_waits: IntCounterVec,
    /// `operator_manager_shard_objects{controller}`: in a sharded manager, the cached objects
    /// of the slots this replica owns, that is, the objects it reconciles (see
    /// [`crate::shards`]); absent when not sharded.
    pub shard_objects: IntGaugeVec,
}

/// The outcomes of `operator_manager_reconcile_cache_waits_total`.
pub mod cache_wait {
    /// The cache showed the write, and the reconcile started.
    pub const CAUGHT_UP: &str = "caught_up";
    /// The reconcile started without the cache showing the write.
    pub const BEHIND: &str = "behind";
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    ///
    /// # Errors
    /// When a metric of the same name is already registered.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self::new()?;
        registry.register(Box::new(metrics.reconcile_total.clone()))?;
        registry.register(Box::new(metrics.reconcile_errors_total.clone()))?;
        registry.register(Box::new(metrics.reconcile_time_seconds.clone()))?;
        registry.register(Box::new(metrics.active_workers.clone()))?;
        registry.register(Box::new(metrics.max_concurrent_reconciles.clone()))?;
        registry.register(Box::new(metrics.reconcile_panics_total.clone()))?;
        registry.register(Box::new(metrics.reconcile_timeouts_total.clone()))?;
        registry.register(Box::new(metrics.terminal_reconcile_errors_total.clone()))?;
        registry.register(Box::new(metrics.workqueue_depth.clone()))?;
        registry.register(Box::new(metrics.workqueue_adds_total.clone()))?;
        registry.register(Box::new(metrics.workqueue_retries_total.clone()))?;
        registry.register(Box::new(metrics.workqueue_queue_duration_seconds.clone()))?;
        registry.register(Box::new(metrics.workqueue_work_duration_seconds.clone()))?;
        registry.register(Box::new(metrics.workqueue_unfinished_work_seconds.clone()))?;
        registry.register(Box::new(
            metrics.workqueue_longest_running_processor_seconds.clone(),
        ))?;
        registry.register(Box::new(metrics.reconcile_errors_by_kind.clone()))?;
        registry.register(Box::new(metrics.reconcile_triggers.clone()))?;
        registry.register(Box::new(metrics.reconcile_cache_waits.clone()))?;
        registry.register(Box::new(metrics.shard_objects.clone()))?;
        Ok(metrics)
    }

    /// Creates the metrics without registering them (tests, or a caller that registers itself).
    ///
    /// # Errors
    /// Only on an invalid metric definition, which would be a bug here.
    pub fn new() -> Result<Self, prometheus::Error> {
        // controller-runtime's reconcile-time buckets: 5 ms to about 60 s, then coarse steps.
        let mut buckets = vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4,
        ];
        buckets.extend([
            0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0,
        ]);
        buckets.extend([
            3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0,
        ]);
        buckets.extend([40.0, 50.0, 60.0]);
        Ok(Self {
            reconcile_total: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_total",
                    "Total number of reconciliations per controller",
                ),
                &["controller", "result"],
            )?,
            reconcile_errors_total: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_errors_total",
                    "Total number of reconciliation errors per controller",
                ),
                &["controller"],
            )?,
            reconcile_time_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "controller_runtime_reconcile_time_seconds",
                    "Length of time per reconciliation per controller",
                )
                .buckets(buckets),
                &["controller"],
            )?,
            active_workers: IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_active_workers",
                    "Number of currently used workers per controller",
                ),
                &["controller"],
            )?,
            max_concurrent_reconciles: IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_max_concurrent_reconciles",
                    "Maximum number of concurrent reconciles per controller",
                ),
                &["controller"],
            )?,
            reconcile_panics_total: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_panics_total",
                    "Total number of reconciliation panics per controller",
                ),
                &["controller"],
            )?,
            reconcile_timeouts_total: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_timeouts_total",
                    "Total number of reconciliation timeouts per controller",
                ),
                &["controller"],
            )?,
            terminal_reconcile_errors_total: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_terminal_reconcile_errors_total",
                    "Total number of terminal reconciliation errors per controller",
                ),
                &["controller"],
            )?,
            workqueue_depth: IntGaugeVec::new(
                Opts::new(
                    "workqueue_depth",
                    "Current depth of workqueue by workqueue and priority",
                ),
                &["name", "controller", "priority"],
            )?,
            workqueue_adds_total: IntCounterVec::new(
                Opts::new(
                    "workqueue_adds_total",
                    "Total number of adds handled by workqueue",
                ),
                &QUEUE_LABELS,
            )?,
            workqueue_retries_total: IntCounterVec::new(
                Opts::new(
                    "workqueue_retries_total",
                    "Total number of items added to the workqueue with a non-zero delay (rate-limited requeues, explicit RequeueAfter or AddAfter calls)",
                ),
                &QUEUE_LABELS,
            )?,
            workqueue_queue_duration_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_queue_duration_seconds",
                    "How long in seconds an item stays in workqueue before being requested",
                )
                .buckets(queue_buckets()?),
                &QUEUE_LABELS,
            )?,
            workqueue_work_duration_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_work_duration_seconds",
                    "How long in seconds processing an item from workqueue takes.",
                )
                .buckets(queue_buckets()?),
                &QUEUE_LABELS,
            )?,
            workqueue_unfinished_work_seconds: GaugeVec::new(
                Opts::new(
                    "workqueue_unfinished_work_seconds",
                    "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
                ),
                &QUEUE_LABELS,
            )?,
            workqueue_longest_running_processor_seconds: GaugeVec::new(
                Opts::new(
                    "workqueue_longest_running_processor_seconds",
                    "How many seconds has the longest running processor for workqueue been running.",
                ),
                &QUEUE_LABELS,
            )?,
            reconcile_errors_by_kind: IntCounterVec::new(
                Opts::new(
                    "operator_manager_reconcile_errors_total",
                    "Reconciliation errors per controller and kind of error",
                ),
                &["controller", "kind"],
            )?,
            reconcile_triggers: IntCounterVec::new(
                Opts::new(
                    "operator_manager_reconcile_triggers_total",
                    "Watch events that asked for a reconcile, per controller and kind of object that changed",
                ),
                &["controller", "source"],
            )?,
            reconcile_cache_waits: IntCounterVec::new(
                Opts::new(
                    "operator_manager_reconcile_cache_waits_total",
                    "Reconciles held back until a cache showed the controller's own last write, per controller and outcome",
                ),
                &["controller", "outcome"],
            )?,
            shard_objects: IntGaugeVec::new(
                Opts::new(
                    "operator_manager_shard_objects",
                    "Objects of the shards this replica owns, per controller",
                ),
                &["controller"],
            )?,
        })
    }

    /// Creates every series of `controller` at zero, so dashboards see it before the first
    /// reconcile, and records its concurrency bound.
    pub fn init_controller(&self, controller: &str, max_concurrent_reconciles: u16) {
        for result in result::ALL {
            self.reconcile_total
                .with_label_values(&[controller, result]);
        }
        self.reconcile_errors_total.with_label_values(&[controller]);
        self.reconcile_time_seconds.with_label_values(&[controller]);
        self.active_workers.with_label_values(&[controller]).set(0);
        self.max_concurrent_reconciles
            .with_label_values(&[controller])
            .set(i64::from(max_concurrent_reconciles));
        self.reconcile_panics_total.with_label_values(&[controller]);
        self.reconcile_timeouts_total
            .with_label_values(&[controller]);
        self.terminal_reconcile_errors_total
            .with_label_values(&[controller]);
        for outcome in [cache_wait::CAUGHT_UP, cache_wait::BEHIND] {
            self.reconcile_cache_waits
                .with_label_values(&[controller, outcome]);
        }
        let queue = self.queue(controller);
        queue.depth.live.set(0);
        queue.depth.catch_up.set(0);
        self.workqueue_retries_total
            .with_label_values(&[controller, controller]);
    }

    /// The work-queue series of `controller` (its queue is named after it, as in
    /// controller-runtime).
    pub fn queue(&self, controller: &str) -> QueueMetrics {
        let labels = [controller, controller];
        QueueMetrics {
            depth: DepthGauges {
                live: self.workqueue_depth.with_label_values(&[
                    controller,
                    controller,
                    Priority::Live.label(),
                ]),
                catch_up: self.workqueue_depth.with_label_values(&[
                    controller,
                    controller,
                    Priority::CatchUp.label(),
                ]),
            },
            adds: self.workqueue_adds_total.with_label_values(&labels),
            retries: self.workqueue_retries_total.with_label_values(&labels),
            queue_duration: self
                .workqueue_queue_duration_seconds
                .with_label_values(&labels),
            work_duration: self
                .workqueue_work_duration_seconds
                .with_label_values(&labels),
            unfinished_work: self
                .workqueue_unfinished_work_seconds
                .with_label_values(&labels),
            longest_running: self
                .workqueue_longest_running_processor_seconds
                .with_label_values(&labels),
        }
    }
}

/// The labels of controller-runtime's work-queue series: the queue's name and its controller
/// (the same value).
const QUEUE_LABELS: [&str; 2] = ["name", "controller"];

/// client-go's work-queue buckets: 10 ns to 1000 s, ten times apart.
fn queue_buckets() -> Result<Vec<f64>, prometheus::Error> {
    prometheus::exponential_buckets(10e-9, 10.0, 12)
}

/// One controller's `workqueue_depth`, one series per priority.
#[derive(Clone, Debug)]
pub struct DepthGauges {
    /// Objects waiting with a live change (`priority="0"`).
    pub live: IntGauge,
    /// Objects waiting only to catch up (`priority="-100"`).
    pub catch_up: IntGauge,
}

impl DepthGauges {
    /// Objects waiting, whatever their priority.
    pub fn get(&self) -> i64 {
        self.live.get() + self.catch_up.get()
    }

    /// The series of `priority`.
    pub fn of(&self, priority: Priority) -> &IntGauge {
        match priority {
            Priority::Live => &self.live,
            Priority::CatchUp => &self.catch_up,
        }
    }
}

/// One controller's work-queue series.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    /// `workqueue_depth`, by priority.
    pub depth: DepthGauges,
    /// `workqueue_adds_total`.
    pub adds: IntCounter,
    /// `workqueue_retries_total`.
    pub retries: IntCounter,
    /// `workqueue_queue_duration_seconds`.
    pub queue_duration: Histogram,
    /// `workqueue_work_duration_seconds`.
    pub work_duration: Histogram,
    /// `workqueue_unfinished_work_seconds`.
    pub unfinished_work: Gauge,
    /// `workqueue_longest_running_processor_seconds`.
    pub longest_running: Gauge,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_controller_runtime_names() -> Result<(), prometheus::Error> {
        let registry = Registry::new();
        let metrics = Metrics::register(&registry)?;
        metrics.init_controller("memcached", 4);
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        for name in [
            "controller_runtime_reconcile_total",
            "controller_runtime_reconcile_errors_total",
            "controller_runtime_reconcile_time_seconds",
            "controller_runtime_active_workers",
            "controller_runtime_max_concurrent_reconciles",
            "workqueue_depth",
            "workqueue_adds_total",
            "workqueue_retries_total",
        ] {
            assert!(
                names.iter().any(|n| n == name),
                "{name} missing from {names:?}"
            );
        }
        assert_eq!(
            metrics
                .max_concurrent_reconciles
                .with_label_values(&["memcached"])
                .get(),
            4
        );
        assert!(
            Metrics::register(&registry).is_err(),
            "registering twice fails"
        );
        Ok(())
    }
}
