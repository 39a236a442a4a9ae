//! `cargo xtask image --push` and `cargo xtask bundle --push`, Operator SDK's `make docker-push`
//! and `make bundle bundle-build bundle-push`, against a registry of the test's own: the bundle
//! image carries OLM's labels and a ClusterServiceVersion that installs the pushed manager, and
//! is refused until that manager is there.

use std::path::Path;
use std::process::{Command, Output};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

const PACKAGE: &str = product::name!();
const VERSION: &str = env!("CARGO_PKG_VERSION");

#[test]
fn the_bundle_image_installs_the_pushed_manager_and_waits_for_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let registry = testkit::PrivateRegistry::start(&dir.path().join("registry"))?;
    let address = registry.address();

    let refused = xtask(&["bundle", "--push", "--registry", address])?;
    ensure!(
        !refused.status.success(),
        "pushed a bundle without its manager"
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    for expected in [
        format!("holds no {PACKAGE}:{VERSION}"),
        format!("cargo xtask image manager --push --registry {address}"),
    ] {
        ensure!(said.contains(&expected), "{expected:?} in: {said}");
    }

    let manager = format!("{address}/{PACKAGE}:{VERSION}");
    let pushed = succeeded(xtask(&[
        "image",
        "manager",
        "--push",
        "--registry",
        address,
    ])?)?;
    ensure!(pushed.contains(&format!("pushed:  {manager}")), "{pushed}");
    succeeded(xtask(&["bundle", "--push", "--registry", address])?)?;

    let bundle = format!("docker://{address}/{PACKAGE}-bundle:v{VERSION}");
    let inspected: Value = serde_json::from_slice(
        &run("skopeo", &["inspect", "--tls-verify=false", &bundle])?.stdout,
    )?;
    let labels = &inspected["Labels"];
    ensure!(
        labels["operators.operatorframework.io.bundle.package.v1"] == PACKAGE
            && labels["operators.operatorframework.io.bundle.mediatype.v1"] == "registry+v1",
        "the bundle's labels: {labels}"
    );

    let csv = bundle_file(
        &bundle,
        dir.path(),
        &format!("manifests/{PACKAGE}.clusterserviceversion.yaml"),
    )?;
    ensure!(
        csv.contains(&format!("containerImage: {manager}")),
        "the ClusterServiceVersion does not install {manager}:\n{csv}"
    );
    Ok(())
}

/// A file of the bundle image, read as a user would: copied out with skopeo, its layer unpacked.
fn bundle_file(image: &str, dir: &Path, path: &str) -> Result<String> {
    let copied = dir.join("bundle-image");
    let destination = format!("dir:{}", copied.display());
    run(
        "skopeo",
        &["copy", "--src-tls-verify=false", image, &destination],
    )?;
    let manifest: Value = serde_json::from_slice(&std::fs::read(copied.join("manifest.json"))?)?;
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .and_then(|digest| digest.strip_prefix("sha256:"))
        .context("the bundle image has no layer")?;
    let unpacked = dir.join("bundle-files");
    std::fs::create_dir_all(&unpacked)?;
    let layer = copied.join(layer).display().to_string();
    let into = unpacked.display().to_string();
    run("tar", &["-xzf", &layer, "-C", &into])?;
    Ok(std::fs::read_to_string(unpacked.join(path))?)
}

fn xtask(args: &[&str]) -> Result<Output> {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .with_context(|| format!("running xtask {}", args.join(" ")))?;
    println!(
        "$ cargo xtask {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}

/// What a command that had to succeed printed.
fn succeeded(output: Output) -> Result<String> {
    if !output.status.success() {
        bail!(
            "failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs a tool `cargo xtask setup` installs; a failure is an error with what it said.
fn run(program: &str, args: &[&str]) -> Result<Output> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}; `cargo xtask setup` installs it"))?;
    if !output.status.success() {
        bail!(
            "`{program} {}` failed ({}):\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}
