//! Running the `manager` binary as a child process of a test.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::namespace::unique_name;
use crate::{Error, Result};

/// The directory of the running test binary's profile (`<target-dir>/debug`): tests run from
/// `<target-dir>/<profile>/deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let deps = exe.parent().unwrap_or(Path::new("."));
    let profile = if deps.ends_with("deps") {
        deps.parent().unwrap_or(deps)
    } else {
        deps
    };
    profile.to_owned()
}

/// The `manager` binary next to the test binary (`<target-dir>/<profile>/manager`).
///
/// # Errors
/// [`Error::ManagerMissing`], saying to run `cargo build -p manager`, when it is not built.
pub fn manager_binary() -> Result<PathBuf> {
    let path = profile_dir().join("manager");
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::ManagerMissing { path })
    }
}

/// Where test processes write their logs: `<target-dir>/<profile>/e2e-logs/`.
pub fn log_dir() -> PathBuf {
    profile_dir().join("e2e-logs")
}

/// A running `manager`, killed when dropped (so a failing test never leaves one behind).
#[derive(Debug)]
pub struct ManagerProcess {
    child: Child,
    log: PathBuf,
}

/// Starts the `manager` binary with `KUBECONFIG=kubeconfig`, the given arguments and extra
/// environment, its stdout and stderr going to a fresh file in [`log_dir`]. `RUST_LOG`
/// defaults to `info` unless set in `env` or the test's environment. The webhook server is
/// off (`MANAGER_WEBHOOK_BIND_ADDRESS=0`): tests run managers side by side, and only a test of
/// the webhooks turns it on, with a loopback address of its own.
///
/// ```no_run
/// # async fn demo(kubeconfig: &std::path::Path) -> testkit::Result<()> {
/// let manager = testkit::spawn_manager(kubeconfig, &["--metrics-bind-address=127.0.0.1:0"], &[]).await?;
/// // ... on failure, print manager.log_text() ...
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::ManagerMissing`] when not built; [`Error::Spawn`] when it cannot start.
pub async fn spawn_manager(
    kubeconfig: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<ManagerProcess> {
    spawn_manager_binary(&manager_binary()?, kubeconfig, args, env).await
}

/// As [`spawn_manager`], with a given manager binary (for example a release build).
///
/// # Errors
/// [`Error::Spawn`] when it cannot start.
pub async fn spawn_manager_binary(
    binary: &Path,
    kubeconfig: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<ManagerProcess> {
    let binary = binary.to_owned();
    let dir = log_dir();
    std::fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
    let log = dir.join(format!("{}.log", unique_name("manager")));
    let out = std::fs::File::create(&log).map_err(Error::io("creating", &log))?;
    let err = out.try_clone().map_err(Error::io("creating", &log))?;
    let mut cmd = Command::new(&binary);
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    cmd.env("MANAGER_WEBHOOK_BIND_ADDRESS", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().map_err(|source| Error::Spawn {
        binary: binary.clone(),
        source,
    })?;
    Ok(ManagerProcess { child, log })
}

impl ManagerProcess {
    /// Its process id, while it runs.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Everything it has logged so far.
    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Sends SIGTERM (a graceful shutdown, as the kubelet does).
    pub fn terminate(&self) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }

    /// Waits up to `timeout` for it to exit; `None` if it still runs.
    ///
    /// # Errors
    /// [`Error::Io`] when waiting fails.
    pub async fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status
                .map(Some)
                .map_err(Error::io("waiting for", &self.log)),
            Err(_) => Ok(None),
        }
    }

    /// Whether it has exited, without waiting.
    ///
    /// # Errors
    /// [`Error::Io`] when the status cannot be read.
    pub fn try_exit_status(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .map_err(Error::io("checking", &self.log))
    }

    /// Kills it (SIGKILL) and waits for it.
    ///
    /// # Errors
    /// [`Error::Io`] when killing fails.
    pub async fn kill(&mut self) -> Result<()> {
        self.child
            .kill()
            .await
            .map_err(Error::io("killing", &self.log))
    }
}

/// A free TCP port on 127.0.0.1, e.g. for `--metrics-bind-address`.
///
/// # Errors
/// [`Error::Io`] when no port can be bound.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(Error::io("binding", "127.0.0.1:0"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(Error::io("binding", "127.0.0.1:0"))
}

/// A free TCP port on 127.0.0.1 that is none of `kept`: the ports a test keeps for a process it
/// restarts are free while that process is down, and the kernel may hand one out again.
///
/// # Errors
/// [`Error::Io`] when no port can be bound.
pub fn free_port_other_than(kept: &[u16]) -> Result<u16> {
    loop {
        let port = free_port()?;
        if !kept.contains(&port) {
            return Ok(port);
        }
    }
}
