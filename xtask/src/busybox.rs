//! The distribution's static busybox (`busybox-static`, which `cargo xtask setup` installs): one
//! file that is a shell, `cp`, `cat`, `gzip`, `mkdir` and `rm`. Its shell runs those applets
//! without looking them up on a `PATH`, so an image of that one file is a shell image.
//!
//! The images the local cluster's helper pods need a shell in use it: the local-path
//! provisioner's helper pods, and the init container of the catalog pod `operator-sdk run
//! bundle` starts.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use ociimage::{Image, ImageConfig, Metadata, Platform, Reference, User};

/// Where the package installs it.
pub const BINARY: &str = "/bin/busybox";
/// A registry domain no one serves: nothing tries to pull the image, and it cannot be mistaken
/// for the published one.
const REPOSITORY: &str = concat!(product::name!(), ".local/busybox");

/// The shell image: busybox as `/bin/sh`, run as root, named by busybox's version.
///
/// # Errors
/// When busybox is not installed or prints no version.
pub fn shell_image() -> anyhow::Result<Image> {
    let binary = Path::new(BINARY);
    let version = version(binary)?;
    let config = ImageConfig {
        platform: Platform::host(),
        // The local-path volumes' parent directory belongs to root.
        user: User {
            name: "root".into(),
            uid: 0,
            gid: 0,
        },
        entrypoint: vec!["/bin/sh".into()],
        cmd: Vec::new(),
        env: Vec::new(),
        exposed_ports: Vec::new(),
        working_dir: "/".into(),
        metadata: Metadata {
            title: "busybox".into(),
            description: "the distribution's static busybox, as /bin/sh".into(),
            version: version.clone(),
            revision: None,
            source: None,
            url: Some("https://busybox.net/".into()),
            licenses: Some("GPL-2.0-only".into()),
            labels: Default::default(),
            created: 0,
        },
    };
    let reference = Reference::parse(&format!("{REPOSITORY}:{version}"))?;
    let mut image = Image::new(reference, config);
    image
        .add_binary(binary, "/bin/sh")
        .with_context(|| format!("adding {} to the busybox image", binary.display()))?;
    Ok(image)
}

/// The version busybox's banner names: `BusyBox v1.35.0 (Debian …)` gives `1.35.0`.
fn version(binary: &Path) -> anyhow::Result<String> {
    if !binary.is_file() {
        bail!(
            "{} not found: the local cluster's helper pods run the distribution's static \
             busybox; install it with `cargo xtask setup` (`apt-get install busybox-static`)",
            binary.display()
        );
    }
    let output = Command::new(binary)
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    parse_version(&String::from_utf8_lossy(&output.stdout))
}

fn parse_version(banner: &str) -> anyhow::Result<String> {
    banner
        .split_whitespace()
        .skip_while(|word| *word != "BusyBox")
        .nth(1)
        .and_then(|version| version.strip_prefix('v'))
        .map(str::to_owned)
        .with_context(|| {
            format!(
                "busybox printed no version: {:?}",
                banner.lines().next().unwrap_or_default()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_its_banner() {
        let banner = "BusyBox v1.35.0 (Debian 1:1.35.0-4+deb12u1+b1) multi-call binary.\n";
        assert_eq!(parse_version(banner).unwrap(), "1.35.0");
        assert!(parse_version("sh: not found").is_err());
    }
}
