//! Status shared by the workload controllers: how far an owned workload (a Deployment, a
//! StatefulSet, a DaemonSet, a Job: any [`Workload`]) has rolled out, and the `Available` /
//! `Progressing` / `Degraded` conditions that describe it.

use crate::conditions::{AVAILABLE, DEGRADED, NewCondition, PROGRESSING, READY, merge};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::status_writer::{Progress, WithStatus};
use crate::workload::Workload;

/// Condition reason when a Deployment of the custom resource's name exists and something else
/// controls it.
pub const REASON_NOT_OWNED: &str = "DeploymentNotOwned";

/// A custom resource that owns a workload and reports its progress: any custom resource whose
/// status reports conditions.
pub trait WorkloadOwner: WithStatus<Status: AsRef<[Condition]>> {
    /// The conditions its status reports now.
    fn current_conditions(&self) -> &[Condition] {
        self.status().map(AsRef::as_ref).unwrap_or_default()
    }
}

impl<K: WithStatus<Status: AsRef<[Condition]>>> WorkloadOwner for K {}

/// The [`Progress`] of a new status for a custom resource asking for `desired` replicas of
/// `workload` (`None` when it is blocked by a foreign one), which now reports
/// `reported`. Moving when the new state is a passing one and the reported one is not a failure:
/// a resource that reported a failure or a block and leaves it is news to report at once, while
/// a complete one that starts a rollout reports it once a step of it has stood (or with its end,
/// when that comes first), like any other step.
pub fn progress<W: Workload + kube::Resource<DynamicType = ()>>(
    desired: i32,
    workload: Option<&W>,
    reported: &[Condition],
) -> Progress {
    let reports_failure = reported
        .iter()
        .any(|c| c.type_ == DEGRADED && c.status == "True");
    match workload {
        Some(w) if !reports_failure => Rollout::of(desired, w).progress(),
        _ => Progress::Settled,
    }
}

/// What an owned workload reports, reduced to what the conditions need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rollout {
    /// The workload's kind, for messages.
    pub kind: std::borrow::Cow<'static, str>,
    /// Replicas the custom resource asks for (or the workload, when it decides: see
    /// [`Workload::desired`]).
    pub desired: i32,
    /// Pods the workload has (old and new).
    pub replicas: i32,
    /// Pods of the current template.
    pub updated: i32,
    /// Ready pods.
    pub ready: i32,
    /// Available pods (ready for `minReadySeconds`).
    pub available: i32,
    /// Whether the workload's controller has seen its latest spec.
    pub observed: bool,
    /// Whether the workload reached a state that lasts ([`Workload::settled`]).
    pub settled: bool,
    /// A failure the workload reports (a Deployment's `ReplicaFailure`, or `Progressing=False`
    /// because the progress deadline passed; a Job's `Failed`): reason and message.
    pub failure: Option<(String, String)>,
}

impl Rollout {
    /// Reads `workload`'s status against `desired` replicas.
    pub fn of<W: Workload + kube::Resource<DynamicType = ()>>(desired: i32, workload: &W) -> Self {
        let desired = workload.desired().unwrap_or(desired);
        Self {
            kind: W::kind(&()),
            desired,
            replicas: workload.current(),
            updated: workload.updated(),
            ready: workload.ready(),
            available: workload.available(),
            observed: workload.observed(),
            settled: workload.settled(desired),
            failure: workload.failed(),
        }
    }

    /// Whether this is a state that lasts (complete, or failed) or one the rollout passes
    /// through.
    pub fn progress(&self) -> Progress {
        if self.is_complete() || self.failure.is_some() {
            Progress::Settled
        } else {
            Progress::Moving
        }
    }

    /// Every desired replica is available.
    pub fn is_available(&self) -> bool {
        self.observed && self.available >= self.desired
    }

    /// The workload has exactly the desired pods, all of the current template and available
    /// (or, for a Job, it ran to its end).
    pub fn is_complete(&self) -> bool {
        self.settled
    }

    /// Whether an owner reading this state instead of `earlier` (both against the same desired
    /// replicas) could write anything sooner than at the rollout's end. Between two passing
    /// states with the same conditions and ready pods, what differs (how many pods exist, how
    /// many are of the current template) is a detail the status waits to write until the
    /// rollout settles (see [`crate::status_writer::StatusWriter`]), and the settled state
    /// differs in its conditions.
    pub fn is_news_after(&self, earlier: &Self) -> bool {
        let passing = |r: &Self| r.progress() == Progress::Moving;
        self != earlier
            && !(passing(self)
                && passing(earlier)
                && self.ready == earlier.ready
                && self.conditions() == earlier.conditions())
    }

    /// The `Ready` condition of an owner that reports one condition for its workload: `True`
    /// once the rollout is complete (`AllReplicasReady`), `False` with the workload's failure,
    /// or `RollingOut` on the way.
    pub fn ready(&self) -> NewCondition {
        let (ready, desired, updated) = (self.ready, self.desired, self.updated);
        match &self.failure {
            Some((reason, message)) => NewCondition::new(READY, false, reason, message),
            None if self.is_complete() => {
                let message = format!("{ready} of {desired} replicas ready");
                NewCondition::new(READY, true, "AllReplicasReady", message)
            }
            None => {
                let message = format!("{ready} of {desired} replicas ready, {updated} updated");
                NewCondition::new(READY, false, "RollingOut", message)
            }
        }
    }

    /// The three conditions this rollout state implies.
    pub fn conditions(&self) -> [NewCondition; 3] {
        let (desired, ready) = (self.desired, self.ready);
        let available = if self.is_available() {
            NewCondition::new(
                AVAILABLE,
                true,
                "AllReplicasReady",
                format!("{ready} of {desired} replicas ready"),
            )
        } else {
            NewCondition::new(
                AVAILABLE,
                false,
                "ReplicasNotReady",
                format!("{ready} of {desired} replicas ready"),
            )
        };
        let kind = &self.kind;
        let progressing = if !self.observed {
            NewCondition::new(
                PROGRESSING,
                true,
                format!("{kind}Updating"),
                format!("the {kind} controller has not yet seen the latest spec"),
            )
        } else if self.updated < self.replicas {
            // Pods of an older template remain.
            let updated = self.updated;
            NewCondition::new(
                PROGRESSING,
                true,
                "RollingOut",
                format!("{updated} of {desired} replicas updated"),
            )
        } else if self.replicas > desired {
            let replicas = self.replicas;
            NewCondition::new(
                PROGRESSING,
                true,
                "ScalingDown",
                format!("{replicas} replicas, {desired} desired"),
            )
        } else if !self.is_complete() {
            let available = self.available;
            NewCondition::new(
                PROGRESSING,
                true,
                "ScalingUp",
                format!("{available} of {desired} replicas available"),
            )
        } else {
            NewCondition::new(
                PROGRESSING,
                false,
                "RolloutComplete",
                format!("{desired} replicas up to date and available"),
            )
        };
        let degraded = match &self.failure {
            Some((reason, message)) => NewCondition::new(DEGRADED, true, reason, message),
            None => NewCondition::new(
                DEGRADED,
                false,
                "AsExpected",
                format!("the {kind} reports no failure"),
            ),
        };
        [available, progressing, degraded]
    }
}

/// What every owner of one Deployment reports in its status.
#[derive(Clone, Debug, PartialEq)]
pub struct Reported {
    /// Pods of the Deployment.
    pub replicas: i32,
    /// Ready pods.
    pub ready: i32,
    /// The owner's `metadata.generation` this report is about.
    pub observed_generation: Option<i64>,
    /// `Available`, `Progressing` and `Degraded`; those whose status holds keep their
    /// transition time.
    pub conditions: Vec<Condition>,
}

/// What `owner`, asking for `desired` replicas, reports given its Deployment (`None` when a
/// foreign one blocks it), at `now`.
pub fn report<K: WorkloadOwner, W: Workload + kube::Resource<DynamicType = ()>>(
    owner: &K,
    desired: i32,
    workload: Option<&W>,
    now: &Time,
) -> Reported {
    let generation = owner.meta().generation;
    let (replicas, ready, conditions) = match workload {
        Some(w) => {
            let rollout = Rollout::of(desired, w);
            (rollout.replicas, rollout.ready, rollout.conditions())
        }
        None => {
            let namespace = owner.namespace().unwrap_or_default();
            let kind = K::kind(&());
            (
                0,
                0,
                not_owned_conditions(&namespace, &owner.name_any(), &kind),
            )
        }
    };
    Reported {
        replicas,
        ready,
        observed_generation: generation,
        conditions: merge(owner.current_conditions(), conditions, generation, now),
    }
}

/// The conditions of a custom resource whose Deployment name is taken by an object it does not
/// control: nothing runs for it, and a user has to act.
pub fn not_owned_conditions(namespace: &str, name: &str, kind: &str) -> [NewCondition; 3] {
    let message = format!(
        "Deployment {namespace}/{name} exists and is not controlled by this {kind}; \
         it is left untouched: delete or rename it, or rename the {kind}"
    );
    [
        NewCondition::new(AVAILABLE, false, REASON_NOT_OWNED, &message),
        NewCondition::new(PROGRESSING, false, REASON_NOT_OWNED, &message),
        NewCondition::new(DEGRADED, true, REASON_NOT_OWNED, &message),
    ]
}

/// Whether `conditions` already hold `type_` as `True` for `reason` (so an Event about it was
/// already published, unless the cache is behind).
pub fn reports(conditions: &[Condition], type_: &str, reason: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True" && c.reason == reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::now;
    use crate::deployment_view::DeploymentView;
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    fn deployment(generation: i64, status: DeploymentStatus) -> DeploymentView {
        DeploymentView {
            metadata: ObjectMeta {
                generation: Some(generation),
                ..ObjectMeta::default()
            },
            status: Some(status),
            ..DeploymentView::default()
        }
    }

    fn settled(n: i32) -> DeploymentStatus {
        DeploymentStatus {
            observed_generation: Some(1),
            replicas: Some(n),
            updated_replicas: Some(n),
            ready_replicas: Some(n),
            available_replicas: Some(n),
            ..DeploymentStatus::default()
        }
    }

    fn by_type<'a>(conditions: &'a [NewCondition], type_: &str) -> &'a NewCondition {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("{type_} missing"))
    }

    #[test]
    fn settled_deployment_is_available_and_not_progressing() {
        let rollout = Rollout::of(3, &deployment(1, settled(3)));
        assert!(rollout.is_complete());
        let conditions = rollout.conditions();
        assert!(by_type(&conditions, AVAILABLE).status);
        assert!(!by_type(&conditions, PROGRESSING).status);
        assert!(!by_type(&conditions, DEGRADED).status);
        assert_eq!(
            by_type(&conditions, AVAILABLE).message,
            "3 of 3 replicas ready"
        );
    }

    #[test]
    fn scaling_up_is_progressing_and_unavailable() {
        let mut status = settled(3);
        status.replicas = Some(5);
        status.updated_replicas = Some(5);
        let rollout = Rollout::of(5, &deployment(1, status));
        let conditions = rollout.conditions();
        assert!(!by_type(&conditions, AVAILABLE).status);
        assert_eq!(by_type(&conditions, PROGRESSING).reason, "ScalingUp");
    }

    #[test]
    fn scaling_up_before_the_new_pods_exist_is_not_a_rollout() {
        // The Deployment controller has seen size 3 but the pods are not there yet: every
        // existing pod runs the current template.
        let rollout = Rollout::of(3, &deployment(1, settled(1)));
        assert_eq!(
            by_type(&rollout.conditions(), PROGRESSING).reason,
            "ScalingUp"
        );
        assert_eq!(rollout.progress(), Progress::Moving);
    }

    #[test]
    fn pods_of_an_older_template_are_a_rollout() {
        let mut status = settled(3);
        status.replicas = Some(4);
        status.updated_replicas = Some(1);
        let rollout = Rollout::of(3, &deployment(1, status));
        assert_eq!(
            by_type(&rollout.conditions(), PROGRESSING).reason,
            "RollingOut"
        );
    }

    fn failed_status() -> DeploymentStatus {
        let mut failed = settled(1);
        failed.conditions = Some(vec![DeploymentCondition {
            type_: Some("ReplicaFailure".into()),
            status: Some("True".into()),
            reason: Some("FailedCreate".into()),
            message: Some("quota".into()),
            ..DeploymentCondition::default()
        }]);
        failed
    }

    #[test]
    fn complete_failed_and_blocked_are_settled() {
        assert_eq!(
            progress(3, Some(&deployment(1, settled(3))), &[]),
            Progress::Settled
        );
        assert_eq!(
            progress(3, Some(&deployment(1, failed_status())), &[]),
            Progress::Settled
        );
        assert_eq!(progress::<DeploymentView>(3, None, &[]), Progress::Settled);
        let moving = deployment(2, settled(3));
        assert_eq!(progress(3, Some(&moving), &[]), Progress::Moving);

        // Leaving a failure is reported at once; a rollout's steps, from a complete state or
        // from another step, may wait.
        let reported = |status: DeploymentStatus| {
            let now = now();
            merge(
                &[],
                Rollout::of(3, &deployment(1, status)).conditions(),
                Some(1),
                &now,
            )
        };
        assert_eq!(
            progress(3, Some(&moving), &reported(failed_status())),
            Progress::Settled
        );
        assert_eq!(
            progress(3, Some(&moving), &reported(settled(3))),
            Progress::Moving
        );
        assert_eq!(
            progress(3, Some(&moving), &reported(settled(1))),
            Progress::Moving
        );
    }

    #[test]
    fn unobserved_generation_is_progressing() {
        let rollout = Rollout::of(3, &deployment(2, settled(3)));
        assert!(!rollout.is_available());
        assert_eq!(
            by_type(&rollout.conditions(), PROGRESSING).reason,
            "DeploymentUpdating"
        );
    }

    #[test]
    fn scaled_to_zero_is_available() {
        let rollout = Rollout::of(
            0,
            &deployment(
                1,
                DeploymentStatus {
                    observed_generation: Some(1),
                    ..DeploymentStatus::default()
                },
            ),
        );
        assert!(rollout.is_complete());
    }

    #[test]
    fn replica_failure_is_degraded_with_its_reason() {
        let mut status = settled(0);
        status.conditions = Some(vec![DeploymentCondition {
            type_: Some("ReplicaFailure".into()),
            status: Some("True".into()),
            reason: Some("FailedCreate".into()),
            message: Some("pods are forbidden".into()),
            ..DeploymentCondition::default()
        }]);
        let conditions = Rollout::of(3, &deployment(1, status)).conditions();
        let degraded = by_type(&conditions, DEGRADED);
        assert!(degraded.status);
        assert_eq!(degraded.reason, "FailedCreate");
        assert_eq!(degraded.message, "pods are forbidden");
    }

    #[test]
    fn not_owned_is_degraded() {
        let conditions = not_owned_conditions("ns", "mc", "Memcached");
        let degraded = by_type(&conditions, DEGRADED);
        assert!(degraded.status);
        assert_eq!(degraded.reason, REASON_NOT_OWNED);
        assert!(degraded.message.contains("ns/mc"));
        assert!(!by_type(&conditions, AVAILABLE).status);
    }

    #[test]
    fn transition_time_is_kept_while_status_holds() {
        let first = merge(
            &[],
            Rollout::of(3, &deployment(1, settled(1))).conditions(),
            Some(1),
            &at(100),
        );
        assert!(first.iter().all(|c| c.last_transition_time == at(100)));

        // Same statuses, new message: times kept.
        let second = merge(
            &first,
            Rollout::of(3, &deployment(1, settled(2))).conditions(),
            Some(1),
            &at(200),
        );
        assert!(
            second.iter().all(|c| c.last_transition_time == at(100)),
            "{second:?}"
        );
        let available = second
            .iter()
            .find(|c| c.type_ == AVAILABLE)
            .map(|c| c.message.as_str());
        assert_eq!(available, Some("2 of 3 replicas ready"));

        // Available and Progressing flip; Degraded does not.
        let third = merge(
            &second,
            Rollout::of(3, &deployment(1, settled(3))).conditions(),
            Some(2),
            &at(300),
        );
        let time = |t: &str| {
            third
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| c.last_transition_time.clone())
        };
        assert_eq!(time(AVAILABLE), Some(at(300)));
        assert_eq!(time(PROGRESSING), Some(at(300)));
        assert_eq!(time(DEGRADED), Some(at(100)));
        assert!(third.iter().all(|c| c.observed_generation == Some(2)));
    }

    #[test]
    fn foreign_condition_types_are_kept() {
        let foreign = Condition {
            type_: "Custom".into(),
            status: "True".into(),
            reason: "Set".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: at(1),
        };
        let merged = merge(
            std::slice::from_ref(&foreign),
            not_owned_conditions("a", "b", "MyApp"),
            None,
            &at(2),
        );
        assert_eq!(merged.len(), 4);
        assert_eq!(merged.last(), Some(&foreign));
    }

    #[test]
    fn reports_finds_a_true_condition_by_reason() {
        let merged = merge(&[], not_owned_conditions("a", "b", "MyApp"), None, &at(2));
        assert!(reports(&merged, DEGRADED, REASON_NOT_OWNED));
        assert!(
            !reports(&merged, AVAILABLE, REASON_NOT_OWNED),
            "Available is False"
        );
        assert!(!reports(&[], DEGRADED, REASON_NOT_OWNED));
    }
}
