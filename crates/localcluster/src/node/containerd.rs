//! The node's own containerd: its configuration (all state under the node's directory, its own
//! socket, so it never touches a containerd the machine may run already) and image import.

use std::path::Path;

use super::NodeState;
use super::host::{CNI_BIN_DIR, run};
use crate::{Error, Result};

/// The containerd namespace the CRI plugin (and so the kubelet) uses.
pub(crate) const K8S_NAMESPACE: &str = "k8s.io";

/// The node's containerd.
#[derive(Debug)]
pub(crate) struct Containerd;

impl Containerd {
    /// Writes the configuration and the CNI network, returning the command-line arguments.
    pub(crate) fn prepare(node: &NodeState) -> Result<Vec<String>> {
        let dir = node.containerd_dir();
        for d in [
            dir.clone(),
            node.cni_conf_dir(),
            node.ipam_dir(),
            node.images_dir(),
            node.containerd_hosts_dir(),
        ] {
            std::fs::create_dir_all(&d).map_err(Error::io("creating", &d))?;
        }
        if let Some(address) = node.registry {
            let ca = node.trusted_certificates.as_ref().map(|d| d.join("ca.crt"));
            let https = node.registry_https.zip(ca.as_deref());
            super::registry::containerd_hosts(node, address, https)?;
        }
        let config = dir.join("config.toml");
        std::fs::write(&config, Self::config(node)).map_err(Error::io("writing", &config))?;
        let network = node.cni_conf_dir().join("10-operator-manager.conflist");
        std::fs::write(&network, cni_network(node)).map_err(Error::io("writing", &network))?;
        Ok(vec![format!("--config={}", config.display())])
    }

    /// containerd's configuration (format version 2, which containerd 1.6 and 1.7 read).
    ///
    /// - `restrict_oom_score_adj`: root may lack `CAP_SYS_RESOURCE` (in a container or a
    ///   sandboxed VM); without it every sandbox fails to start.
    /// - `netns_mounts_under_state_dir`: pod network namespaces live under the node's
    ///   directory, so `down` finds every one of them.
    /// - the sandbox image is the locally built `pause`, never pulled.
    /// - registries are configured by directory (`config_path`): the node's own registry speaks
    ///   plain HTTP.
    fn config(node: &NodeState) -> String {
        let dir = node.containerd_dir();
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        format!(
            r#"# Generated for the local cluster's real node; removed by `cargo xtask cluster down`.
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{socket}"

[debug]
  level = "info"

[{cri}]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.registry]
  config_path = "{hosts}"

[{cri}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni_conf}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"#,
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            socket = node.containerd_socket.display(),
            pause = super::pause_image(),
            cni_bin = CNI_BIN_DIR,
            cni_conf = node.cni_conf_dir().display(),
            opt = dir.join("opt").display(),
            hosts = node.containerd_hosts_dir().display(),
        )
    }

    /// Waits for containerd to answer on its socket.
    pub(crate) fn ready(socket: &Path) -> std::result::Result<(), String> {
        run("ctr", &ctr_args(socket, &["version"]))
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// `ctr` arguments for the node's containerd and the kubelet's namespace.
pub(crate) fn ctr_args<'a>(socket: &'a Path, rest: &[&'a str]) -> Vec<&'a str> {
    let address = socket.to_str().unwrap_or_default();
    let mut args = vec!["--address", address, "--namespace", K8S_NAMESPACE];
    args.extend_from_slice(rest);
    args
}

/// The names of the images in the node's containerd (what the kubelet can run without a pull).
///
/// # Errors
/// [`Error::HostCommand`] when `ctr` cannot reach containerd.
pub fn loaded_images(socket: &Path) -> Result<Vec<String>> {
    let out = run("ctr", &ctr_args(socket, &["images", "list", "--quiet"]))?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("sha256:"))
        .map(str::to_owned)
        .collect())
}

/// The node's CNI network: a bridge with host-local addresses, and port mappings for pods that
/// ask for host ports. No masquerading: pod traffic never leaves the machine.
fn cni_network(node: &NodeState) -> String {
    let network = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "operator-manager",
        "plugins": [
            {
                "type": "bridge",
                "bridge": super::BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": super::POD_CIDR, "gateway": super::NODE_IP.to_string() }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": node.ipam_dir(),
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    });
    serde_json::to_string_pretty(&network).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_keeps_everything_under_the_node_directory() {
        let node = NodeState::new(Path::new("/state"));
        let config = Containerd::config(&node);
        assert!(config.contains("root = \"/state/node/containerd/root\""));
        assert!(config.contains("address = \"/state/node/containerd.sock\""));
        assert!(config.contains("restrict_oom_score_adj = true"));
        assert!(config.contains("netns_mounts_under_state_dir = true"));
        assert!(config.contains(&format!(
            "sandbox_image = \"{}\"",
            super::super::pause_image()
        )));
        assert!(config.contains("SystemdCgroup = false"));
        assert!(config.contains("config_path = \"/state/node/containerd/certs.d\""));
    }

    #[test]
    fn the_network_uses_our_bridge_and_range() {
        let node = NodeState::new(Path::new("/state"));
        let network: serde_json::Value = serde_json::from_str(&cni_network(&node)).expect("JSON");
        let bridge = &network["plugins"][0];
        assert_eq!(bridge["bridge"], super::super::BRIDGE);
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(
            bridge["ipam"]["ranges"][0][0]["subnet"],
            super::super::POD_CIDR
        );
        assert_eq!(bridge["ipam"]["dataDir"], "/state/node/cni/ipam");
    }
}
