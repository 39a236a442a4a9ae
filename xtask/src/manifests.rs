//! `cargo xtask manifests [--check]`: render `deploy/` from the Rust types, the Helm chart in
//! `deploy/chart/` from them and the project metadata, and the single-file installer
//! `dist/install.yaml`, and the manager's configuration reference `docs/configuration.md`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use codegen::Mode;

pub fn run(check: bool, deploy_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let root = crate::workspace_root();
    let deploy_dir = deploy_dir.unwrap_or_else(|| root.join("deploy"));
    let mode = if check { Mode::Check } else { Mode::Write };
    let mut outcome = codegen::generate(&deploy_dir, mode)
        .with_context(|| format!("generating manifests into {}", deploy_dir.display()))?;
    let under = |dir: &'static str| {
        move |paths: Vec<PathBuf>| paths.into_iter().map(move |p| PathBuf::from(dir).join(p))
    };
    outcome.rendered = under("deploy")(outcome.rendered).collect();
    outcome.stale = under("deploy")(outcome.stale).collect();
    let project = crate::bundle::project(&root)?;
    let chart_dir = deploy_dir.join("chart");
    let chart = codegen::generate_chart(&project, &root, &chart_dir, mode)
        .with_context(|| format!("generating the Helm chart into {}", chart_dir.display()))?;
    outcome
        .rendered
        .extend(under("deploy/chart")(chart.rendered));
    outcome.stale.extend(under("deploy/chart")(chart.stale));
    // Beside `deploy/`: `dist/` of the default layout.
    let dist_dir = deploy_dir.with_file_name("dist");
    let installer = codegen::generate_installer(&dist_dir, mode)
        .with_context(|| format!("generating the installer into {}", dist_dir.display()))?;
    outcome.rendered.extend(under("dist")(installer.rendered));
    outcome.stale.extend(under("dist")(installer.stale));
    let reference = deploy_dir.with_file_name("docs").join("configuration.md");
    if write_if_changed(&reference, &manager::config::reference(), mode)? {
        outcome.stale.push(PathBuf::from("docs/configuration.md"));
    }
    outcome
        .rendered
        .push(PathBuf::from("docs/configuration.md"));
    if check {
        if !outcome.stale.is_empty() {
            let list: Vec<String> = outcome
                .stale
                .iter()
                .map(|p| format!("  {}", p.display()))
                .collect();
            bail!(
                "{} generated file(s) not up to date: run `cargo xtask manifests` and commit.\n{}",
                outcome.stale.len(),
                list.join("\n")
            );
        }
        println!(
            "deploy/, dist/ and the configuration reference are up to date ({} files)",
            outcome.rendered.len()
        );
    } else if outcome.stale.is_empty() {
        println!(
            "deploy/, dist/ and the configuration reference already up to date ({} files)",
            outcome.rendered.len()
        );
    } else {
        for path in &outcome.stale {
            println!("updated {}", path.display());
        }
    }
    Ok(())
}

/// Whether `path` differs from `text`; writes it in [`Mode::Write`].
fn write_if_changed(path: &std::path::Path, text: &str, mode: Mode) -> anyhow::Result<bool> {
    let current = std::fs::read_to_string(path).ok();
    if current.as_deref() == Some(text) {
        return Ok(false);
    }
    if mode == Mode::Write {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(true)
}
