//! The distribution's static busybox (`busybox-static`, which `cargo xtask setup` installs): one
//! file that is a shell, `cp`, `cat`, `gzip`, `mkdir` and `rm`. Its shell runs those applets
//! without looking them up on a `PATH`, so an image of that one file is a shell image.
//!
//! The images the local cluster's helper pods need a shell in use it: the local-path
//! provisioner's helper pods, and the init container of the catalog pod `operator-sdk run
//! bundle` starts. So does the image `operator-sdk scorecard` untars the bundle with.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use ociimage::{Image, ImageConfig, Metadata, Reference, User};

/// Where the package installs it.
pub const BINARY: &str = "/bin/busybox";
/// A registry domain no one serves: nothing tries to pull the images, and they cannot be mistaken
/// for the published ones.
const REPOSITORY_DOMAIN: &str = concat!(product::name!(), ".local");

/// The shell image: busybox as `/bin/sh`, run as root, named by busybox's version.
///
/// # Errors
/// When busybox is not installed or prints no version.
pub fn shell_image() -> anyhow::Result<Image> {
    // The local-path volumes' parent directory belongs to root.
    image("busybox", "/bin/sh", User::new("root", 0), Some("/bin/sh"))
}

/// The tar image: busybox as `/bin/tar` and no entrypoint, so a container's command is `tar`
/// and its arguments, as `operator-sdk scorecard`'s init container runs its `--untar-image`.
///
/// # Errors
/// As [`shell_image`].
pub fn tar_image() -> anyhow::Result<Image> {
    image("busybox-tar", "/bin/tar", User::new("nonroot", 65532), None)
}

/// busybox at `path`, an applet's name, which is what busybox runs when started by it.
fn image(name: &str, path: &str, user: User, entrypoint: Option<&str>) -> anyhow::Result<Image> {
    let binary = Path::new(BINARY);
    let version = version(binary)?;
    let config = ImageConfig {
        env: vec![("PATH".into(), "/bin".into())],
        ..ImageConfig::new(
            user,
            entrypoint.into_iter().map(str::to_owned).collect(),
            Metadata {
                title: name.into(),
                description: format!("the distribution's static busybox, as {path}"),
                version: version.clone(),
                revision: None,
                source: None,
                url: Some("https://busybox.net/".into()),
                licenses: Some("GPL-2.0-only".into()),
                labels: Default::default(),
                created: 0,
            },
        )
    };
    let reference = Reference::parse(&format!("{REPOSITORY_DOMAIN}/{name}:{version}"))?;
    let mut image = Image::new(reference, config);
    image
        .add_binary(binary, path)
        .with_context(|| format!("adding {} to the {name} image", binary.display()))?;
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
