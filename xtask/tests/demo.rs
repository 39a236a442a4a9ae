//! `cargo xtask demo` as a newcomer runs it: it must end with the Memcached sample converged, its
//! pods shown and (with the real node) a memcached round trip on each and a redis round trip on
//! each server of the KeyValueStore sample, and `--stop` must stop the manager it started.

use std::process::{Command, Output};

use localcluster::LocalCluster;

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .expect("xtask runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Stops the demo's manager however the test ends.
struct StopDemo;

impl Drop for StopDemo {
    fn drop(&mut self) {
        let out = xtask(&["demo", "--stop"]);
        if !out.status.success() {
            eprintln!("cargo xtask demo --stop failed: {}", text(&out.stderr));
        }
    }
}

#[test]
fn demo_converges_and_shows_the_pods() {
    let _stop = StopDemo;
    let out = xtask(&["demo"]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        text(&out.stderr)
    );

    // The pods the sample's status lists, read from the cluster, all appear in the output.
    let state = LocalCluster::from_env()
        .and_then(|c| c.running())
        .expect("the demo left the cluster running");
    let nodes = Command::new(state.bin_dir.join("kubectl"))
        .env("KUBECONFIG", &state.kubeconfig)
        .args([
            "get",
            "memcached",
            "memcached-sample",
            "--namespace=memcached-demo",
            "-o",
            "jsonpath={.status.nodes[*]}",
        ])
        .output()
        .expect("kubectl runs");
    let nodes = text(&nodes.stdout);
    let names: Vec<&str> = nodes.split_whitespace().collect();
    assert_eq!(names.len(), 3, "the sample has 3 nodes: {nodes:?}");
    for name in &names {
        assert!(
            stdout.contains(name),
            "the demo shows pod {name}:\n{stdout}"
        );
        if state.node.is_some() {
            assert!(
                stdout.contains(&format!("get demo-{name} -> hello")),
                "the demo reads a key back from memcached on {name}:\n{stdout}"
            );
        }
    }
    if state.node.is_some() {
        // The KeyValueStore sample's three redis servers each keep a key.
        for ordinal in 0..3 {
            let pod = format!("keyvaluestore-sample-{ordinal}");
            assert!(
                stdout.contains(&format!("GET demo-{pod} -> hello   on {pod}")),
                "the demo reads a key back from redis on {pod}:\n{stdout}"
            );
        }
    }
    for expected in [
        "kubectl get memcached",
        "--type=merge",
        "metrics:",
        "cargo xtask demo --stop",
    ] {
        assert!(
            stdout.contains(expected),
            "the demo tells the user about {expected:?}:\n{stdout}"
        );
    }

    let stop = xtask(&["demo", "--stop"]);
    assert!(stop.status.success(), "{}", text(&stop.stderr));
    assert!(
        text(&stop.stdout).contains("Stopped the demo's manager"),
        "{}",
        text(&stop.stdout)
    );
}
