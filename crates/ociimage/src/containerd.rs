//! Handing an archive to containerd, where the kubelet finds it without any registry.

use std::path::Path;
use std::process::{Command, Output};

use crate::{Error, Reference};

/// The containerd namespace the kubelet's CRI plugin keeps its images in.
pub const KUBERNETES_NAMESPACE: &str = "k8s.io";

/// How long to wait for containerd to accept the connection before calling it unreachable.
const CONNECT_TIMEOUT: &str = "10s";

/// Imports `archive` into the containerd at `address`, in [`KUBERNETES_NAMESPACE`], and checks
/// that it lists `reference` afterwards.
///
/// Runs containerd's own client, `ctr images import`, which unpacks the image for the default
/// snapshotter too, so a pod with `image: <reference>` and `imagePullPolicy: IfNotPresent` starts
/// without pulling. The name comes from the archive's `io.containerd.image.name` annotation,
/// which [`Image::write`](crate::Image::write) sets to [`Reference::normalized`].
///
/// # Errors
///
/// [`Error::CtrMissing`] when `ctr` is not installed, [`Error::ContainerdUnreachable`] when
/// nothing answers at `address`, [`Error::ImportFailed`] when containerd refuses the archive,
/// [`Error::NotImported`] when the image is not listed under its name afterwards.
pub fn import_into_containerd(
    archive: &Path,
    reference: &Reference,
    address: &Path,
) -> Result<(), Error> {
    if !address.exists() {
        return Err(Error::ContainerdUnreachable {
            address: address.to_owned(),
            message: "the socket does not exist".into(),
        });
    }
    if !archive.is_file() {
        return Err(Error::Source {
            path: archive.to_owned(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    let version = ctr(address, &["version"])?;
    if !version.status.success() {
        return Err(Error::ContainerdUnreachable {
            address: address.to_owned(),
            message: stderr(&version),
        });
    }

    let mut args = vec!["images", "import"];
    let archive_arg = archive.to_string_lossy();
    args.push(&archive_arg);
    let import = ctr(address, &args)?;
    if !import.status.success() {
        return Err(Error::ImportFailed {
            archive: archive.to_owned(),
            address: address.to_owned(),
            message: stderr(&import),
        });
    }

    let name = reference.normalized();
    let list = ctr(address, &["images", "ls", "--quiet"])?;
    let listed = list.status.success()
        && String::from_utf8_lossy(&list.stdout)
            .lines()
            .any(|line| line.trim() == name);
    if !listed {
        return Err(Error::NotImported {
            archive: archive.to_owned(),
            address: address.to_owned(),
            name,
        });
    }
    Ok(())
}

fn ctr(address: &Path, args: &[&str]) -> Result<Output, Error> {
    Command::new("ctr")
        .arg("--address")
        .arg(address)
        .args(["--connect-timeout", CONNECT_TIMEOUT])
        .args(["--namespace", KUBERNETES_NAMESPACE])
        .args(args)
        .output()
        .map_err(|source| Error::CtrMissing { source })
}

fn stderr(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    if text.is_empty() {
        format!("ctr exited with {}", output.status)
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_socket_is_reported_before_running_anything() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("containerd.sock");
        let reference = Reference::parse("app:1").unwrap();
        let error =
            import_into_containerd(&dir.path().join("a.tar"), &reference, &socket).unwrap_err();
        assert!(
            matches!(error, Error::ContainerdUnreachable { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("containerd.sock"), "{error}");
    }

    #[test]
    fn a_socket_nobody_listens_on_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("stale.sock");
        // Binding and closing leaves the socket file behind with nothing listening.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let archive = dir.path().join("a.tar");
        std::fs::write(&archive, b"").unwrap();
        let reference = Reference::parse("app:1").unwrap();
        match import_into_containerd(&archive, &reference, &socket).unwrap_err() {
            Error::ContainerdUnreachable { address, .. } => assert_eq!(address, socket),
            // Where containerd's client is not installed, that is what gets reported.
            Error::CtrMissing { .. } => {}
            error => panic!("unexpected error: {error}"),
        }
    }
}
