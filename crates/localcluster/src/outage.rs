//! Taking the API server away for a while, to test that clients survive an outage.

use std::time::{Duration, Instant};

use crate::state::ClusterState;
use crate::{Error, LocalCluster, Result, client_from_kubeconfig, lock, process};

/// The component name of the API server in the cluster state.
const APISERVER: &str = "kube-apiserver";

/// How long the API server gets to become ready again.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the stopped API server gets to exit and free its port. A killed process with a
/// large heap can hold its listening socket for seconds after the kill.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(60);

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
        let stopping = Instant::now();
        // Stopping waits (blocking) for the process to exit.
        let _ = tokio::task::spawn_blocking(move || {
            process::stop(pid, &binary, Duration::from_secs(10))
        })
        .await;
        // Started again while the old process still holds its port, the new one would exit at
        // once with "address already in use".
        let port = secure_port(&args);
        while process::is_alive(component.pid, &component.binary)
            || port.is_some_and(|port| !port_is_free(port))
        {
            if stopping.elapsed() > RELEASE_TIMEOUT {
                return Err(Error::Timeout {
                    what: format!(
                        "the stopped API server (pid {}) to exit and free its port",
                        component.pid
                    ),
                    seconds: RELEASE_TIMEOUT.as_secs(),
                    detail: format!("; log: {}", component.log.display()),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
            if !process::is_alive(pid, &component.binary) {
                return Err(Error::Exited {
                    component: APISERVER.to_owned(),
                    log: component.log.clone(),
                    tail: process::tail(&component.log, 20),
                });
            }
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

/// The port the API server listens on, from its command line.
fn secure_port(args: &[String]) -> Option<u16> {
    args.iter()
        .find_map(|arg| arg.strip_prefix("--secure-port="))
        .and_then(|port| port.parse().ok())
}

/// Whether nothing listens on `port` of the loopback address the API server binds.
fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secure_port_comes_from_the_command_line() {
        let args = [
            "--etcd-servers=http://127.0.0.1:2379",
            "--secure-port=23150",
        ]
        .map(String::from);
        assert_eq!(secure_port(&args), Some(23150));
        assert_eq!(secure_port(&["--bind-address=127.0.0.1".to_owned()]), None);
    }

    #[test]
    fn a_port_in_use_is_not_free() {
        let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(!port_is_free(port));
        drop(listener);
        assert!(port_is_free(port));
    }
}
