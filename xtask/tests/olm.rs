//! The Operator SDK tutorial's OLM flow, command for command, with the real tools, as a user's
//! cluster runs it:
//!
//! ```text
//! cargo xtask image manager --push          # make docker-build docker-push
//! cargo xtask bundle --push                 # make bundle bundle-build bundle-push
//! cargo xtask olm install                   # operator-sdk olm install
//! operator-sdk run bundle <registry>/operator-manager-bundle:v0.1.0 ...
//! kubectl apply -f <the Memcached sample>   # pods converge
//! kubectl patch memcached memcached-sample -p '{"spec":{"size": 2}}' --type=merge
//! operator-sdk cleanup operator-manager
//! cargo xtask olm uninstall                 # operator-sdk olm uninstall
//! ```
//!
//! OLM (olm-operator and the catalog operator) and `operator-sdk` are built from their Go
//! modules at the pinned releases; `run bundle` installs through a CatalogSource served by a
//! registry pod, a Subscription, an InstallPlan and a bundle-unpacking Job, with the images
//! pulled from the local cluster's registry.
//!
//! The installation is cluster-wide (the CRDs, webhook configurations, ClusterRoles), so this
//! binary runs one scenario from start to end, and leaves the cluster as it found it.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use apis::Memcached;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use testkit::{PodSecurity, TestCluster, TestNamespace};

const MANAGER: &str = product::name!();
const CSV: &str = concat!(concat!(product::name!(), ".v"), env!("CARGO_PKG_VERSION"));
/// The label OLM puts on what it creates for a ClusterServiceVersion.
const OWNED: &str = concat!(
    concat!("olm.owner=", product::name!(), ".v"),
    env!("CARGO_PKG_VERSION")
);
const BUNDLE: &str = concat!(
    concat!(product::name!(), "-bundle:v"),
    env!("CARGO_PKG_VERSION")
);
/// The bundle's ClusterRole for reading the metrics, which OLM leaves behind.
const METRICS_READER: &str = concat!(product::name!(), "-metrics-reader");
const MEMCACHED_IMAGE: &str = concat!(product::name!(), ".local/memcached");
/// Generous: real containers start on a loaded two-core machine.
const TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn the_tutorials_olm_flow_installs_converges_and_cleans_up() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let memcached_image = cluster.loaded_image(MEMCACHED_IMAGE, "memcached")?;
    // operator-sdk runs the catalog's registry pod as its image's user, without the restricted
    // profile's settings: the tutorial's namespace enforces none.
    let ns = TestNamespace::on_real_node(&cluster, "olm", PodSecurity::Baseline).await?;

    let cleanup = Cleanup {
        namespace: ns.name().to_owned(),
        kubeconfig: cluster.kubeconfig.display().to_string(),
        kubectl: cluster.kubectl_path(),
        armed: true,
    };
    let result = scenario(&cluster, &ns, &memcached_image).await;
    let report = if result.is_err() {
        report(&cluster, ns.name())
    } else {
        String::new()
    };
    result.with_context(|| report)?;
    cleanup.run()?;
    ns.delete().await?;
    everything_is_gone(&cluster).await
}

async fn scenario(cluster: &TestCluster, ns: &TestNamespace, memcached_image: &str) -> Result<()> {
    let namespace = ns.name();
    let kubeconfig = cluster.kubeconfig.display().to_string();
    xtask(&["image", "manager", "--push"])?;
    let bundle = xtask(&["bundle", "--push"])?;
    ensure!(bundle.contains(BUNDLE), "{bundle}");
    let installed = xtask(&["olm", "install"])?;
    ensure!(installed.contains("OLM v0."), "{installed}");
    // Both of OLM's operators run, and the images its Jobs and operator-sdk's catalog pods pull
    // are in the cluster's registry.
    let olm: Api<Deployment> = Api::namespaced(cluster.client.clone(), "olm");
    for name in ["olm-operator", "catalog-operator"] {
        let available = olm
            .get(name)
            .await?
            .status
            .and_then(|s| s.available_replicas)
            .unwrap_or_default();
        ensure!(available >= 1, "OLM's {name} is not available");
    }
    let registry = cluster
        .state
        .registry()
        .context("the local cluster runs a registry")?
        .to_string();
    let https = cluster
        .state
        .registry_https()
        .context("the local cluster's registry serves HTTPS")?
        .to_string();
    let decompression = installed
        .split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{registry}/busybox:")))
        .and_then(|tag| tag.strip_suffix(','))
        .map(|tag| format!("{registry}/busybox:{tag}"))
        .with_context(|| format!("install names no busybox image: {installed}"))?;
    let opm = installed
        .split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{https}/operator-framework/opm:")))
        .map(|tag| format!("{https}/operator-framework/opm:{tag}"))
        .with_context(|| format!("install names no index image: {installed}"))?;

    let ran = xtask(&[
        "operator-sdk",
        "--",
        "run",
        "bundle",
        &format!("{https}/{BUNDLE}"),
        "--index-image",
        &opm,
        "--decompression-image",
        &decompression,
        "--namespace",
        namespace,
        "--kubeconfig",
        &kubeconfig,
        "--timeout",
        "5m",
    ])?;
    ensure!(ran.contains("successfully installed"), "{ran}");
    // Removing OLM under an operator it manages would orphan it.
    let refused = xtask_fails(&["olm", "uninstall"])?;
    ensure!(refused.contains(&format!("{namespace}/{CSV}")), "{refused}");

    // What the tutorial shows: the bundle's unpacking Job done, the catalog's registry pod and
    // the manager running, through a CatalogSource, a Subscription and an InstallPlan.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let listed = pods.list(&ListParams::default()).await?.items;
    let phase = |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    };
    let name = |pod: &Pod| pod.metadata.name.clone().unwrap_or_default();
    let owned_by_job = |pod: &Pod| {
        pod.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Job")
    };
    let unpacked = listed
        .iter()
        .filter(|p| owned_by_job(p) && phase(p) == "Succeeded")
        .count();
    let registry_pods = listed
        .iter()
        .filter(|p| name(p).ends_with(&BUNDLE.replace([':', '.'], "-")) && phase(p) == "Running")
        .count();
    let managers = listed
        .iter()
        .filter(|p| name(p).starts_with(MANAGER) && testkit::pod_ready(p))
        .count();
    ensure!(
        unpacked == 1 && registry_pods == 1 && managers >= 1,
        "want the unpacking Job's pod Completed, the registry pod Running and the manager \
         Running: {:?}",
        listed
            .iter()
            .map(|p| format!("{} {}", name(p), phase(p)))
            .collect::<Vec<_>>()
    );
    for kind in ["CatalogSource", "Subscription", "InstallPlan"] {
        let objects = olm_api(cluster, kind, namespace)
            .list(&ListParams::default())
            .await?;
        ensure!(objects.items.len() == 1, "{} {kind}s", objects.items.len());
    }
    let csv = olm_api(cluster, "ClusterServiceVersion", namespace)
        .get(CSV)
        .await?;
    ensure!(csv.data["status"]["phase"] == "Succeeded", "{:?}", csv.data);

    // OLM serves the webhooks through its own Service and certificate.
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let conversion = crds
        .get(concat!("memcacheds.", product::group!(cache)))
        .await?
        .spec
        .conversion
        .context("the Memcached CRD has no conversion")?;
    let service = conversion
        .webhook
        .and_then(|w| w.client_config)
        .and_then(|c| c.service)
        .context("OLM did not point the conversion at a Service")?;
    ensure!(service.namespace == namespace, "{service:?}");
    ensure!(!webhook_configurations(cluster).await?.is_empty());

    let samples =
        TestNamespace::on_real_node(cluster, "olm-sample", PodSecurity::Restricted).await?;
    let converged = sample_converges(cluster, &samples, memcached_image).await;
    samples.delete().await?;
    converged?;

    // `operator-sdk cleanup` removes the operator, its CRDs and what `run bundle` made.
    let cleaned = xtask(&[
        "operator-sdk",
        "--",
        "cleanup",
        MANAGER,
        "--namespace",
        namespace,
        "--kubeconfig",
        &kubeconfig,
    ])?;
    ensure!(cleaned.contains("uninstalled"), "{cleaned}");
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace);
    testkit::wait_for(
        "operator-sdk cleanup to remove the operator",
        TIMEOUT,
        || async {
            let mut left = Vec::new();
            if deployments.get_opt(MANAGER).await?.is_some() {
                left.push("the Deployment".to_owned());
            }
            let remaining: Vec<String> = pods
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|p| !owned_by_job(p))
                .map(name)
                .collect();
            if !remaining.is_empty() {
                left.push(format!("pods {remaining:?}"));
            }
            for kind in ["CatalogSource", "Subscription", "ClusterServiceVersion"] {
                let objects = olm_api(cluster, kind, namespace)
                    .list(&ListParams::default())
                    .await?;
                if !objects.items.is_empty() {
                    left.push(format!("{} {kind}s", objects.items.len()));
                }
            }
            let webhooks = webhook_configurations(cluster).await?;
            if !webhooks.is_empty() {
                left.push(format!("webhook configurations {webhooks:?}"));
            }
            if crds
                .get_opt(concat!("memcacheds.", product::group!(cache)))
                .await?
                .is_some()
            {
                left.push("the Memcached CRD".to_owned());
            }
            if left.is_empty() {
                Ok(())
            } else {
                Err(anyhow::anyhow!("still there: {}", left.join(", ")))
            }
        },
    )
    .await?;

    // What OLM leaves, as on any cluster: the bundle's metrics-reader ClusterRole.
    // `operator-sdk cleanup` deletes only the operator's CRDs, CSV, Subscription, CatalogSource
    // and OperatorGroup, and OLM's garbage collection goes by owner labels the role lacks. The
    // tutorial's bundle has the same role.
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    let owned: Vec<String> = roles
        .list_metadata(&ListParams::default().labels(OWNED))
        .await?
        .items
        .into_iter()
        .filter_map(|r| r.metadata.name)
        .filter(|name| name != METRICS_READER)
        .collect();
    ensure!(owned.is_empty(), "the CSV's ClusterRoles left: {owned:?}");
    ensure!(
        roles.get_opt(METRICS_READER).await?.is_some(),
        "OLM removed {METRICS_READER}: say so in the OLM page"
    );
    kubectl(cluster, &["delete", "clusterrole", METRICS_READER])?;
    Ok(())
}

/// Creates the v1beta1 sample, through OLM's webhooks, and waits for real memcached pods.
async fn sample_converges(cluster: &TestCluster, ns: &TestNamespace, image: &str) -> Result<()> {
    let sample = testkit::deploy_dir()
        .join("samples")
        .join("cache_v1beta1_memcached.yaml");
    let mut objects = testkit::read_yaml_file(&sample)?;
    for object in &mut objects {
        // The sample names the public image, which cannot be pulled here.
        object.data["spec"]["image"] = serde_json::json!(image);
    }
    // A replica is Ready a moment before kube-proxy routes OLM's webhook Service to it, so the
    // first calls may be refused.
    testkit::wait_for(
        "the webhooks to admit the sample",
        Duration::from_secs(60),
        || async {
            testkit::apply_objects(&cluster.client, objects.clone(), Some(ns.name())).await
        },
    )
    .await?;

    let memcacheds: Api<Memcached> = Api::namespaced(cluster.client.clone(), ns.name());
    let created = memcacheds.get("memcached-sample").await?;
    let defaulted = created
        .spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|r| r.contains_key("memory"));
    ensure!(
        defaulted,
        "the defaulting webhook did not set the memory request: {:?}",
        created.spec
    );

    let size = memcacheds.get("memcached-sample").await?.spec.size;
    converges(cluster, ns, size).await?;

    // The tutorial's patch, to a size the sample does not have.
    kubectl(
        cluster,
        &[
            "patch",
            "memcached",
            "memcached-sample",
            "--namespace",
            ns.name(),
            "--type=merge",
            "-p",
            r#"{"spec":{"size":2}}"#,
        ],
    )?;
    converges(cluster, ns, 2).await?;

    // Read through the other version: the API server converts through OLM's Service.
    let alpha = kubectl(
        cluster,
        &[
            "get",
            concat!("memcacheds.v1alpha1.", product::group!(cache)),
            "memcached-sample",
            "--namespace",
            ns.name(),
            "-o",
            "jsonpath={.apiVersion} {.spec.size}",
        ],
    )?;
    ensure!(
        alpha == concat!(product::group!(cache), "/v1alpha1 2"),
        "{alpha}"
    );
    Ok(())
}

/// Waits until the sample has `size` ready memcached pods, and its status says so.
async fn converges(cluster: &TestCluster, ns: &TestNamespace, size: i32) -> Result<()> {
    let memcacheds: Api<Memcached> = Api::namespaced(cluster.client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns.name());
    testkit::wait_for("the sample to converge", TIMEOUT, || async {
        let mc = memcacheds.get("memcached-sample").await?;
        let status = mc.status.clone().unwrap_or_default();
        let ready = pods
            .list(&ListParams::default().labels("memcached_cr=memcached-sample"))
            .await?
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && testkit::pod_ready(p))
            .count();
        let want = usize::try_from(size).unwrap_or_default();
        if mc.spec.size == size
            && status.observed_generation == mc.metadata.generation
            && status.ready_replicas == size
            && ready == want
        {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "want {want}: status ready {} observed {:?}/{:?}, {ready} ready pods",
                status.ready_replicas,
                status.observed_generation,
                mc.metadata.generation
            ))
        }
    })
    .await?;
    Ok(())
}

/// OLM's `kind` (of `operators.coreos.com/v1alpha1`) in `namespace`.
fn olm_api(cluster: &TestCluster, kind: &str, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("operators.coreos.com", "v1alpha1", kind);
    let plural = format!("{}s", kind.to_lowercase());
    let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
    Api::namespaced_with(cluster.client.clone(), namespace, &resource)
}

/// The admission webhook configurations OLM made for the CSV, by name.
async fn webhook_configurations(cluster: &TestCluster) -> Result<Vec<String>> {
    let owned = ListParams::default().labels(OWNED);
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(cluster.client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(cluster.client.clone());
    let mut names: Vec<String> = mutating
        .list_metadata(&owned)
        .await?
        .items
        .into_iter()
        .filter_map(|w| w.metadata.name)
        .collect();
    names.extend(
        validating
            .list_metadata(&owned)
            .await?
            .items
            .into_iter()
            .filter_map(|w| w.metadata.name),
    );
    Ok(names)
}

/// After `operator-sdk cleanup`, `olm uninstall` and deleting the metrics reader: no ClusterRole of the CSV or of OLM's groups, no
/// OLM namespace, no OLM CRD.
async fn everything_is_gone(cluster: &TestCluster) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    let left = roles
        .list_metadata(&ListParams::default().labels("olm.owner"))
        .await?;
    ensure!(
        left.items.is_empty(),
        "ClusterRoles left: {:?}",
        left.items
            .iter()
            .map(|r| &r.metadata.name)
            .collect::<Vec<_>>()
    );
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    for crd in crds.list_metadata(&ListParams::default()).await?.items {
        let name = crd.metadata.name.unwrap_or_default();
        ensure!(
            !name.ends_with(".operators.coreos.com"),
            "OLM's CRD {name} is left"
        );
    }
    Ok(())
}

/// Removes the operator and OLM, also when the scenario failed half-way.
struct Cleanup {
    namespace: String,
    kubeconfig: String,
    kubectl: std::path::PathBuf,
    armed: bool,
}

impl Cleanup {
    fn steps(&self) -> [Vec<&str>; 2] {
        [
            vec![
                "operator-sdk",
                "--",
                "cleanup",
                MANAGER,
                "--namespace",
                &self.namespace,
                "--kubeconfig",
                &self.kubeconfig,
            ],
            vec!["olm", "uninstall"],
        ]
    }

    fn run(mut self) -> Result<()> {
        self.armed = false;
        // The scenario already cleaned up the operator; a second cleanup finds nothing.
        xtask(&["olm", "uninstall"])?;
        Ok(())
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.armed {
            for step in self.steps() {
                if let Err(error) = xtask(&step) {
                    eprintln!("cleaning up after the failed test: {error:#}");
                }
            }
            let deleted = Command::new(&self.kubectl)
                .args(["--kubeconfig", &self.kubeconfig, "delete", "clusterrole"])
                .args([METRICS_READER, "--ignore-not-found"])
                .status();
            if let Err(error) = deleted {
                eprintln!("cleaning up after the failed test: kubectl: {error}");
            }
        }
    }
}

/// Runs an xtask command, with its output shown; fails with it when the command fails. Returns
/// what it printed, stdout then stderr (operator-sdk logs to stderr).
fn xtask(args: &[&str]) -> Result<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .with_context(|| format!("running xtask {}", args.join(" ")))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("$ cargo xtask {}\n{stdout}{stderr}", args.join(" "));
    if !output.status.success() {
        bail!("`cargo xtask {}` failed:\n{stdout}{stderr}", args.join(" "));
    }
    Ok(format!("{stdout}{stderr}"))
}

/// Runs an xtask command that must fail, and returns what it said.
fn xtask_fails(args: &[&str]) -> Result<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .with_context(|| format!("running xtask {}", args.join(" ")))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("$ cargo xtask {} (must fail)\n{said}", args.join(" "));
    ensure!(
        !output.status.success(),
        "`cargo xtask {}` succeeded",
        args.join(" ")
    );
    Ok(said)
}

fn kubectl(cluster: &TestCluster, args: &[&str]) -> Result<String> {
    Ok(cluster.kubectl_output(args)?.trim().to_owned())
}

/// What OLM and the operator said, for a failed run.
fn report(cluster: &TestCluster, namespace: &str) -> String {
    let mut out = String::new();
    for args in [
        vec![
            "get",
            "csv,subscriptions,installplans,catalogsources,jobs,deployments,pods",
            "-A",
            "-o",
            "wide",
        ],
        vec![
            "logs",
            "--namespace",
            "olm",
            "deployment/olm-operator",
            "--tail=40",
        ],
        vec![
            "logs",
            "--namespace",
            "olm",
            "deployment/catalog-operator",
            "--tail=40",
        ],
        vec![
            "logs",
            "--namespace",
            namespace,
            concat!("deployment/", product::name!()),
            "--tail=40",
        ],
        vec!["get", "events", "--namespace", namespace],
    ] {
        let text = kubectl(cluster, &args).unwrap_or_else(|e| e.to_string());
        out.push_str(&format!("\n$ kubectl {}\n{text}\n", args.join(" ")));
    }
    out
}
