//! Where each object's time in a phase went, step by step, from the API server's audit log.
//!
//! The bench's own watches split an object's time in three ([`super::workload::Split`]): the
//! manager's reaction, the cluster's rollout and the manager's report. The rollout is most of
//! it, and it is several controllers' work in turn. The local cluster's API server records
//! every write with the time it completed, so the log tells, per object, when the manager
//! wrote its Deployment, when the controller manager's Deployment controller scaled a
//! ReplicaSet for it (the wait in that controller's queue), when the ReplicaSet's pods last
//! changed (created, bound by the scheduler and started by the node, or deleted), when the
//! ReplicaSet controller and then the Deployment controller last recorded it in a status, and
//! when the manager reported it.
//!
//! Each step is told by what was written, not by who wrote it: in a phase only the bench
//! writes a Memcached's spec, only the manager its status and its Deployment's spec, only the
//! Deployment controller a ReplicaSet's spec and a Deployment's status, and only the
//! ReplicaSet controller a ReplicaSet's status.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use testkit::AuditEvent;

use super::workload::Spread;

/// One phase's per-object steps, each timed from the step before, in seconds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Timeline {
    /// The objects whose every step the log showed in order; the others are left out.
    pub objects: usize,
    /// From the bench's write of the Memcached until the manager's first write of its
    /// Deployment.
    pub deployment_written: Spread,
    /// From then until the Deployment controller's first write of one of its ReplicaSets: how
    /// long the Deployment waited in that controller's queue.
    pub replica_set_scaled: Spread,
    /// From then until the last write of one of its pods before the step after: created, bound
    /// by the scheduler and started by the node, or deleted.
    pub pods_changed: Spread,
    /// From then until the ReplicaSet controller's last status write of one of its ReplicaSets.
    pub replica_set_status: Spread,
    /// From then until the Deployment controller's last status write of the Deployment before
    /// the report: the rollout recorded.
    pub rolled_out: Spread,
    /// From then until the manager's last status write of the Memcached before the bench saw
    /// it converge.
    pub reported: Spread,
}

impl Timeline {
    /// The steps in order, from the request to the report.
    pub fn steps(&self) -> [&Spread; 6] {
        [
            &self.deployment_written,
            &self.replica_set_scaled,
            &self.pods_changed,
            &self.replica_set_status,
            &self.rolled_out,
            &self.reported,
        ]
    }
}

/// What a write did, as far as the timeline goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    MemcachedSpec,
    MemcachedStatus,
    DeploymentSpec,
    DeploymentStatus,
    ReplicaSetSpec,
    ReplicaSetStatus,
    Pod,
}

impl Write {
    /// The kind of an accepted write and the Deployment (named as its Memcached) it belongs to;
    /// `None` for anything else.
    fn of(event: &AuditEvent) -> Option<(Self, &str)> {
        if !event.succeeded()
            || !matches!(
                event.verb.as_str(),
                "create" | "update" | "patch" | "delete"
            )
        {
            return None;
        }
        let name = event.name.as_str();
        let write = match (event.resource.as_str(), event.subresource.as_str()) {
            ("memcacheds", "") => (Self::MemcachedSpec, name),
            ("memcacheds", "status") => (Self::MemcachedStatus, name),
            ("deployments", "") => (Self::DeploymentSpec, name),
            ("deployments", "status") => (Self::DeploymentStatus, name),
            ("replicasets", "") => (Self::ReplicaSetSpec, owner(name)?),
            ("replicasets", "status") => (Self::ReplicaSetStatus, owner(name)?),
            // The pod itself, its binding and its status alike.
            ("pods", _) => (Self::Pod, owner(owner(name)?)?),
            _ => return None,
        };
        Some(write)
    }
}

/// The owner's name in a generated name, `<owner>-<suffix>`: a ReplicaSet's Deployment, a
/// pod's ReplicaSet.
fn owner(name: &str) -> Option<&str> {
    name.rsplit_once('-').map(|(owner, _)| owner)
}

/// One phase's window: when it started, and per object (`namespace/name`) when the bench saw
/// it converge, in seconds since the Unix epoch.
pub struct Window {
    pub started: f64,
    pub converged: HashMap<String, f64>,
}

/// The timeline of the phase `window` describes, from the audit `events` (any order; events
/// outside the window are ignored).
pub fn timeline(events: &[AuditEvent], window: &Window) -> Timeline {
    let mut writes: HashMap<String, Vec<(f64, Write)>> = HashMap::new();
    for event in events {
        let Some((write, deployment)) = Write::of(event) else {
            continue;
        };
        let key = format!("{}/{deployment}", event.namespace);
        let Some(&converged) = window.converged.get(&key) else {
            continue;
        };
        // The bench can see a write's effect on its watch before the API server logs the
        // write complete, so the window holds what was received in it.
        let received = seconds(event.received);
        if received >= window.started && received <= converged {
            writes
                .entry(key)
                .or_default()
                .push((seconds(event.completed), write));
        }
    }
    let mut steps: [Vec<f64>; 6] = Default::default();
    for object in writes.values_mut() {
        object.sort_by(|a, b| a.0.total_cmp(&b.0));
        if let Some(times) = object_steps(object) {
            for (samples, time) in steps.iter_mut().zip(times) {
                samples.push(time);
            }
        }
    }
    let objects = steps[0].len();
    let [written, scaled, pods, replica_set, rolled_out, reported] = steps.map(|mut samples| {
        samples.sort_by(f64::total_cmp);
        Spread::of(&samples)
    });
    Timeline {
        objects,
        deployment_written: written,
        replica_set_scaled: scaled,
        pods_changed: pods,
        replica_set_status: replica_set,
        rolled_out,
        reported,
    }
}

/// One object's six steps from its writes in time order, or `None` when one is missing.
///
/// The first three are the first of their kind after the step before; the last four are
/// found backwards from the report, each the last of its kind before the step after, so that
/// the passing statuses of a rollout and anything written after the report are no part of it.
fn object_steps(writes: &[(f64, Write)]) -> Option<[f64; 6]> {
    let first_after = |kind: Write, after: f64| {
        writes
            .iter()
            .find(|(at, write)| *write == kind && *at >= after)
            .map(|(at, _)| *at)
    };
    let last_before = |kind: Write, before: f64| {
        writes
            .iter()
            .rev()
            .find(|(at, write)| *write == kind && *at <= before)
            .map(|(at, _)| *at)
    };
    let changed = first_after(Write::MemcachedSpec, f64::NEG_INFINITY)?;
    let written = first_after(Write::DeploymentSpec, changed)?;
    let scaled = first_after(Write::ReplicaSetSpec, written)?;
    let reported = last_before(Write::MemcachedStatus, f64::INFINITY)?;
    let rolled_out = last_before(Write::DeploymentStatus, reported)?;
    let replica_set = last_before(Write::ReplicaSetStatus, rolled_out)?;
    let pods = last_before(Write::Pod, replica_set)?;
    let times = [
        changed,
        written,
        scaled,
        pods,
        replica_set,
        rolled_out,
        reported,
    ];
    if times.windows(2).any(|pair| pair[1] < pair[0]) {
        return None;
    }
    Some(std::array::from_fn(|i| times[i + 1] - times[i]))
}

/// The events of `namespaces` that a timeline uses, from the audit log files of the cluster
/// `state` describes, written to since `since`.
///
/// # Errors
/// Said in words: the cluster keeps no audit log, a file cannot be read, or a line of the
/// namespaces is not an audit event.
pub fn read_cluster_events(
    state: &localcluster::ClusterState,
    namespaces: &HashSet<String>,
    since: SystemTime,
) -> Result<Vec<AuditEvent>, String> {
    let files = state.audit_log_files().map_err(|e| e.to_string())?;
    if files.is_empty() {
        return Err("the cluster keeps no audit log".to_owned());
    }
    read_events(&files, namespaces, since).map_err(|e| e.to_string())
}

/// The audit log's events of `namespaces` that a timeline uses, from the files (as
/// `ClusterState::audit_log_files` lists them) written to since `since`.
///
/// # Errors
/// When a file cannot be read or a line of the namespaces is not an audit event.
fn read_events(
    files: &[PathBuf],
    namespaces: &HashSet<String>,
    since: SystemTime,
) -> testkit::Result<Vec<AuditEvent>> {
    // A rotated file last written before the phase holds nothing of it.
    let recent: Vec<PathBuf> = files
        .iter()
        .filter(|file| {
            std::fs::metadata(file)
                .and_then(|m| m.modified())
                .map_or(true, |modified| modified >= since)
        })
        .cloned()
        .collect();
    let namespaces: Vec<String> = namespaces
        .iter()
        .map(|namespace| format!(r#""namespace":"{namespace}""#))
        .collect();
    let resources = [
        r#""resource":"memcacheds""#,
        r#""resource":"deployments""#,
        r#""resource":"replicasets""#,
        r#""resource":"pods""#,
    ];
    testkit::read_audit_files_where(&recent, |line| {
        namespaces.iter().any(|n| line.contains(n.as_str()))
            && resources.iter().any(|r| line.contains(r))
    })
}

/// Seconds since the Unix epoch of `at` (0 for a time before it).
pub fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// Seconds since the Unix epoch.
pub fn seconds(at: k8s_openapi::jiff::Timestamp) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let nanoseconds = at.as_nanosecond() as f64;
    nanoseconds / 1e9
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    const T0: f64 = 1_800_000_000.0;

    fn event(ms: i64, verb: &str, resource: &str, subresource: &str, name: &str) -> AuditEvent {
        let at = Timestamp::from_millisecond(1_800_000_000_000 + ms).expect("in range");
        AuditEvent {
            verb: verb.into(),
            request_uri: String::new(),
            user_agent: String::new(),
            user: String::new(),
            group: String::new(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: "ns".into(),
            name: name.into(),
            code: 200,
            received: at,
            completed: at,
            request_object: None,
            response_object: None,
        }
    }

    /// A scale-up of `m` as the log records it, starting at `start` ms.
    fn scale_up(start: i64) -> Vec<AuditEvent> {
        vec![
            event(start, "patch", "memcacheds", "", "m"),
            event(start + 100, "patch", "deployments", "", "m"),
            event(start + 150, "update", "deployments", "status", "m"),
            event(start + 1100, "update", "replicasets", "", "m-5d8f"),
            event(start + 1200, "create", "pods", "", "m-5d8f-abcde"),
            event(start + 1300, "create", "pods", "binding", "m-5d8f-abcde"),
            event(start + 1350, "update", "replicasets", "status", "m-5d8f"),
            event(start + 1400, "patch", "pods", "status", "m-5d8f-abcde"),
            event(start + 1450, "patch", "memcacheds", "status", "m"),
            event(start + 1600, "update", "replicasets", "status", "m-5d8f"),
            event(start + 2200, "update", "deployments", "status", "m"),
            event(start + 2500, "patch", "memcacheds", "status", "m"),
        ]
    }

    fn window(started_ms: i64, converged_ms: i64) -> Window {
        #[allow(clippy::cast_precision_loss)]
        let at = |ms: i64| T0 + ms as f64 / 1000.0;
        Window {
            started: at(started_ms),
            converged: HashMap::from([("ns/m".to_owned(), at(converged_ms))]),
        }
    }

    fn p50s(timeline: &Timeline) -> [f64; 6] {
        timeline
            .steps()
            .map(|spread| (spread.p50 * 1000.0).round() / 1000.0)
    }

    #[test]
    fn a_scale_up_splits_into_each_controllers_step() {
        let timeline = timeline(&scale_up(0), &window(0, 2600));
        assert_eq!(timeline.objects, 1);
        // Written after 0.1 s, queued 1.0 s, the pod last changed 0.3 s later, the ReplicaSet's
        // last status 0.2 s after that, rolled out 0.6 s later, reported 0.3 s after.
        assert_eq!(p50s(&timeline), [0.1, 1.0, 0.3, 0.2, 0.6, 0.3]);
    }

    #[test]
    fn writes_outside_the_window_are_no_part_of_it() {
        // The previous phase's writes come before the window, a status write after the
        // convergence the bench saw comes after it.
        let mut events = scale_up(-10_000);
        events.extend(scale_up(0));
        events.push(event(2900, "patch", "memcacheds", "status", "m"));
        events.push(event(2950, "update", "deployments", "status", "m"));
        events.reverse();
        let timeline = timeline(&events, &window(-5, 2600));
        assert_eq!(p50s(&timeline), [0.1, 1.0, 0.3, 0.2, 0.6, 0.3]);
    }

    #[test]
    fn a_report_seen_before_the_log_completed_it_still_counts() {
        let mut events = scale_up(0);
        let report = events.last_mut().expect("the report");
        report.completed = Timestamp::from_millisecond(1_800_000_002_650).expect("in range");
        let timeline = timeline(&events, &window(0, 2600));
        assert_eq!(timeline.objects, 1);
        assert_eq!(p50s(&timeline)[5], 0.45);
    }

    #[test]
    fn a_scale_down_ends_with_the_pod_deleted() {
        let events = vec![
            event(0, "patch", "memcacheds", "", "m"),
            event(200, "patch", "deployments", "", "m"),
            event(700, "update", "replicasets", "", "m-5d8f"),
            event(800, "delete", "pods", "", "m-5d8f-abcde"),
            event(900, "update", "replicasets", "status", "m-5d8f"),
            event(1000, "update", "deployments", "status", "m"),
            event(1100, "patch", "memcacheds", "status", "m"),
        ];
        let timeline = timeline(&events, &window(0, 1200));
        assert_eq!(p50s(&timeline), [0.2, 0.5, 0.1, 0.1, 0.1, 0.1]);
    }

    #[test]
    fn an_object_missing_a_step_or_refused_writes_are_left_out() {
        let mut refused = scale_up(0);
        for e in &mut refused {
            if e.resource == "replicasets" && e.subresource.is_empty() {
                e.code = 409;
            }
        }
        assert_eq!(timeline(&refused, &window(0, 2600)).objects, 0);
        let timeline = timeline(&scale_up(0), &window(0, 1000));
        assert_eq!(timeline.objects, 0, "not reported before it converged");
        assert!(timeline.reported.p50.is_nan());
    }

    #[test]
    fn only_the_objects_of_the_window_count() {
        let mut other = scale_up(0);
        for e in &mut other {
            e.name = e.name.replacen('m', "other", 1);
        }
        assert_eq!(timeline(&other, &window(0, 2600)).objects, 0);
    }

    #[test]
    fn owners_come_from_generated_names() {
        assert_eq!(owner("bench-12-5d8f9c"), Some("bench-12"));
        assert_eq!(owner("bench-12-5d8f9c").and_then(owner), Some("bench"));
        assert_eq!(owner("plain"), None);
    }
}
