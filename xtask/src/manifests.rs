//! `cargo xtask manifests [--check]`: render `deploy/` from the Rust types, and the Helm chart
//! in `deploy/chart/` from them and the project metadata.

use std::path::PathBuf;

use anyhow::{Context, bail};
use codegen::Mode;

pub fn run(check: bool, deploy_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let root = crate::workspace_root();
    let deploy_dir = deploy_dir.unwrap_or_else(|| root.join("deploy"));
    let mode = if check { Mode::Check } else { Mode::Write };
    let mut outcome = codegen::generate(&deploy_dir, mode)
        .with_context(|| format!("generating manifests into {}", deploy_dir.display()))?;
    let project = crate::bundle::project(&root)?;
    let chart_dir = deploy_dir.join("chart");
    let chart = codegen::generate_chart(&project, &root, &chart_dir, mode)
        .with_context(|| format!("generating the Helm chart into {}", chart_dir.display()))?;
    let in_chart = |paths: Vec<PathBuf>| paths.into_iter().map(|p| PathBuf::from("chart").join(p));
    outcome.rendered.extend(in_chart(chart.rendered));
    outcome.stale.extend(in_chart(chart.stale));
    if check {
        if !outcome.stale.is_empty() {
            let list: Vec<String> = outcome
                .stale
                .iter()
                .map(|p| format!("  deploy/{}", p.display()))
                .collect();
            bail!(
                "{} generated file(s) not up to date: run `cargo xtask manifests` and commit.\n{}",
                outcome.stale.len(),
                list.join("\n")
            );
        }
        println!("deploy/ is up to date ({} files)", outcome.rendered.len());
    } else if outcome.stale.is_empty() {
        println!(
            "deploy/ already up to date ({} files)",
            outcome.rendered.len()
        );
    } else {
        for path in &outcome.stale {
            println!("updated deploy/{}", path.display());
        }
    }
    Ok(())
}
