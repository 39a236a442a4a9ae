//! A namespace of its own for every test, deleted when the test ends.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

use crate::{Error, Result, TestCluster};

/// A Pod Security Standard level, for `pod-security.kubernetes.io/enforce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSecurity {
    /// No restrictions.
    Privileged,
    /// Prevents known privilege escalations.
    Baseline,
    /// Current pod hardening best practice.
    Restricted,
}

impl PodSecurity {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Privileged => "privileged",
            Self::Baseline => "baseline",
            Self::Restricted => "restricted",
        }
    }
}

/// A uniquely named namespace, deleted when dropped (or explicitly with
/// [`TestNamespace::delete`]).
///
/// ```no_run
/// # async fn demo() -> testkit::Result<()> {
/// let cluster = testkit::cluster().await?;
/// let ns = testkit::TestNamespace::create(&cluster, "memcached").await?;
/// // ... objects in ns.name() ...
/// # Ok(()) }
/// ```
pub struct TestNamespace {
    name: String,
    kubeconfig: PathBuf,
    client: kube::Client,
    deleted: bool,
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TestNamespace {
    /// Creates a namespace named `<prefix>-<unique suffix>`.
    ///
    /// # Errors
    /// [`Error::Kube`] when the API server refuses.
    pub async fn create(cluster: &TestCluster, prefix: &str) -> Result<Self> {
        Self::create_with_labels(cluster, prefix, BTreeMap::new()).await
    }

    /// Creates a namespace that enforces (and warns and audits at) a Pod Security Standard
    /// level, at the `latest` version.
    ///
    /// # Errors
    /// [`Error::Kube`] when the API server refuses.
    pub async fn with_pod_security(
        cluster: &TestCluster,
        prefix: &str,
        level: PodSecurity,
    ) -> Result<Self> {
        Self::create_with(cluster, prefix, pod_security_labels(level), BTreeMap::new()).await
    }

    /// Creates a namespace whose pods run on the local cluster's real node (real containers:
    /// images must be loaded there), enforcing a Pod Security Standard level.
    ///
    /// # Errors
    /// [`Error::NoRealNode`] when the cluster runs without one, [`Error::Kube`] when the API
    /// server refuses.
    pub async fn on_real_node(
        cluster: &TestCluster,
        prefix: &str,
        level: PodSecurity,
    ) -> Result<Self> {
        cluster.real_node()?;
        let annotations = localcluster::node::namespace_annotations();
        Self::create_with(cluster, prefix, pod_security_labels(level), annotations).await
    }

    /// Creates a namespace with the given labels.
    ///
    /// # Errors
    /// [`Error::Kube`] when the API server refuses.
    pub async fn create_with_labels(
        cluster: &TestCluster,
        prefix: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Self> {
        Self::create_with(cluster, prefix, labels, BTreeMap::new()).await
    }

    async fn create_with(
        cluster: &TestCluster,
        prefix: &str,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
    ) -> Result<Self> {
        let name = unique_name(prefix);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(cluster.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .map_err(Error::kube(format!("creating namespace {name}")))?;
        Ok(Self {
            name,
            kubeconfig: cluster.kubeconfig.clone(),
            client: cluster.client.clone(),
            deleted: false,
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Deletes the namespace now (its contents go with it, asynchronously).
    ///
    /// # Errors
    /// [`Error::Kube`] when the API server refuses.
    pub async fn delete(mut self) -> Result<()> {
        self.deleted = true;
        delete(&self.client, &self.name).await
    }
}

/// `pod-security.kubernetes.io/{enforce,warn,audit}` at `level`, version `latest`.
pub fn pod_security_labels(level: PodSecurity) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for mode in ["enforce", "warn", "audit"] {
        labels.insert(
            format!("pod-security.kubernetes.io/{mode}"),
            level.as_str().to_owned(),
        );
        labels.insert(
            format!("pod-security.kubernetes.io/{mode}-version"),
            "latest".to_owned(),
        );
    }
    labels
}

async fn delete(client: &kube::Client, name: &str) -> Result<()> {
    match Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Kube {
            action: format!("deleting namespace {name}"),
            source,
        }),
    }
}

impl Drop for TestNamespace {
    /// Deletes the namespace on a thread of its own: the test's runtime may already be
    /// shutting down, and its client with it.
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let name = std::mem::take(&mut self.name);
        let kubeconfig = self.kubeconfig.clone();
        let joined = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let Ok(runtime) = runtime else { return };
            runtime.block_on(async {
                match localcluster::client_from_kubeconfig(&kubeconfig).await {
                    Ok(client) => {
                        if let Err(e) = delete(&client, &name).await {
                            eprintln!("warning: {e}");
                        }
                    }
                    Err(e) => eprintln!("warning: cannot delete namespace {name}: {e}"),
                }
            });
        })
        .join();
        if joined.is_err() {
            eprintln!("warning: deleting a test namespace panicked");
        }
    }
}

/// `<prefix>-<suffix>`, unique across processes and calls, at most 63 characters.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let suffix = format!(
        "{:x}{:x}{n:x}",
        std::process::id() % 0xffff,
        nanos % 0xfffff
    );
    let prefix: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(62 - suffix.len())
        .collect();
    let prefix = prefix.trim_matches('-');
    if prefix.is_empty() {
        format!("t-{suffix}")
    } else {
        format!("{prefix}-{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_valid() {
        let a = unique_name("Memcached_Test");
        let b = unique_name("Memcached_Test");
        assert_ne!(a, b);
        assert!(a.starts_with("memcached-test-"), "{a}");
        let long = unique_name(&"x".repeat(100));
        assert!(long.len() <= 63, "{long}");
        assert!(unique_name("--").starts_with("t-"));
    }
}
