//! Who may read `/metrics` when it is served securely: as in controller-runtime's
//! `filters.WithAuthenticationAndAuthorization`, every request carries a bearer token, the API
//! server authenticates it (TokenReview) and authorizes its user for `get` on the non-resource
//! URL `/metrics` (SubjectAccessReview), which the generated `metrics-reader` ClusterRole
//! grants. No token, or one the API server does not accept, gets 401; a user without the grant
//! gets 403.
//!
//! Answers are cached with controller-runtime's lifetimes (an authentication for a minute, an
//! allowed request for five, a denied one for thirty seconds), so a scrape every few seconds
//! is not two API calls each. Tokens are kept as their SHA-256 only.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

/// How long an authenticated token is trusted without asking again.
pub const AUTHENTICATED_FOR: Duration = Duration::from_secs(60);
/// How long an allowed user is trusted without asking again.
pub const ALLOWED_FOR: Duration = Duration::from_secs(5 * 60);
/// How long a denied user stays denied without asking again.
pub const DENIED_FOR: Duration = Duration::from_secs(30);

/// The non-resource URL and verb a reader must be allowed.
const PATH: &str = "/metrics";
const VERB: &str = "get";

/// At most this many answers are cached; beyond it the expired ones are dropped, then all.
const MAX_CACHED: usize = 4096;

/// The TokenReview and SubjectAccessReview client, with its caches.
pub struct MetricsAuth {
    client: kube::Client,
    /// Who each token (by its SHA-256) is, if anyone, and since when that is known.
    users: Mutex<Cache<[u8; 32], Option<UserInfo>>>,
    /// Whether each user may read, and since when that is known.
    decisions: Mutex<Cache<String, bool>>,
}

/// Answers by key, with when each was given.
type Cache<K, V> = HashMap<K, (V, Instant)>;

/// Why a request is turned away.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer token, or one the API server does not authenticate: 401.
    Unauthenticated,
    /// Authenticated, but not allowed `get` on `/metrics`: 403, naming the user.
    Forbidden(String),
    /// The API server could not be asked: 500.
    Unavailable(String),
}

impl std::fmt::Debug for MetricsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsAuth").finish_non_exhaustive()
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::Unauthenticated => (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response(),
            Self::Forbidden(user) => (
                StatusCode::FORBIDDEN,
                format!("Authorization denied for user {user}: it may not get {PATH}\n"),
            )
                .into_response(),
            Self::Unavailable(why) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Authorization failed: {why}\n"),
            )
                .into_response(),
        }
    }
}

impl MetricsAuth {
    /// Asks the API server through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            users: Mutex::default(),
            decisions: Mutex::default(),
        }
    }

    /// Whether the bearer token in `authorization` (the header's value) may read the metrics.
    ///
    /// # Errors
    /// The [`Refusal`] to answer with.
    pub async fn check(&self, authorization: Option<&str>) -> Result<(), Refusal> {
        let token = authorization
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or(Refusal::Unauthenticated)?;
        let user = self
            .authenticate(token)
            .await?
            .ok_or(Refusal::Unauthenticated)?;
        if self.authorize(&user).await? {
            Ok(())
        } else {
            Err(Refusal::Forbidden(user.username.unwrap_or_default()))
        }
    }

    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, Refusal> {
        let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .unwrap_or([0; 32]);
        let now = Instant::now();
        if let Some((user, at)) = lock(&self.users).get(&key)
            && now.duration_since(*at) < AUTHENTICATED_FOR
        {
            return Ok(user.clone());
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refusal::Unavailable(format!("TokenReview: {e}")))?;
        let user = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user);
        insert(
            &mut lock(&self.users),
            key,
            user.clone(),
            now,
            AUTHENTICATED_FOR,
        );
        Ok(user)
    }

    async fn authorize(&self, user: &UserInfo) -> Result<bool, Refusal> {
        let key = format!(
            "{}\u{0}{}\u{0}{:?}\u{0}{:?}",
            user.username.as_deref().unwrap_or_default(),
            user.uid.as_deref().unwrap_or_default(),
            user.groups,
            user.extra
        );
        let now = Instant::now();
        if let Some((allowed, at)) = lock(&self.decisions).get(&key)
            && now.duration_since(*at) < if *allowed { ALLOWED_FOR } else { DENIED_FOR }
        {
            return Ok(*allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.as_ref().map(|extra| {
                    extra
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect::<BTreeMap<_, _>>()
                }),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(PATH.to_owned()),
                    verb: Some(VERB.to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refusal::Unavailable(format!("SubjectAccessReview: {e}")))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed { ALLOWED_FOR } else { DENIED_FOR };
        insert(&mut lock(&self.decisions), key, allowed, now, ttl);
        Ok(allowed)
    }
}

/// Caches `value` under `key`, dropping expired answers (or, if none are, every answer) when
/// the cache is full.
fn insert<K: std::hash::Hash + Eq, V>(
    cache: &mut HashMap<K, (V, Instant)>,
    key: K,
    value: V,
    now: Instant,
    ttl: Duration,
) {
    if cache.len() >= MAX_CACHED {
        cache.retain(|_, (_, at)| now.duration_since(*at) < ttl);
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
    }
    cache.insert(key, (value, now));
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The axum middleware: passes the request on only when [`MetricsAuth::check`] allows it.
pub async fn require_metrics_reader(
    State(auth): State<Arc<MetricsAuth>>,
    request: Request,
    next: Next,
) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match auth.check(authorization).await {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            tracing::debug!(?refusal, "metrics request refused");
            refusal.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use futures::future::BoxFuture;
    use kube::client::Body;

    /// An API server that authenticates the tokens `alice-token` (as `alice`) and `bob-token`
    /// (as `bob`), and allows only `alice` to get `/metrics`; it counts the requests.
    #[derive(Clone, Default)]
    struct Server {
        requests: Arc<AtomicUsize>,
        /// Answers every review with 500.
        failing: bool,
    }

    impl tower::Service<http::Request<Body>> for Server {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            self.requests.fetch_add(1, Ordering::SeqCst);
            let failing = self.failing;
            Box::pin(async move {
                if failing {
                    let status = serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "InternalError", "code": 500, "message": "etcd is down"
                    });
                    let mut response =
                        http::Response::new(Body::from(status.to_string().into_bytes()));
                    *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                    return Ok(response);
                }
                let path = request.uri().path().to_owned();
                let body = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .unwrap_or_default();
                let mut review: serde_json::Value =
                    serde_json::from_slice(&body).unwrap_or_default();
                if path.ends_with("/tokenreviews") {
                    let user = match review["spec"]["token"].as_str() {
                        Some("alice-token") => Some("alice"),
                        Some("bob-token") => Some("bob"),
                        _ => None,
                    };
                    review["status"] = match user {
                        Some(user) => serde_json::json!({
                            "authenticated": true,
                            "user": {"username": user, "groups": ["system:authenticated"]}
                        }),
                        None => serde_json::json!({"authenticated": false}),
                    };
                } else {
                    let spec = &review["spec"];
                    let allowed = spec["user"] == "alice"
                        && spec["nonResourceAttributes"]["path"] == "/metrics"
                        && spec["nonResourceAttributes"]["verb"] == "get";
                    review["status"] = serde_json::json!({"allowed": allowed});
                }
                Ok(http::Response::new(Body::from(
                    review.to_string().into_bytes(),
                )))
            })
        }
    }

    fn auth() -> (MetricsAuth, Arc<AtomicUsize>) {
        let server = Server::default();
        let requests = server.requests.clone();
        (
            MetricsAuth::new(kube::Client::new(server, "default")),
            requests,
        )
    }

    #[tokio::test]
    async fn a_failing_api_server_refuses_the_scrape_and_nothing_is_cached() {
        let server = Server {
            failing: true,
            ..Server::default()
        };
        let requests = server.requests.clone();
        let auth = MetricsAuth::new(kube::Client::new(server, "default"));
        for _ in 0..2 {
            let refused = auth.check(Some("Bearer alice-token")).await;
            assert!(
                matches!(&refused, Err(Refusal::Unavailable(why)) if why.contains("TokenReview")),
                "{refused:?}"
            );
        }
        assert!(
            requests.load(Ordering::SeqCst) >= 2,
            "asked again each time"
        );
        let response = Refusal::Unavailable("x".into()).into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[tokio::test]
    async fn no_token_or_an_unknown_one_is_unauthenticated() {
        let (auth, requests) = auth();
        assert_eq!(auth.check(None).await, Err(Refusal::Unauthenticated));
        assert_eq!(
            auth.check(Some("Basic abc")).await,
            Err(Refusal::Unauthenticated)
        );
        assert_eq!(requests.load(Ordering::SeqCst), 0, "nothing to ask");
        assert_eq!(
            auth.check(Some("Bearer forged")).await,
            Err(Refusal::Unauthenticated)
        );
        assert_eq!(requests.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_reader_is_allowed_and_remembered() {
        let (auth, requests) = auth();
        assert_eq!(auth.check(Some("Bearer alice-token")).await, Ok(()));
        assert_eq!(
            requests.load(Ordering::SeqCst),
            2,
            "a TokenReview and a SubjectAccessReview"
        );
        for _ in 0..5 {
            assert_eq!(auth.check(Some("Bearer alice-token")).await, Ok(()));
        }
        assert_eq!(
            requests.load(Ordering::SeqCst),
            2,
            "answered from the cache"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_user_without_the_grant_is_forbidden_until_the_denial_expires() {
        let (auth, requests) = auth();
        assert_eq!(
            auth.check(Some("Bearer bob-token")).await,
            Err(Refusal::Forbidden("bob".to_owned()))
        );
        assert_eq!(
            auth.check(Some("Bearer bob-token")).await,
            Err(Refusal::Forbidden("bob".to_owned()))
        );
        assert_eq!(requests.load(Ordering::SeqCst), 2);
        tokio::time::advance(DENIED_FOR + Duration::from_secs(1)).await;
        let _ = auth.check(Some("Bearer bob-token")).await;
        assert_eq!(
            requests.load(Ordering::SeqCst),
            3,
            "the authentication is still cached, the denial is asked again"
        );
    }
}
