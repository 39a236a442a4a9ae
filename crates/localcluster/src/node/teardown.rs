//! Removing the real node, whatever state it is in: running, half started, or crashed with
//! containers still running and nobody left to stop them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::kubelet::{KubeProxy, cgroup_hierarchies};
use super::{CGROUP_ROOT, NodeState};
use crate::process;
use crate::state::Component;

/// How long the node's processes get after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The node's processes, stopped first: the kubelet would otherwise restart containers.
pub(crate) const NODE_COMPONENTS: [&str; 4] =
    ["apiserver-forwarder", "kube-proxy", "kubelet", "containerd"];

/// Removes the node: its processes, every container and shim, mounts, cgroups, kube-proxy's
/// rules and the network changes. Returns one line per thing that could not be removed.
pub(crate) fn teardown(
    node: &NodeState,
    components: &[Component],
    kube_proxy: &Path,
    say: &dyn Fn(&str),
) -> Vec<String> {
    let mut failures = Vec::new();
    for name in NODE_COMPONENTS {
        for c in components.iter().filter(|c| c.name == name) {
            if process::stop(c.pid, &c.binary, STOP_GRACE) {
                say(&format!("killed {} (pid {})", c.name, c.pid));
            }
        }
    }

    let killed = kill_until_gone(Duration::from_secs(10), || {
        let mut pids = cgroup_processes();
        pids.extend(shims_of(&node.containerd_socket));
        pids
    });
    if killed > 0 {
        say(&format!(
            "killed {killed} container and shim processes of the real node"
        ));
    }

    if kube_proxy.is_file() {
        let args = KubeProxy::cleanup_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let binary = kube_proxy.to_string_lossy();
        if let Err(e) = super::host::run(&binary, &args) {
            failures.push(format!("removing kube-proxy's iptables rules: {e}"));
        }
    }
    // The kubelet's chains, and kube-proxy's after a crash.
    failures.extend(super::iptables::remove_kube_chains());

    for mount in mounts_under(&node.dir) {
        if let Err(e) = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH) {
            failures.push(format!("unmounting {}: {e}", mount.display()));
        }
    }

    for hierarchy in cgroup_hierarchies() {
        let root = hierarchy.join(CGROUP_ROOT);
        if root.is_dir()
            && let Err(e) = remove_cgroup_tree(&root)
        {
            failures.push(e);
        }
    }

    failures.extend(node.network.remove());
    failures
}

/// What of the node is still on the machine after [`teardown`]: one line per leftover.
pub(crate) fn leftovers(node: &NodeState) -> Vec<String> {
    let mut left = Vec::new();
    let processes = cgroup_processes();
    if !processes.is_empty() {
        left.push(format!("container processes {processes:?}"));
    }
    let shims = shims_of(&node.containerd_socket);
    if !shims.is_empty() {
        left.push(format!("containerd shims {shims:?}"));
    }
    for mount in mounts_under(&node.dir) {
        left.push(format!("the mount {}", mount.display()));
    }
    for hierarchy in cgroup_hierarchies() {
        let cgroup = hierarchy.join(CGROUP_ROOT);
        if cgroup.exists() {
            left.push(format!("the cgroup {}", cgroup.display()));
        }
    }
    for chain in super::iptables::kube_chains() {
        left.push(format!("the iptables chain {chain}"));
    }
    left.extend(node.network.leftovers());
    left
}

/// Every process in the node's cgroups (the containers, in any hierarchy).
fn cgroup_processes() -> BTreeSet<i32> {
    let mut pids = BTreeSet::new();
    for hierarchy in cgroup_hierarchies() {
        let mut stack = vec![hierarchy.join(CGROUP_ROOT)];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            stack.extend(
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    pids
}

/// The containerd shims serving the node's containerd (they outlive it by design).
fn shims_of(socket: &Path) -> BTreeSet<i32> {
    let socket = socket.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let mut args = cmdline.split(|b| *b == 0);
                let is_shim = args
                    .next()
                    .is_some_and(|argv0| argv0.ends_with(b"containerd-shim-runc-v2"));
                is_shim && args.any(|arg| arg == socket)
            })
        })
        .collect()
}

/// SIGKILLs whatever `find` returns until it returns nothing or `timeout` passes; returns how
/// many distinct processes were signalled.
fn kill_until_gone(timeout: Duration, find: impl Fn() -> BTreeSet<i32>) -> usize {
    let mut signalled = BTreeSet::new();
    let deadline = Instant::now() + timeout;
    loop {
        let pids = find();
        if pids.is_empty() || Instant::now() > deadline {
            return signalled.len();
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            signalled.insert(pid);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The mount points at or below `dir`, deepest first.
pub(crate) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mount_path(field)))
        .filter(|mount| mount.starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    mounts.dedup();
    mounts
}

/// mountinfo writes space, tab, newline and backslash as three-digit octal escapes.
fn unescape_mount_path(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Removes a cgroup and its children, deepest first (a cgroup directory is removed with
/// `rmdir`; its control files go with it).
fn remove_cgroup_tree(root: &Path) -> Result<(), String> {
    let mut dirs = vec![root.to_owned()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(entries) = std::fs::read_dir(&dirs[i]) {
            dirs.extend(
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        i += 1;
    }
    for dir in dirs.iter().rev() {
        // A cgroup whose last process just died can stay busy for a moment.
        let mut attempts = 0;
        loop {
            match std::fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(_) if attempts < 20 => {
                    attempts += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(format!("removing the cgroup {}: {e}", dir.display())),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b/c"), "/a b/c");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path("/odd\\x"), "/odd\\x");
    }

    #[test]
    fn mounts_are_found_below_a_directory_only() {
        assert!(mounts_under(Path::new("/no/such/dir")).is_empty());
        let root = mounts_under(Path::new("/"));
        assert!(root.iter().any(|m| m == Path::new("/")), "{root:?}");
        assert_eq!(root.last().map(PathBuf::as_path), Some(Path::new("/")));
    }

    #[test]
    fn nothing_to_kill_returns_at_once() {
        let started = Instant::now();
        assert_eq!(kill_until_gone(Duration::from_secs(5), BTreeSet::new), 0);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
