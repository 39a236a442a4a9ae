//! What the benchmark reads: the manager's memory and CPU from `/proc`, and the number of
//! requests the API server dispatched for the manager's ServiceAccount.

use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use testkit::ServiceAccountKubeconfig;

/// The FlowSchema that gives the manager's requests a series of their own in
/// `apiserver_flowcontrol_dispatched_requests_total`. It routes to `workload-low`, the priority
/// level the built-in `service-accounts` schema would have chosen, so behaviour is unchanged.
const FLOW_SCHEMA: &str = "bench-operator-manager";
const DISPATCHED_METRIC: &str = "apiserver_flowcontrol_dispatched_requests_total";

/// Counts the manager's API requests with the API server's own metrics.
#[derive(Debug)]
pub struct RequestCounter;

impl RequestCounter {
    pub async fn install(
        client: &kube::Client,
        manager: &ServiceAccountKubeconfig,
    ) -> anyhow::Result<Self> {
        let schema = json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": FLOW_SCHEMA},
            "spec": {
                "matchingPrecedence": 500,
                "priorityLevelConfiguration": {"name": "workload-low"},
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [{
                    "subjects": [{
                        "kind": "ServiceAccount",
                        "serviceAccount": {"name": manager.service_account, "namespace": manager.namespace},
                    }],
                    "resourceRules": [{
                        "apiGroups": ["*"], "resources": ["*"], "verbs": ["*"],
                        "clusterScope": true, "namespaces": ["*"],
                    }],
                    "nonResourceRules": [{"nonResourceURLs": ["*"], "verbs": ["*"]}],
                }],
            },
        });
        Api::<FlowSchema>::all(client.clone())
            .patch(
                FLOW_SCHEMA,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(schema),
            )
            .await?;
        Ok(Self)
    }

    /// Requests dispatched for the manager so far (0 before its first request).
    pub async fn read(&self, client: &kube::Client) -> anyhow::Result<f64> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .context("building the request")?;
        let text = client
            .request_text(request)
            .await
            .context("reading the API server's /metrics")?;
        Ok(sum_series(
            &text,
            DISPATCHED_METRIC,
            &format!("flow_schema=\"{FLOW_SCHEMA}\""),
        ))
    }

    pub async fn remove(self, client: &kube::Client) -> anyhow::Result<()> {
        Api::<FlowSchema>::all(client.clone())
            .delete(FLOW_SCHEMA, &DeleteParams::default())
            .await
            .map(|_| ())
            .context("removing the benchmark FlowSchema")
    }
}

/// Sums the samples of `metric` whose labels contain `label` in Prometheus text format.
fn sum_series(text: &str, metric: &str, label: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.starts_with(metric)
                && line[metric.len()..].starts_with('{')
                && line.contains(label)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One reading of a process's resource use.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessSample {
    /// Resident memory now, in bytes.
    pub rss_bytes: u64,
    /// The highest resident memory since the process started, in bytes.
    pub peak_rss_bytes: u64,
    /// User plus system CPU time since the process started, in seconds.
    pub cpu_seconds: f64,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`.
pub fn sample(pid: u32) -> anyhow::Result<ProcessSample> {
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let status = std::fs::read_to_string(proc_dir.join("status"))
        .with_context(|| format!("reading /proc/{pid}/status (has the manager exited?)"))?;
    let stat = std::fs::read_to_string(proc_dir.join("stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let ticks = clock_ticks_per_second();
    Ok(ProcessSample {
        rss_bytes: status_kib(&status, "VmRSS:").unwrap_or(0) * 1024,
        peak_rss_bytes: status_kib(&status, "VmHWM:").unwrap_or(0) * 1024,
        cpu_seconds: cpu_ticks(&stat).map_or(0.0, |t| t as f64 / ticks),
    })
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        line.strip_prefix(key)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// utime + stime from `/proc/<pid>/stat`: fields 14 and 15, counted after the parenthesised
/// command name (which may itself contain spaces).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        #[allow(clippy::cast_precision_loss)]
        Ok(Some(ticks)) if ticks > 0 => ticks as f64,
        _ => 100.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_only_the_matching_series() {
        let text = "\
# HELP apiserver_flowcontrol_dispatched_requests_total x
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"bench-operator-manager\",priority_level=\"workload-low\"} 42
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"exempt\",priority_level=\"exempt\"} 1000
apiserver_flowcontrol_dispatched_requests_total_other{flow_schema=\"bench-operator-manager\"} 7
";
        assert_eq!(
            sum_series(
                text,
                DISPATCHED_METRIC,
                "flow_schema=\"bench-operator-manager\""
            ),
            42.0
        );
        assert_eq!(sum_series("", DISPATCHED_METRIC, "x"), 0.0);
    }

    #[test]
    fn parses_proc_files() {
        let status = "Name:\tmanager\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(10240));
        assert_eq!(status_kib(status, "VmHWM:"), Some(20480));
        let stat = "123 (a b) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0";
        assert_eq!(cpu_ticks(stat), Some(300));
    }

    #[test]
    fn samples_this_process() {
        let me = sample(std::process::id()).expect("own /proc entry");
        assert!(me.rss_bytes > 0 && me.peak_rss_bytes >= me.rss_bytes);
    }
}
