//! The Operator SDK tutorial's OLM flow, command for command, with the real tools, as a user's
//! cluster runs it:
//!
//! ```text
//! cargo xtask image manager --push          # make docker-build docker-push
//! cargo xtask bundle --push                 # make bundle bundle-build bundle-push
//! cargo xtask olm install                   # operator-sdk olm install
//! operator-sdk run bundle <registry>/operator-manager-bundle:v0.1.0 ...
//! operator-sdk scorecard bundle/            # the basic and OLM suites
//! kubectl apply -f <the Memcached sample>   # pods converge
//! kubectl patch memcached memcached-sample -p '{"spec":{"size": 2}}' --type=merge
//! operator-sdk cleanup operator-manager
//! ```
//!
//! Last, `cargo xtask olm uninstall` (`operator-sdk olm uninstall`).
//!
//! A second test is the upgrade OLM is for: the next release's manager and bundle pushed, a
//! catalog offering this release and one offering both (`cargo xtask catalog`, `make
//! catalog-build catalog-push`), a Subscription on automatic approval to the first, and the
//! CatalogSource moved to the second while Memcacheds are being scaled. OLM upgrades the
//! manager; every Memcached converges. OLM's catalog operator reaches a catalog through its
//! Service's DNS name, which the local cluster's CoreDNS answers.
//!
//! OLM (olm-operator and the catalog operator) and `operator-sdk` are built from their Go
//! modules at the pinned releases; `run bundle` installs through a CatalogSource served by a
//! registry pod, a Subscription, an InstallPlan and a bundle-unpacking Job, with the images
//! pulled from the local cluster's registry.
//!
//! The installation is cluster-wide (the CRDs, webhook configurations, ClusterRoles), so the
//! tests take turns ([`ONE_AT_A_TIME`]), and each leaves the cluster as it found it.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use apis::Memcached;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use testkit::{PodSecurity, TestCluster, TestNamespace};

const MANAGER: &str = product::name!();
const VERSION: &str = env!("CARGO_PKG_VERSION");
const CSV: &str = concat!(concat!(product::name!(), ".v"), env!("CARGO_PKG_VERSION"));
/// The name `operator-sdk cleanup` looks for a package's CatalogSource by.
const CATALOG_SOURCE: &str = concat!(product::name!(), "-catalog");
/// The OperatorGroup `operator-sdk run bundle` creates, and `cleanup` deletes.
const RUN_BUNDLE_OPERATOR_GROUP: &str = "operator-sdk-og";
/// The Memcacheds scaled while OLM upgrades the manager.
const SCALED: [&str; 3] = ["scaled-0", "scaled-1", "scaled-2"];
const BUNDLE: &str = concat!(
    concat!(product::name!(), "-bundle:v"),
    env!("CARGO_PKG_VERSION")
);
/// The bundle's ClusterRole for reading the metrics, which OLM leaves behind.
const METRICS_READER: &str = concat!(product::name!(), "-metrics-reader");
const MEMCACHED_IMAGE: &str = concat!(product::name!(), ".local/memcached");
/// Generous: real containers start on a loaded two-core machine.
const TIMEOUT: Duration = Duration::from_secs(180);
/// An installation or upgrade through a catalog: a catalog pod, a bundle unpacked, a rollout.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(300);

/// Held for the whole of each test: both install OLM and the operator cluster-wide.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn the_tutorials_olm_flow_installs_converges_and_cleans_up() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = testkit::cluster().await?;
    let memcached_image = cluster.loaded_image(MEMCACHED_IMAGE, "memcached")?;
    // operator-sdk runs the catalog's registry pod as its image's user, without the restricted
    // profile's settings: the tutorial's namespace enforces none.
    let ns = TestNamespace::on_real_node(&cluster, "olm", PodSecurity::Baseline).await?;
    let cleanup = Cleanup::new(&cluster, &ns);
    let result = scenario(&cluster, &ns, &memcached_image).await;
    result.with_context(|| report(&cluster, ns.name()))?;
    cleanup.run()?;
    ns.delete().await?;
    everything_is_gone(&cluster).await
}

/// The upgrade through a catalog, on its own: OLM installed, this release pushed, then
/// [`upgrade_through_a_catalog`].
#[tokio::test]
async fn olm_upgrades_the_manager_from_a_newer_catalog_while_memcacheds_scale() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = testkit::cluster().await?;
    let memcached_image = cluster.loaded_image(MEMCACHED_IMAGE, "memcached")?;
    let ns = TestNamespace::on_real_node(&cluster, "olm-upgrade", PodSecurity::Baseline).await?;
    let cleanup = Cleanup::new(&cluster, &ns);
    xtask(&["image", "manager", "--push"])?;
    xtask(&["bundle", "--push"])?;
    xtask(&["olm", "install"])?;
    let result = upgrade_through_a_catalog(&cluster, &ns, &memcached_image).await;
    result.with_context(|| report(&cluster, ns.name()))?;
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
    let registry = registry(cluster)?;
    let https = cluster
        .state
        .registry_https()
        .context("the local cluster's registry serves HTTPS")?
        .to_string();
    let decompression = printed_image(&installed, &format!("{registry}/busybox:"))?;
    let opm = printed_image(&installed, &format!("{https}/operator-framework/opm:"))?;

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

    scorecard_passes(cluster, namespace, &installed).await?;

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
    ensure!(!webhook_configurations(cluster, CSV).await?.is_empty());

    let samples =
        TestNamespace::on_real_node(cluster, "olm-sample", PodSecurity::Restricted).await?;
    let converged = sample_converges(cluster, &samples, memcached_image).await;
    samples.delete().await?;
    converged?;

    cleanup_removes_it_all(cluster, namespace, CSV).await?;
    operator_group_roles_are_gone(cluster, namespace, RUN_BUNDLE_OPERATOR_GROUP).await?;
    metrics_reader_is_left(cluster, CSV).await
}

/// The upgrade OLM is for. The next release (the same manager under the next version's tag) is
/// pushed with its bundle, which replaces this one's. A CatalogSource offers this release and a
/// Subscription on automatic approval installs it; Memcacheds are created and, while they are
/// being scaled, the CatalogSource moves to a catalog offering both releases. OLM upgrades the
/// manager on its own, and every Memcached converges to its last size.
async fn upgrade_through_a_catalog(
    cluster: &TestCluster,
    ns: &TestNamespace,
    memcached_image: &str,
) -> Result<()> {
    let namespace = ns.name();
    let next = next_release(VERSION)?;
    let next_csv = format!("{MANAGER}.v{next}");
    let registry = registry(cluster)?;
    xtask(&["image", "manager", "--push", "--tag", &format!(":{next}")])?;
    xtask(&[
        "bundle",
        "--push",
        "--version",
        &next,
        "--replaces",
        VERSION,
    ])?;
    let first = xtask(&["catalog"])?;
    let both = xtask(&["catalog", "--releases", &format!("{VERSION},{next}")])?;
    let catalog = |release: &str| format!("{registry}/{MANAGER}-catalog:v{release}");
    ensure!(first.contains(&catalog(VERSION)), "{first}");
    ensure!(both.contains(&catalog(&next)), "{both}");

    let objects: Vec<DynamicObject> = serde_json::from_value(serde_json::json!([
        {
            "apiVersion": "operators.coreos.com/v1",
            "kind": "OperatorGroup",
            "metadata": {"name": MANAGER},
            "spec": {},
        },
        {
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "CatalogSource",
            "metadata": {"name": CATALOG_SOURCE},
            "spec": {
                "sourceType": "grpc",
                "image": catalog(VERSION),
                "displayName": "Operator Manager",
                "publisher": "operator-manager",
                "grpcPodConfig": {"securityContextConfig": "restricted"},
            },
        },
        {
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "Subscription",
            "metadata": {"name": MANAGER},
            "spec": {
                "name": MANAGER,
                "channel": "candidate",
                "source": CATALOG_SOURCE,
                "sourceNamespace": namespace,
                "installPlanApproval": "Automatic",
                "startingCSV": CSV,
            },
        },
    ]))?;
    testkit::apply_objects(&cluster.client, objects, Some(namespace)).await?;
    csv_succeeds(cluster, namespace, CSV).await?;

    let samples =
        TestNamespace::on_real_node(cluster, "olm-upgrade-samples", PodSecurity::Restricted)
            .await?;
    let upgraded = upgrade_while_scaling(cluster, ns, &samples, memcached_image, &next).await;
    samples.delete().await?;
    upgraded?;

    cleanup_removes_it_all(cluster, namespace, &next_csv).await?;
    operator_group_is_removed(cluster, namespace).await?;
    metrics_reader_is_left(cluster, &next_csv).await
}

/// Deletes the OperatorGroup the upgrade created, as its user would after `operator-sdk
/// cleanup` (which deletes only the one `run bundle` makes), and waits for OLM to remove the
/// ClusterRoles it made for the group.
async fn operator_group_is_removed(cluster: &TestCluster, namespace: &str) -> Result<()> {
    olm_api(cluster, "OperatorGroup", namespace)
        .delete(MANAGER, &Default::default())
        .await?;
    operator_group_roles_are_gone(cluster, namespace, MANAGER).await
}

/// Waits for OLM to remove the ClusterRoles it made for the deleted OperatorGroup `name`, which
/// it does only while it runs.
async fn operator_group_roles_are_gone(
    cluster: &TestCluster,
    namespace: &str,
    name: &str,
) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    let group =
        format!("olm.owner={name},olm.owner.kind=OperatorGroup,olm.owner.namespace={namespace}");
    let what = format!("OLM to remove the ClusterRoles of the OperatorGroup {name}");
    testkit::wait_for(&what, TIMEOUT, || async {
        let left = roles
            .list_metadata(&ListParams::default().labels(&group))
            .await?;
        ensure!(left.items.is_empty(), "{} left", left.items.len());
        Ok(())
    })
    .await?;
    Ok(())
}

/// Creates the [`SCALED`] Memcacheds, scales them while the CatalogSource moves to the catalog
/// offering `next` and OLM upgrades the manager, then waits for all of them to converge.
async fn upgrade_while_scaling(
    cluster: &TestCluster,
    ns: &TestNamespace,
    samples: &TestNamespace,
    memcached_image: &str,
    next: &str,
) -> Result<()> {
    let namespace = ns.name();
    let next_csv = format!("{MANAGER}.v{next}");
    let memcacheds: Vec<DynamicObject> = SCALED
        .iter()
        .map(|name| {
            serde_json::from_value(serde_json::json!({
                "apiVersion": concat!(product::group!(cache), "/v1beta1"),
                "kind": "Memcached",
                "metadata": {"name": name},
                "spec": {"size": 1, "image": memcached_image},
            }))
        })
        .collect::<Result<_, _>>()?;
    apply_when_admitted(cluster, memcacheds, samples.name()).await?;
    for name in SCALED {
        converges(cluster, samples, name, 1).await?;
    }

    let api: Api<Memcached> = Api::namespaced(cluster.client.clone(), samples.name());
    let stop = Arc::new(AtomicBool::new(false));
    let scaler = tokio::spawn(scale(api.clone(), Arc::clone(&stop)));
    let moved = Instant::now();
    let catalogs = olm_api(cluster, "CatalogSource", namespace);
    let registry = registry(cluster)?;
    catalogs
        .patch(
            CATALOG_SOURCE,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "spec": {"image": format!("{registry}/{MANAGER}-catalog:v{next}")}
            })),
        )
        .await?;
    let upgraded = upgrade_completes(cluster, namespace, next).await;
    let upgrade_took = moved.elapsed();
    stop.store(true, Ordering::Relaxed);
    let scaled = scaler.await.context("the scaling task")?;
    upgraded?;
    let scaled = scaled?;
    println!(
        "OLM upgraded {CSV} to {next_csv} in {upgrade_took:.0?}; meanwhile {} size changes \
         were made and {} refused: {:?}",
        scaled.made,
        scaled.refused.len(),
        scaled.refused
    );
    ensure!(
        scaled.made_during_upgrade(upgrade_took) > 0,
        "no Memcached was scaled while OLM upgraded the manager"
    );

    // One last change, to the manager OLM installed, then everything converges. Right after an
    // upgrade OLM may rotate the webhooks' certificate (its `NeedsCertRotation`), rolling the
    // manager out once more; until the new pods serve it, the API server refuses the webhook
    // calls, so each change is retried as a user would.
    let last_change = Instant::now();
    let patch = Patch::Merge(serde_json::json!({"spec": {"size": 2}}));
    for name in SCALED {
        let what = format!("the webhooks to admit {name}'s last size");
        testkit::wait_for(&what, TIMEOUT, || async {
            api.patch(name, &PatchParams::default(), &patch).await
        })
        .await?;
    }
    println!(
        "the last size changes were admitted within {:.0?} of the upgrade",
        last_change.elapsed()
    );
    for name in SCALED {
        converges(cluster, samples, name, 2).await?;
    }
    Ok(())
}

/// What [`scale`] did.
struct Scaled {
    /// Size changes the API server accepted, and when, from the start.
    made: usize,
    made_at: Vec<Duration>,
    /// Those it refused, with why (the webhooks may be moving to the new manager's pods).
    refused: Vec<String>,
}

impl Scaled {
    fn made_during_upgrade(&self, upgrade: Duration) -> usize {
        self.made_at.iter().filter(|at| **at <= upgrade).count()
    }
}

/// Changes each of the [`SCALED`] Memcacheds' size between 1 and 2, one after another, every
/// two seconds, until `stop`.
async fn scale(api: Api<Memcached>, stop: Arc<AtomicBool>) -> Result<Scaled> {
    let started = Instant::now();
    let mut scaled = Scaled {
        made: 0,
        made_at: Vec::new(),
        refused: Vec::new(),
    };
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) {
        for (index, name) in SCALED.iter().enumerate() {
            let size = if (round + index).is_multiple_of(2) {
                2
            } else {
                1
            };
            let patch = Patch::Merge(serde_json::json!({"spec": {"size": size}}));
            match api.patch(name, &PatchParams::default(), &patch).await {
                Ok(_) => {
                    scaled.made += 1;
                    scaled.made_at.push(started.elapsed());
                }
                Err(error) => scaled.refused.push(format!("{name}: {error}")),
            }
        }
        round += 1;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(scaled)
}

/// Waits until OLM has replaced this release's ClusterServiceVersion with `next`'s through an
/// InstallPlan it approved itself, and the manager Deployment runs `next`'s image everywhere.
async fn upgrade_completes(cluster: &TestCluster, namespace: &str, next: &str) -> Result<()> {
    let next_csv = format!("{MANAGER}.v{next}");
    csv_succeeds(cluster, namespace, &next_csv).await?;
    let csvs = olm_api(cluster, "ClusterServiceVersion", namespace);
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), namespace);
    testkit::wait_for("OLM to roll the manager out", UPGRADE_TIMEOUT, || async {
        ensure!(csvs.get_opt(CSV).await?.is_none(), "{CSV} is still there");
        let deployment = deployments.get(MANAGER).await?;
        let images: Vec<String> = deployment
            .spec
            .template
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .filter_map(|c| c.image.clone())
            .collect();
        ensure!(
            images
                .iter()
                .all(|image| image.ends_with(&format!(":{next}"))),
            "the manager runs {images:?}"
        );
        let status = deployment.status.clone().unwrap_or_default();
        let want = deployment.spec.replicas.unwrap_or(1);
        ensure!(
            status.observed_generation == deployment.metadata.generation
                && status.updated_replicas == Some(want)
                && status.available_replicas == Some(want)
                && status.replicas == Some(want),
            "the rollout is not done: {status:?}"
        );
        Ok(())
    })
    .await?;
    let plans = olm_api(cluster, "InstallPlan", namespace)
        .list(&ListParams::default())
        .await?;
    let automatic = plans.items.iter().any(|plan| {
        let spec = &plan.data["spec"];
        spec["approval"] == "Automatic"
            && spec["approved"] == true
            && spec["clusterServiceVersionNames"]
                .as_array()
                .is_some_and(|names| names.iter().any(|n| n == next_csv.as_str()))
    });
    ensure!(
        automatic,
        "no InstallPlan for {next_csv} approved automatically: {:?}",
        plans
            .items
            .iter()
            .map(|p| &p.data["spec"])
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// Waits for the ClusterServiceVersion `name` to reach `Succeeded`.
async fn csv_succeeds(cluster: &TestCluster, namespace: &str, name: &str) -> Result<()> {
    let csvs = olm_api(cluster, "ClusterServiceVersion", namespace);
    let what = format!("{name} to succeed");
    testkit::wait_for(&what, UPGRADE_TIMEOUT, || async {
        let phase = csvs
            .get_opt(name)
            .await?
            .map(|csv| csv.data["status"]["phase"].clone());
        ensure!(
            phase.as_ref().is_some_and(|p| p == "Succeeded"),
            "{name} is {phase:?}"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// The release after `version`: the next minor one.
fn next_release(version: &str) -> Result<String> {
    let mut parts = version.split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        bail!("{version} is no version");
    };
    let minor: u32 = minor
        .parse()
        .with_context(|| format!("{version}'s minor"))?;
    Ok(format!("{major}.{}.0", minor + 1))
}

/// `operator-sdk scorecard bundle/`: every test of the basic and OLM suites passes, each in a
/// pod of the images `olm install` pushed, and no pod is left.
async fn scorecard_passes(cluster: &TestCluster, namespace: &str, installed: &str) -> Result<()> {
    let registry = registry(cluster)?;
    let untar = printed_image(installed, &format!("{registry}/busybox-tar:"))?;
    let bundle = testkit::workspace_root().join("bundle");
    let (results, _) = xtask_output(&[
        "operator-sdk",
        "--",
        "scorecard",
        &bundle.display().to_string(),
        "--untar-image",
        &untar,
        "--namespace",
        namespace,
        "--kubeconfig",
        &cluster.kubeconfig.display().to_string(),
        "--output",
        "json",
        "--wait-time",
        "300s",
    ])?;
    let results: serde_json::Value =
        serde_json::from_str(&results).context("scorecard's JSON results")?;
    let mut passed = Vec::new();
    for item in results["items"].as_array().into_iter().flatten() {
        let suite = item["spec"]["labels"]["suite"].as_str().unwrap_or_default();
        for result in item["status"]["results"].as_array().into_iter().flatten() {
            let name = result["name"].as_str().unwrap_or_default();
            ensure!(
                result["state"] == "pass",
                "scorecard's {suite} test {name} did not pass: {result}"
            );
            passed.push((suite.to_owned(), name.to_owned()));
        }
    }
    passed.sort();
    let suites: std::collections::BTreeSet<&str> = passed.iter().map(|(s, _)| s.as_str()).collect();
    ensure!(
        passed.len() == 6 && suites == ["basic", "olm"].into(),
        "want the basic test and the five OLM tests to pass: {passed:?}"
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    testkit::wait_for("scorecard's pods to go", TIMEOUT, || async {
        let left = pods
            .list_metadata(&ListParams::default().labels("app=scorecard-test"))
            .await?
            .items
            .len();
        ensure!(left == 0, "{left} scorecard pods left");
        Ok(())
    })
    .await?;
    Ok(())
}

/// What OLM leaves after `operator-sdk cleanup`, as on any cluster: the bundle's metrics-reader
/// ClusterRole, and no other. Deletes it.
async fn metrics_reader_is_left(cluster: &TestCluster, csv: &str) -> Result<()> {
    // `operator-sdk cleanup` deletes only the operator's CRDs, CSV, Subscription, CatalogSource
    // and OperatorGroup, and OLM's garbage collection goes by owner labels the role lacks. The
    // tutorial's bundle has the same role.
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    let owned: Vec<String> = roles
        .list_metadata(&ListParams::default().labels(&owned_by(csv)))
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

/// The pod is a Job's: OLM's bundle unpacking leaves them.
fn owned_by_job(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Job")
}

/// `operator-sdk cleanup` removes the operator, its CRDs and what installed it: nothing of it is
/// left in `namespace` or the cluster, but for the bundle's unpacking Jobs' pods.
async fn cleanup_removes_it_all(cluster: &TestCluster, namespace: &str, csv: &str) -> Result<()> {
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let name = |pod: &Pod| pod.metadata.name.clone().unwrap_or_default();
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
            let webhooks = webhook_configurations(cluster, csv).await?;
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
    apply_when_admitted(cluster, objects, ns.name()).await?;

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
    converges(cluster, ns, "memcached-sample", size).await?;

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
    converges(cluster, ns, "memcached-sample", 2).await?;

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

/// Applies Memcacheds through OLM's webhooks, again until they are admitted.
async fn apply_when_admitted(
    cluster: &TestCluster,
    objects: Vec<DynamicObject>,
    namespace: &str,
) -> Result<()> {
    // A replica is Ready a moment before kube-proxy routes OLM's webhook Service to it, so the
    // first calls may be refused.
    testkit::wait_for(
        "the webhooks to admit the Memcacheds",
        Duration::from_secs(60),
        || async {
            testkit::apply_objects(&cluster.client, objects.clone(), Some(namespace)).await
        },
    )
    .await?;
    Ok(())
}

/// Waits until the Memcached `name` has `size` ready memcached pods, and its status says so.
async fn converges(cluster: &TestCluster, ns: &TestNamespace, name: &str, size: i32) -> Result<()> {
    let memcacheds: Api<Memcached> = Api::namespaced(cluster.client.clone(), ns.name());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns.name());
    let what = format!("Memcached {name} to converge");
    testkit::wait_for(&what, TIMEOUT, || async {
        let mc = memcacheds.get(name).await?;
        let status = mc.status.clone().unwrap_or_default();
        let ready = pods
            .list(&ListParams::default().labels(&format!("memcached_cr={name}")))
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
    // OperatorGroups are the one kind here that OLM serves as v1.
    let version = if kind == "OperatorGroup" {
        "v1"
    } else {
        "v1alpha1"
    };
    let gvk = GroupVersionKind::gvk("operators.coreos.com", version, kind);
    let plural = format!("{}s", kind.to_lowercase());
    let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
    Api::namespaced_with(cluster.client.clone(), namespace, &resource)
}

/// The local cluster's registry, `HOST:PORT`, plain HTTP.
fn registry(cluster: &TestCluster) -> Result<String> {
    Ok(cluster
        .state
        .registry()
        .context("the local cluster runs a registry")?
        .to_string())
}

/// The first image `cargo xtask olm install` printed whose name starts with `prefix`.
fn printed_image(installed: &str, prefix: &str) -> Result<String> {
    installed
        .split_whitespace()
        .find(|word| word.starts_with(prefix))
        .map(|word| word.trim_end_matches(['`', ',']).to_owned())
        .with_context(|| format!("`olm install` names no {prefix}… image: {installed}"))
}

/// The label OLM puts on what it creates for the ClusterServiceVersion `csv`.
fn owned_by(csv: &str) -> String {
    format!("olm.owner={csv}")
}

/// The admission webhook configurations OLM made for the CSV, by name.
async fn webhook_configurations(cluster: &TestCluster, csv: &str) -> Result<Vec<String>> {
    let owned = ListParams::default().labels(&owned_by(csv));
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
    /// Where the operator is installed.
    namespace: String,
    kubeconfig: String,
    kubectl: std::path::PathBuf,
    armed: bool,
}

impl Cleanup {
    fn new(cluster: &TestCluster, ns: &TestNamespace) -> Self {
        Self {
            namespace: ns.name().to_owned(),
            kubeconfig: cluster.kubeconfig.display().to_string(),
            kubectl: cluster.kubectl_path(),
            armed: true,
        }
    }

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
            // What OLM, gone now, would have removed with the namespace's OperatorGroup.
            let group = format!(
                "olm.owner.kind=OperatorGroup,olm.owner.namespace={}",
                self.namespace
            );
            for args in [
                vec![
                    "delete",
                    "clusterrole",
                    METRICS_READER,
                    "--ignore-not-found",
                ],
                vec!["delete", "clusterrole", "--selector", &group],
            ] {
                let deleted = Command::new(&self.kubectl)
                    .args(["--kubeconfig", &self.kubeconfig])
                    .args(args)
                    .status();
                if let Err(error) = deleted {
                    eprintln!("cleaning up after the failed test: kubectl: {error}");
                }
            }
        }
    }
}

/// Runs an xtask command, with its output shown; fails with it when the command fails. Returns
/// what it printed, stdout then stderr (operator-sdk logs to stderr).
fn xtask(args: &[&str]) -> Result<String> {
    let (stdout, stderr) = xtask_output(args)?;
    Ok(format!("{stdout}{stderr}"))
}

/// Runs an xtask command, with its output shown; fails with it when the command fails. Returns
/// its stdout and its stderr.
fn xtask_output(args: &[&str]) -> Result<(String, String)> {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .with_context(|| format!("running xtask {}", args.join(" ")))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    println!("$ cargo xtask {}\n{stdout}{stderr}", args.join(" "));
    if !output.status.success() {
        bail!("`cargo xtask {}` failed:\n{stdout}{stderr}", args.join(" "));
    }
    Ok((stdout, stderr))
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
        vec![
            "logs",
            "--namespace",
            namespace,
            "--selector",
            "olm.catalogSource",
            "--all-containers",
            "--prefix",
            "--tail=20",
        ],
        vec!["get", "events", "--namespace", namespace],
    ] {
        let text = kubectl(cluster, &args).unwrap_or_else(|e| e.to_string());
        out.push_str(&format!("\n$ kubectl {}\n{text}\n", args.join(" ")));
    }
    out
}
