//! The manager exports controller-runtime's metrics with their exact names, types, labels and
//! buckets, so Kubebuilder's Grafana dashboards and Operator SDK's alerts work unchanged.
//!
//! The list below is taken from controller-runtime v0.24.1: `pkg/internal/controller/metrics`,
//! `pkg/internal/metrics/workqueue.go`, `pkg/metrics/client_go_adapter.go`,
//! `pkg/metrics/leaderelection.go`, `pkg/webhook/internal/metrics` and
//! `pkg/certwatcher/metrics`. One of its series is not exported, on purpose:
//! `leader_election_slowpath_total` (the elector here has no fast path to fall back from).

use manager::client_metrics::RequestMetrics;
use manager::telemetry;
use prometheus::proto::MetricType;

/// controller-runtime v0.24.1's reconcile-time buckets.
const RECONCILE_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// client-go's work-queue buckets, and controller-runtime's webhook latency buckets:
/// `prometheus.ExponentialBuckets(10e-9, 10, 12)`.
const QUEUE_BUCKETS: [f64; 12] = [
    1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0,
];

/// Name, type and label names (sorted) of each series, as controller-runtime defines it.
const CONTROLLER_RUNTIME: &[(&str, MetricType, &[&str])] = &[
    (
        "controller_runtime_reconcile_total",
        MetricType::COUNTER,
        &["controller", "result"],
    ),
    (
        "controller_runtime_reconcile_errors_total",
        MetricType::COUNTER,
        &["controller"],
    ),
    (
        "controller_runtime_terminal_reconcile_errors_total",
        MetricType::COUNTER,
        &["controller"],
    ),
    (
        "controller_runtime_reconcile_panics_total",
        MetricType::COUNTER,
        &["controller"],
    ),
    (
        "controller_runtime_reconcile_timeouts_total",
        MetricType::COUNTER,
        &["controller"],
    ),
    (
        "controller_runtime_reconcile_time_seconds",
        MetricType::HISTOGRAM,
        &["controller"],
    ),
    (
        "controller_runtime_max_concurrent_reconciles",
        MetricType::GAUGE,
        &["controller"],
    ),
    (
        "controller_runtime_active_workers",
        MetricType::GAUGE,
        &["controller"],
    ),
    (
        "workqueue_depth",
        MetricType::GAUGE,
        &["controller", "name", "priority"],
    ),
    (
        "workqueue_adds_total",
        MetricType::COUNTER,
        &["controller", "name"],
    ),
    (
        "workqueue_queue_duration_seconds",
        MetricType::HISTOGRAM,
        &["controller", "name"],
    ),
    (
        "workqueue_work_duration_seconds",
        MetricType::HISTOGRAM,
        &["controller", "name"],
    ),
    (
        "workqueue_unfinished_work_seconds",
        MetricType::GAUGE,
        &["controller", "name"],
    ),
    (
        "workqueue_longest_running_processor_seconds",
        MetricType::GAUGE,
        &["controller", "name"],
    ),
    (
        "workqueue_retries_total",
        MetricType::COUNTER,
        &["controller", "name"],
    ),
    (
        "rest_client_requests_total",
        MetricType::COUNTER,
        &["code", "host", "method"],
    ),
    (
        "leader_election_master_status",
        MetricType::GAUGE,
        &["name"],
    ),
    (
        "controller_runtime_webhook_requests_total",
        MetricType::COUNTER,
        &["code", "webhook"],
    ),
    (
        "controller_runtime_webhook_latency_seconds",
        MetricType::HISTOGRAM,
        &["webhook"],
    ),
    (
        "controller_runtime_webhook_requests_in_flight",
        MetricType::GAUGE,
        &["webhook"],
    ),
    (
        "certwatcher_read_certificate_total",
        MetricType::COUNTER,
        &[],
    ),
    (
        "certwatcher_read_certificate_errors_total",
        MetricType::COUNTER,
        &[],
    ),
];

/// An API server that answers every request with 200.
struct Answers;

impl tower::Service<http::Request<()>> for Answers {
    type Response = http::Response<()>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<http::Response<()>, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(())))
    }
}

/// The registry the manager serves, with one controller's series and one request recorded.
fn manager_registry() -> prometheus::Registry {
    let registry = telemetry::registry().expect("registry");
    let metrics = kube_operator_runtime::Metrics::register(&registry).expect("controller metrics");
    metrics.init_controller("memcached", 4);
    telemetry::leader_gauge(&registry)
        .expect("leader gauge")
        .with_label_values(&[concat!(product::name!(), "-leader")])
        .set(1);
    manager::tls::CertReads::register(&registry).expect("certificate reads");
    manager::webhook_metrics::WebhookMetrics::register(&registry)
        .expect("webhook metrics")
        .init("/validate-cache-v1-memcached");
    let requests = RequestMetrics::register(&registry, "127.0.0.1:6443").expect("client metrics");
    let mut client = tower::Layer::layer(&requests, Answers);
    let request = http::Request::builder().body(()).expect("request");
    futures::executor::block_on(tower::Service::call(&mut client, request)).expect("answered");
    registry
}

#[test]
fn every_controller_runtime_series_has_its_name_type_and_labels() {
    let families = manager_registry().gather();
    let mut problems = Vec::new();
    for (name, kind, labels) in CONTROLLER_RUNTIME {
        let Some(family) = families.iter().find(|f| f.name() == *name) else {
            problems.push(format!("{name}: missing"));
            continue;
        };
        if family.get_field_type() != *kind {
            problems.push(format!(
                "{name}: a {:?}, not a {kind:?}",
                family.get_field_type()
            ));
        }
        for metric in family.get_metric() {
            let mut ours: Vec<&str> = metric.get_label().iter().map(|l| l.name()).collect();
            ours.sort_unstable();
            if ours != *labels {
                problems.push(format!("{name}: labels {ours:?}, not {labels:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn histograms_have_controller_runtimes_buckets() {
    let families = manager_registry().gather();
    let buckets = |name: &str| -> Vec<f64> {
        let family = families
            .iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("{name} is exported"));
        family.get_metric()[0]
            .get_histogram()
            .get_bucket()
            .iter()
            .map(|b| b.upper_bound())
            .collect()
    };
    assert_eq!(
        buckets("controller_runtime_reconcile_time_seconds"),
        RECONCILE_BUCKETS
    );
    for name in [
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
        "controller_runtime_webhook_latency_seconds",
    ] {
        let ours = buckets(name);
        assert_eq!(ours.len(), QUEUE_BUCKETS.len(), "{name}");
        for (ours, theirs) in ours.iter().zip(QUEUE_BUCKETS) {
            assert!(
                (ours / theirs - 1.0).abs() < 1e-9,
                "{name}: {ours} vs {theirs}"
            );
        }
    }
}
