//! The one error type of this crate.

use std::path::PathBuf;

/// What can go wrong in test support; every variant says enough to act on without a debugger.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Starting or reaching the local cluster failed.
    #[error(transparent)]
    Cluster(#[from] localcluster::Error),

    /// A request to the API server failed.
    #[error("{action} failed: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },

    /// A file could not be read or written.
    #[error("{action} {path} failed: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A manifest is not valid YAML or not a Kubernetes object.
    #[error("invalid manifest {path}: {message}")]
    Manifest {
        /// The file (or `<inline>`).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// A condition did not hold in time.
    #[error("timed out after {seconds:.1}s waiting for {what}; last observation: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        seconds: f64,
        /// The last error or observation.
        last: String,
    },

    /// The manager binary has not been built.
    #[error("the manager binary {path} does not exist; run `cargo build -p manager` first")]
    ManagerMissing {
        /// Where it was expected.
        path: PathBuf,
    },

    /// The test needs real containers, but the local cluster runs without its real node.
    #[error(
        "the local cluster runs without a real node, which this test needs; restart it with \
         `cargo xtask cluster down && cargo xtask cluster up` (as root, after `cargo xtask setup`)"
    )]
    NoRealNode,

    /// An image the test runs on the real node has not been loaded there.
    #[error(
        "no image {repository}:* is loaded on the real node (loaded: {loaded}); build and load it \
         with `cargo xtask image {what} --load` (`cargo xtask test` does)"
    )]
    ImageNotLoaded {
        /// The image repository looked for.
        repository: String,
        /// The `cargo xtask image` target that builds it.
        what: String,
        /// The images the node has.
        loaded: String,
    },

    /// The cluster's binaries have no Prometheus (a cache built before it was added).
    #[error(
        "{path} does not exist; restart the local cluster (`cargo xtask cluster down && cargo \
         xtask cluster up`), which builds it"
    )]
    PrometheusMissing {
        /// Where it was expected.
        path: PathBuf,
    },

    /// Prometheus's HTTP API failed or answered an error.
    #[error("Prometheus request {request} failed: {message}")]
    Prometheus {
        /// The request path.
        request: String,
        /// What went wrong.
        message: String,
    },

    /// A loopback socket could not be bound, or an address not found.
    #[error("{action} failed: {source}")]
    Network {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A kubeconfig could not be read, parsed or rendered.
    #[error("cannot use the kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// A line of the API server's audit log is not an audit event.
    #[error("{} line {line} is not an audit event: {message}", path.display())]
    AuditLog {
        /// The audit log file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },

    /// A command ran and failed.
    #[error("`{command}` failed: {output}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// What it printed.
        output: String,
    },

    /// A process could not be started.
    #[error("cannot start {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::Kube { action, source }
    }

    pub(crate) fn network(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let action = action.into();
        move |source| Self::Network { action, source }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            action,
            path,
            source,
        }
    }
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
