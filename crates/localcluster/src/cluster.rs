//! Starting, inspecting and stopping the local control plane.

use std::future::Future;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::certs::{self, Identity, Pki};
use crate::kubeconfig::{Credentials, KubeconfigSpec};
use crate::node::{self, Network, NodeKubeconfigs, NodeStart, NodeState};
use crate::state::{ClusterState, Component, Status};
use crate::toolchain::{self, Binaries, human};
use crate::{Error, Paths, Result, audit, kwok_stages, lock, process, versions};

/// The Service IP range; its first address is the `kubernetes` Service.
const SERVICE_CIDR: &str = "10.96.0.0/16";
const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The cluster DNS Service's address, the tenth of the range as kubeadm and kind have it: the
/// real node's kubelet gives it to pods as their name server, and `kube-system/kube-dns` claims
/// it.
pub const CLUSTER_DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The pod IP range of the fake nodes: a `/18` of it for each (see [`fake_node_pod_cidr`]).
const FAKE_POD_CIDR: &str = "10.244.0.0/16";
/// The address kwok gives its fake nodes, and the range it is in.
const FAKE_NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 240, 0, 1);
const FAKE_NODE_CIDR: &str = "10.240.0.0/16";
/// The annotation that marks a node as a fake one, played by kwok.
pub const FAKE_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// How many fake nodes `up` creates, each played by its own kwok process.
pub const FAKE_NODES: usize = 3;
// Each fake node takes a quarter of `FAKE_POD_CIDR`.
const _: () = assert!(FAKE_NODES <= 4);
/// How many pods a fake node takes.
const FAKE_NODE_PODS: u32 = 10_000;
/// How long a process gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Receives one human-readable line per step.
pub type Progress = Arc<dyn Fn(&str) + Send + Sync>;

/// The local control plane: build once, start, inspect, stop.
///
/// ```no_run
/// # async fn demo() -> Result<(), localcluster::Error> {
/// let cluster = localcluster::LocalCluster::from_env()?.with_progress(|line| eprintln!("{line}"));
/// let up = cluster.up().await?;
/// println!("KUBECONFIG={} kubectl get nodes", up.state().kubeconfig.display());
/// cluster.down().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LocalCluster {
    paths: Paths,
    progress: Progress,
    real_node: bool,
    /// The API server's feature gates beyond its defaults ([`LocalCluster::feature_gates`]).
    sharded_lists: bool,
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("paths", &self.paths)
            .field("real_node", &self.real_node)
            .field("sharded_lists", &self.sharded_lists)
            .finish_non_exhaustive()
    }
}

/// The outcome of [`LocalCluster::up`].
#[derive(Debug, Clone)]
pub enum Up {
    /// A healthy cluster was already running; nothing was done.
    AlreadyRunning(ClusterState),
    /// A cluster was started.
    Started {
        /// The new cluster.
        state: ClusterState,
        /// How long building the binaries took, when they were not cached yet.
        build_time: Option<Duration>,
        /// How long starting the processes took until the cluster was ready.
        start_time: Duration,
    },
}

impl Up {
    /// The running cluster.
    pub fn state(&self) -> &ClusterState {
        match self {
            Self::AlreadyRunning(state) | Self::Started { state, .. } => state,
        }
    }
}

impl LocalCluster {
    /// The cluster in the user's cache directory (see [`Paths::from_env`]).
    ///
    /// # Errors
    /// [`Error::NoCacheDir`].
    pub fn from_env() -> Result<Self> {
        Ok(Self::new(Paths::from_env()?))
    }

    /// The cluster in `paths`, reporting no progress.
    pub fn new(paths: Paths) -> Self {
        Self {
            paths,
            progress: Arc::new(|_| {}),
            real_node: true,
            sharded_lists: true,
        }
    }

    /// Starts the API server without the alpha `ShardedListAndWatch` gate (KEP-5866), so it
    /// serves every list and watch whole, as clusters before 1.36 and most after do.
    #[must_use]
    pub fn without_sharded_lists(mut self) -> Self {
        self.sharded_lists = false;
        self
    }

    /// The API server's feature gates beyond its defaults: `ShardedListAndWatch`, so that
    /// sharded replicas can list and watch only their share, unless
    /// [`LocalCluster::without_sharded_lists`].
    pub fn feature_gates(&self) -> Vec<String> {
        if self.sharded_lists {
            vec!["ShardedListAndWatch=true".to_owned()]
        } else {
            Vec::new()
        }
    }

    /// Starts only the control plane and the fake nodes, without the real node (which needs
    /// root, containerd and a bridge of its own, so only one cluster per machine can have it).
    #[must_use]
    pub fn without_real_node(mut self) -> Self {
        self.real_node = false;
        self
    }

    /// Reports progress, one line per step, to `progress`.
    #[must_use]
    pub fn with_progress(mut self, progress: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.progress = Arc::new(progress);
        self
    }

    /// Its directories.
    pub fn paths(&self) -> &Paths {
        &self.paths
    }

    pub(crate) fn say(&self, line: &str) {
        (self.progress)(line);
    }

    /// The binaries, built (once) if needed; see [`toolchain::ensure`].
    ///
    /// # Errors
    /// As [`toolchain::ensure`].
    pub async fn binaries(&self) -> Result<toolchain::Built> {
        toolchain::ensure(&self.paths, &*self.progress).await
    }

    /// Builds the binaries if needed and starts the cluster, unless a healthy one runs already.
    ///
    /// A cluster that is partly down (say, after a reboot) is cleaned up and started afresh.
    /// Safe to call from several processes at once: they serialise on a file lock and all but
    /// the first find the cluster running. The processes keep running after this returns;
    /// [`LocalCluster::down`] stops them.
    ///
    /// # Errors
    /// Build errors (see [`toolchain::ensure`]), or a component that exits or does not become
    /// ready in time; processes started by a failed call are stopped again, their logs kept.
    pub async fn up(&self) -> Result<Up> {
        let _lock = lock::exclusive(&self.paths.cluster_lock()).await?;
        let state_dir = self.paths.state_dir();
        if let Some(state) = ClusterState::load(&state_dir)? {
            if state.versions == versions::cache_key()
                && state.all_alive()
                && state.node.is_some() == self.real_node
                && state.feature_gates == self.feature_gates()
                && api_ready(&state).await.is_ok()
            {
                self.say("The local cluster is already running; nothing to do.");
                return Ok(Up::AlreadyRunning(state));
            }
            if state.all_alive() && state.feature_gates != self.feature_gates() {
                self.say("The running cluster has other feature gates; replacing it.");
            } else if state.all_alive() && state.node.is_some() != self.real_node {
                self.say(if self.real_node {
                    "The running cluster has no real node; replacing it with one that has."
                } else {
                    "The running cluster has a real node; replacing it with one without."
                });
            } else {
                self.say("Found a stopped or partly running cluster; removing it first.");
            }
            self.stop_all(&state);
        }
        if self.real_node {
            node::check_prerequisites()?;
        }
        if state_dir.exists() {
            std::fs::remove_dir_all(&state_dir).map_err(Error::io("removing", &state_dir))?;
        }

        let built = self.binaries().await?;
        if built.build_time.is_none() {
            self.say(&format!(
                "Using the cached control plane binaries in {}",
                built.binaries.dir().display()
            ));
        }
        let started = Instant::now();
        let mut state = ClusterState {
            versions: versions::cache_key(),
            server: String::new(),
            kubeconfig: self.paths.admin_kubeconfig(),
            ca_cert: PathBuf::new(),
            bin_dir: built.binaries.dir().to_owned(),
            components: Vec::new(),
            node: None,
            audit_log: Some(self.paths.audit_log()),
            feature_gates: self.feature_gates(),
        };
        match self.start(&built.binaries, &state_dir, &mut state).await {
            Ok(()) => {
                let start_time = started.elapsed();
                self.say(&format!(
                    "The local cluster is ready (started in {}).",
                    human(start_time)
                ));
                Ok(Up::Started {
                    state,
                    build_time: built.build_time,
                    start_time,
                })
            }
            Err(e) => {
                self.say("Start-up failed; stopping what was started (logs are kept).");
                self.stop_all(&state);
                Err(e)
            }
        }
    }

    async fn start(&self, bin: &Binaries, dir: &Path, state: &mut ClusterState) -> Result<()> {
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(Error::io("creating", &logs))?;
        let node_ip = self.real_node.then_some(node::NODE_IP);
        let pki = Pki::generate(&dir.join("pki"), KUBERNETES_SERVICE_IP, node_ip)?;
        state.ca_cert = pki.ca_cert();
        self.say("Generated the CA, serving and client certificates and service-account keys");
        if self.real_node {
            // Recorded before it is made, so `down` undoes a half-made network too.
            let mut node = NodeState::new(dir);
            node.network = Network::plan(SERVICE_CIDR, &[FAKE_POD_CIDR, FAKE_NODE_CIDR]);
            state.node = Some(node.clone());
            state.save(dir)?;
            node.network.create()?;
            state.node = Some(node);
            state.save(dir)?;
            self.say(&format!(
                "Created the real node's bridge {} ({}) and routes",
                node::BRIDGE,
                node::NODE_IP
            ));
        }

        // etcd.
        let etcd_port = process::free_port()?;
        let peer_port = process::free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = self.launch(
            state,
            dir,
            &bin.path("etcd"),
            "etcd",
            &[("client", etcd_port), ("peer", peer_port)],
            vec![
                "--name=local".into(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=local={peer_url}"),
                // A throw-away development store: durability is not worth the latency.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
        )?;
        wait(
            "etcd to report healthy",
            Duration::from_secs(60),
            &[&etcd],
            || async { etcd_healthy(etcd_port).await },
        )
        .await?;
        self.say(&format!("etcd is up on {etcd_url}"));

        // kube-apiserver.
        let api_port = process::free_port()?;
        state.server = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = |id: Identity| -> Result<PathBuf> {
            let path = if id.file == certs::ADMIN.file {
                state.kubeconfig.clone()
            } else {
                dir.join(format!("{}.kubeconfig", id.file))
            };
            KubeconfigSpec {
                name: "operator-manager-local".into(),
                server: state.server.clone(),
                certificate_authority: pki.ca_cert(),
                credentials: Credentials::ClientCertificate {
                    cert: pki.client_cert(id),
                    key: pki.client_key(id),
                },
                namespace: None,
            }
            .write(&path)?;
            Ok(path)
        };
        kubeconfig(certs::ADMIN)?;
        let kcm_config = kubeconfig(certs::CONTROLLER_MANAGER)?;
        let scheduler_config = kubeconfig(certs::SCHEDULER)?;
        let kwok_config = kubeconfig(certs::KWOK)?;
        let kubelet_config = kubeconfig(certs::KUBELET)?;
        let kube_proxy_config = kubeconfig(certs::KUBE_PROXY)?;

        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--tls-cert-file={}", pki.serving_cert().display()),
            format!("--tls-private-key-file={}", pki.serving_key().display()),
            format!("--client-ca-file={}", pki.ca_cert().display()),
            "--authorization-mode=Node,RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!(
                "--service-account-key-file={}",
                pki.service_account_pub().display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                pki.service_account_key().display()
            ),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=true".into(),
            // `/debug/pprof` for the admin kubeconfig (it is on loopback only): where the API
            // server's own memory goes under a large bench is a question only its heap answers.
            "--profiling=true".into(),
            // Log each watch the API server closes for falling behind, with its key and
            // selectors: its metrics count those closures by resource only, not by whose
            // watch it was.
            "--vmodule=cache_watcher=1".into(),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            // Namespaces choose between the fake nodes and the real one (see `node`).
            "--enable-admission-plugins=PodNodeSelector,PodTolerationRestriction".into(),
            format!(
                "--kubelet-client-certificate={}",
                pki.client_cert(certs::APISERVER_KUBELET_CLIENT).display()
            ),
            format!(
                "--kubelet-client-key={}",
                pki.client_key(certs::APISERVER_KUBELET_CLIENT).display()
            ),
            // Reach kubelets (logs, exec) at their node's address: a node name is no
            // host name here, and looking it up would ask the machine's DNS.
            "--kubelet-preferred-address-types=InternalIP".into(),
        ];
        let feature_gates = self.feature_gates();
        if !feature_gates.is_empty() {
            apiserver_args.push(format!("--feature-gates={}", feature_gates.join(",")));
        }
        // Its own record of every write, for tests to check who wrote what and when.
        apiserver_args.extend(audit::apiserver_args(&self.paths)?);
        match node_ip {
            // Pods reach the API server through the `kubernetes` Service at the node's address,
            // where a forwarder passes connections on to loopback.
            Some(ip) => apiserver_args.push(format!("--advertise-address={ip}")),
            // The `kubernetes` Service cannot point at a loopback address, and no real pod
            // would use it.
            None => apiserver_args.extend([
                "--advertise-address=127.0.0.1".into(),
                "--endpoint-reconciler-type=none".into(),
            ]),
        }
        let apiserver = self.launch(
            state,
            dir,
            &bin.path("kube-apiserver"),
            "kube-apiserver",
            &[("https", api_port)],
            apiserver_args,
        )?;
        let client = client_from_kubeconfig(&state.kubeconfig).await?;
        wait(
            "the API server to be ready (/readyz)",
            Duration::from_secs(120),
            &[&apiserver],
            || {
                let client = client.clone();
                async move { readyz(&client).await }
            },
        )
        .await?;
        self.say(&format!("kube-apiserver is ready on {}", state.server));

        // kube-controller-manager and kube-scheduler.
        let kcm_port = process::free_port()?;
        let kcm = self.launch(
            state,
            dir,
            &bin.path("kube-controller-manager"),
            "kube-controller-manager",
            &[("https", kcm_port)],
            vec![
                format!("--kubeconfig={}", kcm_config.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={kcm_port}"),
                format!("--cert-dir={}", dir.join("kcm-certs").display()),
                format!("--root-ca-file={}", pki.ca_cert().display()),
                format!(
                    "--service-account-private-key-file={}",
                    pki.service_account_key().display()
                ),
                format!("--cluster-signing-cert-file={}", pki.ca_cert().display()),
                format!("--cluster-signing-key-file={}", pki.ca_key().display()),
                "--use-service-account-credentials=true".into(),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                // Fake nodes have no kubelet; kwok's heartbeat can lag on a busy machine, and
                // the node lifecycle controller would then taint the nodes and evict pods. (So
                // `up` removes the not-ready taint that admission puts on new nodes itself.)
                "--controllers=*,-node-lifecycle-controller".into(),
                "--leader-elect=false".into(),
                // Client-side rate limits high enough that the control plane keeps up with
                // thousands of objects: the benchmarks measure our manager, not these limits.
                "--kube-api-qps=500".into(),
                "--kube-api-burst=1000".into(),
            ],
        )?;
        let scheduler_port = process::free_port()?;
        let scheduler = self.launch(
            state,
            dir,
            &bin.path("kube-scheduler"),
            "kube-scheduler",
            &[("https", scheduler_port)],
            vec![
                format!("--kubeconfig={}", scheduler_config.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={scheduler_port}"),
                format!("--cert-dir={}", dir.join("scheduler-certs").display()),
                "--leader-elect=false".into(),
                "--kube-api-qps=500".into(),
                "--kube-api-burst=1000".into(),
            ],
        )?;

        // kwok, one process for each fake node. A kwok process that manages nodes by selector
        // watches every assigned pod and matches each event in one goroutine; at 10,000 objects
        // it fell behind that watch, and each time the API server closed it, it listed every
        // pod again. One that manages a single node watches only that node's pods, as a
        // kubelet does, so the pods' events are shared out among the processes.
        let kwok_stages = dir.join("kwok-stages.yaml");
        kwok_stages::write(&bin.kwok_stages(), &kwok_stages)?;
        let mut kwoks = Vec::with_capacity(FAKE_NODES);
        for node in 0..FAKE_NODES {
            let kwok_port = process::free_port()?;
            kwoks.push(self.launch(
                state,
                dir,
                &bin.path("kwok"),
                &format!("kwok-{node}"),
                &[("http", kwok_port)],
                vec![
                    format!("--kubeconfig={}", kwok_config.display()),
                    format!("--config={}", kwok_stages.display()),
                    format!("--manage-single-node={}", fake_node_name(node)),
                    format!("--server-address=127.0.0.1:{kwok_port}"),
                    // Used only for a node without a pod range; each fake node has its own,
                    // so that the processes never hand out the same address.
                    format!("--cidr={}", fake_node_pod_cidr(node)),
                    format!("--node-ip={FAKE_NODE_IP}"),
                ],
            )?);
        }
        let kwok_pids = kwoks
            .iter()
            .map(|k| k.pid.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        self.say(&format!(
            "kube-controller-manager (pid {}), kube-scheduler (pid {}) and kwok (pids {kwok_pids}) started",
            kcm.pid, scheduler.pid
        ));

        create_fake_nodes(&client).await?;
        let watched: Vec<&Component> = [&apiserver, &kcm, &scheduler]
            .into_iter()
            .chain(&kwoks)
            .collect();
        wait(
            &format!("kwok to report the {FAKE_NODES} fake nodes Ready"),
            Duration::from_secs(120),
            &watched,
            || {
                let client = client.clone();
                async move { nodes_ready(&client).await }
            },
        )
        .await?;
        untaint_nodes(&client).await?;
        self.say(&format!("{FAKE_NODES} fake nodes are Ready"));
        wait(
            "the default ServiceAccount (controller-manager running)",
            Duration::from_secs(120),
            &watched,
            || {
                let client = client.clone();
                async move {
                    Api::<ServiceAccount>::namespaced(client, "default")
                        .get("default")
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
            },
        )
        .await?;
        self.say("kube-controller-manager created the default ServiceAccount");
        state.save(dir)?;
        if self.real_node {
            let start = NodeStart {
                bin,
                dir,
                pki: &pki,
                kubeconfigs: NodeKubeconfigs {
                    kubelet: kubelet_config,
                    kube_proxy: kube_proxy_config,
                },
                api_port,
                client: &client,
            };
            self.start_node(start, state).await?;
        }
        Ok(())
    }

    /// Starts one component, recording it in `state` (saved at once, so `down` can stop a
    /// half-started cluster).
    pub(crate) fn launch(
        &self,
        state: &mut ClusterState,
        dir: &Path,
        binary: &Path,
        name: &str,
        ports: &[(&str, u16)],
        args: Vec<String>,
    ) -> Result<Component> {
        let binary = binary.to_owned();
        let log = dir.join("logs").join(format!("{name}.log"));
        let pid = process::spawn_detached(name, &binary, &args, &log, dir)?;
        let component = Component {
            name: name.to_owned(),
            pid,
            binary,
            ports: ports.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            log,
        };
        state.components.push(component.clone());
        state.save(dir)?;
        Ok(component)
    }

    /// Stops every process of the cluster (SIGTERM, then SIGKILL after a grace period) and
    /// removes its state. Returns whether there was a cluster to stop.
    ///
    /// # Errors
    /// [`Error::Io`] when the state cannot be removed.
    pub async fn down(&self) -> Result<bool> {
        let _lock = lock::exclusive(&self.paths.cluster_lock()).await?;
        let state_dir = self.paths.state_dir();
        let found = match ClusterState::load(&state_dir) {
            Ok(Some(state)) => {
                let leftovers = self.remove_node(&state);
                for c in state.components.iter().rev() {
                    let killed = process::stop(c.pid, &c.binary, STOP_GRACE);
                    let how = if killed { "killed" } else { "stopped" };
                    self.say(&format!("{how} {} (pid {})", c.name, c.pid));
                }
                if !leftovers.is_empty() {
                    // The state stays, so another `down` can try again.
                    return Err(Error::Leftovers(leftovers));
                }
                true
            }
            Ok(None) => false,
            Err(e) => {
                self.say(&format!("{e}; removing the state anyway"));
                true
            }
        };
        if state_dir.exists() {
            std::fs::remove_dir_all(&state_dir).map_err(Error::io("removing", &state_dir))?;
            self.say(&format!("removed {}", state_dir.display()));
            return Ok(true);
        }
        Ok(found)
    }

    /// What runs where, `None` when no cluster was started.
    ///
    /// # Errors
    /// [`Error::State`] when the saved state is unreadable.
    pub fn status(&self) -> Result<Option<Status>> {
        Ok(ClusterState::load(&self.paths.state_dir())?.map(|state| {
            let alive = state.components.iter().map(Component::alive).collect();
            Status { state, alive }
        }))
    }

    /// The running cluster's state.
    ///
    /// # Errors
    /// [`Error::NotRunning`] when no cluster runs or any of its processes has stopped.
    pub fn running(&self) -> Result<ClusterState> {
        match self.status()? {
            Some(status) if status.healthy() => Ok(status.state),
            _ => Err(Error::NotRunning),
        }
    }

    /// The admin kubeconfig of the running cluster.
    ///
    /// # Errors
    /// [`Error::NotRunning`] when no cluster runs.
    pub fn kubeconfig(&self) -> Result<PathBuf> {
        Ok(self.running()?.kubeconfig)
    }

    /// An admin client of the running cluster.
    ///
    /// # Errors
    /// [`Error::NotRunning`], or [`Error::Kubeconfig`] when the kubeconfig is unusable.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.kubeconfig()?).await
    }
}

impl LocalCluster {
    /// Stops every recorded process, last started first, and removes the real node.
    fn stop_all(&self, state: &ClusterState) {
        for leftover in self.remove_node(state) {
            self.say(&format!("warning: left behind: {leftover}"));
        }
        for c in state.components.iter().rev() {
            process::stop(c.pid, &c.binary, STOP_GRACE);
        }
    }

    /// Removes the real node, if the cluster has one, with a warning per leftover.
    ///
    /// Returns what is still on the machine afterwards.
    fn remove_node(&self, state: &ClusterState) -> Vec<String> {
        let Some(node) = &state.node else {
            return Vec::new();
        };
        self.say("removing the real node (containers, mounts, cgroups, network)");
        let kube_proxy = state.bin_dir.join("kube-proxy");
        for failure in node::teardown(node, &state.components, &kube_proxy, &*self.progress) {
            self.say(&format!("warning: {failure}"));
        }
        node::leftovers(node)
    }
}

/// A client that uses a kubeconfig file (its current context).
///
/// # Errors
/// [`Error::Kubeconfig`].
pub async fn client_from_kubeconfig(kubeconfig: &Path) -> Result<kube::Client> {
    let err = |e: Box<dyn std::error::Error + Send + Sync>| Error::Kubeconfig {
        path: kubeconfig.to_owned(),
        source: e,
    };
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| err(Box::new(e)))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| err(Box::new(e)))?;
    kube::Client::try_from(config).map_err(|e| err(Box::new(e)))
}

/// Polls `check` every 250 ms until it succeeds, failing early when a watched process exits.
pub(crate) async fn wait<T, F, Fut>(
    what: &str,
    timeout: Duration,
    watch: &[&Component],
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if let Some(dead) = watch.iter().find(|c| !c.alive()) {
            return Err(Error::Exited {
                component: dead.name.clone(),
                log: dead.log.clone(),
                tail: process::tail(&dead.log, 30),
            });
        }
        if start.elapsed() > timeout {
            let logs = watch
                .iter()
                .map(|c| c.log.display().to_string())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Error::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs(),
                detail: format!(" (last error: {last}; logs: {logs})"),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// etcd's `/health`.
async fn etcd_healthy(port: u16) -> std::result::Result<(), String> {
    let (_, body) = crate::http::get(Ipv4Addr::LOCALHOST.into(), port, "/health").await?;
    if body.contains("\"health\":\"true\"") {
        Ok(())
    } else {
        Err(format!("etcd is not healthy yet: {}", body.trim()))
    }
}

/// The API server's `/readyz`: `Ok` once it says "ok", else what it said.
pub(crate) async fn readyz(client: &kube::Client) -> std::result::Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let body = client
        .request_text(request)
        .await
        .map_err(|e| e.to_string())?;
    if body.trim() == "ok" {
        Ok(())
    } else {
        Err(body)
    }
}

/// Whether the API server of a saved cluster answers `/readyz`.
async fn api_ready(state: &ClusterState) -> std::result::Result<(), String> {
    let client = client_from_kubeconfig(&state.kubeconfig)
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::timeout(Duration::from_secs(10), readyz(&client))
        .await
        .map_err(|_| "timed out".to_owned())?
}

/// The name of fake node `index`.
fn fake_node_name(index: usize) -> String {
    format!("kwok-node-{index}")
}

/// The pod range of fake node `index`: the `index`th `/18` of [`FAKE_POD_CIDR`], room for more
/// addresses than the node's pod capacity.
fn fake_node_pod_cidr(index: usize) -> String {
    format!("10.244.{}.0/18", index * 64)
}

/// The fake nodes, marked with [`FAKE_NODE_ANNOTATION`]: each one's kwok process reports it
/// Ready and runs its pods. They are large enough that capacity never limits a test.
async fn create_fake_nodes(client: &kube::Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..FAKE_NODES {
        let name = fake_node_name(i);
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {
                    FAKE_NODE_ANNOTATION: "fake",
                    "node.alpha.kubernetes.io/ttl": "0",
                },
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node-role.kubernetes.io/agent": "",
                },
            },
            "spec": { "podCIDR": fake_node_pod_cidr(i), "podCIDRs": [fake_node_pod_cidr(i)] },
            "status": {
                "allocatable": { "cpu": "1000", "memory": "4Ti", "pods": FAKE_NODE_PODS.to_string() },
                "capacity": { "cpu": "1000", "memory": "4Ti", "pods": FAKE_NODE_PODS.to_string() },
            },
        }))
        .map_err(|e| Error::Render {
            what: "a fake node",
            message: e.to_string(),
        })?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => {
                return Err(Error::Api {
                    action: format!("creating node {name}"),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Removes the `node.kubernetes.io/not-ready` taint that admission puts on every new node;
/// the node lifecycle controller, which would lift it, does not run here.
async fn untaint_nodes(client: &kube::Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..FAKE_NODES {
        let name = fake_node_name(i);
        let patch = serde_json::json!({ "spec": { "taints": null } });
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::Api {
                action: format!("removing the taints of {name}"),
                source,
            })?;
    }
    Ok(())
}

async fn nodes_ready(client: &kube::Client) -> std::result::Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let ready = list
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    if ready >= FAKE_NODES {
        Ok(())
    } else {
        Err(format!("{ready} of {FAKE_NODES} nodes are Ready"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::TcpListener;

    use super::*;

    /// A `/prefix` range as its first address and its length.
    fn range(cidr: &str) -> (u32, u32) {
        let (address, prefix) = cidr.split_once('/').expect("a CIDR");
        let address: Ipv4Addr = address.parse().expect("an IPv4 address");
        let prefix: u32 = prefix.parse().expect("a prefix length");
        (u32::from(address), 1 << (32 - prefix))
    }

    #[test]
    fn each_fake_node_has_its_own_pod_range_inside_the_fake_one() {
        let (whole, whole_len) = range(FAKE_POD_CIDR);
        let ranges: Vec<(u32, u32)> = (0..FAKE_NODES)
            .map(|i| range(&fake_node_pod_cidr(i)))
            .collect();
        for (i, &(start, len)) in ranges.iter().enumerate() {
            assert!(
                start >= whole && start + len <= whole + whole_len,
                "node {i} is outside"
            );
            assert!(
                len - 2 >= FAKE_NODE_PODS,
                "node {i} has fewer addresses than pods"
            );
            for &(other, other_len) in &ranges[..i] {
                assert!(
                    start >= other + other_len || other >= start + len,
                    "node {i} overlaps"
                );
            }
        }
    }

    /// Starts `binary args` the way `up` starts a component, logging to `dir/<name>.log`.
    fn component(dir: &Path, name: &str, binary: &Path, args: &[&str]) -> Component {
        let log = dir.join(format!("{name}.log"));
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let pid = process::spawn_detached(name, binary, &args, &log, dir).expect("spawning");
        Component {
            name: name.to_owned(),
            pid,
            binary: binary.to_owned(),
            ports: BTreeMap::new(),
            log,
        }
    }

    #[tokio::test]
    async fn a_component_whose_port_is_taken_fails_with_its_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        // Someone else holds the port the forwarder was given.
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding");
        let port = taken.local_addr().expect("its address").port();
        let socat = node::find_command("socat").expect("socat is installed (`cargo xtask setup`)");
        let forwarder = component(
            dir.path(),
            "apiserver-forwarder",
            &socat,
            &[&format!("TCP-LISTEN:{port},bind=127.0.0.1"), "STDOUT"],
        );

        let error = wait(
            "the forwarder to listen",
            Duration::from_secs(30),
            &[&forwarder],
            || async { Err::<(), _>("not listening yet".to_owned()) },
        )
        .await
        .expect_err("the forwarder cannot listen");
        let message = error.to_string();
        assert!(matches!(error, Error::Exited { .. }), "{message}");
        for expected in [
            "apiserver-forwarder exited during start-up",
            &forwarder.log.display().to_string(),
            "Address already in use",
        ] {
            assert!(message.contains(expected), "{expected:?} in:\n{message}");
        }
    }

    #[tokio::test]
    async fn a_kubelet_that_never_registers_times_out_naming_the_last_error_and_its_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sleep = node::find_command("sleep").expect("sleep");
        let kubelet = component(dir.path(), "kubelet", &sleep, &["30"]);

        let error = wait(
            "the kubelet to register node real-node and report it Ready",
            Duration::from_secs(1),
            &[&kubelet],
            || async { Err::<(), _>("nodes \"real-node\" not found".to_owned()) },
        )
        .await
        .expect_err("the node never registers");
        process::stop(kubelet.pid, &kubelet.binary, Duration::from_secs(1));
        let message = error.to_string();
        assert!(matches!(error, Error::Timeout { .. }), "{message}");
        for expected in [
            "timed out after 1s waiting for the kubelet to register node real-node",
            "last error: nodes \"real-node\" not found",
            &kubelet.log.display().to_string(),
        ] {
            assert!(message.contains(expected), "{expected:?} in:\n{message}");
        }
    }
}
