//! The write fence: every mutating request the controllers send passes one check, that this
//! replica holds the leader Lease and its renew deadline has not passed, on the monotonic clock
//! and on the boot clock (which counts time the machine was suspended).
//!
//! Leader election alone stops the controllers only when the elector notices it has lost; a
//! replica that was frozen (SIGSTOP, a long stall) or whose machine was suspended wakes up with
//! writes queued and a Lease that a standby may already hold. A VM paused by its hypervisor is
//! covered only if its clocks are stepped forward on resume; the API server's fence (below)
//! covers it either way. The fence refuses those writes before they leave the
//! process, and abandons a write not yet sent or still unanswered when the deadline passes
//! (unless a renewal moved it meanwhile) or as soon as the replica steps down or suspends its
//! writes, so that no request of this replica is sent after a
//! standby could have taken over. What it cannot hold back is a request already handed to
//! the connection when the process froze (the connection's own task sends it on waking), or one
//! that waits in the API server: those the API server refuses, with the generated
//! ValidatingAdmissionPolicy that takes the Lease as its parameter.
//! Reads are never fenced: a standby's caches stay warm.
//!
//!
//! Every write that passes runs to its end on a task of its own, even when the reconcile that
//! sent it is cancelled or aborted, and the fence counts it until then. At shutdown the manager
//! closes the fence to new writes, waits for those in flight to be answered, and only then
//! releases the Lease, so a standby does not lead while a write of this replica is on its way.
//! Writes still unanswered when that wait ends are abandoned (the request is dropped, which
//! makes the API server cancel it unless it has committed it already) before the release; the
//! API server's fence refuses any that land after a standby leads.
//!
//! It is a tower layer on the controllers' client only; the elector's own client must write the
//! Lease to become leader at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Method, Request};
use prometheus::IntCounter;
use tokio::time::Instant;

use crate::Error;
use crate::leader::LeaderStatus;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The layer: checks every write against `status`, counts refusals in `refused`
/// (`leader_election_fenced_writes_total`), and keeps count of the writes in flight.
#[derive(Clone, Debug)]
pub struct WriteFence {
    status: Arc<LeaderStatus>,
    refused: IntCounter,
    writes: Arc<Writes>,
}

/// The writes that passed the fence and have not ended.
#[derive(Debug, Default)]
struct Writes {
    in_flight: AtomicUsize,
    /// Set at shutdown: no new write passes; those in flight go on.
    closed: AtomicBool,
    ended: tokio::sync::Notify,
}

/// Counts one write in flight from the fence's check until it ends, however it ends.
struct InFlight(Arc<Writes>);

impl InFlight {
    fn start(writes: Arc<Writes>) -> Self {
        writes.in_flight.fetch_add(1, Ordering::SeqCst);
        Self(writes)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

impl WriteFence {
    /// A fence that opens while `status` says this replica leads on time.
    pub fn new(status: Arc<LeaderStatus>, refused: IntCounter) -> Self {
        Self {
            status,
            refused,
            writes: Arc::default(),
        }
    }

    /// Lets no new write pass from now on, for good; writes in flight go on.
    pub fn close_to_new_writes(&self) {
        self.writes.closed.store(true, Ordering::SeqCst);
    }

    /// Waits, at most `bound`, until no write is in flight; how many still are.
    pub async fn writes_ended(&self, bound: Duration) -> usize {
        let give_up = Instant::now() + bound;
        loop {
            let ended = self.writes.ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            let in_flight = self.writes.in_flight.load(Ordering::SeqCst);
            if in_flight == 0 || tokio::time::timeout_at(give_up, ended).await.is_err() {
                return self.writes.in_flight.load(Ordering::SeqCst);
            }
        }
    }

    /// The leadership it checks against.
    pub fn status(&self) -> &Arc<LeaderStatus> {
        &self.status
    }

    /// How many writes it has refused or abandoned so far.
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    fn refuse(&self, method: Method, path: String, reason: String) -> BoxError {
        self.refused.inc();
        Box::new(Error::WriteFenced {
            method,
            path,
            reason,
        })
    }
}

/// Whether `method` changes something on the API server.
fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

impl<S> tower::Layer<S> for WriteFence {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced {
            inner,
            fence: self.clone(),
        }
    }
}

/// A client service behind the [`WriteFence`].
#[derive(Clone, Debug)]
pub struct Fenced<S> {
    inner: S,
    fence: WriteFence,
}

impl<S, B> tower::Service<Request<B>> for Fenced<S>
where
    S: tower::Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if !is_write(request.method()) {
            let response = self.inner.call(request);
            return Box::pin(async move { response.await.map_err(Into::into) });
        }
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        if self.fence.writes.closed.load(Ordering::SeqCst) {
            let reason = "the manager is shutting down".to_owned();
            let refused = self.fence.refuse(method, path, reason);
            return Box::pin(std::future::ready(Err(refused)));
        }
        let mut deadline = match self.fence.status.write_deadline(Instant::now()) {
            Ok(deadline) => deadline,
            Err(reason) => {
                let refused = self.fence.refuse(method, path, reason);
                return Box::pin(std::future::ready(Err(refused)));
            }
        };
        // Nothing leaves before the answer future is first polled (the connection is checked
        // out or made then): a process frozen between the check above and that poll must not
        // send the write when it wakes, so every poll checks the deadline before the request.
        let response = self.inner.call(request);
        let fence = self.fence.clone();
        let in_flight = InFlight::start(fence.writes.clone());
        let write = async move {
            // Counts the write until this future ends.
            let _in_flight = in_flight;
            let status = fence.status.clone();
            let mut response = std::pin::pin!(response);
            let mut timer = std::pin::pin!(tokio::time::sleep_until(deadline));
            let mut closed = std::pin::pin!(status.closed());
            closed.as_mut().enable();
            std::future::poll_fn(|cx| {
                if closed.as_mut().poll(cx).is_ready() {
                    // Writing stopped: check now, as if the deadline had come.
                    closed.set(status.closed());
                    closed.as_mut().enable();
                    deadline = Instant::now();
                }
                while Instant::now() >= deadline {
                    match fence.status.write_deadline(Instant::now()) {
                        // Renewed meanwhile: keep waiting for the answer.
                        Ok(later) => {
                            deadline = later;
                            timer.as_mut().reset(later);
                        }
                        Err(reason) => {
                            return Poll::Ready(Err(fence.refuse(
                                method.clone(),
                                path.clone(),
                                format!("abandoned before the API server answered: {reason}"),
                            )));
                        }
                    }
                }
                if let Poll::Ready(answered) = response.as_mut().poll(cx) {
                    return Poll::Ready(answered.map_err(Into::into));
                }
                if timer.as_mut().poll(cx).is_ready() {
                    // The deadline came while the request was pending: look again at once.
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            })
            .await
        };
        // A write runs to its answer even when its caller is gone (a reconcile cancelled or
        // aborted at shutdown): dropping it would leave the API server free to apply it after
        // the Lease is released.
        let write = tokio::spawn(write);
        Box::pin(async move { write.await.map_err(|e| -> BoxError { Box::new(e) })? })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus::IntGauge;
    use tower::{Layer as _, Service as _};

    use super::*;

    /// Answers every request after `delay` (never, if `None`) and counts what it was sent.
    #[derive(Clone)]
    struct Server {
        delay: Option<Duration>,
        sent: Arc<std::sync::atomic::AtomicUsize>,
        answered: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl tower::Service<Request<()>> for Server {
        type Response = &'static str;
        type Error = BoxError;
        type Future = BoxFuture<'static, Result<&'static str, BoxError>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            let (delay, sent, answered) = (self.delay, self.sent.clone(), self.answered.clone());
            // Like a connection pool, it sends when the answer future is first polled.
            Box::pin(async move {
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                match delay {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok("answered")
            })
        }
    }

    struct Setup {
        status: Arc<LeaderStatus>,
        refused: IntCounter,
        sent: Arc<std::sync::atomic::AtomicUsize>,
        answered: Arc<std::sync::atomic::AtomicUsize>,
        fence: WriteFence,
        service: Fenced<Server>,
    }

    fn setup(renew_deadline: Duration, answer_after: Option<Duration>) -> Setup {
        let gauge = IntGauge::new("leading", "h").unwrap();
        let status = Arc::new(LeaderStatus::new(
            gauge,
            renew_deadline,
            crate::leader::LeaseRole::Leader,
        ));
        let refused = IntCounter::new("refused", "h").unwrap();
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let server = Server {
            delay: answer_after,
            sent: sent.clone(),
            answered: answered.clone(),
        };
        let fence = WriteFence::new(status.clone(), refused.clone());
        let service = fence.layer(server);
        Setup {
            status,
            refused,
            sent,
            answered,
            fence,
            service,
        }
    }

    fn request(method: Method) -> Request<()> {
        Request::builder()
            .method(method)
            .uri("/apis/apps/v1/namespaces/ns/deployments/web")
            .body(())
            .unwrap()
    }

    fn sent(setup: &Setup) -> usize {
        setup.sent.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn reads_pass_whoever_leads() {
        let mut s = setup(Duration::from_secs(10), Some(Duration::ZERO));
        assert_eq!(
            s.service.call(request(Method::GET)).await.unwrap(),
            "answered"
        );
        assert_eq!((sent(&s), s.refused.get()), (1, 0));
    }

    #[tokio::test]
    async fn a_standby_sends_no_write_and_counts_it() {
        let mut s = setup(Duration::from_secs(10), Some(Duration::ZERO));
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            let error = s.service.call(request(method.clone())).await.unwrap_err();
            assert_eq!(
                error.to_string(),
                format!(
                    "{method} /apis/apps/v1/namespaces/ns/deployments/web refused by the \
                     write fence: this replica does not hold the leader lease"
                )
            );
        }
        assert_eq!((sent(&s), s.refused.get()), (0, 4));
    }

    #[tokio::test]
    async fn the_leader_writes_until_its_renew_deadline() {
        let mut s = setup(Duration::from_secs(10), Some(Duration::ZERO));
        s.status.renewed(Instant::now());
        assert_eq!(
            s.service.call(request(Method::PATCH)).await.unwrap(),
            "answered"
        );
        assert_eq!((sent(&s), s.refused.get()), (1, 0));

        // As after a freeze: the last renewal is older than the deadline, and the elector has
        // not noticed yet.
        s.status.renewed(Instant::now() - Duration::from_secs(11));
        let error = s.service.call(request(Method::PATCH)).await.unwrap_err();
        assert!(
            error
                .to_string()
                .contains("beyond the renew deadline of 10s"),
            "{error}"
        );
        assert_eq!((sent(&s), s.refused.get()), (1, 1));

        s.status.renewed(Instant::now());
        s.status.suspend_writes();
        let error = s.service.call(request(Method::POST)).await.unwrap_err();
        assert!(error.to_string().contains("being checked"), "{error}");
        assert_eq!((sent(&s), s.refused.get()), (1, 2));
    }

    #[tokio::test]
    async fn a_write_unanswered_at_the_deadline_is_abandoned() {
        let mut s = setup(Duration::from_millis(200), None);
        s.status.renewed(Instant::now());
        let started = Instant::now();
        let error = s.service.call(request(Method::PUT)).await.unwrap_err();
        assert!(error.to_string().contains("abandoned"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!((sent(&s), s.refused.get()), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_not_yet_sent_when_the_deadline_passed_is_never_sent() {
        let mut s = setup(Duration::from_secs(4), Some(Duration::ZERO));
        s.status.renewed(Instant::now());
        let write = s.service.call(request(Method::PATCH));
        // Frozen between the fence's check and the send: time passes, nothing is polled.
        tokio::time::advance(Duration::from_secs(11)).await;
        let error = write.await.unwrap_err();
        assert!(error.to_string().contains("abandoned"), "{error}");
        assert_eq!((sent(&s), s.refused.get()), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_in_flight_is_abandoned_as_soon_as_the_replica_steps_down() {
        for step_down in [LeaderStatus::stepped_down, LeaderStatus::suspend_writes] {
            let mut s = setup(Duration::from_secs(10), None);
            s.status.renewed(Instant::now());
            let write = tokio::spawn(s.service.call(request(Method::PATCH)));
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(sent(&s), 1, "sent, and waiting for its answer");
            let stepped = Instant::now();
            step_down(&s.status);
            let error = write.await.unwrap().unwrap_err();
            assert!(error.to_string().contains("abandoned"), "{error}");
            assert!(
                stepped.elapsed() < Duration::from_secs(1),
                "not at its old deadline"
            );
            assert_eq!(s.refused.get(), 1);
        }
    }

    #[tokio::test]
    async fn renewals_while_a_write_is_in_flight_keep_it() {
        let mut s = setup(Duration::from_millis(200), Some(Duration::from_millis(500)));
        s.status.renewed(Instant::now());
        let status = s.status.clone();
        let renewing = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                status.renewed(Instant::now());
            }
        });
        let answered = s.service.call(request(Method::POST)).await;
        renewing.abort();
        assert_eq!(answered.unwrap(), "answered");
        assert_eq!(s.refused.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_whose_caller_is_aborted_runs_to_its_answer_before_writes_end() {
        let mut s = setup(Duration::from_secs(10), Some(Duration::from_secs(2)));
        s.status.renewed(Instant::now());
        let caller = tokio::spawn(s.service.call(request(Method::PATCH)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        // As a reconcile aborted at the shutdown timeout.
        caller.abort();
        let _ = caller.await;
        s.fence.close_to_new_writes();
        let error = s.service.call(request(Method::POST)).await.unwrap_err();
        assert!(error.to_string().contains("shutting down"), "{error}");

        let waited = Instant::now();
        assert_eq!(s.fence.writes_ended(Duration::from_secs(5)).await, 0);
        assert_eq!(
            s.answered.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the aborted caller's write was answered, not dropped"
        );
        let waited = waited.elapsed();
        assert!(
            waited >= Duration::from_millis(1800) && waited < Duration::from_secs(5),
            "waited {waited:?} for the answer"
        );
        assert_eq!((sent(&s), s.refused.get()), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_unanswered_when_the_wait_ends_is_counted_then_abandoned() {
        let mut s = setup(Duration::from_secs(60), None);
        s.status.renewed(Instant::now());
        let write = tokio::spawn(s.service.call(request(Method::PUT)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.fence.close_to_new_writes();
        assert_eq!(s.fence.writes_ended(Duration::from_secs(3)).await, 1);
        // Stepping down (the release does) abandons it.
        s.status.stepped_down();
        assert!(write.await.unwrap().is_err());
        assert_eq!(s.fence.writes_ended(Duration::ZERO).await, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_abandoned_before_it_was_sent_leaves_nothing_to_wait_for() {
        let mut s = setup(Duration::from_secs(4), Some(Duration::ZERO));
        s.status.renewed(Instant::now());
        let write = s.service.call(request(Method::PATCH));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(write.await.is_err());
        assert_eq!(sent(&s), 0);
        assert_eq!(s.fence.writes_ended(Duration::ZERO).await, 0);
    }
}
