//! A fake API server for unit tests: a `kube::Client` whose every request is recorded and
//! answered by a function of the test's choosing, optionally after a delay. A reconcile, a
//! child writer or a status writer built on its client can be tested without a cluster: the
//! test says what the API server answers and checks what was sent.
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, PostParams};
//! use kube_operator_runtime::fake::{ApiServer, failure};
//!
//! # async fn example() -> Result<(), kube::Error> {
//! let server = ApiServer::answering(|request| match request.method.as_str() {
//!     "POST" => (201, request.body.clone()),
//!     _ => failure(404, "NotFound", "configmaps \"settings\" not found"),
//! });
//! let configmaps = Api::<ConfigMap>::namespaced(server.client(), "team-a");
//! assert!(configmaps.get_opt("settings").await?.is_none());
//! let mut settings = ConfigMap::default();
//! settings.metadata.name = Some("settings".into());
//! configmaps.create(&PostParams::default(), &settings).await?;
//! let sent = server.requests();
//! assert_eq!(sent[1].path, "/api/v1/namespaces/team-a/configmaps");
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::client::Body;

/// One request as the fake server saw it.
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `POST`, `PATCH`, ...
    pub method: String,
    /// The URL path, such as `/api/v1/namespaces/team-a/configmaps`.
    pub path: String,
    /// The query string, without the `?`.
    pub query: String,
    /// The `Accept` header (empty when there is none).
    pub accept: String,
    /// The JSON body (`Null` when there is none).
    pub body: serde_json::Value,
}

/// The status code and JSON body of an answer.
pub type Answer = (u16, serde_json::Value);

type AnswerFn = dyn Fn(&Request) -> Answer + Send + Sync;

/// A fake API server: see the module documentation.
#[derive(Clone)]
pub struct ApiServer {
    answer: Arc<AnswerFn>,
    /// How long each answer takes; `None` never answers.
    delay: Option<Duration>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// A server answering each request with `answer(request)` at once.
    pub fn answering(answer: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Self {
        Self {
            answer: Arc::new(answer),
            delay: Some(Duration::ZERO),
            requests: Arc::default(),
        }
    }

    /// A server answering every request with `object`.
    pub fn echoing(object: serde_json::Value) -> Self {
        Self::answering(move |_| (200, object.clone()))
    }

    /// A server failing every request with `code` and a Status carrying `message`.
    pub fn failing(code: u16, message: &'static str) -> Self {
        Self::answering(move |_| failure(code, "Failure", message))
    }

    /// Answers after `delay`, or never (`None`).
    #[must_use]
    pub fn delayed(self, delay: Option<Duration>) -> Self {
        Self { delay, ..self }
    }

    /// A client of this server.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A failure Status of `code` with `reason` and `message`.
pub fn failure(code: u16, reason: &str, message: &str) -> Answer {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": reason, "code": code, "message": message
    });
    (code, status)
}

impl tower::Service<http::Request<Body>> for ApiServer {
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let method = request.method().to_string();
            let path = request.uri().path().to_owned();
            let query = request.uri().query().unwrap_or_default().to_owned();
            let accept = request
                .headers()
                .get(http::header::ACCEPT)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let seen = Request {
                method,
                path,
                query,
                accept,
                body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
            };
            this.requests
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(seen.clone());
            match this.delay {
                Some(delay) if delay.is_zero() => {}
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
            let (code, answer) = (this.answer)(&seen);
            let mut response = http::Response::new(Body::from(answer.to_string().into_bytes()));
            *response.status_mut() = http::StatusCode::from_u16(code).unwrap_or_default();
            Ok(response)
        })
    }
}
