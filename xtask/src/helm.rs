//! `cargo xtask helm -- <args>`: the Helm release `xtask/helm/go.mod` pins, built from source
//! once (a [`GoModule`], cached like the control plane), then run with the arguments given. The
//! chart's tests run the same binary, so what they check is what users get.
//!
//! Helm finds its cluster as kubectl does (`KUBECONFIG`, `--kubeconfig`); for the local cluster,
//! `KUBECONFIG=$(cargo xtask cluster kubeconfig)`.

use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::gomodule::GoModule;

/// Helm's own module, at the release `go.mod` pins.
pub const MODULE: GoModule = GoModule {
    what: "helm",
    cache_dir: "helm",
    repo_dir: "xtask/helm",
    binary: "helm",
    main_package: "helm.sh/helm/v4/cmd/helm",
    // What Helm's release build stamps, so `helm version` names the exact release.
    ldflags: "-X helm.sh/helm/v4/internal/version.version=v4.3.1",
    tags: "",
    cold_build: "about 2 minutes",
    sources: &[
        ("go.mod", include_str!("../helm/go.mod")),
        ("go.sum", include_str!("../helm/go.sum")),
    ],
};

/// Builds helm unless it is cached, then runs it with `args`; fails when helm does.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let helm = MODULE.build(|line| eprintln!("{line}"))?;
    let status = Command::new(&helm)
        .args(args)
        .stdin(Stdio::inherit())
        .status()
        .with_context(|| format!("running {}", helm.display()))?;
    if !status.success() {
        bail!("`helm {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_module_is_embedded() {
        MODULE.assert_every_file_is_embedded();
    }

    #[test]
    fn helm_4_is_pinned_exactly() {
        let go_mod = MODULE.go_mod();
        assert!(
            go_mod
                .lines()
                .any(|l| l.trim() == "tool helm.sh/helm/v4/cmd/helm"),
            "{go_mod}"
        );
        let pinned: Vec<&str> = go_mod
            .lines()
            .filter_map(|l| l.trim().strip_prefix("helm.sh/helm/v4 "))
            .collect();
        assert_eq!(pinned, ["v4.3.1 // indirect"], "{go_mod}");
        assert!(MODULE.ldflags.ends_with("=v4.3.1"), "{}", MODULE.ldflags);
    }
}
