//! `cargo xtask bundle [--check] [--validate]`: the OLM bundle under `bundle/`, rendered from
//! the Rust sources and the project metadata in the workspace's `Cargo.toml`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use codegen::{Mode, Project};

/// The Kubernetes version the bundle is validated against for removed APIs: the one the local
/// cluster runs and k8s-openapi is compiled for.
const K8S_VERSION: &str = "1.37";

#[derive(Debug, clap::Args)]
pub struct BundleArgs {
    /// Change nothing; exit non-zero and list the stale files if `bundle/` is out of date.
    #[arg(long)]
    pub check: bool,
    /// Then run operator-framework's bundle validators (the default ones, OperatorHub's and
    /// the good practices) on it; builds them from the Go module proxy once.
    #[arg(long)]
    pub validate: bool,
    /// Directory to write into (default: `bundle/` at the workspace root).
    #[arg(long, value_name = "DIR")]
    pub bundle_dir: Option<PathBuf>,
}

pub fn run(args: BundleArgs) -> anyhow::Result<()> {
    let root = crate::workspace_root();
    let project = project(&root)?;
    let bundle_dir = args.bundle_dir.unwrap_or_else(|| root.join("bundle"));
    let mode = if args.check { Mode::Check } else { Mode::Write };
    let outcome = codegen::generate_bundle(&project, &root, &bundle_dir, mode)
        .with_context(|| format!("generating the bundle into {}", bundle_dir.display()))?;
    let shown = bundle_dir.strip_prefix(&root).unwrap_or(&bundle_dir);
    if args.check && !outcome.stale.is_empty() {
        let list: Vec<String> = outcome
            .stale
            .iter()
            .map(|p| format!("  {}", shown.join(p).display()))
            .collect();
        bail!(
            "{} bundle file(s) not up to date: run `cargo xtask bundle` and commit.\n{}",
            outcome.stale.len(),
            list.join("\n")
        );
    }
    if args.check || outcome.stale.is_empty() {
        println!(
            "{} is up to date ({} files, {})",
            shown.display(),
            outcome.rendered.len(),
            project.csv_name()
        );
    } else {
        for path in &outcome.stale {
            println!("updated {}", shown.join(path).display());
        }
    }
    if args.validate {
        validate(&bundle_dir)?;
    }
    Ok(())
}

/// The project metadata, read from the workspace's `Cargo.toml`.
pub(crate) fn project(root: &Path) -> anyhow::Result<Project> {
    let path = root.join("Cargo.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Project::from_cargo_toml(&path, &text)?)
}

/// Runs the validators on `bundle_dir`; any error or warning fails, listed.
fn validate(bundle_dir: &Path) -> anyhow::Result<()> {
    let findings = crate::bundle_validator::validate(bundle_dir, K8S_VERSION, |line| {
        println!("{line}");
    })?;
    for warning in &findings.warnings {
        println!("warning: {warning}");
    }
    for error in &findings.errors {
        println!("error: {error}");
    }
    if !findings.errors.is_empty() || !findings.warnings.is_empty() {
        bail!(
            "the bundle validators found {} error(s) and {} warning(s)",
            findings.errors.len(),
            findings.warnings.len()
        );
    }
    println!(
        "the bundle passes operator-framework's validators (default, OperatorHub, good practices)"
    );
    Ok(())
}
