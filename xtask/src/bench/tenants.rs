//! The bench's Memcacheds, spread over namespaces as a cluster's tenants spread theirs.
//!
//! Kubernetes' own controllers cost O(objects in the namespace) per sync: the Deployment
//! controller lists every ReplicaSet of a Deployment's namespace, the EndpointSlice controller
//! every Service of a pod's, the disruption controller every budget of a pod's. Ten thousand
//! Memcacheds in one namespace make the cluster, not the manager, quadratic: convergence took
//! 1574 s there against 229 s for 3000. Kubernetes' own load tests keep about 3000 pods to a
//! namespace; the bench keeps [`super::BenchArgs::objects_per_namespace`] Memcacheds to one, so
//! up to that count everything is in one namespace, as before.

use std::time::{Duration, Instant};

use anyhow::Context;
use apis::Memcached;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use testkit::{TestCluster, TestNamespace};

/// One bench Memcached: the API of its namespace and its name.
#[derive(Clone)]
pub struct Target {
    pub api: Api<Memcached>,
    pub namespace: String,
    pub name: String,
}

impl Target {
    /// `namespace/name`: unique across the bench's namespaces.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The namespaces of one phase's Memcacheds and the Memcacheds, in creation order.
pub struct Tenants {
    namespaces: Vec<TestNamespace>,
    targets: Vec<Target>,
    per_namespace: usize,
}

impl Tenants {
    /// Creates the namespaces (named `<prefix>-<unique suffix>`) for `objects` Memcacheds called
    /// `<object_prefix>-<i>`, at most `per_namespace` to each. Creates no Memcached.
    pub async fn create(
        cluster: &TestCluster,
        prefix: &str,
        object_prefix: &str,
        objects: usize,
        per_namespace: usize,
    ) -> anyhow::Result<Self> {
        let per_namespace = per_namespace.max(1);
        let count = namespaces_for(objects, per_namespace);
        let mut namespaces = Vec::with_capacity(count);
        for _ in 0..count {
            namespaces.push(TestNamespace::create(cluster, prefix).await?);
        }
        let targets = (0..objects)
            .map(|i| {
                let namespace = namespaces[i / per_namespace].name().to_owned();
                Target {
                    api: Api::namespaced(cluster.client.clone(), &namespace),
                    namespace,
                    name: format!("{object_prefix}-{i}"),
                }
            })
            .collect();
        Ok(Self {
            namespaces,
            targets,
            per_namespace,
        })
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// At most `count` of the Memcacheds, evenly spread over the creation order (and so over
    /// the namespaces).
    pub fn spread_sample(&self, count: usize) -> Vec<Target> {
        spread_indices(self.targets.len(), count)
            .map(|i| self.targets[i].clone())
            .collect()
    }

    /// One API of `K` per namespace.
    pub fn apis<K>(&self, cluster: &TestCluster) -> Vec<Api<K>>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        self.namespaces
            .iter()
            .map(|namespace| Api::namespaced(cluster.client.clone(), namespace.name()))
            .collect()
    }

    /// How many namespaces hold the Memcacheds.
    pub fn namespace_count(&self) -> usize {
        self.namespaces.len()
    }

    /// Creates every Memcached at `size`, `concurrency` at a time, one namespace after another.
    pub async fn populate(&self, size: i32, concurrency: usize) -> anyhow::Result<()> {
        for chunk in self.targets.chunks(self.per_namespace) {
            let Some(first) = chunk.first() else { continue };
            let names: Vec<String> = chunk.iter().map(|t| t.name.clone()).collect();
            populate(&first.api, &names, size, concurrency).await?;
        }
        Ok(())
    }

    /// Deletes every namespace at once and waits until all are gone.
    pub async fn delete_and_wait(
        self,
        cluster: &TestCluster,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        delete_namespaces_and_wait(cluster, self.namespaces, timeout).await
    }
}

/// Creates a Memcached of `size` for each of `names` through `api`, `concurrency` at a time.
pub async fn populate(
    api: &Api<Memcached>,
    names: &[String],
    size: i32,
    concurrency: usize,
) -> anyhow::Result<()> {
    stream::iter(names.iter().cloned())
        .map(|name| async move {
            api.create(
                &PostParams::default(),
                &super::workload::new_memcached(&name, size),
            )
            .await
            .with_context(|| format!("creating Memcached {name}"))
        })
        .buffer_unordered(concurrency)
        .try_for_each(|_| async { Ok(()) })
        .await
}

/// Deletes `namespaces` at once and waits until all are gone.
pub async fn delete_namespaces_and_wait(
    cluster: &TestCluster,
    namespaces: Vec<TestNamespace>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let mut names = Vec::with_capacity(namespaces.len());
    for namespace in namespaces {
        names.push(namespace.name().to_owned());
        namespace.delete().await?;
    }
    let api: Api<Namespace> = Api::all(cluster.client.clone());
    let deadline = Instant::now() + timeout;
    for name in names {
        while api.get_opt(&name).await?.is_some() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "namespace {name} still terminating after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

/// At most `count` indices of `0..len`, evenly spaced from 0.
fn spread_indices(len: usize, count: usize) -> impl Iterator<Item = usize> {
    (0..len).step_by((len / count.max(1)).max(1)).take(count)
}

/// How many namespaces hold `objects` at `per_namespace` to each: at least one.
fn namespaces_for(objects: usize, per_namespace: usize) -> usize {
    objects.div_ceil(per_namespace).max(1)
}

#[cfg(test)]
mod tests {
    use super::{namespaces_for, spread_indices};

    #[test]
    fn objects_fill_namespaces_in_turn() {
        assert_eq!(namespaces_for(100, 1000), 1);
        assert_eq!(namespaces_for(1000, 1000), 1);
        assert_eq!(namespaces_for(1001, 1000), 2);
        assert_eq!(namespaces_for(10_000, 1000), 10);
        assert_eq!(namespaces_for(0, 1000), 1);
    }

    #[test]
    fn a_sample_spreads_over_every_namespace() {
        let sample: Vec<usize> = spread_indices(10_000, 100).collect();
        assert_eq!(sample.len(), 100);
        assert_eq!(&sample[..3], [0, 100, 200]);
        assert_eq!(sample.last(), Some(&9900));
        // Fewer objects than asked for: all of them, each once.
        assert_eq!(spread_indices(3, 100).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(spread_indices(150, 100).count(), 100);
        assert_eq!(spread_indices(5, 0).count(), 0);
    }
}
