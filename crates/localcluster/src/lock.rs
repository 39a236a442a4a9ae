//! Cross-process file locks, so parallel tests and commands never start or build twice.

use std::fs::File;
use std::path::Path;

use crate::{Error, Result};

/// An exclusive lock on a file, released when dropped (or when the process exits).
#[derive(Debug)]
pub(crate) struct FileLock {
    _file: File,
}

/// Waits, without blocking the async runtime, for an exclusive lock on `path` (created if
/// missing).
pub(crate) async fn exclusive(path: &Path) -> Result<FileLock> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(Error::io("creating", parent))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(Error::io("opening", path))?;
    let owned = path.to_owned();
    tokio::task::spawn_blocking(move || {
        file.lock().map_err(Error::io("locking", &owned))?;
        Ok(FileLock { _file: file })
    })
    .await
    .map_err(|e| Error::Io {
        action: "locking",
        path: path.to_owned(),
        source: std::io::Error::other(e),
    })?
}
