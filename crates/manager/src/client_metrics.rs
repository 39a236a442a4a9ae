//! The metrics of the manager's own requests to the API server, as client-go reports them for
//! controller-runtime: `rest_client_requests_total{code,method,host}` and
//! `rest_client_request_duration_seconds{verb,host}` (Kubernetes' latency histogram, to the
//! response headers: a watch counts until it is established, not for as long as it lasts).
//!
//! [`RequestMetrics`] is a tower layer on every client the manager builds, so every request
//! counts: the controllers', the Events', leader election's.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use tokio::time::Instant;

use crate::Error;

/// Kubernetes' buckets for `rest_client_request_duration_seconds`.
const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The `code` of a request that got no response (client-go's value).
const NO_RESPONSE: &str = "<error>";

/// The request metrics, and a layer that records them for requests to `host`.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    requests: IntCounterVec,
    latency: HistogramVec,
    host: Arc<str>,
}

impl RequestMetrics {
    /// Registers the metrics in `registry`; requests are labelled with `host` (the API server's
    /// `host:port`, as client-go labels them).
    ///
    /// # Errors
    /// [`Error::Metrics`] when registration fails.
    pub fn register(registry: &Registry, host: &str) -> Result<Self, Error> {
        let requests = IntCounterVec::new(
            Opts::new(
                "rest_client_requests_total",
                "Number of HTTP requests, partitioned by status code, method, and host.",
            ),
            &["code", "method", "host"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "rest_client_request_duration_seconds",
                "Request latency in seconds. Broken down by verb, and host.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["verb", "host"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        Ok(Self {
            requests,
            latency,
            host: host.into(),
        })
    }

    /// The API server's `host:port` in `url`, as client-go labels its requests.
    pub fn host_of(url: &http::Uri) -> String {
        url.authority().map(ToString::to_string).unwrap_or_default()
    }
}

impl<S> tower::Layer<S> for RequestMetrics {
    type Service = Measured<S>;

    fn layer(&self, inner: S) -> Measured<S> {
        Measured {
            inner,
            metrics: self.clone(),
        }
    }
}

/// A client service whose requests are counted and timed.
#[derive(Clone, Debug)]
pub struct Measured<S> {
    inner: S,
    metrics: RequestMetrics,
}

impl<S, B, R> tower::Service<Request<B>> for Measured<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let method = request.method().as_str().to_owned();
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => NO_RESPONSE.to_owned(),
            };
            let host = &*metrics.host;
            metrics
                .requests
                .with_label_values(&[&code, &method, host])
                .inc();
            metrics
                .latency
                .with_label_values(&[&method, host])
                .observe(started.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer as _, Service as _};

    /// Answers 200 to GET, 409 to PUT, and fails anything else without a response.
    #[derive(Clone)]
    struct Server;

    impl tower::Service<Request<()>> for Server {
        type Response = Response<()>;
        type Error = &'static str;
        type Future = std::future::Ready<Result<Response<()>, &'static str>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<()>) -> Self::Future {
            let status = match *request.method() {
                http::Method::GET => http::StatusCode::OK,
                http::Method::PUT => http::StatusCode::CONFLICT,
                _ => return std::future::ready(Err("connection refused")),
            };
            let mut response = Response::new(());
            *response.status_mut() = status;
            std::future::ready(Ok(response))
        }
    }

    #[tokio::test]
    async fn every_request_is_counted_by_code_method_and_host_and_timed() {
        let registry = Registry::new();
        let metrics = RequestMetrics::register(&registry, "127.0.0.1:6443").expect("registered");
        let mut client = metrics.layer(Server);
        for method in [
            http::Method::GET,
            http::Method::GET,
            http::Method::PUT,
            http::Method::POST,
        ] {
            let request = Request::builder().method(method).body(()).expect("request");
            let _ = client.call(request).await;
        }
        let count = |code: &str, method: &str| {
            metrics
                .requests
                .with_label_values(&[code, method, "127.0.0.1:6443"])
                .get()
        };
        assert_eq!(count("200", "GET"), 2);
        assert_eq!(count("409", "PUT"), 1);
        assert_eq!(count("<error>", "POST"), 1);
        let timed = metrics
            .latency
            .with_label_values(&["GET", "127.0.0.1:6443"]);
        assert_eq!(timed.get_sample_count(), 2);
        assert_eq!(
            RequestMetrics::host_of(&"https://127.0.0.1:6443".parse().expect("uri")),
            "127.0.0.1:6443"
        );
    }
}
