//! What the real node needs from the machine, checked before anything starts, and the host
//! commands it runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Error, Result};

/// Where the distribution's CNI plugins are installed.
pub(crate) const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// The CNI plugins the node's network uses.
const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "loopback", "portmap"];

/// The commands the node runs, with the Debian package that provides each.
const COMMANDS: [(&str, &str); 10] = [
    ("containerd", "containerd"),
    ("containerd-shim-runc-v2", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("ip", "iproute2"),
    ("iptables", "iptables"),
    ("iptables-restore", "iptables"),
    ("conntrack", "conntrack"),
    ("socat", "socat"),
    (super::registry::PROGRAM, "docker-registry"),
];

/// The Debian packages the real node needs (for `cargo xtask setup` and error messages).
pub const PACKAGES: [&str; 8] = [
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iproute2",
    "iptables",
    "conntrack",
    "socat",
    "docker-registry",
];

/// Fails with [`Error::NodePrerequisite`] naming every missing piece when this machine cannot
/// run the real node: not Linux, not root, no cgroups, or packages missing.
pub(crate) fn check_prerequisites() -> Result<()> {
    if !cfg!(target_os = "linux") {
        return Err(Error::NodePrerequisite {
            problem: "it needs Linux (containers, cgroups and network namespaces)".into(),
            fix: "run the cluster on a Linux machine".into(),
        });
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::NodePrerequisite {
            problem: "it must run as root (it creates a bridge, iptables rules, cgroups and \
                      mounts, and runs containerd)"
                .into(),
            fix: "run `cargo xtask cluster up` as root".into(),
        });
    }
    let cgroups = Path::new("/sys/fs/cgroup");
    let v2 = cgroups.join("cgroup.controllers").is_file();
    let v1 = ["cpu", "memory", "pids"]
        .iter()
        .all(|c| cgroups.join(c).is_dir());
    if !v1 && !v2 {
        return Err(Error::NodePrerequisite {
            problem: format!(
                "no cgroup hierarchies with the cpu, memory and pids controllers are mounted \
                 under {}",
                cgroups.display()
            ),
            fix: "mount cgroups (v1 controllers or the v2 unified hierarchy)".into(),
        });
    }
    match missing_pieces(&find_command, Path::new(CNI_BIN_DIR)) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// [`Error::NodePrerequisite`] naming every command (with its package) that `find` does not find
/// and every CNI plugin missing from `cni_dir`, with how to install them; `None` when nothing is
/// missing.
fn missing_pieces(find: &dyn Fn(&str) -> Option<PathBuf>, cni_dir: &Path) -> Option<Error> {
    let mut missing: Vec<String> = COMMANDS
        .iter()
        .filter(|(command, _)| find(command).is_none())
        .map(|(command, package)| format!("`{command}` (package {package})"))
        .collect();
    missing.extend(
        CNI_PLUGINS
            .iter()
            .filter(|plugin| !cni_dir.join(plugin).is_file())
            .map(|plugin| {
                format!(
                    "the CNI plugin {}/{plugin} (package containernetworking-plugins)",
                    cni_dir.display()
                )
            }),
    );
    if missing.is_empty() {
        return None;
    }
    Some(Error::NodePrerequisite {
        problem: format!("missing {}", missing.join(", ")),
        fix: "run `cargo xtask setup` (as root), or install Debian's packages yourself: \
              apt-get install "
            .to_owned()
            + &PACKAGES.join(" "),
    })
}

/// The full path of `command` on `PATH` (and the sbin directories, which a non-login root shell
/// may lack).
pub(crate) fn find_command(command: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(command))
        .find(|candidate| candidate.is_file())
}

/// Runs a host command to completion; a non-zero exit is [`Error::HostCommand`] with its
/// stderr. Returns its stdout.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String> {
    let binary = find_command(program).unwrap_or_else(|| PathBuf::from(program));
    let command_line = format!("{program} {}", args.join(" "));
    let out = Command::new(&binary)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::HostCommand {
            command: command_line.clone(),
            status: "could not run".into(),
            stderr: e.to_string(),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::HostCommand {
            command: command_line,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Reads a sysctl under `/proc/sys` (`net/ipv4/ip_forward`).
pub(crate) fn read_sysctl(name: &str) -> Result<String> {
    let path = Path::new("/proc/sys").join(name);
    std::fs::read_to_string(&path)
        .map(|v| v.trim().to_owned())
        .map_err(Error::io("reading", path))
}

/// Writes a sysctl under `/proc/sys`.
pub(crate) fn write_sysctl(name: &str, value: &str) -> Result<()> {
    let path = Path::new("/proc/sys").join(name);
    std::fs::write(&path, value).map_err(Error::io("writing", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_commands_on_the_path_and_runs_them() {
        assert!(find_command("sh").is_some());
        assert!(find_command("no-such-command-here").is_none());
        assert_eq!(run("sh", &["-c", "echo hi"]).expect("runs"), "hi\n");
        let err = run("sh", &["-c", "echo broken >&2; exit 3"]).expect_err("fails");
        let message = err.to_string();
        assert!(message.contains("sh -c"), "{message}");
        assert!(message.contains("broken"), "{message}");
    }

    #[test]
    fn missing_commands_and_plugins_are_named_with_their_packages_and_the_fix() {
        let cni = tempfile::tempdir().expect("temp dir");
        for plugin in ["bridge", "host-local", "loopback"] {
            std::fs::write(cni.path().join(plugin), b"").expect("writing a plugin");
        }
        let without_runc_and_socat = |command: &str| {
            (!matches!(command, "runc" | "socat")).then(|| PathBuf::from("/usr/bin").join(command))
        };
        let message = missing_pieces(&without_runc_and_socat, cni.path())
            .expect("pieces are missing")
            .to_string();
        for expected in [
            "the real node cannot run here: missing `runc` (package runc), `socat` (package socat)",
            "/portmap (package containernetworking-plugins)",
            "fix: run `cargo xtask setup` (as root)",
            "apt-get install containerd runc",
            "--without-real-node",
        ] {
            assert!(message.contains(expected), "{expected:?} in:\n{message}");
        }
        assert!(!message.contains("bridge"), "{message}");

        std::fs::write(cni.path().join("portmap"), b"").expect("writing a plugin");
        let everything = |command: &str| Some(PathBuf::from("/usr/bin").join(command));
        assert!(missing_pieces(&everything, cni.path()).is_none());
    }

    #[test]
    fn every_command_names_a_package_we_install() {
        for (_, package) in COMMANDS {
            assert!(PACKAGES.contains(&package), "{package}");
        }
    }
}
