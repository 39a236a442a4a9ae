//! Failover: how long until the standby leads, after the leader is stopped gracefully
//! (SIGTERM: it releases the Lease) or killed (SIGKILL: the Lease must expire), while
//! Memcacheds are being scaled, so the leader is busy and every new leader has a full cache to
//! fill (or, warm, already holds it). Also how long until a change made right after the stop
//! is acted on: one Memcached, left out of the scaling, has its size changed at the moment of
//! the stop, and the time until its Deployment has the new size is the user's wait. And what
//! the standby's caches cost: both replicas' resident memory just before each stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::json;
use testkit::{ManagerProcess, ServiceAccountKubeconfig, TestCluster};

use super::tenants::{Target, Tenants};
use super::workload::wait_for_holder;
use super::{BenchArgs, Contender};

/// Pod names of the two managers (`POD_NAME`, the holder identity before its suffix, as
/// in-cluster).
const REPLICAS: [&str; 2] = ["bench-replica-a", "bench-replica-b"];
/// Memcacheds changed one after another as soon as a new leader leads (fewer when the phase
/// has too few objects: at most a quarter of them).
const LIVE_CHANGES: usize = 20;
/// The time between two of those changes.
const LIVE_CHANGE_INTERVAL: Duration = Duration::from_millis(50);
/// client-go's defaults, which the manager also uses.
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// Minimum, median and maximum of a set of handover times, in seconds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spread {
    pub samples: Vec<f64>,
    /// NaN (`null` in the JSON) without samples, as the median and the maximum.
    #[serde(deserialize_with = "super::report::number")]
    pub min: f64,
    #[serde(deserialize_with = "super::report::number")]
    pub median: f64,
    #[serde(deserialize_with = "super::report::number")]
    pub max: f64,
    /// The nearest-rank 99th percentile (the maximum below 100 samples).
    #[serde(default = "nan", deserialize_with = "super::report::number")]
    pub p99: f64,
}

fn nan() -> f64 {
    f64::NAN
}

impl Default for Spread {
    /// No samples (NaN): what a result written before a field was measured reads as.
    fn default() -> Self {
        Self::of(Vec::new())
    }
}

impl Spread {
    fn of(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        let pick = |i: usize| samples.get(i).copied().unwrap_or(f64::NAN);
        Self {
            min: pick(0),
            median: pick(samples.len() / 2),
            max: pick(samples.len().saturating_sub(1)),
            p99: pick((samples.len() * 99).div_ceil(100).saturating_sub(1)),
            samples,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Failover {
    /// Which manager ([`super::OURS`], [`super::REFERENCE`] or an `--also-manager` name).
    pub manager: String,
    /// Memcacheds present and being scaled meanwhile.
    pub objects: usize,
    /// SIGTERM on the leader until the standby holds the Lease.
    pub graceful: Spread,
    /// SIGKILL on the leader until the standby holds the Lease.
    pub crash: Spread,
    /// SIGTERM on the leader until a size changed right after it reached the Deployment.
    #[serde(default)]
    pub graceful_change: Spread,
    /// SIGKILL on the leader until a size changed right after it reached the Deployment.
    #[serde(default)]
    pub crash_change: Spread,
    /// The standby's resident memory just before each stop, in MiB.
    #[serde(default)]
    pub standby_rss_mib: Spread,
    /// The leader's resident memory just before each stop, in MiB.
    #[serde(default)]
    pub leader_rss_mib: Spread,
    /// From each new size of the live changes made as the new leader led after a SIGTERM,
    /// until its Deployment had it.
    #[serde(default)]
    pub graceful_live: Spread,
    /// The same after a SIGKILL.
    #[serde(default)]
    pub crash_live: Spread,
    /// The changes of [`Failover::graceful_change`] and [`Failover::graceful_live`] that had
    /// not reached their Deployments after twice the time a takeover may take: a result, not
    /// a failure of the bench (they are no samples of those spreads).
    #[serde(default)]
    pub graceful_missed: Missed,
    /// The same after a SIGKILL.
    #[serde(default)]
    pub crash_missed: Missed,
    /// The new leader's peak resident memory since it started, read after each round's
    /// caches were filled, in MiB.
    #[serde(default)]
    pub new_leader_peak_rss_mib: Spread,
    /// The restarted standby's peak resident memory, read once it has had time to fill its
    /// caches, in MiB.
    #[serde(default)]
    pub restarted_peak_rss_mib: Spread,
    /// The API server's peak resident memory from each stop until the restarted standby's
    /// caches were filled, above what it held at the stop, in MiB.
    #[serde(default)]
    pub api_server_rise_mib: Spread,
}

/// Changes that did not reach their Deployments in time, over the rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Missed {
    /// Sizes changed at the stop.
    pub change: usize,
    /// Sizes changed as the new leader led.
    pub live: usize,
}

/// What the rounds measured, each a sample per round.
#[derive(Default)]
struct Rounds {
    graceful_missed: Missed,
    crash_missed: Missed,
    graceful: Vec<f64>,
    crash: Vec<f64>,
    graceful_change: Vec<f64>,
    crash_change: Vec<f64>,
    standby_rss_mib: Vec<f64>,
    leader_rss_mib: Vec<f64>,
    graceful_live: Vec<f64>,
    crash_live: Vec<f64>,
    new_leader_peak_rss_mib: Vec<f64>,
    restarted_peak_rss_mib: Vec<f64>,
    api_server_rise_mib: Vec<f64>,
}

pub async fn measure(
    cluster: &TestCluster,
    contender: &Contender,
    kubeconfig: &ServiceAccountKubeconfig,
    objects: usize,
    args: &BenchArgs,
) -> anyhow::Result<Failover> {
    let tenants = Tenants::create(
        cluster,
        "bench-failover",
        "load",
        objects,
        args.objects_per_namespace,
    )
    .await?;
    tenants.populate(args.size, args.concurrency).await?;
    // The first Memcached is the one changed at each stop, the next ones are changed as the
    // new leader leads; the others are being scaled.
    let (probe, rest) = tenants
        .targets()
        .split_first()
        .context("no Memcached to measure failover with")?;
    let (live, scaled) = rest.split_at(LIVE_CHANGES.min(objects / 4));
    let stop_load = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(scale_continuously(
        scaled.to_vec(),
        args.size,
        stop_load.clone(),
    ));
    let changed = Changed { probe, live };
    let measured = rounds(cluster, contender, kubeconfig, &tenants, &changed, args).await;
    stop_load.store(true, Ordering::SeqCst);
    let _ = load.await;
    tenants.delete_and_wait(cluster, args.timeout()).await?;
    let measured = measured?;
    Ok(Failover {
        manager: contender.name.clone(),
        objects,
        graceful: Spread::of(measured.graceful),
        crash: Spread::of(measured.crash),
        graceful_change: Spread::of(measured.graceful_change),
        crash_change: Spread::of(measured.crash_change),
        standby_rss_mib: Spread::of(measured.standby_rss_mib),
        leader_rss_mib: Spread::of(measured.leader_rss_mib),
        graceful_live: Spread::of(measured.graceful_live),
        crash_live: Spread::of(measured.crash_live),
        graceful_missed: measured.graceful_missed,
        crash_missed: measured.crash_missed,
        new_leader_peak_rss_mib: Spread::of(measured.new_leader_peak_rss_mib),
        restarted_peak_rss_mib: Spread::of(measured.restarted_peak_rss_mib),
        api_server_rise_mib: Spread::of(measured.api_server_rise_mib),
    })
}

/// Changes the size of `probe` to `size`, then waits until its Deployment has it: the time
/// from `since` until then, in seconds; `None` when it did not within `within`.
async fn change_reaches_deployment(
    cluster: &TestCluster,
    probe: &Target,
    size: i32,
    since: Instant,
    within: Duration,
) -> anyhow::Result<Option<f64>> {
    let patch = json!({"spec": {"size": size}});
    (probe.api)
        .patch(&probe.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .with_context(|| format!("changing the size of {}", probe.key()))?;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), &probe.namespace);
    let deadline = since + within;
    loop {
        let deployment = deployments.get_opt(&probe.name).await?;
        if deployment.and_then(|d| d.spec.replicas) == Some(size) {
            return Ok(Some(since.elapsed().as_secs_f64()));
        }
        if Instant::now() >= deadline {
            println!(
                "  the size of {} changed at the stop did not reach its Deployment within {within:?}",
                probe.key()
            );
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Changes the sizes of `targets` to `size`, one every [`LIVE_CHANGE_INTERVAL`], and times
/// each until its Deployment has it, in seconds, in the order of `targets`; with how many
/// had not reached their Deployments within `within` (no samples). A watch of every
/// Deployment from before the first change sees them arrive (polling twenty objects would load
/// the API server the manager is measured against).
async fn live_changes(
    cluster: &TestCluster,
    targets: &[Target],
    size: i32,
    within: Duration,
) -> anyhow::Result<(Vec<f64>, usize)> {
    use futures::StreamExt as _;
    use kube::api::{ListParams, WatchEvent, WatchParams};
    if targets.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let deployments: Api<Deployment> = Api::all(cluster.client.clone());
    let now = deployments
        .list_metadata(&ListParams::default().limit(1))
        .await
        .context("reading the Deployments' resourceVersion")?
        .metadata
        .resource_version
        .context("a list without a resourceVersion")?;
    let mut events = deployments
        .watch(&WatchParams::default(), &now)
        .await
        .context("watching the Deployments")?
        .boxed();
    let mut changed_at: Vec<Option<Instant>> = vec![None; targets.len()];
    let mut written: Vec<Option<f64>> = vec![None; targets.len()];
    let deadline = Instant::now() + within;
    let mut next_change = Instant::now();
    let mut pending = targets.len();
    while pending > 0 {
        if Instant::now() >= deadline {
            println!(
                "  {pending} of {} sizes changed as the new leader led did not reach their Deployments within {within:?}",
                targets.len()
            );
            break;
        }
        let unchanged = changed_at.iter().position(Option::is_none);
        let wake = tokio::time::Instant::from_std(if unchanged.is_some() {
            next_change
        } else {
            deadline
        });
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {
                // Without a change left to make, this wakes at the deadline.
                let Some(index) = unchanged else { continue };
                let target = &targets[index];
                let patch = json!({"spec": {"size": size}});
                changed_at[index] = Some(Instant::now());
                (target.api)
                    .patch(&target.name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .with_context(|| format!("changing the size of {}", target.key()))?;
                next_change += LIVE_CHANGE_INTERVAL;
            }
            event = events.next() => {
                let deployment = match event {
                    Some(Ok(WatchEvent::Added(d) | WatchEvent::Modified(d))) => d,
                    Some(Ok(WatchEvent::Error(e))) => anyhow::bail!("the Deployment watch ended: {e}"),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e).context("watching the Deployments"),
                    None => anyhow::bail!("the Deployment watch ended before every change was written"),
                };
                if deployment.spec.replicas != Some(size) {
                    continue;
                }
                let found = targets.iter().position(|t| {
                    deployment.metadata.namespace.as_deref() == Some(t.namespace.as_str())
                        && deployment.metadata.name.as_deref() == Some(t.name.as_str())
                });
                if let Some(index) = found
                    && written[index].is_none()
                    && let Some(at) = changed_at[index]
                {
                    written[index] = Some(at.elapsed().as_secs_f64());
                    pending -= 1;
                }
            }
        }
    }
    Ok((written.into_iter().flatten().collect(), pending))
}

/// Waits until the tenants' namespaces hold a Deployment per Memcached.
async fn every_memcached_deployed(
    cluster: &TestCluster,
    tenants: &Tenants,
    objects: usize,
    within: Duration,
) -> anyhow::Result<()> {
    use kube::api::ListParams;
    let deadline = Instant::now() + within;
    loop {
        let mut deployed = 0;
        for api in tenants.apis::<Deployment>(cluster) {
            // One item and the count of the rest: the API server counts, the bench does not
            // page through thousands.
            let page = api.list_metadata(&ListParams::default().limit(1)).await?;
            let rest = page.metadata.remaining_item_count.unwrap_or(0);
            deployed += page.items.len() + usize::try_from(rest).unwrap_or(0);
        }
        if deployed >= objects {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the first leader gave {deployed} of {objects} Memcacheds their Deployments within {within:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The resident memory of `replica` now, in MiB (NaN when it cannot be read).
fn rss_mib(replica: &Replica) -> f64 {
    replica_mib(replica, |sample| sample.rss_bytes)
}

/// The highest resident memory of `replica` since it started, in MiB (NaN when it cannot be
/// read).
fn peak_rss_mib(replica: &Replica) -> f64 {
    replica_mib(replica, |sample| sample.peak_rss_bytes)
}

fn replica_mib(replica: &Replica, bytes: impl Fn(&super::probe::ProcessSample) -> u64) -> f64 {
    replica
        .process
        .id()
        .and_then(|pid| super::probe::sample(pid).ok())
        .map_or(f64::NAN, |sample| mib(bytes(&sample)))
}

#[allow(clippy::cast_precision_loss)] // MiB of a process fit an f64 exactly
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// How long after a restarted standby is ready its caches are given to fill before the
/// round's memory is read: 2 s, and 1 s more per 1000 objects, at most 15 s.
fn settle_time(objects: usize) -> Duration {
    let seconds = 2 + u64::try_from(objects / 1000).unwrap_or(u64::MAX);
    Duration::from_secs(seconds.min(15))
}

/// Samples a process's resident memory every 50 ms from its start until it is stopped: the
/// API server's, whose peak is only seen while a list is served.
struct PeakSampler {
    baseline: u64,
    peak: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PeakSampler {
    fn start(pid: u32) -> anyhow::Result<Self> {
        let baseline = super::probe::sample(pid)?.rss_bytes;
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(baseline));
        let task = tokio::spawn({
            let peak = peak.clone();
            async move {
                loop {
                    if let Ok(sample) = super::probe::sample(pid) {
                        peak.fetch_max(sample.rss_bytes, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        Ok(Self {
            baseline,
            peak,
            task,
        })
    }

    /// The peak above the resident memory at the start, in MiB.
    fn stop(self) -> f64 {
        self.task.abort();
        mib(self
            .peak
            .load(Ordering::Relaxed)
            .saturating_sub(self.baseline))
    }
}

/// The local cluster's API server's process id.
fn api_server_pid() -> anyhow::Result<u32> {
    let state = localcluster::LocalCluster::from_env()
        .and_then(|local| local.running())
        .context("finding the running local cluster")?;
    state
        .components
        .iter()
        .find(|component| component.name == "kube-apiserver")
        .map(|component| component.pid)
        .context("the local cluster runs no kube-apiserver")
}

/// Scales the Memcacheds one after another between `size` and `size + 1`, ten a second, until
/// `stop`; failures (a manager restarting does not matter, the API server is up) are skipped.
async fn scale_continuously(targets: Vec<Target>, size: i32, stop: Arc<AtomicBool>) {
    let mut round = 0_usize;
    while !stop.load(Ordering::SeqCst) {
        for Target { api, name, .. } in &targets {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let target = size + i32::from(round.is_multiple_of(2));
            let patch = json!({"spec": {"size": target}});
            let _ = api
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        round += 1;
    }
}

/// The Memcacheds left out of the scaling: `probe` is changed at each stop, `live` as the new
/// leader leads.
#[derive(Clone, Copy)]
struct Changed<'a> {
    probe: &'a Target,
    live: &'a [Target],
}

/// The graceful and crash handovers of `--failover-rounds` rounds each, under the tenants'
/// Memcacheds.
async fn rounds(
    cluster: &TestCluster,
    contender: &Contender,
    kubeconfig: &ServiceAccountKubeconfig,
    tenants: &Tenants,
    changed: &Changed<'_>,
    args: &BenchArgs,
) -> anyhow::Result<Rounds> {
    let Changed { probe, live } = *changed;
    let objects = tenants.targets().len();
    let lease = testkit::unique_name("bench-failover");
    let mut replicas = [
        spawn(contender, kubeconfig, &lease, REPLICAS[0]).await?,
        spawn(contender, kubeconfig, &lease, REPLICAS[1]).await?,
    ];
    for replica in &mut replicas {
        replica.wait_ready().await?;
    }
    let namespace = kubeconfig.namespace.as_str();
    let takes_over = LEASE_DURATION * 3;
    let api_server = api_server_pid()?;
    // The Memcacheds are "being scaled", not being created: the first leader gives each its
    // Deployment before the first stop, and the standby gets time to fill its caches.
    let began = Instant::now();
    every_memcached_deployed(cluster, tenants, objects, args.timeout()).await?;
    println!(
        "the first leader gave the {objects} Memcacheds their Deployments in {:.1} s",
        began.elapsed().as_secs_f64()
    );
    tokio::time::sleep(settle_time(objects)).await;

    let mut measured = Rounds::default();
    for round in 0..args.failover_rounds * 2 {
        let holder = wait_for_holder(
            cluster,
            namespace,
            &lease,
            |h| REPLICAS.contains(&h),
            takes_over,
        )
        .await?;
        let leader = usize::from(holder == REPLICAS[1]);
        let standby = REPLICAS[1 - leader];
        let is_crash = round % 2 == 1;
        measured
            .standby_rss_mib
            .push(rss_mib(&replicas[1 - leader]));
        measured.leader_rss_mib.push(rss_mib(&replicas[leader]));
        let api_server_memory = PeakSampler::start(api_server)?;
        let started = Instant::now();
        if is_crash {
            replicas[leader].process.kill().await?;
        } else {
            replicas[leader].process.terminate();
        }
        // A size the scaled Memcacheds never have, and the probe did not have in the round
        // before: each round's change is one to make.
        let size = args.size + 2 + i32::from(round % 2 == 1);
        let change = change_reaches_deployment(cluster, probe, size, started, takes_over * 2);
        let handover_and_live = async {
            wait_for_holder(cluster, namespace, &lease, |h| h == standby, takes_over).await?;
            let seconds = started.elapsed().as_secs_f64();
            let live = live_changes(cluster, live, size, takes_over * 2).await?;
            anyhow::Ok((seconds, live))
        };
        let ((seconds, (live, live_missed)), changed) =
            tokio::try_join!(handover_and_live, change)?;
        let kind = if is_crash { "crash" } else { "graceful" };
        let live_max = live.iter().copied().fold(f64::NAN, f64::max);
        let changed_text =
            changed.map_or_else(|| "never".to_owned(), |s| format!("after {s:.3} s"));
        println!(
            "{kind} handover {}: {seconds:.3} s, the change made at the stop written {changed_text}, {} changes made as it led written within {live_max:.3} s",
            round / 2 + 1,
            live.len()
        );
        let exit = replicas[leader]
            .process
            .wait_timeout(Duration::from_secs(40))
            .await?;
        let exited_well = match exit {
            // A graceful stop releases the Lease and exits 0.
            Some(status) if !is_crash => status.success(),
            Some(_) => true,
            None => {
                replicas[leader].process.kill().await?;
                false
            }
        };
        let bound = if is_crash {
            LEASE_DURATION.as_secs_f64() + 1.0
        } else {
            1.0
        };
        let slow = changed.is_none_or(|changed| changed > bound) || live_missed > 0;
        if !exited_well || slow {
            println!(
                "  the stopped replica {} exited with {exit:?}; the end of its log ({}):\n{}",
                REPLICAS[leader],
                replicas[leader].process.log().display(),
                indent(&tail(&replicas[leader].process.log_text(), 30))
            );
        }
        let (handovers, changes, lives, missed) = if is_crash {
            let m = &mut measured;
            (
                &mut m.crash,
                &mut m.crash_change,
                &mut m.crash_live,
                &mut m.crash_missed,
            )
        } else {
            let m = &mut measured;
            (
                &mut m.graceful,
                &mut m.graceful_change,
                &mut m.graceful_live,
                &mut m.graceful_missed,
            )
        };
        handovers.push(seconds);
        changes.extend(changed);
        lives.extend(live);
        missed.change += usize::from(changed.is_none());
        missed.live += live_missed;
        // Bring the stopped replica back as the new standby, like the kubelet would, and wait
        // until it is ready (connected, watching the Lease) before the next round.
        replicas[leader] = spawn(contender, kubeconfig, &lease, REPLICAS[leader]).await?;
        replicas[leader].wait_ready().await?;
        tokio::time::sleep(settle_time(objects)).await;
        let rise = api_server_memory.stop();
        let (new_leader, restarted) = (
            peak_rss_mib(&replicas[1 - leader]),
            peak_rss_mib(&replicas[leader]),
        );
        println!(
            "  peak memory: the new leader {new_leader:.1} MiB, the restarted standby {restarted:.1} MiB, the API server {rise:+.1} MiB over the round"
        );
        measured.api_server_rise_mib.push(rise);
        measured.new_leader_peak_rss_mib.push(new_leader);
        measured.restarted_peak_rss_mib.push(restarted);
    }
    for replica in &mut replicas {
        replica.process.terminate();
        if replica
            .process
            .wait_timeout(Duration::from_secs(40))
            .await?
            .is_none()
        {
            replica.process.kill().await?;
        }
    }
    Ok(measured)
}

/// One manager replica and its health-probe port.
struct Replica {
    process: ManagerProcess,
    probes: u16,
}

impl Replica {
    /// Waits until `/readyz` answers 200: connected to the API server and standing by.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let port = self.probes;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if ready(port).await {
                return Ok(());
            }
            if let Some(status) = self.process.try_exit_status()? {
                anyhow::bail!(
                    "a restarted replica exited with {status}:\n{}",
                    tail(&self.process.log_text(), 30)
                );
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "a restarted replica was not ready within 60 s:\n{}",
                tail(&self.process.log_text(), 30)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether `GET /readyz` on 127.0.0.1:`port` answers 200.
async fn ready(port: u16) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let request = b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    let mut response = String::new();
    stream.write_all(request).await.is_ok()
        && stream.read_to_string(&mut response).await.is_ok()
        && response.lines().next().is_some_and(|l| l.contains(" 200"))
}

async fn spawn(
    contender: &Contender,
    kubeconfig: &ServiceAccountKubeconfig,
    lease: &str,
    identity: &str,
) -> anyhow::Result<Replica> {
    let lease_arg = format!("--leader-election-id={lease}");
    let namespace = format!("--leader-election-namespace={}", kubeconfig.namespace);
    let metrics_port = testkit::free_port()?;
    let metrics = format!("--metrics-bind-address=127.0.0.1:{metrics_port}");
    let probes = testkit::free_port_other_than(&[metrics_port])?;
    let probes_arg = format!("--health-probe-bind-address=127.0.0.1:{probes}");
    // Logs at info level for both (no `extra_args`): a slow round prints the log's tail.
    let flags = [
        "--leader-elect",
        &lease_arg,
        &namespace,
        &metrics,
        &probes_arg,
        "--log-format=json",
    ];
    let process = testkit::spawn_manager_binary(
        &contender.binary,
        &kubeconfig.path,
        &flags,
        &[("POD_NAME", identity), ("RUST_LOG", "info")],
    )
    .await?;
    Ok(Replica { process, probes })
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::Spread;

    #[test]
    fn spread_of_samples() {
        let s = Spread::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(s.samples, [1.0, 2.0, 3.0]);
        assert_eq!(s.p99, 3.0, "below 100 samples, the maximum");
        assert!(Spread::of(Vec::new()).median.is_nan());
        let hundreds = Spread::of((1..=200).map(f64::from).collect());
        assert_eq!(hundreds.p99, 198.0);
    }
}
