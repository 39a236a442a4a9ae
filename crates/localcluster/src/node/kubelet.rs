//! The kubelet and kube-proxy of the real node: their configuration and arguments.

use std::path::{Path, PathBuf};

use super::{CGROUP_ROOT, NODE_IP, NODE_LABEL, NODE_NAME, NodeState, POD_CIDR, TAINT_KEY};
use crate::{Error, Result};

/// Where cgroup hierarchies are mounted.
pub(crate) const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// The kubelet.
#[derive(Debug)]
pub(crate) struct Kubelet;

impl Kubelet {
    /// Writes the KubeletConfiguration and creates the cgroup the kubelet puts pods under;
    /// returns the command-line arguments.
    ///
    /// `port` and `healthz_port` are free ports; the kubelet serves its API on the node's
    /// address (the API server reaches it there for logs and exec) and its health check on
    /// loopback.
    pub(crate) fn prepare(
        node: &NodeState,
        kubeconfig: &Path,
        client_ca: &Path,
        port: u16,
        healthz_port: u16,
    ) -> Result<Vec<String>> {
        let root = node.kubelet_dir();
        for d in [root.clone(), node.pod_logs_dir()] {
            std::fs::create_dir_all(&d).map_err(Error::io("creating", &d))?;
        }
        create_cgroup_root()?;
        // The host's name servers are not the pods': a pod names Services through the cluster
        // DNS, and nothing it sends should leave the machine.
        let resolv = node.dir.join("resolv.conf");
        std::fs::write(&resolv, "").map_err(Error::io("writing", &resolv))?;
        let config = root.join("config.yaml");
        let text =
            yaml_serde::to_string(&Self::config(node, client_ca, &resolv, port, healthz_port))
                .map_err(|e| Error::Render {
                    what: "the kubelet configuration",
                    message: e.to_string(),
                })?;
        std::fs::write(&config, text).map_err(Error::io("writing", &config))?;
        let (label, value) = NODE_LABEL;
        Ok(vec![
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", root.display()),
            format!("--cert-dir={}", root.join("pki").display()),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={NODE_IP}"),
            format!("--node-labels={label}={value}"),
        ])
    }

    /// The KubeletConfiguration.
    ///
    /// - `failCgroupV1: false` and `cgroupDriver: cgroupfs`: many development machines and CI
    ///   runners still have cgroup v1 and no systemd; since Kubernetes 1.35 the kubelet refuses
    ///   cgroup v1 unless told otherwise.
    /// - `imagePullCredentialsVerificationPolicy: NeverVerify`: any pod may run any image on
    ///   the node, under any of its names. Nothing here needs pull credentials, and since 1.35
    ///   the kubelet otherwise refuses a loaded image to a pod once it has pulled the same
    ///   image under another name (from the cluster's registry, say).
    /// - `clusterDNS`: pods resolve Services through the cluster's CoreDNS, which `cargo xtask
    ///   cluster up` runs at [`crate::CLUSTER_DNS_IP`].
    /// - no disk eviction threshold (the kubelet reads "0%" as none) and no image garbage
    ///   collection: on a nearly full developer disk the kubelet would otherwise reclaim space by
    ///   removing the loaded images, which this node cannot pull again, and evicting the pods.
    fn config(
        node: &NodeState,
        client_ca: &Path,
        resolv: &Path,
        port: u16,
        healthz_port: u16,
    ) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{CGROUP_ROOT}"),
            "containerRuntimeEndpoint": format!("unix://{}", node.containerd_socket.display()),
            "address": NODE_IP.to_string(),
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "authentication": {
                "anonymous": { "enabled": false },
                "webhook": { "enabled": true },
                "x509": { "clientCAFile": client_ca },
            },
            "authorization": { "mode": "Webhook" },
            "registerWithTaints": [{ "key": TAINT_KEY, "value": "true", "effect": "NoSchedule" }],
            "podLogsDir": node.pod_logs_dir(),
            "resolvConf": resolv,
            "clusterDomain": "cluster.local",
            "clusterDNS": [crate::cluster::CLUSTER_DNS_IP.to_string()],
            "failSwapOn": false,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "0%",
                "imagefs.available": "0%",
                // Unset signals would get the kubelet's defaults, so these are named too.
                "nodefs.inodesFree": "0%",
                "imagefs.inodesFree": "0%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": false,
            "imagePullCredentialsVerificationPolicy": "NeverVerify",
            "nodeStatusReportFrequency": "10s",
            "shutdownGracePeriod": "0s",
        })
    }
}

/// Every mounted cgroup hierarchy (`/sys/fs/cgroup` itself on cgroup v2; each controller's
/// directory, and the unified one of a hybrid setup, on v1).
pub(crate) fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mount = Path::new(CGROUP_MOUNT);
    if mount.join("cgroup.controllers").is_file() {
        return vec![mount.to_owned()];
    }
    let Ok(entries) = std::fs::read_dir(mount) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").is_file() && !p.is_symlink())
        .collect();
    dirs.sort();
    dirs
}

/// Creates [`CGROUP_ROOT`] in every hierarchy (the kubelet requires its cgroup root to
/// exist). On cgroup v1 a new cpuset cgroup starts with no CPUs and no memory nodes, so they
/// are copied from the parent.
fn create_cgroup_root() -> Result<()> {
    for hierarchy in cgroup_hierarchies() {
        let dir = hierarchy.join(CGROUP_ROOT);
        std::fs::create_dir_all(&dir).map_err(Error::io("creating the cgroup", &dir))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let (parent, child) = (hierarchy.join(file), dir.join(file));
            if parent.is_file() && child.is_file() {
                let value =
                    std::fs::read_to_string(&parent).map_err(Error::io("reading", &parent))?;
                let current =
                    std::fs::read_to_string(&child).map_err(Error::io("reading", &child))?;
                if current.trim().is_empty() {
                    std::fs::write(&child, value.trim()).map_err(Error::io("writing", &child))?;
                }
            }
        }
    }
    Ok(())
}

/// kube-proxy.
#[derive(Debug)]
pub(crate) struct KubeProxy;

impl KubeProxy {
    /// The command-line arguments: iptables mode (the kernel may lack IPVS), the node's
    /// range as the cluster's, health and metrics on loopback, node ports on the node's
    /// address only, and no conntrack table tuning (a container or VM may forbid it).
    pub(crate) fn args(kubeconfig: &Path, healthz_port: u16, metrics_port: u16) -> Vec<String> {
        vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--proxy-mode=iptables".into(),
            format!("--hostname-override={NODE_NAME}"),
            format!("--cluster-cidr={POD_CIDR}"),
            format!("--healthz-bind-address=127.0.0.1:{healthz_port}"),
            format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
            format!("--nodeport-addresses={NODE_IP}/32"),
            "--conntrack-max-per-core=0".into(),
            "--conntrack-tcp-timeout-established=0".into(),
            "--conntrack-tcp-timeout-close-wait=0".into(),
        ]
    }

    /// The arguments that make kube-proxy remove its rules and exit.
    pub(crate) fn cleanup_args() -> Vec<String> {
        vec!["--cleanup".into(), "--proxy-mode=iptables".into()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_runs_on_cgroup_v1_with_cgroupfs_and_taints_its_node() {
        let node = NodeState::new(Path::new("/state"));
        let config = Kubelet::config(
            &node,
            Path::new("/pki/ca.crt"),
            Path::new("/state/node/resolv.conf"),
            10250,
            10248,
        );
        assert_eq!(config["failCgroupV1"], false);
        assert_eq!(config["cgroupDriver"], "cgroupfs");
        assert_eq!(
            config["containerRuntimeEndpoint"],
            "unix:///state/node/containerd.sock"
        );
        assert_eq!(config["registerWithTaints"][0]["key"], TAINT_KEY);
        assert_eq!(config["healthzBindAddress"], "127.0.0.1");
        assert_eq!(config["readOnlyPort"], 0);
        assert_eq!(config["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(config["clusterDNS"][0], "10.96.0.10");
        assert_eq!(
            config["imagePullCredentialsVerificationPolicy"],
            "NeverVerify"
        );
    }

    #[test]
    fn kube_proxy_uses_iptables_and_listens_on_loopback() {
        let args = KubeProxy::args(Path::new("/k"), 1, 2).join(" ");
        assert!(args.contains("--proxy-mode=iptables"));
        assert!(args.contains("--healthz-bind-address=127.0.0.1:1"));
        assert!(args.contains("--metrics-bind-address=127.0.0.1:2"));
    }
}
