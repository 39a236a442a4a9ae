//! Taking the API server away for a while, to test that clients survive an outage.

use std::time::{Duration, Instant};

use crate::state::ClusterState;
use crate::{Error, LocalCluster, Result, client_from_kubeconfig, lock, process};

/// The component name of the API server in the cluster state.
const APISERVER: &str = "kube-apiserver";

/// How long the API server gets to become ready again.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

impl LocalCluster {
    /// Stops the running kube-apiserver (SIGTERM, as a restart by a supervisor would), keeps it
    /// stopped for `downtime`, starts it again with the same command line, and waits until it
    /// answers `/readyz`. Clients see connection refused meanwhile; etcd and the other
    /// components keep running. The other processes of the test machine that use the cluster
    /// in the meantime see the outage too, so a test that calls this should not share the
    /// cluster with concurrent tests.
    ///
    /// Holds the cluster lock throughout, so a concurrent [`LocalCluster::up`] waits instead
    /// of mistaking the outage for a dead cluster.
    ///
    /// # Errors
    /// [`Error::NotRunning`] when no healthy cluster runs; [`Error::Spawn`] when the API server
    /// cannot be started again; [`Error::Timeout`] when it does not become ready in time.
    pub async fn restart_apiserver(&self, downtime: Duration) -> Result<()> {
        let _lock = lock::exclusive(&self.paths().cluster_lock()).await?;
        let state_dir = self.paths().state_dir();
        let mut state = ClusterState::load(&state_dir)?.ok_or(Error::NotRunning)?;
        let index = state
            .components
            .iter()
            .position(|c| c.name == APISERVER && c.alive())
            .ok_or(Error::NotRunning)?;
        let component = state.components[index].clone();
        let cmdline_path = std::path::Path::new("/proc")
            .join(component.pid.to_string())
            .join("cmdline");
        let cmdline = std::fs::read(&cmdline_path).map_err(Error::io("reading", &cmdline_path))?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .skip(1)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();

        let (pid, binary) = (component.pid, component.binary.clone());
        // Stopping waits (blocking) for the process to exit.
        let _ = tokio::task::spawn_blocking(move || {
            process::stop(pid, &binary, Duration::from_secs(10))
        })
        .await;
        tokio::time::sleep(downtime).await;

        let pid = process::spawn_detached(
            APISERVER,
            &component.binary,
            &args,
            &component.log,
            &state_dir,
        )?;
        state.components[index].pid = pid;
        state.save(&state_dir)?;

        let client = client_from_kubeconfig(&state.kubeconfig).await?;
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < READY_TIMEOUT {
            let request = http::Request::get("/readyz").body(Vec::new());
            if let Ok(request) = request {
                match tokio::time::timeout(Duration::from_secs(5), client.request_text(request))
                    .await
                {
                    Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                    Ok(Ok(body)) => last = body,
                    Ok(Err(e)) => last = e.to_string(),
                    Err(_) => last = "no answer within 5s".to_owned(),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(Error::Timeout {
            what: "the restarted API server to be ready (/readyz)".to_owned(),
            seconds: READY_TIMEOUT.as_secs(),
            detail: format!("; last: {last}; log: {}", component.log.display()),
        })
    }
}
