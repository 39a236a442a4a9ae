//! The physical limit: the minimum writes the work needs, made by the bench client itself.
//!
//! Per object: create the Memcached, create its Deployment, write its status once. That is
//! what any controller must cause at the least, so the manager's convergence time is reported
//! as a ratio to this, measured against the same API server at the same concurrency. Nothing
//! reconciles these objects (the manager is not running while this is measured) and the
//! Deployments ask for zero replicas, so no pods are started behind the benchmark's back.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context;
use apis::{Memcached, MemcachedSpec, MemcachedStatus};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;
use testkit::TestCluster;

use super::BenchArgs;
use super::tenants::Tenants;

/// How long the minimum writes took.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Limit {
    /// Wall-clock seconds for all writes.
    pub seconds: f64,
    /// Number of writes made (three per object).
    pub writes: usize,
}

pub async fn measure(
    cluster: &TestCluster,
    objects: usize,
    args: &BenchArgs,
) -> anyhow::Result<Limit> {
    let tenants = Tenants::create(
        cluster,
        "bench-limit",
        "limit",
        objects,
        args.objects_per_namespace,
    )
    .await?;
    let size = args.size;
    if let Some(first) = tenants.targets().first() {
        warm_up(&first.api).await?;
    }

    let started = Instant::now();
    stream::iter(tenants.targets())
        .map(|target| {
            let deployments: Api<Deployment> =
                Api::namespaced(cluster.client.clone(), &target.namespace);
            async move {
                let (memcacheds, name) = (&target.api, &target.name);
                let created = memcacheds
                    .create(
                        &PostParams::default(),
                        &Memcached::new(
                            name,
                            MemcachedSpec {
                                size,
                                image: apis::memcached::DEFAULT_IMAGE.to_owned(),
                                ..Default::default()
                            },
                        ),
                    )
                    .await
                    .with_context(|| format!("creating Memcached {}", target.key()))?;
                deployments
                    .create(&PostParams::default(), &deployment(name, 0))
                    .await
                    .with_context(|| format!("creating Deployment {}", target.key()))?;
                let status = MemcachedStatus {
                    observed_generation: created.metadata.generation,
                    ..MemcachedStatus::default()
                };
                memcacheds
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": status})),
                    )
                    .await
                    .with_context(|| format!("writing the status of Memcached {}", target.key()))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let seconds = started.elapsed().as_secs_f64();

    // Gone before a manager starts, so none of them sees (and reports) these Memcacheds.
    tenants
        .delete_and_wait(cluster, args.timeout())
        .await
        .context("deleting the physical-limit namespaces")?;
    Ok(Limit {
        seconds,
        writes: objects * 3,
    })
}

/// The API server's first requests for a custom resource type set up its storage and
/// conversion; one write and delete before timing keeps that out of the measurement.
async fn warm_up(memcacheds: &Api<Memcached>) -> anyhow::Result<()> {
    let spec = MemcachedSpec {
        size: 0,
        image: apis::memcached::DEFAULT_IMAGE.to_owned(),
        ..Default::default()
    };
    memcacheds
        .create(&PostParams::default(), &Memcached::new("warm-up", spec))
        .await
        .context("warming up the API server")?;
    memcacheds
        .delete("warm-up", &kube::api::DeleteParams::default())
        .await
        .context("warming up the API server")?;
    Ok(())
}

/// A Deployment of the shape the controller writes, of `replicas` pods.
pub(super) fn deployment(name: &str, replicas: i32) -> Deployment {
    let labels = BTreeMap::from([
        ("app".to_owned(), "memcached".to_owned()),
        ("memcached_cr".to_owned(), name.to_owned()),
    ]);
    Deployment {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "memcached".to_owned(),
                        image: Some(apis::memcached::DEFAULT_IMAGE.to_owned()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        ..Deployment::default()
    }
}
