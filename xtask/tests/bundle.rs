//! `cargo xtask bundle` as CI runs it: the committed bundle is what the sources render, and
//! operator-framework's own validators (built from its Go module through the module proxy, like
//! the bench's reference) find nothing in it, warnings included.

use std::process::Command;

#[test]
fn the_committed_bundle_is_current_and_passes_operator_frameworks_validators() {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bundle", "--check", "--validate"])
        .output()
        .expect("xtask runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("passes operator-framework's validators"),
        "{stdout}"
    );
}

#[test]
fn a_stale_bundle_is_listed_by_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bundle", "--check", "--bundle-dir"])
        .arg(dir.path())
        .output()
        .expect("xtask runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("clusterserviceversion.yaml") && stderr.contains("cargo xtask bundle"),
        "{stderr}"
    );
}
