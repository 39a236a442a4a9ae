//! `cargo xtask olm`: the Operator Lifecycle Manager on the local cluster, and the bundle
//! installed through it, as `operator-sdk olm install` and `operator-sdk run bundle` do on a
//! cluster that can pull images.
//!
//! OLM's own installer pulls its images from a registry, which these machines cannot reach, so
//! `install` builds OLM's olm-operator from its Go module at the version `xtask/olm/go.mod` pins
//! (through the module proxy, once, into the local cluster's cache), packs it into an OCI image,
//! loads that into the real node and runs it as OLM's own manifests do: its CRDs (from the same
//! module), the `olm` namespace, a ServiceAccount bound to OLM's ClusterRole, the Deployment,
//! the `cluster` OLMConfig, and the `operators` namespace with its global OperatorGroup.
//!
//! The catalog operator is left out: it resolves Subscriptions against catalog and bundle images
//! served from a registry. `run-bundle` does what the InstallPlan would have done with the
//! bundle: it applies the bundle's CRDs and other objects, makes sure the namespace has an
//! OperatorGroup, creates the ClusterServiceVersion and waits until OLM has installed the
//! operator (phase `Succeeded`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::discovery::{self, ApiResource, Scope};
use ociimage::{Image, ImageConfig, Metadata, Platform, Reference, User};
use serde_json::{Value, json};

use crate::component::{self, Component};
use crate::gomodule::GoModule;

/// olm-operator, built from OLM's module at the version `go.mod` pins.
const MODULE: GoModule = GoModule {
    what: "OLM's olm-operator",
    cache_dir: "olm",
    repo_dir: "xtask/olm",
    binary: "olm",
    main_package: "github.com/operator-framework/operator-lifecycle-manager/cmd/olm",
    // What OLM's release build stamps, so `olm --version` and OLM's logs name the release.
    ldflags: "-X github.com/operator-framework/operator-lifecycle-manager/pkg/version.OLMVersion=v0.46.0",
    cold_build: "about 6 minutes",
    sources: &[
        ("go.mod", include_str!("../olm/go.mod")),
        ("go.sum", include_str!("../olm/go.sum")),
    ],
};
/// OLM's Go module, whose `deploy/chart/crds` are the CRDs of that release.
const OLM_MODULE: &str = "github.com/operator-framework/operator-lifecycle-manager";
/// Where OLM runs, as in its own manifests.
const OLM_NAMESPACE: &str = "olm";
/// Where operators for every namespace go, with OLM's global OperatorGroup.
const GLOBAL_NAMESPACE: &str = "operators";
const GLOBAL_OPERATOR_GROUP: &str = "global-operators";
const OLM_DEPLOYMENT: &str = "olm-operator";
const OLM_SERVICE_ACCOUNT: &str = "olm-operator-serviceaccount";
const OLM_CLUSTER_ROLE: &str = "system:controller:operator-lifecycle-manager";
const OLM_CLUSTER_ROLE_BINDING: &str = "olm-operator-binding-olm";
/// A registry domain no one serves: nothing tries to pull the image, and it cannot be mistaken
/// for OLM's published one.
const OLM_REPOSITORY: &str = concat!(product::name!(), ".local/olm");
/// The binary's path in the image, as in OLM's published image.
const OLM_BINARY: &str = "/bin/olm";
/// A numeric non-root user, so the kubelet can check `runAsNonRoot`.
const OLM_USER: u32 = 65532;
/// The label OLM puts on the ClusterServiceVersions it copies into every target namespace.
const COPIED_FROM: &str = "olm.copiedFrom";
const CSV_CRD: &str = "clusterserviceversions.operators.coreos.com";
/// How long OLM's Deployment may take to become Available: a real container on a busy
/// two-core machine.
const OLM_READY_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Debug, clap::Subcommand)]
pub enum OlmCommand {
    /// Build OLM's olm-operator from source, load it into the real node and install OLM.
    Install,
    /// Remove OLM; refused while an operator it installed is still there.
    Uninstall,
    /// Install the bundle through OLM, as an InstallPlan would, and wait until OLM reports the
    /// ClusterServiceVersion `Succeeded`.
    RunBundle(BundleArgs),
    /// Remove what `run-bundle` installed: the bundle's CRDs (and with them every custom
    /// resource of theirs), the ClusterServiceVersion (OLM then removes the operator) and the
    /// bundle's other objects.
    CleanupBundle(BundleArgs),
}

#[derive(Debug, clap::Args)]
pub struct BundleArgs {
    /// The namespace the operator is installed into.
    #[arg(long, default_value = GLOBAL_NAMESPACE)]
    namespace: String,
    /// The bundle directory (default: `bundle/` at the workspace root).
    #[arg(long, value_name = "DIR")]
    bundle_dir: Option<PathBuf>,
    /// How long to wait for OLM, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    timeout: u64,
}

pub fn run(command: OlmCommand) -> anyhow::Result<()> {
    // The Go build is synchronous and long: run it before the async runtime exists.
    let olm_binary = match command {
        OlmCommand::Install => Some(MODULE.build(|line| println!("{line}"))?),
        _ => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let state = localcluster::LocalCluster::from_env()?
            .running()
            .context("OLM runs on the local cluster: start it with `cargo xtask cluster up`")?;
        let client = localcluster::client_from_kubeconfig(&state.kubeconfig).await?;
        match command {
            OlmCommand::Install => {
                let binary = olm_binary.context("olm-operator was not built")?;
                install(&client, &state, &binary).await
            }
            OlmCommand::Uninstall => uninstall(&client).await,
            OlmCommand::RunBundle(args) => run_bundle(&client, &state, &args).await,
            OlmCommand::CleanupBundle(args) => cleanup_bundle(&client, &args).await,
        }
    })
}

async fn install(
    client: &kube::Client,
    state: &localcluster::ClusterState,
    binary: &Path,
) -> anyhow::Result<()> {
    let node = state.node.as_ref().context(
        "OLM runs as a pod on the local cluster's real node, and the cluster runs without one; \
         restart it with `cargo xtask cluster down && cargo xtask cluster up`",
    )?;
    let version = MODULE.required_version(OLM_MODULE)?;
    let image = olm_image(binary, version)?;
    let archive = binary.with_file_name(format!("olm-{version}.oci.tar"));
    let built = image
        .write(&archive)
        .with_context(|| format!("writing the image {}", image.reference()))?;
    ociimage::import_into_containerd(&built.archive, &built.reference, &node.containerd_socket)?;
    println!("loaded {} into the real node", built.reference);

    let crds = olm_crds()?;
    println!("applying OLM {version}'s {} CRDs", crds.len());
    testkit::apply_objects(client, crds, None).await?;
    testkit::apply_objects(client, olm_objects(&built.reference.normalized())?, None).await?;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OLM_NAMESPACE);
    let started = Instant::now();
    testkit::wait_for(
        "OLM's olm-operator to be Available",
        OLM_READY_TIMEOUT,
        || async {
            let deployment = deployments
                .get(OLM_DEPLOYMENT)
                .await
                .map_err(|e| e.to_string())?;
            let status = deployment.status.unwrap_or_default();
            if status.available_replicas.unwrap_or_default() > 0 {
                Ok(())
            } else {
                Err(format!("status {status:?}"))
            }
        },
    )
    .await?;
    println!(
        "OLM {version} is running in namespace {OLM_NAMESPACE} (ready in {:.0?}); install the \
         bundle with `cargo xtask olm run-bundle`",
        started.elapsed()
    );
    Ok(())
}

fn olm_image(binary: &Path, version: &str) -> anyhow::Result<Image> {
    let config = ImageConfig {
        platform: Platform::host(),
        user: User {
            name: "nonroot".into(),
            uid: OLM_USER,
            gid: OLM_USER,
        },
        entrypoint: vec![OLM_BINARY.into()],
        cmd: Vec::new(),
        env: Vec::new(),
        exposed_ports: Vec::new(),
        working_dir: "/".into(),
        metadata: Metadata {
            title: "olm".into(),
            description: "OLM's olm-operator, built from its Go module".into(),
            version: version.into(),
            revision: None,
            source: Some(format!("https://{OLM_MODULE}")),
            url: Some("https://olm.operatorframework.io/".into()),
            licenses: Some("Apache-2.0".into()),
            labels: Default::default(),
            // Reproducible: the image changes only with the binary.
            created: 0,
        },
    };
    let reference = Reference::parse(&format!("{OLM_REPOSITORY}:{version}"))?;
    let mut image = Image::new(reference, config);
    image
        .add_binary(binary, OLM_BINARY)
        .with_context(|| format!("adding {} to the OLM image", binary.display()))?;
    Ok(image)
}

/// OLM's CRDs, from the pinned release's module.
fn olm_crds() -> anyhow::Result<Vec<DynamicObject>> {
    let dir = MODULE.dependency_dir(OLM_MODULE)?.join("deploy/chart/crds");
    let mut crds = Vec::new();
    for file in testkit::yaml_files(&dir)? {
        crds.extend(testkit::read_yaml_file(&file)?);
    }
    if crds.is_empty() {
        bail!("{} holds no CRDs", dir.display());
    }
    Ok(crds)
}

/// Everything of OLM but its CRDs, as OLM's own manifests install it.
fn olm_objects(image: &str) -> anyhow::Result<Vec<DynamicObject>> {
    // OLM's pods, and the operators it installs, are real containers: they run on the real node.
    let component = Component {
        name: OLM_DEPLOYMENT,
        namespace: OLM_NAMESPACE,
        service_account: OLM_SERVICE_ACCOUNT,
    };
    let container = json!({
        "image": image,
        "command": [OLM_BINARY],
        "args": ["--namespace", "$(OPERATOR_NAMESPACE)"],
        "env": [
            {"name": "OPERATOR_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "OPERATOR_NAME", "value": OLM_DEPLOYMENT},
        ],
        "ports": [{"name": "metrics", "containerPort": 8080}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
        "resources": {"requests": {"cpu": "10m", "memory": "160Mi"}},
        "volumeMounts": [{"name": "tmpfs", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    let volumes = json!([{"name": "tmpfs", "emptyDir": {}}]);
    component::objects(
        vec![
            component.namespace(),
            component::on_real_node(GLOBAL_NAMESPACE),
            component.service_account(),
            // OLM grants the operators it installs what their CSVs ask for, so it holds
            // everything.
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": OLM_CLUSTER_ROLE},
                "rules": [
                    {"apiGroups": ["*"], "resources": ["*"], "verbs": [
                        "watch", "list", "get", "create", "update", "patch", "delete",
                        "deletecollection", "escalate", "bind"]},
                    {"nonResourceURLs": ["*"], "verbs": ["*"]},
                ],
            }),
            component.cluster_role_binding(OLM_CLUSTER_ROLE_BINDING, OLM_CLUSTER_ROLE),
            component.deployment(container, volumes),
            json!({
                "apiVersion": "operators.coreos.com/v1", "kind": "OLMConfig",
                "metadata": {"name": "cluster"},
            }),
            json!({
                "apiVersion": "operators.coreos.com/v1", "kind": "OperatorGroup",
                "metadata": {"name": GLOBAL_OPERATOR_GROUP, "namespace": GLOBAL_NAMESPACE},
            }),
        ],
        "OLM's objects",
    )
}

async fn uninstall(client: &kube::Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds.get_opt(CSV_CRD).await?.is_some() {
        let installed = installed_operators(client).await?;
        if !installed.is_empty() {
            bail!(
                "OLM still manages {}; remove them first (`cargo xtask olm cleanup-bundle`, or \
                 delete the ClusterServiceVersions)",
                installed.join(", ")
            );
        }
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    delete_all(
        &namespaces,
        &[OLM_NAMESPACE, GLOBAL_NAMESPACE],
        "OLM's namespaces",
        OLM_READY_TIMEOUT,
    )
    .await?;
    let cluster_objects = [
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
            OLM_CLUSTER_ROLE_BINDING,
        ),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            OLM_CLUSTER_ROLE,
        ),
        ("operators.coreos.com/v1", "OLMConfig", "cluster"),
    ];
    for (api_version, kind, name) in cluster_objects {
        if let Some(api) = dynamic_api(client, api_version, kind, None).await? {
            delete(&api, name).await?;
        }
    }
    // What OLM made for its OperatorGroups is cluster-scoped and outlives their namespaces.
    delete_cluster_rbac(
        client,
        &format!("olm.owner.namespace in ({OLM_NAMESPACE},{GLOBAL_NAMESPACE})"),
    )
    .await?;
    let names: Vec<String> = olm_crds()?
        .into_iter()
        .filter_map(|crd| crd.metadata.name)
        .collect();
    delete_all(&crds, &names, "OLM's CRDs", OLM_READY_TIMEOUT).await?;
    println!("OLM is uninstalled");
    Ok(())
}

/// The ClusterServiceVersions OLM manages, as `namespace/name`, its copies left out.
async fn installed_operators(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let Some(csvs) = dynamic_api(
        client,
        "operators.coreos.com/v1alpha1",
        "ClusterServiceVersion",
        None,
    )
    .await?
    else {
        return Ok(Vec::new());
    };
    let list = csvs
        .list(&ListParams::default().labels(&format!("!{COPIED_FROM}")))
        .await?;
    Ok(list
        .items
        .iter()
        .map(|csv| {
            format!(
                "{}/{}",
                csv.metadata.namespace.as_deref().unwrap_or_default(),
                csv.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect())
}

/// A bundle directory's manifests, sorted by what `run-bundle` does with them.
#[derive(Debug)]
struct Bundle {
    csv: DynamicObject,
    crds: Vec<DynamicObject>,
    others: Vec<DynamicObject>,
}

impl Bundle {
    fn read(dir: &Path) -> anyhow::Result<Self> {
        let manifests = dir.join("manifests");
        if !manifests.is_dir() {
            bail!(
                "{} is no bundle: it has no manifests/ directory (write one with `cargo xtask \
                 bundle`)",
                dir.display()
            );
        }
        let mut csvs = Vec::new();
        let mut crds = Vec::new();
        let mut others = Vec::new();
        for file in testkit::yaml_files(&manifests)? {
            for object in testkit::read_yaml_file(&file)? {
                match kind(&object) {
                    "ClusterServiceVersion" => csvs.push(object),
                    "CustomResourceDefinition" => crds.push(object),
                    _ => others.push(object),
                }
            }
        }
        let csv = match <[DynamicObject; 1]>::try_from(csvs) {
            Ok([csv]) => csv,
            Err(found) => bail!(
                "{} holds {} ClusterServiceVersions; a bundle has exactly one",
                manifests.display(),
                found.len()
            ),
        };
        Ok(Self { csv, crds, others })
    }

    fn csv_name(&self) -> &str {
        self.csv.metadata.name.as_deref().unwrap_or_default()
    }

    /// The Deployments of the CSV's install strategy, by name.
    fn deployments(&self) -> Vec<&Value> {
        self.csv.data["spec"]["install"]["spec"]["deployments"]
            .as_array()
            .map(|all| all.iter().collect())
            .unwrap_or_default()
    }

    fn deployment_names(&self) -> Vec<&str> {
        self.deployments()
            .iter()
            .filter_map(|d| d["name"].as_str())
            .collect()
    }

    /// Every image the install strategy's pods run.
    fn images(&self) -> Vec<&str> {
        let mut images = Vec::new();
        for deployment in self.deployments() {
            let spec = &deployment["spec"]["template"]["spec"];
            for list in ["initContainers", "containers"] {
                for container in spec[list].as_array().into_iter().flatten() {
                    images.extend(container["image"].as_str());
                }
            }
        }
        images
    }

    /// The ServiceAccounts, Roles, ClusterRoles and bindings the install strategy asks for,
    /// as OLM's InstallPlan creates them: the namespaced ones owned by the CSV (uid `csv_uid`)
    /// so that deleting it deletes them, all of them labelled with their owner.
    fn rbac(&self, namespace: &str, csv_uid: &str) -> anyhow::Result<Vec<DynamicObject>> {
        let csv = self.csv_name();
        let owner = json!({
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "ClusterServiceVersion",
            "name": csv,
            "uid": csv_uid,
            "blockOwnerDeletion": false,
            "controller": false,
        });
        let labels = owner_labels(csv, namespace);
        let strategy = &self.csv.data["spec"]["install"]["spec"];
        let mut objects = Vec::new();
        let mut accounts: Vec<&str> = Vec::new();
        for (scope, cluster) in [("permissions", false), ("clusterPermissions", true)] {
            for (index, permission) in strategy[scope].as_array().into_iter().flatten().enumerate()
            {
                let account = permission["serviceAccountName"].as_str().with_context(|| {
                    format!("{csv}: an entry of {scope} names no serviceAccountName")
                })?;
                if !accounts.contains(&account) {
                    accounts.push(account);
                    objects.push(json!({
                        "apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": account, "namespace": namespace, "ownerReferences": [owner]},
                    }));
                }
                let (role_kind, binding_kind, suffix) = if cluster {
                    ("ClusterRole", "ClusterRoleBinding", "cluster-")
                } else {
                    ("Role", "RoleBinding", "")
                };
                let name = format!("{csv}-{account}-{suffix}{index}");
                let mut metadata = json!({"name": name, "labels": labels});
                if !cluster {
                    metadata["namespace"] = json!(namespace);
                    metadata["ownerReferences"] = json!([owner]);
                }
                objects.push(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": role_kind,
                    "metadata": metadata, "rules": permission["rules"],
                }));
                objects.push(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding_kind,
                    "metadata": metadata,
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
                    "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
                }));
            }
        }
        objects
            .into_iter()
            .map(|object| serde_json::from_value(object).context("building the bundle's RBAC"))
            .collect()
    }

    /// The OperatorGroup spec to create in `namespace` when it has none: every namespace if
    /// the CSV supports that, else the namespace itself.
    fn operator_group_spec(&self, namespace: &str) -> anyhow::Result<Value> {
        let supports = |mode: &str| {
            self.csv.data["spec"]["installModes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["type"] == mode && m["supported"] == true)
        };
        if supports("AllNamespaces") {
            Ok(json!({}))
        } else if supports("OwnNamespace") {
            Ok(json!({ "targetNamespaces": [namespace] }))
        } else {
            bail!(
                "{} supports neither the AllNamespaces nor the OwnNamespace install mode; \
                 create the OperatorGroup in {namespace} yourself",
                self.csv_name()
            )
        }
    }

    /// The name of the OperatorGroup `run-bundle` creates when the namespace has none.
    fn operator_group_name(&self) -> String {
        let package = self
            .csv_name()
            .split_once(".v")
            .map_or(self.csv_name(), |(package, _)| package);
        format!("{package}-group")
    }
}

/// OLM's labels naming the CSV that owns an object; they let cluster-scoped objects, which
/// cannot have a namespaced owner, be found again.
fn owner_labels(csv: &str, namespace: &str) -> Value {
    json!({
        "olm.owner": csv,
        "olm.owner.namespace": namespace,
        "olm.owner.kind": "ClusterServiceVersion",
    })
}

fn owner_selector(csv: &str, namespace: &str) -> String {
    format!("olm.owner={csv},olm.owner.namespace={namespace},olm.owner.kind=ClusterServiceVersion")
}

fn kind(object: &DynamicObject) -> &str {
    object.types.as_ref().map_or("", |t| t.kind.as_str())
}

fn bundle_dir(args: &BundleArgs) -> PathBuf {
    args.bundle_dir
        .clone()
        .unwrap_or_else(|| crate::workspace_root().join("bundle"))
}

async fn run_bundle(
    client: &kube::Client,
    state: &localcluster::ClusterState,
    args: &BundleArgs,
) -> anyhow::Result<()> {
    let bundle = Bundle::read(&bundle_dir(args))?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds.get_opt(CSV_CRD).await?.is_none() {
        bail!("OLM is not installed on the local cluster: run `cargo xtask olm install` first");
    }
    if let Some(node) = &state.node {
        let loaded = localcluster::node::loaded_images(&node.containerd_socket)?;
        for image in bundle.images() {
            let normalized = Reference::parse(image)?.normalized();
            if !loaded.contains(&normalized) {
                bail!(
                    "the operator's image {image} is not loaded on the real node, which cannot \
                     pull: load it with `cargo xtask image manager --load`"
                );
            }
        }
    }

    let namespace = args.namespace.as_str();
    ensure_namespace(client, namespace).await?;
    ensure_operator_group(client, &bundle, namespace).await?;
    testkit::apply_objects(client, bundle.crds.clone(), None).await?;
    testkit::apply_objects(client, bundle.others.clone(), Some(namespace)).await?;
    let csv = testkit::apply_objects(client, vec![bundle.csv.clone()], Some(namespace)).await?;
    let uid = csv
        .first()
        .and_then(|csv| csv.metadata.uid.clone())
        .context("the API server returned the ClusterServiceVersion without a uid")?;
    // What the InstallPlan creates beside the CSV: OLM waits for the ServiceAccounts and their
    // permissions before it installs the Deployments.
    testkit::apply_objects(client, bundle.rbac(namespace, &uid)?, Some(namespace)).await?;
    println!(
        "created {} in {namespace}; waiting for OLM",
        bundle.csv_name()
    );

    let csvs = dynamic_api(
        client,
        "operators.coreos.com/v1alpha1",
        "ClusterServiceVersion",
        Some(namespace),
    )
    .await?
    .context("the ClusterServiceVersion API is not served")?;
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let csv = csvs.get(bundle.csv_name()).await?;
        let status = &csv.data["status"];
        let phase = status["phase"].as_str().unwrap_or("(none yet)");
        let progress = format!(
            "{phase}: {} {}",
            status["reason"].as_str().unwrap_or_default(),
            status["message"].as_str().unwrap_or_default()
        );
        if progress != last {
            println!("  {:>5.1}s {progress}", started.elapsed().as_secs_f64());
            last = progress;
        }
        if phase == "Succeeded" {
            break;
        }
        if started.elapsed() > Duration::from_secs(args.timeout) {
            bail!(
                "{} did not succeed within {} s; OLM last said {last}",
                bundle.csv_name(),
                args.timeout
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "OLM installed {} in {namespace} in {:.0?}",
        bundle.csv_name(),
        started.elapsed()
    );
    Ok(())
}

async fn ensure_namespace(client: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(namespace).await?.is_none() {
        let object: Namespace = serde_json::from_value(json!({
            "metadata": {
                "name": namespace,
                "annotations": localcluster::node::namespace_annotations(),
            },
        }))?;
        namespaces.create(&PostParams::default(), &object).await?;
        println!("created namespace {namespace}");
    }
    Ok(())
}

async fn ensure_operator_group(
    client: &kube::Client,
    bundle: &Bundle,
    namespace: &str,
) -> anyhow::Result<()> {
    let groups = dynamic_api(
        client,
        "operators.coreos.com/v1",
        "OperatorGroup",
        Some(namespace),
    )
    .await?
    .context("the OperatorGroup API is not served")?;
    if !groups.list(&ListParams::default()).await?.items.is_empty() {
        return Ok(());
    }
    let name = bundle.operator_group_name();
    let group: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "operators.coreos.com/v1",
        "kind": "OperatorGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": bundle.operator_group_spec(namespace)?,
    }))?;
    groups.create(&PostParams::default(), &group).await?;
    println!("created OperatorGroup {name} in {namespace}");
    Ok(())
}

async fn cleanup_bundle(client: &kube::Client, args: &BundleArgs) -> anyhow::Result<()> {
    let bundle = Bundle::read(&bundle_dir(args))?;
    let namespace = args.namespace.as_str();
    let timeout = Duration::from_secs(args.timeout);

    // CRDs first, while the operator still runs to see its resources go.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_names: Vec<&str> = bundle
        .crds
        .iter()
        .filter_map(|crd| crd.metadata.name.as_deref())
        .collect();
    delete_all(&crds, &crd_names, "the bundle's CRDs", timeout).await?;

    if let Some(csvs) = dynamic_api(
        client,
        "operators.coreos.com/v1alpha1",
        "ClusterServiceVersion",
        Some(namespace),
    )
    .await?
    {
        delete(&csvs, bundle.csv_name()).await?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    testkit::wait_for(
        "OLM to remove the operator's Deployments",
        timeout,
        || async {
            for name in bundle.deployment_names() {
                if deployments.get_opt(name).await?.is_some() {
                    return Err(anyhow::anyhow!("Deployment {name} is still there"));
                }
            }
            Ok(())
        },
    )
    .await?;

    for object in &bundle.others {
        let types = object.types.clone().unwrap_or_default();
        if let Some(api) =
            dynamic_api(client, &types.api_version, &types.kind, Some(namespace)).await?
        {
            delete(&api, object.metadata.name.as_deref().unwrap_or_default()).await?;
        }
    }
    // Cluster-scoped RBAC has no owner to be collected with; find it by OLM's owner labels.
    delete_cluster_rbac(client, &owner_selector(bundle.csv_name(), namespace)).await?;
    if let Some(groups) = dynamic_api(
        client,
        "operators.coreos.com/v1",
        "OperatorGroup",
        Some(namespace),
    )
    .await?
    {
        delete(&groups, &bundle.operator_group_name()).await?;
    }
    println!(
        "removed {} and its objects from {namespace}",
        bundle.csv_name()
    );
    Ok(())
}

/// The API of a kind, namespaced to `namespace` if the kind is namespaced; `None` when the
/// server does not serve the kind (OLM's CRDs are not installed).
async fn dynamic_api(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> anyhow::Result<Option<Api<DynamicObject>>> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities): (ApiResource, _) = match discovery::pinned_kind(client, &gvk)
        .await
    {
        Ok(found) => found,
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
        Err(error) => {
            return Err(error).with_context(|| format!("finding the API of {api_version} {kind}"));
        }
    };
    Ok(Some(match (capabilities.scope, namespace) {
        (Scope::Namespaced, Some(namespace)) => {
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    }))
}

/// Deletes the named objects and waits until they are gone.
async fn delete_all<K, N>(
    api: &Api<K>,
    names: &[N],
    what: &str,
    timeout: Duration,
) -> anyhow::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    N: AsRef<str>,
{
    for name in names {
        delete(api, name.as_ref()).await?;
    }
    testkit::wait_for(&format!("{what} to be gone"), timeout, || async {
        for name in names {
            if api.get_opt(name.as_ref()).await?.is_some() {
                return Err(anyhow::anyhow!("{} is still there", name.as_ref()));
            }
        }
        Ok(())
    })
    .await?;
    Ok(())
}

/// Deletes the ClusterRoleBindings and ClusterRoles that match `selector`.
async fn delete_cluster_rbac(client: &kube::Client, selector: &str) -> anyhow::Result<()> {
    let matching = ListParams::default().labels(selector);
    for kind in ["ClusterRoleBinding", "ClusterRole"] {
        if let Some(api) = dynamic_api(client, "rbac.authorization.k8s.io/v1", kind, None).await? {
            for object in api.list_metadata(&matching).await? {
                delete(&api, object.metadata.name.as_deref().unwrap_or_default()).await?;
            }
        }
    }
    Ok(())
}

/// Deletes `name` in the foreground (its dependents first); gone already is fine.
async fn delete<K>(api: &Api<K>, name: &str) -> anyhow::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::foreground()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error).with_context(|| format!("deleting {name}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_module_is_embedded() {
        MODULE.assert_every_file_is_embedded();
    }

    #[test]
    fn the_pinned_release_is_read_from_go_mod() {
        let version = MODULE.required_version(OLM_MODULE).unwrap();
        assert!(version.starts_with("v0."), "{version}");
        assert!(
            MODULE.ldflags.ends_with(&format!("={version}")),
            "{}",
            MODULE.ldflags
        );
    }

    #[test]
    fn the_committed_bundle_is_sorted_for_olm() {
        let bundle = Bundle::read(&crate::workspace_root().join("bundle")).unwrap();
        assert_eq!(
            bundle.csv_name(),
            format!("{}.v{}", product::NAME, env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(bundle.deployment_names(), [product::name!()]);
        assert_eq!(
            bundle.images(),
            [format!("{}:{}", product::NAME, env!("CARGO_PKG_VERSION"))]
        );
        assert!(!bundle.crds.is_empty());
        assert!(
            bundle
                .others
                .iter()
                .all(|o| kind(o) != "CustomResourceDefinition")
        );
        assert_eq!(
            bundle.operator_group_name(),
            concat!(product::name!(), "-group")
        );
        let rbac = bundle.rbac("ns", "uid-1").unwrap();
        let kinds: Vec<&str> = rbac.iter().map(kind).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "ClusterRole",
                "ClusterRoleBinding"
            ]
        );
        for object in &rbac {
            let namespaced = !kind(object).starts_with("Cluster");
            assert_eq!(
                object.metadata.owner_references.is_some(),
                namespaced,
                "{object:?}"
            );
            if kind(object) != "ServiceAccount" {
                let labels = object.metadata.labels.clone().unwrap_or_default();
                assert_eq!(labels["olm.owner"], bundle.csv_name());
            }
        }
        // Conversion webhooks need every namespace: OLM refuses them in any other mode.
        assert_eq!(bundle.operator_group_spec("x").unwrap(), json!({}));
    }

    #[test]
    fn a_directory_without_manifests_is_no_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let error = Bundle::read(dir.path()).unwrap_err().to_string();
        assert!(error.contains("cargo xtask bundle"), "{error}");
    }

    #[test]
    fn a_bundle_needs_exactly_one_csv() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("manifests")).unwrap();
        std::fs::write(
            dir.path().join("manifests/crd.yaml"),
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: a.b\n",
        )
        .unwrap();
        let error = Bundle::read(dir.path()).unwrap_err().to_string();
        assert!(error.contains("0 ClusterServiceVersions"), "{error}");
    }

    #[test]
    fn an_operator_for_its_own_namespace_gets_a_group_of_that_namespace() {
        let csv: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "operators.coreos.com/v1alpha1", "kind": "ClusterServiceVersion",
            "metadata": {"name": "x.v1.0.0"},
            "spec": {"installModes": [
                {"type": "OwnNamespace", "supported": true},
                {"type": "AllNamespaces", "supported": false},
            ]},
        }))
        .unwrap();
        let bundle = Bundle {
            csv,
            crds: Vec::new(),
            others: Vec::new(),
        };
        assert_eq!(
            bundle.operator_group_spec("ns").unwrap(),
            json!({"targetNamespaces": ["ns"]})
        );
        assert_eq!(bundle.operator_group_name(), "x-group");
    }
}
