//! The webhook endpoints: each admission webhook the controllers declare
//! ([`kube_operator_runtime::webhooks`]) answers `POST` on its own path, and every declared CRD
//! conversion ([`kube_operator_runtime::conversions`]) on [`CONVERSION_PATH`].
//!
//! A review is decided on a blocking thread within [`HANDLER_BUDGET`], well below the
//! `timeoutSeconds` the configurations give the API server: a review that takes longer is
//! refused with a message that says so, instead of leaving the API server to time out. A body
//! that is no AdmissionReview (or ConversionReview) gets 400 and the reason; nothing a client
//! sends can panic the server (a panicking rule is answered with 500).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::core::Status;
use kube::core::conversion::ConversionResponse;
use kube_operator_runtime::webhook::conversion::{self, CONVERSION_PATH, ConversionWebhook};
use kube_operator_runtime::webhook::{AdmissionWebhook, HANDLER_BUDGET};

/// Every webhook the manager serves: admission, and CRD conversion.
#[derive(Clone, Debug, Default)]
pub struct DeclaredWebhooks {
    /// Defaulting and validating webhooks.
    pub admission: Vec<AdmissionWebhook>,
    /// Conversions, one per CRD with more than one version.
    pub conversions: Vec<ConversionWebhook>,
}

impl DeclaredWebhooks {
    /// Every webhook of `controllers`.
    ///
    /// # Errors
    /// When two admission webhooks share a name or a path.
    pub fn of(
        controllers: &[Box<dyn kube_operator_runtime::ManagedController>],
    ) -> Result<Self, kube_operator_runtime::Error> {
        Ok(Self {
            admission: kube_operator_runtime::webhooks(controllers)?,
            conversions: kube_operator_runtime::conversions(controllers),
        })
    }

    /// Whether there is nothing to serve.
    pub fn is_empty(&self) -> bool {
        self.admission.is_empty() && self.conversions.is_empty()
    }
}

/// The largest review accepted: an object and its old version, each up to the API server's
/// own 3 MiB request limit, with room to spare.
const BODY_LIMIT: usize = 8 << 20;

/// The router answering every webhook on its path.
pub fn router(webhooks: DeclaredWebhooks) -> Router {
    let mut router = Router::new();
    for webhook in webhooks.admission {
        let path = webhook.path.clone();
        router = router.route(&path, post(review).with_state(Arc::new(webhook)));
    }
    if !webhooks.conversions.is_empty() {
        router = router.route(
            CONVERSION_PATH,
            post(convert).with_state(Arc::new(webhooks.conversions)),
        );
    }
    router.layer(DefaultBodyLimit::max(BODY_LIMIT))
}

async fn convert(State(conversions): State<Arc<Vec<ConversionWebhook>>>, body: Bytes) -> Response {
    let uid = request_uid(&body);
    let converting = tokio::task::spawn_blocking(move || conversion::review(&conversions, &body));
    match tokio::time::timeout(HANDLER_BUDGET, converting).await {
        Ok(Ok(Ok(review))) => axum::Json(review).into_response(),
        Ok(Ok(Err(malformed))) => {
            tracing::warn!(error = %malformed, "refused a malformed conversion review");
            (StatusCode::BAD_REQUEST, format!("{malformed}\n")).into_response()
        }
        Ok(Err(panicked)) => {
            tracing::error!(error = %panicked, "the conversion failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the conversion failed\n".to_owned(),
            )
                .into_response()
        }
        Err(_) => {
            tracing::warn!(%uid, "no conversion within the budget");
            let mut response = ConversionResponse::invalid(Status::failure(
                &format!(
                    "the conversion did not finish within {}s",
                    HANDLER_BUDGET.as_secs()
                ),
                "Timeout",
            ));
            response.uid = uid;
            axum::Json(response.into_review()).into_response()
        }
    }
}

async fn review(State(webhook): State<Arc<AdmissionWebhook>>, body: Bytes) -> Response {
    let uid = request_uid(&body);
    let name = webhook.name.clone();
    let deciding = tokio::task::spawn_blocking(move || webhook.review(&body));
    match tokio::time::timeout(HANDLER_BUDGET, deciding).await {
        Ok(Ok(Ok(review))) => axum::Json(review).into_response(),
        Ok(Ok(Err(malformed))) => {
            tracing::warn!(webhook = %name, error = %malformed, "refused a malformed review");
            (StatusCode::BAD_REQUEST, format!("{malformed}\n")).into_response()
        }
        Ok(Err(panicked)) => {
            tracing::error!(webhook = %name, error = %panicked, "the webhook's rules failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("webhook {name} failed while deciding\n"),
            )
                .into_response()
        }
        Err(_) => {
            tracing::warn!(webhook = %name, %uid, "no decision within the budget");
            axum::Json(AdmissionWebhook::out_of_time(&uid)).into_response()
        }
    }
}

/// The request's uid, read before deciding so that even a late answer names its request.
fn request_uid(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Review {
        request: Option<Request>,
    }
    #[derive(serde::Deserialize)]
    struct Request {
        uid: String,
    }
    serde_json::from_slice::<Review>(body)
        .ok()
        .and_then(|review| review.request)
        .map(|request| request.uid)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use serde_json::{Value, json};
    use tower::ServiceExt as _;

    use super::*;

    fn router() -> Router {
        super::router(DeclaredWebhooks::of(&controllers::all()).expect("webhooks"))
    }

    async fn post(path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        let request = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("request");
        let response = router().oneshot(request).await.expect("answered");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, body.to_vec())
    }

    fn memcached_review(image: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "uid-1",
                "kind": {"group": "cache.example.com", "version": "v1beta1", "kind": "Memcached"},
                "resource": {"group": "cache.example.com", "version": "v1beta1", "resource": "memcacheds"},
                "name": "m",
                "namespace": "ns",
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "object": {
                    "apiVersion": "cache.example.com/v1beta1",
                    "kind": "Memcached",
                    "metadata": {"name": "m", "namespace": "ns"},
                    "spec": {"size": 1, "image": image},
                },
                "oldObject": null,
            }
        }))
        .expect("JSON")
    }

    #[tokio::test]
    async fn each_declared_webhook_answers_on_its_path() {
        let (status, body) = post(
            "/validate-cache-example-com-v1beta1-memcached",
            memcached_review("memcached:1.6 x"),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let review: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(review["response"]["uid"], "uid-1");
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(
            review["response"]["status"]["details"]["causes"][0]["field"],
            "spec.image"
        );

        let (status, body) = post(
            "/mutate-cache-example-com-v1beta1-memcached",
            memcached_review(""),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let review: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(review["response"]["allowed"], true);
        assert_eq!(review["response"]["patchType"], "JSONPatch");
    }

    #[tokio::test]
    async fn a_malformed_review_gets_400_with_the_reason() {
        let (status, body) = post(
            "/validate-cache-example-com-v1beta1-memcached",
            b"{\"kind\": 3".to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let text = String::from_utf8(body).expect("text");
        assert!(text.contains("not an AdmissionReview"), "{text}");
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_are_refused() {
        let (status, _) = post("/validate-nothing", memcached_review("m:1")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let request = Request::get("/validate-cache-example-com-v1beta1-memcached")
            .body(Body::empty())
            .expect("request");
        let response = router().oneshot(request).await.expect("answered");
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    }

    #[test]
    fn the_uid_is_read_from_whatever_review_arrives() {
        assert_eq!(request_uid(&memcached_review("m:1")), "uid-1");
        assert_eq!(request_uid(b"garbage"), "");
    }
}
