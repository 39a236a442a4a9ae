//! Connecting to the local cluster, starting it when none runs.

use std::path::PathBuf;
use std::process::Command;

use localcluster::node::NodeState;
use localcluster::{ClusterState, LocalCluster};
use tokio::sync::OnceCell;

use crate::Result;

/// The local cluster as a test sees it.
#[derive(Clone)]
pub struct TestCluster {
    /// An admin client (`system:masters`), bound to the calling test's runtime.
    pub client: kube::Client,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// What runs where, and the CA and binaries of the cluster.
    pub state: ClusterState,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("kubeconfig", &self.kubeconfig)
            .field("server", &self.state.server)
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// Connects an admin client to the cluster that `state` describes (one that runs).
    ///
    /// # Errors
    /// [`crate::Error::Cluster`] when its kubeconfig cannot be read or gives no client.
    pub async fn connect(state: ClusterState) -> Result<Self> {
        let client = localcluster::client_from_kubeconfig(&state.kubeconfig).await?;
        Ok(Self {
            client,
            kubeconfig: state.kubeconfig.clone(),
            state,
        })
    }

    /// The `kubectl` built with the cluster (same Kubernetes version; no system kubectl needed).
    pub fn kubectl_path(&self) -> PathBuf {
        self.state.bin_dir.join("kubectl")
    }

    /// The real node (kubelet, containerd) of the cluster.
    ///
    /// # Errors
    /// [`crate::Error::NoRealNode`] when the cluster runs without one.
    pub fn real_node(&self) -> Result<&NodeState> {
        self.state.node.as_ref().ok_or(crate::Error::NoRealNode)
    }

    /// The full name (`docker.io/library/name:tag`) of the image of `repository` loaded on the
    /// real node, e.g. `operator-manager.local/memcached`; `what` is the
    /// `cargo xtask image` target that builds it, for the error message.
    ///
    /// # Errors
    /// [`crate::Error::NoRealNode`], [`crate::Error::ImageNotLoaded`], or
    /// [`crate::Error::Cluster`] when containerd cannot be asked.
    pub fn loaded_image(&self, repository: &str, what: &str) -> Result<String> {
        let node = self.real_node()?;
        let loaded = localcluster::node::loaded_images(&node.containerd_socket)?;
        let prefixes = [
            format!("{repository}:"),
            format!("docker.io/library/{repository}:"),
        ];
        loaded
            .iter()
            .find(|image| prefixes.iter().any(|p| image.starts_with(p.as_str())))
            .cloned()
            .ok_or_else(|| crate::Error::ImageNotLoaded {
                repository: repository.to_owned(),
                what: what.to_owned(),
                loaded: loaded.join(", "),
            })
    }

    /// A `kubectl` command against this cluster as administrator (`KUBECONFIG` set).
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.kubectl_path());
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// Runs kubectl as administrator and returns what it printed.
    ///
    /// # Errors
    /// [`crate::Error::Spawn`] when kubectl cannot run, [`crate::Error::CommandFailed`] (with
    /// its output) when it fails.
    pub fn kubectl_output(&self, args: &[&str]) -> Result<String> {
        let out = self
            .kubectl()
            .args(args)
            .output()
            .map_err(|source| crate::Error::Spawn {
                binary: self.kubectl_path(),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(crate::Error::CommandFailed {
                command: format!("kubectl {}", args.join(" ")),
                output: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
            });
        }
        Ok(stdout)
    }

    /// For a failed test: the pods of `namespace` matching `selector`, the namespace's events,
    /// and the end of each pod's log.
    pub fn pods_report(&self, namespace: &str, selector: &str) -> String {
        let mut report = String::new();
        for args in [
            vec!["get", "pods", "-o", "wide", "-n", namespace, "-l", selector],
            vec!["get", "events", "-n", namespace, "--sort-by=.lastTimestamp"],
            vec![
                "logs",
                "-n",
                namespace,
                "-l",
                selector,
                "--tail=60",
                "--prefix",
            ],
        ] {
            let text = self.kubectl_output(&args).unwrap_or_else(|e| e.to_string());
            report.push_str(&format!("$ kubectl {}\n{text}\n", args.join(" ")));
        }
        report
    }
}

/// Whether the pod's Ready condition is true.
pub fn pod_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The state of the cluster once this process has made sure it runs.
static READY: OnceCell<ClusterState> = OnceCell::const_new();

/// Connects to the running local cluster, starting it first when none runs (building the
/// control plane if it is not cached, which takes long the first time).
///
/// Safe to call from every test, in parallel and from several test binaries at once: within
/// one process the check happens once, across processes a file lock lets one start the
/// cluster while the others wait. A cluster started here keeps running after the tests (so
/// the next run is quick); `cargo xtask cluster down` stops it.
///
/// Each call returns a new [`kube::Client`], because a client is tied to the tokio runtime it
/// was created on and every `#[tokio::test]` has its own.
///
/// # Errors
/// [`crate::Error::Cluster`] when the cluster cannot be built, started or reached.
pub async fn cluster() -> Result<TestCluster> {
    let state = READY
        .get_or_try_init(|| async {
            let cluster =
                LocalCluster::from_env()?.with_progress(|line| eprintln!("[cluster] {line}"));
            let up = cluster.up().await?;
            Ok::<_, crate::Error>(up.state().clone())
        })
        .await?
        .clone();
    TestCluster::connect(state).await
}
