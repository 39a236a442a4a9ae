//! Kubernetes Events for what a user should see: created, scaled, updated, failed.
//!
//! Like client-go's recorder, publishing never holds up a reconcile: [`Events::normal`] and
//! [`Events::warning`] queue the Event and return, and a background task per controller sends
//! them (a few at a time). kube's recorder turns repeats of one Event into a series, as
//! client-go aggregates them. The controller's run waits for the queue to drain
//! ([`Publisher::finish`]) before it returns, so a graceful stop loses nothing queued before it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::labels;

/// The Events API limit on a note.
const MAX_NOTE_BYTES: usize = 1024;

/// Events waiting to be sent; more are dropped (and counted). client-go's broadcaster queues
/// 1000.
const QUEUE: usize = 1024;

/// How long a stopped controller waits for its queued Events to be sent.
pub const EVENTS_FLUSH: Duration = Duration::from_secs(5);

/// Events sent at once.
const CONCURRENCY: usize = 4;

/// Queues `events.k8s.io/v1` Events for one controller. A failure to publish is logged and
/// otherwise ignored: an Event is information, never a reason to fail a reconcile.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<(ObjectReference, Event)>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

/// The task that sends one controller's Events.
#[derive(Debug)]
pub struct Publisher {
    task: JoinHandle<()>,
    dropped: Arc<AtomicU64>,
}

impl Events {
    /// Events reported by `operator-manager/<controller>` from `instance` (the pod name
    /// in-cluster; empty for "unknown"), and the task that sends them: it runs until every
    /// clone of the returned [`Events`] is dropped and the queue is empty.
    pub fn start(client: kube::Client, controller: &str, instance: &str) -> (Self, Publisher) {
        let reporter = Reporter {
            controller: reporting_controller(controller),
            instance: (!instance.is_empty()).then(|| instance.to_owned()),
        };
        let recorder = Recorder::new(client, reporter);
        let (queue, received) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(send_all(recorder, received));
        let publisher = Publisher {
            task,
            dropped: dropped.clone(),
        };
        (Self { queue, dropped }, publisher)
    }

    /// Queues a `Normal` event about `regarding`.
    pub fn normal(&self, regarding: &ObjectReference, reason: &str, action: &str, note: String) {
        self.queue(regarding, EventType::Normal, reason, action, note);
    }

    /// Queues a `Warning` event about `regarding`.
    pub fn warning(&self, regarding: &ObjectReference, reason: &str, action: &str, note: String) {
        self.queue(regarding, EventType::Warning, reason, action, note);
    }

    fn queue(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, MAX_NOTE_BYTES)),
            action: action.to_owned(),
            secondary: None,
        };
        if self.queue.try_send((regarding.clone(), event)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(reason, "event queue full; dropping the event");
        }
    }
}

impl Publisher {
    /// Waits, at most `timeout`, until every queued Event has been sent. Call it once the
    /// controller has stopped (its [`Events`] dropped).
    pub async fn finish(self, timeout: Duration) {
        let abort = self.task.abort_handle();
        if tokio::time::timeout(timeout, self.task).await.is_err() {
            abort.abort();
            tracing::warn!(
                timeout = ?timeout,
                "events still queued when the controller stopped were not sent"
            );
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(dropped, "events were dropped because the queue was full");
        }
    }
}

async fn send_all(recorder: Recorder, received: mpsc::Receiver<(ObjectReference, Event)>) {
    let events = futures::stream::unfold(received, |mut received| async move {
        received.recv().await.map(|event| (event, received))
    });
    events
        .for_each_concurrent(CONCURRENCY, |(regarding, event)| {
            let recorder = recorder.clone();
            async move {
                if let Err(e) = recorder.publish(&event, &regarding).await {
                    let e = crate::Error::Kube(e);
                    if e.is_namespace_terminating() {
                        tracing::debug!(
                            reason = event.reason,
                            "not publishing an event: the namespace is being deleted"
                        );
                    } else {
                        tracing::warn!(reason = event.reason, error = %e, "cannot publish event");
                    }
                }
            }
        })
        .await;
}

/// `reportingController` must be a qualified name (`prefix/name`).
pub fn reporting_controller(controller: &str) -> String {
    format!("{}/{controller}", labels::MANAGER)
}

/// `text` cut to at most `max` bytes on a character boundary.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Poll};

    use futures::future::BoxFuture;
    use kube::client::Body;
    use tokio::time::Instant;

    /// An API server that answers every request with an Event after `delay` (never, if
    /// `None`), counting requests.
    #[derive(Clone)]
    struct SlowServer {
        delay: Option<Duration>,
        requests: Arc<AtomicUsize>,
    }

    impl tower::Service<http::Request<Body>> for SlowServer {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<Body>) -> Self::Future {
            self.requests.fetch_add(1, Ordering::SeqCst);
            let delay = self.delay;
            Box::pin(async move {
                match delay {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
                let event = serde_json::json!({
                    "apiVersion": "events.k8s.io/v1",
                    "kind": "Event",
                    "metadata": {"name": "e", "namespace": "default"},
                    "eventTime": "2026-01-01T00:00:00.000000Z"
                });
                Ok(http::Response::new(Body::from(
                    event.to_string().into_bytes(),
                )))
            })
        }
    }

    fn start(delay: Option<Duration>) -> (Events, Publisher, Arc<AtomicUsize>) {
        let requests = Arc::new(AtomicUsize::new(0));
        let server = SlowServer {
            delay,
            requests: requests.clone(),
        };
        let client = kube::Client::new(server, "default");
        let (events, publisher) = Events::start(client, "memcached", "pod-1");
        (events, publisher, requests)
    }

    fn regarding() -> ObjectReference {
        ObjectReference {
            api_version: Some("cache.example.com/v1alpha1".into()),
            kind: Some("Memcached".into()),
            name: Some("m".into()),
            namespace: Some("default".into()),
            uid: Some("u".into()),
            ..ObjectReference::default()
        }
    }

    #[tokio::test]
    async fn queueing_never_waits_for_the_api_server() {
        let (events, publisher, requests) = start(Some(Duration::from_millis(300)));
        let started = Instant::now();
        for i in 0..8 {
            events.normal(&regarding(), "Scaled", "ScaleDeployment", format!("to {i}"));
        }
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "queueing took {:?}",
            started.elapsed()
        );
        drop(events);
        let flushing = Instant::now();
        publisher.finish(Duration::from_secs(20)).await;
        assert_eq!(requests.load(Ordering::SeqCst), 8, "every event was sent");
        // Four at a time: two rounds of 300 ms, not eight.
        assert!(
            flushing.elapsed() < Duration::from_millis(8 * 300),
            "sending took {:?}",
            flushing.elapsed()
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let (events, publisher, _) = start(None);
        for _ in 0..QUEUE + 100 {
            events.warning(&regarding(), "ReconcileFailed", "Reconcile", "x".into());
        }
        // At most CONCURRENCY left the queue (and hang in the server that never answers).
        let dropped = events.dropped.load(Ordering::Relaxed);
        let in_flight = u64::try_from(CONCURRENCY).unwrap();
        assert!(
            (100 - in_flight..=100).contains(&dropped),
            "dropped {dropped}"
        );
        drop(events);
        // Gives up on the server that never answers.
        publisher.finish(Duration::from_millis(100)).await;
    }

    #[test]
    fn notes_are_truncated_on_char_boundaries() {
        assert_eq!(truncate("abc".into(), 5), "abc");
        assert_eq!(
            truncate("é".repeat(600), MAX_NOTE_BYTES).len(),
            MAX_NOTE_BYTES
        );
        assert_eq!(truncate("aé".into(), 2), "a");
    }

    #[test]
    fn reporting_controller_is_a_qualified_name() {
        assert_eq!(
            reporting_controller("memcached"),
            "operator-manager/memcached"
        );
    }
}
