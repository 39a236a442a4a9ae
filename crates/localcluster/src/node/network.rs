//! The node's network on the host: its bridge, the routes that keep cluster addresses on this
//! machine, a firewall rule that keeps pod traffic from leaving it, and the sysctls routing
//! needs. Recorded in the cluster state before it is made, and undone by [`Network::remove`].

use serde::{Deserialize, Serialize};

use super::host::{read_sysctl, run, write_sysctl};
use super::{BRIDGE, NODE_IP, POD_CIDR};
use crate::Result;

/// The comment that marks our iptables rules.
const RULE_COMMENT: &str = "operator-manager local node";

/// IP forwarding: pods reach Services through DNAT on this host.
const IP_FORWARD: &str = "net/ipv4/ip_forward";
/// Bridged pod traffic must pass iptables for a Service whose endpoint is on the same bridge.
const BRIDGE_NF_CALL_IPTABLES: &str = "net/bridge/bridge-nf-call-iptables";

/// The host changes the node makes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Network {
    /// Ranges routed to the bridge, so traffic to them never takes the default route (the
    /// Service range: kube-proxy rewrites it to pod addresses).
    pub bridge_routes: Vec<String>,
    /// Ranges that only exist as names (the fake nodes' and fake pods' addresses): dropped
    /// here rather than sent out of the machine.
    pub blackhole_routes: Vec<String>,
    /// The sysctls set, with the value each had before (restored when it differed).
    pub sysctls: Vec<(String, String, String)>,
}

impl Network {
    /// The changes for a cluster whose Services use `service_cidr` and whose fake nodes and
    /// pods use `fake_cidrs`.
    pub(crate) fn plan(service_cidr: &str, fake_cidrs: &[&str]) -> Self {
        Self {
            bridge_routes: vec![service_cidr.to_owned()],
            blackhole_routes: fake_cidrs.iter().map(|c| (*c).to_owned()).collect(),
            sysctls: Vec::new(),
        }
    }

    /// Makes the changes. A bridge of ours left by a cluster that was not stopped is replaced.
    ///
    /// # Errors
    /// [`crate::Error::HostCommand`] when `ip` or `iptables` refuses, naming the command.
    pub(crate) fn create(&mut self) -> Result<()> {
        if run("ip", &["link", "show", BRIDGE]).is_ok() {
            run("ip", &["link", "delete", BRIDGE])?;
        }
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
        let prefix = POD_CIDR.split('/').nth(1).unwrap_or("16");
        run(
            "ip",
            &["addr", "add", &format!("{NODE_IP}/{prefix}"), "dev", BRIDGE],
        )?;
        run("ip", &["link", "set", BRIDGE, "up"])?;
        for cidr in &self.bridge_routes {
            run("ip", &["route", "replace", cidr, "dev", BRIDGE])?;
        }
        for cidr in &self.blackhole_routes {
            run("ip", &["route", "replace", "blackhole", cidr])?;
        }
        if !Self::firewall_rule_present() {
            run("iptables", &Self::firewall_rule("-I"))?;
        }
        for (name, value) in [(IP_FORWARD, "1"), (BRIDGE_NF_CALL_IPTABLES, "1")] {
            if read_sysctl(name).is_err() && name == BRIDGE_NF_CALL_IPTABLES {
                // The module that provides it may not be loaded yet.
                let _ = run("modprobe", &["br_netfilter"]);
            }
            let before = read_sysctl(name)?;
            if before != value {
                write_sysctl(name, value)?;
                self.sysctls
                    .push((name.to_owned(), before, value.to_owned()));
            }
        }
        Ok(())
    }

    /// Undoes every change that is still in place; returns what could not be undone.
    pub(crate) fn remove(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let mut attempt = |result: Result<String>| {
            if let Err(e) = result {
                failures.push(e.to_string());
            }
        };
        while Self::firewall_rule_present() {
            let result = run("iptables", &Self::firewall_rule("-D"));
            let failed = result.is_err();
            attempt(result);
            if failed {
                break;
            }
        }
        for cidr in &self.blackhole_routes {
            if blackhole_present(cidr) {
                attempt(run("ip", &["route", "delete", "blackhole", cidr]));
            }
        }
        if run("ip", &["link", "show", BRIDGE]).is_ok() {
            // Takes the bridge's routes with it.
            attempt(run("ip", &["link", "delete", BRIDGE]));
        }
        for (name, before, ours) in &self.sysctls {
            // Only when nobody changed it since.
            if read_sysctl(name).is_ok_and(|now| &now == ours)
                && let Err(e) = write_sysctl(name, before)
            {
                failures.push(e.to_string());
            }
        }
        failures
    }

    /// What of the changes is still in place.
    pub(crate) fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        if run("ip", &["link", "show", BRIDGE]).is_ok() {
            left.push(format!("the bridge {BRIDGE}"));
        }
        if Self::firewall_rule_present() {
            left.push(format!(
                "the iptables rule {:?}",
                Self::firewall_rule("-A").join(" ")
            ));
        }
        for cidr in &self.blackhole_routes {
            if blackhole_present(cidr) {
                left.push(format!("the route blackhole {cidr}"));
            }
        }
        left
    }

    /// `iptables <op> FORWARD ...`: pod traffic may go to the bridge (other pods, Services
    /// rewritten to pods) and to this host, but is not forwarded anywhere else.
    fn firewall_rule(op: &str) -> Vec<&str> {
        vec![
            op,
            "FORWARD",
            "-i",
            BRIDGE,
            "!",
            "-o",
            BRIDGE,
            "-m",
            "comment",
            "--comment",
            RULE_COMMENT,
            "-j",
            "DROP",
        ]
    }

    fn firewall_rule_present() -> bool {
        run("iptables", &Self::firewall_rule("-C")).is_ok()
    }
}

/// Whether the blackhole route for exactly `cidr` exists.
fn blackhole_present(cidr: &str) -> bool {
    run(
        "ip",
        &["route", "show", "type", "blackhole", "to", "exact", cidr],
    )
    .is_ok_and(|out| !out.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_routes_services_to_the_bridge_and_drops_fake_addresses() {
        let plan = Network::plan("10.96.0.0/16", &["10.244.0.0/16", "10.240.0.0/16"]);
        assert_eq!(plan.bridge_routes, ["10.96.0.0/16"]);
        assert_eq!(plan.blackhole_routes, ["10.244.0.0/16", "10.240.0.0/16"]);
        assert!(plan.sysctls.is_empty(), "nothing is changed by planning");
    }

    #[test]
    fn the_firewall_rule_only_drops_traffic_leaving_the_bridge() {
        let rule = Network::firewall_rule("-I").join(" ");
        assert_eq!(
            rule,
            format!(
                "-I FORWARD -i {BRIDGE} ! -o {BRIDGE} -m comment --comment {RULE_COMMENT} -j DROP"
            )
        );
    }
}
