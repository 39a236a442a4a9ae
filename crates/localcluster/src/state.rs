//! What a running cluster consists of, saved next to it so later commands can find, inspect and
//! stop it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result, process};

/// One process of the control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    /// `etcd`, `kube-apiserver`, ...
    pub name: String,
    /// Its process id (also its process group).
    pub pid: u32,
    /// The binary it runs.
    pub binary: PathBuf,
    /// The loopback ports it listens on, by purpose.
    pub ports: BTreeMap<String, u16>,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
}

impl Component {
    /// Whether the process still runs.
    pub fn alive(&self) -> bool {
        process::is_alive(self.pid, &self.binary)
    }
}

/// The saved state of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    /// The versions it runs (`<k8s>-<etcd>-<kwok>`).
    pub versions: String,
    /// The API server URL.
    pub server: String,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The CA certificate clients trust.
    pub ca_cert: PathBuf,
    /// The directory of `kubectl` and the other binaries.
    pub bin_dir: PathBuf,
    /// The processes, in start order.
    pub components: Vec<Component>,
    /// The real node, when the cluster has one.
    #[serde(default)]
    pub node: Option<crate::node::NodeState>,
    /// The API server's current audit log file (rotated backups sit beside it, see
    /// [`ClusterState::audit_log_files`]); `None` for a cluster started before the API server
    /// kept one.
    #[serde(default)]
    pub audit_log: Option<PathBuf>,
    /// The API server's feature gates beyond its defaults, as `Name=true`.
    #[serde(default)]
    pub feature_gates: Vec<String>,
}

impl ClusterState {
    pub(crate) fn file(state_dir: &Path) -> PathBuf {
        state_dir.join("state.json")
    }

    /// Reads the state, `None` when no cluster was started.
    pub(crate) fn load(state_dir: &Path) -> Result<Option<Self>> {
        let path = Self::file(state_dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| Error::State { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::Io {
                action: "reading",
                path,
                source: e,
            }),
        }
    }

    pub(crate) fn save(&self, state_dir: &Path) -> Result<()> {
        let path = Self::file(state_dir);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self).map_err(|source| Error::State {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&tmp, text).map_err(Error::io("writing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(Error::io("writing", &path))
    }

    /// Every file of the API server's audit log, oldest first: the rotated backups, then the
    /// current file. Read them in this order for the events in the order the API server wrote
    /// them. Empty when the cluster keeps no audit log or has logged nothing yet.
    ///
    /// # Errors
    /// [`Error::Io`] when the log's directory cannot be listed.
    pub fn audit_log_files(&self) -> Result<Vec<PathBuf>> {
        match &self.audit_log {
            Some(log) => crate::audit::log_files(log),
            None => Ok(Vec::new()),
        }
    }

    /// The address of the real node's image registry (`HOST:PORT`, plain HTTP), which this
    /// machine pushes to and the node pulls from; `None` without a real node.
    pub fn registry(&self) -> Option<SocketAddrV4> {
        self.node.as_ref().and_then(|node| node.registry)
    }

    /// The same registry over HTTPS, its certificate issued by the cluster's CA; `None` without
    /// a real node.
    pub fn registry_https(&self) -> Option<SocketAddrV4> {
        self.node.as_ref().and_then(|node| node.registry_https)
    }

    /// Whether every process still runs.
    pub fn all_alive(&self) -> bool {
        !self.components.is_empty() && self.components.iter().all(Component::alive)
    }
}

/// What `status` reports: each process, whether it runs, and where.
#[derive(Debug, Clone)]
pub struct Status {
    /// The saved state.
    pub state: ClusterState,
    /// Per component, whether it is alive, in the same order.
    pub alive: Vec<bool>,
}

impl Status {
    /// Whether every component runs.
    pub fn healthy(&self) -> bool {
        !self.alive.is_empty() && self.alive.iter().all(|a| *a)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.healthy() {
            "running"
        } else {
            "DEGRADED (some processes are not running)"
        };
        writeln!(f, "Local cluster ({}): {verdict}", self.state.versions)?;
        writeln!(f, "  API server: {}", self.state.server)?;
        writeln!(f, "  kubeconfig: {}", self.state.kubeconfig.display())?;
        if let Some(log) = &self.state.audit_log {
            writeln!(f, "  audit log:  {}", log.display())?;
        }
        if let Some(registry) = self.state.registry() {
            // Unindented, for scripts: `sed -n 's/^registry: //p'`, `s/^registry-https: //p`.
            writeln!(f, "registry: {registry}")?;
        }
        if let Some(https) = self.state.registry_https() {
            writeln!(f, "registry-https: {https}")?;
        }
        writeln!(
            f,
            "  {:<24} {:>8}  {:<6}  {:<48} log",
            "component", "pid", "state", "listens on"
        )?;
        for (c, alive) in self.state.components.iter().zip(&self.alive) {
            let ports = c
                .ports
                .iter()
                .map(|(what, port)| format!("{what}=127.0.0.1:{port}"))
                .collect::<Vec<_>>()
                .join(" ");
            let state = if *alive { "up" } else { "DOWN" };
            writeln!(
                f,
                "  {:<24} {:>8}  {:<6}  {:<48} {}",
                c.name,
                c.pid,
                state,
                ports,
                c.log.display()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_saved_before_the_audit_log_existed_still_loads() {
        let old = serde_json::json!({
            "versions": "v",
            "server": "https://127.0.0.1:1",
            "kubeconfig": "/k",
            "ca_cert": "/ca",
            "bin_dir": "/bin",
            "components": [],
        });
        let state: ClusterState = serde_json::from_value(old).expect("loads");
        assert_eq!(state.audit_log, None);
        assert!(state.audit_log_files().expect("no files").is_empty());
    }

    #[test]
    fn status_names_the_registry_on_a_line_of_its_own() {
        let mut node = crate::node::NodeState::new(Path::new("/state"));
        node.registry = Some(SocketAddrV4::new(crate::node::NODE_IP, 5000));
        node.registry_https = Some(SocketAddrV4::new(crate::node::NODE_IP, 5001));
        let state = ClusterState {
            versions: "v".into(),
            server: "https://127.0.0.1:1".into(),
            kubeconfig: "/k".into(),
            ca_cert: "/ca".into(),
            bin_dir: "/bin".into(),
            components: Vec::new(),
            node: Some(node),
            audit_log: None,
            feature_gates: Vec::new(),
        };
        let shown = Status {
            state,
            alive: Vec::new(),
        }
        .to_string();
        for line in ["registry: 10.85.0.1:5000", "registry-https: 10.85.0.1:5001"] {
            assert!(shown.lines().any(|l| l == line), "{line} in {shown}");
        }
    }
}
