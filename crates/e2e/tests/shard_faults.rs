//! One writer per object, proven from the API server's own record, while the replicas of a
//! sharded manager come, go, crash and freeze.
//!
//! Three replicas run with `--sharding` against a cluster of this test's own while a hundred
//! Memcacheds are scaled and replaced. The test stops one gracefully (SIGTERM), kills one
//! (SIGKILL), freezes one past its lease (SIGSTOP), scales 3→2→4 and restarts the API server;
//! like the kubelet, it starts a replica that exited again under the same name, except the one
//! scaled away. Then it reads the audit log: the holders' Lease as stored after each write says
//! which replica held which slot when, and every write a replica made for a Memcached (its
//! status, its Deployment, Service and PodDisruptionBudget) must have been committed while that
//! replica held the Memcached's slot. And every Memcached converges.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher;
use kube_operator_runtime::slots::{self, Slots, slot_of_uid};
use manager::sharding::Holders;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use testkit::{AuditEvent, ManagerProcess, PrivateCluster, TestNamespace};

const LEASE_DURATION: Duration = Duration::from_secs(6);
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// How long a frozen replica stays frozen: past its lease, so the others take its slots.
const FREEZE: Duration = Duration::from_secs(6 + 4);
/// Memcacheds kept in the namespace while the faults happen.
const MEMCACHEDS: usize = 100;
/// How long the live replicas may take to share every slot after a change.
const SHARE_TIMEOUT: Duration = Duration::from_secs(60);
/// The leader-election id: the prefix of the group's Leases.
const GROUP: &str = "shard-faults";

/// One replica: a stable name (its `POD_NAME`), and the process running under it.
struct Replica {
    name: String,
    process: Option<ManagerProcess>,
    /// The running process's identity in the group (its member Lease's holder).
    identity: Option<String>,
    metrics: u16,
    probes: u16,
}

impl Replica {
    /// Starts the replica's process and waits until `/readyz` answers 200 and it holds its
    /// member Lease.
    async fn start(&mut self, kubeconfig: &std::path::Path) -> Result<()> {
        self.metrics = testkit::free_port()?;
        self.probes = testkit::free_port_other_than(&[self.metrics])?;
        let args = [
            "--sharding".to_owned(),
            format!("--leader-election-id={GROUP}"),
            format!("--lease-duration={}s", LEASE_DURATION.as_secs()),
            format!("--renew-deadline={}s", RENEW_DEADLINE.as_secs()),
            format!("--retry-period={}s", RETRY_PERIOD.as_secs()),
            format!("--metrics-bind-address=127.0.0.1:{}", self.metrics),
            format!("--health-probe-bind-address=127.0.0.1:{}", self.probes),
            "--log-format=json".to_owned(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let process =
            testkit::spawn_manager(kubeconfig, &args, &[("POD_NAME", &self.name)]).await?;
        println!("{}: log {}", self.name, process.log().display());
        self.process = Some(process);
        self.identity = None;
        let started = Instant::now();
        loop {
            if let Some(status) = self.process()?.try_exit_status()? {
                bail!("{} exited with {status} while starting", self.name);
            }
            self.identity = self
                .identity
                .take()
                .or_else(|| member_identity(&self.process.as_ref()?.log_text()));
            let ready = http_get(self.probes, "/readyz")
                .await
                .is_ok_and(|(code, _)| code == 200);
            if ready && self.identity.is_some() {
                return Ok(());
            }
            ensure!(
                started.elapsed() < SHARE_TIMEOUT,
                "{} not ready after {SHARE_TIMEOUT:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The slots the holders' Lease gives this replica's running process.
    fn held(&self, holders: &Holders) -> Slots {
        match (&self.process, &self.identity) {
            (Some(_), Some(identity)) => holders.of(identity),
            _ => Slots::NONE,
        }
    }

    fn process(&mut self) -> Result<&mut ManagerProcess> {
        self.process
            .as_mut()
            .with_context(|| format!("{} is not running", self.name))
    }

    fn signal(&mut self, signal: Signal) -> Result<()> {
        let pid = self.process()?.id().context("the process has exited")?;
        kill(Pid::from_raw(i32::try_from(pid)?), signal)?;
        Ok(())
    }

    /// Waits for the process to exit; it is gone afterwards.
    async fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let status = self
            .process()?
            .wait_timeout(timeout)
            .await?
            .with_context(|| format!("{} did not exit within {timeout:?}", self.name))?;
        self.process = None;
        Ok(status)
    }

    /// The value of the gauge `name` in its metrics (0 when it does not answer).
    async fn gauge(&self, name: &str) -> f64 {
        let Ok((200, text)) = http_get(self.metrics, "/metrics").await else {
            return 0.0;
        };
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

/// `GET path` on a loopback port: the status code and the body.
async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .context("no status code")?;
    Ok((code, body.to_owned()))
}

/// The identity a replica's log says it holds its member Lease as.
fn member_identity(log: &str) -> Option<String> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["message"] == "acquired the member lease")
        .find_map(|line| line["identity"].as_str().map(str::to_owned))
}

/// Waits until the running replicas at `indexes` each hold some slots and all 64 together,
/// and returns how long that took as the holders' Lease says it (the moment the ranges
/// moved). Then waits until the moves are over: each holds exactly its share, and its own
/// metrics show it, so that the next fault starts from a settled group.
async fn wait_shared(
    leases: &Api<Lease>,
    replicas: &[Replica],
    indexes: &[usize],
) -> Result<Duration> {
    let started = Instant::now();
    let moved = loop {
        let holders = read_holders(leases).await?;
        let held: Vec<Slots> = indexes
            .iter()
            .map(|&i| replicas[i].held(&holders))
            .collect();
        let all = held
            .iter()
            .fold(Slots::NONE, |all, slots| all.union(*slots));
        if held.iter().all(|slots| !slots.is_empty()) && all == Slots::ALL {
            break started.elapsed();
        }
        ensure!(
            started.elapsed() < SHARE_TIMEOUT,
            "replicas {indexes:?} hold {held:?} after {SHARE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    loop {
        let holders = read_holders(leases).await?;
        let identities: Vec<&str> = indexes
            .iter()
            .filter_map(|&i| replicas[i].identity.as_deref())
            .collect();
        let shares = slots::assign(&identities, &holders.0);
        let mut settled = true;
        for &index in indexes {
            let replica = &replicas[index];
            let held = replica.held(&holders);
            let share = (replica.identity.as_ref()).and_then(|identity| shares.get(identity));
            settled = settled
                && share == Some(&held)
                && replica.gauge("operator_manager_shard_slots").await == f64::from(held.len());
        }
        if settled {
            return Ok(moved);
        }
        ensure!(
            started.elapsed() < SHARE_TIMEOUT,
            "replicas {indexes:?} have not settled on their shares {shares:?} after \
             {SHARE_TIMEOUT:?}: {holders:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Who holds which slots, as the holders' Lease says now (nobody while it cannot be read, as
/// while the API server restarts).
async fn read_holders(leases: &Api<Lease>) -> Result<Holders> {
    let name = manager::sharding::holders_lease_name(GROUP);
    match leases.get_opt(&name).await {
        Ok(Some(lease)) => Ok(Holders::from_lease(&lease)?),
        _ => Ok(Holders::default()),
    }
}

/// Waits until each replica at `indexes` sees exactly those as the group's members: the
/// member Lease of one that crashed counts until it expires, and a change of membership before
/// then would be measured with it.
async fn wait_members(replicas: &[Replica], indexes: &[usize]) -> Result<()> {
    let started = Instant::now();
    loop {
        let mut seen = Vec::new();
        for &index in indexes {
            seen.push(
                replicas[index]
                    .gauge("operator_manager_shard_members")
                    .await,
            );
        }
        #[allow(clippy::cast_precision_loss)]
        let expected = indexes.len() as f64;
        if seen
            .iter()
            .all(|members| (*members - expected).abs() < f64::EPSILON)
        {
            return Ok(());
        }
        ensure!(
            started.elapsed() < SHARE_TIMEOUT,
            "replicas {indexes:?} see {seen:?} members after {SHARE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the member Leases of the group are those of `count` replicas: the Lease a
/// replica that died left behind is deleted two lease durations after it stood still, and a
/// replica that joins before then counts it alive for a lease duration.
async fn wait_left_behind_gone(leases: &Api<Lease>, count: usize) -> Result<()> {
    let prefix = format!("{GROUP}-member-");
    testkit::wait_for(
        "the member Leases of replicas that died to be deleted",
        LEASE_DURATION * 4,
        || async {
            let names: Vec<String> = (leases.list(&Default::default()).await)
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter_map(|lease| lease.metadata.name)
                .filter(|name| name.starts_with(&prefix))
                .collect();
            if names.len() == count {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

/// Records the uid of every Memcached that ever exists in `api`'s namespace, by name (the
/// workload never reuses a name).
fn record_uids(
    api: Api<DynamicObject>,
) -> (
    Arc<Mutex<HashMap<String, String>>>,
    tokio::task::JoinHandle<()>,
) {
    let uids: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let recorded = uids.clone();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            let (watcher::Event::Apply(object) | watcher::Event::InitApply(object)) =
                event.unwrap_or(watcher::Event::Init)
            else {
                continue;
            };
            if let (Some(name), Some(uid)) = (object.metadata.name, object.metadata.uid) {
                recorded
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(name, uid);
            }
        }
    });
    (uids, task)
}

/// Which member held which slots from when, from the holders' Lease as stored after each
/// write the audit log records, in commit order.
fn holder_history(
    events: &[AuditEvent],
    namespace: &str,
) -> Result<Vec<(Timestamp, BTreeMap<String, Slots>)>> {
    let lease = manager::sharding::holders_lease_name(GROUP);
    let mut history = Vec::new();
    for event in events {
        let written = event.resource == "leases"
            && event.namespace == namespace
            && event.name == lease
            && event.succeeded()
            && matches!(event.verb.as_str(), "create" | "update" | "patch");
        let Some(stored) = event.response_object.as_ref().filter(|_| written) else {
            continue;
        };
        let annotation = stored["metadata"]["annotations"][manager::sharding::HOLDERS_ANNOTATION]
            .as_str()
            .unwrap_or("{}");
        let raw: BTreeMap<String, String> = serde_json::from_str(annotation)
            .with_context(|| format!("the holders' annotation {annotation:?}"))?;
        let mut holders = BTreeMap::new();
        for (member, slots) in raw {
            holders.insert(member, slots.parse::<Slots>()?);
        }
        history.push((event.completed, holders));
    }
    history.sort_by_key(|(at, _)| *at);
    Ok(history)
}

/// A write committed while its replica did not hold the object's slot.
struct Misplaced {
    identity: String,
    what: String,
    committed: Timestamp,
    /// Who held the object's slot then (`None`: nobody).
    holder: Option<String>,
}

impl std::fmt::Display for Misplaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let holder = self.holder.as_deref().unwrap_or("nobody");
        write!(
            f,
            "{} {} committed {} while {holder} held its slot",
            self.identity, self.what, self.committed
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writer_per_object_while_sharded_replicas_come_go_crash_and_freeze() -> Result<()> {
    let private = PrivateCluster::start("shard-faults").await?;
    let cluster = private.test().clone();
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let namespace = TestNamespace::create(&cluster, "shards").await?;
    let api: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        namespace.name(),
        &testkit::memcached_resource(),
    );
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace.name());
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), &identity.namespace);
    let (uids, recording) = record_uids(api.clone());

    let mut replicas: Vec<Replica> = (0..4)
        .map(|index| Replica {
            name: format!("shard-{index}"),
            process: None,
            identity: None,
            metrics: 0,
            probes: 0,
        })
        .collect();
    for replica in &mut replicas[..3] {
        replica.start(&identity.path).await?;
    }
    wait_shared(&leases, &replicas, &[0, 1, 2]).await?;
    for index in 0..MEMCACHEDS {
        testkit::create_memcached(&api, &format!("mc-{index}"), 1 + index % 3).await?;
    }
    // The faults come under a steady workload, not the first reconciles of a hundred objects.
    testkit::wait_all_converged(&api, &deployments, Duration::from_secs(120)).await?;
    let (stop_churn, stopped) = tokio::sync::watch::channel(false);
    let churning = tokio::spawn(testkit::churn(api.clone(), MEMCACHEDS, stopped));
    let began = Instant::now();

    // SIGTERM: its slots move within a second, and it comes back.
    replicas[2].signal(Signal::SIGTERM)?;
    let moved = wait_shared(&leases, &replicas, &[0, 1]).await?;
    let status = replicas[2].wait_exit(Duration::from_secs(40)).await?;
    ensure!(
        status.success(),
        "shard-2 exited with {status} after SIGTERM"
    );
    println!("SIGTERM: slots moved in {:.3} s", moved.as_secs_f64());
    ensure!(
        moved < Duration::from_secs(1),
        "a graceful handover took {moved:?}"
    );
    replicas[2].start(&identity.path).await?;
    let joined = wait_shared(&leases, &replicas, &[0, 1, 2]).await?;
    println!(
        "shard-2 back: slots shared again in {:.3} s",
        joined.as_secs_f64()
    );

    // SIGKILL: its slots move once its member Lease has expired.
    wait_members(&replicas, &[0, 1, 2]).await?;
    replicas[1].signal(Signal::SIGKILL)?;
    let moved = wait_shared(&leases, &replicas, &[0, 2]).await?;
    replicas[1].wait_exit(Duration::from_secs(10)).await?;
    println!(
        "SIGKILL: slots moved in {:.3} s (lease {LEASE_DURATION:?})",
        moved.as_secs_f64()
    );
    ensure!(
        moved < LEASE_DURATION + Duration::from_secs(2),
        "the takeover after a crash took {moved:?}"
    );
    replicas[1].start(&identity.path).await?;
    wait_shared(&leases, &replicas, &[0, 1, 2]).await?;

    // SIGSTOP past the lease: the others take its slots; woken, it finds its member Lease
    // lost and exits without a write, and comes back.
    wait_members(&replicas, &[0, 1, 2]).await?;
    replicas[0].signal(Signal::SIGSTOP)?;
    let frozen = Instant::now();
    let moved = wait_shared(&leases, &replicas, &[1, 2]).await?;
    println!("SIGSTOP: slots moved in {:.3} s", moved.as_secs_f64());
    tokio::time::sleep(FREEZE.saturating_sub(frozen.elapsed())).await;
    replicas[0].signal(Signal::SIGCONT)?;
    // Past its renew deadline it fences its writes and exits; either way it writes nothing
    // for the slots it lost, which the audit log shows.
    match replicas[0]
        .process()?
        .wait_timeout(RENEW_DEADLINE * 3)
        .await?
    {
        Some(status) => {
            println!(
                "woken after {:.1} s, shard-0 exited with {status}",
                FREEZE.as_secs_f64()
            );
            replicas[0].process = None;
            replicas[0].start(&identity.path).await?;
        }
        None => println!("woken, shard-0 kept running"),
    }
    wait_shared(&leases, &replicas, &[0, 1, 2]).await?;

    // Scale 3 → 2 → 4, once the Leases of the replicas that died are gone.
    wait_left_behind_gone(&leases, 3).await?;
    wait_members(&replicas, &[0, 1, 2]).await?;
    replicas[2].signal(Signal::SIGTERM)?;
    let moved = wait_shared(&leases, &replicas, &[0, 1]).await?;
    replicas[2].wait_exit(Duration::from_secs(40)).await?;
    println!("3 → 2: slots moved in {:.3} s", moved.as_secs_f64());
    ensure!(
        moved < Duration::from_secs(1),
        "the scale-down took {moved:?}"
    );
    wait_members(&replicas, &[0, 1]).await?;
    let asked = Instant::now();
    for index in [2, 3] {
        replicas[index].start(&identity.path).await?;
    }
    let ready = asked.elapsed();
    let shared = wait_shared(&leases, &replicas, &[0, 1, 2, 3]).await?;
    println!(
        "2 → 4: ready in {:.3} s, slots shared {:.3} s later",
        ready.as_secs_f64(),
        shared.as_secs_f64()
    );
    ensure!(
        shared < Duration::from_secs(1),
        "the scale-up took {shared:?} once ready"
    );

    // The API server restarts: replicas that missed their renew deadline exit and, like pods
    // of a Deployment, come back.
    private
        .local()
        .restart_apiserver(Duration::from_secs(2))
        .await?;
    let back = Instant::now();
    tokio::time::sleep(RENEW_DEADLINE + RETRY_PERIOD).await;
    for replica in &mut replicas {
        let exited = match replica.process.as_mut() {
            Some(process) => process.try_exit_status()?,
            None => None,
        };
        if let Some(status) = exited {
            println!(
                "{} exited with {status} after the API server's restart",
                replica.name
            );
            replica.process = None;
            replica.start(&identity.path).await?;
        }
    }
    wait_shared(&leases, &replicas, &[0, 1, 2, 3]).await?;
    println!(
        "API server restarted: slots shared {:.3} s after it was back",
        back.elapsed().as_secs_f64()
    );

    let _ = stop_churn.send(true);
    let (changes, errors) = churning.await?;
    println!(
        "faults done in {:.0} s; the workload made {changes} changes ({errors} refused or failed)",
        began.elapsed().as_secs_f64()
    );
    testkit::wait_all_converged(&api, &deployments, Duration::from_secs(120)).await?;
    for replica in &mut replicas {
        replica.signal(Signal::SIGTERM)?;
    }
    for replica in &mut replicas {
        let status = replica.wait_exit(Duration::from_secs(40)).await?;
        ensure!(
            status.success(),
            "{} exited with {status} at the end",
            replica.name
        );
    }
    recording.abort();

    // The verdict, from the audit log.
    let files = cluster.state.audit_log_files()?;
    let events = testkit::read_audit_files(&files)?;
    let history = holder_history(&events, &identity.namespace)?;
    ensure!(
        history.len() > 5,
        "the audit log holds {} writes of the holders' Lease: is the audit policy current?",
        history.len()
    );
    let uids = uids
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let names: Vec<&str> = replicas.iter().map(|r| r.name.as_str()).collect();
    let (mut judged, mut unknown) = (BTreeMap::<String, usize>::new(), 0);
    let mut misplaced = Vec::new();
    for event in &events {
        let Some(id) = testkit::manager_identity(&event.user_agent) else {
            continue;
        };
        let ours = names.contains(&testkit::identity_pod(&id));
        let write = matches!(
            event.verb.as_str(),
            "create" | "update" | "patch" | "delete"
        );
        let kind = match (event.resource.as_str(), event.subresource.as_str()) {
            ("memcacheds", "status") => "memcacheds/status",
            ("deployments" | "services" | "poddisruptionbudgets", "") => event.resource.as_str(),
            _ => continue,
        };
        if !ours || !write || !event.succeeded() || event.namespace != namespace.name() {
            continue;
        }
        let Some(uid) = uids.get(&event.name) else {
            unknown += 1;
            continue;
        };
        *judged.entry(kind.to_owned()).or_default() += 1;
        let slot = slot_of_uid(uid);
        let holders = history
            .iter()
            .rev()
            .find(|(at, _)| *at <= event.completed)
            .map(|(_, holders)| holders);
        let holder = holders.and_then(|holders| {
            holders
                .iter()
                .find(|(_, slots)| slots.contains(slot))
                .map(|(member, _)| member.clone())
        });
        if holder.as_deref() != Some(id.as_str()) {
            misplaced.push(Misplaced {
                identity: id,
                what: format!("{} {kind} {}", event.verb, event.name),
                committed: event.completed,
                holder,
            });
        }
    }
    println!(
        "writes judged against the holders of their object's slot: {judged:?} ({unknown} for objects whose uid was never seen)"
    );
    ensure!(
        judged.get("memcacheds/status").is_some_and(|n| *n > 0)
            && judged.contains_key("deployments"),
        "the audit log holds no status or Deployment write of a replica: {judged:?}"
    );
    ensure!(
        misplaced.is_empty(),
        "{} writes were committed by a replica that did not hold the object's slot, e.g.:\n  {}",
        misplaced.len(),
        misplaced
            .iter()
            .take(5)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    drop(namespace);
    Ok(())
}
