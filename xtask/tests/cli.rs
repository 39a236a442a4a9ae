//! The xtask command line, run as a user would: bad invocations fail clearly.

use std::process::{Command, Output};

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .expect("xtask runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn unknown_subcommand_is_refused() {
    let output = xtask(&["frobnicate"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(
        err.contains("unrecognized subcommand 'frobnicate'"),
        "{err}"
    );
    assert!(
        err.contains("manifests"),
        "the error lists what is available: {err}"
    );
}

#[test]
fn unwritable_output_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "").expect("file");
    let target = blocker.join("deploy");
    let output = xtask(&[
        "manifests",
        "--deploy-dir",
        target.to_str().expect("utf-8 path"),
    ]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(
        err.contains("cannot create directory") && err.contains("a-file"),
        "{err}"
    );
}

#[test]
fn check_fails_and_lists_stale_files_then_passes_after_writing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let deploy = dir.path().join("deploy");
    let deploy_arg = deploy.to_str().expect("utf-8 path");

    let stale = xtask(&["manifests", "--check", "--deploy-dir", deploy_arg]);
    assert!(!stale.status.success());
    let err = stderr(&stale);
    assert!(
        err.contains("not up to date")
            && err.contains(concat!(
                "deploy/crds/",
                product::group!(cache),
                "_memcacheds.yaml"
            )),
        "{err}"
    );

    let write = xtask(&["manifests", "--deploy-dir", deploy_arg]);
    assert!(write.status.success(), "{}", stderr(&write));
    let fresh = xtask(&["manifests", "--check", "--deploy-dir", deploy_arg]);
    assert!(fresh.status.success(), "{}", stderr(&fresh));
}
