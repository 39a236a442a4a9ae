//! Removing the iptables chains the kubelet and kube-proxy create (`KUBE-*`), for IPv4 and
//! IPv6, in one `iptables-restore` transaction per family.
//!
//! kube-proxy's `--cleanup` removes its own rules but not the kubelet's (`KUBE-FIREWALL`, the
//! `KUBE-KUBELET-CANARY` chains), and neither runs after a crash. Caveat: a machine that also
//! runs a real kube-proxy or kubelet in its own network namespace loses their chains too.

use std::io::Write as _;
use std::process::{Command, Stdio};

use super::host::find_command;

/// The prefix of every chain the kubelet and kube-proxy make.
const PREFIX: &str = "KUBE-";

/// `(save, restore)` commands per address family.
const FAMILIES: [(&str, &str); 2] = [
    ("iptables-save", "iptables-restore"),
    ("ip6tables-save", "ip6tables-restore"),
];

/// The `KUBE-*` chains still present, as `<command> <table> <chain>`.
pub(crate) fn kube_chains() -> Vec<String> {
    let mut found = Vec::new();
    for (save, _) in FAMILIES {
        let Some(rules) = saved(save) else { continue };
        let mut table = "";
        for line in rules.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name;
            } else if let Some(chain) = declared_chain(line) {
                found.push(format!("{save} {table} {chain}"));
            }
        }
    }
    found
}

/// Deletes every rule that jumps to a `KUBE-*` chain and every such chain; returns failures.
pub(crate) fn remove_kube_chains() -> Vec<String> {
    let mut failures = Vec::new();
    for (save, restore) in FAMILIES {
        let Some(rules) = saved(save) else { continue };
        let Some(script) = cleanup_script(&rules) else {
            continue;
        };
        if let Err(e) = restore_noflush(restore, &script) {
            failures.push(format!("removing the KUBE-* chains with {restore}: {e}"));
        }
    }
    failures
}

/// The output of `iptables-save` (all tables), `None` when the command is missing or fails.
fn saved(save: &str) -> Option<String> {
    let binary = find_command(save)?;
    let out = Command::new(binary)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The chain a `:NAME POLICY [counters]` line declares, if it is one of ours.
fn declared_chain(line: &str) -> Option<&str> {
    let name = line.strip_prefix(':')?.split_whitespace().next()?;
    name.starts_with(PREFIX).then_some(name)
}

/// An `iptables-restore --noflush` script that removes the `KUBE-*` chains from the tables of
/// `saved`: first the jumps to them from other chains, then their rules, then the chains.
/// `None` when there are none.
fn cleanup_script(saved: &str) -> Option<String> {
    let mut script = String::new();
    let mut table: Option<&str> = None;
    let (mut jumps, mut chains): (Vec<String>, Vec<&str>) = (Vec::new(), Vec::new());
    for line in saved.lines() {
        if let Some(name) = line.strip_prefix('*') {
            emit(&mut script, table, &mut jumps, &mut chains);
            table = Some(name);
        } else if let Some(chain) = declared_chain(line) {
            chains.push(chain);
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let in_our_chain = rule.starts_with(PREFIX);
            let jumps_to_ours = rule
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| (w[0] == "-j" || w[0] == "-g") && w[1].starts_with(PREFIX));
            if jumps_to_ours && !in_our_chain {
                jumps.push(format!("-D {rule}"));
            }
        }
    }
    emit(&mut script, table, &mut jumps, &mut chains);
    (!script.is_empty()).then_some(script)
}

/// Appends one table's section of the cleanup script, if it has chains of ours.
fn emit(script: &mut String, table: Option<&str>, jumps: &mut Vec<String>, chains: &mut Vec<&str>) {
    if let Some(name) = table
        && !chains.is_empty()
    {
        script.push_str(&format!("*{name}\n"));
        for jump in jumps.iter() {
            script.push_str(jump);
            script.push('\n');
        }
        for chain in chains.iter() {
            script.push_str(&format!("-F {chain}\n"));
        }
        for chain in chains.iter() {
            script.push_str(&format!("-X {chain}\n"));
        }
        script.push_str("COMMIT\n");
    }
    jumps.clear();
    chains.clear();
}

fn restore_noflush(restore: &str, script: &str) -> Result<(), String> {
    let binary = find_command(restore).ok_or_else(|| format!("`{restore}` is not installed"))?;
    let mut child = Command::new(binary)
        .arg("--noflush")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "\
# Generated by iptables-save
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:OTHER - [0:0]
-A INPUT -j KUBE-FIREWALL
-A FORWARD -i opmgr0 ! -o opmgr0 -m comment --comment \"operator-manager local node\" -j DROP
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -j DROP
-A OTHER -j ACCEPT
COMMIT
*raw
:PREROUTING ACCEPT [0:0]
COMMIT
";

    #[test]
    fn the_script_removes_jumps_then_rules_then_chains_and_nothing_else() {
        let script = cleanup_script(SAVED).expect("a script");
        assert_eq!(
            script,
            "*mangle\n-F KUBE-KUBELET-CANARY\n-X KUBE-KUBELET-CANARY\nCOMMIT\n\
             *filter\n-D INPUT -j KUBE-FIREWALL\n-F KUBE-FIREWALL\n-X KUBE-FIREWALL\nCOMMIT\n"
        );
    }

    #[test]
    fn nothing_to_remove_gives_no_script() {
        assert_eq!(
            cleanup_script("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n"),
            None
        );
    }

    #[test]
    fn only_our_chains_are_declared_ours() {
        assert_eq!(
            declared_chain(":KUBE-SERVICES - [0:0]"),
            Some("KUBE-SERVICES")
        );
        assert_eq!(declared_chain(":INPUT ACCEPT [0:0]"), None);
        assert_eq!(declared_chain("-A KUBE-SERVICES -j X"), None);
    }
}
