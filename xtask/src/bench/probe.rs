//! What the benchmark reads: the manager's memory and CPU from `/proc`, the number of
//! requests the API server dispatched for the manager's ServiceAccount, the whole cluster's watch
//! traffic (changes, and the events sent for them to all the API server's clients), and the
//! reconciles the manager counted on its own `/metrics`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::json;
use testkit::ServiceAccountKubeconfig;

/// The FlowSchemas that give the manager's requests series of their own in
/// `apiserver_flowcontrol_dispatched_requests_total`: one per (resource, verb) of
/// [`COUNTED_RESOURCES`] and [`COUNTED_VERBS`], and a catch-all for the rest. They route to
/// `workload-low`, the priority level the built-in `service-accounts` schema would have chosen,
/// so behaviour is unchanged.
const FLOW_SCHEMA: &str = concat!("bench-", product::name!());
const DISPATCHED_METRIC: &str = "apiserver_flowcontrol_dispatched_requests_total";
/// Watch events the API server sent, to every client, by group, version and resource.
const WATCH_EVENTS_METRIC: &str = "apiserver_watch_events_total";
/// Their sizes in bytes: the sum of the histogram, by the same labels.
const WATCH_BYTES_METRIC: &str = "apiserver_watch_events_sizes_sum";
/// Changes the API server's watch cache received from etcd, by resource: each change of an
/// object once, however many clients watch it.
const CHANGES_METRIC: &str = "apiserver_watch_cache_events_received_total";
/// Events a new watch was sent for the objects that existed when it started (a client's
/// re-list as a watch), by resource: part of [`WATCH_EVENTS_METRIC`] that is no change.
const INITIAL_EVENTS_METRIC: &str = "apiserver_init_events_total";
/// Watches the API server closed because their client fell behind (the buffer it keeps for
/// each watch stayed full past its short wait), by resource. Such a client watches again, and
/// what it missed is replayed to it: part of [`INITIAL_EVENTS_METRIC`].
const CLOSED_WATCHES_METRIC: &str = "apiserver_terminated_watchers_total";
/// Precedence of the per-(resource, verb) schemas: before the catch-all (lower wins).
const SPECIFIC_PRECEDENCE: u32 = 499;
const CATCH_ALL_PRECEDENCE: u32 = 500;

/// The resources whose requests are counted one by one (everything else is `other`).
const COUNTED_RESOURCES: [&str; 8] = [
    "memcacheds",
    "memcacheds/status",
    "deployments",
    "services",
    "poddisruptionbudgets",
    "pods",
    "events",
    "leases",
];
const COUNTED_VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];
/// The key of requests outside [`COUNTED_RESOURCES`] × [`COUNTED_VERBS`].
pub const OTHER: &str = "other";

/// Counts by key: requests the API server dispatched for the manager by `resource verb` (or
/// [`OTHER`]), or one of its watch counters by resource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts(pub BTreeMap<String, f64>);

impl Counts {
    pub fn total(&self) -> f64 {
        // Not `sum()`: a float sum of nothing is -0.0, which prints as "-0.0".
        self.0.values().fold(0.0, |total, count| total + count)
    }

    /// What was counted since `earlier`, leaving out what did not change.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(key, now)| {
                    (
                        key.clone(),
                        now - earlier.0.get(key).copied().unwrap_or(0.0),
                    )
                })
                .filter(|(_, delta)| *delta > 0.0)
                .collect(),
        )
    }

    /// These counts and `other`'s, added key by key.
    #[must_use]
    pub fn plus(&self, other: &Self) -> Self {
        let mut sum = self.clone();
        for (key, count) in &other.0 {
            *sum.0.entry(key.clone()).or_default() += count;
        }
        sum
    }

    /// Every count divided by `objects`.
    #[must_use]
    pub fn per(&self, objects: f64) -> Self {
        Self(
            self.0
                .iter()
                .map(|(key, count)| (key.clone(), count / objects.max(1.0)))
                .collect(),
        )
    }

    /// `deployments patch 1.00, events create 1.00, ...`, largest first.
    pub fn describe(&self) -> String {
        self.describe_to(2)
    }

    /// The same with `decimals` places (0 for counts that are whole numbers).
    pub fn describe_to(&self, decimals: usize) -> String {
        let mut entries: Vec<(&String, &f64)> = self.0.iter().collect();
        entries.sort_by(|a, b| b.1.total_cmp(a.1).then_with(|| a.0.cmp(b.0)));
        entries
            .iter()
            .map(|(key, count)| format!("{key} {count:.decimals$}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The name of the schema counting `verb` on `resource` (`memcacheds/status` becomes
/// `memcacheds-status`).
fn schema_name(resource: &str, verb: &str) -> String {
    format!("{FLOW_SCHEMA}.{}.{verb}", resource.replace('/', "-"))
}

/// The `resource verb` key of a schema name, [`OTHER`] for the catch-all, `None` for a schema
/// that is not ours.
fn key_of(schema: &str) -> Option<String> {
    if schema == FLOW_SCHEMA {
        return Some(OTHER.to_owned());
    }
    let rest = schema.strip_prefix(FLOW_SCHEMA)?.strip_prefix('.')?;
    let (resource, verb) = rest.rsplit_once('.')?;
    COUNTED_RESOURCES
        .iter()
        .find(|r| r.replace('/', "-") == resource)
        .map(|r| format!("{r} {verb}"))
}

/// Counts the manager's API requests, and the whole cluster's watch traffic, with the API
/// server's own metrics.
#[derive(Debug)]
pub struct RequestCounter;

impl RequestCounter {
    pub async fn install(
        client: &kube::Client,
        manager: &ServiceAccountKubeconfig,
    ) -> anyhow::Result<Self> {
        let subjects = json!([{
            "kind": "ServiceAccount",
            "serviceAccount": {"name": manager.service_account, "namespace": manager.namespace},
        }]);
        let schema = |name: &str, precedence: u32, rules: serde_json::Value| {
            json!({
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": name},
                "spec": {
                    "matchingPrecedence": precedence,
                    "priorityLevelConfiguration": {"name": "workload-low"},
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": [rules],
                },
            })
        };
        let mut schemas = vec![(
            FLOW_SCHEMA.to_owned(),
            schema(
                FLOW_SCHEMA,
                CATCH_ALL_PRECEDENCE,
                json!({
                    "subjects": subjects,
                    "resourceRules": [{
                        "apiGroups": ["*"], "resources": ["*"], "verbs": ["*"],
                        "clusterScope": true, "namespaces": ["*"],
                    }],
                    "nonResourceRules": [{"nonResourceURLs": ["*"], "verbs": ["*"]}],
                }),
            ),
        )];
        for resource in COUNTED_RESOURCES {
            for verb in COUNTED_VERBS {
                let name = schema_name(resource, verb);
                let body = schema(
                    &name,
                    SPECIFIC_PRECEDENCE,
                    json!({
                        "subjects": subjects,
                        "resourceRules": [{
                            "apiGroups": ["*"], "resources": [resource], "verbs": [verb],
                            "clusterScope": true, "namespaces": ["*"],
                        }],
                    }),
                );
                schemas.push((name, body));
            }
        }
        let api = Api::<FlowSchema>::all(client.clone());
        for (name, body) in schemas {
            api.patch(
                &name,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(body),
            )
            .await
            .with_context(|| format!("installing FlowSchema {name}"))?;
        }
        Ok(Self)
    }

    /// Requests dispatched for the manager so far, and the cluster's watch traffic.
    pub async fn read(&self, client: &kube::Client) -> anyhow::Result<ApiServerReading> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .context("building the request")?;
        let text = client
            .request_text(request)
            .await
            .context("reading the API server's /metrics")?;
        Ok(ApiServerReading {
            requests: counts_by_schema(&text),
            watch_events: sums_by_resource(&text, WATCH_EVENTS_METRIC),
            watch_bytes: sums_by_resource(&text, WATCH_BYTES_METRIC),
            changes: sums_by_resource(&text, CHANGES_METRIC),
            initial_events: sums_by_resource(&text, INITIAL_EVENTS_METRIC),
            closed_watches: sums_by_resource(&text, CLOSED_WATCHES_METRIC),
        })
    }

    pub async fn remove(self, client: &kube::Client) -> anyhow::Result<()> {
        let api = Api::<FlowSchema>::all(client.clone());
        let names = std::iter::once(FLOW_SCHEMA.to_owned()).chain(
            COUNTED_RESOURCES
                .iter()
                .flat_map(|r| COUNTED_VERBS.iter().map(move |v| schema_name(r, v))),
        );
        for name in names {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.is_not_found() => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("removing FlowSchema {name}"));
                }
            }
        }
        Ok(())
    }
}

/// One reading of the API server's own counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApiServerReading {
    /// Requests dispatched for the manager, by `resource verb`.
    pub requests: Counts,
    /// Watch events sent to every client (the cluster's controllers, the bench's own watches
    /// and the manager's), by resource: how much the cluster had to say, not what the manager
    /// received.
    pub watch_events: Counts,
    /// The bytes of those events, by resource.
    pub watch_bytes: Counts,
    /// Changes of objects, each once, by resource.
    pub changes: Counts,
    /// Of the watch events, those that started a new watch with the objects it found, by
    /// resource.
    pub initial_events: Counts,
    /// Watches closed on a client that fell behind, by resource.
    pub closed_watches: Counts,
}

impl ApiServerReading {
    /// What was counted since `earlier`.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            requests: self.requests.since(&earlier.requests),
            watch_events: self.watch_events.since(&earlier.watch_events),
            watch_bytes: self.watch_bytes.since(&earlier.watch_bytes),
            changes: self.changes.since(&earlier.changes),
            initial_events: self.initial_events.since(&earlier.initial_events),
            closed_watches: self.closed_watches.since(&earlier.closed_watches),
        }
    }
}

/// Sums the samples of `metric` per `resource` label, in Prometheus text format.
fn sums_by_resource(text: &str, metric: &str) -> Counts {
    sums_by(text, metric, |labels| {
        label(labels, "resource").map(str::to_owned)
    })
}

/// Sums the samples of `metric` per key that `key_of_labels` finds in their labels (what
/// follows the `{`), leaving out the samples it finds none in.
fn sums_by(text: &str, metric: &str, key_of_labels: impl Fn(&str) -> Option<String>) -> Counts {
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let Some(labels) = line
            .strip_prefix(metric)
            .and_then(|rest| rest.strip_prefix('{'))
        else {
            continue;
        };
        let (Some(key), Some(value)) = (key_of_labels(labels), sample_value(line)) else {
            continue;
        };
        *counts.entry(key).or_insert(0.0) += value;
    }
    Counts(counts)
}

/// The value of label `name` among a sample's `labels` (what follows its `{`).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let labels = labels.split_once('}').map_or(labels, |(inside, _)| inside);
    labels
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| key.trim() == name)
        .map(|(_, value)| value.trim_matches('"'))
}

/// The value of a sample line: its last field.
fn sample_value(line: &str) -> Option<f64> {
    line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())
}

/// Sums the samples of [`DISPATCHED_METRIC`] per schema of ours, in Prometheus text format.
fn counts_by_schema(text: &str) -> Counts {
    sums_by(text, DISPATCHED_METRIC, |labels| {
        label(labels, "flow_schema").and_then(key_of)
    })
}

/// One reading of a process's resource use.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessSample {
    /// Resident memory now, in bytes.
    pub rss_bytes: u64,
    /// The highest resident memory since the process started, in bytes.
    pub peak_rss_bytes: u64,
    /// Of the resident memory now, the anonymous pages: heap, stacks, runtime.
    pub anon_rss_bytes: u64,
    /// Of the resident memory now, pages of files: the binary's code and its libraries.
    pub file_rss_bytes: u64,
}

/// Reads `/proc/<pid>/status`.
pub fn sample(pid: u32) -> anyhow::Result<ProcessSample> {
    let path = Path::new("/proc").join(pid.to_string()).join("status");
    let status = std::fs::read_to_string(path)
        .with_context(|| format!("reading /proc/{pid}/status (has the manager exited?)"))?;
    Ok(ProcessSample {
        rss_bytes: status_kib(&status, "VmRSS:").unwrap_or(0) * 1024,
        peak_rss_bytes: status_kib(&status, "VmHWM:").unwrap_or(0) * 1024,
        anon_rss_bytes: status_kib(&status, "RssAnon:").unwrap_or(0) * 1024,
        file_rss_bytes: status_kib(&status, "RssFile:").unwrap_or(0) * 1024,
    })
}

/// A reading of a process's CPU time, precise enough to compare phases of a few seconds.
///
/// `/proc/<pid>/stat` counts the whole process, threads that exited included, but in clock
/// ticks (10 ms) with user and system time each rounded down: a 100-object phase uses 10 to 20
/// ticks, so the rounding alone moved it by a tenth. Each thread's `schedstat` counts its run
/// time in nanoseconds, but only while the thread lives. So [`CpuClock::seconds_since`] sums
/// the threads' nanoseconds, and takes the ticks instead when they show more than their
/// rounding could: time of threads that exited between the two readings.
///
/// The same `schedstat` line also counts how long each thread was runnable but waited for a
/// CPU ([`CpuClock::wait_seconds_since`]): the contention the manager met. On a machine busy
/// with other work the same reconciles cost more CPU time, so
/// this tells a count whose machine was saturated from one whose manager did more.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuClock {
    /// Each live thread's run time in nanoseconds, by thread id.
    threads_ns: BTreeMap<u32, u64>,
    /// Each live thread's time waiting for a CPU while runnable, in nanoseconds, by thread id.
    threads_wait_ns: BTreeMap<u32, u64>,
    /// User plus system time of the whole process, in clock ticks.
    ticks: u64,
    ticks_per_second: f64,
}

impl CpuClock {
    /// Reads `/proc/<pid>/stat` and each `/proc/<pid>/task/<tid>/schedstat`.
    pub fn read(pid: u32) -> anyhow::Result<Self> {
        let proc_dir = Path::new("/proc").join(pid.to_string());
        let stat = std::fs::read_to_string(proc_dir.join("stat"))
            .with_context(|| format!("reading /proc/{pid}/stat (has the manager exited?)"))?;
        let ticks = cpu_ticks(&stat)
            .with_context(|| format!("no utime and stime in /proc/{pid}/stat: {stat:?}"))?;
        let tasks = std::fs::read_dir(proc_dir.join("task"))
            .with_context(|| format!("listing /proc/{pid}/task"))?;
        let (mut threads_ns, mut threads_wait_ns) = (BTreeMap::new(), BTreeMap::new());
        for task in tasks {
            let task = task.with_context(|| format!("listing /proc/{pid}/task"))?;
            let Some(tid) = task.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            // A thread that exits between the listing and the read has nothing left to count.
            let Ok(schedstat) = std::fs::read_to_string(task.path().join("schedstat")) else {
                continue;
            };
            let (run_ns, wait_ns) = run_and_wait_ns(&schedstat).with_context(|| {
                format!("no run and wait times in /proc/{pid}/task/{tid}/schedstat: {schedstat:?}")
            })?;
            threads_ns.insert(tid, run_ns);
            threads_wait_ns.insert(tid, wait_ns);
        }
        Ok(Self {
            threads_ns,
            threads_wait_ns,
            ticks,
            ticks_per_second: clock_ticks_per_second(),
        })
    }

    /// The CPU time used between `earlier` and this reading, in seconds.
    #[allow(clippy::cast_precision_loss)]
    pub fn seconds_since(&self, earlier: &Self) -> f64 {
        let threads = threads_seconds_since(&self.threads_ns, &earlier.threads_ns);
        let ticks = self.ticks.saturating_sub(earlier.ticks) as f64 / self.ticks_per_second;
        // Each reading rounds user and system time down: up to two ticks between two readings.
        let rounding = 2.0 / self.ticks_per_second;
        if ticks - threads > rounding {
            ticks
        } else {
            threads
        }
    }

    /// How long the manager's threads waited for a CPU while runnable between `earlier` and
    /// this reading, in seconds. A thread that exited between the two readings took its wait
    /// with it (the process has no total of these), so this is a lower bound.
    pub fn wait_seconds_since(&self, earlier: &Self) -> f64 {
        threads_seconds_since(&self.threads_wait_ns, &earlier.threads_wait_ns)
    }
}

/// The nanoseconds counted by the threads of `now` since `earlier`, summed, in seconds.
#[allow(clippy::cast_precision_loss)]
fn threads_seconds_since(now: &BTreeMap<u32, u64>, earlier: &BTreeMap<u32, u64>) -> f64 {
    let ns: u64 = now
        .iter()
        .map(|(tid, &ns)| match earlier.get(tid) {
            Some(&before) if before <= ns => ns - before,
            // New since `earlier`, or a new thread with an exited one's id.
            _ => ns,
        })
        .sum();
    ns as f64 / 1e9
}

/// The first two fields of a thread's `schedstat`: its time on a CPU and its time waiting for
/// one while runnable, in nanoseconds.
fn run_and_wait_ns(schedstat: &str) -> Option<(u64, u64)> {
    let mut fields = schedstat.split_whitespace().map(str::parse::<u64>);
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

/// CPU clocks of the local cluster's own processes (the API server, etcd, the controller
/// manager, the scheduler, kwok): what a phase cost the cluster, beside what it cost the
/// manager. Each manager's writes cost the API server and etcd differently (an apply is not an
/// update), and on two cores that CPU is taken from the cluster's rollouts.
#[derive(Clone, Debug)]
pub struct ControlPlaneClock(BTreeMap<String, (u32, CpuClock)>);

impl ControlPlaneClock {
    /// Reads each process of the running local cluster.
    pub fn read() -> anyhow::Result<Self> {
        let state = localcluster::LocalCluster::from_env()
            .and_then(|local| local.running())
            .context("finding the running local cluster")?;
        let mut clocks = BTreeMap::new();
        for component in &state.components {
            let clock = CpuClock::read(component.pid)
                .with_context(|| format!("reading the CPU time of {}", component.name))?;
            clocks.insert(component.name.clone(), (component.pid, clock));
        }
        Ok(Self(clocks))
    }

    /// CPU seconds by process since `earlier`; one restarted in between is left out.
    pub fn seconds_since(&self, earlier: &Self) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .filter_map(|(name, (pid, now))| {
                let (earlier_pid, before) = earlier.0.get(name)?;
                (earlier_pid == pid).then(|| (name.clone(), now.seconds_since(before)))
            })
            .collect()
    }
}

/// A reading of the whole machine's CPU time from `/proc/stat`: how busy all its CPUs were
/// between two readings, whoever kept them busy (the cluster, the bench, the manager).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineClock {
    /// Clock ticks spent on any work: user, nice, system, interrupts and stolen time.
    busy: u64,
    /// Those plus the idle ticks and the ticks idle while waiting for I/O.
    total: u64,
}

impl MachineClock {
    /// Reads the first line of `/proc/stat` (all CPUs together).
    pub fn read() -> anyhow::Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let line = stat.lines().next().unwrap_or_default();
        Self::parse(line).with_context(|| format!("no CPU times in /proc/stat: {line:?}"))
    }

    /// `cpu  user nice system idle iowait irq softirq steal guest guest_nice`; the guest times
    /// are within user and nice already.
    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks[..] else {
            return None;
        };
        let busy = user + nice + system + irq + softirq + steal;
        Some(Self {
            busy,
            total: busy + idle + iowait,
        })
    }

    /// The share of the machine's CPU time that was busy between `earlier` and this reading,
    /// from 0 to 1 (0 when no tick passed).
    #[allow(clippy::cast_precision_loss)]
    pub fn busy_share_since(&self, earlier: &Self) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        self.busy.saturating_sub(earlier.busy) as f64 / total as f64
    }
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

/// The metric both managers count every finished reconcile in (controller-runtime's name).
const RECONCILES_METRIC: &str = "controller_runtime_reconcile_total";

/// The histogram both managers time every reconcile in (controller-runtime's name): its sum
/// and count give the mean time a reconcile held a worker.
const RECONCILE_TIME_METRIC: &str = "controller_runtime_reconcile_time_seconds";

/// The metric ours counts the watch events that asked for a reconcile in, by `source` (the
/// kind of object that changed). The reference has no such metric.
const TRIGGERS_METRIC: &str = "operator_manager_reconcile_triggers_total";

/// The metric ours counts the reconciles it held back for its cache to show its own last
/// write in, by `outcome` (`caught_up`, or `behind` when it started without). The reference
/// has no such metric.
const CACHE_WAITS_METRIC: &str = "operator_manager_reconcile_cache_waits_total";

/// What a manager counted on its own `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct ManagerCounts {
    /// Every reconcile finished, of every controller and result.
    pub reconciles: f64,
    /// The seconds every timed reconcile took, together, and how many were timed.
    pub reconcile_time: (f64, f64),
    /// The watch events that asked for a reconcile, by the kind of object that changed (empty
    /// for a manager that does not count them).
    pub triggers: Counts,
    /// The reconciles held back for the cache to show the manager's own last write, by
    /// outcome (empty for a manager that does not count them).
    pub cache_waits: Counts,
}

impl ManagerCounts {
    /// What this manager and `other` counted together: the replicas of a sharded one.
    #[must_use]
    pub fn plus(&self, other: &Self) -> Self {
        Self {
            reconciles: self.reconciles + other.reconciles,
            reconcile_time: (
                self.reconcile_time.0 + other.reconcile_time.0,
                self.reconcile_time.1 + other.reconcile_time.1,
            ),
            triggers: self.triggers.plus(&other.triggers),
            cache_waits: self.cache_waits.plus(&other.cache_waits),
        }
    }
}

/// What the manager serving plain-HTTP metrics on `127.0.0.1:port` has counted so far.
pub async fn manager_counts(port: u16) -> anyhow::Result<ManagerCounts> {
    Ok(counts_of(&metrics_text(port).await?))
}

/// The sum of every sample of `name` that the manager serving plain-HTTP metrics on
/// `127.0.0.1:port` exports now.
pub async fn manager_metric(port: u16, name: &str) -> anyhow::Result<f64> {
    Ok(sum_of(&metrics_text(port).await?, name))
}

/// The ranges of the uid hash space a sharded replica serving plain-HTTP metrics on
/// `127.0.0.1:port` reconciles now (its `operator_manager_shard_ranges{start,end}`), `end`
/// exclusive.
pub async fn manager_shard_ranges(port: u16) -> anyhow::Result<Vec<(u128, u128)>> {
    shard_ranges_of(&metrics_text(port).await?)
}

/// The ranges of `operator_manager_shard_ranges` samples set to 1 in Prometheus text.
fn shard_ranges_of(text: &str) -> anyhow::Result<Vec<(u128, u128)>> {
    let hex = |value: &str| {
        let digits = value.trim_start_matches("0x");
        u128::from_str_radix(digits, 16)
            .with_context(|| format!("a shard range's bound {value:?} is no hex number"))
    };
    let mut ranges = Vec::new();
    for line in text.lines() {
        let Some(labels) = line
            .strip_prefix(SHARD_RANGES_METRIC)
            .and_then(|rest| rest.strip_prefix('{'))
        else {
            continue;
        };
        if sample_value(line) != Some(1.0) {
            continue;
        }
        let (Some(start), Some(end)) = (label(labels, "start"), label(labels, "end")) else {
            anyhow::bail!("a shard range without its bounds: {line:?}");
        };
        ranges.push((hex(start)?, hex(end)?));
    }
    Ok(ranges)
}

/// The ranges of the uid hash space a sharded replica reconciles, one sample each.
const SHARD_RANGES_METRIC: &str = "operator_manager_shard_ranges";

/// The metrics text of the manager serving plain-HTTP metrics on `127.0.0.1:port`.
async fn metrics_text(port: u16) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        std::io::Result::Ok(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .with_context(|| format!("reading the manager's /metrics on port {port}: no answer"))?
        .with_context(|| format!("reading the manager's /metrics on port {port}"))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "the manager's /metrics on port {port} answered {:?}",
        head.lines().next().unwrap_or_default()
    );
    Ok(body.to_owned())
}

/// The reconciles and triggers in a manager's metrics text.
fn counts_of(text: &str) -> ManagerCounts {
    ManagerCounts {
        reconciles: sum_of(text, RECONCILES_METRIC),
        reconcile_time: (
            sum_of(text, &format!("{RECONCILE_TIME_METRIC}_sum")),
            sum_of(text, &format!("{RECONCILE_TIME_METRIC}_count")),
        ),
        triggers: sums_by(text, TRIGGERS_METRIC, |labels| {
            label(labels, "source").map(str::to_owned)
        }),
        cache_waits: sums_by(text, CACHE_WAITS_METRIC, |labels| {
            label(labels, "outcome").map(str::to_owned)
        }),
    }
}

/// The sum of every sample of counter `name` in Prometheus text.
fn sum_of(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(sample_value)
        .fold(0.0, |total, value| total + value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_replicas_shard_ranges_from_its_metrics() {
        let text = "\
# TYPE operator_manager_shard_ranges gauge
operator_manager_shard_ranges{end=\"0x0400000000000000\",start=\"0x0000000000000000\"} 1
operator_manager_shard_ranges{end=\"0x10000000000000000\",start=\"0xfc00000000000000\"} 1
operator_manager_shard_slots 2
";
        let ranges = shard_ranges_of(text).expect("parsed");
        assert_eq!(
            ranges,
            [(0, 0x0400_0000_0000_0000), (0xfc00_0000_0000_0000, 1 << 64)]
        );
        let broken = "operator_manager_shard_ranges{start=\"0xzz\",end=\"0x1\"} 1";
        assert!(
            shard_ranges_of(broken).is_err(),
            "a bound that is no number"
        );
    }

    #[test]
    fn sums_every_series_of_a_counter_and_nothing_else() {
        let text = "\
# TYPE controller_runtime_reconcile_total counter
controller_runtime_reconcile_total{controller=\"memcached\",result=\"success\"} 40
controller_runtime_reconcile_total{controller=\"memcached\",result=\"requeue_after\"} 2
controller_runtime_reconcile_total{controller=\"myapp\",result=\"error\"} 1
controller_runtime_reconcile_total_other 100
controller_runtime_reconcile_errors_total{controller=\"memcached\"} 7
";
        assert!((sum_of(text, RECONCILES_METRIC) - 43.0).abs() < f64::EPSILON);
        assert!(sum_of("", RECONCILES_METRIC).abs() < f64::EPSILON);
    }

    #[test]
    fn counts_triggers_and_cache_waits_over_every_controller() {
        let text = "\
# TYPE operator_manager_reconcile_triggers_total counter
operator_manager_reconcile_triggers_total{controller=\"memcached\",source=\"Deployment\"} 30
operator_manager_reconcile_triggers_total{controller=\"memcached\",source=\"Pod\"} 12
operator_manager_reconcile_triggers_total{controller=\"myapp\",source=\"Deployment\"} 5
operator_manager_reconcile_triggers_total{controller=\"myapp\",source=\"MyApp\"} 0
operator_manager_reconcile_cache_waits_total{controller=\"memcached\",outcome=\"caught_up\"} 4
operator_manager_reconcile_cache_waits_total{controller=\"myapp\",outcome=\"caught_up\"} 1
operator_manager_reconcile_cache_waits_total{controller=\"myapp\",outcome=\"behind\"} 2
controller_runtime_reconcile_total{controller=\"memcached\",result=\"success\"} 9
controller_runtime_reconcile_time_seconds_bucket{controller=\"memcached\",le=\"+Inf\"} 9
controller_runtime_reconcile_time_seconds_sum{controller=\"memcached\"} 1.5
controller_runtime_reconcile_time_seconds_count{controller=\"memcached\"} 9
controller_runtime_reconcile_time_seconds_sum{controller=\"myapp\"} 0.5
controller_runtime_reconcile_time_seconds_count{controller=\"myapp\"} 1
";
        let counts = counts_of(text);
        assert!((counts.reconciles - 9.0).abs() < f64::EPSILON);
        assert_eq!(counts.reconcile_time, (2.0, 10.0));
        assert_eq!(
            counts.triggers.0,
            BTreeMap::from([
                ("Deployment".to_owned(), 35.0),
                ("MyApp".to_owned(), 0.0),
                ("Pod".to_owned(), 12.0),
            ])
        );
        assert_eq!(
            counts.cache_waits.0,
            BTreeMap::from([("behind".to_owned(), 2.0), ("caught_up".to_owned(), 5.0)])
        );
        let reference = counts_of("");
        assert!(
            reference.triggers.0.is_empty() && reference.cache_waits.0.is_empty(),
            "the reference counts none"
        );

        // Replicas' counts add up, key by key.
        let both = counts.plus(&counts_of(
            "operator_manager_reconcile_triggers_total{controller=\"memcached\",source=\"Service\"} 3\n\
             controller_runtime_reconcile_total{controller=\"memcached\",result=\"success\"} 1\n",
        ));
        assert!((both.reconciles - 10.0).abs() < f64::EPSILON);
        assert_eq!(both.reconcile_time, (2.0, 10.0));
        assert_eq!(
            both.triggers.0,
            BTreeMap::from([
                ("Deployment".to_owned(), 35.0),
                ("MyApp".to_owned(), 0.0),
                ("Pod".to_owned(), 12.0),
                ("Service".to_owned(), 3.0),
            ])
        );
        assert_eq!(both.cache_waits, counts.cache_waits);
    }

    #[test]
    fn counts_each_schema_of_ours() {
        let text = "\
# HELP apiserver_flowcontrol_dispatched_requests_total x
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"bench-operator-manager\",priority_level=\"workload-low\"} 2
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"bench-operator-manager.memcacheds-status.patch\",priority_level=\"workload-low\"} 40
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"bench-operator-manager.memcacheds-status.patch\",priority_level=\"other\"} 2
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"exempt\",priority_level=\"exempt\"} 1000
apiserver_flowcontrol_dispatched_requests_total_other{flow_schema=\"bench-operator-manager\"} 7
";
        let counts = counts_by_schema(text);
        assert_eq!(
            counts.0,
            BTreeMap::from([
                ("memcacheds/status patch".to_owned(), 42.0),
                (OTHER.to_owned(), 2.0),
            ])
        );
        assert_eq!(counts.total(), 44.0);
        let earlier = Counts(BTreeMap::from([(OTHER.to_owned(), 2.0)]));
        let since = counts.since(&earlier).per(2.0);
        assert_eq!(since.describe(), "memcacheds/status patch 21.00");
        assert_eq!(counts_by_schema("").total(), 0.0);
        assert_eq!(format!("{:.1}", Counts::default().total()), "0.0");
    }

    #[test]
    fn sums_watch_events_by_resource() {
        let text = "\
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{group=\"\",resource=\"pods\",version=\"v1\"} 30
apiserver_watch_events_total{group=\"apps\",resource=\"deployments\",version=\"v1\"} 12
apiserver_watch_events_total{group=\"events.k8s.io\",resource=\"events\",version=\"v1\"} 1
apiserver_watch_events_total{group=\"\",resource=\"events\",version=\"v1\"} 2
apiserver_watch_events_sizes_sum{group=\"\",resource=\"pods\",version=\"v1\"} 3.5e+04
apiserver_watch_events_sizes_count{group=\"\",resource=\"pods\",version=\"v1\"} 30
apiserver_watch_events_total_other{resource=\"pods\"} 99
apiserver_watch_cache_events_received_total{group=\"\",resource=\"pods\"} 8
apiserver_init_events_total{group=\"\",resource=\"pods\"} 4
apiserver_terminated_watchers_total{group=\"\",resource=\"pods\"} 2
";
        let events = sums_by_resource(text, WATCH_EVENTS_METRIC);
        assert_eq!(
            events.0,
            BTreeMap::from([
                ("deployments".to_owned(), 12.0),
                ("events".to_owned(), 3.0),
                ("pods".to_owned(), 30.0),
            ])
        );
        let bytes = sums_by_resource(text, WATCH_BYTES_METRIC);
        assert_eq!(bytes.0, BTreeMap::from([("pods".to_owned(), 35_000.0)]));
        let earlier = ApiServerReading {
            watch_events: Counts(BTreeMap::from([("pods".to_owned(), 10.0)])),
            ..ApiServerReading::default()
        };
        let changes = sums_by_resource(text, CHANGES_METRIC);
        assert_eq!(changes.0, BTreeMap::from([("pods".to_owned(), 8.0)]));
        let initial = sums_by_resource(text, INITIAL_EVENTS_METRIC);
        assert_eq!(initial.0, BTreeMap::from([("pods".to_owned(), 4.0)]));
        let closed = sums_by_resource(text, CLOSED_WATCHES_METRIC);
        assert_eq!(closed.0, BTreeMap::from([("pods".to_owned(), 2.0)]));
        let reading = ApiServerReading {
            requests: Counts::default(),
            watch_events: events,
            watch_bytes: bytes,
            changes,
            initial_events: initial,
            closed_watches: closed,
        };
        assert_eq!(
            reading.since(&earlier).watch_events.describe(),
            "pods 20.00, deployments 12.00, events 3.00"
        );
        assert_eq!(
            reading.since(&earlier).closed_watches.describe_to(0),
            "pods 2"
        );
    }

    #[test]
    fn schema_names_round_trip() {
        for resource in COUNTED_RESOURCES {
            for verb in COUNTED_VERBS {
                assert_eq!(
                    key_of(&schema_name(resource, verb)),
                    Some(format!("{resource} {verb}"))
                );
            }
        }
        assert_eq!(key_of(concat!("bench-", product::name!(), "-x")), None);
        assert_eq!(key_of("exempt"), None);
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
    fn parses_thread_run_and_wait_times() {
        assert_eq!(
            run_and_wait_ns("1849973 52000 17\n"),
            Some((1_849_973, 52_000))
        );
        assert_eq!(run_and_wait_ns(""), None);
        assert_eq!(run_and_wait_ns("1849973"), None);
        assert_eq!(run_and_wait_ns("x 0 1"), None);
    }

    fn clock(threads: &[(u32, u64)], ticks: u64) -> CpuClock {
        CpuClock {
            threads_ns: threads.iter().copied().collect(),
            threads_wait_ns: BTreeMap::new(),
            ticks,
            ticks_per_second: 100.0,
        }
    }

    #[test]
    fn wait_for_a_cpu_is_summed_over_the_threads() {
        let mut before = clock(&[(1, 0), (2, 0)], 0);
        before.threads_wait_ns = BTreeMap::from([(1, 2_000_000), (2, 1_000_000)]);
        let mut after = clock(&[(1, 0), (3, 0)], 0);
        // Thread 1 waited 5 ms more, thread 2 exited, thread 3 is new and waited 1 ms.
        after.threads_wait_ns = BTreeMap::from([(1, 7_000_000), (3, 1_000_000)]);
        assert!((after.wait_seconds_since(&before) - 0.006).abs() < 1e-12);
    }

    #[test]
    fn the_machine_busy_share_counts_every_kind_of_work_but_idle() {
        let line = |user, idle| format!("cpu  {user} 10 20 {idle} 5 1 2 3 0 0");
        let before = MachineClock::parse(&line(100, 1000)).expect("a cpu line");
        assert_eq!(
            before,
            MachineClock {
                busy: 136,
                total: 1141
            }
        );
        // 60 ticks of user time and 40 idle: 60 % busy.
        let after = MachineClock::parse(&line(160, 1040)).expect("a cpu line");
        assert!((after.busy_share_since(&before) - 0.6).abs() < 1e-12);
        assert!(before.busy_share_since(&before).abs() < f64::EPSILON);
        assert_eq!(MachineClock::parse("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(MachineClock::parse("cpu  1 2 3"), None);
        assert_eq!(MachineClock::parse("cpu  1 2 x 4 5 6 7 8"), None);
        let now = MachineClock::read().expect("this machine's /proc/stat");
        assert!(now.total >= now.busy);
    }

    #[test]
    fn cpu_time_is_the_threads_nanoseconds_within_the_ticks_rounding() {
        let before = clock(&[(1, 1_000_000_000), (2, 500_000_000)], 150);
        // 0.123 s in thread 1, 0.004 s in thread 2, 0.010 s in a new thread 3: 0.137 s, which
        // the ticks round to 0.12 s.
        let after = clock(
            &[(1, 1_123_000_000), (2, 504_000_000), (3, 10_000_000)],
            162,
        );
        assert!((after.seconds_since(&before) - 0.137).abs() < 1e-9);
    }

    #[test]
    fn cpu_time_of_exited_threads_comes_from_the_ticks() {
        // Thread 2 ran 0.3 s and exited: only the ticks saw it.
        let before = clock(&[(1, 1_000_000_000), (2, 500_000_000)], 150);
        let after = clock(&[(1, 1_100_000_000)], 190);
        assert!((after.seconds_since(&before) - 0.40).abs() < 1e-9);
        // A new thread that took an exited one's id counts from zero.
        let reused = clock(&[(1, 1_100_000_000), (2, 50_000_000)], 165);
        assert!((reused.seconds_since(&before) - 0.15).abs() < 1e-9);
    }

    #[test]
    fn reads_this_process_cpu_clock_as_the_ticks_do() {
        let me = std::process::id();
        let before = CpuClock::read(me).expect("own /proc entry");
        assert!(before.threads_ns.contains_key(&me));
        assert!(before.threads_wait_ns.contains_key(&me));
        // Spin until the kernel's ticks have counted 50 ms (other tests may share the CPUs).
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut x = 0u64;
        let after = loop {
            x = std::hint::black_box(x.wrapping_add(1));
            if x.is_multiple_of(100_000) {
                let now = CpuClock::read(me).expect("own /proc entry");
                if now.ticks >= before.ticks + 5 || std::time::Instant::now() > give_up {
                    break now;
                }
            }
        };
        let ticks = (after.ticks - before.ticks) as f64 / after.ticks_per_second;
        let used = after.seconds_since(&before);
        assert!(
            ticks >= 0.05,
            "the ticks counted {ticks} s in 30 s of spinning"
        );
        assert!(
            (used - ticks).abs() <= 2.0 / after.ticks_per_second,
            "counted {used} s where the ticks counted {ticks} s"
        );
    }

    #[test]
    fn samples_this_process() {
        let me = sample(std::process::id()).expect("own /proc entry");
        assert!(me.rss_bytes > 0 && me.peak_rss_bytes >= me.rss_bytes);
        // The test binary's own code is a file's pages; its heap is anonymous.
        assert!(me.anon_rss_bytes > 0 && me.file_rss_bytes > 0);
        assert!(me.anon_rss_bytes + me.file_rss_bytes <= me.rss_bytes);
    }
}
