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
    write_config(node, "config.yml", &config(&storage(node)?, address, None))
}

/// Writes the configuration of a second registry on the same storage that serves HTTPS with
/// `tls` (certificate, key); returns its command-line arguments. Registries sharing a storage
/// directory is how the distribution's registry scales out.
pub(crate) fn prepare_https(
    node: &NodeState,
    address: SocketAddrV4,
    tls: (&Path, &Path),
) -> Result<Vec<String>> {
    write_config(
        node,
        "config-https.yml",
        &config(&storage(node)?, address, Some(tls)),
    )
}

fn storage(node: &NodeState) -> Result<std::path::PathBuf> {
    let storage = node.registry_dir().join("storage");
    std::fs::create_dir_all(&storage).map_err(Error::io("creating", &storage))?;
    Ok(storage)
}

fn write_config(node: &NodeState, name: &str, text: &str) -> Result<Vec<String>> {
    let config_file = node.registry_dir().join(name);
    std::fs::write(&config_file, text).map_err(Error::io("writing", &config_file))?;
    Ok(vec!["serve".into(), config_file.display().to_string()])
}

/// The registry's configuration: filesystem storage, no authentication, deletes allowed (so a
/// tag can be replaced and its old blobs collected), plain HTTP unless `tls` names a
/// certificate and key.
fn config(storage: &Path, address: SocketAddrV4, tls: Option<(&Path, &Path)>) -> String {
    let tls = tls
        .map(|(cert, key)| {
            format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            )
        })
        .unwrap_or_default();
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
{tls}",
        storage = storage.display(),
    )
}

/// Public registries whose images the node asks the local registry for first, since it cannot
/// reach them: OLM and `operator-sdk` name their images (`quay.io/operator-framework/opm`) and
/// pull them with `imagePullPolicy: Always`, so the images built here are pushed to the local
/// registry under the same paths.
pub const MIRRORED: [&str; 1] = ["quay.io"];

/// Tells containerd to pull from the registry over plain HTTP (`<address>/hosts.toml` in the
/// directory containerd reads registries from, [`NodeState::containerd_hosts_dir`]), and to ask
/// it first for the images of the [`MIRRORED`] registries.
pub(crate) fn containerd_hosts(
    node: &NodeState,
    address: SocketAddrV4,
    https: Option<(SocketAddrV4, &Path)>,
) -> Result<()> {
    let hosts = node.containerd_hosts_dir();
    let files = std::iter::once((address.to_string(), hosts_toml(address)))
        .chain(https.map(|(https, ca)| (https.to_string(), https_hosts_toml(https, ca))))
        .chain(
            MIRRORED
                .iter()
                .map(|registry| ((*registry).to_owned(), mirror_toml(registry, address))),
        );
    for (name, text) in files {
        let dir = hosts.join(name);
        std::fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
        let file = dir.join("hosts.toml");
        std::fs::write(&file, text).map_err(Error::io("writing", &file))?;
    }
    Ok(())
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

/// The registry's HTTPS address, its certificate checked against the cluster's CA (`ca`).
fn https_hosts_toml(address: SocketAddrV4, ca: &Path) -> String {
    format!(
        "# The local cluster's registry over HTTPS, with a certificate of the cluster's CA.
server = \"https://{address}\"

[host.\"https://{address}\"]
  capabilities = [\"pull\", \"resolve\"]
  ca = \"{}\"
",
        ca.display()
    )
}

/// `registry`'s images from the local one first, by the same path; `registry` itself after.
fn mirror_toml(registry: &str, address: SocketAddrV4) -> String {
    format!(
        "# {registry}'s images from the local cluster's registry first (plain HTTP), by the same path.
server = \"https://{registry}\"

[host.\"http://{address}\"]
  capabilities = [\"pull\", \"resolve\"]
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
        let text = config(&node.registry_dir().join("storage"), address(5000), None);
        let yaml: serde_json::Value = yaml_serde::from_str(&text).expect("YAML");
        assert_eq!(
            yaml["storage"]["filesystem"]["rootdirectory"],
            "/state/node/registry/storage"
        );
        assert_eq!(yaml["http"]["addr"], format!("{NODE_IP}:5000"));
        assert!(yaml.get("auth").is_none(), "no authentication: {yaml}");
        assert!(yaml["http"].get("tls").is_none(), "plain HTTP: {yaml}");
    }

    #[test]
    fn the_https_registry_shares_the_storage_and_serves_the_certificate() {
        let node = NodeState::new(Path::new("/state"));
        let storage = node.registry_dir().join("storage");
        let tls = (
            Path::new("/pki/registry.crt"),
            Path::new("/pki/registry.key"),
        );
        let yaml: serde_json::Value =
            yaml_serde::from_str(&config(&storage, address(5001), Some(tls))).expect("YAML");
        assert_eq!(
            yaml["storage"]["filesystem"]["rootdirectory"],
            "/state/node/registry/storage"
        );
        assert_eq!(yaml["http"]["tls"]["certificate"], "/pki/registry.crt");
        assert_eq!(yaml["http"]["tls"]["key"], "/pki/registry.key");
        let hosts: toml::Value = toml::from_str(&https_hosts_toml(
            address(5001),
            Path::new("/pki/trusted/ca.crt"),
        ))
        .expect("TOML");
        let host = &hosts["host"][&format!("https://{NODE_IP}:5001")];
        assert_eq!(host["ca"].as_str(), Some("/pki/trusted/ca.crt"));
    }

    #[test]
    fn containerd_pulls_from_it_over_plain_http() {
        let text = hosts_toml(address(5000));
        assert!(text.contains(&format!("server = \"http://{NODE_IP}:5000\"")));
        assert!(text.contains(&format!("[host.\"http://{NODE_IP}:5000\"]")));
    }

    #[test]
    fn quay_io_is_asked_of_it_first() {
        let text = mirror_toml("quay.io", address(5000));
        let toml: toml::Value = toml::from_str(&text).expect("TOML");
        assert_eq!(toml["server"].as_str(), Some("https://quay.io"));
        let host = &toml["host"][&format!("http://{NODE_IP}:5000")];
        assert_eq!(
            host["capabilities"],
            toml::Value::Array(vec!["pull".into(), "resolve".into()]),
            "never pushed to as quay.io"
        );
    }
}
