//! `cargo xtask cluster`: a real Kubernetes control plane on loopback, for development and the
//! end-to-end tests. A thin command line over the `localcluster` crate.

use anyhow::Context as _;
use clap::Subcommand;
use localcluster::{LocalCluster, Up, toolchain::human};

/// The `cluster` subcommands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum ClusterCommand {
    /// Build the control plane (once) and start it with kwok's fake nodes and a real node
    /// (kubelet, containerd, CNI, kube-proxy) whose volumes come from the default StorageClass
    /// `local-path` and whose pods resolve Services through CoreDNS; does nothing when it
    /// already runs.
    Up {
        /// Only the control plane and the fake nodes: no root, containerd or bridge needed.
        #[arg(long)]
        without_real_node: bool,
    },
    /// Stop every process of the control plane and remove its state.
    Down,
    /// Show which processes run, with their pids, ports and logs.
    Status,
    /// Print only the path of the admin kubeconfig, for
    /// `KUBECONFIG=$(cargo xtask cluster kubeconfig) kubectl ...`.
    Kubeconfig,
}

/// Runs one `cluster` subcommand.
///
/// # Errors
/// When the cluster cannot be built, started or found; the message says why.
pub fn run(cmd: ClusterCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run_async(cmd))
}

/// What a cluster with a real node runs for its pods, as kubeadm or kind would: the default
/// StorageClass's provisioner and cluster DNS. Idempotent.
///
/// # Errors
/// When either cannot be built or installed.
pub async fn install_node_services(state: &localcluster::ClusterState) -> anyhow::Result<()> {
    let client = localcluster::client_from_kubeconfig(&state.kubeconfig).await?;
    crate::storage::install(&client, state)
        .await
        .context("installing the local-path provisioner")?;
    crate::dns::install(&client, state)
        .await
        .context("installing cluster DNS")
}

async fn run_async(cmd: ClusterCommand) -> anyhow::Result<()> {
    let cluster = LocalCluster::from_env()?.with_progress(|line| println!("{line}"));
    match cmd {
        ClusterCommand::Up { without_real_node } => {
            let cluster = if without_real_node {
                cluster.without_real_node()
            } else {
                cluster
            };
            let up = cluster.up().await?;
            if let Up::Started {
                build_time,
                start_time,
                ..
            } = &up
            {
                match build_time {
                    Some(t) => println!("Build: {}", human(*t)),
                    None => println!("Build: not needed (binaries cached)"),
                }
                println!("Start: {}", human(*start_time));
            }
            let state = up.state();
            if state.node.is_some() {
                install_node_services(state).await?;
            }
            println!();
            println!("Use it with:");
            println!(
                "  KUBECONFIG={} kubectl get nodes",
                state.kubeconfig.display()
            );
            println!(
                "kubectl of the same version: {}",
                state.bin_dir.join("kubectl").display()
            );
            if state.node.is_some() {
                println!(
                    "Real containers: pods in a namespace annotated with {:?} run on node {}; \
                     other pods land on the fake nodes.",
                    localcluster::node::namespace_annotations(),
                    localcluster::node::NODE_NAME
                );
                println!("Load images into it with: cargo xtask image --load");
            }
            println!("Stop it with: cargo xtask cluster down");
        }
        ClusterCommand::Down => {
            if !cluster.down().await? {
                println!("No local cluster was running.");
            }
        }
        ClusterCommand::Status => match cluster.status()? {
            None => {
                println!("No local cluster is running (start one with `cargo xtask cluster up`).")
            }
            Some(status) => {
                print!("{status}");
                anyhow::ensure!(
                    status.healthy(),
                    "some processes of the local cluster are not running; restart it with \
                     `cargo xtask cluster down && cargo xtask cluster up`"
                );
            }
        },
        ClusterCommand::Kubeconfig => {
            println!("{}", cluster.kubeconfig()?.display());
        }
    }
    Ok(())
}
