//! Failover: how long until the standby leads, after the leader is stopped gracefully
//! (SIGTERM: it releases the Lease) or killed (SIGKILL: the Lease must expire).

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use testkit::{ManagerProcess, ServiceAccountKubeconfig, TestCluster};

use super::workload::wait_for_holder;

/// Identities of the two managers (`POD_NAME` is the holder identity, as in-cluster).
const REPLICAS: [&str; 2] = ["bench-replica-a", "bench-replica-b"];
/// client-go's defaults, which the manager also uses.
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// Minimum, median and maximum of a set of handover times, in seconds.
#[derive(Clone, Debug, Serialize)]
pub struct Spread {
    pub samples: Vec<f64>,
    pub min: f64,
    pub median: f64,
    pub max: f64,
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

#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    /// SIGTERM on the leader until the standby holds the Lease.
    pub graceful: Spread,
    /// SIGKILL on the leader until the standby holds the Lease.
    pub crash: Spread,
}

pub async fn measure(
    cluster: &TestCluster,
    binary: &Path,
    kubeconfig: &ServiceAccountKubeconfig,
    rounds: usize,
) -> anyhow::Result<Failover> {
    let lease = testkit::unique_name("bench-failover");
    let mut replicas = [
        spawn(binary, kubeconfig, &lease, REPLICAS[0]).await?,
        spawn(binary, kubeconfig, &lease, REPLICAS[1]).await?,
    ];
    let namespace = kubeconfig.namespace.as_str();
    let takes_over = LEASE_DURATION * 3;

    let mut graceful = Vec::new();
    let mut crash = Vec::new();
    for round in 0..rounds * 2 {
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
        let started = Instant::now();
        if is_crash {
            replicas[leader].kill().await?;
        } else {
            replicas[leader].terminate();
        }
        wait_for_holder(cluster, namespace, &lease, |h| h == standby, takes_over).await?;
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{} handover {}: {seconds:.3} s",
            if is_crash { "crash" } else { "graceful" },
            round / 2 + 1
        );
        if is_crash {
            crash.push(seconds)
        } else {
            graceful.push(seconds)
        }
        if replicas[leader]
            .wait_timeout(Duration::from_secs(40))
            .await?
            .is_none()
        {
            replicas[leader].kill().await?;
        }
        // Bring the stopped replica back as the new standby, like the kubelet would.
        replicas[leader] = spawn(binary, kubeconfig, &lease, REPLICAS[leader]).await?;
        // Let it reach its watch on the Lease before the next round.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    for replica in &mut replicas {
        replica.terminate();
        if replica
            .wait_timeout(Duration::from_secs(40))
            .await?
            .is_none()
        {
            replica.kill().await?;
        }
    }
    Ok(Failover {
        graceful: Spread::of(graceful),
        crash: Spread::of(crash),
    })
}

async fn spawn(
    binary: &Path,
    kubeconfig: &ServiceAccountKubeconfig,
    lease: &str,
    identity: &str,
) -> anyhow::Result<ManagerProcess> {
    let lease_arg = format!("--leader-election-id={lease}");
    let namespace = format!("--leader-election-namespace={}", kubeconfig.namespace);
    let metrics = format!("--metrics-bind-address=127.0.0.1:{}", testkit::free_port()?);
    let probes = format!(
        "--health-probe-bind-address=127.0.0.1:{}",
        testkit::free_port()?
    );
    Ok(testkit::spawn_manager_binary(
        binary,
        &kubeconfig.path,
        &[
            "--leader-elect",
            &lease_arg,
            &namespace,
            &metrics,
            &probes,
            "--log-format=json",
        ],
        &[("POD_NAME", identity), ("RUST_LOG", "warn")],
    )
    .await?)
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
