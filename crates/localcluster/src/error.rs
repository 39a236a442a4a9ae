//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while building, starting, inspecting or stopping the local
/// control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither `XDG_CACHE_HOME` nor `HOME` is set, so there is nowhere to keep the cache.
    #[error("cannot find a cache directory: neither XDG_CACHE_HOME nor HOME is set")]
    NoCacheDir,

    /// The `go` command is not installed (or not on `PATH`).
    #[error(
        "the Go toolchain is required to build the control plane, but `go` was not found on PATH \
         (install Go {required} or newer)"
    )]
    GoMissing {
        /// The oldest Go release that builds the pinned versions.
        required: &'static str,
        /// Why running `go` failed.
        #[source]
        source: std::io::Error,
    },

    /// The Go module proxy could not be reached and the modules are not in the module cache.
    #[error(
        "cannot download the Go modules of the control plane (is the Go module proxy reachable? \
         GOPROXY={goproxy}):\n{stderr}"
    )]
    ModuleProxy {
        /// The value of `go env GOPROXY`.
        goproxy: String,
        /// What `go` said.
        stderr: String,
    },

    /// `go build` failed.
    #[error("building {what} failed; the end of {log}:\n{tail}")]
    GoBuild {
        /// Which module was being built.
        what: &'static str,
        /// The build log.
        log: PathBuf,
        /// The last lines of the build log.
        tail: String,
    },

    /// The C compiler that builds `pause` could not be run.
    #[error(
        "cannot run the C compiler `{compiler}` to build the pod sandbox (`pause`); install \
         Debian's `gcc` and `libc6-dev` (`cargo xtask setup` does)"
    )]
    CompilerMissing {
        /// The compiler command (`$CC`, else `cc`).
        compiler: String,
        /// Why it could not be run.
        #[source]
        source: std::io::Error,
    },

    /// This machine cannot run the real node, and why.
    #[error(
        "the real node cannot run here: {problem}\n  fix: {fix}\n  (`cargo xtask cluster up \
         --without-real-node` starts the control plane and the fake nodes only)"
    )]
    NodePrerequisite {
        /// What is missing or wrong.
        problem: String,
        /// What to do about it.
        fix: String,
    },

    /// A host command that sets up or tears down the real node failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    HostCommand {
        /// The command line.
        command: String,
        /// Its exit status, or why it did not run.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },

    /// Building or loading a locally built image failed.
    #[error("preparing an image for the real node failed")]
    Image(#[from] ociimage::Error),

    /// `down` could not remove everything the real node had made.
    #[error(
        "the real node left these behind (run `cargo xtask cluster down` again; if they stay, \
         remove them by hand):\n  {}", .0.join("\n  ")
    )]
    Leftovers(Vec<String>),

    /// A file or directory could not be read or written.
    #[error("{action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A process of the control plane could not be started.
    #[error("cannot start {component} ({binary})")]
    Spawn {
        /// The component's name.
        component: String,
        /// The binary that was run.
        binary: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A process of the control plane exited while starting up.
    #[error("{component} exited during start-up; the end of its log ({log}):\n{tail}")]
    Exited {
        /// The component's name.
        component: String,
        /// Its log file.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },

    /// A process of the control plane to restart had already exited.
    #[error(
        "{component} is not running, so it cannot be restarted; the end of its log ({log}):\n{tail}"
    )]
    ComponentDown {
        /// The component's name.
        component: String,
        /// Its log file.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },

    /// The control plane did not become ready in time.
    #[error("timed out after {seconds}s waiting for {what}{detail}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        seconds: u64,
        /// The last error seen, if any, with its log file.
        detail: String,
    },

    /// Generating certificates or keys failed.
    #[error("generating {what} failed")]
    Certificate {
        /// Which certificate or key.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: rcgen::Error,
    },

    /// No free loopback port could be found.
    #[error("cannot find a free port on 127.0.0.1")]
    NoFreePort(#[source] std::io::Error),

    /// The saved state of the cluster is unreadable.
    #[error(
        "the cluster state in {path} is unreadable; run `cargo xtask cluster down` to reset it"
    )]
    State {
        /// The state file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },

    /// No cluster is running.
    #[error("no local cluster is running (start one with `cargo xtask cluster up`)")]
    NotRunning,

    /// A Kubernetes client could not be built from the admin kubeconfig.
    #[error("cannot use the kubeconfig {path}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A request to the API server failed.
    #[error("{action} failed")]
    Api {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },

    /// kwok's upstream stages are not what this version expects to rewrite.
    #[error("kwok's stages in {path} are not what the local cluster expects: {problem}")]
    KwokStages {
        /// The upstream stage file.
        path: PathBuf,
        /// What is unexpected.
        problem: String,
    },

    /// Rendering a kubeconfig or configuration file failed.
    #[error("rendering {what} failed: {message}")]
    Render {
        /// Which file.
        what: &'static str,
        /// What went wrong.
        message: String,
    },
}

impl Error {
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
