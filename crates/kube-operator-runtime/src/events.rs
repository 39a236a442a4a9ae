//! Kubernetes Events for what a user should see: created, scaled, updated, failed.
//!
//! Like client-go's recorder, publishing never holds up a reconcile: [`Events::normal`] and
//! [`Events::warning`] queue the Event and return, and a background task per controller sends
//! them (a few at a time). A repeat of an Event sent in the last [`SERIES_WINDOW`] (same
//! action, reason and object, as client-go compares them) is not sent again: the first one's
//! `series` is counted up instead. The controller's run waits for the queue to drain
//! ([`Publisher::finish`]) before it returns, so a graceful stop loses nothing queued before it.

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::own_writes::{OwnWrites, Subject};
use crate::{Error, labels, writes};

/// The Events API limit on a note.
const MAX_NOTE_BYTES: usize = 1024;

/// Events waiting to be sent; more are dropped (and counted). client-go's broadcaster queues
/// 1000.
const QUEUE: usize = 1024;

/// How long a stopped controller waits for its queued Events to be sent.
pub const EVENTS_FLUSH: Duration = Duration::from_secs(5);

/// Events sent at once.
const CONCURRENCY: usize = 4;

/// How long after its last occurrence a repeat of an Event counts up its series (client-go's
/// 6 minutes); a later repeat is a new Event.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// Whether an Event is `Normal` or a `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One queued Event.
#[derive(Debug)]
struct Queued {
    regarding: ObjectReference,
    type_: EventType,
    reason: Cow<'static, str>,
    action: Cow<'static, str>,
    note: String,
}

#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<Queued>,
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
    /// Events reported by `<manager>/<controller>` ([`crate::labels::manager`]) from
    /// `instance` (the pod name in-cluster; empty for "unknown"), and the task that sends
    /// them: it runs until every clone of the returned [`Events`] is dropped and the queue is
    /// empty.
    pub fn start(client: kube::Client, controller: &str, instance: &str) -> (Self, Publisher) {
        Self::remembering(client, controller, instance, OwnWrites::default())
    }

    /// [`Events::start`], remembering the Events sent (for their series) in `own_writes`, the
    /// controller's.
    pub fn remembering(
        client: kube::Client,
        controller: &str,
        instance: &str,
        own_writes: OwnWrites,
    ) -> (Self, Publisher) {
        let controller = reporting_controller(controller);
        let recorder = Arc::new(Recorder {
            client,
            instance: if instance.is_empty() {
                controller.clone()
            } else {
                instance.to_owned()
            },
            controller,
            sent: own_writes,
        });
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
    pub fn normal(
        &self,
        regarding: &ObjectReference,
        reason: impl Into<Cow<'static, str>>,
        action: impl Into<Cow<'static, str>>,
        note: String,
    ) {
        let (reason, action) = (reason.into(), action.into());
        self.queue(regarding, EventType::Normal, reason, action, note);
    }

    /// Queues a `Warning` event about `regarding`.
    pub fn warning(
        &self,
        regarding: &ObjectReference,
        reason: impl Into<Cow<'static, str>>,
        action: impl Into<Cow<'static, str>>,
        note: String,
    ) {
        let (reason, action) = (reason.into(), action.into());
        self.queue(regarding, EventType::Warning, reason, action, note);
    }

    fn queue(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: Cow<'static, str>,
        action: Cow<'static, str>,
        note: String,
    ) {
        let event = Queued {
            regarding: regarding.clone(),
            type_,
            reason,
            action,
            note: truncate(note, MAX_NOTE_BYTES),
        };
        if let Err(full) = self.queue.try_send(event) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            let reason = full.into_inner().reason;
            tracing::debug!(%reason, "event queue full; dropping the event");
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

async fn send_all(recorder: Arc<Recorder>, received: mpsc::Receiver<Queued>) {
    let events = futures::stream::unfold(received, |mut received| async move {
        received.recv().await.map(|event| (event, received))
    });
    events
        .for_each_concurrent(CONCURRENCY, |event| {
            let recorder = recorder.clone();
            async move {
                if let Err(e) = recorder.publish(&event).await {
                    if e.is_namespace_terminating() {
                        tracing::debug!(
                            reason = %event.reason,
                            "not publishing an event: the namespace is being deleted"
                        );
                    } else {
                        tracing::warn!(reason = %event.reason, error = %e, "cannot publish event");
                    }
                }
            }
        })
        .await;
}

/// Sends one controller's Events and remembers them for their series.
struct Recorder {
    client: kube::Client,
    controller: String,
    instance: String,
    /// The Events sent in the last [`SERIES_WINDOW`], as [`Subject::EventSeries`] of
    /// [`Recorder::series_key`].
    sent: OwnWrites,
}

/// A sent Event: where it is and how often it happened.
struct Series {
    namespace: String,
    name: String,
    count: i32,
}

impl Recorder {
    /// What makes two Events the same for client-go: action, reason and the object (with its
    /// resourceVersion); the reporting controller is this recorder's.
    fn series_key(event: &Queued) -> u64 {
        let mut hasher = DefaultHasher::new();
        (&event.action, &event.reason).hash(&mut hasher);
        let r = &event.regarding;
        (
            &r.api_version,
            &r.kind,
            &r.namespace,
            &r.name,
            &r.uid,
            &r.resource_version,
            &r.field_path,
        )
            .hash(&mut hasher);
        hasher.finish()
    }

    async fn publish(&self, event: &Queued) -> Result<(), Error> {
        let key = Subject::EventSeries(Self::series_key(event));
        let repeat = self.sent.recall(&key, |series: &mut Series, until| {
            series.count += 1;
            *until = Instant::now() + SERIES_WINDOW;
            (series.namespace.clone(), series.name.clone(), series.count)
        });
        if let Some((namespace, name, count)) = repeat {
            match self.count_up(&namespace, &name, count).await {
                Err(e) if e.is_not_found() => {
                    // Deleted (or expired) since: the repeat becomes a new Event.
                }
                done => return done,
            }
        }
        let created = self.create(event).await?;
        (self.sent).keep(key, created, Instant::now() + SERIES_WINDOW);
        Ok(())
    }

    async fn create(&self, event: &Queued) -> Result<Series, Error> {
        let now = Timestamp::now();
        let namespace = event
            .regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        // client-go's naming: the object's name and the time in hex nanoseconds.
        let name = format!(
            "{}.{:x}",
            event.regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let k8s_event = K8sEvent {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some(event.action.to_string()),
            reason: Some(event.reason.to_string()),
            note: Some(event.note.clone()),
            type_: Some(event.type_.as_str().to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(event.regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        };
        writes::create(&self.client, &namespace, &PostParams::default(), &k8s_event).await?;
        Ok(Series {
            namespace,
            name,
            count: 1,
        })
    }

    /// Records that the Event `namespace/name` happened for the `count`th time.
    async fn count_up(&self, namespace: &str, name: &str, count: i32) -> Result<(), Error> {
        let series = EventSeries {
            count,
            last_observed_time: MicroTime(Timestamp::now()),
        };
        let patch = serde_json::json!({ "series": series });
        writes::patch::<K8sEvent, _>(
            &self.client,
            namespace,
            name,
            None,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        Ok(())
    }
}

/// `reportingController` must be a qualified name (`prefix/name`).
pub fn reporting_controller(controller: &str) -> String {
    format!("{}/{controller}", labels::manager())
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

    use tokio::time::Instant;

    use crate::fake::{self, ApiServer};

    /// What the fake API server answers to every write of an Event.
    fn an_event() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "eventTime": "2026-01-01T00:00:00.000000Z"
        })
    }

    /// Events through an API server that answers after `delay` (never, if `None`).
    fn start(delay: Option<Duration>) -> (Events, Publisher, ApiServer) {
        let server = ApiServer::echoing(an_event()).delayed(delay);
        let (events, publisher) = Events::start(server.client(), "memcached", "pod-1");
        (events, publisher, server)
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
        assert_eq!(requests.requests().len(), 8, "every event was sent");
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

    /// An API server that answers every write with an Event, or PATCH with 404 when
    /// `patch_finds_nothing`.
    fn recording(patch_finds_nothing: bool) -> ApiServer {
        ApiServer::answering(move |request| {
            if request.method == "PATCH" && patch_finds_nothing {
                fake::failure(404, "NotFound", "not found")
            } else {
                (200, an_event())
            }
        })
    }

    fn recorder(server: &ApiServer) -> Recorder {
        Recorder {
            client: server.client(),
            controller: reporting_controller("memcached"),
            instance: "pod-1".into(),
            sent: OwnWrites::default(),
        }
    }

    fn scaled(note: &str) -> Queued {
        Queued {
            regarding: regarding(),
            type_: EventType::Normal,
            reason: "Scaled".into(),
            action: "ScaleDeployment".into(),
            note: note.into(),
        }
    }

    #[tokio::test]
    async fn a_repeated_event_counts_up_the_series_of_the_first() {
        let server = recording(false);
        let recorder = recorder(&server);
        for note in ["first", "again", "and again"] {
            recorder.publish(&scaled(note)).await.expect("published");
        }
        let mut other = scaled("another object");
        other.regarding.uid = Some("u2".into());
        recorder.publish(&other).await.expect("published");

        let requests = server.requests();
        let methods: Vec<&str> = requests.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(methods, ["POST", "PATCH", "PATCH", "POST"]);
        let (path, created) = (&requests[0].path, &requests[0].body);
        assert_eq!(path, "/apis/events.k8s.io/v1/namespaces/default/events");
        assert_eq!(created["note"], "first");
        assert_eq!(created["type"], "Normal");
        assert_eq!(
            created["reportingController"],
            format!("{}/memcached", crate::labels::manager())
        );
        assert_eq!(created["reportingInstance"], "pod-1");
        let name = created["metadata"]["name"].as_str().expect("named");
        assert!(name.starts_with("m."), "{name}");
        for (i, request) in requests[1..3].iter().enumerate() {
            let patch = &request.body;
            assert_eq!(
                &request.path,
                &format!("/apis/events.k8s.io/v1/namespaces/default/events/{name}")
            );
            assert_eq!(patch["series"]["count"], i + 2);
            assert!(patch["series"]["lastObservedTime"].is_string());
        }
    }

    #[tokio::test]
    async fn a_repeat_of_a_deleted_event_is_created_again() {
        let server = recording(true);
        let recorder = recorder(&server);
        recorder.publish(&scaled("first")).await.expect("published");
        recorder.publish(&scaled("again")).await.expect("published");
        let requests = server.requests();
        let methods: Vec<&str> = requests.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(methods, ["POST", "PATCH", "POST"]);
        assert_eq!(requests[2].body["note"], "again");
    }

    #[test]
    fn remembered_events_stay_bounded_and_keep_the_latest() {
        let sent = OwnWrites::default();
        let now = std::time::Instant::now();
        for key in 0..20_000_u64 {
            let series = Series {
                namespace: "default".into(),
                name: format!("m.{key:x}"),
                count: 1,
            };
            let until = now + SERIES_WINDOW + Duration::from_millis(key);
            sent.keep(Subject::EventSeries(key), series, until);
            assert!(
                sent.len() <= 2 * crate::own_writes::MAX_EVENT_SERIES,
                "{} remembered",
                sent.len()
            );
        }
        let remembered =
            |key| (sent.recall(&Subject::EventSeries(key), |_: &mut Series, _| ())).is_some();
        assert!(remembered(19_999), "the latest is remembered");
        assert!(!remembered(0), "the oldest is forgotten");
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
            format!("{}/memcached", crate::labels::manager())
        );
    }
}
