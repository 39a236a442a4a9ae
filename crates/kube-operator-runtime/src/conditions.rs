//! The condition types the runtime reports for a workload, following the Kubernetes API
//! conventions (`metav1.Condition`), so tooling like `kubectl wait --for=condition=Available`
//! works.
//!
//! A status reports its conditions to the runtime by implementing `AsRef<[Condition]>`: a
//! standard trait, so the crate of API types needs no dependency on this one.
//!
//! [`set`] sets one condition of any type, as apimachinery's `meta.SetStatusCondition` does;
//! [`merge`] merges all a reconcile decided at once. Both keep `lastTransitionTime` unless the
//! status changes, and set `observedGeneration`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The workload is serving: every desired replica is ready.
pub const AVAILABLE: &str = "Available";
/// The workload is moving towards the desired state (rolling out, scaling).
pub const PROGRESSING: &str = "Progressing";
/// Reconciliation is blocked on something a user must fix; the reason and message say what.
pub const DEGRADED: &str = "Degraded";
/// Everything the object asks for is in place: the one condition of a resource that is not a
/// workload (`kubectl wait --for=condition=Ready`).
pub const READY: &str = "Ready";

/// A condition as a reconcile decides it, before it is merged with what the object reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewCondition {
    /// `type`.
    pub type_: &'static str,
    /// `status`: `True` or `False`.
    pub status: bool,
    /// `reason`: CamelCase, machine-readable.
    pub reason: String,
    /// `message`: for humans.
    pub message: String,
}

impl NewCondition {
    /// A condition.
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Merges freshly decided conditions into the ones an object reports.
///
/// A condition whose status did not change keeps its `lastTransitionTime` (its reason and message
/// may still change); a changed or new one gets `now`. Conditions of other types (written by
/// someone else) are kept as they are, after ours.
pub fn merge(
    old: &[Condition],
    new: impl IntoIterator<Item = NewCondition>,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut merged: Vec<Condition> = new
        .into_iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" }.to_owned();
            let last_transition_time = old
                .iter()
                .find(|o| o.type_ == c.type_ && o.status == status)
                .map_or_else(|| now.clone(), |o| o.last_transition_time.clone());
            Condition {
                type_: c.type_.to_owned(),
                status,
                reason: c.reason,
                message: c.message,
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect();
    let others: Vec<Condition> = old
        .iter()
        .filter(|o| !merged.iter().any(|m| m.type_ == o.type_))
        .cloned()
        .collect();
    merged.extend(others);
    merged
}

/// The current time at the precision the API stores (`metav1.Time` has whole seconds), so a
/// freshly built status compares equal to the same status read back.
pub fn now() -> Time {
    let now = Timestamp::now();
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Sets `condition` among `conditions`, as apimachinery's `meta.SetStatusCondition` does: a
/// condition of that type is replaced, keeping its `lastTransitionTime` when its status is
/// unchanged; a new type is appended with `now`. Either way it gets `observedGeneration`
/// `generation`. Returns whether anything changed (so a status write can be skipped).
pub fn set(
    conditions: &mut Vec<Condition>,
    condition: NewCondition,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let status = if condition.status { "True" } else { "False" };
    let existing = conditions.iter_mut().find(|c| c.type_ == condition.type_);
    let Some(existing) = existing else {
        conditions.push(Condition {
            type_: condition.type_.to_owned(),
            status: status.to_owned(),
            reason: condition.reason,
            message: condition.message,
            observed_generation: generation,
            last_transition_time: now.clone(),
        });
        return true;
    };
    let before = existing.clone();
    if existing.status != status {
        existing.status = status.to_owned();
        existing.last_transition_time = now.clone();
    }
    existing.reason = condition.reason;
    existing.message = condition.message;
    existing.observed_generation = generation;
    *existing != before
}

/// The condition of `type_` among `conditions`, if there is one.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether `conditions` hold `type_` with status `True` (`meta.IsStatusConditionTrue`).
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    #[test]
    fn set_keeps_the_transition_time_until_the_status_changes() {
        let mut conditions = Vec::new();
        let ready = |status, reason: &str| NewCondition::new("Ready", status, reason, "m");
        assert!(set(
            &mut conditions,
            ready(false, "Creating"),
            Some(1),
            &at(10)
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert!(!is_true(&conditions, "Ready"));

        assert!(set(
            &mut conditions,
            ready(false, "Waiting"),
            Some(2),
            &at(20)
        ));
        let c = find(&conditions, "Ready").expect("set");
        assert_eq!(
            (c.reason.as_str(), c.observed_generation),
            ("Waiting", Some(2))
        );
        assert_eq!(
            c.last_transition_time,
            at(10),
            "same status, same transition"
        );

        assert!(set(&mut conditions, ready(true, "Ready"), Some(2), &at(30)));
        assert_eq!(conditions[0].last_transition_time, at(30));
        assert!(is_true(&conditions, "Ready"));

        assert!(
            !set(&mut conditions, ready(true, "Ready"), Some(2), &at(40)),
            "nothing changed"
        );
        assert_eq!(conditions[0].last_transition_time, at(30));
    }

    #[test]
    fn set_leaves_other_types_alone() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            NewCondition::new("A", true, "R", ""),
            None,
            &at(1),
        );
        set(
            &mut conditions,
            NewCondition::new("B", false, "R", ""),
            None,
            &at(2),
        );
        set(
            &mut conditions,
            NewCondition::new("A", false, "S", ""),
            None,
            &at(3),
        );
        let types: Vec<(&str, &str)> = conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(types, [("A", "False"), ("B", "False")]);
        assert_eq!(conditions[1].last_transition_time, at(2));
    }

    #[test]
    fn now_has_whole_seconds() {
        assert_eq!(now().0.subsec_nanosecond(), 0);
    }
}
