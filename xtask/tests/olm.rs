//! OLM installs the operator from its bundle, as on a user's cluster: OLM's olm-operator, built
//! from its Go module at the pinned release, runs as a pod on the local cluster's real node
//! (`cargo xtask olm install`); the bundle's ClusterServiceVersion is created with an
//! OperatorGroup (`cargo xtask olm run-bundle`) and OLM brings the manager up with its
//! webhooks and their certificate; the Memcached sample converges through them into real
//! memcached pods; deleting the ClusterServiceVersion makes OLM remove the operator.
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
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use testkit::{PodSecurity, TestCluster, TestNamespace};

/// Where `run-bundle` installs the operator by default: OLM's namespace for operators of every
/// namespace.
const NAMESPACE: &str = "operators";
const MANAGER: &str = product::name!();
const CSV: &str = concat!(concat!(product::name!(), ".v"), env!("CARGO_PKG_VERSION"));
/// The label OLM puts on what it creates for a ClusterServiceVersion.
const OWNED: &str = concat!(
    concat!("olm.owner=", product::name!(), ".v"),
    env!("CARGO_PKG_VERSION")
);
const MEMCACHED_IMAGE: &str = concat!(product::name!(), ".local/memcached");
/// Generous: real containers start on a loaded two-core machine.
const TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn olm_installs_the_bundle_and_removes_the_operator_with_its_csv() -> Result<()> {
    let cluster = testkit::cluster().await?;
    cluster.loaded_image(MANAGER, "manager")?;
    let memcached_image = cluster.loaded_image(MEMCACHED_IMAGE, "memcached")?;

    let cleanup = Cleanup { armed: true };
    let result = scenario(&cluster, &memcached_image).await;
    let report = if result.is_err() {
        report(&cluster)
    } else {
        String::new()
    };
    result.with_context(|| report)?;
    cleanup.run()?;
    everything_is_gone(&cluster).await
}

async fn scenario(cluster: &TestCluster, memcached_image: &str) -> Result<()> {
    let refused = xtask_fails(&["olm", "run-bundle"])?;
    ensure!(refused.contains("cargo xtask olm install"), "{refused}");
    let installed = xtask(&["olm", "install"])?;
    ensure!(installed.contains("OLM v0."), "{installed}");
    let ran = xtask(&["olm", "run-bundle"])?;
    ensure!(ran.contains("Succeeded"), "{ran}");
    // Removing OLM under an operator it manages would orphan it.
    let refused = xtask_fails(&["olm", "uninstall"])?;
    ensure!(refused.contains(&format!("{NAMESPACE}/{CSV}")), "{refused}");

    let csvs = csv_api(cluster);
    let csv = csvs.get(CSV).await?;
    ensure!(csv.data["status"]["phase"] == "Succeeded", "{:?}", csv.data);
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let manager = deployments.get(MANAGER).await?;
    ensure!(
        manager
            .status
            .and_then(|s| s.available_replicas)
            .unwrap_or_default()
            >= 1,
        "OLM reported success with no manager replica available"
    );
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
    ensure!(service.namespace == NAMESPACE, "{service:?}");
    ensure!(!webhook_configurations(cluster).await?.is_empty());

    let ns = TestNamespace::on_real_node(cluster, "olm", PodSecurity::Restricted).await?;
    let converged = sample_converges(cluster, &ns, memcached_image).await;
    ns.delete().await?;
    converged?;

    // Deleting the CSV removes the operator: OLM deletes its Deployment and webhooks, the
    // garbage collector what the CSV owns, and the CRD stops converting through the gone
    // Service.
    csvs.delete(CSV, &DeleteParams::foreground()).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    testkit::wait_for("OLM to remove the operator", TIMEOUT, || async {
        let mut left = Vec::new();
        if deployments.get_opt(MANAGER).await?.is_some() {
            left.push("the Deployment".to_owned());
        }
        let manager_pods = pods
            .list(
                &ListParams::default().labels(concat!("app.kubernetes.io/name=", product::name!())),
            )
            .await?;
        if !manager_pods.items.is_empty() {
            left.push(format!("{} pods", manager_pods.items.len()));
        }
        if accounts.get_opt(MANAGER).await?.is_some() {
            left.push("the ServiceAccount".to_owned());
        }
        let webhooks = webhook_configurations(cluster).await?;
        if !webhooks.is_empty() {
            left.push(format!("webhook configurations {webhooks:?}"));
        }
        let crd = crds
            .get(concat!("memcacheds.", product::group!(cache)))
            .await?;
        let strategy = crd.spec.conversion.map(|c| c.strategy).unwrap_or_default();
        if strategy != "None" {
            left.push(format!("conversion strategy {strategy}"));
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(anyhow::anyhow!("still there: {}", left.join(", ")))
        }
    })
    .await?;
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
        let size = usize::try_from(mc.spec.size).unwrap_or_default();
        if status.observed_generation == mc.metadata.generation
            && status.ready_replicas == mc.spec.size
            && ready == size
        {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "want {size}: status ready {} observed {:?}/{:?}, {ready} ready pods",
                status.ready_replicas,
                status.observed_generation,
                mc.metadata.generation
            ))
        }
    })
    .await?;

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
        alpha == concat!(product::group!(cache), "/v1alpha1 3"),
        "{alpha}"
    );
    Ok(())
}

fn csv_api(cluster: &TestCluster) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("operators.coreos.com", "v1alpha1", "ClusterServiceVersion");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "clusterserviceversions");
    Api::namespaced_with(cluster.client.clone(), NAMESPACE, &resource)
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

/// After `cleanup-bundle` and `uninstall`: no ClusterRole of the CSV or of OLM's groups, no
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

/// Removes the bundle and OLM, also when the scenario failed half-way.
struct Cleanup {
    armed: bool,
}

impl Cleanup {
    fn run(mut self) -> Result<()> {
        self.armed = false;
        xtask(&["olm", "cleanup-bundle"])?;
        xtask(&["olm", "uninstall"])?;
        Ok(())
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.armed {
            for step in [["olm", "cleanup-bundle"], ["olm", "uninstall"]] {
                if let Err(error) = xtask(&step) {
                    eprintln!("cleaning up after the failed test: {error:#}");
                }
            }
        }
    }
}

/// Runs an xtask command, with its output shown; fails with it when the command fails.
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
    Ok(stdout)
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
fn report(cluster: &TestCluster) -> String {
    let mut out = String::new();
    for args in [
        vec!["get", "csv,deployments,pods", "-A", "-o", "wide"],
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
            NAMESPACE,
            concat!("deployment/", product::name!()),
            "--tail=40",
        ],
        vec!["get", "events", "--namespace", NAMESPACE],
    ] {
        let text = kubectl(cluster, &args).unwrap_or_else(|e| e.to_string());
        out.push_str(&format!("\n$ kubectl {}\n{text}\n", args.join(" ")));
    }
    out
}
