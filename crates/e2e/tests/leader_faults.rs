//! Never two leaders, proven from the API server's own record.
//!
//! Three replicas of the manager run against a cluster of this test's own, each through a
//! loopback proxy the test controls, while a few hundred Memcacheds are created, scaled and
//! deleted. The test injects faults into whichever replica leads (SIGTERM, SIGKILL, SIGSTOP for
//! the lease duration plus 5 s, a cut connection) and into the API server (a restart), edits
//! the Lease by hand as a confused user would, holds a leader's write in a slow admission
//! webhook while the leader freezes, and plays the kubelet: a replica that exits is started
//! again under the same name.
//!
//! Each replica authenticates as a pod of the manager's ServiceAccount, with a token bound to a
//! pod of its name, so the generated leader fence (`deploy/leader-fence/`, a
//! ValidatingAdmissionPolicy whose parameter is the Lease) judges its writes as it would in a
//! cluster. Then the test reads the API server's
//! audit log and checks, by when the API server committed each write it accepted:
//! - that none was committed while another replica held the Lease (zero tolerance);
//! - that none was committed after a hand edit or a release of the Lease, or arrived past the
//!   renew deadline of its replica's last renewal, beyond a bound it prints;
//! - that each held write was refused by the fence;
//! - that no replica sent a status write that changed nothing right after its own last one
//!   (a reconcile that started from a cache older than its own write would);
//!
//! and that every Memcached converges, and no graceful handover waited for the Lease to expire.
//!
//! `LEADER_FAULT_ROUNDS` (default 10) sets how often each fault is injected.

mod held_admission;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use nix::sys::signal::Signal;
use serde_json::json;
use testkit::{ManagerProcess, PrivateCluster, TcpProxy, TestNamespace};

const REPLICAS: usize = 3;
/// How often the harness restarts exited replicas before it calls them crash-looping.
const SUPERVISE_ROUNDS: usize = 3;
const LEASE_DURATION: Duration = Duration::from_secs(6);
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// How long a frozen leader stays frozen: past the lease, so a standby takes over meanwhile.
const FREEZE: Duration = Duration::from_secs(6 + 5);
/// Memcacheds kept in the namespace while the faults happen.
const MEMCACHEDS: usize = 200;
/// How long after a hand edit or a release of the Lease a replica's accepted write may still
/// commit, and how long past its renew deadline one may arrive: the API server's fence learns of
/// an edit through its cache, and a request sent before the deadline is on its way. A write
/// committed while another replica leads has no allowance at all.
const IN_FLIGHT_BOUND: Duration = Duration::from_secs(1);
/// How long the slow webhook holds a leader's write, at least (and never until a standby leads).
const HOLD: Duration = Duration::from_secs(8);
/// How long the API server's fence may take to see a new holder, once the test has seen it.
const FENCE_CACHE_DELAY: Duration = Duration::from_millis(500);
/// Rounds that include a write held in admission.
const HELD_ROUNDS: usize = 3;
/// Marks the manager's log line that counts fenced writes at exit.
const FENCE_SUMMARY: &str = "the leader-election fence refused controller writes";

/// One replica: a stable name (its identity, like a pod name), its own proxy to the API
/// server, and the process currently running under that name.
struct Replica {
    name: String,
    proxy: TcpProxy,
    kubeconfig: PathBuf,
    lease: String,
    process: Option<ManagerProcess>,
    probes: u16,
}

impl Replica {
    async fn start(&mut self) -> Result<()> {
        let metrics = testkit::free_port()?;
        self.probes = testkit::free_port_other_than(&[metrics])?;
        let args = [
            "--leader-elect".to_owned(),
            format!("--leader-election-id={}", self.lease),
            format!("--lease-duration={}s", LEASE_DURATION.as_secs()),
            format!("--renew-deadline={}s", RENEW_DEADLINE.as_secs()),
            format!("--retry-period={}s", RETRY_PERIOD.as_secs()),
            format!("--metrics-bind-address=127.0.0.1:{metrics}"),
            format!("--health-probe-bind-address=127.0.0.1:{}", self.probes),
            "--log-format=json".to_owned(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let process =
            testkit::spawn_manager(&self.kubeconfig, &args, &[("POD_NAME", self.name.as_str())])
                .await?;
        println!("{}: log {}", self.name, process.log().display());
        self.process = Some(process);
        Ok(())
    }

    fn process(&mut self) -> Result<&mut ManagerProcess> {
        self.process
            .as_mut()
            .with_context(|| format!("{} is not running", self.name))
    }

    fn signal(&mut self, signal: Signal) -> Result<()> {
        let name = self.name.clone();
        let pid = self
            .process()?
            .id()
            .with_context(|| format!("{name} has exited"))?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, signal).with_context(|| format!("{signal} to {name}"))?;
        Ok(())
    }

    /// Waits until the replica answers `/readyz`: `Some(status)` instead if it exits first.
    async fn wait_ready(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let start = Instant::now();
        loop {
            let (name, probes) = (self.name.clone(), self.probes);
            let process = self.process()?;
            if let Some(status) = process.try_exit_status()? {
                return Ok(Some(status));
            }
            let ready = localcluster::http::get_ok([127, 0, 0, 1].into(), probes, "/readyz");
            if ready.await.is_ok() {
                return Ok(None);
            }
            if start.elapsed() > timeout {
                bail!(
                    "{name} not ready after {timeout:?}:\n{}",
                    process.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits up to `timeout` for the process to exit; its status and fenced-write count.
    async fn wait_exit(&mut self, timeout: Duration) -> Result<(ExitStatus, u64)> {
        let name = self.name.clone();
        let process = self.process()?;
        let Some(status) = process.wait_timeout(timeout).await? else {
            bail!(
                "{name} still runs {timeout:?} later:\n{}",
                tail(&process.log_text(), 30)
            );
        };
        let fenced = fenced_writes(&process.log_text());
        self.process = None;
        Ok((status, fenced))
    }
}

/// The count in the manager's exit line about fenced writes (0 when it logged none).
fn fenced_writes(log: &str) -> u64 {
    log.lines()
        .filter(|line| line.contains(FENCE_SUMMARY))
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|v| v["refused"].as_u64())
        .sum()
}

/// How long from `earlier` to `later` (zero if `later` is not later).
fn after(later: Timestamp, earlier: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or_default()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A fault, or a hand edit of the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Terminate,
    Kill,
    Freeze,
    ApiserverRestart,
    Cut,
    EditHolder,
    DeleteLease,
    EditDuration(i32),
    HeldWrite,
}

impl Fault {
    fn describe(self) -> String {
        match self {
            Self::Terminate => "SIGTERM of the leader".to_owned(),
            Self::Kill => "SIGKILL of the leader".to_owned(),
            Self::Freeze => format!("SIGSTOP of the leader for {}s", FREEZE.as_secs()),
            Self::ApiserverRestart => "API server restart".to_owned(),
            Self::Cut => "the leader's connection cut".to_owned(),
            Self::EditHolder => "Lease edited to another holder".to_owned(),
            Self::DeleteLease => "Lease deleted".to_owned(),
            Self::EditDuration(seconds) => format!("Lease edited to a {seconds}s duration"),
            Self::HeldWrite => format!(
                "a write held {}s in admission, its leader frozen",
                HOLD.as_secs()
            ),
        }
    }
}

/// What one fault did.
struct Outcome {
    fault: Fault,
    /// When it was injected, on the API server's clock (the same machine's).
    began: Timestamp,
    old_leader: String,
    new_leader: String,
    handover: Duration,
    fenced: u64,
    note: String,
}

struct Harness {
    private: PrivateCluster,
    replicas: Vec<Replica>,
    leases: Api<Lease>,
    lease: String,
    memcacheds: Api<DynamicObject>,
    admission: held_admission::HeldAdmission,
    /// Each held write: the replica that sent it and the Memcached it was for.
    held: Vec<(String, String)>,
}

impl Harness {
    fn replica(&mut self, name: &str) -> Result<&mut Replica> {
        self.replicas
            .iter_mut()
            .find(|r| r.name == name)
            .with_context(|| format!("no replica named {name:?}"))
    }

    /// The pod name of the Lease's holder, if the API server answers.
    async fn holder(&self) -> Option<String> {
        let lease = self.leases.get_opt(&self.lease).await.ok()??;
        let holder = lease.spec?.holder_identity.filter(|h| !h.is_empty())?;
        Some(testkit::identity_pod(&holder).to_owned())
    }

    /// Waits for a replica other than `old` (any replica when `None`) to hold the Lease; the
    /// holder and when it was seen.
    async fn wait_new_holder(
        &self,
        old: Option<&str>,
        timeout: Duration,
    ) -> Result<(String, Instant)> {
        let start = Instant::now();
        let names: BTreeSet<&str> = self.replicas.iter().map(|r| r.name.as_str()).collect();
        loop {
            if let Some(holder) = self.holder().await
                && names.contains(holder.as_str())
                && Some(holder.as_str()) != old
            {
                return Ok((holder, Instant::now()));
            }
            if start.elapsed() > timeout {
                bail!(
                    "no replica other than {old:?} took the Lease within {timeout:?} (holder: {:?})",
                    self.holder().await
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits for a replica to write the Lease as its holder after `since` (after an outage,
    /// the Lease still names the holder from before); the holder and when it was seen.
    async fn wait_renewed_since(
        &self,
        since: Timestamp,
        timeout: Duration,
    ) -> Result<(String, Instant)> {
        let start = Instant::now();
        loop {
            let lease = self.leases.get_opt(&self.lease).await.ok().flatten();
            let spec = lease.and_then(|l| l.spec).unwrap_or_default();
            let renewed = spec.renew_time.map(|t| t.0);
            if let Some(holder) = spec.holder_identity
                && let holder = testkit::identity_pod(&holder).to_owned()
                && self.replicas.iter().any(|r| r.name == holder)
                && renewed.is_some_and(|t| t > since)
            {
                return Ok((holder, Instant::now()));
            }
            if start.elapsed() > timeout {
                bail!("no replica renewed the Lease within {timeout:?} after the outage");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// As the kubelet: starts every replica whose process exited, then waits until all are
    /// ready, starting again any that exits meanwhile (an old leader may still be on its way out
    /// when the new one leads). Returns the exit statuses seen.
    async fn supervise(&mut self) -> Result<Vec<(String, ExitStatus)>> {
        let mut exited = Vec::new();
        for _ in 0..SUPERVISE_ROUNDS {
            for replica in &mut self.replicas {
                let status = match replica.process.as_mut() {
                    Some(process) => process.try_exit_status()?,
                    None => None,
                };
                if let Some(status) = status {
                    replica.process = None;
                    exited.push((replica.name.clone(), status));
                }
                if replica.process.is_none() {
                    replica.start().await?;
                }
            }
            let mut all_ready = true;
            for replica in &mut self.replicas {
                if replica.wait_ready(Duration::from_secs(60)).await?.is_some() {
                    all_ready = false;
                }
            }
            if all_ready {
                return Ok(exited);
            }
        }
        let (name, status) = exited.last().cloned().unzip();
        bail!(
            "replicas kept exiting after {SUPERVISE_ROUNDS} restarts each (last: {} with {})",
            name.unwrap_or_default(),
            status.map(|s| s.to_string()).unwrap_or_default()
        )
    }

    async fn inject(&mut self, fault: Fault) -> Result<Outcome> {
        let (old, _) = self.wait_new_holder(None, Duration::from_secs(60)).await?;
        let started = Instant::now();
        let began = Timestamp::now();
        let mut fenced = 0;
        let mut note = String::new();
        let new = match fault {
            Fault::Terminate => {
                self.replica(&old)?.signal(Signal::SIGTERM)?;
                let new = self.wait_new_holder(Some(&old), LEASE_DURATION * 3).await?;
                let (status, count) = self
                    .replica(&old)?
                    .wait_exit(Duration::from_secs(40))
                    .await?;
                ensure!(status.success(), "{old} exited with {status} after SIGTERM");
                fenced = count;
                new
            }
            Fault::Kill => {
                let replica = self.replica(&old)?;
                replica.process()?.kill().await?;
                replica.process = None;
                self.wait_new_holder(Some(&old), LEASE_DURATION * 3).await?
            }
            Fault::Freeze => {
                self.replica(&old)?.signal(Signal::SIGSTOP)?;
                let new = self.wait_new_holder(Some(&old), FREEZE).await;
                (fenced, note) = self.thaw(&old, started).await?;
                new?
            }
            Fault::HeldWrite => {
                let name = format!("held-{}", self.held.len());
                testkit::create_memcached(&self.memcacheds, &name, 1).await?;
                let held = self.admission.next(Duration::from_secs(30)).await?;
                ensure!(
                    held.name == name && held.pod == old,
                    "the webhook held a write for {} from {:?}, not {name}'s from the leader {old}",
                    held.name,
                    held.pod
                );
                self.replica(&old)?.signal(Signal::SIGSTOP)?;
                let frozen = Instant::now();
                let new = self.wait_new_holder(Some(&old), FREEZE).await;
                tokio::time::sleep_until((frozen + HOLD).into()).await;
                tokio::time::sleep(FENCE_CACHE_DELAY).await;
                held.release();
                self.held.push((old.clone(), name));
                (fenced, note) = self.thaw(&old, frozen).await?;
                new?
            }
            Fault::ApiserverRestart => {
                self.private
                    .local()
                    .restart_apiserver(Duration::from_secs(2))
                    .await?;
                let back = Instant::now();
                let new = self
                    .wait_renewed_since(Timestamp::now(), LEASE_DURATION * 5)
                    .await?;
                note = format!(
                    "API server back after {:.1}s, Lease renewed {:.2}s later",
                    back.duration_since(started).as_secs_f64(),
                    new.1.saturating_duration_since(back).as_secs_f64()
                );
                new
            }
            Fault::Cut => {
                self.replica(&old)?.proxy.cut().await;
                let new = self.wait_new_holder(Some(&old), LEASE_DURATION * 3).await;
                let replica = self.replica(&old)?;
                let exit = replica.wait_exit(RENEW_DEADLINE * 3).await;
                replica.proxy.restore().await;
                let (status, count) = exit?;
                ensure!(
                    !status.success(),
                    "{old} lost its connection but exited with {status}"
                );
                fenced = count;
                new?
            }
            Fault::EditHolder | Fault::DeleteLease | Fault::EditDuration(_) => {
                self.edit_lease(fault).await?;
                let settled = self.wait_new_holder(None, LEASE_DURATION * 4).await?;
                if let Some(process) = self.replica(&old)?.process.as_mut()
                    && let Some(status) = process.try_exit_status()?
                {
                    note = format!("{old} exited with {status}");
                }
                settled
            }
        };
        let (new, seen) = new;
        let handover = seen.saturating_duration_since(started);
        for (name, status) in self.supervise().await? {
            if name != old {
                note.push_str(&format!("; {name} also exited with {status}"));
            }
        }
        Ok(Outcome {
            fault,
            began,
            old_leader: old,
            new_leader: new,
            handover,
            fenced,
            note,
        })
    }

    /// Wakes the frozen `old` leader once [`FREEZE`] has passed since `frozen`, and waits for it
    /// to exit on finding its Lease lost; its fenced-write count and how long that took.
    async fn thaw(&mut self, old: &str, frozen: Instant) -> Result<(u64, String)> {
        tokio::time::sleep_until((frozen + FREEZE).into()).await;
        let replica = self.replica(old)?;
        replica.signal(Signal::SIGCONT)?;
        let woke = Instant::now();
        let (status, fenced) = replica.wait_exit(Duration::from_secs(10)).await?;
        ensure!(
            !status.success(),
            "{old} woke to a lost Lease but exited with {status}"
        );
        let note = format!("exited {:.2}s after waking", woke.elapsed().as_secs_f64());
        Ok((fenced, note))
    }

    async fn edit_lease(&self, fault: Fault) -> Result<()> {
        let patch = match fault {
            Fault::EditHolder => json!({ "spec": { "holderIdentity": "intruder" } }),
            Fault::EditDuration(seconds) => json!({ "spec": { "leaseDurationSeconds": seconds } }),
            Fault::DeleteLease => {
                self.leases
                    .delete(&self.lease, &DeleteParams::default())
                    .await?;
                return Ok(());
            }
            other => bail!("{other:?} is not an edit"),
        };
        self.leases
            .patch(&self.lease, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_write_outside_the_lease_under_faults() -> Result<()> {
    let rounds: usize = std::env::var("LEADER_FAULT_ROUNDS")
        .ok()
        .map(|v| v.parse())
        .transpose()
        .context("LEADER_FAULT_ROUNDS must be a number")?
        .unwrap_or(10);
    let private = PrivateCluster::start("leader-faults").await?;
    let cluster = private.test().clone();
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    // The API server's fence, opt-in: this cluster is the test's own and keeps its binding.
    testkit::apply_dir(&cluster.client, &testkit::deploy_dir().join("leader-fence")).await?;
    let namespace = TestNamespace::create(&cluster, "faults").await?;
    // The Lease the generated fence's binding names: this cluster is the test's own.
    let lease = codegen::LEADER_ELECTION_ID.to_owned();
    let upstream = testkit::server_addr(&cluster.state.server)?;

    let mut replicas = Vec::new();
    for index in 0..REPLICAS {
        let name = format!("replica-{index}");
        let proxy = TcpProxy::start(upstream).await?;
        let kubeconfig = private.scratch_dir().join(format!("{name}.kubeconfig"));
        let pod = testkit::pod_kubeconfig(&cluster, &identity, &name).await?;
        testkit::kubeconfig_via(&pod.path, &proxy.url(), &kubeconfig)?;
        replicas.push(Replica {
            name,
            proxy,
            kubeconfig,
            lease: lease.clone(),
            process: None,
            probes: 0,
        });
    }
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), &identity.namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        namespace.name(),
        &testkit::memcached_resource(),
    );
    let held_names: Vec<String> = (0..HELD_ROUNDS).map(|i| format!("held-{i}")).collect();
    let admission =
        held_admission::HeldAdmission::start(&cluster.client, namespace.name(), &held_names)
            .await?;
    let mut harness = Harness {
        private,
        replicas,
        leases,
        lease: lease.clone(),
        memcacheds: api.clone(),
        admission,
        held: Vec::new(),
    };
    harness.supervise().await?;

    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace.name());
    for index in 0..MEMCACHEDS {
        testkit::create_memcached(&api, &format!("mc-{index}"), 1 + index % 3).await?;
    }
    let (stop_churn, stopped) = tokio::sync::watch::channel(false);
    let churning = tokio::spawn(testkit::churn(api.clone(), MEMCACHEDS, stopped));

    let mut plan = Vec::new();
    for round in 0..rounds {
        plan.extend([
            Fault::Terminate,
            Fault::Kill,
            Fault::Freeze,
            Fault::ApiserverRestart,
            Fault::Cut,
        ]);
        if round < HELD_ROUNDS {
            plan.push(Fault::HeldWrite);
        }
        if round < 2 {
            plan.extend([
                Fault::EditHolder,
                Fault::DeleteLease,
                Fault::EditDuration(1),
                Fault::EditDuration(i32::MAX),
            ]);
        }
    }
    let mut outcomes = Vec::new();
    let began = Instant::now();
    for (index, fault) in plan.iter().enumerate() {
        let outcome = harness.inject(*fault).await.with_context(|| {
            format!(
                "fault {} of {}: {}",
                index + 1,
                plan.len(),
                fault.describe()
            )
        })?;
        println!(
            "fault {:>2}/{}: {:<40} {} -> {} in {:>5.2}s, fenced writes {}{}",
            index + 1,
            plan.len(),
            outcome.fault.describe(),
            outcome.old_leader,
            outcome.new_leader,
            outcome.handover.as_secs_f64(),
            outcome.fenced,
            if outcome.note.is_empty() {
                String::new()
            } else {
                format!(" ({})", outcome.note)
            }
        );
        outcomes.push(outcome);
    }
    let _ = stop_churn.send(true);
    let (changes, errors) = churning.await?;
    println!(
        "{} faults in {:.0}s; the workload made {changes} changes ({errors} refused or failed)",
        outcomes.len(),
        began.elapsed().as_secs_f64()
    );
    testkit::wait_all_converged(&api, &deployments, Duration::from_secs(180)).await?;
    let count = api.list(&ListParams::default()).await?.items.len();
    println!("all {count} Memcacheds converged");

    // Stop every replica gracefully, so the audit log ends with a release.
    for replica in &mut harness.replicas {
        if replica.process.is_some() {
            replica.signal(Signal::SIGTERM)?;
        }
    }
    for replica in &mut harness.replicas {
        if replica.process.is_some() {
            let (status, _) = replica.wait_exit(Duration::from_secs(40)).await?;
            ensure!(
                status.success(),
                "{} exited with {status} at the end",
                replica.name
            );
        }
    }

    // The verdict, from the audit log alone.
    let files = cluster.state.audit_log_files()?;
    let events = testkit::read_audit_files(&files)?;
    let names: BTreeSet<String> = harness.replicas.iter().map(|r| r.name.clone()).collect();
    let report = testkit::check_fencing(
        &events,
        &identity.namespace,
        &lease,
        RENEW_DEADLINE,
        |agent| {
            testkit::manager_identity(agent).filter(|id| names.contains(testkit::identity_pod(id)))
        },
    );
    for (name, history) in &report.replicas {
        println!(
            "{name}: {} tenures, {} writes accepted, {} refused, {} late",
            history.tenures.len(),
            history.writes,
            history.refused,
            history.late.len()
        );
    }
    // Events change no object, and the API server's fence does not cover them: one handed to
    // the HTTP connection just before the process froze goes out when it wakes, after the
    // client's fence would refuse it. They are counted, not judged.
    let (late_events, late): (Vec<_>, Vec<_>) = report
        .late_writes()
        .partition(|w| w.request_uri.starts_with("/apis/events.k8s.io/"));
    println!(
        "Events written outside their replica's tenure (not judged): {}",
        late_events.len()
    );
    // Which fault each late write followed, so a failure names what to look at.
    let described = |write: &testkit::LateWrite| {
        let during = outcomes
            .iter()
            .enumerate()
            .rev()
            .find(|(_, o)| o.began <= write.received)
            .map(|(index, o)| format!("fault {} ({})", index + 1, o.fault.describe()))
            .unwrap_or_else(|| "before the first fault".to_owned());
        format!(
            "{} {} {} received {} committed {} ({:?}{}, {:.3}s beyond), after {during}",
            write.identity,
            write.verb,
            write.request_uri,
            write.received,
            write.committed,
            write.breach,
            write
                .holder
                .as_deref()
                .map(|h| format!(" of {h}"))
                .unwrap_or_default(),
            write.beyond.as_secs_f64()
        )
    };
    let total_writes: usize = report.replicas.values().map(|r| r.writes).sum();
    ensure!(
        total_writes > 0,
        "the audit log holds no write of any replica: is the audit log on, and the user agent set?"
    );
    // Two leaders at once: a write committed while another replica held the Lease.
    let split: Vec<&&testkit::LateWrite> = late
        .iter()
        .filter(|w| w.breach == testkit::Breach::OtherHolder)
        .filter(|w| {
            w.holder
                .as_deref()
                .is_some_and(|h| names.contains(testkit::identity_pod(h)))
        })
        .collect();
    let bounded = late
        .iter()
        .filter(|w| !split.iter().any(|s| std::ptr::eq(**s, **w)))
        .map(|w| w.beyond)
        .max()
        .unwrap_or_default();
    println!(
        "accepted writes committed while another replica led: {}; others outside their \
         replica's tenure or past its renew deadline: {} (worst {:.3}s, allowed {:?})",
        split.len(),
        late.len() - split.len(),
        bounded.as_secs_f64(),
        IN_FLIGHT_BOUND
    );
    if !late.is_empty() {
        for (name, history) in &report.replicas {
            for tenure in &history.tenures {
                println!(
                    "  tenure of {name}: {} until {:?}",
                    tenure.from, tenure.until
                );
            }
        }
    }
    for write in late.iter().take(20) {
        println!("  {}", described(write));
    }
    ensure!(
        split.is_empty(),
        "a replica's write was committed while another replica held the Lease:\n  {}",
        split
            .iter()
            .take(5)
            .map(|w| described(w))
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    if bounded > IN_FLIGHT_BOUND {
        let mut beyond: Vec<&&testkit::LateWrite> =
            late.iter().filter(|w| w.beyond > IN_FLIGHT_BOUND).collect();
        beyond.sort_by_key(|w| std::cmp::Reverse(w.beyond));
        let worst: Vec<String> = beyond.iter().take(5).map(|w| described(w)).collect();
        bail!(
            "a replica wrote {:.3}s outside its leadership ({} writes beyond {IN_FLIGHT_BOUND:?}; \
             the worst:\n  {})",
            bounded.as_secs_f64(),
            beyond.len(),
            worst.join("\n  ")
        );
    }
    // Each held write reached the API server before the takeover and was refused after it.
    for (writer, name) in &harness.held {
        let attempts: Vec<&testkit::AuditEvent> = events
            .iter()
            .filter(|e| e.resource == "deployments" && &e.name == name)
            .filter(|e| {
                testkit::manager_identity(&e.user_agent)
                    .is_some_and(|id| testkit::identity_pod(&id) == writer)
            })
            .collect();
        let held = attempts
            .iter()
            .find(|e| after(e.completed, e.received) >= HOLD)
            .with_context(|| format!("no write of {writer} for {name} was held {HOLD:?}"))?;
        println!(
            "held write of {writer} for {name}: answered {} after {:.2}s in admission",
            held.code,
            after(held.completed, held.received).as_secs_f64()
        );
        ensure!(
            !held.succeeded(),
            "the write {writer} sent for {name} before it froze was committed after a takeover"
        );
    }
    // No reconcile started from a cache older than its own controller's last write: a status
    // write that changed nothing right after the same replica's own would show one.
    let status_writes = testkit::repeated_status_writes(&events);
    println!(
        "status writes: {} checked, {} changed nothing after the same replica's own, {} changed \
         nothing after another replica's (a new leader's cache behind its predecessor's last write)",
        status_writes.checked,
        status_writes.repeats.len(),
        status_writes.after_another_replica
    );
    ensure!(
        status_writes.checked > 0,
        "the audit log holds no status write with its stored object: is the audit policy current?"
    );
    ensure!(
        status_writes.repeats.is_empty(),
        "reconciles started from a cache older than their own last write: {:?}",
        &status_writes.repeats[..status_writes.repeats.len().min(5)]
    );
    let waited: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.fault == Fault::Terminate && o.handover >= LEASE_DURATION)
        .collect();
    ensure!(
        waited.is_empty(),
        "graceful handovers waited for the Lease to expire: {:?}",
        waited
            .iter()
            .map(|o| o.handover.as_secs_f64())
            .collect::<Vec<_>>()
    );
    for fault in [
        Fault::Terminate,
        Fault::Kill,
        Fault::Freeze,
        Fault::ApiserverRestart,
        Fault::Cut,
        Fault::HeldWrite,
    ] {
        let times: Vec<f64> = outcomes
            .iter()
            .filter(|o| o.fault == fault)
            .map(|o| o.handover.as_secs_f64())
            .collect();
        let fenced: u64 = outcomes
            .iter()
            .filter(|o| o.fault == fault)
            .map(|o| o.fenced)
            .sum();
        let max = times.iter().copied().fold(0.0, f64::max);
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{:<40} {} rounds, handover min {min:.2}s max {max:.2}s, fenced writes {fenced}",
            fault.describe(),
            times.len()
        );
    }
    harness.admission.unregister().await?;
    drop(namespace);
    Ok(())
}
