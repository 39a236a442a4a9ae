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
}

/// What the rounds measured, each a sample per round.
#[derive(Default)]
struct Rounds {
    graceful: Vec<f64>,
    crash: Vec<f64>,
    graceful_change: Vec<f64>,
    crash_change: Vec<f64>,
    standby_rss_mib: Vec<f64>,
    leader_rss_mib: Vec<f64>,
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
    // The first Memcached is the one changed at each stop; the others are being scaled.
    let (probe, scaled) = tenants
        .targets()
        .split_first()
        .context("no Memcached to measure failover with")?;
    let stop_load = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(scale_continuously(
        scaled.to_vec(),
        args.size,
        stop_load.clone(),
    ));
    let measured = rounds(cluster, contender, kubeconfig, probe, args).await;
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
    })
}

/// Changes the size of `probe` to `size`, then waits until its Deployment has it: the time
/// from `since` until then, in seconds.
async fn change_reaches_deployment(
    cluster: &TestCluster,
    probe: &Target,
    size: i32,
    since: Instant,
    within: Duration,
) -> anyhow::Result<f64> {
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
            return Ok(since.elapsed().as_secs_f64());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the size of {} changed at the stop did not reach its Deployment within {within:?}",
            probe.key()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The resident memory of `replica` now, in MiB (NaN when it cannot be read).
fn rss_mib(replica: &Replica) -> f64 {
    let bytes = replica
        .process
        .id()
        .and_then(|pid| super::probe::sample(pid).ok())
        .map(|sample| sample.rss_bytes);
    #[allow(clippy::cast_precision_loss)] // MiB of a process fit an f64 exactly
    bytes.map_or(f64::NAN, |b| b as f64 / (1024.0 * 1024.0))
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

/// The graceful and crash handovers of `--failover-rounds` rounds each, with `probe` changed
/// at each stop.
async fn rounds(
    cluster: &TestCluster,
    contender: &Contender,
    kubeconfig: &ServiceAccountKubeconfig,
    probe: &Target,
    args: &BenchArgs,
) -> anyhow::Result<Rounds> {
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
        let handover = async {
            wait_for_holder(cluster, namespace, &lease, |h| h == standby, takes_over).await?;
            anyhow::Ok(started.elapsed().as_secs_f64())
        };
        let (seconds, changed) = tokio::try_join!(handover, change)?;
        let kind = if is_crash { "crash" } else { "graceful" };
        println!(
            "{kind} handover {}: {seconds:.3} s, the change made at the stop written after {changed:.3} s",
            round / 2 + 1
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
        let slow = changed
            > if is_crash {
                LEASE_DURATION.as_secs_f64() + 1.0
            } else {
                1.0
            };
        if !exited_well || slow {
            println!(
                "  the stopped replica {} exited with {exit:?}; the end of its log ({}):\n{}",
                REPLICAS[leader],
                replicas[leader].process.log().display(),
                indent(&tail(&replicas[leader].process.log_text(), 30))
            );
        }
        if is_crash {
            measured.crash.push(seconds);
            measured.crash_change.push(changed);
        } else {
            measured.graceful.push(seconds);
            measured.graceful_change.push(changed);
        }
        // Bring the stopped replica back as the new standby, like the kubelet would, and wait
        // until it is ready (connected, watching the Lease) before the next round.
        replicas[leader] = spawn(contender, kubeconfig, &lease, REPLICAS[leader]).await?;
        replicas[leader].wait_ready().await?;
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
        assert!(Spread::of(Vec::new()).median.is_nan());
    }
}
