//! Taking the API server away for a while, to test that clients survive an outage.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cluster::{readyz, wait};
use crate::state::{ClusterState, Component};
use crate::{Error, LocalCluster, Result, client_from_kubeconfig, lock, process};

/// The component name of the API server in the cluster state.
const APISERVER: &str = "kube-apiserver";

/// How long the API server gets to become ready again.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one `/readyz` request of that wait may take.
const READYZ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the stopped API server gets to exit and free its port. A killed process with a
/// large heap can hold its listening socket for seconds after the kill.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stopped component gets to exit on SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What an outage takes away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// The API server alone. Its clients, the cluster's own controllers among them, keep
    /// running and reconnect on their own schedule (client-go's backoff grows to 30 s, with
    /// as much again of jitter).
    ApiServer,
    /// The API server and the control plane's own clients of it (the controller manager, the
    /// scheduler and kwok), as when every control-plane process is restarted at once: an
    /// upgrade, or a restart of the control-plane machine with etcd kept elsewhere. They start
    /// again, in the order `up` starts them, once the API server is ready, so none of them
    /// comes back on a backoff grown during the outage. etcd and a real node keep running.
    ControlPlane,
}

impl Outage {
    /// Whether `component` is stopped and started again by this outage.
    fn takes(self, component: &str) -> bool {
        match self {
            Self::ApiServer => component == APISERVER,
            Self::ControlPlane => {
                component == APISERVER
                    || component == "kube-controller-manager"
                    || component == "kube-scheduler"
                    || component.starts_with("kwok-")
            }
        }
    }
}

impl LocalCluster {
    /// Stops the running kube-apiserver (SIGTERM, as a restart by a supervisor would), keeps it
    /// stopped for `downtime`, starts it again with the same command line, and waits until it
    /// answers `/readyz`: [`LocalCluster::restart`] with [`Outage::ApiServer`].
    ///
    /// # Errors
    /// As [`LocalCluster::restart`].
    pub async fn restart_apiserver(&self, downtime: Duration) -> Result<()> {
        self.restart(Outage::ApiServer, downtime).await
    }

    /// Takes away what `outage` names for `downtime`: stops the API server (SIGTERM, as a
    /// restart by a supervisor would) and, for [`Outage::ControlPlane`], the controller manager,
    /// the scheduler and kwok; keeps the API server away for `downtime` from its SIGTERM (or
    /// until it and the others have exited, if that takes longer); starts it again with
    /// the same command line and waits until it answers `/readyz`; then starts the others again
    /// with theirs, without waiting for them; the API server with the feature gates this
    /// cluster asks for ([`LocalCluster::feature_gates`]), so a restart of
    /// `LocalCluster::from_env()?.without_sharded_lists()` turns the gate off. Clients see
    /// connection refused meanwhile; etcd keeps running. The other processes of the test machine that use the cluster in the
    /// meantime see the outage too, so a test that calls this should not share the cluster with
    /// concurrent tests.
    ///
    /// Holds the cluster lock throughout, so a concurrent [`LocalCluster::up`] waits instead
    /// of mistaking the outage for a dead cluster.
    ///
    /// # Errors
    /// [`Error::NotRunning`] when no healthy cluster runs; [`Error::ComponentDown`] when
    /// another component to restart no longer runs; [`Error::Spawn`] when a component cannot be
    /// started again; [`Error::Exited`] when the API server exits before it is ready;
    /// [`Error::Timeout`] when the stopped API server does not free its port, or the started
    /// one does not become ready, in time.
    pub async fn restart(&self, outage: Outage, downtime: Duration) -> Result<()> {
        let _lock = lock::exclusive(&self.paths().cluster_lock()).await?;
        let state_dir = self.paths().state_dir();
        let mut state = ClusterState::load(&state_dir)?.ok_or(Error::NotRunning)?;
        let apiserver = state
            .components
            .iter()
            .position(|c| c.name == APISERVER && c.alive())
            .ok_or(Error::NotRunning)?;
        // Indexes of the API server's clients this outage takes too, in start order.
        let clients: Vec<usize> = (0..state.components.len())
            .filter(|&i| i != apiserver && outage.takes(&state.components[i].name))
            .collect();
        let mut command_lines = Vec::with_capacity(clients.len());
        for &i in &clients {
            command_lines.push(command_line(&state.components[i])?);
        }
        // Started again with the feature gates this cluster asks for: a bench turns the
        // sharded lists off and on between its managers.
        let apiserver_args = with_feature_gates(
            command_line(&state.components[apiserver])?,
            &self.feature_gates(),
        );
        state.feature_gates = self.feature_gates();

        let component = state.components[apiserver].clone();
        let stopping = Instant::now();
        stop([&component]).await;
        // Started again while the old process still holds its port, the new one would exit at
        // once with "address already in use".
        let port = secure_port(&apiserver_args);
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
        // The outage runs from the API server's SIGTERM: it stops answering at once but can
        // take its whole grace period to exit, which would otherwise make the outage that much
        // longer than `downtime`. The clients stop within it too (it is longer only when
        // stopping takes longer than that), together, so one that needs its whole grace period
        // does not hold up the others.
        stop(clients.iter().map(|&i| &state.components[i])).await;
        tokio::time::sleep(downtime.saturating_sub(stopping.elapsed())).await;

        let pid = respawn(&component, &apiserver_args, &state_dir)?;
        state.components[apiserver].pid = pid;
        state.save(&state_dir)?;
        wait_ready(&state, &state.components[apiserver]).await?;

        for (&i, args) in clients.iter().zip(&command_lines) {
            let pid = respawn(&state.components[i], args, &state_dir)?;
            state.components[i].pid = pid;
            state.save(&state_dir)?;
        }
        Ok(())
    }
}

/// `args` with `--feature-gates` set to `gates` (left out when there are none).
fn with_feature_gates(args: Vec<String>, gates: &[String]) -> Vec<String> {
    let mut args: Vec<String> = args
        .into_iter()
        .filter(|arg| !arg.starts_with("--feature-gates="))
        .collect();
    if !gates.is_empty() {
        args.push(format!("--feature-gates={}", gates.join(",")));
    }
    args
}

/// The arguments `component` was started with, read from its running process.
///
/// # Errors
/// [`Error::ComponentDown`] when it no longer runs.
fn command_line(component: &Component) -> Result<Vec<String>> {
    if !component.alive() {
        return Err(Error::ComponentDown {
            component: component.name.clone(),
            log: component.log.clone(),
            tail: process::tail(&component.log, 20),
        });
    }
    let path = Path::new("/proc")
        .join(component.pid.to_string())
        .join("cmdline");
    let cmdline = std::fs::read(&path).map_err(Error::io("reading", &path))?;
    Ok(cmdline
        .split(|b| *b == 0)
        .skip(1)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect())
}

/// Stops `components`, all at once, and waits (off the runtime's threads) until each has
/// exited.
async fn stop<'a>(components: impl IntoIterator<Item = &'a Component>) {
    let mut stopping = tokio::task::JoinSet::new();
    for component in components {
        let (pid, binary) = (component.pid, component.binary.clone());
        stopping.spawn_blocking(move || process::stop(pid, &binary, STOP_GRACE));
    }
    while stopping.join_next().await.is_some() {}
}

/// Starts `component` again with `args`, logging to the same file; returns its new pid.
fn respawn(component: &Component, args: &[String], state_dir: &Path) -> Result<u32> {
    process::spawn_detached(
        &component.name,
        &component.binary,
        args,
        &component.log,
        state_dir,
    )
}

/// Waits until the started API server `component` answers `/readyz`.
async fn wait_ready(state: &ClusterState, component: &Component) -> Result<()> {
    let client = client_from_kubeconfig(&state.kubeconfig).await?;
    wait(
        "the restarted API server to be ready (/readyz)",
        READY_TIMEOUT,
        &[component],
        || async {
            tokio::time::timeout(READYZ_TIMEOUT, readyz(&client))
                .await
                .map_err(|_| format!("no answer within {}s", READYZ_TIMEOUT.as_secs()))?
        },
    )
    .await
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
    fn a_restart_sets_the_feature_gates_asked_for() {
        let args = |list: &[&str]| list.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        let gated = args(&[
            "--secure-port=1",
            "--feature-gates=ShardedListAndWatch=true",
            "--v=1",
        ]);
        assert_eq!(
            with_feature_gates(gated.clone(), &[]),
            args(&["--secure-port=1", "--v=1"])
        );
        assert_eq!(
            with_feature_gates(
                args(&["--v=1"]),
                &["A=true".to_owned(), "B=false".to_owned()]
            ),
            args(&["--v=1", "--feature-gates=A=true,B=false"])
        );
        assert_eq!(
            with_feature_gates(gated, &["ShardedListAndWatch=true".to_owned()]),
            args(&[
                "--secure-port=1",
                "--v=1",
                "--feature-gates=ShardedListAndWatch=true"
            ])
        );
    }

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
    fn an_outage_of_the_control_plane_takes_its_clients_and_leaves_etcd() {
        let names = [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok-0",
            "kwok-3",
            "kubelet",
        ];
        let taken = |outage: Outage| -> Vec<&str> {
            names.into_iter().filter(|n| outage.takes(n)).collect()
        };
        assert_eq!(taken(Outage::ApiServer), ["kube-apiserver"]);
        assert_eq!(
            taken(Outage::ControlPlane),
            [
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kwok-0",
                "kwok-3"
            ]
        );
    }

    #[test]
    fn a_component_is_restarted_with_its_arguments_and_one_that_exited_is_named() {
        let dir = tempfile::tempdir().expect("temporary directory");
        // This test's own process stands for a running component: spawning one would hold
        // a copy of every descriptor open at the time, the other tests' sockets among them.
        let component = |pid: u32| Component {
            name: "kwok-1".to_owned(),
            pid,
            // As started: a component is told by its binary's path as its first argument.
            binary: std::env::args_os().next().expect("argv[0]").into(),
            ports: Default::default(),
            log: dir.path().join("kwok-1.log"),
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        assert_eq!(
            command_line(&component(std::process::id())).expect("read"),
            args
        );

        std::fs::write(dir.path().join("kwok-1.log"), "the last words\n").expect("log");
        // No process has this id (Linux's pid_max is at most 2^22).
        let error = command_line(&component(u32::MAX)).expect_err("not running");
        assert!(matches!(error, Error::ComponentDown { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("kwok-1 is not running"), "{message}");
        assert!(message.contains("the last words"), "{message}");
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
