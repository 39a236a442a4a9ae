//! `cargo xtask demo`: the Memcached tutorial in one command, on the local cluster.
//!
//! 1. brings the local control plane up (`cargo xtask cluster up`, built once);
//! 2. installs the CRDs, the manager's namespace and its RBAC from `deploy/`;
//! 3. builds the manager and starts it in the background as its ServiceAccount (so it has
//!    exactly the generated permissions), logging to a file, metrics on a loopback port;
//! 4. applies the Memcached sample (`deploy/samples`, size 3) and waits until it converges;
//! 5. prints what the tutorial shows, then how to scale it, where the logs and metrics are, and
//!    how to stop everything.
//!
//! `cargo xtask demo --stop` ([`stop`]) stops the manager the demo started; the cluster keeps
//! running until `cargo xtask cluster down`. The manager's files (pid, log, kubeconfig) live in
//! the cache directory next to the cluster, never in the repository.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use localcluster::{ClusterState, Credentials, KubeconfigSpec, LocalCluster, Paths};

/// The sample the demo applies, and its name.
const SAMPLE_FILE: &str = "samples/cache_v1alpha1_memcached.yaml";
const SAMPLE: &str = "memcached-sample";
/// The manager's ServiceAccount and namespace, as generated in `deploy/rbac`.
const SERVICE_ACCOUNT: &str = "operator-manager";
const MANAGER_NAMESPACE: &str = "operator-system";
/// How long the sample may take to converge.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the manager gets to stop gracefully before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs the demo; see the module documentation.
///
/// # Errors
/// When a step fails; the message names the step, and the manager's log when it is involved.
pub fn run() -> anyhow::Result<()> {
    let files = DemoFiles::new()?;
    step("Starting the local cluster (built from source the first time, which takes a while)");
    let state = cluster_up()?;
    let kubectl = Kubectl {
        bin: state.bin_dir.join("kubectl"),
        kubeconfig: state.kubeconfig.clone(),
    };
    let deploy = crate::workspace_root().join("deploy");

    step("Installing the CRDs and the manager's RBAC from deploy/");
    for dir in ["crds", "manager/namespace.yaml", "rbac"] {
        let path = deploy.join(dir);
        print!(
            "{}",
            kubectl.run(&[
                "apply",
                "--server-side",
                "--field-manager=demo",
                "-f",
                path_str(&path)?
            ])?
        );
    }
    kubectl.run(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/memcacheds.cache.example.com",
    ])?;

    step("Building the manager");
    let binary = build_manager()?;

    if stop_manager(&files)? {
        println!("(stopped the manager of a previous demo)");
    }
    step("Starting the manager in the background, as its ServiceAccount");
    write_manager_kubeconfig(&kubectl, &state, &files.kubeconfig)?;
    let metrics_port = free_port()?;
    let pid = start_manager(&binary, &files, metrics_port)?;
    println!("manager pid {pid}, log {}", files.log.display());

    step("Applying the Memcached sample (size 3)");
    let sample = deploy.join(SAMPLE_FILE);
    print!("{}", kubectl.run(&["apply", "-f", path_str(&sample)?])?);
    wait_for_sample(&kubectl, &files)?;

    step("kubectl get memcached");
    print!("{}", kubectl.run(&["get", "memcached"])?);
    step(&format!(
        "The status of {SAMPLE}: its nodes are the pods' names"
    ));
    print!(
        "{}",
        kubectl.run(&["get", "memcached", SAMPLE, "-o", STATUS_TEMPLATE])?
    );
    step("kubectl get deployment");
    print!(
        "{}",
        kubectl.run(&["get", "deployment", SAMPLE, "-o", "wide"])?
    );
    step("kubectl get pods");
    print!(
        "{}",
        kubectl.run(&[
            "get",
            "pods",
            "-l",
            &format!("app=memcached,memcached_cr={SAMPLE}"),
            "-o",
            "wide"
        ])?
    );

    let kubeconfig = state.kubeconfig.display();
    let bin = state.bin_dir.display();
    println!(
        "
==> Try it

  export KUBECONFIG={kubeconfig}
  export PATH={bin}:$PATH   # kubectl of the cluster's Kubernetes version

Scale the cluster to 5 and watch the pods and status.nodes follow:

  kubectl patch memcached {SAMPLE} -p '{{\"spec\":{{\"size\":5}}}}' --type=merge
  kubectl get memcached {SAMPLE} -o jsonpath='{{.status.nodes}}'

Scale the Deployment by hand, or delete it or a pod, and see it put back:

  kubectl scale deployment {SAMPLE} --replicas=1
  kubectl get events --field-selector involvedObject.name={SAMPLE}

The manager:
  logs:    {log}
  metrics: curl -s http://127.0.0.1:{metrics_port}/metrics | grep -E '^(controller_runtime|workqueue)'

Stop it:
  cargo xtask demo --stop     # stops the manager this demo started
  cargo xtask cluster down    # stops the local cluster",
        log = files.log.display(),
    );
    Ok(())
}

/// Stops the manager a previous `cargo xtask demo` started, if it still runs.
///
/// # Errors
/// When the process cannot be signalled.
pub fn stop() -> anyhow::Result<()> {
    let files = DemoFiles::new()?;
    if stop_manager(&files)? {
        println!(
            "Stopped the demo's manager (its log stays at {}).",
            files.log.display()
        );
    } else {
        println!("No demo manager is running.");
    }
    println!("The local cluster keeps running; stop it with `cargo xtask cluster down`.");
    Ok(())
}

/// Jsonpath printing the sample's status the way a reader wants it.
const STATUS_TEMPLATE: &str = concat!(
    "jsonpath=",
    "readyReplicas: {.status.readyReplicas}{\"\\n\"}",
    "observedGeneration: {.status.observedGeneration}{\"\\n\"}",
    "nodes:{\"\\n\"}{range .status.nodes[*]}  - {@}{\"\\n\"}{end}",
    "conditions:{\"\\n\"}{range .status.conditions[*]}  - {.type}={.status} ({.reason}: {.message}){\"\\n\"}{end}",
);

/// Where the demo keeps the manager's files: next to the cluster, in the cache directory.
struct DemoFiles {
    pid: PathBuf,
    log: PathBuf,
    kubeconfig: PathBuf,
}

impl DemoFiles {
    fn new() -> anyhow::Result<Self> {
        let dir = Paths::from_env()?.root().join("demo");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            pid: dir.join("manager.pid"),
            log: dir.join("manager.log"),
            kubeconfig: dir.join("manager.kubeconfig"),
        })
    }
}

fn step(what: &str) {
    println!("\n==> {what}");
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not valid UTF-8", path.display()))
}

fn cluster_up() -> anyhow::Result<ClusterState> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let cluster = LocalCluster::from_env()?.with_progress(|line| println!("  {line}"));
        let up = cluster.up().await.context("starting the local cluster")?;
        Ok(up.state().clone())
    })
}

/// `kubectl` of the cluster, as administrator.
struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// Runs kubectl and returns its output; fails with its error output.
    fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.bin)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .output()
            .with_context(|| format!("running {}", self.bin.display()))?;
        if !out.status.success() {
            bail!(
                "`kubectl {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Builds the manager and returns its binary.
fn build_manager() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let root = crate::workspace_root();
    let status = Command::new(&cargo)
        .args(["build", "--package", "manager", "--bin", "manager"])
        .current_dir(&root)
        .status()
        .with_context(|| format!("running {cargo}"))?;
    if !status.success() {
        bail!("building the manager failed ({status})");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_relative() {
                root.join(dir)
            } else {
                dir
            }
        })
        .unwrap_or_else(|| root.join("target"));
    let binary = target.join("debug").join("manager");
    if !binary.is_file() {
        bail!(
            "the manager was built but {} does not exist",
            binary.display()
        );
    }
    Ok(binary)
}

/// A kubeconfig for the manager's ServiceAccount, with a token from the TokenRequest API.
fn write_manager_kubeconfig(
    kubectl: &Kubectl,
    state: &ClusterState,
    path: &Path,
) -> anyhow::Result<()> {
    let token = kubectl.run(&[
        "create",
        "token",
        SERVICE_ACCOUNT,
        "-n",
        MANAGER_NAMESPACE,
        "--duration=24h",
    ])?;
    KubeconfigSpec {
        name: format!("{MANAGER_NAMESPACE}-{SERVICE_ACCOUNT}"),
        server: state.server.clone(),
        certificate_authority: state.ca_cert.clone(),
        credentials: Credentials::Token(token.trim().to_owned()),
        namespace: Some(MANAGER_NAMESPACE.to_owned()),
    }
    .write(path)?;
    Ok(())
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Starts the manager detached from this process (its own process group, so a Ctrl-C in this
/// terminal does not reach it) and records its pid.
fn start_manager(binary: &Path, files: &DemoFiles, metrics_port: u16) -> anyhow::Result<u32> {
    use std::os::unix::process::CommandExt as _;
    let log = std::fs::File::create(&files.log)
        .with_context(|| format!("creating {}", files.log.display()))?;
    let child = Command::new(binary)
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
        .arg(format!(
            "--health-probe-bind-address=127.0.0.1:{}",
            free_port()?
        ))
        .arg("--log-format=text")
        .env("KUBECONFIG", &files.kubeconfig)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned()),
        )
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = child.id();
    std::fs::write(&files.pid, pid.to_string())
        .with_context(|| format!("writing {}", files.pid.display()))?;
    Ok(pid)
}

/// Waits until the sample lists 3 nodes and is Available, or fails with the manager's log.
fn wait_for_sample(kubectl: &Kubectl, files: &DemoFiles) -> anyhow::Result<()> {
    let start = Instant::now();
    let template =
        "jsonpath={.status.nodes[*]}|{.status.conditions[?(@.type==\"Available\")].status}";
    let mut last = String::new();
    while start.elapsed() < CONVERGE_TIMEOUT {
        if !manager_running(files)? {
            bail!("the manager exited; its log:\n{}", log_tail(&files.log));
        }
        match kubectl.run(&["get", "memcached", SAMPLE, "-o", template]) {
            Ok(out) => {
                let (nodes, available) = out.split_once('|').unwrap_or((out.as_str(), ""));
                if nodes.split_whitespace().count() == 3 && available == "True" {
                    println!("converged in {:.1}s", start.elapsed().as_secs_f64());
                    return Ok(());
                }
                last = out;
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!(
        "{SAMPLE} did not converge within {}s (last seen: {last}); the manager's log:\n{}",
        CONVERGE_TIMEOUT.as_secs(),
        log_tail(&files.log)
    )
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The pid of the demo's manager if it still runs (and is still a manager: pids are reused).
fn running_pid(files: &DemoFiles) -> anyhow::Result<Option<i32>> {
    let Ok(text) = std::fs::read_to_string(&files.pid) else {
        return Ok(None);
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return Ok(None);
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    let is_manager = Path::new(std::str::from_utf8(program).unwrap_or_default()).file_name()
        == Some(std::ffi::OsStr::new("manager"));
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    });
    Ok((is_manager && !zombie).then_some(pid))
}

fn manager_running(files: &DemoFiles) -> anyhow::Result<bool> {
    Ok(running_pid(files)?.is_some())
}

/// Stops the demo's manager gracefully (SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]); whether
/// one was running.
fn stop_manager(files: &DemoFiles) -> anyhow::Result<bool> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Some(pid) = running_pid(files)? else {
        let _ = std::fs::remove_file(&files.pid);
        return Ok(false);
    };
    kill(Pid::from_raw(pid), Signal::SIGTERM)
        .with_context(|| format!("stopping the manager (pid {pid})"))?;
    let start = Instant::now();
    while running_pid(files)?.is_some() {
        if start.elapsed() > STOP_TIMEOUT {
            kill(Pid::from_raw(pid), Signal::SIGKILL)
                .with_context(|| format!("killing the manager (pid {pid})"))?;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = std::fs::remove_file(&files.pid);
    Ok(true)
}
