//! Starting the control plane's processes so they outlive the command that started them, and
//! stopping them again.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::{Error, Result};

/// Starts `binary` in its own process group (so Ctrl-C in the starting terminal does not reach
/// it), with stdin closed and stdout/stderr appended to `log`. Returns its pid.
///
/// The child is reaped by a background thread while this process lives; after that it is
/// re-parented and keeps running.
pub(crate) fn spawn_detached(
    component: &str,
    binary: &Path,
    args: &[String],
    log: &Path,
    cwd: &Path,
) -> Result<u32> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(Error::io("opening", log))?;
    let err = out.try_clone().map_err(Error::io("opening", log))?;
    let mut child = Command::new(binary)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            component: component.to_owned(),
            binary: binary.to_owned(),
            source,
        })?;
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(pid)
}

/// Whether `pid` is a live (not zombie) process running `binary`; guards against the pid having
/// been reused by an unrelated process after ours died.
pub(crate) fn is_alive(pid: u32, binary: &Path) -> bool {
    let proc = Path::new("/proc").join(pid.to_string());
    let Ok(stat) = std::fs::read_to_string(proc.join("stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself contain spaces.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    if matches!(state, Some("Z" | "X") | None) {
        return false;
    }
    match std::fs::read(proc.join("cmdline")) {
        // Empty for a moment right after exec (the kernel releases the spawning parent before
        // it has set up the new program's arguments): that is our process, starting.
        Ok(cmdline) if cmdline.is_empty() => true,
        Ok(cmdline) => {
            let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
            argv0 == binary.as_os_str().as_encoded_bytes()
        }
        Err(_) => false,
    }
}

/// Stops the process group of `pid`: SIGTERM, then SIGKILL if it has not exited after
/// `grace`. Returns whether it had to be killed.
pub(crate) fn stop(pid: u32, binary: &Path, grace: Duration) -> bool {
    if !is_alive(pid, binary) {
        return false;
    }
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    let target = Pid::from_raw(raw);
    // The process leads its own group; signal the group (children included) and, should it not
    // lead one, the process itself.
    let signal = |sig| {
        let _ = killpg(target, sig);
        let _ = kill(target, sig);
    };
    signal(Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !is_alive(pid, binary) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && is_alive(pid, binary) {
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// The last `lines` lines of a log file, for error messages.
pub(crate) fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A free TCP port on 127.0.0.1 for a component to listen on.
///
/// Ports come from below the kernel's ephemeral range (`ip_local_port_range`): a port the
/// kernel handed out for `bind(0)` and that was released again can be taken as the source port
/// of an outgoing connection (the API server opens many to etcd) before the component binds
/// it. Ports handed out earlier in this process are never handed out again.
pub(crate) fn free_port() -> Result<u16> {
    use std::sync::Mutex;
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());

    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    let (low, high) = (10_000_u16, ephemeral_start.max(12_000) - 1);
    let span = u32::from(high - low) + 1;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default()
        ^ std::process::id().wrapping_mul(2_654_435_761);
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for i in 0..span {
        let offset = (seed.wrapping_add(i.wrapping_mul(7919))) % span;
        let Ok(port) = u16::try_from(u32::from(low) + offset) else {
            continue;
        };
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return Ok(port);
        }
    }
    Err(Error::NoFreePort(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("every port from {low} to {high} is taken"),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_checks_and_stops_a_process() {
        let dir = std::env::temp_dir().join(format!("localcluster-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let log = dir.join("sleep.log");
        let sleep = Path::new("/bin/sleep");
        let pid = spawn_detached("sleep", sleep, &["30".into()], &log, &dir).expect("spawn");
        assert!(is_alive(pid, sleep));
        // Until exec has set the new program's arguments, any binary counts as ours (see
        // `is_alive`); on a loaded machine that takes a moment.
        let cmdline = Path::new("/proc").join(pid.to_string()).join("cmdline");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read(&cmdline).is_ok_and(|c| c.is_empty()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!is_alive(pid, Path::new("/bin/other")));
        assert!(
            !stop(pid, sleep, Duration::from_secs(5)),
            "SIGTERM should suffice"
        );
        assert!(!is_alive(pid, sleep));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn free_ports_are_distinct_and_outside_the_ephemeral_range() {
        let ports: Vec<u16> = (0..20).map(|_| free_port().expect("port")).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        assert!(ports.iter().all(|p| *p >= 10_000), "{ports:?}");
    }

    #[test]
    fn tails_logs() {
        let dir = std::env::temp_dir().join(format!("localcluster-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let log = dir.join("x.log");
        std::fs::write(&log, "a\nb\nc\n").expect("write");
        assert_eq!(tail(&log, 2), "b\nc");
        assert_eq!(tail(&dir.join("missing"), 2), "");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
