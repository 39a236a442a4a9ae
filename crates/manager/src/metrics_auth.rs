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
//!
//! Anyone who reaches the port can send tokens, so what they cost the API server is bounded:
//! - requests that carry the same unknown token at once share one TokenReview;
//! - at most [`REVIEWS_PER_SECOND`] TokenReviews are sent (in bursts of up to
//!   [`REVIEW_BURST`]); a request with an unknown token beyond that gets 429 and is asked to
//!   come back, while tokens already known are answered from the cache as before;
//! - each cache holds at most [`MAX_CACHED`] answers and drops the least recently used first,
//!   so a flood of new tokens does not push out the scrapers'.
//!
//! The manager gives this its own API client, apart from the controllers' and the Lease's.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::Hash;
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
use tokio::sync::OnceCell;
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

/// At most this many answers are kept in each cache; the least recently used go first.
pub const MAX_CACHED: usize = 4096;
/// TokenReviews sent per second at most, on average.
pub const REVIEWS_PER_SECOND: f64 = 10.0;
/// TokenReviews sent at once at most, after a quiet while.
pub const REVIEW_BURST: f64 = 20.0;

/// A token's SHA-256.
type TokenHash = [u8; 32];
/// Answers on their way by key: requests that ask the same at once share one API call.
struct InFlight<K, V>(Mutex<HashMap<K, Arc<Answer<V>>>>);

/// One answer, given once to every request waiting for it.
type Answer<V> = OnceCell<Result<V, Refusal>>;

impl<K: Hash + Eq + Clone, V: Clone> InFlight<K, V> {
    async fn share<F>(&self, key: K, ask: impl FnOnce() -> F) -> Result<V, Refusal>
    where
        F: Future<Output = Result<V, Refusal>>,
    {
        let answer = lock(&self.0).entry(key.clone()).or_default().clone();
        let result = answer.get_or_init(ask).await.clone();
        let mut in_flight = lock(&self.0);
        // Only this answer: a newer one for the same key may be on its way already.
        if in_flight.get(&key).is_some_and(|a| Arc::ptr_eq(a, &answer)) {
            in_flight.remove(&key);
        }
        result
    }
}

impl<K, V> Default for InFlight<K, V> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

/// The TokenReview and SubjectAccessReview client, with its caches.
pub struct MetricsAuth {
    client: kube::Client,
    /// Who each token is, if anyone, and since when that is known.
    users: Mutex<Cache<TokenHash, Option<UserInfo>>>,
    /// Whether each user may read, and since when that is known.
    decisions: Mutex<Cache<String, bool>>,
    /// The TokenReviews in flight, shared by the requests that carry the same token.
    reviewing: InFlight<TokenHash, Option<UserInfo>>,
    /// The SubjectAccessReviews in flight, shared likewise by user.
    deciding: InFlight<String, bool>,
    /// What may still be sent now.
    budget: Mutex<Budget>,
}

/// Answers by key, with when each was given; the least recently used goes first when full.
struct Cache<K, V> {
    entries: HashMap<K, Cached<V>>,
    /// Keys by when they were last used (a counter), oldest first.
    by_use: BTreeMap<u64, K>,
    uses: u64,
}

struct Cached<V> {
    value: V,
    at: Instant,
    used: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> Cache<K, V> {
    /// The answer for `key` if it is younger than what `lifetime` gives it.
    fn get(&mut self, key: &K, now: Instant, lifetime: impl Fn(&V) -> Duration) -> Option<V> {
        let entry = self.entries.get_mut(key)?;
        if now.duration_since(entry.at) >= lifetime(&entry.value) {
            return None;
        }
        self.uses += 1;
        self.by_use.remove(&entry.used);
        entry.used = self.uses;
        self.by_use.insert(self.uses, key.clone());
        Some(entry.value.clone())
    }

    fn insert(&mut self, key: K, value: V, now: Instant) {
        self.uses += 1;
        let used = self.uses;
        if let Some(old) = self.entries.insert(
            key.clone(),
            Cached {
                value,
                at: now,
                used,
            },
        ) {
            self.by_use.remove(&old.used);
        }
        self.by_use.insert(used, key);
        while self.entries.len() > MAX_CACHED {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
    }
}

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
            uses: 0,
        }
    }
}

/// A token bucket of TokenReviews: [`REVIEWS_PER_SECOND`], up to [`REVIEW_BURST`] at once.
#[derive(Debug)]
struct Budget {
    left: f64,
    at: Instant,
}

impl Budget {
    fn new(now: Instant) -> Self {
        Self {
            left: REVIEW_BURST,
            at: now,
        }
    }

    /// Takes one review if there is one left at `now`.
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.duration_since(self.at).as_secs_f64() * REVIEWS_PER_SECOND;
        self.left = (self.left + refill).min(REVIEW_BURST);
        self.at = now;
        if self.left >= 1.0 {
            self.left -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Why a request is turned away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer token, or one the API server does not authenticate: 401.
    Unauthenticated,
    /// Authenticated, but not allowed `get` on `/metrics`: 403, naming the user.
    Forbidden(String),
    /// The API server could not be asked: 500.
    Unavailable(String),
    /// An unknown token while the TokenReviews of this second are spent: 429, come back later.
    TooManyReviews,
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
            Self::TooManyReviews => (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, "1")],
                "Too many new tokens to review; try again\n",
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
            reviewing: InFlight::default(),
            deciding: InFlight::default(),
            budget: Mutex::new(Budget::new(Instant::now())),
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
        let key: TokenHash = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .unwrap_or([0; 32]);
        if let Some(user) = lock(&self.users).get(&key, Instant::now(), |_| AUTHENTICATED_FOR) {
            return Ok(user);
        }
        // One review per token at a time: the requests that carry it meanwhile wait for it.
        self.reviewing
            .share(key, || async {
                let user = self.review_token(token).await?;
                lock(&self.users).insert(key, user.clone(), Instant::now());
                Ok(user)
            })
            .await
    }

    /// Asks the API server who `token` is, if the budget allows.
    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, Refusal> {
        if !lock(&self.budget).take(Instant::now()) {
            return Err(Refusal::TooManyReviews);
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
        Ok(answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user))
    }

    async fn authorize(&self, user: &UserInfo) -> Result<bool, Refusal> {
        let key = format!(
            "{}\u{0}{}\u{0}{:?}\u{0}{:?}",
            user.username.as_deref().unwrap_or_default(),
            user.uid.as_deref().unwrap_or_default(),
            user.groups,
            user.extra
        );
        let lifetime = |allowed: &bool| if *allowed { ALLOWED_FOR } else { DENIED_FOR };
        if let Some(allowed) = lock(&self.decisions).get(&key, Instant::now(), lifetime) {
            return Ok(allowed);
        }
        self.deciding
            .share(key.clone(), || async {
                let allowed = self.review_access(user).await?;
                lock(&self.decisions).insert(key, allowed, Instant::now());
                Ok(allowed)
            })
            .await
    }

    /// Asks the API server whether `user` may get `/metrics`.
    async fn review_access(&self, user: &UserInfo) -> Result<bool, Refusal> {
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
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
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

    #[tokio::test]
    async fn requests_with_the_same_new_token_at_once_share_its_reviews() {
        let (auth, requests) = auth();
        let checks = (0..50).map(|_| auth.check(Some("Bearer alice-token")));
        let answers = futures::future::join_all(checks).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(
            requests.load(Ordering::SeqCst),
            2,
            "one TokenReview and one SubjectAccessReview for all fifty"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_new_tokens_makes_a_bounded_number_of_reviews() {
        let (auth, requests) = auth();
        assert_eq!(auth.check(Some("Bearer alice-token")).await, Ok(()));
        let (mut refused, seconds) = (0, 10);
        for second in 0..seconds {
            for i in 0..10_000 {
                let token = format!("Bearer flood-{second}-{i}");
                match auth.check(Some(&token)).await {
                    Err(Refusal::TooManyReviews) => refused += 1,
                    answer => assert_eq!(answer, Err(Refusal::Unauthenticated)),
                }
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let reviews = requests.load(Ordering::SeqCst) - 2;
        let most = REVIEW_BURST + REVIEWS_PER_SECOND * f64::from(seconds);
        assert!(
            reviews as f64 <= most,
            "{reviews} TokenReviews, at most {most}"
        );
        assert_eq!(
            refused,
            100_000 - reviews,
            "the others were asked to come back"
        );
        // The scraper's token is still known: no review for it.
        assert_eq!(auth.check(Some("Bearer alice-token")).await, Ok(()));
        assert_eq!(requests.load(Ordering::SeqCst), reviews + 2);
        let response = Refusal::TooManyReviews.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    }

    #[test]
    fn a_full_cache_drops_the_least_recently_used() {
        let mut cache: Cache<usize, usize> = Cache::default();
        let now = Instant::now();
        for key in 0..MAX_CACHED {
            cache.insert(key, key, now);
        }
        // The first is used again; the second is now the least recently used.
        let forever = |_: &usize| Duration::MAX;
        assert_eq!(cache.get(&0, now, forever), Some(0));
        cache.insert(MAX_CACHED, MAX_CACHED, now);
        assert_eq!(cache.entries.len(), MAX_CACHED);
        assert_eq!(cache.get(&0, now, forever), Some(0));
        assert_eq!(cache.get(&1, now, forever), None);
        assert_eq!(cache.get(&2, now, forever), Some(2));
        // Expired answers are not given.
        assert_eq!(cache.get(&2, now, |_| Duration::ZERO), None);
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
