//! `cargo xtask test`: the whole test suite, end-to-end tests included, on a local cluster.
//!
//! Builds the manager (the end-to-end tests run the real binary), brings the local control plane
//! up, runs `cargo test --workspace`, then checks in the API server's audit log that the suite
//! used every verb the generated RBAC grants the manager (the ignored `rbac_audit` test), and
//! tears the cluster down again, even when tests fail, if
//! this command was the one that started it: by crashing it and checking that `down` still
//! removes everything (the ignored `crash_cleanup` test). A cluster you started yourself is left
//! running, unless it has no real node (the bench starts it without one): the in-cluster tests
//! need it, so that cluster is replaced by one with it, which is stopped afterwards.

use std::process::Command;

use anyhow::{Context, bail};

use localcluster::LocalCluster;

use crate::cluster::{self, ClusterCommand};

pub fn run(test_args: &[String]) -> anyhow::Result<()> {
    crate::setup::run(false).context("installing the packages the real node needs")?;
    cargo(&["build", "--package", "manager", "--bin", "manager"])
        .context("building the manager")?;

    let running = LocalCluster::from_env()?.status()?.filter(|s| s.healthy());
    // The in-cluster tests need the real node; a cluster without one (as the bench leaves it)
    // is replaced, and then stopped afterwards like any cluster this command starts.
    let already_running = running.as_ref().is_some_and(|s| s.state.node.is_some());
    if already_running {
        println!("Using the local cluster that is already running; it stays up afterwards.");
    } else {
        if running.is_some() {
            println!(
                "The local cluster runs without a real node, which the tests need; replacing it."
            );
        }
        cluster::run(ClusterCommand::Up {
            without_real_node: false,
        })
        .context("starting the local cluster")?;
    }

    // The in-cluster tests run these images on the real node, which cannot pull.
    let loaded = crate::image::run(crate::image::ImageArgs::all_loaded())
        .context("building the images and loading them into the real node");
    if let Err(error) = loaded {
        if !already_running && let Err(e) = cluster::run(ClusterCommand::Down) {
            eprintln!("warning: stopping the local cluster failed: {e:#}");
        }
        return Err(error);
    }

    // Every test binary runs even when one fails, so one run shows every failure; passing tests
    // show what they printed too (the end-to-end tests print what they measured, such as the
    // leader fault test's summary).
    let mut args = vec!["test", "--workspace", "--no-fail-fast"];
    args.extend(test_args.iter().map(String::as_str));
    if !args.contains(&"--") {
        args.push("--");
    }
    args.push("--show-output");
    let tests = cargo(&args).context("tests failed");

    // On a cluster this command started, for the whole suite, the audit log holds exactly the
    // suite's requests: every verb the generated RBAC grants the manager must be among them.
    let whole_suite = !already_running && test_args.is_empty();
    let audited = if whole_suite {
        cargo(&[
            "test",
            "--package",
            "e2e",
            "--test",
            "rbac_audit",
            "--",
            "--ignored",
            "--show-output",
        ])
        .context("a grant of the generated RBAC went unused in the suite")
    } else {
        Ok(())
    };

    // The last test crashes the cluster this command started and checks that `down` still
    // removes everything; a cluster you started, or a filtered run, is left alone.
    let crash = if !whole_suite {
        Ok(())
    } else {
        cargo(&[
            "test",
            "--package",
            "e2e",
            "--test",
            "crash_cleanup",
            "--",
            "--ignored",
            "--show-output",
        ])
        .context("cleaning up after a crashed cluster failed")
    };

    if !already_running && let Err(error) = cluster::run(ClusterCommand::Down) {
        eprintln!("warning: stopping the local cluster failed: {error:#}");
    }
    tests.and(audited).and(crash)
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(crate::workspace_root())
        .status()
        .with_context(|| format!("running {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` exited with {status}", args.join(" "));
    }
    Ok(())
}
