//! `cargo xtask image` as a user runs it: what can be asked for, and a clear refusal otherwise.
//! Building real images needs a release build; the image crate's own tests cover the archives.

use std::process::{Command, Output};

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .expect("xtask runs")
}

#[test]
fn an_unknown_image_is_refused_with_the_choices() {
    let output = xtask(&["image", "postgres"]);
    assert!(!output.status.success());
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("'postgres'"), "{err}");
    assert!(
        err.contains("manager") && err.contains("memcached"),
        "{err}"
    );
}

#[test]
fn help_names_the_images_and_options() {
    let output = xtask(&["image", "--help"]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for word in ["manager", "memcached", "--out", "--containerd"] {
        assert!(help.contains(word), "{word} missing from:\n{help}");
    }
}
