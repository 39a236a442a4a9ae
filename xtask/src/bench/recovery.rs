//! Recovery: how soon a manager acts again after the API server was away, and how soon it
//! notices that the Deployment blocking a Memcached is gone.
//!
//! - *Outages*: with a few Memcacheds converged, the API server is stopped for
//!   `--outage-seconds` and started again; the moment it is ready, every Memcached is scaled.
//!   Timed from readiness: until the manager has scaled each Deployment (its own part), until
//!   the cluster has rolled each out, and until each Memcached has reported it (the manager's
//!   part again). The API server's audit log tells when the manager and each of the cluster's
//!   components a rollout needs (the Deployment and ReplicaSet controllers, the scheduler,
//!   kwok) first wrote again. This runs twice:
//!   - with the API server alone away ([`Outage::ApiServer`]): the cluster's own clients keep
//!     running and reconnect on client-go's backoff, which after a 20 s outage brings them back
//!     anywhere up to a minute after the API server, and the rollout waits for them;
//!   - with the control plane's own clients stopped and started with it
//!     ([`Outage::ControlPlane`]), as when every control-plane process restarts: they start
//!     fresh once the API server is ready, so what is left to wait for after the API server's
//!     return is the manager's own reconnection and the cluster's startup.
//!
//!   The manager runs with a Lease longer than the outage, so it keeps leading through it, as a
//!   manager whose API server restarts quickly would.
//! - *Foreign Deployment*: a Memcached whose name a Deployment of somebody else's holds reports
//!   it; a second later that Deployment is deleted, and the clock runs until the Memcached's
//!   own exists.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use apis::Memcached;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use localcluster::{LocalCluster, Outage};
use serde::{Deserialize, Serialize};
use serde_json::json;
use testkit::{AuditEvent, ManagerProcess, ServiceAccountKubeconfig, TestCluster, TestNamespace};

use super::tenants::populate;
use super::timeline;
use super::workload::{self, delete_and_wait, is_converged, is_rolled_out};
use super::{BenchArgs, Contender};

/// Memcacheds scaled right after the outage.
const OBJECTS: usize = 20;
/// The leader-election timing during this phase: longer than any outage measured, so the
/// manager keeps its Lease through it.
const LEASE_FLAGS: [&str; 3] = [
    "--lease-duration=120s",
    "--renew-deadline=90s",
    "--retry-period=2s",
];
/// How long to wait for a Memcached to take its name back (the reference rechecks every two
/// minutes).
const FOREIGN_TIMEOUT: Duration = Duration::from_secs(200);
/// How long the foreign Deployment stays after its Memcached reported it. A user deletes it
/// long after; deleting it the moment the status shows would time ours' debounce of the
/// triggers that follow a reconcile (the one that wrote that status) instead of how soon the
/// deletion is noticed.
const FOREIGN_REPORTED_FOR: Duration = Duration::from_secs(1);
const FOREIGN_NAME: &str = "taken";

/// What one manager's recovery came to.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Recovery {
    pub manager: String,
    pub outage_seconds: u64,
    /// After the API server alone was away.
    #[serde(flatten)]
    pub apiserver: OutageRecovery,
    /// After the control plane's own clients were stopped and started with the API server;
    /// `None` in the results of runs before this was measured.
    #[serde(default)]
    pub control_plane: Option<OutageRecovery>,
    /// From deleting the foreign Deployment until the Memcached's own Deployment existed.
    pub foreign_seconds: f64,
}

/// How soon one manager and the cluster were done after one outage, in seconds from the API
/// server being ready again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OutageRecovery {
    /// Until the manager had scaled every Deployment.
    pub reacted_seconds: f64,
    /// Until the cluster had rolled out every Deployment.
    pub rolled_out_seconds: f64,
    /// Until every Memcached had converged.
    pub converged_seconds: f64,
    /// The manager's own share of `converged_seconds`: until it had scaled every Deployment,
    /// plus from the last rollout until every Memcached reported it.
    pub manager_seconds: f64,
    /// When the manager and each of the cluster's components a rollout needs first wrote a
    /// Memcached, Deployment, ReplicaSet or pod of the phase's namespace after the API server
    /// was ready, earliest first, from the API server's audit log: when each was back at work.
    /// Empty when the log could not be read, and in the results of runs before it was.
    #[serde(default)]
    pub first_writes: Vec<(String, f64)>,
}

pub async fn measure(
    cluster: &TestCluster,
    contender: &Contender,
    kubeconfig: &ServiceAccountKubeconfig,
    args: &BenchArgs,
) -> anyhow::Result<Recovery> {
    let namespace = TestNamespace::create(cluster, "bench-recovery").await?;
    let namespace_name = namespace.name().to_owned();
    let api: Api<Memcached> = Api::namespaced(cluster.client.clone(), namespace.name());
    let lease_id = testkit::unique_name("bench-recovery");
    let (mut manager, _) = workload::start_manager(
        cluster,
        contender,
        kubeconfig,
        &lease_id,
        args,
        &LEASE_FLAGS,
    )
    .await?;
    let names: Vec<String> = (0..OBJECTS).map(|i| format!("recover-{i}")).collect();
    let measured = async {
        populate(&api, &names, args.size, args.concurrency).await?;
        wait_until(
            args.timeout(),
            "the Memcacheds to converge before the outages",
            || all_converged(&api, &names, args.size),
        )
        .await?;
        // The second outage scales the Memcacheds one replica further than the first.
        let apiserver = after_outage(cluster, &api, &names, Outage::ApiServer, args.size, args);
        let apiserver = apiserver.await?;
        still_running(&mut manager, Outage::ApiServer)?;
        let size = args.size + 1;
        let control_plane = after_outage(cluster, &api, &names, Outage::ControlPlane, size, args);
        let control_plane = control_plane.await?;
        still_running(&mut manager, Outage::ControlPlane)?;
        let foreign = foreign(cluster, &api, namespace.name(), args).await?;
        anyhow::Ok((apiserver, control_plane, foreign))
    }
    .await;
    workload::stop_manager(manager).await?;
    delete_and_wait(cluster, namespace, args.timeout()).await?;
    let (apiserver, control_plane, foreign) = measured?;
    let manager_user = format!(
        "system:serviceaccount:{}:{}",
        kubeconfig.namespace, kubeconfig.service_account
    );
    let recovery = |times: OutageTimes| OutageRecovery {
        reacted_seconds: times.reacted,
        rolled_out_seconds: times.rolled_out,
        converged_seconds: times.converged,
        manager_seconds: times.managers_part(),
        first_writes: first_writes_or_warn(cluster, &namespace_name, &times, &manager_user),
    };
    Ok(Recovery {
        manager: contender.name.clone(),
        outage_seconds: args.outage_seconds,
        apiserver: recovery(apiserver),
        control_plane: Some(recovery(control_plane)),
        foreign_seconds: foreign,
    })
}

/// Fails, naming its log, when the manager exited during `outage`.
fn still_running(manager: &mut ManagerProcess, outage: Outage) -> anyhow::Result<()> {
    if manager.try_exit_status()?.is_some() {
        anyhow::bail!(
            "the manager exited during the {}; its log: {}",
            outage_name(outage),
            manager.log().display()
        );
    }
    Ok(())
}

/// How an outage is named in messages.
fn outage_name(outage: Outage) -> &'static str {
    match outage {
        Outage::ApiServer => "API-server outage",
        Outage::ControlPlane => "control-plane outage",
    }
}

/// When each step after the outage was done for every Memcached, in seconds from the API
/// server's readiness.
#[derive(Debug)]
struct OutageTimes {
    /// When the API server was ready again.
    ready: SystemTime,

    reacted: f64,
    rolled_out: f64,
    converged: f64,
}

impl OutageTimes {
    /// The manager's part of the time to converge: until it wrote every Deployment, and from
    /// the cluster's last rollout until every Memcached reported it. The rest is the cluster's.
    fn managers_part(&self) -> f64 {
        self.reacted + (self.converged - self.rolled_out)
    }
}

/// Takes away what `outage` names for `--outage-seconds`, scales the converged Memcacheds
/// `names` from `size` replicas to one more the moment the API server is back, and times the
/// steps to convergence.
async fn after_outage(
    cluster: &TestCluster,
    api: &Api<Memcached>,
    names: &[String],
    outage: Outage,
    size: i32,
    args: &BenchArgs,
) -> anyhow::Result<OutageTimes> {
    let local = LocalCluster::from_env().context("finding the local cluster")?;
    local
        .restart(outage, Duration::from_secs(args.outage_seconds))
        .await
        .with_context(|| format!("taking the {} away", outage_name(outage)))?;
    let (ready, ready_wall) = (Instant::now(), SystemTime::now());
    let scaled = size + 1;
    for name in names {
        let patch = json!({"spec": {"size": scaled}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| {
                format!("scaling Memcached {name} after the {}", outage_name(outage))
            })?;
    }
    let namespace = api.namespace().unwrap_or_default();
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace);
    let (mut reacted, mut rolled_out) = (None, None);
    let deadline = ready + args.timeout();
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the Memcacheds did not converge within {:?} of the API server's return after the {}",
            args.timeout(),
            outage_name(outage)
        );
        // Read before the Memcacheds, so that a step seen done is never timed after a later one.
        let now = ready.elapsed().as_secs_f64();
        let list = deployments.list(&Default::default()).await?;
        if reacted.is_none()
            && every_deployment(&list.items, names, |d| d.spec.replicas == Some(scaled))
        {
            reacted = Some(now);
        }
        if rolled_out.is_none()
            && every_deployment(&list.items, names, |d| is_rolled_out(d, scaled))
        {
            rolled_out = Some(now);
        }
        if all_converged(api, names, scaled).await? {
            let converged = ready.elapsed().as_secs_f64();
            // A step done between two polls counts as done when the next one was.
            let rolled_out = rolled_out.unwrap_or(converged);
            return Ok(OutageTimes {
                ready: ready_wall,
                reacted: reacted.unwrap_or(rolled_out),
                rolled_out,
                converged,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Blocks a Memcached with a Deployment of its name, deletes that Deployment once the Memcached
/// reports it, and returns the seconds until the Memcached's own Deployment exists.
async fn foreign(
    cluster: &TestCluster,
    api: &Api<Memcached>,
    namespace: &str,
    args: &BenchArgs,
) -> anyhow::Result<f64> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace);
    let blocker: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": FOREIGN_NAME},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "somebody-else"}},
            "template": {
                "metadata": {"labels": {"app": "somebody-else"}},
                "spec": {"containers": [{"name": "app", "image": "somebody-else:1"}]},
            },
        },
    }))
    .context("building the foreign Deployment")?;
    deployments
        .create(&PostParams::default(), &blocker)
        .await
        .context("creating the foreign Deployment")?;
    api.create(
        &PostParams::default(),
        &workload::new_memcached(FOREIGN_NAME, args.size),
    )
    .await
    .context("creating the blocked Memcached")?;
    wait_until(
        args.timeout(),
        "the Memcached to report the foreign Deployment",
        || async {
            let mc = api.get(FOREIGN_NAME).await?;
            Ok(mc.status.is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.reason == "DeploymentNotOwned" && c.status == "True")
            }))
        },
    )
    .await?;
    tokio::time::sleep(FOREIGN_REPORTED_FOR).await;

    deployments
        .delete(FOREIGN_NAME, &DeleteParams::foreground())
        .await
        .context("deleting the foreign Deployment")?;
    let deleted = Instant::now();
    wait_until(
        FOREIGN_TIMEOUT,
        "the Memcached to take its name back",
        || async {
            Ok(deployments.get_opt(FOREIGN_NAME).await?.is_some_and(|d| {
                d.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == "Memcached" && o.controller == Some(true))
            }))
        },
    )
    .await?;
    Ok(deleted.elapsed().as_secs_f64())
}

/// [`first_writes`] in `namespace` after the API server was ready again in `times`, from the
/// cluster's audit log; empty (said on stderr) when the log cannot be read.
fn first_writes_or_warn(
    cluster: &TestCluster,
    namespace: &str,
    times: &OutageTimes,
    manager_user: &str,
) -> Vec<(String, f64)> {
    let namespaces = HashSet::from([namespace.to_owned()]);
    match timeline::read_cluster_events(&cluster.state, &namespaces, times.ready) {
        Ok(events) => first_writes(&events, timeline::unix_seconds(times.ready), manager_user),
        Err(error) => {
            eprintln!("warning: no first writes after the outage: {error}");
            Vec::new()
        }
    }
}

/// The component whose write this is, told by its user: the manager, or one of the cluster's
/// components a rollout needs (the controller manager runs each controller as its own
/// ServiceAccount).
fn component(user: &str, manager_user: &str) -> Option<&'static str> {
    match user {
        _ if user == manager_user => Some("the manager"),
        "system:serviceaccount:kube-system:deployment-controller" => {
            Some("the Deployment controller")
        }
        "system:serviceaccount:kube-system:replicaset-controller" => {
            Some("the ReplicaSet controller")
        }
        "system:kube-scheduler" => Some("the scheduler"),
        "kwok-controller" => Some("kwok"),
        _ => None,
    }
}

/// Seconds from `ready` (since the Unix epoch) until each [`component`]'s first accepted write
/// received after it, earliest first.
fn first_writes(events: &[AuditEvent], ready: f64, manager_user: &str) -> Vec<(String, f64)> {
    let mut first: Vec<(String, f64)> = Vec::new();
    for event in events.iter().filter(|e| e.succeeded()) {
        let received = timeline::seconds(event.received);
        if received < ready {
            continue;
        }
        let Some(who) = component(&event.user, manager_user) else {
            continue;
        };
        match first.iter_mut().find(|(name, _)| name == who) {
            Some((_, at)) => *at = at.min(received - ready),
            None => first.push((who.to_owned(), received - ready)),
        }
    }
    first.sort_by(|a, b| a.1.total_cmp(&b.1));
    first
}

/// Whether every one of `names` has a Deployment in `deployments` for which `done` holds.
fn every_deployment(
    deployments: &[Deployment],
    names: &[String],
    done: impl Fn(&Deployment) -> bool,
) -> bool {
    names.iter().all(|name| {
        deployments
            .iter()
            .any(|d| d.metadata.name.as_deref() == Some(name) && done(d))
    })
}

async fn all_converged(api: &Api<Memcached>, names: &[String], size: i32) -> anyhow::Result<bool> {
    let list = api.list(&Default::default()).await?;
    Ok(names.iter().all(|name| {
        list.items
            .iter()
            .any(|mc| mc.metadata.name.as_deref() == Some(name) && is_converged(mc, size))
    }))
}

/// Polls `check` every 100 ms until it is true; errors from the API server are retried.
async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    while Instant::now() < deadline {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_error = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let detail = last_error
        .map(|e| format!(" (last error: {e:#})"))
        .unwrap_or_default();
    anyhow::bail!("timed out after {timeout:?} waiting for {what}{detail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_managers_part_leaves_out_the_rollout() {
        let times = OutageTimes {
            ready: SystemTime::UNIX_EPOCH,
            reacted: 1.5,
            rolled_out: 9.0,
            converged: 9.75,
        };
        assert_eq!(times.managers_part(), 2.25);
    }

    #[test]
    fn results_from_before_the_control_plane_outage_still_read() {
        let before = json!({
            "manager": "ours",
            "outage_seconds": 20,
            "reacted_seconds": 0.42,
            "rolled_out_seconds": 7.5,
            "converged_seconds": 8.17,
            "manager_seconds": 0.7,
            "foreign_seconds": 0.31,
        });
        let read: Recovery = serde_json::from_value(before).expect("read");
        assert_eq!(read.apiserver.converged_seconds, 8.17);
        assert!(read.apiserver.first_writes.is_empty());
        assert!(read.control_plane.is_none());
    }

    #[test]
    fn first_writes_name_each_component_once_earliest_first() {
        let write = |seconds: i64, user: &str, code: u16| {
            let at = k8s_openapi::jiff::Timestamp::from_second(seconds).expect("in range");
            AuditEvent {
                verb: "patch".into(),
                request_uri: String::new(),
                user_agent: String::new(),
                user: user.into(),
                group: String::new(),
                resource: "deployments".into(),
                subresource: String::new(),
                namespace: "ns".into(),
                name: "d".into(),
                code,
                received: at,
                completed: at,
                request_object: None,
                response_object: None,
            }
        };
        let manager = concat!(
            "system:serviceaccount:",
            product::namespace!(),
            ":",
            product::name!()
        );
        let events = [
            // Before the API server was ready, and refused: neither counts.
            write(95, manager, 200),
            write(
                101,
                "system:serviceaccount:kube-system:deployment-controller",
                403,
            ),
            write(102, manager, 200),
            write(103, manager, 200),
            write(
                150,
                "system:serviceaccount:kube-system:deployment-controller",
                200,
            ),
            write(151, "system:kube-scheduler", 200),
            write(152, "kwok-controller", 200),
            write(
                153,
                "system:serviceaccount:kube-system:endpoint-controller",
                200,
            ),
        ];
        let first = first_writes(&events, 100.0, manager);
        assert_eq!(
            first,
            [
                ("the manager".to_owned(), 2.0),
                ("the Deployment controller".to_owned(), 50.0),
                ("the scheduler".to_owned(), 51.0),
                ("kwok".to_owned(), 52.0),
            ]
        );
    }

    #[test]
    fn every_deployment_needs_each_name_done() {
        let deployment = |name: &str, replicas: i32| {
            let mut d = Deployment::default();
            d.metadata.name = Some(name.to_owned());
            d.spec.replicas = Some(replicas);
            d
        };
        let names = ["a".to_owned(), "b".to_owned()];
        let scaled_to_two = |d: &Deployment| d.spec.replicas == Some(2);
        let both = [deployment("a", 2), deployment("b", 2)];
        assert!(every_deployment(&both, &names, scaled_to_two));
        let one_behind = [deployment("a", 2), deployment("b", 1)];
        assert!(!every_deployment(&one_behind, &names, scaled_to_two));
        let one_missing = [deployment("a", 2)];
        assert!(!every_deployment(&one_missing, &names, scaled_to_two));
    }
}
