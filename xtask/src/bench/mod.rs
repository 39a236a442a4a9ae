//! `cargo xtask bench`: convergence, cost per object and failover, on the local control plane.
//!
//! For each object count N it measures, in one run and against the same API server:
//! - the *physical limit*: the bench client itself making the minimum writes the work needs
//!   (each object's create, its Deployment's create, one status write) at the same concurrency;
//! - *convergence*: N Memcached objects created at that concurrency, timed until every one has
//!   its Deployment at the right size, its pods ready, `status.nodes` complete and `Available`
//!   True; reported as total time, objects per second, per-object p50/p99, and a ratio to the
//!   physical limit;
//! - a *scale event*: the size of all N objects changed at once, timed the same way;
//! - a *burst*: the same 100 scale events at every N (100 of the objects, spread over the
//!   namespaces, scaled back at once), so what it costs per object is the manager's cost of the
//!   same work with N objects present, apart from how long the cluster's rollouts take at N;
//! - *cost*: the manager's resident memory (idle, peak, after convergence), its CPU seconds, and
//!   the API requests it made per object, counted by the API server itself (a FlowSchema that
//!   matches only the manager's ServiceAccount, read from `apiserver_flowcontrol_*` metrics).
//!
//! Then *recovery* ([`recovery`]): after an outage of the API server alone, after one of the
//! API server with the cluster's own controllers (restarted with it), and after a foreign
//! Deployment that blocked a Memcached is deleted. Then *failover*: two managers, the leader stopped gracefully (SIGTERM) or killed (SIGKILL)
//! several times, timing how long until the standby leads, while the largest object count's
//! Memcacheds exist and are being scaled (so every new leader has a full cache to fill).
//!
//! Everything is measured twice in the same run: for our manager, and for the *reference*, the
//! same Memcached controller written the idiomatic controller-runtime way in Go
//! ([`reference`]), with the same ServiceAccount, flags and cluster, alternating which goes
//! first from one object count to the next, each against a freshly restarted API server. The
//! tables print both and their ratio (ours over the reference), the only comparison that means
//! anything on a noisy machine. A count whose phases last only seconds is measured a few times
//! (`--min-measured-seconds`), and its ratios compare medians.
//!
//! The manager runs as a release build with only the generated RBAC (the reference also gets
//! what its own RBAC markers grant, [`reference::extra_rbac`]). Numbers are printed and
//! written as JSON; nothing is asserted about them.

mod baseline;
mod cluster_ready;
mod crds;
mod failover;
mod merge;
pub(crate) mod plot;
mod probe;
mod recovery;
mod reference;
mod report;
mod shard_crash;
mod tenants;
mod timeline;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

/// Options of `cargo xtask bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Object counts to measure, comma-separated (e.g. `100,1000,5000`).
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    pub objects: Vec<usize>,
    /// Memcacheds to a namespace: larger counts are spread over several namespaces, as a
    /// cluster's tenants spread theirs (Kubernetes' own controllers cost what a namespace holds
    /// per sync, so one namespace of thousands measures them, not the manager).
    #[arg(long, default_value_t = 1000)]
    pub objects_per_namespace: usize,
    /// Concurrent requests the bench client keeps in flight, for creates and patches alike.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// `spec.size` of every Memcached (pods per object); the scale event adds one.
    #[arg(long, default_value_t = 1)]
    pub size: i32,
    /// Concurrent reconciles per controller in the manager under test.
    #[arg(long, default_value_t = 4)]
    pub max_concurrent_reconciles: u16,
    /// The phases to measure, comma-separated, in their fixed order: `workload` (converge,
    /// scale and burst at each `--objects` count), `recovery` and `failover` (under the largest
    /// count's Memcacheds), e.g. `--phases failover` to measure handovers alone.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "workload,recovery,failover"
    )]
    pub phases: Vec<Phase>,
    /// Graceful and crash failovers to measure each (0 skips failover).
    #[arg(long, default_value_t = 3)]
    pub failover_rounds: usize,
    /// How long the API server stays away in the recovery phase (0 skips recovery).
    #[arg(long, default_value_t = 20)]
    pub outage_seconds: u64,
    /// A count whose phases (converge, scale and burst) took less than this many seconds for
    /// some manager is measured again, each manager alternately, up to five runs of each (an
    /// odd number), and the ratio and growth tables take each value's median: a phase of a few
    /// seconds on a shared machine moves with whatever else runs, and one of a minute by a
    /// fifth between runs (0 measures every count once). The default repeats 100 objects five
    /// times and 1000 three times; 10,000 objects, half an hour a phase, once.
    #[arg(long, default_value_t = 300)]
    pub min_measured_seconds: u64,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout_seconds: u64,
    /// Benchmark this manager binary instead of building the workspace's (to compare builds).
    #[arg(long, value_name = "PATH")]
    pub manager_binary: Option<PathBuf>,
    /// A flag for our manager only, beside the ones both get (repeatable), e.g.
    /// `--manager-flag=--reconcile-debounce=1s` to compare settings.
    #[arg(long, value_name = "FLAG", allow_hyphen_values = true)]
    pub manager_flag: Vec<String>,
    /// Also measure another build of ours in the same run, as `NAME=PATH` (repeatable), e.g.
    /// `--also-manager size-opt=./manager-os`: it gets our flags and its own rows and ratios,
    /// so two builds compare within one run instead of across two noisy ones.
    #[arg(long, value_name = "NAME=PATH", value_parser = parse_also_manager)]
    pub also_manager: Vec<(String, PathBuf)>,
    /// Also measure our build with other flags in the same run, as `NAME=FLAGS` (repeatable;
    /// flags separated by spaces), e.g. `--variant no-wait=--wait-for-own-writes=false`: it
    /// gets our flags, then these, and its own rows and ratios, so two settings compare within
    /// one run.
    #[arg(long, value_name = "NAME=FLAGS", value_parser = parse_variant)]
    pub variant: Vec<(String, Vec<String>)>,
    /// Replica counts of ours to measure in the workload phase, comma-separated: 1 is the
    /// usual manager, leading alone; each count above it adds `ours-sharded-<n>`, that many
    /// replicas with `--sharding`, each reconciling a share of the objects (e.g. `--replicas
    /// 1,3`). Its memory is the most any replica held, and its CPU and requests those of all
    /// replicas together. After its phases one replica is killed while the burst's objects are
    /// scaled again, timing the dead replica's objects and the survivors' apart. Recovery and
    /// failover measure single managers only.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub replicas: Vec<usize>,
    /// Whether the sharded managers of `--replicas` run on an API server that lists and
    /// watches by shard (the `ShardedListAndWatch` gate, which the local cluster has): `on`,
    /// `off` (restarted without the gate for them, as `ours-sharded-<n>-gate-off`), or `both`.
    #[arg(long, value_enum, default_value = "on")]
    pub sharded_lists: ShardedLists,
    /// Measure only our manager, without the controller-runtime reference.
    #[arg(long)]
    pub no_reference: bool,
    /// Measure on the local cluster with its real node. By default the bench runs on the
    /// control plane and the fake nodes only (replacing a running cluster that has a real node):
    /// no pod of the bench runs on the real node, but its kubelet, containerd and kube-proxy
    /// would share the CPUs with the managers under test, the more so the more Services exist.
    #[arg(long)]
    pub real_node: bool,
    /// Where to write the JSON results (default: `<target-dir>/bench/bench.json`).
    #[arg(long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Measure nothing: print the tables of the results in these JSON files, which earlier
    /// runs wrote (their `--output`), with the settings they hold (so no other option goes
    /// with it but `--plot`). A run stopped part-way keeps the runs it finished there, and
    /// this prints their ratios and growth all the same. Several files, each measuring other
    /// object counts or phases of the same builds (e.g. `--objects 100,1000`, then `--objects
    /// 10000`), print as one run of them all; see `bench/merge.rs` for what must agree.
    #[arg(
        long,
        value_name = "PATH",
        num_args = 1..,
        conflicts_with_all = [
            "objects", "phases", "objects_per_namespace", "concurrency", "size",
            "max_concurrent_reconciles", "failover_rounds", "outage_seconds",
            "min_measured_seconds", "timeout_seconds", "manager_binary", "manager_flag",
            "also_manager", "variant", "replicas", "sharded_lists", "no_reference", "real_node", "output",
        ]
    )]
    pub report: Vec<PathBuf>,
    /// With `--report`: write SVG plots of those results into this directory instead of
    /// printing their tables: time to converge and to scale, CPU per object, peak RSS and
    /// requests per object against the object count, each manager a line, and ours over the
    /// reference (see `bench/plot.rs`), e.g. `--report <files> --plot docs/bench-results/plots`.
    #[arg(long, value_name = "DIR", requires = "report")]
    pub plot: Option<PathBuf>,
}

/// Which API servers the sharded managers are measured on ([`BenchArgs::sharded_lists`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ShardedLists {
    On,
    Off,
    Both,
}

impl ShardedLists {
    /// Each gate setting to measure, on first.
    fn settings(self) -> &'static [bool] {
        match self {
            Self::On => &[true],
            Self::Off => &[false],
            Self::Both => &[true, false],
        }
    }
}

/// A part of the bench that `--phases` can select.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    Workload,
    Recovery,
    Failover,
}

impl BenchArgs {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds)
    }

    fn measures_workload(&self) -> bool {
        self.phases.contains(&Phase::Workload)
    }

    fn measures_recovery(&self) -> bool {
        self.phases.contains(&Phase::Recovery) && self.outage_seconds > 0
    }

    fn measures_failover(&self) -> bool {
        self.phases.contains(&Phase::Failover) && self.failover_rounds > 0
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.objects.is_empty() || self.objects.contains(&0) {
            anyhow::bail!(
                "--objects: every count must be at least 1 (got {:?})",
                self.objects
            );
        }
        if !(self.measures_workload() || self.measures_recovery() || self.measures_failover()) {
            anyhow::bail!(
                "nothing to measure: --phases {} leaves out the workload, and recovery and failover run only with --outage-seconds and --failover-rounds above 0 (got {} and {})",
                self.phases
                    .iter()
                    .map(|p| format!("{p:?}").to_lowercase())
                    .collect::<Vec<_>>()
                    .join(","),
                self.outage_seconds,
                self.failover_rounds
            );
        }
        if self.objects_per_namespace == 0 {
            anyhow::bail!("--objects-per-namespace must be at least 1");
        }
        if self.concurrency == 0 {
            anyhow::bail!("--concurrency must be at least 1");
        }
        if !(0..100).contains(&self.size) {
            anyhow::bail!(
                "--size must be within 0..=99 so the scale event (size + 1) stays within the CRD's 0..=100"
            );
        }
        let sharded: Vec<String> = (self.replicas.iter())
            .flat_map(|r| [sharded_name(*r, true), sharded_name(*r, false)])
            .collect();
        let mut names: Vec<&str> = (self.also_manager.iter().map(|(n, _)| n.as_str()))
            .chain(self.variant.iter().map(|(n, _)| n.as_str()))
            .collect();
        if let Some(name) = names.iter().find(|name| sharded.iter().any(|s| s == *name)) {
            anyhow::bail!("--also-manager, --variant: `{name}` names the replicas of --replicas");
        }
        names.sort_unstable();
        if let Some(twice) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            anyhow::bail!(
                "--also-manager, --variant: the name `{}` is given twice",
                twice[0]
            );
        }
        if self.max_concurrent_reconciles == 0 {
            anyhow::bail!("--max-concurrent-reconciles must be at least 1");
        }
        if let Some(replicas) = self.replicas.iter().find(|r| !(1..=64).contains(*r)) {
            anyhow::bail!(
                "--replicas {replicas}: each count must be within 1..=64 (a sharded manager splits 64 slots)"
            );
        }
        Ok(())
    }
}

/// A manager binary under test, and what the tables call it.
#[derive(Clone, Debug)]
pub struct Contender {
    pub name: String,
    pub binary: PathBuf,
    /// Flags for this binary only, beside the ones both get.
    pub extra_args: Vec<String>,
    /// How many replicas run in the workload phase: above 1, a sharded manager's.
    pub replicas: usize,
    /// Whether the API server it runs on lists and watches by shard.
    pub sharded_lists: bool,
}

/// The controllers our managers run in the bench: Memcached, whose job the reference does, and
/// MyApp, which shares its Deployment watch (as in every run measured so far).
const BENCHED_CONTROLLERS: &str = "--controllers=memcached,myapp";
/// Our manager's name in the tables.
pub const OURS: &str = "ours";

/// The name in the tables of ours as `replicas` sharded replicas, on an API server that lists
/// by shard or not.
fn sharded_name(replicas: usize, sharded_lists: bool) -> String {
    if sharded_lists {
        format!("{OURS}-sharded-{replicas}")
    } else {
        format!("{OURS}-sharded-{replicas}-gate-off")
    }
}
/// The controller-runtime reference's name in the tables.
pub const REFERENCE: &str = "controller-runtime";

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if !args.report.is_empty() {
        let parts = args
            .report
            .iter()
            .map(|path| Ok((path.clone(), report::read_json(path)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let merged = merge::merge(parts)?;
        if let Some(dir) = &args.plot {
            let mut text = String::new();
            for path in plot::write(&merged.results, dir)? {
                text.push_str(&format!("wrote {}\n", path.display()));
            }
            return print_to_stdout(&text);
        }
        let mut text = String::new();
        if merged.sources.len() > 1 {
            text.push_str(&format!(
                "Measured in {} runs of the bench:\n",
                merged.sources.len()
            ));
            for source in &merged.sources {
                text.push_str(&format!("- {source}\n"));
            }
            text.push('\n');
        }
        text.push_str(&report::markdown(&merged.results));
        return print_to_stdout(&text);
    }
    args.validate()?;
    let manager = match &args.manager_binary {
        Some(path) if path.is_file() => path.clone(),
        Some(path) => anyhow::bail!("--manager-binary: {} is not a file", path.display()),
        None => build_release_manager()?,
    };
    // The workload's controllers only, whatever else the platform registers: the reference
    // runs one, and each controller of ours adds watches of its own.
    let ours_args = || {
        let mut flags = vec![BENCHED_CONTROLLERS.to_owned()];
        flags.extend(args.manager_flag.iter().cloned());
        flags
    };
    let mut contenders = vec![Contender {
        name: OURS.to_owned(),
        binary: manager.clone(),
        extra_args: ours_args(),
        replicas: 1,
        sharded_lists: true,
    }];
    let mut sharded: Vec<usize> = args.replicas.iter().copied().filter(|r| *r > 1).collect();
    sharded.sort_unstable();
    sharded.dedup();
    for replicas in sharded {
        for &sharded_lists in args.sharded_lists.settings() {
            let mut extra_args = ours_args();
            extra_args.push("--sharding".to_owned());
            contenders.push(Contender {
                name: sharded_name(replicas, sharded_lists),
                binary: manager.clone(),
                extra_args,
                replicas,
                sharded_lists,
            });
        }
    }
    for (name, flags) in &args.variant {
        let mut extra_args = ours_args();
        extra_args.extend(flags.iter().cloned());
        contenders.push(Contender {
            name: name.clone(),
            binary: manager.clone(),
            extra_args,
            replicas: 1,
            sharded_lists: true,
        });
    }
    for (name, binary) in &args.also_manager {
        contenders.push(Contender {
            name: name.clone(),
            binary: binary.clone(),
            extra_args: ours_args(),
            replicas: 1,
            sharded_lists: true,
        });
    }
    if !args.no_reference {
        contenders.push(Contender {
            name: REFERENCE.to_owned(),
            binary: reference::build(|line| println!("{line}"))?,
            // Ours runs with RUST_LOG=warn; zap has no warn-only flag value, error is closest.
            extra_args: vec!["--zap-log-level=error".to_owned()],
            replicas: 1,
            sharded_lists: true,
        });
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let mut stop = StopSignals::install()?;
        tokio::select! {
            result = run_async(args, contenders) => result,
            signal = stop.recv() => {
                // Returning drops the bench's future, and with it every manager it started
                // (they are killed on drop) and its namespaces (deleted on drop); the default
                // action of SIGTERM would leave them running.
                anyhow::bail!("stopped by {signal}; what finished before it is in the JSON output")
            }
        }
    })
}

/// Prints `text`; a reader that stopped reading (`--report ... | head`) ends it quietly.
fn print_to_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(error).context("printing the report")
        }
        _ => Ok(()),
    }
}

/// The signals that stop a bench, handled so that stopping it stops what it started.
struct StopSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Handles SIGTERM, SIGINT and SIGHUP from now on, in place of their default action.
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            terminate: signal(SignalKind::terminate()).context("handling SIGTERM")?,
            interrupt: signal(SignalKind::interrupt()).context("handling SIGINT")?,
            hangup: signal(SignalKind::hangup()).context("handling SIGHUP")?,
        })
    }

    /// Waits for one of them and names it.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

async fn run_async(args: BenchArgs, contenders: Vec<Contender>) -> anyhow::Result<()> {
    let cluster = local_cluster(args.real_node).await?;
    let kubeconfig = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir())
        .await
        .context("installing the generated CRDs and RBAC")?;
    let extra = reference::extra_rbac(&kubeconfig.service_account, &kubeconfig.namespace)?;
    testkit::apply_objects(&cluster.client, extra, None)
        .await
        .context("granting the reference what its RBAC markers ask for")?;
    for crd in crds::serve_storage_versions_only(&cluster.client).await? {
        println!(
            "{crd}: served at its storage version only, without conversion (see bench/crds.rs)"
        );
    }
    let counter = probe::RequestCounter::install(&cluster.client, &kubeconfig)
        .await
        .context("installing the request-counting FlowSchema")?;
    let machine = report::Machine::describe(&cluster.client, cluster.state.node.is_some()).await;
    // Everything measured so far, written after each run, recovery and failover, so a bench
    // that fails or is stopped part-way keeps what it finished.
    let mut results = report::Results {
        machine,
        settings: report::Settings::from(&args),
        builds: contenders
            .iter()
            .map(|c| report::Build::of(&c.name, &c.binary))
            .collect::<anyhow::Result<Vec<_>>>()?,
        runs: Vec::new(),
        recovery: Vec::new(),
        failover: Vec::new(),
    };
    let output = args.output.clone().unwrap_or_else(default_output);

    let workload_counts = if args.measures_workload() {
        args.objects.as_slice()
    } else {
        &[]
    };
    for (index, &objects) in workload_counts.iter().enumerate() {
        println!(
            "\n== {objects} objects, concurrency {}, size {}",
            args.concurrency, args.size
        );
        let limit = baseline::measure(&cluster, objects, &args).await?;
        println!(
            "physical limit: {:.2} s for {} writes",
            limit.seconds, limit.writes
        );
        let mut rounds = 1;
        let mut round = 0;
        while round < rounds {
            // Alternate who goes first, so a cluster that drifts during the run favours neither.
            let mut order: Vec<&Contender> = contenders.iter().collect();
            if (index + round) % 2 == 1 {
                order.reverse();
            }
            let mut shortest = f64::INFINITY;
            for contender in order {
                if rounds > 1 {
                    println!("-- {} (run {} of {rounds})", contender.name, round + 1);
                } else {
                    println!("-- {}", contender.name);
                }
                fresh_control_plane(&cluster, args.timeout(), contender.sharded_lists).await?;
                let (run, tenants) = workload::measure(
                    &cluster,
                    contender,
                    &kubeconfig,
                    &counter,
                    objects,
                    &args,
                    limit,
                )
                .await
                .with_context(|| format!("measuring {}", contender.name))?;
                report::print_run(&run);
                shortest = shortest.min(run.measured_seconds());
                results.runs.push(run);
                report::write_json(&output, &results)?;
                tenants
                    .delete_and_wait(&cluster, args.timeout())
                    .await
                    .with_context(|| format!("deleting the namespaces {} used", contender.name))?;
            }
            if round == 0 {
                rounds = runs_needed(shortest, args.min_measured_seconds);
                if rounds > 1 {
                    println!(
                        "the phases took {shortest:.1} s at the shortest, under {} s: measuring {objects} objects {rounds} times, and taking the medians",
                        args.min_measured_seconds
                    );
                }
            }
            round += 1;
        }
    }

    // The cluster goes on with the gate it is started with, which the rest measure with.
    if !workload_counts.is_empty() && contenders.iter().any(|c| !c.sharded_lists) {
        fresh_control_plane(&cluster, args.timeout(), true).await?;
    }

    // A sharded manager's recovery and failover are its replicas' own: not measured here.
    let single = || contenders.iter().filter(|c| c.replicas == 1);
    if args.measures_recovery() {
        for contender in single() {
            println!(
                "\n== recovery of {}: a {} s outage of the API server, then of the control plane, then a foreign Deployment",
                contender.name, args.outage_seconds
            );
            let recovery = recovery::measure(&cluster, contender, &kubeconfig, &args)
                .await
                .with_context(|| format!("recovery of {}", contender.name))?;
            report::print_recovery(&recovery);
            results.recovery.push(recovery);
            report::write_json(&output, &results)?;
        }
    }

    if args.measures_failover() {
        let load = args.objects.iter().copied().max().unwrap_or_default();
        for contender in single() {
            println!(
                "\n== failover of {}, {} rounds each, {load} Memcacheds being scaled",
                contender.name, args.failover_rounds
            );
            let failover = failover::measure(&cluster, contender, &kubeconfig, load, &args)
                .await
                .with_context(|| format!("failover of {}", contender.name))?;
            results.failover.push(failover);
            report::write_json(&output, &results)?;
        }
    }
    counter.remove(&cluster.client).await?;

    println!();
    print!("{}", report::markdown(&results));
    report::write_json(&output, &results)?;
    println!("\nJSON written to {}", output.display());
    Ok(())
}

/// The most runs of one manager at one count.
const MAX_RUNS: usize = 5;

/// How many runs of each manager a count needs whose shortest run measured `seconds` of
/// phases, so that together they measure at least `min_seconds`: an odd number, so the median
/// is one of them, and at most [`MAX_RUNS`].
fn runs_needed(seconds: f64, min_seconds: u64) -> usize {
    #[allow(clippy::cast_precision_loss)]
    let min_seconds = min_seconds as f64;
    if seconds >= min_seconds {
        return 1;
    }
    if seconds.is_nan() || seconds <= 0.0 {
        return MAX_RUNS;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let needed = (min_seconds / seconds).ceil().min(MAX_RUNS as f64) as usize;
    (needed | 1).min(MAX_RUNS)
}

/// Starts the local cluster, with or without its real node, unless it runs already as asked.
async fn local_cluster(real_node: bool) -> anyhow::Result<testkit::TestCluster> {
    let local = localcluster::LocalCluster::from_env()
        .context("finding the local cluster")?
        .with_progress(|line| println!("[cluster] {line}"));
    let local = if real_node {
        local
    } else {
        local.without_real_node()
    };
    let up = local.up().await.context("starting the local cluster")?;
    testkit::TestCluster::connect(up.state().clone())
        .await
        .context("connecting to the local cluster")
}

/// Restarts the control plane (the API server, and the controller manager, the scheduler and
/// kwok with it; the API server with the `ShardedListAndWatch` gate unless `sharded_lists` is
/// false) before a manager is measured, so each starts from the same server and the
/// same controllers: the API server's watch caches and heap grow with every object a run
/// creates and deletes (past 20 GiB after 10,000 Memcacheds), which would slow, or at that
/// size starve, whoever runs next, and the controllers' own caches and queues would carry the
/// last run's work. Started with the API server, the controllers come back without the
/// backoff a restart of the API server alone leaves them on (up to a minute). Then waits until
/// they run a pod again ([`cluster_ready`]), so no manager's clock includes their startup.
async fn fresh_control_plane(
    cluster: &testkit::TestCluster,
    timeout: Duration,
    sharded_lists: bool,
) -> anyhow::Result<()> {
    let local = localcluster::LocalCluster::from_env().context("finding the local cluster")?;
    let local = if sharded_lists {
        local
    } else {
        local.without_sharded_lists()
    };
    let restarted = Instant::now();
    local
        .restart(localcluster::Outage::ControlPlane, Duration::ZERO)
        .await
        .context("restarting the control plane before the next manager")?;
    let ready = restarted.elapsed();
    let canary = cluster_ready::wait_for_controllers(cluster, timeout).await?;
    println!(
        "control plane restarted in {:.1} s; the cluster's controllers ran a canary pod {:.1} s later",
        ready.as_secs_f64(),
        canary.as_secs_f64()
    );
    Ok(())
}

fn default_output() -> PathBuf {
    crate::target_dir().join("bench").join("bench.json")
}

/// One `--also-manager` value: a name the tables can tell from the others, and an existing file.
fn parse_also_manager(value: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = value
        .split_once('=')
        .ok_or_else(|| format!("`{value}` is not NAME=PATH"))?;
    let name = name.trim();
    if name.is_empty() || name == OURS || name == REFERENCE {
        return Err(format!(
            "`{name}` cannot name another build: it must be non-empty and neither `{OURS}` nor `{REFERENCE}`"
        ));
    }
    let path = PathBuf::from(path);
    if !path.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    Ok((name.to_owned(), path))
}

/// `--variant NAME=FLAGS`: a name of its own and at least one flag, each starting with `--`.
fn parse_variant(value: &str) -> Result<(String, Vec<String>), String> {
    let (name, flags) = value
        .split_once('=')
        .ok_or_else(|| format!("`{value}` is not NAME=FLAGS"))?;
    let name = name.trim();
    if name.is_empty() || name == OURS || name == REFERENCE {
        return Err(format!(
            "`{name}` cannot name a variant: it must be non-empty and neither `{OURS}` nor `{REFERENCE}`"
        ));
    }
    let flags: Vec<String> = flags.split_whitespace().map(str::to_owned).collect();
    if flags.is_empty() {
        return Err(format!("the variant `{name}` names no flag"));
    }
    if let Some(flag) = flags.iter().find(|flag| !flag.starts_with("--")) {
        return Err(format!(
            "the variant `{name}`: `{flag}` is not a flag (flags start with `--`)"
        ));
    }
    Ok((name.to_owned(), flags))
}

/// Benchmarks measure the optimised manager, as it ships.
pub(crate) fn build_release_manager() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    println!("building the manager (release)...");
    let status = std::process::Command::new(&cargo)
        .args([
            "build",
            "--release",
            "--package",
            "manager",
            "--bin",
            "manager",
        ])
        .current_dir(crate::workspace_root())
        .status()
        .with_context(|| format!("running {cargo}"))?;
    anyhow::ensure!(
        status.success(),
        "building the release manager failed ({status})"
    );
    Ok(crate::target_dir().join("release").join("manager"))
}

/// The `p`-th percentile (0..=100) of sorted samples, nearest-rank.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::Parser;

    use super::{
        BenchArgs, MAX_RUNS, StopSignals, parse_also_manager, parse_variant, percentile,
        runs_needed, sharded_name,
    };

    #[derive(Debug, Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn a_report_measures_nothing_so_it_takes_no_measuring_options() {
        let parsed = Bench::try_parse_from(["bench", "--report", "old.json"]).expect("valid");
        assert_eq!(parsed.args.report, [PathBuf::from("old.json")]);
        let parsed = Bench::try_parse_from(["bench", "--report", "a.json", "b.json"])
            .expect("several files");
        assert_eq!(
            parsed.args.report,
            [PathBuf::from("a.json"), PathBuf::from("b.json")]
        );
        // The JSON holds what the run was measured with; an option given beside it would be
        // ignored, so it is refused instead.
        for measuring in [
            &["--objects", "100"][..],
            &["--concurrency", "4"],
            &["--min-measured-seconds", "0"],
            &["--no-reference"],
            &["--phases", "failover"],
            &["--output", "new.json"],
            &["--real-node"],
            &["--manager-flag=--reconcile-debounce=1s"],
        ] {
            let argv = ["bench", "--report", "old.json"].iter().chain(measuring);
            let error = Bench::try_parse_from(argv).expect_err("conflicting options");
            assert_eq!(
                error.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{measuring:?}"
            );
        }
    }

    #[test]
    fn plots_are_drawn_from_a_report_only() {
        let parsed =
            Bench::try_parse_from(["bench", "--report", "a.json", "b.json", "--plot", "plots"])
                .expect("valid");
        assert_eq!(parsed.args.plot, Some(PathBuf::from("plots")));
        assert_eq!(parsed.args.report.len(), 2);
        let parsed = Bench::try_parse_from(["bench", "--plot", "plots", "--report", "a.json"])
            .expect("either order");
        assert_eq!(parsed.args.report, [PathBuf::from("a.json")]);
        // Plots need results to draw: a measuring run has none yet.
        let error = Bench::try_parse_from(["bench", "--plot", "plots"]).expect_err("no report");
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        let error = Bench::try_parse_from([
            "bench",
            "--report",
            "a.json",
            "--plot",
            "plots",
            "--objects",
            "100",
        ])
        .expect_err("a measuring option");
        assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn phases_select_what_is_measured_and_refuse_to_measure_nothing() {
        let parse = |argv: &[&str]| {
            Bench::try_parse_from(["bench"].iter().chain(argv))
                .expect("valid")
                .args
        };
        let all = parse(&[]);
        assert!(all.measures_workload() && all.measures_recovery() && all.measures_failover());
        assert!(all.validate().is_ok());

        let sharded = parse(&["--replicas", "1,3"]);
        assert_eq!(sharded.replicas, [1, 3]);
        assert!(sharded.validate().is_ok());
        let both = parse(&["--replicas", "3", "--sharded-lists", "both"]);
        assert_eq!(both.sharded_lists.settings(), [true, false]);
        assert_eq!(sharded_name(3, false), "ours-sharded-3-gate-off");
        let error = parse(&["--replicas", "0,3"])
            .validate()
            .expect_err("no replica");
        assert!(error.to_string().contains("--replicas 0"), "{error}");
        let clash = parse(&[
            "--replicas",
            "3",
            "--also-manager",
            "ours-sharded-3=/bin/sh",
        ]);
        let error = clash.validate().expect_err("a clash");
        assert!(error.to_string().contains("`ours-sharded-3`"), "{error}");

        let failover = parse(&["--phases", "failover", "--objects", "10000"]);
        assert!(!failover.measures_workload() && !failover.measures_recovery());
        assert!(failover.measures_failover());
        assert!(failover.validate().is_ok());

        // The older switches still turn their phase off.
        let workload = parse(&["--failover-rounds", "0", "--outage-seconds", "0"]);
        assert!(workload.measures_workload());
        assert!(!workload.measures_recovery() && !workload.measures_failover());

        let nothing = parse(&[
            "--phases",
            "recovery,failover",
            "--outage-seconds",
            "0",
            "--failover-rounds",
            "0",
        ]);
        let error = nothing
            .validate()
            .expect_err("nothing to measure")
            .to_string();
        assert!(
            error.contains("nothing to measure: --phases recovery,failover"),
            "{error}"
        );

        let unknown = Bench::try_parse_from(["bench", "--phases", "scale"]).expect_err("unknown");
        assert_eq!(unknown.kind(), clap::error::ErrorKind::InvalidValue);
    }

    #[test]
    fn short_counts_run_an_odd_number_of_times_up_to_the_most() {
        assert_eq!(runs_needed(100.0, 60), 1);
        assert_eq!(runs_needed(60.0, 60), 1);
        assert_eq!(runs_needed(40.0, 60), 3, "two runs, made odd");
        assert_eq!(runs_needed(25.0, 60), 3);
        assert_eq!(runs_needed(13.0, 60), MAX_RUNS);
        assert_eq!(runs_needed(1.0, 60), MAX_RUNS);
        assert_eq!(runs_needed(10.0, 20), 3);
        assert_eq!(runs_needed(10.0, 0), 1, "0 measures every count once");
        assert_eq!(runs_needed(f64::INFINITY, 60), 1);
        assert_eq!(runs_needed(0.0, 60), MAX_RUNS);

        // With the default, the usual counts: phases of about 15 s at 100 objects, 150 s at
        // 1000 and 1500 s at 10,000.
        let default = Bench::try_parse_from(["bench"])
            .expect("valid")
            .args
            .min_measured_seconds;
        assert_eq!(runs_needed(15.0, default), MAX_RUNS);
        assert_eq!(runs_needed(150.0, default), 3);
        assert_eq!(runs_needed(1500.0, default), 1);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 50.0), 50.0);
        assert_eq!(percentile(&samples, 99.0), 99.0);
        assert_eq!(percentile(&samples, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn another_build_needs_a_distinct_name_and_an_existing_file() {
        let file = std::env::current_exe().expect("the test binary's path");
        let named = parse_also_manager(&format!("size-opt={}", file.display()));
        assert_eq!(named, Ok(("size-opt".to_owned(), file.clone())));
        for bad in [
            "no-equals-sign",
            "=/bin/sh",
            "ours=/bin/sh",
            "controller-runtime=/bin/sh",
        ] {
            assert!(parse_also_manager(bad).is_err(), "{bad} was accepted");
        }
        let missing = parse_also_manager("x=/no/such/manager");
        assert!(missing.is_err_and(|e| e.contains("/no/such/manager is not a file")));
    }

    #[test]
    fn a_variant_needs_a_distinct_name_and_flags() {
        let variant = parse_variant("no-wait=--wait-for-own-writes=false --reconcile-debounce=0s");
        assert_eq!(
            variant,
            Ok((
                "no-wait".to_owned(),
                vec![
                    "--wait-for-own-writes=false".to_owned(),
                    "--reconcile-debounce=0s".to_owned()
                ]
            ))
        );
        for bad in [
            "no-equals-sign",
            "=--x",
            "ours=--x",
            "controller-runtime=--x",
            "v=",
            "v=x",
        ] {
            assert!(parse_variant(bad).is_err(), "{bad} was accepted");
        }
    }

    #[tokio::test]
    async fn a_stop_signal_is_handled_and_named_instead_of_ending_the_process() {
        let mut stop = StopSignals::install().expect("installing the handlers");
        let pid = i32::try_from(std::process::id()).expect("a pid fits in i32");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGHUP,
        )
        .expect("sending SIGHUP to this process");
        let signal = tokio::time::timeout(std::time::Duration::from_secs(10), stop.recv()).await;
        assert_eq!(signal, Ok("SIGHUP"));
    }
}
