//! The webhook endpoints: each admission webhook the controllers declare
//! ([`kube_operator_runtime::webhooks`]) answers `POST` on its own path, and every declared CRD
//! conversion ([`kube_operator_runtime::conversions`]) on [`CONVERSION_PATH`].
//!
//! The port is open to every pod, so what a review may cost is bounded. At most
//! `MAX_CONCURRENT_REVIEWS` are read and decided at once; the others wait for a slot. A body
//! is read only once it has a slot, up to a limit sized for one object and its old version
//! (413 beyond). Everything happens within [`HANDLER_BUDGET`] of the request's arrival, well
//! below the `timeoutSeconds` the configurations give the API server: the slot, the body
//! (408 when it trickles in too slowly) and the decision, made on a blocking thread that keeps
//! its slot until it returns and is skipped if its time is up before it starts. A review out of
//! time is refused with a message that says so, instead of leaving the API server to time out.
//! A body that is no AdmissionReview (or ConversionReview) gets 400 and the reason; nothing a
//! client sends can panic the server (a panicking rule is answered with 500). The connections
//! themselves are bounded by [`crate::serving`].

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::LengthLimitError;
use kube::core::Status;
use kube::core::conversion::ConversionResponse;
use kube_operator_runtime::webhook::conversion::{self, CONVERSION_PATH, ConversionWebhook};
use kube_operator_runtime::webhook::{AdmissionWebhook, HANDLER_BUDGET};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::webhook_metrics::WebhookMetrics;

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

/// The largest admission review read: an object and its old version, each up to etcd's
/// 1.5 MiB object limit, and the review around them.
const ADMISSION_BODY_LIMIT: usize = (3 << 20) + (64 << 10);
/// The largest conversion review read: the API server converts a list in one review.
const CONVERSION_BODY_LIMIT: usize = 8 << 20;
/// Reviews read and decided at once, whatever their kind. Deciding is CPU work and the pod has
/// half a core: more at once finish no sooner, and each holds its body and what is parsed
/// from it. Further reviews wait for a slot within their budget.
const MAX_CONCURRENT_REVIEWS: usize = 2;

/// What a webhook's handler has: the webhook, and the slots it shares with every other.
#[derive(Debug)]
struct Served<W> {
    webhook: W,
    slots: Arc<Semaphore>,
}

/// The router answering every webhook on its path, each request counted in `metrics`.
pub fn router(webhooks: DeclaredWebhooks, metrics: &WebhookMetrics) -> Router {
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT_REVIEWS));
    let mut router = Router::new();
    for webhook in webhooks.admission {
        let path = webhook.path.clone();
        metrics.init(&path);
        let served = Served {
            webhook,
            slots: slots.clone(),
        };
        router = router.route(&path, post(review).with_state(Arc::new(served)));
    }
    if !webhooks.conversions.is_empty() {
        let served = Served {
            webhook: webhooks.conversions,
            slots,
        };
        metrics.init(CONVERSION_PATH);
        router = router.route(CONVERSION_PATH, post(convert).with_state(Arc::new(served)));
    }
    router.route_layer(axum::middleware::from_fn_with_state(
        metrics.clone(),
        crate::webhook_metrics::instrument,
    ))
}

/// A review taken in: its slot (held until its decision is made, even past the deadline) and
/// its body.
struct TakenIn {
    slot: OwnedSemaphorePermit,
    body: Bytes,
}

/// Why a review was not taken in, answered as its status and message.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.status, format!("{}\n", self.message)).into_response()
    }
}

/// Waits for a slot, then reads the body, both by `deadline`.
async fn take_in(
    slots: &Arc<Semaphore>,
    body: Body,
    limit: usize,
    deadline: Instant,
) -> Result<TakenIn, Refusal> {
    let refuse = |status: StatusCode, message: String| {
        tracing::warn!(%status, "{message}");
        Err(Refusal { status, message })
    };
    let Ok(Ok(slot)) = tokio::time::timeout_at(deadline, slots.clone().acquire_owned()).await
    else {
        let budget = HANDLER_BUDGET.as_secs();
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("too many reviews in progress: none could start within {budget}s"),
        );
    };
    match tokio::time::timeout_at(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(body)) => Ok(TakenIn { slot, body }),
        Ok(Err(error)) if is_too_large(&error) => refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the review is larger than {limit} bytes"),
        ),
        Ok(Err(error)) => refuse(
            StatusCode::BAD_REQUEST,
            format!("the review could not be read: {error}"),
        ),
        Err(_) => refuse(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the review did not arrive within {}s",
                HANDLER_BUDGET.as_secs()
            ),
        ),
    }
}

fn is_too_large(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if error.is::<LengthLimitError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Runs `decide` on a blocking thread, which holds the review's slot until it returns; work
/// whose deadline has passed before it starts is skipped (`None`).
async fn decide_by<T: Send + 'static>(
    deadline: Instant,
    TakenIn { slot, body }: TakenIn,
    decide: impl FnOnce(&[u8]) -> T + Send + 'static,
) -> Result<Result<Option<T>, tokio::task::JoinError>, tokio::time::error::Elapsed> {
    let deciding = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        (Instant::now() < deadline).then(|| decide(&body))
    });
    tokio::time::timeout_at(deadline, deciding).await
}

async fn convert(
    State(served): State<Arc<Served<Vec<ConversionWebhook>>>>,
    body: Body,
) -> Response {
    let deadline = Instant::now() + HANDLER_BUDGET;
    let taken = match take_in(&served.slots, body, CONVERSION_BODY_LIMIT, deadline).await {
        Ok(taken) => taken,
        Err(refused) => return refused.into_response(),
    };
    let uid = request_uid(&taken.body);
    let conversions = served.clone();
    let decided = decide_by(deadline, taken, move |body| {
        conversion::review(&conversions.webhook, body)
    });
    match decided.await {
        Ok(Ok(Some(Ok(review)))) => axum::Json(review).into_response(),
        Ok(Ok(Some(Err(malformed)))) => {
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
        Ok(Ok(None)) | Err(_) => {
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

async fn review(State(served): State<Arc<Served<AdmissionWebhook>>>, body: Body) -> Response {
    let deadline = Instant::now() + HANDLER_BUDGET;
    let taken = match take_in(&served.slots, body, ADMISSION_BODY_LIMIT, deadline).await {
        Ok(taken) => taken,
        Err(refused) => return refused.into_response(),
    };
    let uid = request_uid(&taken.body);
    let name = served.webhook.name.clone();
    let webhook = served.clone();
    let decided = decide_by(deadline, taken, move |body| webhook.webhook.review(body));
    match decided.await {
        Ok(Ok(Some(Ok(review)))) => axum::Json(review).into_response(),
        Ok(Ok(Some(Err(malformed)))) => {
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
        Ok(Ok(None)) | Err(_) => {
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
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use axum::http::Request;
    use futures::StreamExt as _;
    use serde_json::{Value, json};
    use tower::ServiceExt as _;

    use super::*;

    fn router() -> Router {
        let registry = prometheus::Registry::new();
        let metrics = WebhookMetrics::register(&registry).expect("metrics");
        super::router(
            DeclaredWebhooks::of(&controllers::all()).expect("webhooks"),
            &metrics,
        )
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
                "kind": {"group": product::group!(cache), "version": "v1beta1", "kind": "Memcached"},
                "resource": {"group": product::group!(cache), "version": "v1beta1", "resource": "memcacheds"},
                "name": "m",
                "namespace": "ns",
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "object": {
                    "apiVersion": concat!(product::group!(cache), "/v1beta1"),
                    "kind": "Memcached",
                    "metadata": {"name": "m", "namespace": "ns"},
                    "spec": {"size": 1, "image": image},
                },
                "oldObject": null,
            }
        }))
        .expect("JSON")
    }

    /// The path of Memcached's v1beta1 webhook of `kind` (`mutate`, `validate`).
    fn memcached_path(kind: &str) -> String {
        let group = product::group!(cache).replace('.', "-");
        format!("/{kind}-{group}-v1beta1-memcached")
    }

    #[tokio::test]
    async fn each_review_is_counted_by_its_path_and_code() {
        let registry = prometheus::Registry::new();
        let metrics = WebhookMetrics::register(&registry).expect("metrics");
        let webhooks = DeclaredWebhooks::of(&controllers::all()).expect("webhooks");
        let router = super::router(webhooks, &metrics);
        let path = memcached_path("validate");
        for (to, body) in [
            (path.as_str(), memcached_review("memcached:1.6")),
            (path.as_str(), b"not a review".to_vec()),
            ("/not-a-webhook", memcached_review("memcached:1.6")),
        ] {
            let request = Request::post(to)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .expect("request");
            router.clone().oneshot(request).await.expect("answered");
        }
        let families = registry.gather();
        let sample = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
            let family = families.iter().find(|f| f.name() == name)?;
            let metric = family.get_metric().iter().find(|m| {
                labels.iter().all(|(key, value)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *key && l.value() == *value)
                })
            })?;
            Some(match family.get_field_type() {
                prometheus::proto::MetricType::COUNTER => metric.get_counter().get_value(),
                prometheus::proto::MetricType::GAUGE => metric.get_gauge().get_value(),
                _ => metric.get_histogram().get_sample_count() as f64,
            })
        };
        let requests = "controller_runtime_webhook_requests_total";
        let webhook = ("webhook", path.as_str());
        assert_eq!(sample(requests, &[webhook, ("code", "200")]), Some(1.0));
        assert_eq!(sample(requests, &[webhook, ("code", "400")]), Some(1.0));
        assert_eq!(
            sample("controller_runtime_webhook_latency_seconds", &[webhook]),
            Some(2.0)
        );
        assert_eq!(
            sample("controller_runtime_webhook_requests_in_flight", &[webhook]),
            Some(0.0)
        );
        let unknown = ("webhook", "/not-a-webhook");
        assert_eq!(
            sample(requests, &[unknown]),
            None,
            "no series for a path not served"
        );
    }

    #[tokio::test]
    async fn each_declared_webhook_answers_on_its_path() {
        let (status, body) = post(
            &memcached_path("validate"),
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

        let (status, body) = post(&memcached_path("mutate"), memcached_review("")).await;
        assert_eq!(status, StatusCode::OK);
        let review: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(review["response"]["allowed"], true);
        assert_eq!(review["response"]["patchType"], "JSONPatch");
    }

    #[tokio::test]
    async fn a_malformed_review_gets_400_with_the_reason() {
        let (status, body) = post(&memcached_path("validate"), b"{\"kind\": 3".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let text = String::from_utf8(body).expect("text");
        assert!(text.contains("not an AdmissionReview"), "{text}");
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_are_refused() {
        let (status, _) = post("/validate-nothing", memcached_review("m:1")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let request = Request::get(memcached_path("validate"))
            .body(Body::empty())
            .expect("request");
        let response = router().oneshot(request).await.expect("answered");
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    }

    /// Posts `body` to Memcached's validating webhook through `router`.
    async fn validate(router: Router, body: Body) -> StatusCode {
        let request = Request::post(memcached_path("validate"))
            .header("content-type", "application/json")
            .body(body)
            .expect("request");
        router.oneshot(request).await.expect("answered").status()
    }

    /// A body that sends `first`, then nothing more for `pause` (forever when `None`), then
    /// the rest.
    fn trickling(review: Vec<u8>, pause: Option<Duration>) -> Body {
        let (first, rest) = review.split_at(10);
        let (first, rest) = (Bytes::copy_from_slice(first), Bytes::copy_from_slice(rest));
        let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(first) }).chain(
            futures::stream::once(async move {
                match pause {
                    Some(pause) => tokio::time::sleep(pause).await,
                    None => std::future::pending().await,
                }
                Ok(rest)
            }),
        );
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn a_review_past_the_body_limit_gets_413() {
        let mut review = memcached_review("m:1");
        review.resize(ADMISSION_BODY_LIMIT + 1, b' ');
        assert_eq!(
            validate(router(), Body::from(review)).await,
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[tokio::test]
    async fn reviews_past_the_slots_wait_for_one() {
        let router = router();
        let slow = Some(Duration::from_millis(300));
        let answers = futures::future::join_all([
            validate(router.clone(), trickling(memcached_review("m:1"), slow)),
            validate(router.clone(), trickling(memcached_review("m:1"), slow)),
            validate(router.clone(), Body::from(memcached_review("m:1"))),
        ])
        .await;
        assert_eq!(answers, [StatusCode::OK; 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_slot_or_a_whole_body_by_the_deadline_a_review_is_refused() {
        let taken_in = |slots: Arc<Semaphore>, body: Body| async move {
            let deadline = Instant::now() + HANDLER_BUDGET;
            let refused = take_in(&slots, body, ADMISSION_BODY_LIMIT, deadline)
                .await
                .err()
                .expect("refused");
            assert_eq!(Instant::now(), deadline, "refused at the deadline");
            refused.status
        };
        let busy = Arc::new(Semaphore::new(0));
        let review = || memcached_review("m:1");
        assert_eq!(
            taken_in(busy, Body::from(review())).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let free = Arc::new(Semaphore::new(1));
        assert_eq!(
            taken_in(free.clone(), trickling(review(), None)).await,
            StatusCode::REQUEST_TIMEOUT
        );
        assert_eq!(free.available_permits(), 1, "the slot is given back");
    }

    #[tokio::test]
    async fn a_decision_holds_its_slot_past_the_deadline_and_late_work_is_skipped() {
        let slots = Arc::new(Semaphore::new(1));
        let taken = || TakenIn {
            slot: slots.clone().try_acquire_owned().expect("a free slot"),
            body: Bytes::new(),
        };
        let deadline = Instant::now() + Duration::from_millis(100);
        let slow = decide_by(deadline, taken(), |_| {
            std::thread::sleep(Duration::from_millis(500));
        });
        assert!(slow.await.is_err(), "out of time");
        assert_eq!(
            slots.available_permits(),
            0,
            "still deciding, still counted"
        );
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(slots.available_permits(), 1);

        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let late = decide_by(Instant::now(), taken(), move |_| {
            flag.store(true, Ordering::SeqCst)
        });
        // Answered as skipped, or as out of time when the blocking pool was slower than the
        // deadline's timer (a loaded machine): either way the work never runs.
        let outcome = late.await;
        assert!(matches!(outcome, Ok(Ok(None)) | Err(_)), "skipped");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!ran.load(Ordering::SeqCst));
    }

    #[test]
    fn the_uid_is_read_from_whatever_review_arrives() {
        assert_eq!(request_uid(&memcached_review("m:1")), "uid-1");
        assert_eq!(request_uid(b"garbage"), "");
    }
}
