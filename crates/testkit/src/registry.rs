//! An image registry of a test's own: the distribution's `docker-registry` (which `cargo xtask
//! setup` installs) on a loopback port, storing in a directory of the test's, stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How long the registry may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running registry, plain HTTP, without authentication.
#[derive(Debug)]
pub struct PrivateRegistry {
    process: Child,
    address: String,
}

impl PrivateRegistry {
    /// Starts a registry storing under `dir` (created), and waits until it listens.
    ///
    /// # Errors
    /// [`Error::Io`] when `dir` cannot be written, [`Error::Spawn`] when `docker-registry` is not
    /// installed, [`Error::Timeout`] when it does not listen within 30 s (its log is named).
    pub fn start(dir: &Path) -> Result<Self> {
        let io = |action: &'static str, path: PathBuf| {
            move |source| Error::Io {
                action,
                path,
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(io("creating", dir.to_owned()))?;
        let port = crate::free_port()?;
        let address = format!("127.0.0.1:{port}");
        let config = dir.join("config.yml");
        let text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {address}\n",
            dir.join("storage").display()
        );
        std::fs::write(&config, text).map_err(io("writing", config.clone()))?;
        let log_path = dir.join("registry.log");
        let log = std::fs::File::create(&log_path).map_err(io("creating", log_path.clone()))?;
        let log_err = log.try_clone().map_err(io("opening", log_path.clone()))?;
        let binary = PathBuf::from("docker-registry");
        let process = Command::new(&binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|source| Error::Spawn { binary, source })?;
        let registry = Self { process, address };
        let start = Instant::now();
        while std::net::TcpStream::connect(&registry.address).is_err() {
            if start.elapsed() > START_TIMEOUT {
                return Err(Error::Timeout {
                    what: format!("the registry to listen on {}", registry.address),
                    seconds: START_TIMEOUT.as_secs_f64(),
                    last: format!("see {}", log_path.display()),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(registry)
    }

    /// Its address, `127.0.0.1:PORT`.
    pub fn address(&self) -> &str {
        &self.address
    }
}

impl Drop for PrivateRegistry {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
