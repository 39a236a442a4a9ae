//! The crash of one replica of a sharded manager under load: one replica is killed (SIGKILL) and
//! at that moment a sample of the Memcacheds, spread over the namespaces, is scaled. Each
//! change is timed from the crash until its Deployment has the new size, apart for the objects
//! the dead replica reconciled (taken over once its member Lease has expired: the lease
//! duration, plus a second at most, is the aim) and for the survivors' own (which should never
//! pause).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use apis::Memcached;
use futures::{StreamExt as _, TryStreamExt as _, stream};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::ListParams;
use serde::{Deserialize, Serialize};
use testkit::{ManagerProcess, TestCluster};
use tokio::sync::oneshot;

use super::BenchArgs;
use super::probe;
use super::tenants::{Target, Tenants};
use super::workload::{self, FirstSeen, Spread};

/// The member Lease's duration the bench's managers run with (client-go's default).
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// What the crash of one replica did to the changes made at that moment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardCrash {
    /// The member Lease's duration, in seconds: the dead replica's objects wait that long.
    pub lease_seconds: f64,
    /// The changed objects the dead replica had reconciled.
    pub dead_objects: usize,
    /// From the crash until each of their Deployments had its new size, in seconds.
    pub dead: Spread,
    /// The changed objects of the surviving replicas.
    pub surviving_objects: usize,
    /// The same for theirs.
    pub surviving: Spread,
    /// Changes that had not reached their Deployments when the bench stopped waiting, twice the
    /// lease duration and a minute after the crash.
    pub missed: usize,
}

/// Kills the first of `replicas` (each a manager process and its metrics port) and times
/// `sample` scaled to `size` at that moment. The killed replica is removed from `replicas`.
pub async fn measure(
    cluster: &TestCluster,
    tenants: &Tenants,
    replicas: &mut Vec<(ManagerProcess, u16)>,
    sample: &[Target],
    size: i32,
    args: &BenchArgs,
) -> anyhow::Result<ShardCrash> {
    anyhow::ensure!(
        replicas.len() > 1,
        "a crash of one replica needs more than one"
    );
    let dead_ranges = probe::manager_shard_ranges(replicas[0].1).await?;
    anyhow::ensure!(
        !dead_ranges.is_empty(),
        "the replica to be killed reconciles no range"
    );
    let uids = uids_of(cluster, tenants).await?;
    let is_dead = |target: &Target| {
        uids.get(&target.key()).is_some_and(|uid| {
            let hash = u128::from(kube_operator_runtime::slots::fnv1a_64(uid));
            (dead_ranges.iter()).any(|(start, end)| (*start..*end).contains(&hash))
        })
    };
    let dead_keys: Vec<String> = (sample.iter().filter(|t| is_dead(t)))
        .map(Target::key)
        .collect();

    let expected: Arc<HashSet<String>> = Arc::new(sample.iter().map(Target::key).collect());
    let written_at = FirstSeen::default();
    let (listed, deployments_listed) = oneshot::channel();
    let watch = tokio::spawn(workload::record_first(
        tenants.apis::<Deployment>(cluster),
        expected,
        listed,
        vec![(
            Box::new(move |deployment: &Deployment| deployment.spec.replicas == Some(size)),
            Arc::clone(&written_at),
        )],
    ));
    let listed = tokio::time::timeout(args.timeout(), deployments_listed).await;
    if !matches!(listed, Ok(Ok(()))) {
        watch.abort();
        anyhow::bail!(
            "the bench's watch of the Deployments did not list within {:?}",
            args.timeout()
        );
    }

    let (mut dead, _) = replicas.remove(0);
    let crashed = Instant::now();
    dead.kill().await.context("killing a replica")?;
    stream::iter(sample)
        .map(|target| async move {
            workload::resize(target.api.clone(), target.name.clone(), size)
                .await
                .with_context(|| format!("changing Memcached {}", target.key()))
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let deadline = crashed + LEASE_DURATION * 2 + Duration::from_secs(60);
    while written_at.lock().map_or(0, |m| m.len()) < sample.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch.abort();
    let written_at = written_at.lock().map(|m| m.clone()).unwrap_or_default();

    let since_crash = |dead_ones: bool| {
        let mut seconds: Vec<f64> = (sample.iter())
            .map(Target::key)
            .filter(|key| dead_keys.contains(key) == dead_ones)
            .filter_map(|key| written_at.get(&key))
            .map(|at| at.saturating_duration_since(crashed).as_secs_f64())
            .collect();
        seconds.sort_by(f64::total_cmp);
        Spread::of(&seconds)
    };
    Ok(ShardCrash {
        lease_seconds: LEASE_DURATION.as_secs_f64(),
        dead_objects: dead_keys.len(),
        dead: since_crash(true),
        surviving_objects: sample.len() - dead_keys.len(),
        surviving: since_crash(false),
        missed: sample.len() - written_at.len(),
    })
}

/// The uid of every Memcached of `tenants`, by `namespace/name`.
async fn uids_of(
    cluster: &TestCluster,
    tenants: &Tenants,
) -> anyhow::Result<HashMap<String, String>> {
    let mut uids = HashMap::new();
    for api in tenants.apis::<Memcached>(cluster) {
        for memcached in api.list_metadata(&ListParams::default()).await? {
            let meta = memcached.metadata;
            let key = format!(
                "{}/{}",
                meta.namespace.unwrap_or_default(),
                meta.name.unwrap_or_default()
            );
            uids.insert(key, meta.uid.unwrap_or_default());
        }
    }
    Ok(uids)
}
