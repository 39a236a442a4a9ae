//! `cargo xtask manifests [--check]`: render `deploy/` from the Rust types.

use std::path::PathBuf;

use anyhow::{Context, bail};
use codegen::Mode;

pub fn run(check: bool, deploy_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let deploy_dir = deploy_dir.unwrap_or_else(|| crate::workspace_root().join("deploy"));
    let mode = if check { Mode::Check } else { Mode::Write };
    let outcome = codegen::generate(&deploy_dir, mode)
        .with_context(|| format!("generating manifests into {}", deploy_dir.display()))?;
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
