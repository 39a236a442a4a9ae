//! The archive loads with the tools users load images with, not only with containerd: Docker's
//! archive format (`manifest.json`, what `docker load` reads) through `skopeo`'s
//! `docker-archive:` transport, the OCI layout through `oci-archive:`, `podman load` into a
//! throwaway store, and `docker load` into a Docker daemon of the test's own. [`ociimage::push`]
//! puts it in the distribution's registry, where skopeo reads it back. `cargo xtask setup`
//! installs all of them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ociimage::{Image, ImageConfig, ImageFile, Metadata, Port, Reference, User};
use serde_json::Value;

/// The labels every image carries, checked through each loader.
const TITLE: &str = "loader-check";
const VERSION: &str = "0.0.1";

fn built(dir: &Path) -> ociimage::BuiltImage {
    let program = dir.join("program");
    std::fs::write(&program, b"#!/bin/sh\necho loaded\n").expect("writing the program");
    let config = ImageConfig {
        cmd: vec!["--serve".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        exposed_ports: vec![Port::Tcp(8080)],
        ..ImageConfig::new(
            User::new("nonroot", 65532),
            vec!["/program".into()],
            Metadata {
                title: TITLE.into(),
                description: "an image the loaders read".into(),
                version: VERSION.into(),
                revision: Some("0123abc".into()),
                source: None,
                url: None,
                licenses: Some("Apache-2.0".into()),
                labels: Default::default(),
                created: 1_700_000_000,
            },
        )
    };
    let reference = Reference::parse(&format!("{TITLE}:{VERSION}")).expect("a valid reference");
    let mut image = Image::new(reference, config);
    image
        .add(ImageFile::executable(&program, "/program"))
        .expect("adding the program");
    image
        .write(&dir.join("image.oci.tar"))
        .expect("writing the archive")
}

/// Runs a loader; a missing tool fails the test with what to install.
fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}); install it with `cargo xtask setup` (as root)")
        });
    assert!(
        out.status.success(),
        "`{program} {}` failed ({}):\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn assert_labels(labels: &Value, how: &str) {
    assert_eq!(
        labels["org.opencontainers.image.title"], TITLE,
        "{how}: {labels}"
    );
    assert_eq!(
        labels["org.opencontainers.image.version"], VERSION,
        "{how}: {labels}"
    );
    assert_eq!(
        labels["org.opencontainers.image.revision"], "0123abc",
        "{how}: {labels}"
    );
}

#[test]
fn skopeo_reads_the_docker_archive_and_the_oci_layout_alike() {
    let dir = tempfile::tempdir().expect("temp dir");
    let image = built(dir.path());
    let archive = image.archive.display().to_string();

    let docker = json(&run(
        "skopeo",
        &["inspect", &format!("docker-archive:{archive}")],
    ));
    let oci = json(&run(
        "skopeo",
        &["inspect", &format!("oci-archive:{archive}")],
    ));
    assert_labels(&docker["Labels"], "docker-archive");
    assert_labels(&oci["Labels"], "oci-archive");
    // Both formats describe one image: the same configuration, and one layer, which Docker's
    // format names by its uncompressed digest (the configuration's diff id) and the OCI layout
    // by the digest of the compressed blob.
    assert_eq!(docker["Env"], oci["Env"]);
    let config = json(&run(
        "skopeo",
        &["inspect", "--config", &format!("oci-archive:{archive}")],
    ));
    assert_eq!(docker["Layers"], config["rootfs"]["diff_ids"]);
    let manifest = json(&run(
        "skopeo",
        &["inspect", "--raw", &format!("oci-archive:{archive}")],
    ));
    assert_eq!(oci["Layers"][0], manifest["layers"][0]["digest"]);

    // Copying through the Docker format reads every blob `manifest.json` names and checks the
    // layer against the configuration's diff ids, as `docker load` does.
    let copy = dir.path().join("copy");
    run(
        "skopeo",
        &[
            "copy",
            "--quiet",
            &format!("docker-archive:{archive}"),
            &format!("oci:{}:{VERSION}", copy.display()),
        ],
    );
    let copied = json(&run(
        "skopeo",
        &["inspect", &format!("oci:{}:{VERSION}", copy.display())],
    ));
    assert_labels(&copied["Labels"], "copied through docker-archive");
}

#[test]
fn podman_loads_the_archive_under_its_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let image = built(dir.path());
    // A store of its own, so the machine's podman images are neither read nor changed.
    let root = dir.path().join("store");
    let runroot = dir.path().join("run");
    let podman = |args: &[&str]| {
        let mut all = vec![
            "--root",
            root.to_str().expect("a UTF-8 temp path"),
            "--runroot",
            runroot.to_str().expect("a UTF-8 temp path"),
            "--storage-driver",
            "vfs",
            "--events-backend",
            "file",
            "--cgroup-manager",
            "cgroupfs",
        ];
        all.extend_from_slice(args);
        run("podman", &all)
    };

    let loaded = podman(&["load", "--input", &image.archive.display().to_string()]);
    let said = String::from_utf8_lossy(&loaded.stdout);
    let name = format!("{TITLE}:{VERSION}");
    assert!(said.contains(&name), "podman load says: {said}");

    let inspected = json(&podman(&["image", "inspect", &name]));
    let inspected = &inspected[0];
    assert_labels(&inspected["Labels"], "podman");
    assert_eq!(inspected["Config"]["User"], "65532:65532");
    assert_eq!(inspected["Config"]["Entrypoint"][0], "/program");
    // The id podman shows is the configuration's digest, as with every runtime.
    assert_eq!(
        format!("sha256:{}", inspected["Id"].as_str().unwrap_or_default()),
        image.config_digest
    );
}

/// A Docker daemon of the test's own: its state, socket and managed containerd live in a temp
/// directory, and it touches neither the host's network (no bridge, no iptables) nor a daemon the
/// machine may already run. Stopped (SIGTERM, then waited for) when dropped.
struct PrivateDocker {
    daemon: Child,
    socket: PathBuf,
}

impl PrivateDocker {
    fn start(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("creating the daemon's directory");
        let socket = dir.join("docker.sock");
        let log = std::fs::File::create(dir.join("dockerd.log")).expect("creating the daemon log");
        let daemon = Command::new("dockerd")
            .arg("--host")
            .arg(format!("unix://{}", socket.display()))
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .args(["--bridge=none", "--iptables=false", "--ip6tables=false"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cloning the log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run dockerd ({e}); install it with `cargo xtask setup` (as root)")
            });
        let docker = Self { daemon, socket };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answered = Command::new("docker")
                .args(["--host", &docker.host(), "version"])
                .output()
                .is_ok_and(|out| out.status.success());
            if answered {
                return docker;
            }
            assert!(
                Instant::now() < deadline,
                "dockerd did not answer on {} within 60 s; read {}",
                docker.socket.display(),
                dir.join("dockerd.log").display()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    fn run(&self, args: &[&str]) -> Output {
        let host = self.host();
        let mut all = vec!["--host", host.as_str()];
        all.extend_from_slice(args);
        run("docker", &all)
    }
}

impl Drop for PrivateDocker {
    fn drop(&mut self) {
        // SIGTERM lets dockerd stop the containerd it started and unmount its state.
        if let Ok(pid) = i32::try_from(self.daemon.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.daemon.wait();
    }
}

#[test]
fn docker_loads_the_archive_under_its_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let image = built(dir.path());
    let docker = PrivateDocker::start(&dir.path().join("docker"));

    let loaded = docker.run(&["load", "--input", &image.archive.display().to_string()]);
    let said = String::from_utf8_lossy(&loaded.stdout);
    let name = format!("{TITLE}:{VERSION}");
    assert!(said.contains(&name), "docker load says: {said}");

    let inspected = json(&docker.run(&["image", "inspect", &name]));
    let inspected = &inspected[0];
    assert_labels(&inspected["Config"]["Labels"], "docker");
    assert_eq!(inspected["Config"]["User"], "65532:65532");
    assert_eq!(inspected["Config"]["Entrypoint"][0], "/program");
    assert_eq!(inspected["Id"], image.config_digest.as_str());
}

#[test]
fn a_pushed_image_is_what_skopeo_reads_from_the_registry() {
    let dir = tempfile::tempdir().expect("temp dir");
    let image = built(dir.path());
    let registry =
        testkit::PrivateRegistry::start(&dir.path().join("registry")).expect("a registry");

    let pushed = ociimage::push(
        &image.archive,
        registry.address(),
        "team/loader-check",
        VERSION,
    )
    .expect("pushing");
    assert_eq!(pushed.manifest_digest, image.manifest_digest);
    assert_eq!(
        (pushed.uploaded, pushed.present),
        (2, 0),
        "config and layer"
    );
    assert_eq!(
        pushed.name,
        format!("{}/team/loader-check:{VERSION}", registry.address())
    );

    let inspected = json(&run(
        "skopeo",
        &[
            "inspect",
            "--tls-verify=false",
            &format!("docker://{}", pushed.name),
        ],
    ));
    assert_eq!(inspected["Digest"], image.manifest_digest.as_str());
    assert_labels(&inspected["Labels"], "skopeo from the registry");

    let again = ociimage::push(
        &image.archive,
        registry.address(),
        "team/loader-check",
        "latest",
    )
    .expect("pushing again");
    assert_eq!(
        (again.uploaded, again.present),
        (0, 2),
        "nothing sent twice"
    );
    let found = ociimage::manifest_digest(registry.address(), "team/loader-check", "latest")
        .expect("asking the registry");
    assert_eq!(found.as_deref(), Some(image.manifest_digest.as_str()));
    let missing = ociimage::manifest_digest(registry.address(), "team/loader-check", "never")
        .expect("asking the registry");
    assert_eq!(missing, None);
}

#[test]
fn a_push_to_nothing_names_the_registry_and_the_step() {
    let dir = tempfile::tempdir().expect("temp dir");
    let image = built(dir.path());
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port");
    let error = ociimage::push(&image.archive, &closed.to_string(), "x", "v1")
        .expect_err("nothing listens there");
    let text = error.to_string();
    assert!(text.contains(&closed.to_string()), "{text}");
    assert!(text.contains("HEAD /v2/x/blobs/sha256:"), "{text}");
}
