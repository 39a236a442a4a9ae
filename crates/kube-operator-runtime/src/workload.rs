//! How far a workload has come, whatever runs it: a Deployment, a StatefulSet, a DaemonSet or
//! a Job reports its progress through [`Workload`], so an owner's status, its conditions and
//! the holding of status writes ([`crate::status`], [`crate::status_writer`]) work the same for
//! each.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;

use crate::deployment_view::DeploymentView;

/// What a workload's controller reports of its progress, read from the workload's status.
pub trait Workload {
    /// The pods (or, for a Job, completions) its spec asks for, when it decides that itself: a
    /// DaemonSet's count comes from the nodes, a Job's from `completions`. `None` when the
    /// owner's spec says, as for a Deployment or a StatefulSet.
    fn desired(&self) -> Option<i32> {
        None
    }
    /// The pods it has now, of every revision.
    fn current(&self) -> i32;
    /// Its pods of the current revision (of the latest pod template).
    fn updated(&self) -> i32;
    /// Its ready pods (for a Job, the completed ones count too).
    fn ready(&self) -> i32;
    /// Its ready pods that have been ready for `minReadySeconds`.
    fn available(&self) -> i32 {
        self.ready()
    }
    /// Whether its controller has seen its latest spec: `status.observedGeneration` has reached
    /// `metadata.generation`.
    fn observed(&self) -> bool;
    /// Whether it reached a state that lasts until its spec changes: every pod of the current
    /// revision and available, or a Job that completed.
    fn settled(&self, desired: i32) -> bool {
        self.observed()
            && self.available() >= desired
            && self.updated() == desired
            && self.current() == desired
    }
    /// A failure it reports, as a reason and a message: it will not get further by itself.
    fn failed(&self) -> Option<(String, String)>;
}

/// Whether `observed_generation` has reached `generation` (a workload without a generation
/// has nothing to observe).
fn reached(observed_generation: Option<i64>, generation: Option<i64>) -> bool {
    match (observed_generation, generation) {
        (Some(seen), Some(generation)) => seen >= generation,
        (_, None) => true,
        (None, Some(_)) => false,
    }
}

/// The condition among `conditions` (type, status, reason, message) that says a workload
/// failed: one of `failure_types` with status `True`, or `Progressing=False` for a missed
/// progress deadline.
fn failure<'a>(
    conditions: impl Iterator<Item = (&'a str, &'a str, Option<&'a str>, Option<&'a str>)>,
    failure_types: &[&str],
) -> Option<(String, String)> {
    conditions
        .into_iter()
        .find(|(type_, status, reason, _)| {
            (failure_types.contains(type_) && *status == "True")
                || (*type_ == "Progressing"
                    && *status == "False"
                    && *reason == Some("ProgressDeadlineExceeded"))
        })
        .map(|(type_, _, reason, message)| {
            let reason = reason.unwrap_or(type_).to_owned();
            (reason, message.unwrap_or_default().to_owned())
        })
}

/// A Deployment and the view of one the caches keep read the same status.
macro_rules! deployment_workload {
    ($type:ty) => {
        impl Workload for $type {
            fn current(&self) -> i32 {
                self.status.as_ref().and_then(|s| s.replicas).unwrap_or(0)
            }

            fn updated(&self) -> i32 {
                let status = self.status.as_ref();
                status.and_then(|s| s.updated_replicas).unwrap_or(0)
            }

            fn ready(&self) -> i32 {
                let status = self.status.as_ref();
                status.and_then(|s| s.ready_replicas).unwrap_or(0)
            }

            fn available(&self) -> i32 {
                let status = self.status.as_ref();
                status.and_then(|s| s.available_replicas).unwrap_or(0)
            }

            fn observed(&self) -> bool {
                let seen = self.status.as_ref().and_then(|s| s.observed_generation);
                reached(seen, self.metadata.generation)
            }

            fn failed(&self) -> Option<(String, String)> {
                let conditions = self.status.as_ref().and_then(|s| s.conditions.as_ref());
                let conditions = conditions.into_iter().flatten().map(|c| {
                    (
                        c.type_.as_deref().unwrap_or_default(),
                        c.status.as_deref().unwrap_or_default(),
                        c.reason.as_deref(),
                        c.message.as_deref(),
                    )
                });
                failure(conditions, &["ReplicaFailure"])
            }
        }
    };
}

deployment_workload!(Deployment);
deployment_workload!(DeploymentView);

impl Workload for StatefulSet {
    fn current(&self) -> i32 {
        self.status.as_ref().map_or(0, |s| s.replicas)
    }

    fn updated(&self) -> i32 {
        let status = self.status.as_ref();
        status.and_then(|s| s.updated_replicas).unwrap_or(0)
    }

    fn ready(&self) -> i32 {
        let status = self.status.as_ref();
        status.and_then(|s| s.ready_replicas).unwrap_or(0)
    }

    fn available(&self) -> i32 {
        let status = self.status.as_ref();
        status.and_then(|s| s.available_replicas).unwrap_or(0)
    }

    fn observed(&self) -> bool {
        let seen = self.status.as_ref().and_then(|s| s.observed_generation);
        reached(seen, self.metadata.generation)
    }

    /// As for any workload, and the rollout's revision is the current one: a StatefulSet
    /// replaces its pods one at a time, counting each new pod as updated before the revision
    /// completes.
    fn settled(&self, desired: i32) -> bool {
        let status = self.status.as_ref();
        let revision_done = status
            .is_none_or(|s| s.update_revision.is_none() || s.update_revision == s.current_revision);
        revision_done
            && self.observed()
            && self.available() >= desired
            && self.updated() == desired
            && self.current() == desired
    }

    fn failed(&self) -> Option<(String, String)> {
        // A StatefulSet reports no failure condition; a stuck rollout shows as pods that do
        // not get ready.
        None
    }
}

impl Workload for DaemonSet {
    fn desired(&self) -> Option<i32> {
        Some(
            self.status
                .as_ref()
                .map_or(0, |s| s.desired_number_scheduled),
        )
    }

    fn current(&self) -> i32 {
        self.status
            .as_ref()
            .map_or(0, |s| s.current_number_scheduled)
    }

    fn updated(&self) -> i32 {
        let status = self.status.as_ref();
        status.and_then(|s| s.updated_number_scheduled).unwrap_or(0)
    }

    fn ready(&self) -> i32 {
        self.status.as_ref().map_or(0, |s| s.number_ready)
    }

    fn available(&self) -> i32 {
        let status = self.status.as_ref();
        status.and_then(|s| s.number_available).unwrap_or(0)
    }

    fn observed(&self) -> bool {
        let seen = self.status.as_ref().and_then(|s| s.observed_generation);
        reached(seen, self.metadata.generation)
    }

    fn failed(&self) -> Option<(String, String)> {
        None
    }
}

impl Workload for Job {
    /// `spec.completions`, or 1 when unset (a Job that runs one pod to completion).
    fn desired(&self) -> Option<i32> {
        Some(self.spec.as_ref().and_then(|s| s.completions).unwrap_or(1))
    }

    /// The pods running now, and those that completed.
    fn current(&self) -> i32 {
        let status = self.status.as_ref();
        status.map_or(0, |s| s.active.unwrap_or(0) + s.succeeded.unwrap_or(0))
    }

    /// A Job's pod template cannot change: all its pods are of the current revision.
    fn updated(&self) -> i32 {
        self.current()
    }

    /// The ready pods, and those that completed.
    fn ready(&self) -> i32 {
        let status = self.status.as_ref();
        status.map_or(0, |s| s.ready.unwrap_or(0) + s.succeeded.unwrap_or(0))
    }

    /// A Job has no generation its controller reports.
    fn observed(&self) -> bool {
        true
    }

    /// The Job completed (`Complete=True`), or failed.
    fn settled(&self, _desired: i32) -> bool {
        let conditions = self.status.as_ref().and_then(|s| s.conditions.as_ref());
        let complete = conditions
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Complete" && c.status == "True");
        complete || self.failed().is_some()
    }

    fn failed(&self) -> Option<(String, String)> {
        let conditions = self.status.as_ref().and_then(|s| s.conditions.as_ref());
        let conditions = conditions.into_iter().flatten().map(|c| {
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_deref(),
                c.message.as_deref(),
            )
        });
        failure(conditions, &["Failed"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{
        DaemonSetStatus, DeploymentCondition, DeploymentStatus, StatefulSetStatus,
    };
    use k8s_openapi::api::batch::v1::{JobCondition, JobSpec, JobStatus};
    use kube::api::ObjectMeta;

    fn generation(generation: i64) -> ObjectMeta {
        ObjectMeta {
            generation: Some(generation),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_deployment_settles_when_every_pod_is_updated_and_available() {
        let mut deployment = Deployment {
            metadata: generation(2),
            status: Some(DeploymentStatus {
                observed_generation: Some(2),
                replicas: Some(3),
                updated_replicas: Some(2),
                ready_replicas: Some(3),
                available_replicas: Some(3),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        };
        assert!(!deployment.settled(3), "an old pod remains");
        let status = deployment.status.as_mut().expect("status");
        status.updated_replicas = Some(3);
        assert!(deployment.settled(3));
        assert!(!deployment.settled(4), "one short");
        deployment.metadata.generation = Some(3);
        assert!(
            !deployment.settled(3),
            "its controller has not seen the new spec"
        );
        let view = DeploymentView::from(deployment);
        assert!(!view.observed());
    }

    #[test]
    fn a_deployment_past_its_progress_deadline_failed() {
        let deployment = Deployment {
            status: Some(DeploymentStatus {
                conditions: Some(vec![DeploymentCondition {
                    type_: Some("Progressing".into()),
                    status: Some("False".into()),
                    reason: Some("ProgressDeadlineExceeded".into()),
                    message: Some("took too long".into()),
                    ..DeploymentCondition::default()
                }]),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        };
        let failed = deployment.failed();
        assert_eq!(
            failed,
            Some(("ProgressDeadlineExceeded".into(), "took too long".into()))
        );
        assert_eq!(DeploymentView::from(deployment).failed(), failed);
    }

    #[test]
    fn a_stateful_set_settles_only_once_its_revision_is_current() {
        let mut set = StatefulSet {
            metadata: generation(1),
            status: Some(StatefulSetStatus {
                observed_generation: Some(1),
                replicas: 3,
                updated_replicas: Some(3),
                ready_replicas: Some(3),
                available_replicas: Some(3),
                current_revision: Some("web-1".into()),
                update_revision: Some("web-2".into()),
                ..StatefulSetStatus::default()
            }),
            ..StatefulSet::default()
        };
        assert!(!set.settled(3), "the revision is still rolling");
        if let Some(status) = set.status.as_mut() {
            status.current_revision = Some("web-2".into());
        }
        assert!(set.settled(3));
        assert_eq!(set.desired(), None, "the owner says how many");
    }

    #[test]
    fn a_daemon_set_wants_a_pod_per_scheduled_node() {
        let set = DaemonSet {
            metadata: generation(1),
            status: Some(DaemonSetStatus {
                observed_generation: Some(1),
                desired_number_scheduled: 2,
                current_number_scheduled: 2,
                updated_number_scheduled: Some(2),
                number_ready: 1,
                number_available: Some(1),
                ..DaemonSetStatus::default()
            }),
            ..DaemonSet::default()
        };
        assert_eq!(set.desired(), Some(2));
        assert!(!set.settled(2), "one pod not yet available");
    }

    #[test]
    fn a_job_settles_when_complete_or_failed() {
        let condition = |type_: &str| JobCondition {
            type_: type_.into(),
            status: "True".into(),
            reason: Some(format!("{type_}Reason")),
            message: Some("done".into()),
            ..JobCondition::default()
        };
        let mut job = Job {
            spec: Some(JobSpec {
                completions: Some(2),
                ..JobSpec::default()
            }),
            status: Some(JobStatus {
                active: Some(1),
                succeeded: Some(1),
                ready: Some(1),
                ..JobStatus::default()
            }),
            ..Job::default()
        };
        assert_eq!((job.desired(), job.current(), job.ready()), (Some(2), 2, 2));
        assert!(!job.settled(2) && job.failed().is_none());
        let status = job.status.as_mut().expect("status");
        status.conditions = Some(vec![condition("Failed")]);
        assert_eq!(job.failed().map(|f| f.0), Some("FailedReason".into()));
        assert!(job.settled(2));
        let status = job.status.as_mut().expect("status");
        status.conditions = Some(vec![condition("Complete")]);
        assert!(job.settled(2) && job.failed().is_none());
    }
}
