//! Convergence and scale-event timing with the real manager, and what it cost.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use apis::{Memcached, MemcachedSpec};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde::{Deserialize, Serialize};
use serde_json::json;
use testkit::{ManagerProcess, ServiceAccountKubeconfig, TestCluster, TestNamespace};
use tokio::sync::oneshot;

use super::baseline::Limit;
use super::probe::{
    self, ControlPlaneClock, Counts, CpuClock, MachineClock, ProcessSample, RequestCounter, sample,
};
use super::shard_crash::{self, ShardCrash};
use super::tenants::{Target, Tenants};
use super::timeline::{self, Timeline, Window};
use super::{BenchArgs, Contender, percentile};

/// One timed phase: every object changed, then waited for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Phase {
    /// From the first request until the last object converged.
    pub seconds: f64,
    pub objects_per_second: f64,
    /// Per object, from its own create/patch response until it converged (NaN, `null` in the
    /// JSON, without samples).
    #[serde(deserialize_with = "super::report::number")]
    pub p50_seconds: f64,
    #[serde(deserialize_with = "super::report::number")]
    pub p99_seconds: f64,
    /// Where each object's time went, from the object's Deployment as the bench watched it.
    pub split: Split,
    /// The same time step by step, from the API server's audit log; `None` when the log could
    /// not be read, and in the results of runs before it was read.
    #[serde(default)]
    pub timeline: Option<Timeline>,
    /// Requests the API server dispatched for the manager during the phase, per object.
    pub requests_per_object: f64,
    /// The same, by resource and verb.
    pub requests_by_kind: Counts,
    /// Watch events the API server sent during the phase to all its clients (the cluster's
    /// controllers, kwok, the bench and the manager), per object, by resource.
    pub watch_events_by_resource: Counts,
    /// The bytes of those events, per object, in KiB.
    pub watch_kib_per_object: f64,
    /// Of those events, the ones that started a new watch (a client's re-list), per object.
    pub watch_initial_events_per_object: f64,
    /// Watches the API server closed during the phase because their client fell behind, by
    /// resource (a count, not per object): on a saturated machine a busy client is closed and
    /// watches again, and the replay of what it missed is in the initial-list events. Empty
    /// in the results of runs that did not count them.
    #[serde(default)]
    pub closed_watches: Counts,
    /// Changes of objects during the phase (each once, whoever watches it), per object, by
    /// resource: what the cluster did, before the API server fans it out to its watchers.
    pub changes_by_resource: Counts,
    /// The manager's CPU seconds during the phase.
    pub cpu_seconds: f64,
    /// How long the manager's threads were runnable but waited for a CPU during the phase, in
    /// seconds: the contention it met (see [`CpuClock`]).
    pub cpu_wait_seconds: f64,
    /// The share of the whole machine's CPU time that was busy during the phase, from 0 to 1.
    pub machine_busy: f64,
    /// The local cluster's own processes' CPU seconds during the phase, by process (see
    /// [`ControlPlaneClock`]).
    pub control_plane_cpu_seconds: BTreeMap<String, f64>,
    /// Reconciles the manager finished during the phase, per object (from its own
    /// `controller_runtime_reconcile_total`); `None` when its metrics could not be read.
    pub reconciles_per_object: Option<f64>,
    /// The mean time a reconcile held a worker during the phase, in seconds (from the
    /// manager's own `controller_runtime_reconcile_time_seconds`); `None` when its metrics
    /// could not be read or no reconcile finished.
    #[serde(default)]
    pub reconcile_mean_seconds: Option<f64>,
    /// The watch events that asked ours for a reconcile during the phase, per object, by the
    /// kind of object that changed (from its `operator_manager_reconcile_triggers_total`;
    /// empty for the reference). The queue folds several into one reconcile.
    pub triggers_by_source: Counts,
    /// The reconciles ours held back for its cache to show its own last write, per object, by
    /// outcome: `caught_up`, or `behind` when one started without it (from its
    /// `operator_manager_reconcile_cache_waits_total`; empty for the reference).
    #[serde(default)]
    pub cache_waits: Counts,
}

/// How a per-object time spreads, in seconds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spread {
    #[serde(deserialize_with = "super::report::number")]
    pub p50: f64,
    #[serde(deserialize_with = "super::report::number")]
    pub p99: f64,
    /// NaN (`null` in the JSON) without samples.
    #[serde(deserialize_with = "super::report::number")]
    pub max: f64,
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} / {:.2} / {:.2}", self.p50, self.p99, self.max)
    }
}

impl Spread {
    /// Of `samples`, sorted.
    pub(super) fn of(samples: &[f64]) -> Self {
        Self {
            p50: percentile(samples, 50.0),
            p99: percentile(samples, 99.0),
            max: samples.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// One phase's per-object time in three parts, in order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Split {
    /// The manager's: from the object's request's response until its Deployment asked for
    /// the new size (created or changed).
    pub reacted: Spread,
    /// The cluster's: from then until the Deployment had every pod of that spec ready and
    /// available ([`is_rolled_out`]).
    pub rolled_out: Spread,
    /// The manager's again: from then until the object reported it ([`is_converged`]).
    pub reported: Spread,
}

/// The manager's resident memory at the moments that matter, in MiB: of a sharded manager,
/// the most any of its replicas held at each.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Memory {
    pub idle_mib: f64,
    pub peak_mib: f64,
    /// Each replica's peak, of a sharded manager; empty for one process.
    #[serde(default)]
    pub replica_peaks_mib: Vec<f64>,
    pub converged_mib: f64,
    /// Of `converged_mib`, the anonymous pages (heap, stacks, runtime) and the pages of files
    /// (the binary's code, its libraries): at small counts the code is most of the peak.
    pub converged_anon_mib: f64,
    pub converged_file_mib: f64,
}

/// Everything measured for one manager at one object count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    /// Which manager ([`super::OURS`], [`super::REFERENCE`] or an `--also-manager` name).
    pub manager: String,
    pub objects: usize,
    pub limit: Limit,
    pub convergence: Phase,
    /// Convergence time over the physical limit's time.
    #[serde(deserialize_with = "super::report::number")]
    pub ratio_to_limit: f64,
    pub scale: Phase,
    /// The same work at every object count: [`BURST_OBJECTS`] of the Memcacheds (all, when
    /// there are fewer), spread over the namespaces, scaled back at once with every other
    /// object present. What it costs per object is the manager's cost of one scale event, apart
    /// from how much longer the cluster's rollouts take at larger counts.
    pub burst: Phase,
    /// How many Memcacheds the burst scaled.
    pub burst_objects: usize,
    pub memory: Memory,
    /// Of a sharded manager: one replica killed while the burst's Memcacheds are scaled again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_crash: Option<ShardCrash>,
}

impl Run {
    /// How long its three phases took together.
    pub fn measured_seconds(&self) -> f64 {
        self.convergence.seconds + self.scale.seconds + self.burst.seconds
    }
}

/// Memcacheds scaled in the burst after the scale phase (see [`Run::burst`]).
pub const BURST_OBJECTS: usize = 100;

/// Measures `contender` at `objects` Memcacheds. Returns the run with the namespaces it used,
/// which the caller deletes once the run is saved: at 10,000 objects that takes ten minutes.
pub async fn measure(
    cluster: &TestCluster,
    contender: &Contender,
    kubeconfig: &ServiceAccountKubeconfig,
    counter: &RequestCounter,
    objects: usize,
    args: &BenchArgs,
    limit: Limit,
) -> anyhow::Result<(Run, Tenants)> {
    let tenants = Tenants::create(
        cluster,
        "bench",
        "bench",
        objects,
        args.objects_per_namespace,
    )
    .await?;
    if tenants.namespace_count() > 1 {
        println!(
            "{objects} Memcacheds in {} namespaces",
            tenants.namespace_count()
        );
    }
    let lease_id = testkit::unique_name("bench-lease");
    let mut managers = start_contender(cluster, contender, kubeconfig, &lease_id, args).await?;
    let processes = managers
        .iter()
        .map(|(manager, port)| {
            let pid = manager
                .id()
                .context("a manager exited right after starting")?;
            anyhow::Ok((pid, *port))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pids: Vec<u32> = processes.iter().map(|(pid, _)| *pid).collect();
    // Let the watches list and settle before calling the manager idle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = samples(&pids)?;

    let size = args.size;
    let convergence = timed_phase(
        cluster,
        counter,
        &processes,
        (&tenants, tenants.targets()),
        size,
        args,
        |api, name| async move {
            api.create(&PostParams::default(), &new_memcached(&name, size))
                .await
                .map(|_| ())
        },
    )
    .await
    .context("convergence phase")?;
    let converged = samples(&pids)?;
    println!("converged: {:.2} s", convergence.seconds);

    let scaled = size + 1;
    let scale = timed_phase(
        cluster,
        counter,
        &processes,
        (&tenants, tenants.targets()),
        scaled,
        args,
        |api, name| resize(api, name, scaled),
    )
    .await
    .context("scale phase")?;
    println!("scaled: {:.2} s", scale.seconds);

    let sampled = tenants.spread_sample(BURST_OBJECTS);
    let burst = timed_phase(
        cluster,
        counter,
        &processes,
        (&tenants, &sampled),
        size,
        args,
        |api, name| resize(api, name, size),
    )
    .await
    .context("burst phase")?;
    let after = samples(&pids)?;
    println!("burst of {}: {:.2} s", sampled.len(), burst.seconds);

    let shard_crash = if managers.len() > 1 {
        let crash =
            shard_crash::measure(cluster, &tenants, &mut managers, &sampled, size + 1, args)
                .await
                .context("the crash of a replica")?;
        println!(
            "a replica killed, {} objects scaled at once, until their Deployments had it (p50 / p99 / max): its {} objects {} s, the survivors' {} {} s (lease {:.0} s); {} missed",
            sampled.len(),
            crash.dead_objects,
            crash.dead,
            crash.surviving_objects,
            crash.surviving,
            crash.lease_seconds,
            crash.missed
        );
        Some(crash)
    } else {
        None
    };
    for (manager, _) in managers {
        stop_manager(manager).await?;
    }
    let peaks: Vec<f64> = (after.iter().zip(&converged))
        .map(|(after, converged)| mib(after.peak_rss_bytes.max(converged.peak_rss_bytes)))
        .collect();
    let most = |of: &[ProcessSample], bytes: fn(&ProcessSample) -> u64| {
        mib(of.iter().map(bytes).max().unwrap_or_default())
    };

    let run = Run {
        manager: contender.name.clone(),
        objects,
        ratio_to_limit: convergence.seconds / limit.seconds,
        limit,
        convergence,
        scale,
        burst,
        burst_objects: sampled.len(),
        memory: Memory {
            idle_mib: most(&idle, |s| s.rss_bytes),
            peak_mib: peaks.iter().copied().fold(0.0, f64::max),
            replica_peaks_mib: if peaks.len() > 1 { peaks } else { Vec::new() },
            converged_mib: most(&converged, |s| s.rss_bytes),
            converged_anon_mib: most(&converged, |s| s.anon_rss_bytes),
            converged_file_mib: most(&converged, |s| s.file_rss_bytes),
        },
        shard_crash,
    };
    Ok((run, tenants))
}

/// Sets the size of Memcached `name` to `size`.
pub(super) async fn resize(
    api: Api<Memcached>,
    name: String,
    size: i32,
) -> Result<(), kube::Error> {
    let patch = json!({"spec": {"size": size}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
}

/// A sample of each process of `pids`.
fn samples(pids: &[u32]) -> anyhow::Result<Vec<ProcessSample>> {
    pids.iter().map(|pid| sample(*pid)).collect()
}

#[allow(clippy::cast_precision_loss)]
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Changes each of `targets` (among `tenants`' Memcacheds) with `change`, at the configured
/// concurrency, and waits until each has converged at `size`, timing each object from its own
/// request's response. The clock starts once the bench's own watches have listed what the
/// namespaces hold, so their lists are no part of the phase.
async fn timed_phase<F, Fut>(
    cluster: &TestCluster,
    counter: &RequestCounter,
    processes: &[(u32, u16)],
    (tenants, targets): (&Tenants, &[Target]),
    size: i32,
    args: &BenchArgs,
    change: F,
) -> anyhow::Result<Phase>
where
    F: Fn(Api<Memcached>, String) -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let expected: Arc<HashSet<String>> = Arc::new(targets.iter().map(Target::key).collect());
    let (converged_at, written_at, ready_at): (FirstSeen, FirstSeen, FirstSeen) =
        Default::default();
    let (memcacheds_listed, deployments_listed) = (oneshot::channel(), oneshot::channel());
    let watches = [
        tokio::spawn(record_first(
            tenants.apis(cluster),
            expected.clone(),
            memcacheds_listed.0,
            vec![(
                Box::new(move |memcached: &Memcached| is_converged(memcached, size)),
                Arc::clone(&converged_at),
            )],
        )),
        tokio::spawn(record_first(
            tenants.apis(cluster),
            expected,
            deployments_listed.0,
            vec![
                (
                    Box::new(move |deployment: &Deployment| deployment.spec.replicas == Some(size)),
                    Arc::clone(&written_at),
                ),
                (
                    Box::new(move |deployment: &Deployment| is_rolled_out(deployment, size)),
                    Arc::clone(&ready_at),
                ),
            ],
        )),
    ];
    let listed = async { memcacheds_listed.1.await.and(deployments_listed.1.await) };
    if !matches!(
        tokio::time::timeout(args.timeout(), listed).await,
        Ok(Ok(()))
    ) {
        watches.iter().for_each(tokio::task::JoinHandle::abort);
        anyhow::bail!(
            "the bench's watches of the Memcacheds and Deployments did not list within {:?}",
            args.timeout()
        );
    }
    let api_server_before = counter.read(&cluster.client).await?;
    let (cpu_before, machine_before) = (cpu_clocks(processes)?, MachineClock::read()?);
    let control_plane_before = ControlPlaneClock::read()?;
    let counted_before = manager_counts_or_warn(processes).await;

    let (started, started_wall) = (Instant::now(), SystemTime::now());
    let changed_at: HashMap<String, Instant> = stream::iter(targets.iter())
        .map(|target| {
            let fut = change(target.api.clone(), target.name.clone());
            async move {
                fut.await
                    .with_context(|| format!("changing Memcached {}", target.key()))?;
                anyhow::Ok((target.key(), Instant::now()))
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect()
        .await?;

    let deadline = started + args.timeout();
    loop {
        let done = converged_at.lock().map(|m| m.len()).unwrap_or(0);
        if done >= targets.len() {
            break;
        }
        if Instant::now() > deadline {
            watches.iter().for_each(tokio::task::JoinHandle::abort);
            anyhow::bail!(
                "only {done} of {} objects converged within {:?}",
                targets.len(),
                args.timeout()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A Deployment whose watch event is still on its way is left out of the split.
    watches.iter().for_each(tokio::task::JoinHandle::abort);
    let [converged_at, written_at, ready_at] = [converged_at, written_at, ready_at]
        .map(|m| m.lock().map(|m| m.clone()).unwrap_or_default());
    let latencies = sorted_gaps(&changed_at, &converged_at);
    let split = Split {
        reacted: Spread::of(&sorted_gaps(&changed_at, &written_at)),
        rolled_out: Spread::of(&sorted_gaps(&written_at, &ready_at)),
        reported: Spread::of(&sorted_gaps(&ready_at, &converged_at)),
    };
    let api_server = counter
        .read(&cluster.client)
        .await?
        .since(&api_server_before);
    let (cpu_after, machine_after) = (cpu_clocks(processes)?, MachineClock::read()?);
    let control_plane = ControlPlaneClock::read()?.seconds_since(&control_plane_before);
    let counted = counted_before.zip(manager_counts_or_warn(processes).await);
    let cpu_since = |seconds: fn(&CpuClock, &CpuClock) -> f64| {
        (cpu_after.iter().zip(&cpu_before))
            .map(|(after, before)| seconds(after, before))
            .fold(0.0, |total, seconds| total + seconds)
    };
    // Read once the counters are: parsing the log is the bench's work, not the phase's.
    let timeline = audit_timeline(cluster, targets, (started, started_wall), &converged_at).await;
    let requests = api_server.requests;
    #[allow(clippy::cast_precision_loss)]
    let count = targets.len() as f64;
    let seconds = converged_at
        .values()
        .max()
        .map_or(0.0, |last| last.duration_since(started).as_secs_f64());
    Ok(Phase {
        seconds,
        objects_per_second: count / seconds.max(f64::EPSILON),
        p50_seconds: percentile(&latencies, 50.0),
        p99_seconds: percentile(&latencies, 99.0),
        split,
        timeline,
        requests_per_object: requests.total() / count,
        requests_by_kind: requests.per(count),
        watch_events_by_resource: api_server.watch_events.per(count),
        watch_kib_per_object: api_server.watch_bytes.total() / 1024.0 / count,
        watch_initial_events_per_object: api_server.initial_events.total() / count,
        closed_watches: api_server.closed_watches,
        changes_by_resource: api_server.changes.per(count),
        cpu_seconds: cpu_since(CpuClock::seconds_since),
        cpu_wait_seconds: cpu_since(CpuClock::wait_seconds_since),
        machine_busy: machine_after.busy_share_since(&machine_before),
        control_plane_cpu_seconds: control_plane,
        reconciles_per_object: counted
            .as_ref()
            .map(|(before, after)| (after.reconciles - before.reconciles) / count),
        reconcile_mean_seconds: counted.as_ref().and_then(|(before, after)| {
            let timed = after.reconcile_time.1 - before.reconcile_time.1;
            (timed > 0.0).then(|| (after.reconcile_time.0 - before.reconcile_time.0) / timed)
        }),
        triggers_by_source: (counted.as_ref()).map_or_else(Counts::default, |(before, after)| {
            after.triggers.since(&before.triggers).per(count)
        }),
        cache_waits: counted.map_or_else(Counts::default, |(before, after)| {
            after.cache_waits.since(&before.cache_waits).per(count)
        }),
    })
}

/// The phase's [`Timeline`] from the API server's audit log, or `None` (said on stderr) when
/// the cluster keeps no log or it cannot be read. `converged_at` is when the bench saw each of
/// `targets` converge, on the clock the phase `started` on.
async fn audit_timeline(
    cluster: &TestCluster,
    targets: &[Target],
    (started, started_wall): (Instant, SystemTime),
    converged_at: &HashMap<String, Instant>,
) -> Option<Timeline> {
    let started_seconds = timeline::unix_seconds(started_wall);
    let window = Window {
        started: started_seconds,
        converged: converged_at
            .iter()
            .map(|(key, at)| {
                let after = at.saturating_duration_since(started).as_secs_f64();
                (key.clone(), started_seconds + after)
            })
            .collect(),
    };
    let namespaces: HashSet<String> = targets.iter().map(|t| t.namespace.clone()).collect();
    let state = cluster.state.clone();
    let read = tokio::task::spawn_blocking(move || {
        timeline::read_cluster_events(&state, &namespaces, started_wall)
            .map(|events| timeline::timeline(&events, &window))
    })
    .await
    .unwrap_or_else(|error| Err(format!("reading the audit log failed: {error}")));
    read.inspect_err(|error| eprintln!("warning: no timeline: {error}"))
        .ok()
}

/// The CPU clock of each of `processes` (pid and metrics port).
fn cpu_clocks(processes: &[(u32, u16)]) -> anyhow::Result<Vec<CpuClock>> {
    processes
        .iter()
        .map(|(pid, _)| CpuClock::read(*pid))
        .collect()
}

/// What the manager of `processes` (each pid and metrics port: a sharded one's replicas)
/// counted so far, all together, or `None` (said on stderr) when some metrics are unreadable.
async fn manager_counts_or_warn(processes: &[(u32, u16)]) -> Option<probe::ManagerCounts> {
    let mut total = probe::ManagerCounts::default();
    for (_, port) in processes {
        let counts = probe::manager_counts(*port)
            .await
            .inspect_err(|error| eprintln!("warning: no reconcile count: {error:#}"))
            .ok()?;
        total = total.plus(&counts);
    }
    Some(total)
}

/// The first moment each object (`namespace/name`) was seen in some state.
pub(super) type FirstSeen = Arc<Mutex<HashMap<String, Instant>>>;

/// Per key in both, seconds from `from` to `to` (zero when `to` came first), sorted.
fn sorted_gaps(from: &HashMap<String, Instant>, to: &HashMap<String, Instant>) -> Vec<f64> {
    let mut gaps: Vec<f64> = from
        .iter()
        .filter_map(|(key, from)| Some(to.get(key)?.saturating_duration_since(*from).as_secs_f64()))
        .collect();
    gaps.sort_by(f64::total_cmp);
    gaps
}

/// A state of an object, and where the first moment each object is seen in it goes.
pub(super) type Milestone<K> = (Box<dyn Fn(&K) -> bool + Send>, FirstSeen);

/// Notes the first moment each of the `expected` objects (`namespace/name`) reaches each
/// milestone, watching each namespace's objects of `K`; says on `listed` when every
/// namespace's first list is in.
pub(super) async fn record_first<K>(
    apis: Vec<Api<K>>,
    expected: Arc<HashSet<String>>,
    listed: oneshot::Sender<()>,
    milestones: Vec<Milestone<K>>,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut unlisted: HashSet<usize> = (0..apis.len()).collect();
    let mut listed = Some(listed);
    let mut events = stream::select_all(apis.into_iter().enumerate().map(|(namespace, api)| {
        watcher(api, watcher::Config::default())
            .default_backoff()
            .map(move |event| (namespace, event))
            .boxed()
    }));
    while let Some((namespace, event)) = events.next().await {
        let object = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => object,
            Ok(watcher::Event::InitDone) => {
                unlisted.remove(&namespace);
                if unlisted.is_empty()
                    && let Some(listed) = listed.take()
                {
                    // Nobody waits any more when the phase gave up.
                    let _ = listed.send(());
                }
                continue;
            }
            Ok(watcher::Event::Init | watcher::Event::Delete(_)) | Err(_) => continue,
        };
        let meta = object.meta();
        let key = format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        );
        if !expected.contains(&key) {
            continue;
        }
        for (reached, first_seen) in &milestones {
            if reached(&object)
                && let Ok(mut map) = first_seen.lock()
            {
                map.entry(key.clone()).or_insert_with(Instant::now);
            }
        }
    }
}

/// A Deployment at `size` whose controller has seen its latest spec, with exactly `size` pods,
/// all of that spec, ready and available: what each manager's status reports, as the cluster
/// has it.
pub fn is_rolled_out(deployment: &Deployment, size: i32) -> bool {
    let (spec, Some(status)) = (&deployment.spec, &deployment.status) else {
        return false;
    };
    let observed = match (status.observed_generation, deployment.metadata.generation) {
        (Some(seen), Some(generation)) => seen >= generation,
        _ => false,
    };
    observed
        && spec.replicas == Some(size)
        && [
            status.replicas,
            status.updated_replicas,
            status.ready_replicas,
            status.available_replicas,
        ]
        .iter()
        .all(|count| *count == Some(size))
}

/// Deployment at the right size with every pod ready, `status.nodes` complete, `Available`
/// True, and all of it describing the latest spec.
pub fn is_converged(memcached: &Memcached, size: i32) -> bool {
    let Some(status) = &memcached.status else {
        return false;
    };
    let expected = usize::try_from(size).unwrap_or(0);
    memcached.spec.size == size
        && status.observed_generation.is_some()
        && status.observed_generation == memcached.metadata.generation
        && status.ready_replicas == size
        && status.nodes.len() == expected
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == kube_operator_runtime::conditions::AVAILABLE && c.status == "True")
}

/// Starts `contender` with the bench's flags plus `extra`, and waits until it leads; the
/// process and the loopback port of its plain-HTTP metrics.
pub async fn start_manager(
    cluster: &TestCluster,
    contender: &Contender,
    kubeconfig: &ServiceAccountKubeconfig,
    lease_id: &str,
    args: &BenchArgs,
    extra: &[&str],
) -> anyhow::Result<(ManagerProcess, u16)> {
    let (manager, metrics_port) =
        spawn_manager(contender, kubeconfig, lease_id, args, extra).await?;
    wait_for_holder(
        cluster,
        &kubeconfig.namespace,
        lease_id,
        |holder| !holder.is_empty(),
        Duration::from_secs(60),
    )
    .await
    .with_context(|| {
        format!(
            "the manager did not take the Lease; its log: {}",
            manager.log().display()
        )
    })?;
    Ok((manager, metrics_port))
}

/// Starts `contender` for the workload: its manager, once it leads, or each replica of a
/// sharded one, once they share every slot. Each with the loopback port of its metrics.
async fn start_contender(
    cluster: &TestCluster,
    contender: &Contender,
    kubeconfig: &ServiceAccountKubeconfig,
    lease_id: &str,
    args: &BenchArgs,
) -> anyhow::Result<Vec<(ManagerProcess, u16)>> {
    if contender.replicas <= 1 {
        let manager = start_manager(cluster, contender, kubeconfig, lease_id, args, &[]).await?;
        return Ok(vec![manager]);
    }
    let mut replicas = Vec::with_capacity(contender.replicas);
    for _ in 0..contender.replicas {
        replicas.push(spawn_manager(contender, kubeconfig, lease_id, args, &[]).await?);
    }
    let started = Instant::now();
    let timeout = Duration::from_secs(60);
    loop {
        let mut shares = Vec::with_capacity(replicas.len());
        for (_, port) in &replicas {
            // A replica not serving its metrics yet owns nothing yet.
            let slots = probe::manager_metric(*port, SHARD_SLOTS_METRIC).await;
            shares.push(slots.unwrap_or(0.0));
        }
        let owned: f64 = shares.iter().sum();
        if shares.iter().all(|slots| *slots > 0.0) && owned >= 64.0 {
            println!(
                "{} replicas share the 64 slots as {shares:?}, {:.1} s after the first started",
                replicas.len(),
                started.elapsed().as_secs_f64()
            );
            return Ok(replicas);
        }
        if started.elapsed() > timeout {
            let logs: Vec<String> = (replicas.iter())
                .map(|(manager, _)| manager.log().display().to_string())
                .collect();
            anyhow::bail!(
                "the {} replicas did not share the slots within {timeout:?} (they own {shares:?}); their logs: {}",
                replicas.len(),
                logs.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many of the 64 slots a sharded replica reconciles.
const SHARD_SLOTS_METRIC: &str = "operator_manager_shard_slots";

/// Spawns `contender` with the bench's flags plus `extra`; the process and the loopback port
/// of its plain-HTTP metrics.
async fn spawn_manager(
    contender: &Contender,
    kubeconfig: &ServiceAccountKubeconfig,
    lease_id: &str,
    args: &BenchArgs,
    extra: &[&str],
) -> anyhow::Result<(ManagerProcess, u16)> {
    let metrics_port = testkit::free_port()?;
    let metrics = format!("--metrics-bind-address=127.0.0.1:{metrics_port}");
    let probes = format!(
        "--health-probe-bind-address=127.0.0.1:{}",
        testkit::free_port_other_than(&[metrics_port])?
    );
    let lease = format!("--leader-election-id={lease_id}");
    let namespace = format!("--leader-election-namespace={}", kubeconfig.namespace);
    let concurrency = format!(
        "--max-concurrent-reconciles={}",
        args.max_concurrent_reconciles
    );
    let mut flags = vec![
        "--leader-elect",
        &lease,
        &namespace,
        &metrics,
        &probes,
        &concurrency,
        "--log-format=json",
    ];
    flags.extend(contender.extra_args.iter().map(String::as_str));
    flags.extend(extra);
    let manager = testkit::spawn_manager_binary(
        &contender.binary,
        &kubeconfig.path,
        &flags,
        &[("RUST_LOG", "warn")],
    )
    .await?;
    Ok((manager, metrics_port))
}

pub async fn stop_manager(mut manager: ManagerProcess) -> anyhow::Result<()> {
    manager.terminate();
    if manager
        .wait_timeout(Duration::from_secs(40))
        .await?
        .is_none()
    {
        manager.kill().await?;
    }
    Ok(())
}

/// Polls the Lease until `accept` takes the pod name of its holder; returns that pod name.
pub async fn wait_for_holder(
    cluster: &TestCluster,
    namespace: &str,
    name: &str,
    accept: impl Fn(&str) -> bool,
    timeout: Duration,
) -> anyhow::Result<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), namespace);
    let deadline = Instant::now() + timeout;
    loop {
        let identity = leases
            .get_opt(name)
            .await?
            .and_then(|l| l.spec?.holder_identity)
            .unwrap_or_default();
        // Ours adds a suffix of the process to the pod name; the reference uses it as is.
        let holder = testkit::identity_pod(&identity);
        if accept(holder) {
            return Ok(holder.to_owned());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "Lease {namespace}/{name} not acquired within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A Memcached as the bench creates it: `size` pods of the default image.
pub fn new_memcached(name: &str, size: i32) -> Memcached {
    let spec = MemcachedSpec {
        size,
        image: apis::memcached::DEFAULT_IMAGE.to_owned(),
        ..Default::default()
    };
    Memcached::new(name, spec)
}

/// Deletes `namespace` and waits until it is gone.
pub async fn delete_and_wait(
    cluster: &TestCluster,
    namespace: TestNamespace,
    timeout: Duration,
) -> anyhow::Result<()> {
    super::tenants::delete_namespaces_and_wait(cluster, vec![namespace], timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn memcached(
        size: i32,
        generation: i64,
        observed: i64,
        ready: i32,
        nodes: usize,
        available: &str,
    ) -> Memcached {
        let mut mc = Memcached::new(
            "m",
            MemcachedSpec {
                size,
                image: "i".into(),
                ..Default::default()
            },
        );
        mc.metadata.generation = Some(generation);
        mc.status = Some(apis::MemcachedStatus {
            nodes: (0..nodes).map(|i| format!("m-{i}")).collect(),
            ready_replicas: ready,
            service: None,
            observed_generation: Some(observed),
            conditions: vec![Condition {
                type_: "Available".into(),
                status: available.into(),
                reason: "R".into(),
                message: String::new(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
        });
        mc
    }

    #[test]
    fn convergence_needs_every_part() {
        assert!(is_converged(&memcached(3, 2, 2, 3, 3, "True"), 3));
        assert!(
            !is_converged(&memcached(3, 2, 1, 3, 3, "True"), 3),
            "stale generation"
        );
        assert!(
            !is_converged(&memcached(3, 2, 2, 2, 3, "True"), 3),
            "not all ready"
        );
        assert!(
            !is_converged(&memcached(3, 2, 2, 3, 2, "True"), 3),
            "nodes incomplete"
        );
        assert!(
            !is_converged(&memcached(3, 2, 2, 3, 3, "False"), 3),
            "not available"
        );
        assert!(
            !is_converged(&memcached(3, 2, 2, 3, 3, "True"), 4),
            "other size"
        );
    }

    #[test]
    fn a_rollout_is_done_when_every_pod_of_the_latest_spec_is_available() {
        use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
        let deployment = |replicas: i32, observed: i64, counts: [i32; 4]| Deployment {
            metadata: kube::api::ObjectMeta {
                generation: Some(2),
                ..Default::default()
            },
            spec: DeploymentSpec {
                replicas: Some(replicas),
                ..Default::default()
            },
            status: Some(DeploymentStatus {
                observed_generation: Some(observed),
                replicas: Some(counts[0]),
                updated_replicas: Some(counts[1]),
                ready_replicas: Some(counts[2]),
                available_replicas: Some(counts[3]),
                ..Default::default()
            }),
        };
        assert!(is_rolled_out(&deployment(2, 2, [2, 2, 2, 2]), 2));
        assert!(
            !is_rolled_out(&deployment(2, 1, [2, 2, 2, 2]), 2),
            "not seen"
        );
        assert!(
            !is_rolled_out(&deployment(1, 2, [2, 2, 2, 2]), 2),
            "old spec"
        );
        for counts in [[3, 2, 2, 2], [2, 1, 2, 2], [2, 2, 1, 2], [2, 2, 2, 1]] {
            assert!(!is_rolled_out(&deployment(2, 2, counts), 2), "{counts:?}");
        }
        assert!(!is_rolled_out(&Deployment::default(), 0), "no status yet");
    }

    #[test]
    fn gaps_are_per_object_and_never_negative() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let from = HashMap::from([
            ("a".to_owned(), at(1000)),
            ("b".to_owned(), at(500)),
            ("only here".to_owned(), at(0)),
        ]);
        let to = HashMap::from([("a".to_owned(), at(1500)), ("b".to_owned(), at(0))]);
        assert_eq!(sorted_gaps(&from, &to), vec![0.0, 0.5]);
    }
}
