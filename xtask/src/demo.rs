//! `cargo xtask demo`: the Memcached tutorial in one command, on the local cluster.
//!
//! 1. installs the distribution packages and brings the local cluster up with its real node
//!    (`cargo xtask setup`, `cargo xtask cluster up`; built once);
//! 2. builds the manager's image and the memcached and redis images and loads them into the
//!    real node;
//! 3. installs everything with `kubectl apply -k deploy/`, as a user would, and waits for the
//!    manager's two replicas to be Ready;
//! 4. applies the Memcached sample (`deploy/samples`, size 3, its image pointed at the local
//!    memcached) in namespace `memcached-demo`, waits until it converges, and stores and reads a
//!    key on every memcached pod;
//! 5. on the real node, applies the KeyValueStore sample beside it: three redis servers, each
//!    with a volume from the cluster's default StorageClass, and a key stored and read back on
//!    each;
//! 6. prints what the tutorial shows, then what to try next and how to stop everything.
//!
//! Where the real node cannot run (not root, packages missing), it says why and runs the
//! manager as a local process against the fake nodes instead, as its ServiceAccount, its
//! admission webhooks on loopback and the generated webhook configurations pointed there.
//!
//! `cargo xtask demo --stop` ([`stop`]) removes the demo's manager and namespace; the cluster
//! keeps running until `cargo xtask cluster down`. The demo's files (pid, log, kubeconfig,
//! manifests) live in the cache directory next to the cluster, never in the repository.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use localcluster::{ClusterState, Credentials, KubeconfigSpec, LocalCluster, Paths};

/// The sample the demo applies, its name, and the namespace it goes to.
const SAMPLE_FILE: &str = "samples/cache_v1alpha1_memcached.yaml";
/// The same sample in the stored version, which needs no conversion webhook: a local manager
/// serves its webhooks on loopback, which the generated CRD does not point at.
const SAMPLE_FILE_V1BETA1: &str = "samples/cache_v1beta1_memcached.yaml";
const SAMPLE: &str = "memcached-sample";
/// The KeyValueStore sample, applied beside it on the real node.
const STORE_SAMPLE_FILE: &str = "samples/cache_v1alpha1_keyvaluestore.yaml";
const STORE_SAMPLE: &str = "keyvaluestore-sample";
const DEMO_NAMESPACE: &str = "memcached-demo";
/// The manager's Deployment, as generated in `deploy/manager`.
const MANAGER_DEPLOYMENT: &str = product::name!();
/// The manager's ServiceAccount and namespace, as generated in `deploy/rbac`.
const SERVICE_ACCOUNT: &str = product::name!();
const MANAGER_NAMESPACE: &str = product::namespace!();
/// How long the sample may take to converge.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a local manager may take to serve its admission webhooks.
const WEBHOOKS_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the manager gets to stop gracefully before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs the demo; see the module documentation.
///
/// # Errors
/// When a step fails; the message names the step, and the manager's log when it is involved.
pub fn run() -> anyhow::Result<()> {
    let files = DemoFiles::new()?;
    step("Installing the distribution packages the local cluster's real node needs");
    let real_node = match crate::setup::run(false) {
        Ok(()) => true,
        Err(error) => {
            println!("The real node cannot run here ({error:#}).");
            false
        }
    };
    step("Starting the local cluster (built from source the first time, which takes a while)");
    let state = cluster_up(real_node)?;
    let kubectl = Kubectl {
        bin: state.bin_dir.join("kubectl"),
        kubeconfig: state.kubeconfig.clone(),
    };
    let deploy = crate::workspace_root().join("deploy");
    if stop_manager(&files)? {
        println!("(stopped the local manager of a previous demo)");
    }
    match &state.node {
        Some(_) => in_cluster(&kubectl, &deploy, &files)?,
        None => {
            println!(
                "The cluster runs without its real node, so the manager runs as a local process \
                 and the memcached pods on kwok's fake nodes (they run nothing)."
            );
            local_process(&kubectl, &state, &deploy, &files)?;
        }
    }

    step("kubectl get memcached");
    print!("{}", kubectl.demo(&["get", "memcached"])?);
    step(&format!(
        "The status of {SAMPLE}: its nodes are the pods' names"
    ));
    print!(
        "{}",
        kubectl.demo(&["get", "memcached", SAMPLE, "-o", STATUS_TEMPLATE])?
    );
    step("kubectl get deployment");
    print!(
        "{}",
        kubectl.demo(&["get", "deployment", SAMPLE, "-o", "wide"])?
    );
    step("kubectl get pods");
    print!(
        "{}",
        kubectl.demo(&["get", "pods", "-l", &memcached_pods(), "-o", "wide"])?
    );
    if state.node.is_some() {
        step("memcached itself: a key stored and read back on every pod");
        for (pod, ip) in pod_addresses(&kubectl, &memcached_pods())? {
            round_trip(&ip, &format!("demo-{pod}"))
                .with_context(|| format!("memcached on pod {pod} ({ip}:11211)"))?;
            println!("set demo-{pod} = hello, get demo-{pod} -> hello   on {pod} ({ip}:11211)");
        }
    }

    let manager_hint = if state.node.is_some() {
        format!(
            "  logs:    kubectl logs -n {MANAGER_NAMESPACE} deployment/{MANAGER_DEPLOYMENT}
  metrics: served over HTTPS to scrapers granted {name}-metrics-reader; to read them as the manager's own account:
           kubectl create clusterrolebinding metrics-demo --clusterrole={name}-metrics-reader --serviceaccount={MANAGER_NAMESPACE}:{name}
           curl -sk -H \"Authorization: Bearer $(kubectl create token {name} -n {MANAGER_NAMESPACE})\" https://$(kubectl get pod -n {MANAGER_NAMESPACE} -l app.kubernetes.io/name={name} -o jsonpath='{{.items[0].status.podIP}}'):8443/metrics | grep -E '^(controller_runtime|workqueue)'
  leader:  kubectl get lease -n {MANAGER_NAMESPACE}",
            name = product::NAME
        )
    } else {
        format!(
            "  logs:    {log}
  metrics: curl -s http://127.0.0.1:{port}/metrics | grep -E '^(controller_runtime|workqueue)'",
            log = files.log.display(),
            port = std::fs::read_to_string(&files.metrics_port)
                .unwrap_or_default()
                .trim()
        )
    };
    let store_hint = if state.node.is_some() {
        format!(
            "Change the store's config and see its servers roll; delete it and see its volume \
             claims go:

  kubectl patch keyvaluestore {STORE_SAMPLE} -p '{{\"spec\":{{\"config\":{{\"maxmemory-policy\":\"noeviction\"}}}}}}' --type=merge
  kubectl delete keyvaluestore {STORE_SAMPLE}; kubectl get pvc

"
        )
    } else {
        String::new()
    };
    let kubeconfig = state.kubeconfig.display();
    let bin = state.bin_dir.display();
    println!(
        "
==> Try it

  export KUBECONFIG={kubeconfig}
  export PATH={bin}:$PATH   # kubectl of the cluster's Kubernetes version
  kubectl config set-context --current --namespace={DEMO_NAMESPACE}

Scale the cluster to 5 and watch the pods and status.nodes follow:

  kubectl patch memcached {SAMPLE} -p '{{\"spec\":{{\"size\":5}}}}' --type=merge
  kubectl get memcached {SAMPLE} -o jsonpath='{{.status.nodes}}'

Ask for an image that is no image reference, and see the validating webhook refuse it:

  kubectl patch memcached {SAMPLE} -p '{{\"spec\":{{\"image\":\"memcached:1.6 -alpine\"}}}}' --type=merge

Scale the Deployment by hand, or delete it or a pod, and see it put back:

  kubectl scale deployment {SAMPLE} --replicas=1
  kubectl get events --field-selector involvedObject.name={SAMPLE}

{store_hint}The manager:
{manager_hint}

Stop it:
  cargo xtask demo --stop     # removes the demo's manager and its namespace
  cargo xtask cluster down    # stops the local cluster"
    );
    Ok(())
}

/// Removes what a previous `cargo xtask demo` started: the in-cluster manager's Deployment and
/// the demo's namespace, or the local manager process.
///
/// # Errors
/// When the process cannot be signalled or kubectl fails.
pub fn stop() -> anyhow::Result<()> {
    let files = DemoFiles::new()?;
    let mut stopped = stop_manager(&files)?;
    if let Ok(state) = LocalCluster::from_env()?.running() {
        let kubectl = Kubectl {
            bin: state.bin_dir.join("kubectl"),
            kubeconfig: state.kubeconfig.clone(),
        };
        let deleted = kubectl.run(&[
            "delete",
            "deployment",
            MANAGER_DEPLOYMENT,
            "-n",
            MANAGER_NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
        ])?;
        stopped |= !deleted.trim().is_empty();
        // With no manager to answer them, the webhook configurations would refuse every write
        // of the platform's types.
        for (kind, name) in [
            (
                "mutatingwebhookconfiguration",
                product::MUTATING_CONFIGURATION,
            ),
            (
                "validatingwebhookconfiguration",
                product::VALIDATING_CONFIGURATION,
            ),
        ] {
            kubectl.run(&["delete", kind, name, "--ignore-not-found"])?;
        }
        kubectl.run(&[
            "delete",
            "namespace",
            DEMO_NAMESPACE,
            "--ignore-not-found",
            "--wait=false",
        ])?;
    }
    if stopped {
        println!(
            "Stopped the demo's manager, removed its webhook configurations and namespace {DEMO_NAMESPACE}."
        );
    } else {
        println!("No demo manager is running.");
    }
    println!("The local cluster keeps running; stop it with `cargo xtask cluster down`.");
    Ok(())
}

/// The real thing: the images loaded into the real node, `kubectl apply -k deploy/`, and the
/// sample with real memcached pods.
fn in_cluster(kubectl: &Kubectl, deploy: &Path, files: &DemoFiles) -> anyhow::Result<()> {
    step(
        "Building the manager's image and the memcached and redis images, and loading them into the real node",
    );
    crate::image::run(crate::image::ImageArgs::all_loaded())?;
    let memcached_image = loaded_image(concat!(product::name!(), ".local/memcached:"))?;

    step(&format!(
        "Installing with `kubectl apply -k deploy/` ({MANAGER_NAMESPACE} marked for the real node first)"
    ));
    let annotations = localcluster::node::namespace_annotations();
    write_namespace(
        &files.manager_namespace,
        MANAGER_NAMESPACE,
        &annotations,
        false,
    )?;
    // Server-side, under a manager of its own: `kubectl apply -k` then leaves the annotations
    // alone (a client-side apply removes what its own last apply set and this one lacks).
    kubectl.run(&[
        "apply",
        "--server-side",
        "--field-manager=demo-real-node",
        "-f",
        path_str(&files.manager_namespace)?,
    ])?;
    print!("{}", kubectl.run(&["apply", "-k", path_str(deploy)?])?);
    print!(
        "{}",
        kubectl.run(&[
            "rollout",
            "status",
            &format!("deployment/{MANAGER_DEPLOYMENT}"),
            "-n",
            MANAGER_NAMESPACE,
            "--timeout=180s",
        ])?
    );
    print!(
        "{}",
        kubectl.run(&["get", "pods", "-n", MANAGER_NAMESPACE, "-o", "wide"])?
    );

    step(&format!(
        "Applying the Memcached sample (size 3) in namespace {DEMO_NAMESPACE}, with image {memcached_image}"
    ));
    write_namespace(&files.demo_namespace, DEMO_NAMESPACE, &annotations, true)?;
    kubectl.run(&["apply", "-f", path_str(&files.demo_namespace)?])?;
    write_sample(&deploy.join(SAMPLE_FILE), &memcached_image, &files.sample)?;
    print!(
        "{}",
        apply_through_webhooks(kubectl, &files.sample, || Ok(()))?
    );
    let manager_ready = || {
        let ready = kubectl.run(&[
            "get",
            "deployment",
            MANAGER_DEPLOYMENT,
            "-n",
            MANAGER_NAMESPACE,
            "-o",
            "jsonpath={.status.readyReplicas}",
        ])?;
        if ready.trim().is_empty() || ready.trim() == "0" {
            bail!(
                "no manager replica is Ready; its log:\n{}",
                kubectl
                    .run(&[
                        "logs",
                        "-n",
                        MANAGER_NAMESPACE,
                        &format!("deployment/{MANAGER_DEPLOYMENT}"),
                        "--tail=40"
                    ])
                    .unwrap_or_default()
            );
        }
        Ok(())
    };
    wait_for_sample(kubectl, manager_ready)?;
    key_value_store(kubectl, deploy, files, manager_ready)
}

/// The KeyValueStore sample: redis servers on the real node, each with a volume from the
/// cluster's default StorageClass, and a key stored and read back on each.
fn key_value_store(
    kubectl: &Kubectl,
    deploy: &Path,
    files: &DemoFiles,
    manager_ready: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let image = loaded_image(concat!(product::name!(), ".local/redis:"))?;
    step(&format!(
        "Applying the KeyValueStore sample (3 redis servers, a volume each) in namespace \
         {DEMO_NAMESPACE}, with image {image}"
    ));
    write_sample(&deploy.join(STORE_SAMPLE_FILE), &image, &files.sample)?;
    print!(
        "{}",
        apply_through_webhooks(kubectl, &files.sample, || Ok(()))?
    );
    let template =
        "jsonpath={.status.readyReplicas}|{.status.conditions[?(@.type==\"Ready\")].status}";
    wait_for_status(
        kubectl,
        "keyvaluestore",
        STORE_SAMPLE,
        template,
        manager_ready,
        |out| out == "3|True",
    )?;
    print!(
        "{}",
        kubectl.demo(&["get", "keyvaluestore,statefulset,pvc", "-o", "wide"])?
    );
    step("redis itself: a key stored and read back on every server");
    for (pod, ip) in pod_addresses(kubectl, &store_pods())? {
        let key = format!("demo-{pod}");
        redis_round_trip(&ip, &key).with_context(|| format!("redis on pod {pod} ({ip}:6379)"))?;
        println!("SET {key} hello, GET {key} -> hello   on {pod} ({ip}:6379)");
    }
    Ok(())
}

/// The label selector of the Memcached sample's pods.
fn memcached_pods() -> String {
    format!("app=memcached,memcached_cr={SAMPLE}")
}

/// The label selector of the KeyValueStore sample's pods.
fn store_pods() -> String {
    format!("app.kubernetes.io/name=keyvaluestore,app.kubernetes.io/instance={STORE_SAMPLE}")
}

/// Stores `key` = `hello` with the redis protocol and reads it back.
fn redis_round_trip(ip: &str, key: &str) -> anyhow::Result<()> {
    use std::io::{BufRead as _, BufReader, Write as _};
    let address: std::net::SocketAddr = format!("{ip}:6379").parse()?;
    let stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let command = |args: &[&str]| {
        let mut text = format!("*{}\r\n", args.len());
        for arg in args {
            text.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        text
    };
    writer.write_all((command(&["SET", key, "hello"]) + &command(&["GET", key])).as_bytes())?;
    let mut answers = Vec::new();
    let mut line = String::new();
    for _ in 0..3 {
        line.clear();
        reader.read_line(&mut line)?;
        answers.push(line.trim_end().to_owned());
    }
    let expected = ["+OK", "$5", "hello"];
    if answers != expected {
        bail!("redis answered {answers:?}, not {expected:?}");
    }
    Ok(())
}

/// Without the real node: the manager as a local process with its ServiceAccount's token, the
/// sample on the fake nodes.
fn local_process(
    kubectl: &Kubectl,
    state: &ClusterState,
    deploy: &Path,
    files: &DemoFiles,
) -> anyhow::Result<()> {
    step("Installing the CRDs and the manager's RBAC from deploy/");
    // Directories are kustomizations (`-k`); the namespace is a single file (`-f`).
    for (how, path) in [
        ("-k", "crds"),
        ("-f", "manager/namespace.yaml"),
        ("-k", "rbac"),
    ] {
        let path = deploy.join(path);
        print!(
            "{}",
            kubectl.run(&[
                "apply",
                "--server-side",
                "--field-manager=demo",
                how,
                path_str(&path)?
            ])?
        );
    }
    kubectl.run(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        concat!("crd/memcacheds.", product::group!(cache)),
    ])?;

    step("Building the manager");
    let binary = build_manager()?;
    let webhook_port = testkit::free_port()?;
    // Installed before the manager starts, so the manager finds them and puts its CA into
    // them before it serves.
    step(&format!(
        "Pointing the generated webhook configurations at the manager on https://127.0.0.1:{webhook_port}"
    ));
    let (mutating, validating) = codegen::webhook_configurations(&codegen::WebhookTarget::Url {
        base: format!("https://127.0.0.1:{webhook_port}"),
    })?;
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            serde_json::to_value(&mutating)?,
            serde_json::to_value(&validating)?,
        ],
    });
    std::fs::write(&files.webhooks, serde_json::to_string_pretty(&list)?)
        .with_context(|| format!("writing {}", files.webhooks.display()))?;
    // A server-side apply under a manager of its own leaves the CA the manager puts in to it.
    print!(
        "{}",
        kubectl.run(&[
            "apply",
            "--server-side",
            "--field-manager=demo",
            "-f",
            path_str(&files.webhooks)?,
        ])?
    );

    step("Starting the manager in the background, as its ServiceAccount");
    write_manager_kubeconfig(kubectl, state, &files.kubeconfig)?;
    let metrics_port = testkit::free_port_other_than(&[webhook_port])?;
    std::fs::write(&files.metrics_port, metrics_port.to_string())
        .with_context(|| format!("writing {}", files.metrics_port.display()))?;
    let pid = start_manager(&binary, files, metrics_port, webhook_port)?;
    println!("manager pid {pid}, log {}", files.log.display());

    step(&format!(
        "Applying the Memcached sample (size 3) in namespace {DEMO_NAMESPACE}"
    ));
    write_namespace(
        &files.demo_namespace,
        DEMO_NAMESPACE,
        &Default::default(),
        true,
    )?;
    kubectl.run(&["apply", "-f", path_str(&files.demo_namespace)?])?;
    let sample = deploy.join(SAMPLE_FILE_V1BETA1);
    // Admission needs the manager serving: until then the API server cannot call it.
    let applied = apply_through_webhooks(kubectl, &sample, || {
        if manager_running(files)? {
            Ok(())
        } else {
            bail!("the manager exited")
        }
    });
    print!(
        "{}",
        applied.with_context(|| format!("the manager's log:\n{}", log_tail(&files.log)))?
    );
    wait_for_sample(kubectl, || {
        if manager_running(files)? {
            Ok(())
        } else {
            bail!("the manager exited; its log:\n{}", log_tail(&files.log))
        }
    })
}

/// Applies `file` in the demo's namespace, retrying for up to [`WEBHOOKS_TIMEOUT`] while the
/// API server cannot reach the manager's webhooks: a local manager may not serve yet, and a
/// replica is Ready a moment before kube-proxy routes its Service to it. `serving` fails when
/// waiting is pointless (the manager exited).
fn apply_through_webhooks(
    kubectl: &Kubectl,
    file: &Path,
    serving: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + WEBHOOKS_TIMEOUT;
    loop {
        match kubectl.demo(&["apply", "-f", path_str(file)?]) {
            Ok(out) => return Ok(out),
            Err(error) => {
                let message = error.to_string();
                let unreachable = message.contains("failed calling webhook")
                    || message.contains("conversion webhook for");
                if !unreachable || Instant::now() >= deadline {
                    return Err(error);
                }
                serving().context(error)?;
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// The full name of the image loaded on the real node whose name starts with `prefix`.
fn loaded_image(prefix: &str) -> anyhow::Result<String> {
    let state = LocalCluster::from_env()?.running()?;
    let node = state.node.context("the local cluster has no real node")?;
    localcluster::node::loaded_images(&node.containerd_socket)?
        .into_iter()
        .find(|image| image.starts_with(prefix))
        .with_context(|| format!("no image {prefix}* is loaded on the real node"))
}

/// A Namespace manifest with the given annotations, enforcing the restricted Pod Security
/// Standard when `restricted`.
fn write_namespace(
    path: &Path,
    name: &str,
    annotations: &std::collections::BTreeMap<String, String>,
    restricted: bool,
) -> anyhow::Result<()> {
    let mut labels = serde_json::Map::new();
    if restricted {
        for mode in ["enforce", "warn", "audit"] {
            labels.insert(
                format!("pod-security.kubernetes.io/{mode}"),
                "restricted".into(),
            );
        }
    }
    let namespace = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": name, "labels": labels, "annotations": annotations },
    });
    std::fs::write(path, serde_json::to_string_pretty(&namespace)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The sample with `spec.image` set to `image` (the sample names the public image, which
/// cannot be pulled here).
fn write_sample(sample: &Path, image: &str, out: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(sample).with_context(|| format!("reading {}", sample.display()))?;
    let mut object: serde_json::Value =
        yaml_serde::from_str(&text).with_context(|| format!("parsing {}", sample.display()))?;
    object["spec"]["image"] = serde_json::Value::String(image.to_owned());
    std::fs::write(out, serde_json::to_string_pretty(&object)?)
        .with_context(|| format!("writing {}", out.display()))
}

/// The pods `selector` selects, and their addresses.
fn pod_addresses(kubectl: &Kubectl, selector: &str) -> anyhow::Result<Vec<(String, String)>> {
    let out = kubectl.demo(&[
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{\"\\n\"}{end}",
    ])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(pod, ip)| (pod.to_owned(), ip.to_owned()))
        .collect())
}

/// Stores `key` = `hello` with the memcached text protocol and reads it back.
fn round_trip(ip: &str, key: &str) -> anyhow::Result<()> {
    use std::io::{BufRead as _, BufReader, Write as _};
    let address: std::net::SocketAddr = format!("{ip}:11211").parse()?;
    let stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    writer.write_all(format!("set {key} 0 300 5\r\nhello\r\nget {key}\r\n").as_bytes())?;
    let mut answers = Vec::new();
    for _ in 0..4 {
        line.clear();
        reader.read_line(&mut line)?;
        answers.push(line.trim_end().to_owned());
    }
    let expected = [
        "STORED".to_owned(),
        format!("VALUE {key} 0 5"),
        "hello".into(),
        "END".into(),
    ];
    if answers != expected {
        bail!("memcached answered {answers:?}, not {expected:?}");
    }
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
    metrics_port: PathBuf,
    manager_namespace: PathBuf,
    demo_namespace: PathBuf,
    sample: PathBuf,
    webhooks: PathBuf,
}

impl DemoFiles {
    fn new() -> anyhow::Result<Self> {
        let dir = Paths::from_env()?.root().join("demo");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            pid: dir.join("manager.pid"),
            log: dir.join("manager.log"),
            kubeconfig: dir.join("manager.kubeconfig"),
            metrics_port: dir.join("manager.metrics-port"),
            manager_namespace: dir.join("manager-namespace.json"),
            demo_namespace: dir.join("demo-namespace.json"),
            sample: dir.join("sample.json"),
            webhooks: dir.join("webhook-configurations.json"),
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

/// The running cluster, started if needed; with its real node when `real_node` and this machine
/// can run it, else (saying why) without.
fn cluster_up(real_node: bool) -> anyhow::Result<ClusterState> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let cluster = LocalCluster::from_env()?.with_progress(|line| println!("  {line}"));
        if real_node {
            match cluster.up().await {
                Ok(up) => {
                    let state = up.state().clone();
                    crate::cluster::install_node_services(&state).await?;
                    return Ok(state);
                }
                Err(error @ localcluster::Error::NodePrerequisite { .. }) => {
                    println!("{error}");
                }
                Err(error) => return Err(error).context("starting the local cluster"),
            }
        }
        if let Ok(state) = cluster.running() {
            return Ok(state);
        }
        let up = cluster
            .without_real_node()
            .up()
            .await
            .context("starting the local cluster")?;
        Ok(up.state().clone())
    })
}

/// `kubectl` of the cluster, as administrator.
struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// Runs kubectl in the demo's namespace.
    fn demo(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["--namespace", DEMO_NAMESPACE];
        all.extend_from_slice(args);
        self.run(&all)
    }

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

/// Starts the manager detached from this process (its own process group, so a Ctrl-C in this
/// terminal does not reach it) and records its pid.
fn start_manager(
    binary: &Path,
    files: &DemoFiles,
    metrics_port: u16,
    webhook_port: u16,
) -> anyhow::Result<u32> {
    use std::os::unix::process::CommandExt as _;
    let log = std::fs::File::create(&files.log)
        .with_context(|| format!("creating {}", files.log.display()))?;
    let child = Command::new(binary)
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
        .arg(format!(
            "--health-probe-bind-address=127.0.0.1:{}",
            testkit::free_port_other_than(&[metrics_port, webhook_port])?
        ))
        .arg(format!("--webhook-bind-address=127.0.0.1:{webhook_port}"))
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

/// Waits until the sample lists 3 nodes and is Available; `manager_alive` fails the wait early
/// (with the manager's log) when the manager is gone.
fn wait_for_sample(
    kubectl: &Kubectl,
    manager_alive: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let template =
        "jsonpath={.status.nodes[*]}|{.status.conditions[?(@.type==\"Available\")].status}";
    wait_for_status(
        kubectl,
        "memcached",
        SAMPLE,
        template,
        manager_alive,
        |out| {
            let (nodes, available) = out.split_once('|').unwrap_or((out, ""));
            nodes.split_whitespace().count() == 3 && available == "True"
        },
    )
}

/// Waits until `converged` holds for what `template` prints of the demo's `kind` `name`,
/// checking `manager_alive` on the way.
fn wait_for_status(
    kubectl: &Kubectl,
    kind: &str,
    name: &str,
    template: &str,
    manager_alive: impl Fn() -> anyhow::Result<()>,
    converged: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < CONVERGE_TIMEOUT {
        manager_alive()?;
        match kubectl.demo(&["get", kind, name, "-o", template]) {
            Ok(out) if converged(&out) => {
                println!("converged in {:.1}s", start.elapsed().as_secs_f64());
                return Ok(());
            }
            Ok(out) => last = out,
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!(
        "{name} did not converge within {}s (last seen: {last})",
        CONVERGE_TIMEOUT.as_secs(),
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
