//! The benchmark's output: a table for the terminal and BENCHMARKS.md, and a JSON file.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::failover::Failover;
use super::probe::Counts;
use super::recovery::{OutageRecovery, Recovery};
use super::shard_crash::ShardCrash;
use super::timeline::Timeline;
use super::workload::{Phase, Run};
use super::{BenchArgs, REFERENCE};

/// The machine and software the numbers were measured on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub rustc: String,
    pub kubernetes: String,
    pub kube_crate: String,
    /// Whether the local cluster's real node (kubelet, containerd, kube-proxy) ran beside the
    /// fake nodes, sharing the CPUs.
    pub real_node: bool,
}

impl Machine {
    pub async fn describe(client: &kube::Client, real_node: bool) -> Self {
        let memory_kib: f64 = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines().find_map(|l| {
                    l.strip_prefix("MemTotal:")?
                        .split_whitespace()
                        .next()?
                        .parse()
                        .ok()
                })
            })
            .unwrap_or(0.0);
        Self {
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            memory_gib: (memory_kib / (1024.0 * 1024.0) * 10.0).round() / 10.0,
            kernel: first_line(&["uname", "-sr"]),
            rustc: first_line(&["rustc", "--version"]),
            kubernetes: client
                .apiserver_version()
                .await
                .map_or_else(|e| format!("unknown ({e})"), |v| v.git_version),
            kube_crate: locked_version("kube").unwrap_or_else(|| "unknown".to_owned()),
            real_node,
        }
    }
}

fn first_line(command: &[&str]) -> String {
    std::process::Command::new(command[0])
        .args(&command[1..])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The version of `package` in the workspace's Cargo.lock.
fn locked_version(package: &str) -> Option<String> {
    let lock = std::fs::read_to_string(crate::workspace_root().join("Cargo.lock")).ok()?;
    let needle = format!("name = \"{package}\"\nversion = \"");
    let start = lock.find(&needle)? + needle.len();
    Some(lock[start..].split('"').next()?.to_owned())
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub concurrency: usize,
    pub objects_per_namespace: usize,
    pub size: i32,
    pub max_concurrent_reconciles: u16,
    pub min_measured_seconds: u64,
}

impl From<&BenchArgs> for Settings {
    fn from(args: &BenchArgs) -> Self {
        Self {
            concurrency: args.concurrency,
            objects_per_namespace: args.objects_per_namespace,
            size: args.size,
            max_concurrent_reconciles: args.max_concurrent_reconciles,
            min_measured_seconds: args.min_measured_seconds,
        }
    }
}

/// A manager's binary, named by the digest of its file, so results can tell one build from
/// another (a commit that changes only documentation builds the same binary).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Build {
    pub manager: String,
    /// `sha256:<hex>` of the binary.
    pub digest: String,
}

impl Build {
    /// The digest of `binary`, which `manager` names.
    pub fn of(manager: &str, binary: &Path) -> anyhow::Result<Self> {
        let bytes = std::fs::read(binary)
            .with_context(|| format!("reading {} to name its build", binary.display()))?;
        Ok(Self {
            manager: manager.to_owned(),
            digest: ociimage::sha256_digest(&bytes),
        })
    }

    /// The digest as the tables print it: long enough to tell builds apart.
    pub(super) fn short_digest(&self) -> &str {
        self.digest
            .get(..("sha256:".len() + 12))
            .unwrap_or(&self.digest)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub machine: Machine,
    pub settings: Settings,
    /// The binaries measured; empty in the results of runs before they were recorded.
    #[serde(default)]
    pub builds: Vec<Build>,
    pub runs: Vec<Run>,
    pub recovery: Vec<Recovery>,
    pub failover: Vec<Failover>,
}

pub fn print_recovery(r: &Recovery) {
    for (what, o) in outages(r) {
        println!(
            "{}: after a {} s outage of the {what}, from the API server being ready: reacted {:.2} s, rolled out {:.2} s, converged {:.2} s (the manager's part {:.2} s)",
            r.manager,
            r.outage_seconds,
            o.reacted_seconds,
            o.rolled_out_seconds,
            o.converged_seconds,
            o.manager_seconds,
        );
        if !o.first_writes.is_empty() {
            println!(
                "  first write after the API server was ready: {}",
                first_writes(o)
            );
        }
    }
    println!(
        "{}: took its name back {:.2} s after the foreign Deployment went",
        r.manager, r.foreign_seconds
    );
}

/// Each outage a recovery measured, named by what was away: the API server alone, then the
/// control plane (its controllers restarted with it) when measured.
fn outages(r: &Recovery) -> impl Iterator<Item = (&'static str, &OutageRecovery)> {
    std::iter::once(("API server", &r.apiserver))
        .chain(r.control_plane.as_ref().map(|o| ("control plane", o)))
}

/// Who first wrote after an outage, and when, in seconds: `the manager 0.95, kwok 1.20`.
fn first_writes(o: &OutageRecovery) -> String {
    o.first_writes
        .iter()
        .map(|(who, seconds)| format!("{who} {seconds:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn print_run(run: &Run) {
    println!(
        "{} with {} objects: converged in {:.2} s ({:.1}/s, p50 {:.2} s, p99 {:.2} s), {:.1}x the physical limit; scale {:.2} s",
        run.manager,
        run.objects,
        run.convergence.seconds,
        run.convergence.objects_per_second,
        run.convergence.p50_seconds,
        run.convergence.p99_seconds,
        run.ratio_to_limit,
        run.scale.seconds
    );
    for (phase, measured) in phases(run) {
        println!(
            "  per object, {phase}: {} reconciles; requests {}",
            reconciles(measured),
            measured.requests_by_kind.describe()
        );
        println!("  per object, {phase}: {}", watch_traffic(measured));
        let split = &measured.split;
        println!(
            "  {phase}, per object (p50 / p99 / max): Deployment written {} s after the request, rolled out {} s later, reported {} s after that",
            split.reacted, split.rolled_out, split.reported
        );
        if let Some(timeline) = &measured.timeline {
            println!(
                "  {phase}, per object from the audit log (p50 / p99 / max, {} objects): {}",
                timeline.objects,
                describe_timeline(timeline)
            );
        }
    }
    // Printed now, not only in the tables at the end: a run stopped later keeps these.
    println!(
        "  cost: CPU {:.2} s ({:.2} ms per object; the burst of {}: {:.2} ms per object; waited for a CPU {:.2} ms per object, on a machine {:.0}% busy), RSS idle / peak / converged {:.1} / {:.1} / {:.1} MiB (converged: {:.1} anonymous, {:.1} of files)",
        cpu_seconds(run),
        cpu_ms_per_object(run),
        run.burst_objects,
        burst_cpu_ms_per_object(run),
        cpu_wait_ms_per_object(run),
        machine_busy(run) * 100.0,
        run.memory.idle_mib,
        run.memory.peak_mib,
        run.memory.converged_mib,
        run.memory.converged_anon_mib,
        run.memory.converged_file_mib
    );
    if !run.memory.replica_peaks_mib.is_empty() {
        let peaks: Vec<String> = (run.memory.replica_peaks_mib.iter())
            .map(|peak| format!("{peak:.1}"))
            .collect();
        println!(
            "  {} replicas, each its share: peak RSS {} MiB (the memory above is the most of any)",
            peaks.len(),
            peaks.join(" / ")
        );
    }
    println!(
        "  the cluster's own CPU per object: {}",
        phases(run)
            .map(|(name, phase)| format!(
                "{name} {}",
                control_plane_cpu(phase, phase_objects(run, name))
            ))
            .join("; ")
    );
}

/// A timeline's steps in words, each with its spread.
fn describe_timeline(t: &Timeline) -> String {
    let [written, scaled, pods, replica_set, rolled_out, reported] = t.steps();
    format!(
        "Deployment written {written} s after the request, a ReplicaSet scaled {scaled} s later (the Deployment controller's queue), its pods last changed {pods} s later, its status {replica_set} s later, the Deployment's {rolled_out} s later (rolled out), reported {reported} s after that"
    )
}

/// The local cluster's CPU milliseconds per object in `phase`, all its processes together and
/// then by process.
fn control_plane_cpu(phase: &Phase, objects: usize) -> String {
    #[allow(clippy::cast_precision_loss)]
    let per_object = |seconds: f64| seconds * 1000.0 / objects.max(1) as f64;
    let by_process: Vec<String> = phase
        .control_plane_cpu_seconds
        .iter()
        .map(|(process, &seconds)| format!("{process} {:.2}", per_object(seconds)))
        .collect();
    format!(
        "{:.2} ms ({})",
        per_object(phase.control_plane_cpu_seconds.values().sum()),
        by_process.join(", ")
    )
}

/// The objects a phase of `run` changed: the burst changes fewer than the others.
fn phase_objects(run: &Run, phase: &str) -> usize {
    if phase == "burst" {
        run.burst_objects
    } else {
        run.objects
    }
}

/// The watch traffic per object of `phase`: the changes of objects (each once), then the events
/// the API server sent for them to all its clients and their size, and how many of those
/// started a new watch (a client's re-list); each total with the resources that had at least
/// one per hundred objects. Then, when there were any, the watches the API server closed on a
/// client that fell behind (a count for the phase, not per object).
fn watch_traffic(phase: &Phase) -> String {
    let traffic = format!(
        "changes {}; watch events to all clients {}, {:.1} KiB, {:.1} of them a new watch's initial list",
        notable(&phase.changes_by_resource),
        notable(&phase.watch_events_by_resource),
        phase.watch_kib_per_object,
        phase.watch_initial_events_per_object
    );
    let closed = phase.closed_watches.total();
    if closed == 0.0 {
        return traffic;
    }
    format!(
        "{traffic}; watches closed on a client that fell behind: {closed:.0} ({})",
        phase.closed_watches.describe_to(0)
    )
}

/// `total (largest, ...)` of per-object counts, leaving out those under one per hundred objects.
fn notable(counts: &Counts) -> String {
    let shown = Counts(
        counts
            .0
            .iter()
            .filter(|(_, count)| **count >= 0.01)
            .map(|(key, count)| (key.clone(), *count))
            .collect(),
    );
    format!("{:.1} ({})", counts.total(), shown.describe())
}

/// Reconciles per object in `phase` (`-` when the manager's metrics were unreadable), the
/// watch events that asked for them by the kind of object that changed, and those held back
/// for the cache to show the manager's own last write, when counted.
fn reconciles(phase: &Phase) -> String {
    let mut out = phase
        .reconciles_per_object
        .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"));
    if let Some(mean) = phase.reconcile_mean_seconds {
        out.push_str(&format!(" of {:.0} ms", mean * 1000.0));
    }
    if !phase.triggers_by_source.0.is_empty() {
        out.push_str(&format!(
            " (triggered by {})",
            phase.triggers_by_source.describe()
        ));
    }
    if !phase.cache_waits.0.is_empty() {
        out.push_str(&format!(
            " (held for own writes: {})",
            phase.cache_waits.describe()
        ));
    }
    out
}

/// The results as Markdown tables (what BENCHMARKS.md holds).
pub fn markdown(results: &Results) -> String {
    let m = &results.machine;
    let s = &results.settings;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Machine: {} cores, {} GiB, {}; {}; Kubernetes {}, {}; kube {}.",
        m.cores,
        m.memory_gib,
        m.kernel,
        m.rustc,
        m.kubernetes,
        if m.real_node {
            "fake nodes and the real node"
        } else {
            "fake nodes only"
        },
        m.kube_crate
    );
    let _ = writeln!(
        out,
        "Settings: bench concurrency {}, size {} (scale event to {}), {} concurrent reconciles per controller, at most {} Memcacheds to a namespace.",
        s.concurrency,
        s.size,
        s.size + 1,
        s.max_concurrent_reconciles,
        s.objects_per_namespace
    );
    if !results.builds.is_empty() {
        let builds: Vec<String> = results
            .builds
            .iter()
            .map(|b| format!("{} {}", b.manager, b.short_digest()))
            .collect();
        let _ = writeln!(out, "Builds: {}.", builds.join(", "));
    }
    out.push('\n');
    if !results.runs.is_empty() {
        push_workload_tables(&mut out, results);
        push_shard_tables(&mut out, results);
    }
    if !results.recovery.is_empty() {
        out.push_str(
            "\n| manager | away | for (s) | reacted after ready (s) | rolled out after ready (s) | converged after ready (s) | the manager's part (s) | first write after ready (s) |\n|---|---|---:|---:|---:|---:|---:|---|\n",
        );
        for r in &results.recovery {
            for (what, o) in outages(r) {
                let _ = writeln!(
                    out,
                    "| {} | {what} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                    r.manager,
                    r.outage_seconds,
                    o.reacted_seconds,
                    o.rolled_out_seconds,
                    o.converged_seconds,
                    o.manager_seconds,
                    if o.first_writes.is_empty() {
                        "-".to_owned()
                    } else {
                        first_writes(o)
                    }
                );
            }
        }
        out.push_str("\n| manager | foreign Deployment deleted to own created (s) |\n|---|---:|\n");
        for r in &results.recovery {
            let _ = writeln!(out, "| {} | {:.2} |", r.manager, r.foreign_seconds);
        }
    }
    if !results.failover.is_empty() {
        out.push_str(
            "\n| manager | failover | objects | runs | min (s) | median (s) | max (s) |\n|---|---|---:|---:|---:|---:|---:|\n",
        );
        for f in &results.failover {
            for (name, spread) in [
                ("graceful (SIGTERM)", &f.graceful),
                ("crash (SIGKILL)", &f.crash),
            ] {
                let _ = writeln!(
                    out,
                    "| {} | {name} | {} | {} | {:.3} | {:.3} | {:.3} |",
                    f.manager,
                    f.objects,
                    spread.samples.len(),
                    spread.min,
                    spread.median,
                    spread.max
                );
            }
        }
        out.push_str(
            "\nA size changed at the moment of each stop, until its Deployment had it (the user's wait), and the replicas' resident memory just before each stop (a change not written after twice the time a takeover may take is counted as missed, and is no sample):\n\n| manager | failover | change written: min (s) | median (s) | max (s) | missed | standby RSS median (MiB) | leader RSS median (MiB) |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
        );
        for f in &results.failover {
            for (name, spread, missed) in [
                ("graceful (SIGTERM)", &f.graceful_change, f.graceful_missed),
                ("crash (SIGKILL)", &f.crash_change, f.crash_missed),
            ] {
                let _ = writeln!(
                    out,
                    "| {} | {name} | {:.3} | {:.3} | {:.3} | {} | {:.1} | {:.1} |",
                    f.manager,
                    spread.min,
                    spread.median,
                    spread.max,
                    missed.change,
                    f.standby_rss_mib.median,
                    f.leader_rss_mib.median
                );
            }
        }
        out.push_str(
            "\nSizes changed one every 50 ms as soon as the new leader led (while a cold standby catches up), until their Deployments had them:\n\n| manager | failover | changes | missed | median (s) | p99 (s) | max (s) |\n|---|---|---:|---:|---:|---:|---:|\n",
        );
        for f in &results.failover {
            for (name, spread, missed) in [
                ("graceful (SIGTERM)", &f.graceful_live, f.graceful_missed),
                ("crash (SIGKILL)", &f.crash_live, f.crash_missed),
            ] {
                let _ = writeln!(
                    out,
                    "| {} | {name} | {} | {} | {:.3} | {:.3} | {:.3} |",
                    f.manager,
                    spread.samples.len(),
                    missed.live,
                    spread.median,
                    spread.p99,
                    spread.max
                );
            }
        }
        out.push_str(
            "\nWhat one start of the caches cost (each round holds one: a cold standby lists everything when it takes over, a warm one when it is started again as the standby), medians over the rounds:\n\n| manager | new leader peak RSS (MiB) | restarted standby peak RSS (MiB) | API server peak above its RSS at the stop (MiB) |\n|---|---:|---:|---:|\n",
        );
        for f in &results.failover {
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.1} | {:.1} |",
                f.manager,
                f.new_leader_peak_rss_mib.median,
                f.restarted_peak_rss_mib.median,
                f.api_server_rise_mib.median
            );
        }
    }
    out
}

/// The workload runs' tables: every run, where its requests and time went, the ratios to the
/// reference and the growth of CPU per object.
fn push_workload_tables(out: &mut String, results: &Results) {
    out.push_str("| manager | objects | limit (s) | converge (s) | ratio | obj/s | p50 (s) | p99 (s) | req/obj | CPU (s) | CPU/obj (ms) | burst CPU/obj (ms) | scale (s) | scale p99 (s) | scale req/obj | RSS idle / peak / converged (MiB) |\n");
    out.push_str(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in &results.runs {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} / {:.1} / {:.1} |",
            r.manager,
            r.objects,
            r.limit.seconds,
            r.convergence.seconds,
            r.ratio_to_limit,
            r.convergence.objects_per_second,
            r.convergence.p50_seconds,
            r.convergence.p99_seconds,
            r.convergence.requests_per_object,
            cpu_seconds(r),
            cpu_ms_per_object(r),
            burst_cpu_ms_per_object(r),
            r.scale.seconds,
            r.scale.p99_seconds,
            r.scale.requests_per_object,
            r.memory.idle_mib,
            r.memory.peak_mib,
            r.memory.converged_mib,
        );
    }
    out.push_str(
        "\nPer object: the reconciles the manager counted and the mean time each held a worker (for ours, with the watch events that asked for them, by the kind of object that changed: the queue folds several into one reconcile; and those held back until the cache showed the manager's own last write: `caught_up`, or `behind` when one started without it), the requests by resource and verb, the changes of objects in the cluster (each once), and the watch events the API server sent for them to all its clients (the cluster's controllers, kwok, the bench and the manager), with those that started a new watch:\n\n",
    );
    push_phase_rows(
        out,
        results,
        "| reconciles | requests | watch traffic |\n|---|---:|---|---:|---|---|",
        |_, _, measured| {
            format!(
                "{} | {} | {}",
                reconciles(measured),
                measured.requests_by_kind.describe(),
                watch_traffic(measured)
            )
        },
    );
    out.push_str(
        "\nWhere each object's time went (p50 / p99 / max, seconds): from its request until the manager wrote its Deployment, from then until the cluster had rolled it out, and from then until the object reported it:\n\n",
    );
    push_phase_rows(
        out,
        results,
        "| Deployment written | rolled out | reported |\n|---|---:|---|---|---|---|",
        |_, _, measured| {
            let split = &measured.split;
            format!(
                "{} | {} | {}",
                split.reacted, split.rolled_out, split.reported
            )
        },
    );
    if results
        .runs
        .iter()
        .any(|r| phases(r).iter().any(|(_, p)| p.timeline.is_some()))
    {
        out.push_str(
            "\nThe same time step by step, from the API server's audit log (p50 / p99 / max, seconds; the objects whose every step it showed): from the request until the manager wrote the Deployment, until the Deployment controller scaled a ReplicaSet for it (its queue), until the pods last changed (created, bound and started, or deleted), until the ReplicaSet controller's last status, until the Deployment controller's (rolled out), and until the manager reported it:\n\n",
        );
        push_phase_rows(
            out,
            results,
            "| objects | Deployment written | ReplicaSet scaled | pods changed | ReplicaSet status | rolled out | reported |\n|---|---:|---|---:|---|---|---|---|---|---|",
            |_, _, measured| {
                measured.timeline.as_ref().map_or_else(
                    || "- | - | - | - | - | - | -".to_owned(),
                    |t| {
                        let steps = t.steps().map(ToString::to_string).join(" | ");
                        format!("{} | {steps}", t.objects)
                    },
                )
            },
        );
    }
    out.push_str(
        "\nThe cluster's own CPU per object (API server, etcd, controller manager, scheduler, kwok), all together and by process, in milliseconds:\n\n",
    );
    push_phase_rows(
        out,
        results,
        "| cluster CPU/obj |\n|---|---:|---|---|",
        |r, phase, measured| control_plane_cpu(measured, phase_objects(r, phase)),
    );
    let points = points(&results.runs);
    let pairs = pairs(&points);
    if !pairs.is_empty() {
        let _ = writeln!(
            out,
            "\nOurs over {REFERENCE} (below 1 is better for ours; of a count measured more than once, each value's median):\n"
        );
        out.push_str(
            "| manager | objects | runs | converge | req/obj | scale | scale req/obj | CPU | burst CPU | peak RSS | cluster CPU |\n",
        );
        out.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (ours, reference) in pairs {
            let ratio = |value: fn(&Run) -> f64| ours.median(value) / reference.median(value);
            let _ = writeln!(
                out,
                "| {} | {} | {} / {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                ours.manager,
                ours.objects,
                ours.runs.len(),
                reference.runs.len(),
                ratio(|r| r.convergence.seconds),
                ratio(|r| r.convergence.requests_per_object),
                ratio(|r| r.scale.seconds),
                ratio(|r| r.scale.requests_per_object),
                ratio(cpu_seconds),
                ratio(burst_cpu_ms_per_object),
                ratio(|r| r.memory.peak_mib),
                ratio(control_plane_cpu_seconds),
            );
        }
    }
    let growth = growth(&points);
    if !growth.is_empty() {
        out.push_str(
            "\nCPU per object at each count over the same manager's at its smallest count (flat is 1.00; of a count measured more than once, the median), and the bench's physical limit per write at that count, which tells how fast the machine and cluster were (counts measured in different runs compare like with like only where it is about the same):\n\n",
        );
        out.push_str(
            "| manager | objects | runs | CPU/obj (ms) | over the smallest | burst CPU/obj (ms) | over the smallest | waited for a CPU/obj (ms) | machine busy | physical limit per write (ms) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for (point, smallest) in growth {
            let cpu = point.median(cpu_ms_per_object);
            let burst = point.median(burst_cpu_ms_per_object);
            let _ = writeln!(
                out,
                "| {} | {} | {} | {cpu:.2} | {:.2} | {burst:.2} | {:.2} | {:.2} | {:.0}% | {:.2} |",
                point.manager,
                point.objects,
                point.runs.len(),
                cpu / smallest.median(cpu_ms_per_object),
                burst / smallest.median(burst_cpu_ms_per_object),
                point.median(cpu_wait_ms_per_object),
                point.median(machine_busy) * 100.0,
                point.median(limit_ms_per_write),
            );
        }
    }
}

/// The sharded managers against the single one at the same count (each value's median over
/// the runs), and the crash of one of their replicas: nothing when no sharded manager ran.
fn push_shard_tables(out: &mut String, results: &Results) {
    let points = points(&results.runs);
    let single =
        |objects| (points.iter()).find(|p| p.manager == super::OURS && p.objects == objects);
    let sharded: Vec<(&Point<'_>, &Point<'_>)> = (points.iter())
        .filter(|p| {
            p.runs
                .iter()
                .any(|r| !r.memory.replica_peaks_mib.is_empty())
        })
        .filter_map(|p| Some((p, single(p.objects)?)))
        .collect();
    if !sharded.is_empty() {
        let _ = writeln!(
            out,
            "\nSharded replicas over the single `{}` at the same count (below 1 is better for the replicas; of a count measured more than once, each value's median): each replica's peak RSS (the most any held), the time to converge and to scale, and the requests per object of all replicas together:\n",
            super::OURS
        );
        out.push_str("| manager | objects | runs | peak RSS per replica | converge | scale | req/obj | scale req/obj | CPU (all replicas) |\n");
        out.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
        for (replicas, single) in sharded {
            let ratio = |value: fn(&Run) -> f64| replicas.median(value) / single.median(value);
            let _ = writeln!(
                out,
                "| {} | {} | {} / {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                replicas.manager,
                replicas.objects,
                replicas.runs.len(),
                single.runs.len(),
                ratio(|r| r.memory.peak_mib),
                ratio(|r| r.convergence.seconds),
                ratio(|r| r.scale.seconds),
                ratio(|r| r.convergence.requests_per_object),
                ratio(|r| r.scale.requests_per_object),
                ratio(cpu_seconds),
            );
        }
    }
    let crashes: Vec<(&Run, &ShardCrash)> = (results.runs.iter())
        .filter_map(|r| Some((r, r.shard_crash.as_ref()?)))
        .collect();
    if !crashes.is_empty() {
        out.push_str(
            "\nOne replica killed (SIGKILL) while the burst's objects are scaled again: from the crash until each object's Deployment had its new size (p50 / p99 / max, seconds), the dead replica's objects (taken over once its member Lease expired) and the survivors' own:\n\n",
        );
        out.push_str(
            "| manager | objects | lease (s) | the dead replica's | the survivors' | missed |\n",
        );
        out.push_str("|---|---:|---:|---|---|---:|\n");
        for (run, crash) in crashes {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {} ({}) | {} ({}) | {} |",
                run.manager,
                run.objects,
                crash.lease_seconds,
                crash.dead,
                crash.dead_objects,
                crash.surviving,
                crash.surviving_objects,
                crash.missed,
            );
        }
    }
}

/// A table with a row per run and phase: the manager, the object count and the phase, then
/// the `columns` (their header cells, a newline and the whole alignment row) and each row's
/// `cells` for them.
fn push_phase_rows(
    out: &mut String,
    results: &Results,
    columns: &str,
    cells: impl Fn(&Run, &str, &Phase) -> String,
) {
    let _ = writeln!(out, "| manager | objects | phase {columns}");
    for r in &results.runs {
        for (phase, measured) in phases(r) {
            let _ = writeln!(
                out,
                "| {} | {} | {phase} | {} |",
                r.manager,
                r.objects,
                cells(r, phase, measured)
            );
        }
    }
}

/// The phases of `run` by name, in the order they ran.
fn phases(run: &Run) -> [(&'static str, &Phase); 3] {
    [
        ("converge", &run.convergence),
        ("scale", &run.scale),
        ("burst", &run.burst),
    ]
}

/// CPU milliseconds per object of the burst (the same work at every object count).
#[allow(clippy::cast_precision_loss)]
pub(super) fn burst_cpu_ms_per_object(run: &Run) -> f64 {
    run.burst.cpu_seconds * 1000.0 / run.burst_objects.max(1) as f64
}

/// The local cluster's own CPU seconds over the converge and scale phases.
fn control_plane_cpu_seconds(run: &Run) -> f64 {
    [&run.convergence, &run.scale]
        .iter()
        .flat_map(|phase| phase.control_plane_cpu_seconds.values())
        .sum()
}

/// The manager's CPU seconds over the converge and scale phases.
fn cpu_seconds(run: &Run) -> f64 {
    run.convergence.cpu_seconds + run.scale.cpu_seconds
}

/// CPU milliseconds per object over the converge and scale phases.
#[allow(clippy::cast_precision_loss)]
pub(super) fn cpu_ms_per_object(run: &Run) -> f64 {
    cpu_seconds(run) * 1000.0 / run.objects.max(1) as f64
}

/// Milliseconds per object the manager's threads waited for a CPU over the converge and scale
/// phases.
#[allow(clippy::cast_precision_loss)]
fn cpu_wait_ms_per_object(run: &Run) -> f64 {
    let waited = run.convergence.cpu_wait_seconds + run.scale.cpu_wait_seconds;
    waited * 1000.0 / run.objects.max(1) as f64
}

/// Milliseconds per write of the bench's physical limit: three writes per object at the bench's
/// concurrency with no manager running, so a measure of the machine and cluster alone.
fn limit_ms_per_write(run: &Run) -> f64 {
    if run.limit.writes == 0 {
        return 0.0;
    }
    run.limit.seconds * 1000.0 / run.limit.writes as f64
}

/// The share of the machine's CPU time that was busy over the converge and scale phases, each
/// weighed by its length.
fn machine_busy(run: &Run) -> f64 {
    let (converge, scale) = (&run.convergence, &run.scale);
    let seconds = converge.seconds + scale.seconds;
    if seconds <= 0.0 {
        return 0.0;
    }
    (converge.machine_busy * converge.seconds + scale.machine_busy * scale.seconds) / seconds
}

/// The runs of one manager at one object count: one, or several when the count was short
/// enough to be measured again (`--min-measured-seconds`).
pub(super) struct Point<'a> {
    pub(super) manager: &'a str,
    pub(super) objects: usize,
    pub(super) runs: Vec<&'a Run>,
}

impl Point<'_> {
    /// The median of `value` over the runs (of an even number, the mean of the middle two).
    pub(super) fn median(&self, value: impl Fn(&Run) -> f64) -> f64 {
        let mut values: Vec<f64> = self.runs.iter().map(|run| value(run)).collect();
        values.sort_by(f64::total_cmp);
        let middle = values.len() / 2;
        match values.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => values[middle],
            _ => f64::midpoint(values[middle - 1], values[middle]),
        }
    }
}

/// The runs grouped by manager and object count, in the order each group first ran.
pub(super) fn points(runs: &[Run]) -> Vec<Point<'_>> {
    let mut points: Vec<Point<'_>> = Vec::new();
    for run in runs {
        match points
            .iter_mut()
            .find(|p| p.manager == run.manager && p.objects == run.objects)
        {
            Some(point) => point.runs.push(run),
            None => points.push(Point {
                manager: &run.manager,
                objects: run.objects,
                runs: vec![run],
            }),
        }
    }
    points
}

/// Each count of a manager measured at more than one count, with that manager's smallest
/// count; by manager (in the order each first ran), then by count.
fn growth<'a>(points: &'a [Point<'a>]) -> Vec<(&'a Point<'a>, &'a Point<'a>)> {
    let mut managers: Vec<&str> = Vec::new();
    for point in points {
        if !managers.contains(&point.manager) {
            managers.push(point.manager);
        }
    }
    let mut rows = Vec::new();
    for manager in managers {
        let mut own: Vec<&Point<'_>> = points.iter().filter(|p| p.manager == manager).collect();
        own.sort_by_key(|p| p.objects);
        if let [smallest, _, ..] = own[..] {
            rows.extend(own.into_iter().map(|point| (point, smallest)));
        }
    }
    rows
}

/// Each count of ours (or of another build of ours) and the reference's runs of the same
/// count, in the order ours first ran.
pub(super) fn pairs<'a>(points: &'a [Point<'a>]) -> Vec<(&'a Point<'a>, &'a Point<'a>)> {
    points
        .iter()
        .filter(|p| p.manager != REFERENCE)
        .filter_map(|ours| {
            let reference = points
                .iter()
                .find(|p| p.manager == REFERENCE && p.objects == ours.objects)?;
            Some((ours, reference))
        })
        .collect()
}

/// Reads the results [`write_json`] wrote, whole or as far as a stopped run got.
pub fn read_json(path: &Path) -> anyhow::Result<Results> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--report: reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "--report: {} is not the JSON of `cargo xtask bench` (or of an older version of it)",
            path.display()
        )
    })
}

/// Reads a number that may be NaN: JSON has no NaN, so the results write it as `null` (a
/// spread without samples), and it reads back as NaN.
pub fn number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

pub fn write_json(path: &Path, results: &Results) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(results).context("serializing the results")?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bench::OURS;
    use crate::bench::baseline::Limit;
    use crate::bench::workload::{Memory, Split, Spread};

    pub(crate) fn run(manager: &str, objects: usize, seconds: f64, requests: f64, cpu: f64) -> Run {
        let spread = Spread {
            p50: 0.01,
            p99: 0.02,
            max: 0.03,
        };
        let phase = Phase {
            seconds,
            objects_per_second: 1.0,
            p50_seconds: 0.1,
            p99_seconds: 0.2,
            split: Split {
                reacted: spread.clone(),
                rolled_out: spread.clone(),
                reported: spread,
            },
            timeline: None,
            requests_per_object: requests,
            requests_by_kind: Counts(std::collections::BTreeMap::from([(
                "deployments patch".to_owned(),
                requests,
            )])),
            watch_events_by_resource: Counts(std::collections::BTreeMap::from([
                ("pods".to_owned(), 6.0),
                ("leases".to_owned(), 0.001),
            ])),
            watch_kib_per_object: 12.0,
            watch_initial_events_per_object: 0.5,
            closed_watches: Counts::default(),
            changes_by_resource: Counts(std::collections::BTreeMap::from([(
                "pods".to_owned(),
                2.0,
            )])),
            cpu_seconds: cpu,
            cpu_wait_seconds: cpu / 4.0,
            machine_busy: 0.5,
            control_plane_cpu_seconds: std::collections::BTreeMap::from([
                ("etcd".to_owned(), cpu / 2.0),
                ("kube-apiserver".to_owned(), cpu * 2.0),
            ]),
            reconciles_per_object: Some(2.0),
            reconcile_mean_seconds: Some(0.012),
            triggers_by_source: Counts(std::collections::BTreeMap::from([
                ("Deployment".to_owned(), 1.5),
                ("Memcached".to_owned(), 1.0),
            ])),
            cache_waits: Counts(std::collections::BTreeMap::from([(
                "caught_up".to_owned(),
                0.25,
            )])),
        };
        Run {
            manager: manager.to_owned(),
            objects,
            limit: Limit {
                seconds: 1.0,
                writes: 3,
            },
            convergence: phase.clone(),
            ratio_to_limit: seconds,
            scale: Phase {
                machine_busy: 0.8,
                ..phase.clone()
            },
            burst: Phase {
                // Not in proportion to the phases' CPU, so a swapped column shows.
                cpu_seconds: cpu / 10.0 + 0.05,
                ..phase
            },
            burst_objects: objects / 10,
            memory: Memory {
                idle_mib: 10.0,
                peak_mib: 20.0,
                replica_peaks_mib: Vec::new(),
                converged_mib: 15.0,
                converged_anon_mib: 5.0,
                converged_file_mib: 10.0,
            },
            shard_crash: None,
        }
    }

    /// Ours' recovery from a 20 s outage of the API server (scaled after 1.5 s, converged
    /// after 4.25 s) and of the control plane (scaled after 0.5 s, converged after 3.5 s).
    pub(crate) fn recovery() -> Recovery {
        Recovery {
            manager: OURS.to_owned(),
            outage_seconds: 20,
            apiserver: OutageRecovery {
                reacted_seconds: 1.5,
                rolled_out_seconds: 4.0,
                converged_seconds: 4.25,
                manager_seconds: 1.75,
                first_writes: vec![("the manager".to_owned(), 1.0), ("kwok".to_owned(), 3.5)],
            },
            control_plane: Some(OutageRecovery {
                reacted_seconds: 0.5,
                rolled_out_seconds: 3.25,
                converged_seconds: 3.5,
                manager_seconds: 0.75,
                first_writes: Vec::new(),
            }),
            foreign_seconds: 0.5,
        }
    }

    /// The results of `runs` on a 2-core machine, without recovery or failover.
    pub(crate) fn results_of(runs: Vec<Run>) -> Results {
        Results {
            machine: Machine {
                cores: 2,
                memory_gib: 24.0,
                kernel: "k".into(),
                rustc: "r".into(),
                kubernetes: "v".into(),
                kube_crate: "5".into(),
                real_node: false,
            },
            settings: Settings {
                concurrency: 16,
                objects_per_namespace: 1000,
                size: 1,
                max_concurrent_reconciles: 4,
                min_measured_seconds: 60,
            },
            builds: Vec::new(),
            runs,
            recovery: Vec::new(),
            failover: Vec::new(),
        }
    }

    #[test]
    fn the_json_reads_back_into_the_same_tables() {
        let mut ours = run(OURS, 100, 2.0, 4.0, 1.0);
        // A spread without samples is NaN, which the JSON holds as `null`.
        ours.scale.split.reported = Spread {
            p50: f64::NAN,
            p99: f64::NAN,
            max: f64::NAN,
        };
        let mut results = results_of(vec![ours, run(REFERENCE, 100, 4.0, 8.0, 4.0)]);
        let empty = crate::bench::failover::Spread {
            samples: Vec::new(),
            min: f64::NAN,
            median: f64::NAN,
            max: f64::NAN,
            p99: f64::NAN,
        };
        results.failover.push(Failover {
            manager: OURS.to_owned(),
            objects: 100,
            graceful: empty.clone(),
            crash: empty,
            crash_missed: crate::bench::failover::Missed { change: 1, live: 3 },
            ..Failover::default()
        });
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("bench.json");

        write_json(&path, &results).expect("written");
        let read = read_json(&path).expect("read back");

        assert!(read.runs[0].scale.split.reported.max.is_nan());
        assert!(read.failover[0].crash.median.is_nan());
        assert_eq!(read.failover[0].crash_missed.live, 3);
        assert_eq!(markdown(&read), markdown(&results));
        assert!(
            markdown(&read).contains("| ours | crash (SIGKILL) | 0 | 3 |"),
            "the missed live changes are in the table:\n{}",
            markdown(&read)
        );
    }

    #[test]
    fn watches_closed_on_a_client_that_fell_behind_are_named_when_there_are_any() {
        let mut phase = run(OURS, 100, 2.0, 4.0, 1.0).scale;
        assert!(
            watch_traffic(&phase).ends_with("0.5 of them a new watch's initial list"),
            "{}",
            watch_traffic(&phase)
        );
        phase.closed_watches = Counts(std::collections::BTreeMap::from([
            ("deployments".to_owned(), 1.0),
            ("pods".to_owned(), 3.0),
        ]));
        assert!(
            watch_traffic(&phase).ends_with(
                "0.5 of them a new watch's initial list; watches closed on a client that fell behind: 4 (pods 3, deployments 1)"
            ),
            "{}",
            watch_traffic(&phase)
        );
    }

    #[test]
    fn results_written_before_closed_watches_were_counted_read_back() {
        let results = results_of(vec![run(OURS, 100, 2.0, 4.0, 1.0)]);
        let mut json = serde_json::to_value(&results).expect("serialized");
        for phase in ["convergence", "scale", "burst"] {
            let removed = json["runs"][0][phase]
                .as_object_mut()
                .and_then(|p| p.remove("closed_watches"));
            assert!(removed.is_some(), "{phase} had the field");
        }
        let read: Results = serde_json::from_value(json).expect("read without the field");
        assert!(read.runs[0].scale.closed_watches.0.is_empty());
    }

    #[test]
    fn the_audit_timeline_has_a_table_when_a_phase_has_one() {
        let without = results_of(vec![run(OURS, 100, 2.0, 4.0, 1.0)]);
        assert!(!markdown(&without).contains("from the API server's audit log"));
        // Results written before the timeline read back without one.
        let mut json = serde_json::to_value(&without).expect("serialized");
        let removed = json["runs"][0]["scale"]
            .as_object_mut()
            .and_then(|p| p.remove("timeline"));
        assert!(removed.is_some(), "the scale phase had the field");
        let read: Results = serde_json::from_value(json).expect("read without the field");
        assert!(read.runs[0].scale.timeline.is_none());

        let step = |p50: f64| Spread {
            p50,
            p99: p50 * 2.0,
            max: p50 * 3.0,
        };
        let mut with = without;
        with.runs[0].scale.timeline = Some(Timeline {
            objects: 99,
            deployment_written: step(1.0),
            replica_set_scaled: step(1.5),
            pods_changed: step(0.25),
            replica_set_status: step(0.125),
            rolled_out: step(0.5),
            reported: step(0.75),
        });
        let text = markdown(&with);
        assert!(
            text.contains("| ours | 100 | converge | - | - | - | - | - | - | - |"),
            "{text}"
        );
        assert!(
            text.contains("| ours | 100 | scale | 99 | 1.00 / 2.00 / 3.00 | 1.50 / 3.00 / 4.50 | 0.25 / 0.50 / 0.75 | 0.12 / 0.25 / 0.38 | 0.50 / 1.00 / 1.50 | 0.75 / 1.50 / 2.25 |"),
            "{text}"
        );
    }

    #[test]
    fn sharded_replicas_are_compared_with_the_single_manager_and_their_crash_shown() {
        let single = run(OURS, 1000, 60.0, 5.0, 5.0);
        let mut sharded = run("ours-sharded-3", 1000, 45.0, 5.5, 9.0);
        sharded.memory.peak_mib = 8.0;
        sharded.memory.replica_peaks_mib = vec![8.0, 7.5, 7.0];
        let spread = |p50: f64| Spread::of(&[p50, p50 + 1.0]);
        sharded.shard_crash = Some(ShardCrash {
            lease_seconds: 15.0,
            dead_objects: 33,
            dead: spread(15.0),
            surviving_objects: 67,
            surviving: spread(0.5),
            missed: 0,
        });
        let text = markdown(&results_of(vec![single.clone(), sharded]));
        assert!(
            text.contains("| ours-sharded-3 | 1000 | 1 / 1 | 0.40 | 0.75 |"),
            "{text}"
        );
        assert!(
            text.contains("| ours-sharded-3 | 1000 | 15 | 15.00 / 16.00 / 16.00 (33) | 0.50 / 1.50 / 1.50 (67) | 0 |"),
            "{text}"
        );
        let alone = markdown(&results_of(vec![single]));
        assert!(!alone.contains("Sharded replicas"), "{alone}");
    }

    #[test]
    fn a_build_is_named_by_its_binarys_digest() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let binary = dir.path().join("manager");
        std::fs::write(&binary, "abc").expect("written");
        let build = Build::of(OURS, &binary).expect("digested");
        assert_eq!(
            build.digest,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(build.short_digest(), "sha256:ba7816bf8f01");
        let error = format!(
            "{:#}",
            Build::of(OURS, &dir.path().join("missing")).expect_err("no such file")
        );
        assert!(error.contains("missing"), "{error}");

        // Results written before builds were recorded read back without them.
        let mut json = serde_json::to_value(results_of(Vec::new())).expect("serialized");
        let removed = json.as_object_mut().and_then(|r| r.remove("builds"));
        assert!(removed.is_some(), "the results had the field");
        let read: Results = serde_json::from_value(json).expect("read without the field");
        assert!(read.builds.is_empty());
        assert!(!markdown(&read).contains("Builds:"));
    }

    #[test]
    fn a_file_that_is_not_the_results_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let missing = dir.path().join("missing.json");
        let error = format!("{:#}", read_json(&missing).expect_err("no such file"));
        assert!(error.contains("missing.json"), "{error}");

        let other = dir.path().join("other.json");
        std::fs::write(&other, r#"{"runs": []}"#).expect("written");
        let error = format!("{:#}", read_json(&other).expect_err("not the results"));
        assert!(error.contains("other.json"), "{error}");
        assert!(error.contains("missing field `machine`"), "{error}");
    }

    #[test]
    fn results_without_workload_runs_print_only_what_was_measured() {
        let results = Results {
            recovery: vec![recovery()],
            ..results_of(Vec::new())
        };
        let text = markdown(&results);
        for row in [
            "| ours | API server | 20 | 1.50 | 4.00 | 4.25 | 1.75 | the manager 1.00, kwok 3.50 |",
            "| ours | control plane | 20 | 0.50 | 3.25 | 3.50 | 0.75 | - |",
            "| ours | 0.50 |",
        ] {
            assert!(text.contains(row), "{row} not in {text}");
        }
        for table in [
            "| manager | objects | limit (s)",
            "Per object:",
            "Ours over",
        ] {
            assert!(!text.contains(table), "{table} in {text}");
        }
    }

    #[test]
    fn ratios_pair_runs_of_the_same_count() {
        let runs = vec![
            run(OURS, 100, 2.0, 4.0, 1.0),
            run(REFERENCE, 100, 4.0, 8.0, 4.0),
            run(REFERENCE, 1000, 40.0, 8.0, 40.0),
            run(OURS, 1000, 20.0, 4.0, 10.0),
            run("size-opt", 1000, 30.0, 4.0, 20.0),
            // Measured for ours only: no ratio row.
            run(OURS, 5000, 20.0, 4.0, 10.0),
        ];
        let points = points(&runs);
        let paired: Vec<(&str, usize)> = pairs(&points)
            .iter()
            .map(|(o, _)| (o.manager, o.objects))
            .collect();
        assert_eq!(paired, [(OURS, 100), (OURS, 1000), ("size-opt", 1000)]);
        let results = Results {
            recovery: vec![recovery()],
            ..results_of(runs)
        };
        let text = markdown(&results);
        assert!(
            text.contains(
                "| ours | 100 | 1 / 1 | 0.50 | 0.50 | 0.50 | 0.50 | 0.25 | 0.33 | 1.00 | 0.25 |"
            ),
            "{text}"
        );
        // The cluster's 2.50 s of the converge phase, over 100 objects.
        assert!(
            text.contains("| ours | 100 | converge | 25.00 ms (etcd 5.00, kube-apiserver 20.00) |"),
            "{text}"
        );
        assert!(text.contains("| ours | 100 | 1.00 | 2.00 |"), "{text}");
        // CPU 2.00 s is 20.00 ms per object; the burst, 0.15 s for 10 objects, 15.00.
        assert!(text.contains("| 2.00 | 20.00 | 15.00 |"), "{text}");
        assert!(
            text.contains(
                "| ours | 100 | burst | 2.00 of 12 ms (triggered by Deployment 1.50, Memcached 1.00) (held for own writes: caught_up 0.25) | deployments patch 4.00 |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| size-opt | 1000 | 1 / 1 | 0.75 | 0.50 | 0.75 | 0.50 | 0.50 | 0.51 | 1.00 |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| ours | 100 | converge | 2.00 of 12 ms (triggered by Deployment 1.50, Memcached 1.00) (held for own writes: caught_up 0.25) | deployments patch 4.00 | changes 2.0 (pods 2.00); watch events to all clients 6.0 (pods 6.00), 12.0 KiB, 0.5 of them a new watch's initial list |"
            ),
            "{text}"
        );
        for row in [
            "| ours | API server | 20 | 1.50 | 4.00 | 4.25 | 1.75 | the manager 1.00, kwok 3.50 |",
            "| ours | control plane | 20 | 0.50 | 3.25 | 3.50 | 0.75 | - |",
            "| ours | 0.50 |",
        ] {
            assert!(text.contains(row), "{row} not in {text}");
        }
    }

    #[test]
    fn growth_is_over_the_same_managers_smallest_count() {
        let mut runs = vec![
            run(OURS, 1000, 20.0, 4.0, 10.0),
            run(REFERENCE, 100, 4.0, 8.0, 4.0),
            run(OURS, 100, 2.0, 4.0, 1.0),
            run(REFERENCE, 1000, 40.0, 8.0, 40.0),
            run(OURS, 5000, 20.0, 4.0, 10.0),
            // One count only: nothing to compare.
            run("size-opt", 1000, 30.0, 4.0, 20.0),
        ];
        // A faster machine when 5000 was measured: 2 ms a write against 333.33.
        runs[4].limit = Limit {
            seconds: 30.0,
            writes: 15_000,
        };
        let points = points(&runs);
        let rows: Vec<(&str, usize, usize)> = growth(&points)
            .iter()
            .map(|(point, smallest)| (point.manager, point.objects, smallest.objects))
            .collect();
        assert_eq!(
            rows,
            [
                (OURS, 100, 100),
                (OURS, 1000, 100),
                (OURS, 5000, 100),
                (REFERENCE, 100, 100),
                (REFERENCE, 1000, 100),
            ]
        );
        let text = markdown(&results_of(runs));
        // Ours: 20 ms per object at 100 and at 1000, 4 at 5000; the burst 15, 10.5 and 2.1.
        // A quarter of the CPU time waited for a CPU; the machine was 50% busy in the converge
        // phase and 80% in the scale phase, as long as each other.
        assert!(
            text.contains(
                "| ours | 1000 | 1 | 20.00 | 1.00 | 10.50 | 0.70 | 5.00 | 65% | 333.33 |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| ours | 5000 | 1 | 4.00 | 0.20 | 2.10 | 0.14 | 1.00 | 65% | 2.00 |"),
            "{text}"
        );
        assert!(
            text.contains("| controller-runtime | 1000 | 1 | 80.00 | 1.00 | 40.50 | 0.90 |"),
            "{text}"
        );
        assert!(!text.contains("| size-opt | 1000 | 30"), "{text}");
    }

    #[test]
    fn the_machine_busy_share_weighs_each_phase_by_its_length() {
        let mut measured = run(OURS, 100, 10.0, 4.0, 1.0);
        measured.scale.seconds = 30.0;
        measured.scale.machine_busy = 1.0;
        // Half busy for 10 s, then fully for 30 s.
        assert!((machine_busy(&measured) - 0.875).abs() < 1e-12);
        measured.convergence.seconds = 0.0;
        measured.scale.seconds = 0.0;
        assert!(machine_busy(&measured).abs() < f64::EPSILON);
        // 1 s of CPU in each phase, a quarter of it waiting: 5 ms per object over both.
        assert!((cpu_wait_ms_per_object(&measured) - 5.0).abs() < 1e-12);
    }

    #[test]
    fn a_count_measured_again_is_compared_by_its_medians() {
        let runs = vec![
            run(OURS, 100, 2.0, 4.0, 1.0),
            run(REFERENCE, 100, 4.0, 8.0, 4.0),
            run(REFERENCE, 100, 4.0, 8.0, 6.0),
            run(OURS, 100, 2.0, 4.0, 3.0),
            run(OURS, 100, 2.0, 4.0, 2.0),
            run(OURS, 1000, 20.0, 4.0, 10.0),
        ];
        let points = points(&runs);
        let ours_at_100 = &points[0];
        assert_eq!((ours_at_100.manager, ours_at_100.runs.len()), (OURS, 3));
        // 20, 60 and 40 ms per object: the middle one. The reference's 80 and 120: their mean.
        assert!((ours_at_100.median(cpu_ms_per_object) - 40.0).abs() < 1e-9);
        assert!((points[1].median(cpu_ms_per_object) - 100.0).abs() < 1e-9);
        let text = markdown(&results_of(runs));
        // Every run keeps its own row.
        assert_eq!(text.matches("| ours | 100 | 1.00 |").count(), 3, "{text}");
        // CPU 4 s over 10 s; the burst 0.25 over 0.55 (ms per object 25 and 55).
        assert!(
            text.contains(
                "| ours | 100 | 3 / 2 | 0.50 | 0.50 | 0.50 | 0.50 | 0.40 | 0.45 | 1.00 |"
            ),
            "{text}"
        );
        // 20 ms per object at 1000 against the median 40 at 100.
        assert!(
            text.contains("| ours | 1000 | 1 | 20.00 | 0.50 |"),
            "{text}"
        );
        assert!(text.contains("| ours | 100 | 3 | 40.00 | 1.00 |"), "{text}");
    }
}
