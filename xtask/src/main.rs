//! Developer workflow for the workspace, run as `cargo xtask <command>`.
//!
//! One module per command. Everything here is for people working on the project and for CI; the
//! shipped artefacts are the `manager` binary and the manifests under `deploy/`.

mod bench;
mod bundle;
mod bundle_validator;
mod busybox;
mod catalog;
mod cluster;
mod completions;
mod component;
mod dashboards;
mod demo;
mod dns;
mod docs;
mod gomodule;
mod helm;
mod image;
mod manifests;
mod olm;
mod operator_sdk;
mod opm;
mod setup;
mod storage;
mod test;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Developer workflow for the operator workspace"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Render CRDs, RBAC, the manager's Deployment and samples from the Rust types into `deploy/`.
    Manifests {
        /// Change nothing; exit non-zero and list the stale files if `deploy/` is out of date.
        #[arg(long)]
        check: bool,
        /// Directory to write into (default: `deploy/` at the workspace root); the installer
        /// goes to `dist/` beside it.
        #[arg(long, value_name = "DIR")]
        deploy_dir: Option<PathBuf>,
    },
    /// Render the OLM bundle (ClusterServiceVersion, CRDs, metadata, bundle.Dockerfile) into
    /// `bundle/` from the Rust types and the project metadata in Cargo.toml.
    Bundle(bundle::BundleArgs),
    /// Build a file-based catalog of the bundle images in a registry and push it beside them
    /// (`make catalog-build catalog-push`), for a CatalogSource to offer them to OLM.
    Catalog(catalog::CatalogArgs),
    /// Run the pinned helm, built from source once: `cargo xtask helm -- lint deploy/chart`.
    Helm {
        /// helm's arguments, after `--`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run OLM on the local cluster, built from source.
    Olm {
        #[command(subcommand)]
        command: olm::OlmCommand,
    },
    /// Run the pinned operator-sdk, built from source once: `cargo xtask operator-sdk -- run
    /// bundle REGISTRY/operator-manager-bundle:v0.1.0` (`olm install` prints the whole command).
    OperatorSdk {
        /// operator-sdk's arguments, after `--`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run a real local Kubernetes control plane (etcd, API server, controller manager,
    /// scheduler, kwok fake nodes) built from source.
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// Walk through the Memcached tutorial on the local cluster and leave it running.
    Demo {
        /// Stop the manager a previous `cargo xtask demo` started.
        #[arg(long)]
        stop: bool,
    },
    /// Install the distribution packages the local cluster's real node and the tests need
    /// (as root, with apt-get).
    Setup {
        /// Install nothing; fail and list what is missing.
        #[arg(long)]
        check: bool,
    },
    /// Measure convergence, cost per object and failover on the local cluster.
    Bench(bench::BenchArgs),
    /// Build container images (the manager, memcached) as reproducible OCI archives, without a
    /// container daemon or registry; optionally import them into a containerd.
    Image(image::ImageArgs),
    /// Draw every panel of the generated Grafana dashboards as an SVG in the book, from a real
    /// Prometheus scraping the manager on the local cluster while Memcacheds are resized.
    Dashboards(dashboards::DashboardsArgs),
    /// Write the manager's shell completions (bash, zsh, fish, elvish, PowerShell) and its
    /// man page, from the same definitions as its `--help`.
    Completions {
        /// Directory to write into (default: `completions/` in the cargo target directory).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Build the user documentation (the mdBook in `docs/book/`, with the mdBook version it
    /// pins, installed once) and check every link of the result.
    Docs {
        /// Directory to write the book into (default: `book/` in the cargo target directory).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Run every test, end-to-end tests included, against the local cluster (started and
    /// stopped around the run unless one is already up).
    Test {
        /// Extra arguments for `cargo test`, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if error.kind() == clap::error::ErrorKind::InvalidSubcommand => {
            let commands: Vec<String> = Cli::command()
                .get_subcommands()
                .map(|c| c.get_name().to_owned())
                .collect();
            eprint!("{error}");
            eprintln!("\navailable commands: {}", commands.join(", "));
            return ExitCode::from(2);
        }
        Err(error) => error.exit(),
    };
    let result = match cli.command {
        Command::Manifests { check, deploy_dir } => manifests::run(check, deploy_dir),
        Command::Cluster { command } => cluster::run(command),
        Command::Test { args } => test::run(&args),
        Command::Demo { stop } => {
            if stop {
                demo::stop()
            } else {
                demo::run()
            }
        }
        Command::Bench(args) => bench::run(args),
        Command::Setup { check } => setup::run(check),
        Command::Image(args) => image::run(args),
        Command::Bundle(args) => bundle::run(args),
        Command::Catalog(args) => catalog::run(args),
        Command::Helm { args } => helm::run(&args),
        Command::OperatorSdk { args } => operator_sdk::run(&args),
        Command::Olm { command } => olm::run(command),
        Command::Completions { out } => completions::run(out),
        Command::Dashboards(args) => dashboards::run(&args),
        Command::Docs { out } => docs::run(out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Cargo's target directory: `CARGO_TARGET_DIR`, or `target/` in the workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The workspace root (see [`testkit::workspace_root`]: that of the clone cargo runs xtask
/// from, not necessarily the one it was built in).
pub fn workspace_root() -> PathBuf {
    testkit::workspace_root()
}
