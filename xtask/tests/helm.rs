//! The Helm chart in `deploy/chart/`, through the pinned helm users run (`cargo xtask helm`,
//! built from source on first use): lint is clean, the default values render what
//! `kubectl kustomize deploy/` does, other values land where they should, and `helm install`
//! on the local cluster brings up a manager that reconciles the Memcached sample.
//!
//! Two tests install the chart on the cluster, the default values and sharding on three
//! replicas. Both install the cluster-wide objects every install of the manager shares, so they
//! take turns ([`ONE_AT_A_TIME`]).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use apis::Memcached;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde::Deserialize as _;
use serde_json::{Value, json};
use testkit::{PodSecurity, TestCluster, TestNamespace};

/// The release, and the namespace `deploy/` installs into.
const RELEASE: &str = product::name!();
const NAMESPACE: &str = product::namespace!();
/// The Lease the replicas elect a leader with.
const LEASE: &str = concat!(product::name!(), "-leader");
/// The Lease that records which sharded replica holds which slots, and its annotation.
const HOLDERS_LEASE: &str = concat!(product::name!(), "-leader-shards");
const HOLDERS_ANNOTATION: &str = concat!(product::name!(), "/shard-holders");
/// The slots a sharded group splits the objects' uids into.
const SLOTS: usize = 64;
/// Pods of the manager.
const MANAGER_PODS: &str = concat!("app.kubernetes.io/name=", product::name!());
/// The images `cargo xtask image --load` puts on the real node.
const MANAGER_IMAGE: &str = product::name!();
const MEMCACHED_IMAGE: &str = concat!(product::name!(), ".local/memcached");
/// Generous: real containers start on a loaded two-core machine.
const TIMEOUT: Duration = Duration::from_secs(180);

/// Held for the whole of each test that installs the chart.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How a test installs the chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The default values: two replicas, one elected leader.
    Elected,
    /// `sharding.enabled` on three replicas: each reconciles a share.
    Sharded,
}

impl Mode {
    /// The values given on the command line, to `helm template` and `helm install` alike.
    fn values(self) -> &'static [&'static str] {
        match self {
            Mode::Elected => &[],
            Mode::Sharded => &["--set", "sharding.enabled=true", "--set", "replicas=3"],
        }
    }

    fn replicas(self) -> i32 {
        match self {
            Mode::Elected => 2,
            Mode::Sharded => 3,
        }
    }
}

/// Objects by kind, namespace ("" for cluster-scoped) and name.
type Objects = BTreeMap<(String, String, String), Value>;

fn chart_dir() -> PathBuf {
    testkit::deploy_dir().join("chart")
}

/// Helm's own directories, apart from the user's, so their repositories and plugins play no
/// part; removed when dropped.
struct HelmHome(tempfile::TempDir);

impl HelmHome {
    fn new() -> Self {
        Self(tempfile::tempdir().expect("a temporary directory for helm"))
    }

    /// `cargo xtask helm -- args`, against `kubeconfig` if given.
    fn run(&self, kubeconfig: Option<&Path>, args: &[&str]) -> Output {
        let home = self.0.path();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
        cmd.arg("helm")
            .arg("--")
            .args(args)
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_DATA_HOME", home.join("data"))
            .stdin(Stdio::null());
        if let Some(kubeconfig) = kubeconfig {
            cmd.env("KUBECONFIG", kubeconfig);
        }
        cmd.output().expect("xtask runs")
    }

    /// As [`HelmHome::run`], failing unless helm succeeds; returns what it printed.
    fn ok(&self, kubeconfig: Option<&Path>, args: &[&str]) -> Result<String> {
        let out = self.run(kubeconfig, args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(
            out.status.success(),
            "helm {} failed ({}):\n{stdout}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(stdout)
    }

    /// `helm template` of the chart into `operator-system`, CRDs included, with `set` values.
    fn template(&self, set: &[&str]) -> Result<String> {
        let chart = chart_dir();
        let mut args = vec![
            "template",
            RELEASE,
            chart.to_str().context("a UTF-8 path")?,
            "--namespace",
            NAMESPACE,
            "--include-crds",
        ];
        for value in set {
            args.extend(["--set", value]);
        }
        self.ok(None, &args)
    }
}

/// Every object of a multi-document YAML text; two with the same key are an error.
fn objects(yaml: &str) -> Result<Objects> {
    let mut objects = Objects::new();
    for document in yaml_serde::Deserializer::from_str(yaml) {
        let object = Value::deserialize(document).context("a YAML document")?;
        if object.is_null() {
            continue;
        }
        let field = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
        let key = (
            field("/kind").context("an object without kind")?.to_owned(),
            field("/metadata/namespace").unwrap_or_default().to_owned(),
            field("/metadata/name")
                .context("an object without name")?
                .to_owned(),
        );
        if objects.insert(key.clone(), object).is_some() {
            bail!("{key:?} twice");
        }
    }
    Ok(objects)
}

fn get<'a>(objects: &'a Objects, kind: &str, namespace: &str, name: &str) -> &'a Value {
    objects
        .get(&(kind.to_owned(), namespace.to_owned(), name.to_owned()))
        .unwrap_or_else(|| panic!("no {kind} {namespace}/{name} rendered"))
}

fn has(objects: &Objects, kind: &str, name: &str) -> bool {
    objects.keys().any(|(k, _, n)| k == kind && n == name)
}

#[test]
fn helm_lint_is_clean() {
    let out = HelmHome::new()
        .ok(None, &["lint", "--strict", &chart_dir().to_string_lossy()])
        .expect("helm lint --strict passes");
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
    assert!(
        !out.contains("[WARNING]") && !out.contains("[ERROR]"),
        "{out}"
    );
}

#[tokio::test]
async fn default_values_render_what_kustomize_does() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let helm = objects(&HelmHome::new().template(&[])?)?;
    let out = cluster
        .kubectl()
        .arg("kustomize")
        .arg(testkit::deploy_dir())
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl kustomize deploy/: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut kustomize = objects(&String::from_utf8(out.stdout)?)?;
    // The one difference: helm creates the namespace (`--create-namespace`), the chart does not.
    let namespace = ("Namespace".to_owned(), String::new(), NAMESPACE.to_owned());
    ensure!(
        kustomize.remove(&namespace).is_some(),
        "kustomize renders no Namespace"
    );
    let keys = |objects: &Objects| objects.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&helm), keys(&kustomize), "the same objects");
    for (key, object) in &helm {
        assert_eq!(
            object,
            &kustomize[key],
            "{key:?} differs: helm renders\n{}\nkustomize\n{}",
            yaml_serde::to_string(object)?,
            yaml_serde::to_string(&kustomize[key])?
        );
    }
    println!(
        "helm template and kubectl kustomize render the same {} objects",
        helm.len()
    );
    Ok(())
}

#[test]
fn values_land_where_they_should() {
    let home = HelmHome::new();
    let defaults = objects(&home.template(&[]).expect("renders")).expect("objects");
    let rendered = home
        .template(&[
            "metrics.secure=false",
            "leaderElection.enabled=false",
            "replicas=1",
            "controllers={memcached}",
            "serviceMonitor.enabled=true",
            concat!("image.repository=registry.example/", product::name!()),
            "image.tag=dev",
            "image.pullPolicy=Always",
            "resources.limits.memory=512Mi",
            "logging.level=debug",
            "logging.keys=zap",
        ])
        .expect("renders");
    let objects = objects(&rendered).expect("objects");

    let deployment = get(&objects, "Deployment", NAMESPACE, RELEASE);
    assert_eq!(deployment["spec"]["replicas"], 1);
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    assert_eq!(
        container["args"],
        json!([
            concat!("--leader-election-id=", product::name!(), "-leader"),
            "--metrics-bind-address=:8080",
            "--health-probe-bind-address=:8081",
            "--controllers=memcached",
            "--zap-log-level=debug",
            "--log-keys=zap",
        ])
    );
    assert_eq!(
        container["image"],
        concat!("registry.example/", product::name!(), ":dev")
    );
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(container["resources"]["limits"]["memory"], "512Mi");
    assert_eq!(container["resources"]["requests"]["memory"], "64Mi");
    assert_eq!(
        container["ports"][0],
        json!({"name": "http", "containerPort": 8080})
    );
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(
        (
            &annotations["prometheus.io/port"],
            &annotations["prometheus.io/scheme"]
        ),
        (&json!("8080"), &json!("http"))
    );

    let service = get(
        &objects,
        "Service",
        NAMESPACE,
        concat!(product::name!(), "-metrics"),
    );
    assert_eq!(
        service["spec"]["ports"][0],
        json!({"name": "http", "port": 8080, "protocol": "TCP", "targetPort": "http"})
    );
    let policy = get(
        &objects,
        "NetworkPolicy",
        NAMESPACE,
        concat!(product::name!(), "-allow-metrics"),
    );
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 8080);

    let monitor = get(&objects, "ServiceMonitor", NAMESPACE, RELEASE);
    assert_eq!(
        monitor["spec"]["endpoints"],
        json!([{"interval": "30s", "path": "/metrics", "port": "http", "scheme": "http"}])
    );
    assert!(!has(&defaults, "ServiceMonitor", RELEASE), "off by default");

    // Plain HTTP metrics check no tokens: the roles for that go.
    for (kind, name) in [
        ("ClusterRole", concat!(product::name!(), "-metrics-auth")),
        (
            "ClusterRoleBinding",
            concat!(product::name!(), "-metrics-auth"),
        ),
        ("ClusterRole", concat!(product::name!(), "-metrics-reader")),
    ] {
        assert!(has(&defaults, kind, name), "{kind} {name} by default");
        assert!(
            !has(&objects, kind, name),
            "{kind} {name} with plain metrics"
        );
    }
}

#[test]
fn the_pods_placement_labels_and_environment_come_from_the_values() {
    let home = HelmHome::new();
    let rendered = home
        .template(&[
            "podLabels.team=payments",
            "podAnnotations.note=reviewed",
            "nodeSelector.disk=ssd",
            "tolerations[0].key=dedicated",
            "tolerations[0].operator=Exists",
            "topologySpreadConstraints[0].maxSkew=1",
            "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
            "priorityClassName=platform-critical",
            "imagePullSecrets[0].name=regcred",
            "extraEnv[0].name=RUST_BACKTRACE",
            "extraEnv[0].value=full",
            "affinity=null",
        ])
        .expect("renders");
    let objects = objects(&rendered).expect("objects");
    let pod = &get(&objects, "Deployment", NAMESPACE, RELEASE)["spec"]["template"];
    let (metadata, spec) = (&pod["metadata"], &pod["spec"]);
    assert_eq!(metadata["labels"]["team"], "payments");
    assert_eq!(
        metadata["labels"]["app.kubernetes.io/component"], "manager",
        "the selector's labels stay"
    );
    assert_eq!(metadata["annotations"]["note"], "reviewed");
    assert_eq!(metadata["annotations"]["prometheus.io/scrape"], "true");
    assert_eq!(spec["nodeSelector"], json!({"disk": "ssd"}));
    assert_eq!(
        spec["tolerations"],
        json!([{"key": "dedicated", "operator": "Exists"}])
    );
    assert_eq!(spec["topologySpreadConstraints"][0]["maxSkew"], 1);
    assert_eq!(spec["priorityClassName"], "platform-critical");
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert!(
        spec.get("affinity").is_none(),
        "the default affinity dropped"
    );
    let env = spec["containers"][0]["env"].as_array().expect("env");
    assert_eq!(
        env.last(),
        Some(&json!({"name": "RUST_BACKTRACE", "value": "full"}))
    );
    assert!(
        env.iter().any(|e| e["name"] == "POD_NAME"),
        "the manager's own stay"
    );
}

#[test]
fn the_schema_refuses_what_the_manager_would_not_understand() {
    let home = HelmHome::new();
    let chart = chart_dir();
    let refused = |set: &str, said: &str| {
        let out = home.run(
            None,
            &["template", RELEASE, &chart.to_string_lossy(), "--set", set],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} was accepted");
        assert!(stderr.contains(said), "{set}: {stderr}");
    };
    refused(
        "metrics.secur=false",
        "additional properties 'secur' not allowed",
    );
    refused(
        "controllers={memcache}",
        "'memcache' does not match pattern",
    );
    refused("replicas=-1", "/replicas");
    refused("nodeSelector.disk=1", "got number, want string");
    refused("extraEnv[0].value=full", "missing property 'name'");
    refused(
        "extraEnv[0].name=A,extraEnv[0].value=4",
        "got number, want string",
    );
    refused("imagePullSecrets[0].nam=x", "missing property 'name'");
    refused("logging.level=loud", "/logging/level");
    refused("logging.keys=json", "/logging/keys");
    // Two replicas without leader election would both reconcile.
    refused("leaderElection.enabled=false", "/replicas");
}

/// The release on the local cluster; [`Release::remove`] (or, on failure, dropping it)
/// uninstalls it and deletes what Helm leaves behind.
struct Release {
    cluster: TestCluster,
    helm: HelmHome,
    /// The objects the chart renders with default values, to delete what a failed install left.
    manifest: PathBuf,
    /// The chart's CRDs the cluster did not have before the install: the only ones removing
    /// the release deletes, as deleting a CRD deletes every custom resource of it.
    new_crds: Vec<String>,
    removed: bool,
}

impl Release {
    /// Removes a release a previous run left, and every object of `manifest` left by an install
    /// that was not Helm's, such as `kubectl apply -k deploy/`: Helm will not take over objects
    /// it did not create.
    fn remove_leftovers(&self) -> Result<()> {
        self.uninstall()?;
        self.delete_files(&self.manifest)
    }

    fn uninstall(&self) -> Result<()> {
        self.helm.ok(
            Some(&self.cluster.kubeconfig),
            &[
                "uninstall",
                RELEASE,
                "--namespace",
                NAMESPACE,
                "--ignore-not-found",
                "--wait",
            ],
        )?;
        Ok(())
    }

    /// Deletes the objects of a file or directory of manifests; gone already is fine.
    fn delete_files(&self, path: &Path) -> Result<()> {
        cluster_kubectl(
            &self.cluster,
            &[
                "delete",
                "--ignore-not-found",
                "-f",
                &path.to_string_lossy(),
            ],
        )?;
        Ok(())
    }

    fn remove(&mut self) -> Result<()> {
        self.removed = true;
        self.uninstall()?;
        // Helm installs `crds/` but never deletes them (their deletion would delete every
        // custom resource with them), so that is left to the cluster's owner: here, the test,
        // and only for the CRDs its install created.
        if !self.new_crds.is_empty() {
            let mut args = vec!["delete", "customresourcedefinition", "--ignore-not-found"];
            args.extend(self.new_crds.iter().map(String::as_str));
            cluster_kubectl(&self.cluster, &args)?;
        }
        // The namespace is Helm's only to create: the Lease and the webhook certificate's
        // Secret the manager wrote are in it.
        cluster_kubectl(
            &self.cluster,
            &["delete", "namespace", NAMESPACE, "--ignore-not-found"],
        )?;
        Ok(())
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if let Err(e) = self.remove() {
            eprintln!("warning: removing the release: {e:#}");
        }
        // What an install that failed half-way may have left, webhook configurations first:
        // with no manager to answer them, every write of a Memcached would be refused.
        if let Err(e) = self.remove_leftovers() {
            eprintln!("warning: {e:#}");
        }
    }
}

#[tokio::test]
async fn helm_install_brings_up_a_working_manager() -> Result<()> {
    install_and_reconcile(Mode::Elected).await
}

#[tokio::test]
async fn helm_install_with_sharding_splits_the_slots_among_the_replicas() -> Result<()> {
    install_and_reconcile(Mode::Sharded).await
}

/// Installs the chart as `mode` says, converges the Memcached sample through it, uninstalls it
/// and checks nothing of it is left.
async fn install_and_reconcile(mode: Mode) -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = testkit::cluster().await?;
    cluster.loaded_image(MANAGER_IMAGE, "manager")?;
    let memcached_image = cluster.loaded_image(MEMCACHED_IMAGE, "memcached")?;
    let helm = HelmHome::new();
    let manifest = helm.0.path().join("manifest.yaml");
    let chart = chart_dir().to_string_lossy().into_owned();
    let mut template = vec!["template", RELEASE, &chart, "--namespace", NAMESPACE];
    template.extend(mode.values());
    let rendered = helm.ok(None, &template)?;
    std::fs::write(&manifest, &rendered)?;
    let new_crds = crds_missing(&cluster).await?;
    let mut release = Release {
        cluster: cluster.clone(),
        helm,
        manifest,
        new_crds,
        removed: false,
    };
    release.remove_leftovers()?;

    let result = scenario(&release, mode, &memcached_image).await;
    let report = if result.is_err() {
        cluster.pods_report(NAMESPACE, MANAGER_PODS)
    } else {
        String::new()
    };
    result.with_context(|| report)?;

    let started = Instant::now();
    release.remove()?;
    nothing_left(&cluster, &objects(&rendered)?, &release.new_crds).await?;
    println!(
        "helm uninstall, then the namespace and the {} CRDs the install created deleted: \
         nothing of the release is left ({:.1}s)",
        release.new_crds.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn scenario(release: &Release, mode: Mode, memcached_image: &str) -> Result<()> {
    let cluster = &release.cluster;
    let started = Instant::now();
    // Helm would create the namespace (`--create-namespace` leaves one that exists alone);
    // here it is created first to mark it for the real node, as a cluster of only real nodes
    // needs no help with, and to enforce the restricted standard the manager is built for.
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(NAMESPACE.to_owned()),
            annotations: Some(localcluster::node::namespace_annotations()),
            labels: Some(testkit::pod_security_labels(PodSecurity::Restricted)),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(cluster.client.clone())
        .patch(
            NAMESPACE,
            &PatchParams::apply("e2e-real-node").force(),
            &Patch::Apply(&namespace),
        )
        .await
        .context(concat!(
            "marking ",
            product::namespace!(),
            " for the real node"
        ))?;

    let chart = chart_dir().to_string_lossy().into_owned();
    let mut install = vec![
        "install",
        RELEASE,
        &chart,
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
    ];
    install.extend(mode.values());
    release.helm.ok(Some(&cluster.kubeconfig), &install)?;
    let status: Value = serde_json::from_str(&release.helm.ok(
        Some(&cluster.kubeconfig),
        &["status", RELEASE, "--namespace", NAMESPACE, "-o", "json"],
    )?)?;
    ensure!(
        status["info"]["status"] == "deployed",
        "helm status: {}",
        status["info"]
    );
    let replicas = mode.replicas();
    replicas_ready(cluster, replicas).await?;
    let reconciling = match mode {
        Mode::Elected => format!("{} leads", leader(cluster).await?),
        Mode::Sharded => format!(
            "each holds a share of the slots: {}",
            shares(cluster).await?
        ),
    };
    println!(
        "helm install --wait: the release is deployed, {replicas} replicas Ready on the real \
         node, {reconciling} ({:.1}s)",
        started.elapsed().as_secs_f64()
    );

    let ns = TestNamespace::on_real_node(cluster, "helm", PodSecurity::Restricted).await?;
    // The sample as it is, but for the image: the public one cannot be pulled here.
    let sample_path = testkit::deploy_dir().join("samples/cache_v1beta1_memcached.yaml");
    let mut sample: Value = yaml_serde::from_str(&std::fs::read_to_string(&sample_path)?)?;
    sample["spec"]["image"] = json!(memcached_image);
    let name = sample["metadata"]["name"]
        .as_str()
        .context("the sample's name")?
        .to_owned();
    let size = sample["spec"]["size"]
        .as_i64()
        .context("the sample's size")?;
    // Through the admission webhooks (failure policy Fail): the chart's webhook Service reaches
    // the manager, which trusts nothing but the CA it provisioned. A replica is Ready a moment
    // before kube-proxy routes the Service to it, so the first calls may be refused.
    let manifest = serde_json::to_string(&sample)?;
    testkit::wait_for(
        "the webhooks to admit the sample",
        Duration::from_secs(60),
        || async { kubectl_stdin(cluster, &["apply", "-n", ns.name(), "-f", "-"], &manifest) },
    )
    .await?;
    converged(cluster, ns.name(), &name, i32::try_from(size)?).await?;
    // Read through the older version too: converted by the manager's webhook.
    let listed = cluster_kubectl(
        cluster,
        &[
            "get",
            concat!("memcacheds.v1alpha1.", product::group!(cache)),
            "-n",
            ns.name(),
            "-o",
            "name",
        ],
    )?;
    ensure!(
        listed.contains(&name),
        "v1alpha1 lists {listed:?}, not {name}"
    );
    println!(
        "the Memcached sample converged to {size} Ready pods, and reads through v1alpha1 ({:.1}s)",
        started.elapsed().as_secs_f64()
    );
    ns.delete().await?;
    Ok(())
}

/// Checks that `replicas` replicas are Ready on the real node.
async fn replicas_ready(cluster: &TestCluster, replicas: i32) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let d = deployments.get(RELEASE).await?;
    let status = d.status.unwrap_or_default();
    ensure!(
        status.ready_replicas == Some(replicas) && status.updated_replicas == Some(replicas),
        "helm returned before the manager was Ready: {status:?}"
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let manager_pods = pods
        .list(&ListParams::default().labels(MANAGER_PODS))
        .await?
        .items;
    for pod in &manager_pods {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        ensure!(
            node.as_deref() == Some(localcluster::node::NODE_NAME),
            "manager pod {:?} runs on {node:?}, not the real node",
            pod.metadata.name
        );
    }
    Ok(())
}

/// Waits until a Ready manager pod holds the leader Lease, and names it.
async fn leader(cluster: &TestCluster) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    Ok(
        testkit::wait_for("a manager pod to hold the Lease", TIMEOUT, || async {
            let lease = leases.get(LEASE).await.map_err(|e| e.to_string())?;
            let identity = lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            let holder = testkit::identity_pod(&identity).to_owned();
            let pods = pods
                .list(&ListParams::default().labels(MANAGER_PODS))
                .await
                .map_err(|e| e.to_string())?;
            if pods.items.iter().any(|p| {
                p.metadata.name.as_deref() == Some(holder.as_str()) && testkit::pod_ready(p)
            }) {
                Ok(holder)
            } else {
                Err(format!("holder {holder:?} is not a Ready manager pod"))
            }
        })
        .await?,
    )
}

/// Waits until every slot is held, each of the Ready manager pods holding an equal share (one
/// more for some, as 64 does not divide), and says who holds how many.
async fn shares(cluster: &TestCluster) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let what = "the sharded replicas to split the slots among them";
    Ok(testkit::wait_for(what, TIMEOUT, || async {
        let ready: Vec<String> = pods
            .list(&ListParams::default().labels(MANAGER_PODS))
            .await?
            .items
            .iter()
            .filter(|p| testkit::pod_ready(p))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let lease = leases.get(HOLDERS_LEASE).await?;
        let annotation = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HOLDERS_ANNOTATION))
            .context("no holders recorded yet")?;
        let holders: BTreeMap<String, String> = serde_json::from_str(annotation)
            .with_context(|| format!("{HOLDERS_ANNOTATION}: {annotation}"))?;
        let mut counts = BTreeMap::new();
        for (member, slots) in &holders {
            let pod = testkit::identity_pod(member).to_owned();
            *counts.entry(pod).or_insert(0) += slot_count(slots)?;
        }
        let pods: Vec<&String> = counts.keys().collect();
        ensure!(
            counts.len() == ready.len() && ready.iter().all(|p| counts.contains_key(p)),
            "holders {pods:?}, Ready pods {ready:?}"
        );
        let (share, total) = (SLOTS / ready.len(), counts.values().sum::<usize>());
        ensure!(
            total == SLOTS && counts.values().all(|n| *n == share || *n == share + 1),
            "slots held: {counts:?}"
        );
        Ok(counts
            .iter()
            .map(|(pod, n)| format!("{pod} {n}"))
            .collect::<Vec<_>>()
            .join(", "))
    })
    .await?)
}

/// How many slots a holder's list such as `0-20,42` names.
fn slot_count(slots: &str) -> Result<usize> {
    let mut count = 0;
    for range in slots.split(',').filter(|r| !r.is_empty()) {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (first, last): (usize, usize) = (first.parse()?, last.parse()?);
        ensure!(first <= last, "slots {slots}");
        count += last - first + 1;
    }
    Ok(count)
}

/// Waits until the Memcached `name` has `size` Ready pods, listed in its status, for its
/// current generation.
async fn converged(cluster: &TestCluster, namespace: &str, name: &str, size: i32) -> Result<()> {
    let mcs: Api<Memcached> = Api::namespaced(cluster.client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let what = format!("Memcached {name} to converge to {size}");
    testkit::wait_for(&what, TIMEOUT, || async {
        let mc = mcs.get(name).await.map_err(|e| e.to_string())?;
        let status = mc.status.clone().unwrap_or_default();
        let listed = pods
            .list(&ListParams::default().labels(&format!("memcached_cr={name}")))
            .await
            .map_err(|e| e.to_string())?;
        let ready = listed
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && testkit::pod_ready(p))
            .count();
        let wanted = usize::try_from(size).unwrap_or_default();
        if status.observed_generation == mc.metadata.generation
            && status.nodes.len() == wanted
            && status.ready_replicas == size
            && ready == wanted
        {
            Ok(())
        } else {
            Err(format!(
                "status nodes {:?} ready {} observed {:?}/{:?}, {ready} Ready pods",
                status.nodes,
                status.ready_replicas,
                status.observed_generation,
                mc.metadata.generation
            ))
        }
    })
    .await?;
    Ok(())
}

/// The CRDs of the chart's `crds/`.
fn chart_crds() -> Result<Objects> {
    let mut crds = Objects::new();
    for entry in std::fs::read_dir(chart_dir().join("crds"))? {
        crds.extend(objects(&std::fs::read_to_string(entry?.path())?)?);
    }
    Ok(crds)
}

/// The names of the chart's CRDs the cluster does not have: those the install will create.
/// A cluster started by hand keeps its own, and the Memcacheds in it.
async fn crds_missing(cluster: &TestCluster) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let mut missing = Vec::new();
    for (_, _, name) in chart_crds()?.into_keys() {
        if api.get_opt(&name).await?.is_none() {
            missing.push(name);
        }
    }
    Ok(missing)
}

/// Every object of `rendered`, the namespace and the CRDs named in `new_crds` are gone (a
/// namespace being deleted still counts until it is).
async fn nothing_left(
    cluster: &TestCluster,
    rendered: &Objects,
    new_crds: &[String],
) -> Result<()> {
    let client = &cluster.client;
    let crds = chart_crds()?;
    let namespace =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    let mut expected: Vec<&Value> = rendered.values().collect();
    expected.extend(
        crds.iter()
            .filter(|((_, _, name), _)| new_crds.contains(name))
            .map(|(_, crd)| crd),
    );
    expected.push(&namespace);
    testkit::wait_for(
        "every object of the release to be gone",
        TIMEOUT,
        || async {
            let mut left = Vec::new();
            for object in &expected {
                let object: DynamicObject =
                    serde_json::from_value((*object).clone()).map_err(|e| e.to_string())?;
                let types = object.types.clone().unwrap_or_default();
                let gvk = GroupVersionKind::try_from(&types).map_err(|e| e.to_string())?;
                let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
                    .await
                    .map_err(|e| e.to_string())?;
                let name = object.metadata.name.clone().unwrap_or_default();
                let api: Api<DynamicObject> = match &object.metadata.namespace {
                    Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
                    None => Api::all_with(client.clone(), &resource),
                };
                if api
                    .get_opt(&name)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some()
                {
                    left.push(format!("{} {name}", gvk.kind));
                }
            }
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("left: {}", left.join(", ")))
            }
        },
    )
    .await?;
    Ok(())
}

/// kubectl as administrator; fails unless it succeeds.
fn cluster_kubectl(cluster: &TestCluster, args: &[&str]) -> Result<String> {
    Ok(cluster.kubectl_output(args)?)
}

/// kubectl as administrator with `input` on its standard input.
fn kubectl_stdin(cluster: &TestCluster, args: &[&str], input: &str) -> Result<String> {
    let mut child = cluster
        .kubectl()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
