//! The node's image registry: the distribution's `docker-registry`, on the node's address, so
//! that this machine pushes to it and both the node's containerd and its pods pull from it.
//!
//! It speaks plain HTTP (there is no public CA here), so containerd is told to reach it that way
//! (a `hosts.toml` under its `config_path`, the way containerd configures a mirror). Its storage
//! lives under the node's directory, and `down` removes it with the rest.

use std::net::SocketAddrV4;
use std::path::Path;

use super::{NODE_IP, NodeState};
use crate::{Error, Result};

/// The registry's program, from the distribution's `docker-registry` package.
pub(crate) const PROGRAM: &str = "docker-registry";

/// The registry's address on the node.
pub(crate) fn address(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(NODE_IP, port)
}

/// Writes the registry's configuration; returns its command-line arguments.
pub(crate) fn prepare(node: &NodeState, address: SocketAddrV4) -> Result<Vec<String>> {
    let dir = node.registry_dir();
    let storage = dir.join("storage");
    std::fs::create_dir_all(&storage).map_err(Error::io("creating", &storage))?;
    let config_file = dir.join("config.yml");
    std::fs::write(&config_file, config(&storage, address))
        .map_err(Error::io("writing", &config_file))?;
    Ok(vec!["serve".into(), config_file.display().to_string()])
}

/// The registry's configuration: filesystem storage, no authentication, deletes allowed (so a
/// tag can be replaced and its old blobs collected).
fn config(storage: &Path, address: SocketAddrV4) -> String {
    format!(
        "# Generated for the local cluster's registry; removed by `cargo xtask cluster down`.
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: {address}
  headers:
    X-Content-Type-Options: [nosniff]
",
        storage = storage.display(),
    )
}

/// Tells containerd to pull from the registry over plain HTTP: `<address>/hosts.toml` in the
/// directory containerd reads registries from ([`NodeState::containerd_hosts_dir`]).
pub(crate) fn containerd_hosts(node: &NodeState, address: SocketAddrV4) -> Result<()> {
    let dir = node.containerd_hosts_dir().join(address.to_string());
    std::fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
    let file = dir.join("hosts.toml");
    std::fs::write(&file, hosts_toml(address)).map_err(Error::io("writing", &file))
}

fn hosts_toml(address: SocketAddrV4) -> String {
    format!(
        "# The local cluster's registry, plain HTTP.
server = \"http://{address}\"

[host.\"http://{address}\"]
  capabilities = [\"pull\", \"resolve\", \"push\"]
"
    )
}

/// Whether the registry answers its API's version check (`GET /v2/`, 200).
pub(crate) async fn ready(address: SocketAddrV4) -> std::result::Result<(), String> {
    crate::http::get_ok((*address.ip()).into(), address.port(), "/v2/")
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_keeps_its_storage_under_the_node_and_listens_on_its_address() {
        let node = NodeState::new(Path::new("/state"));
        let text = config(&node.registry_dir().join("storage"), address(5000));
        let yaml: serde_json::Value = yaml_serde::from_str(&text).expect("YAML");
        assert_eq!(
            yaml["storage"]["filesystem"]["rootdirectory"],
            "/state/node/registry/storage"
        );
        assert_eq!(yaml["http"]["addr"], format!("{NODE_IP}:5000"));
        assert!(yaml.get("auth").is_none(), "no authentication: {yaml}");
    }

    #[test]
    fn containerd_pulls_from_it_over_plain_http() {
        let text = hosts_toml(address(5000));
        assert!(text.contains(&format!("server = \"http://{NODE_IP}:5000\"")));
        assert!(text.contains(&format!("[host.\"http://{NODE_IP}:5000\"]")));
    }
}
