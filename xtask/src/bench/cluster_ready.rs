//! Whether the cluster's own controllers work again after the API server was restarted.
//!
//! The API server answers `/readyz` seconds before kube-controller-manager, the scheduler and
//! kwok have their watches back: their reflectors retry on client-go's backoff, which has grown
//! to several seconds by the time a restart is over. A manager started at `/readyz` would have
//! its first objects wait out that backoff, a delay of the cluster's that lands on whichever
//! manager drew the longer one (once 11 s of a 15 s convergence at 100 objects). So before a
//! manager is measured, a canary Deployment of one pod must become ready: that takes the
//! Deployment and ReplicaSet controllers, the scheduler and kwok, all that a Memcached's
//! convergence waits on. Its namespace is deleted and gone before the manager starts.

use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, PostParams};
use testkit::{TestCluster, TestNamespace};

use super::baseline;
use super::tenants::delete_namespaces_and_wait;

const CANARY: &str = "canary";

/// Runs the canary to readiness and cleans it up; returns how long the cluster took to run it.
pub async fn wait_for_controllers(
    cluster: &TestCluster,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let namespace = TestNamespace::create(cluster, "bench-canary").await?;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace.name());
    deployments
        .create(&PostParams::default(), &baseline::deployment(CANARY, 1))
        .await
        .with_context(|| format!("creating the canary Deployment in {}", namespace.name()))?;
    let waited = testkit::wait_for(
        "the cluster's controllers to run a canary Deployment's pod after the API-server restart",
        timeout,
        || async { canary_ready(deployments.get(CANARY).await?) },
    )
    .await;
    let ran = started.elapsed();
    // Removed whether or not it became ready, so no manager ever sees it.
    delete_namespaces_and_wait(cluster, vec![namespace], timeout)
        .await
        .context("deleting the canary's namespace")?;
    waited?;
    Ok(ran)
}

/// `Ok` once the Deployment controller has seen the canary's spec and its one pod is ready;
/// otherwise what it reports so far.
fn canary_ready(deployment: Deployment) -> anyhow::Result<()> {
    let generation = deployment.metadata.generation;
    let status = deployment.status.unwrap_or_default();
    let ready = status.ready_replicas.unwrap_or(0);
    anyhow::ensure!(
        status.observed_generation.is_some() && status.observed_generation == generation,
        "the Deployment controller has not seen generation {generation:?} yet (it reports {:?})",
        status.observed_generation
    );
    anyhow::ensure!(ready >= 1, "{ready} of 1 replicas ready");
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::DeploymentStatus;

    use super::*;

    fn canary(generation: i64, observed: Option<i64>, ready: Option<i32>) -> Deployment {
        let mut deployment = baseline::deployment(CANARY, 1);
        deployment.metadata.generation = Some(generation);
        deployment.status = Some(DeploymentStatus {
            observed_generation: observed,
            ready_replicas: ready,
            ..DeploymentStatus::default()
        });
        deployment
    }

    #[test]
    fn ready_once_its_spec_is_seen_and_its_pod_is_ready() {
        assert!(canary_ready(canary(1, Some(1), Some(1))).is_ok());

        let unseen = canary_ready(canary(1, None, None)).unwrap_err().to_string();
        assert!(unseen.contains("has not seen generation"), "{unseen}");
        let stale = canary_ready(canary(2, Some(1), Some(1))).unwrap_err();
        assert!(stale.to_string().contains("Some(2)"), "{stale}");
        let starting = canary_ready(canary(1, Some(1), None)).unwrap_err();
        assert_eq!(starting.to_string(), "0 of 1 replicas ready");

        let mut no_status = canary(1, None, None);
        no_status.status = None;
        assert!(canary_ready(no_status).is_err());
    }
}
