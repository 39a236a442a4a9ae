//! Where the control plane keeps its binaries and its running state, outside the repository.

use std::path::{Path, PathBuf};

use crate::{Error, Result, versions};

/// The directories of the local control plane.
///
/// Everything lives under `${XDG_CACHE_HOME:-$HOME/.cache}/operator-manager/`:
/// - `control-plane/<k8s>-<etcd>-<kwok>/bin/`: binaries built once per set of versions;
/// - `cluster/`: the running cluster (certificates, etcd data, logs, pids, kubeconfigs, the API
///   server's audit log in `cluster/audit/`), removed by `down`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    root: PathBuf,
    state_dir: Option<PathBuf>,
}

impl Paths {
    /// The directories under the user's cache directory.
    ///
    /// # Errors
    /// [`Error::NoCacheDir`] when neither `XDG_CACHE_HOME` nor `HOME` is set.
    pub fn from_env() -> Result<Self> {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|home| PathBuf::from(home).join(".cache"))
            })
            .ok_or(Error::NoCacheDir)?;
        Ok(Self::with_root(cache.join("operator-manager")))
    }

    /// The directories under an explicit root (tests use a temporary one).
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            state_dir: None,
        }
    }

    /// The same binaries, but the running cluster's state in `dir`: a second, independent
    /// cluster (its own ports, certificates and processes) next to the default one.
    #[must_use]
    pub fn with_state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// The root, `.../operator-manager`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The build cache of the pinned versions.
    pub fn control_plane_dir(&self) -> PathBuf {
        self.root.join("control-plane").join(versions::cache_key())
    }

    /// The built binaries.
    pub fn bin_dir(&self) -> PathBuf {
        self.control_plane_dir().join("bin")
    }

    /// The state of the running cluster.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| self.root.join("cluster"))
    }

    /// The admin kubeconfig of the running cluster.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.state_dir().join("admin.kubeconfig")
    }

    /// The directory of the API server's audit log: the current file, [`Paths::audit_log`], and
    /// its rotated backups, `audit-<UTC timestamp>.log`.
    pub fn audit_dir(&self) -> PathBuf {
        self.state_dir().join("audit")
    }

    /// The API server's current audit log file: JSON lines, one `audit.k8s.io/v1` Event each.
    pub fn audit_log(&self) -> PathBuf {
        self.audit_dir().join("audit.log")
    }

    /// The API server's audit policy, written at start.
    pub(crate) fn audit_policy(&self) -> PathBuf {
        self.state_dir().join("audit-policy.yaml")
    }

    /// The lock that serialises `up` and `down` across processes.
    pub(crate) fn cluster_lock(&self) -> PathBuf {
        self.state_dir().with_extension("lock")
    }
}
