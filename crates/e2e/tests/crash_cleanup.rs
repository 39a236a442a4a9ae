//! `cargo xtask cluster down` after a crash: every process of the local cluster is killed at
//! once while a pod runs on the real node, leaving its container, shim, mounts, cgroups, network
//! and kube-proxy's rules behind with nobody to stop them; `down` must still remove all of it
//! from what the state directory records.
//!
//! It destroys the shared cluster, so it is ignored in an ordinary `cargo test`;
//! `cargo xtask test` runs it last, on a cluster it started itself.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{Api, PostParams};
use localcluster::LocalCluster;
use localcluster::node::{BRIDGE, CGROUP_ROOT, NodeState};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::json;

#[tokio::test]
#[ignore = "destroys the shared local cluster; `cargo xtask test` runs it last"]
async fn down_after_a_crash_removes_everything_the_cluster_made() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let node = cluster.real_node()?.clone();
    let pause = localcluster::node::pause_image();

    // A pod on the real node behind a Service: a container with its shim, mounts and cgroup, a
    // veth on the bridge, and kube-proxy's chains for the Service.
    let namespace = testkit::unique_name("crash");
    let mut labels = testkit::pod_security_labels(testkit::PodSecurity::Restricted);
    labels.insert("app".into(), "crash".into());
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {
            "name": namespace,
            "labels": labels,
            "annotations": localcluster::node::namespace_annotations(),
        }
    }))?;
    Api::<Namespace>::all(cluster.client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "survivor", "labels": {"app": "survivor"}},
        "spec": {
            "containers": [{
                "name": "pause",
                "image": pause,
                "securityContext": {
                    "runAsNonRoot": true,
                    "runAsUser": 65532,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }],
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "survivor"},
        "spec": {"selector": {"app": "survivor"}, "ports": [{"port": 80}]},
    }))?;
    Api::<Service>::namespaced(cluster.client.clone(), &namespace)
        .create(&PostParams::default(), &service)
        .await?;
    wait_until("the pod runs on the real node", || async {
        let pod = pods.get("survivor").await?;
        let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
        Ok(phase == "Running")
    })
    .await?;

    let footprint = || Footprint::of(&node);
    let before = footprint()?;
    println!("before the crash: {before:?}");
    ensure!(
        !before.container_processes.is_empty(),
        "a container runs: {before:?}"
    );
    ensure!(
        before.bridge && before.kube_chains > 0 && before.mounts > 0 && !before.routes.is_empty(),
        "{before:?}"
    );

    // The crash: every process of the cluster dies at once, without a chance to clean up.
    for component in &cluster.state.components {
        let pid = Pid::from_raw(i32::try_from(component.pid)?);
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = kill(pid, Signal::SIGKILL);
    }
    wait_until("every process of the cluster to be dead", || async {
        Ok(cluster.state.components.iter().all(|c| !c.alive()))
    })
    .await?;
    let orphaned = footprint()?;
    println!("after the crash: {orphaned:?}");
    ensure!(
        !orphaned.container_processes.is_empty(),
        "the container outlives the crash (its shim keeps it): {orphaned:?}"
    );

    let local = LocalCluster::from_env()?.with_progress(|line| println!("[down] {line}"));
    let stopped = local.down().await.context("`down` after the crash")?;
    ensure!(stopped, "`down` found the crashed cluster's state");

    let after = footprint()?;
    println!("after down: {after:?}");
    ensure!(after.is_clean(), "`down` left things behind: {after:?}");
    ensure!(
        !local.paths().state_dir().exists(),
        "`down` removes the state directory"
    );
    Ok(())
}

/// What the real node leaves on the machine, looked up directly rather than through the code
/// under test.
#[derive(Debug)]
struct Footprint {
    /// Processes in the node's cgroups (containers) and containerd shims of its socket.
    container_processes: Vec<u32>,
    /// Mounts under the node's directory.
    mounts: usize,
    /// The node's cgroups, in any hierarchy.
    cgroups: Vec<String>,
    /// Whether the node's bridge exists.
    bridge: bool,
    /// iptables chains of the kubelet and kube-proxy (`KUBE-*`), in any table.
    kube_chains: usize,
    /// Routes the node added (to the bridge, and blackholes for the fake nodes' ranges).
    routes: Vec<String>,
}

impl Footprint {
    fn of(node: &NodeState) -> Result<Self> {
        let mut container_processes = Vec::new();
        let mut cgroups = Vec::new();
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
            let root = hierarchy.path().join(CGROUP_ROOT);
            if root.is_dir() {
                cgroups.push(root.display().to_string());
                container_processes.extend(cgroup_processes(&root));
            }
        }
        let socket = node.containerd_socket.display().to_string();
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let shim = args
                .first()
                .is_some_and(|a| a.ends_with("containerd-shim-runc-v2"));
            if shim && args.contains(&socket) {
                container_processes.push(pid);
            }
        }
        container_processes.sort_unstable();
        container_processes.dedup();

        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        let node_dir = node.dir.display().to_string();
        let mounts = mountinfo
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|mount| mount.starts_with(&node_dir))
            .count();

        let bridge = Path::new("/sys/class/net").join(BRIDGE).exists();
        let mut kube_chains = 0;
        for table in ["filter", "nat", "mangle"] {
            let out = Command::new("iptables")
                .args(["-t", table, "-S"])
                .output()?;
            if !out.status.success() {
                bail!(
                    "iptables -t {table} -S: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            kube_chains += String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|line| line.starts_with("-N KUBE-"))
                .count();
        }
        let out = Command::new("ip")
            .args(["route", "show", "table", "all"])
            .output()?;
        let table = String::from_utf8_lossy(&out.stdout);
        let routes = table
            .lines()
            .filter(|line| {
                let network = &node.network;
                network
                    .bridge_routes
                    .iter()
                    .chain(&network.blackhole_routes)
                    .any(|cidr| line.split_whitespace().any(|field| field == cidr))
            })
            .map(str::to_owned)
            .collect();
        Ok(Self {
            routes,
            container_processes,
            mounts,
            cgroups,
            bridge,
            kube_chains,
        })
    }

    fn is_clean(&self) -> bool {
        self.container_processes.is_empty()
            && self.mounts == 0
            && self.cgroups.is_empty()
            && !self.bridge
            && self.kube_chains == 0
            && self.routes.is_empty()
    }
}

/// Every pid in the cgroup tree at `root`.
fn cgroup_processes(root: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    pids
}

async fn wait_until<F, Fut>(what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = String::new();
    while Instant::now() < deadline {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => last.clear(),
            Err(e) => last = format!(" (last error: {e:#})"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("timed out waiting for {what}{last}")
}
