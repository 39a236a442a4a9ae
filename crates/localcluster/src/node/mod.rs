//! The real node: real containers beside kwok's fake nodes.
//!
//! A kubelet built from the pinned Kubernetes source runs pods through containerd and runc
//! (the distribution's packages) on a bridge network of the distribution's CNI plugins, and
//! kube-proxy in iptables mode makes ClusterIP Services reach them. Nothing here needs a
//! registry: the pod sandbox (`pause`) is compiled from the Kubernetes source and loaded into
//! containerd as a locally built image, and so is every image a test runs.
//!
//! # Addresses
//! The node has a bridge of its own, [`BRIDGE`], whose address [`NODE_IP`] is the node's
//! InternalIP; pods get addresses from [`POD_CIDR`]. The API server keeps listening on loopback
//! only; a forwarder on the node's address lets pods reach it through the `kubernetes` Service,
//! as in any cluster. Routes keep the Service range and the fake nodes' made-up addresses on
//! this machine, and a firewall rule keeps pod traffic from leaving it.
//!
//! # Which pods land here
//! The node is tainted [`TAINT_KEY`]`:NoSchedule` and labelled [`NODE_LABEL`], so an ordinary
//! pod (a benchmark's thousands of them) lands on the fake nodes. A namespace whose pods should
//! run for real carries [`namespace_annotations`]: the API server's PodNodeSelector admission
//! plugin pins its pods to this node and PodTolerationRestriction gives them the toleration.
//!
//! # Cleaning up
//! Everything `up` creates is recorded in the cluster state ([`NodeState`]) before it is
//! created, so `down` removes it even after a crash: processes, containers and their shims,
//! mounts, cgroups, the bridge, routes and iptables rules.

mod containerd;
mod host;
mod iptables;
mod kubelet;
mod network;
mod registry;
mod start;
mod teardown;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use containerd::loaded_images;
pub use host::PACKAGES;
pub(crate) use host::check_prerequisites;
#[cfg(test)]
pub(crate) use host::find_command;
pub use network::Network;
pub(crate) use start::{NodeKubeconfigs, NodeStart};
pub(crate) use teardown::{leftovers, teardown};

/// The node's name (and the kubelet's identity, `system:node:<name>`).
pub const NODE_NAME: &str = "real-node";
/// The node's address: the bridge's own address, the pods' gateway.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 85, 0, 1);
/// The range the node's pods get addresses from.
pub const POD_CIDR: &str = "10.85.0.0/16";
/// The node's bridge interface.
pub const BRIDGE: &str = "opmgr0";
/// The taint that keeps ordinary pods off the real node.
pub const TAINT_KEY: &str = "operator-manager.dev/real-node";
/// The label that marks the real node.
pub const NODE_LABEL: (&str, &str) = ("operator-manager.dev/node", "real");
/// The cgroup (in every hierarchy) under which the kubelet puts its pods.
pub const CGROUP_ROOT: &str = "operator-manager-node";
/// The image containerd runs as every pod's sandbox; see [`crate::versions::PAUSE`].
pub fn pause_image() -> String {
    format!("registry.k8s.io/pause:{}", crate::versions::PAUSE)
}

/// The annotations that make a namespace's pods run on the real node: PodNodeSelector pins
/// them to it, PodTolerationRestriction tolerates its taint.
pub fn namespace_annotations() -> BTreeMap<String, String> {
    let (key, value) = NODE_LABEL;
    let toleration = serde_json::json!([{
        "key": TAINT_KEY,
        "operator": "Exists",
        "effect": "NoSchedule",
    }]);
    BTreeMap::from([
        (
            "scheduler.alpha.kubernetes.io/node-selector".to_owned(),
            format!("{key}={value}"),
        ),
        (
            "scheduler.alpha.kubernetes.io/defaultTolerations".to_owned(),
            toleration.to_string(),
        ),
    ])
}

/// What the real node consists of, saved with the cluster so `down` can remove it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    /// The node's directory: containerd's and the kubelet's state, configuration, mounts.
    pub dir: PathBuf,
    /// containerd's socket, for `ctr --address`.
    pub containerd_socket: PathBuf,
    /// The host changes made for the node, undone by `down`.
    pub network: Network,
    /// The image registry on the node's address, once it was started: plain HTTP.
    #[serde(default)]
    pub registry: Option<SocketAddrV4>,
    /// The same registry over HTTPS, with a certificate of the cluster's CA, for clients that
    /// speak nothing else (`operator-sdk` reads a catalog image's labels that way).
    #[serde(default)]
    pub registry_https: Option<SocketAddrV4>,
    /// A directory that holds the cluster's CA certificate and nothing else: what
    /// `SSL_CERT_DIR` names for a program to trust [`NodeState::registry_https`].
    #[serde(default)]
    pub trusted_certificates: Option<PathBuf>,
}

impl NodeState {
    /// The node's layout under the cluster's state directory.
    pub(crate) fn new(state_dir: &Path) -> Self {
        let dir = state_dir.join("node");
        Self {
            containerd_socket: dir.join("containerd.sock"),
            dir,
            network: Network::default(),
            registry: None,
            registry_https: None,
            trusted_certificates: None,
        }
    }

    /// containerd's configuration, root and state.
    pub(crate) fn containerd_dir(&self) -> PathBuf {
        self.dir.join("containerd")
    }

    /// The kubelet's root directory (pods, volumes, plugins).
    pub(crate) fn kubelet_dir(&self) -> PathBuf {
        self.dir.join("kubelet")
    }

    /// The CNI configuration directory containerd reads.
    pub(crate) fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni").join("net.d")
    }

    /// Where host-local IPAM keeps its leases.
    pub(crate) fn ipam_dir(&self) -> PathBuf {
        self.dir.join("cni").join("ipam")
    }

    /// Where the kubelet writes container logs (instead of `/var/log/pods`).
    pub(crate) fn pod_logs_dir(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }

    /// Where containerd reads how to reach each registry (`<host:port>/hosts.toml`).
    pub(crate) fn containerd_hosts_dir(&self) -> PathBuf {
        self.containerd_dir().join("certs.d")
    }

    /// The registry's configuration and storage.
    pub(crate) fn registry_dir(&self) -> PathBuf {
        self.dir.join("registry")
    }

    /// Where locally built images are written before they are imported.
    pub(crate) fn images_dir(&self) -> PathBuf {
        self.dir.join("images")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_annotations_select_the_node_and_tolerate_its_taint() {
        let annotations = namespace_annotations();
        assert_eq!(
            annotations["scheduler.alpha.kubernetes.io/node-selector"],
            "operator-manager.dev/node=real"
        );
        let tolerations: serde_json::Value =
            serde_json::from_str(&annotations["scheduler.alpha.kubernetes.io/defaultTolerations"])
                .expect("JSON");
        assert_eq!(tolerations[0]["key"], TAINT_KEY);
        assert_eq!(tolerations[0]["effect"], "NoSchedule");
    }

    #[test]
    fn the_node_address_is_in_the_pod_range_and_names_fit_the_kernel() {
        assert!(POD_CIDR.starts_with("10.85.0.0/"));
        assert_eq!(NODE_IP.octets()[..2], [10, 85]);
        // Interface names are at most 15 bytes.
        assert!(BRIDGE.len() <= 15);
    }
}
