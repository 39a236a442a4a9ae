//! Kubernetes Events for what a user should see: created, scaled, updated, failed.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::labels;

/// The Events API limit on a note.
const MAX_NOTE_BYTES: usize = 1024;

/// Publishes `events.k8s.io/v1` Events for one controller. A failure to publish is logged and
/// otherwise ignored: an Event is information, never a reason to fail a reconcile.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// Events reported by `operator-manager/<controller>` from `instance` (the pod name
    /// in-cluster; empty for "unknown").
    pub fn new(client: kube::Client, controller: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: reporting_controller(controller),
            instance: (!instance.is_empty()).then(|| instance.to_owned()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// A `Normal` event about `regarding`.
    pub async fn normal(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.publish(regarding, EventType::Normal, reason, action, note)
            .await;
    }

    /// A `Warning` event about `regarding`.
    pub async fn warning(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.publish(regarding, EventType::Warning, reason, action, note)
            .await;
    }

    async fn publish(
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
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            let e = crate::Error::Kube(e);
            if e.is_namespace_terminating() {
                tracing::debug!(
                    reason,
                    "not publishing an event: the namespace is being deleted"
                );
            } else {
                tracing::warn!(reason, error = %e, "cannot publish event");
            }
        }
    }
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
