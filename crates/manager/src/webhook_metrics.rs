//! controller-runtime's webhook metrics, with its names, labels and buckets, so that dashboards
//! and alerts written for a Kubebuilder project's webhooks work unchanged:
//! `controller_runtime_webhook_requests_total{webhook,code}`,
//! `controller_runtime_webhook_latency_seconds{webhook}` and
//! `controller_runtime_webhook_requests_in_flight{webhook}`. The `webhook` label is the path the
//! webhook is served on; a request for any other path is counted nowhere, so what a client sends
//! cannot add series.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::error::Error;

/// The webhook series of one manager.
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    requests: IntCounterVec,
    latency: HistogramVec,
    in_flight: IntGaugeVec,
}

impl WebhookMetrics {
    /// Creates the series and registers them with `registry`.
    ///
    /// # Errors
    /// [`Error::Metrics`] when registration fails.
    pub fn register(registry: &Registry) -> Result<Self, Error> {
        let metrics = Self {
            requests: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_webhook_requests_total",
                    "Total number of admission requests by HTTP status code.",
                ),
                &["webhook", "code"],
            )?,
            // controller-runtime's `prometheus.ExponentialBuckets(10e-9, 10, 12)`.
            latency: HistogramVec::new(
                HistogramOpts::new(
                    "controller_runtime_webhook_latency_seconds",
                    "Histogram of the latency of processing admission requests",
                )
                .buckets(prometheus::exponential_buckets(1e-8, 10.0, 12)?),
                &["webhook"],
            )?,
            in_flight: IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_webhook_requests_in_flight",
                    "Current number of admission requests being served.",
                ),
                &["webhook"],
            )?,
        };
        registry.register(Box::new(metrics.requests.clone()))?;
        registry.register(Box::new(metrics.latency.clone()))?;
        registry.register(Box::new(metrics.in_flight.clone()))?;
        Ok(metrics)
    }

    /// Creates the series of the webhook served on `path` at zero, with the codes
    /// controller-runtime starts with (200 and 500).
    pub fn init(&self, path: &str) {
        for code in ["200", "500"] {
            self.requests.with_label_values(&[path, code]);
        }
        self.latency.with_label_values(&[path]);
        self.in_flight.with_label_values(&[path]).set(0);
    }
}

/// Counts one request in flight while it lives, however its handler ends.
struct InFlight(IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The middleware of every webhook route: counts the request, its answer's code and how long
/// it took, by the route's path.
pub async fn instrument(
    State(metrics): State<WebhookMetrics>,
    path: MatchedPath,
    request: Request,
    next: Next,
) -> Response {
    let path = path.as_str();
    let gauge = metrics.in_flight.with_label_values(&[path]);
    gauge.inc();
    let _in_flight = InFlight(gauge);
    let started = Instant::now();
    let response = next.run(request).await;
    (metrics.latency.with_label_values(&[path])).observe(started.elapsed().as_secs_f64());
    let code = response.status();
    (metrics.requests.with_label_values(&[path, code.as_str()])).inc();
    response
}
