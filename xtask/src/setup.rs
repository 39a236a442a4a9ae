//! `cargo xtask setup`: installs the distribution packages the local cluster's real node and the
//! in-cluster tests need (containerd, runc, CNI plugins, iptables, the image registry, memcached, redis, busybox, a C
//! compiler for the pod sandbox, make for the manager's allocator, skopeo, podman and Docker),
//! so a fresh machine needs nothing done by hand.

use std::process::Command;

use anyhow::{Context as _, bail};

/// Packages beyond the real node's own: the C toolchain that compiles `pause` and the manager's
/// allocator (jemalloc, built with make), memcached and redis (the images the tests run), the
/// static busybox (the local-path provisioner's helper pods), and skopeo, podman and Docker, which the tests load the built images
/// with as users without containerd would. (Prometheus is built from source with the control plane: the
/// distribution's lacks Kubernetes service discovery.)
const EXTRA_PACKAGES: [&str; 9] = [
    "gcc",
    "libc6-dev",
    "make",
    "memcached",
    "redis-server",
    "busybox-static",
    "skopeo",
    "podman",
    "docker.io",
];

/// Every package, in install order.
pub fn packages() -> Vec<&'static str> {
    localcluster::node::PACKAGES
        .iter()
        .chain(EXTRA_PACKAGES.iter())
        .copied()
        .collect()
}

/// Installs what is missing with `apt-get` (as root), or says what to install.
///
/// # Errors
/// When packages are missing and cannot be installed here: not a Debian-like system, not root,
/// or `apt-get` fails.
pub fn run(check: bool) -> anyhow::Result<()> {
    if Command::new("dpkg-query")
        .arg("--version")
        .output()
        .is_err()
    {
        bail!(
            "this machine has no dpkg/apt-get; install the equivalents of these Debian packages \
             yourself: {}",
            packages().join(" ")
        );
    }
    let missing: Vec<&str> = packages().into_iter().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        println!("Every package is installed: {}", packages().join(" "));
        return Ok(());
    }
    let install = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if check {
        bail!(
            "missing packages: {}; run `cargo xtask setup` (as root) or `{install}`",
            missing.join(" ")
        );
    }
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "missing packages: {}; run `sudo cargo xtask setup`, or `sudo apt-get update && sudo {install}`",
            missing.join(" ")
        );
    }
    println!("Installing {} with apt-get", missing.join(" "));
    apt(&["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend(&missing);
    apt(&args)?;
    let still: Vec<&str> = missing.into_iter().filter(|p| !installed(p)).collect();
    if !still.is_empty() {
        bail!(
            "apt-get finished, but these packages are still not installed: {}",
            still.join(" ")
        );
    }
    println!("Installed.");
    Ok(())
}

/// Whether dpkg knows `package` as installed.
fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|out| out.status.success() && out.stdout == b"install ok installed")
}

fn apt(args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("apt-get")
        .args(args)
        // Package scripts must not wait for answers, and services they would start are not
        // needed: the cluster runs its own.
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .with_context(|| format!("running apt-get {}", args.join(" ")))?;
    if !status.success() {
        bail!("`apt-get {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_package_list_covers_the_node_and_the_tests() {
        let all = packages();
        for p in [
            "containerd",
            "runc",
            "containernetworking-plugins",
            "memcached",
            "gcc",
            "make",
        ] {
            assert!(all.contains(&p), "{p}");
        }
        let mut unique = all.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), all.len());
    }
}
