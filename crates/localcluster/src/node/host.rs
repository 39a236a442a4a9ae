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
const COMMANDS: [(&str, &str); 9] = [
    ("containerd", "containerd"),
    ("containerd-shim-runc-v2", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("ip", "iproute2"),
    ("iptables", "iptables"),
    ("iptables-restore", "iptables"),
    ("conntrack", "conntrack"),
    ("socat", "socat"),
];

/// The Debian packages the real node needs (for `cargo xtask setup` and error messages).
pub const PACKAGES: [&str; 7] = [
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iproute2",
    "iptables",
    "conntrack",
    "socat",
];

/// Fails with [`Error::NodePrerequisite`] naming every missing piece when this machine cannot
/// run the real node: not Linux, not root, no cgroups, or packages missing.
pub(crate) fn check_prerequisites() -> Result<()> {
    let setup = "run `cargo xtask setup` (as root), or install Debian's packages yourself: \
                 apt-get install "
        .to_owned()
        + &PACKAGES.join(" ");
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
    let mut missing: Vec<String> = COMMANDS
        .iter()
        .filter(|(command, _)| find_command(command).is_none())
        .map(|(command, package)| format!("`{command}` (package {package})"))
        .collect();
    missing.extend(
        CNI_PLUGINS
            .iter()
            .filter(|plugin| !Path::new(CNI_BIN_DIR).join(plugin).is_file())
            .map(|plugin| {
                format!(
                    "the CNI plugin {CNI_BIN_DIR}/{plugin} (package containernetworking-plugins)"
                )
            }),
    );
    if !missing.is_empty() {
        return Err(Error::NodePrerequisite {
            problem: format!("missing {}", missing.join(", ")),
            fix: setup,
        });
    }
    Ok(())
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
    fn every_command_names_a_package_we_install() {
        for (_, package) in COMMANDS {
            assert!(PACKAGES.contains(&package), "{package}");
        }
    }
}
