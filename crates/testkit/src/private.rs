//! A cluster of one test's own, for tests that would disturb others on the shared cluster
//! (stopping the API server, say).

use std::path::{Path, PathBuf};

use localcluster::{LocalCluster, Paths};

use crate::{Result, TestCluster};

/// A local cluster of the calling test's own, from the cached binaries, in a scratch directory
/// under the system's temporary directory: its own ports, certificates, etcd and processes.
///
/// It runs without the real node, which belongs to the shared cluster (one bridge and one
/// kubelet per machine). Dropping it stops every process and removes the scratch directory,
/// whatever happened in the test.
#[derive(Debug)]
pub struct PrivateCluster {
    local: LocalCluster,
    scratch: PathBuf,
    test: TestCluster,
}

impl PrivateCluster {
    /// Starts a cluster in a new scratch directory named after `prefix` plus a unique suffix.
    ///
    /// Makes sure the shared cluster runs first, because its start-up is what builds the
    /// binaries when they are not cached yet (under its lock, so concurrent tests do not build
    /// twice).
    ///
    /// # Errors
    /// [`crate::Error::Cluster`] when the shared cluster or this one cannot be started or
    /// reached; a cluster that fails to start is stopped and its scratch directory removed.
    pub async fn start(prefix: &str) -> Result<Self> {
        Self::start_with(prefix, |local| local).await
    }

    /// [`PrivateCluster::start`], its API server without the `ShardedListAndWatch` gate the
    /// shared cluster's has ([`LocalCluster::without_sharded_lists`]).
    ///
    /// # Errors
    /// As [`PrivateCluster::start`].
    pub async fn start_without_sharded_lists(prefix: &str) -> Result<Self> {
        Self::start_with(prefix, LocalCluster::without_sharded_lists).await
    }

    async fn start_with(
        prefix: &str,
        configure: impl FnOnce(LocalCluster) -> LocalCluster,
    ) -> Result<Self> {
        crate::cluster().await?;
        let scratch = std::env::temp_dir().join(crate::unique_name(prefix));
        let paths = Paths::from_env()?.with_state_dir(scratch.join("cluster"));
        let local = configure(
            LocalCluster::new(paths)
                .without_real_node()
                .with_progress(|line| println!("[private cluster] {line}")),
        );
        let state = match local.up().await {
            Ok(up) => up.state().clone(),
            Err(error) => {
                if let Err(stopping) = local.down().await {
                    eprintln!("warning: stopping the private cluster: {stopping}");
                }
                let _ = std::fs::remove_dir_all(&scratch);
                return Err(error.into());
            }
        };
        let test = match TestCluster::connect(state).await {
            Ok(test) => test,
            Err(error) => {
                stop(local, scratch);
                return Err(error);
            }
        };
        Ok(Self {
            local,
            scratch,
            test,
        })
    }

    /// The cluster's processes, to stop or restart parts of it (see
    /// [`LocalCluster::restart_apiserver`]).
    pub fn local(&self) -> &LocalCluster {
        &self.local
    }

    /// The cluster as tests see it: an admin client, the kubeconfig and the saved state, for
    /// everything that takes a [`TestCluster`].
    pub fn test(&self) -> &TestCluster {
        &self.test
    }

    /// The scratch directory that holds the cluster's state (under `cluster/`); removed on drop.
    pub fn scratch_dir(&self) -> &Path {
        &self.scratch
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        stop(self.local.clone(), self.scratch.clone());
    }
}

/// Stops the cluster and removes `scratch`, on a thread of its own with a runtime of its own:
/// `Drop` cannot await, and may run inside the test's runtime, where blocking on another
/// future would panic.
fn stop(local: LocalCluster, scratch: PathBuf) {
    let stopped = std::thread::spawn(move || {
        if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            && let Err(error) = runtime.block_on(local.down())
        {
            eprintln!("warning: stopping the private cluster: {error}");
        }
        let _ = std::fs::remove_dir_all(&scratch);
    })
    .join();
    if stopped.is_err() {
        eprintln!("warning: stopping the private cluster panicked");
    }
}
