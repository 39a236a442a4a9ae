//! `cargo xtask olm`: the Operator Lifecycle Manager on the local cluster, as `operator-sdk olm
//! install` installs it on a cluster that can pull images.
//!
//! OLM's own installer downloads its release manifests and pulls its images from the internet,
//! which these machines cannot reach, so `install` builds OLM's programs from its Go module at
//! the version `xtask/olm/go.mod` pins (through the module proxy, once, into the local cluster's
//! cache), and operator-registry's `opm` from the same module. OLM's programs go into one image
//! (olm-operator, the catalog operator, `copy-content`, `cpb`, and the `/bin/cp` the
//! bundle-unpacking Jobs run), loaded into the real node; opm's image ([`crate::opm`]) is pushed
//! to the local registry as `quay.io/operator-framework/opm:latest`, the name OLM and
//! `operator-sdk` pull, which the node asks the local registry for, and so are the images
//! `operator-sdk run bundle` and `operator-sdk scorecard` run. Then it applies what OLM's own
//! manifests do: its CRDs (from the same module), the `olm` namespace, a ServiceAccount bound
//! to OLM's ClusterRole, the olm-operator and catalog-operator Deployments, the `cluster`
//! OLMConfig, and the `operators` namespace with its global OperatorGroup.
//!
//! `operator-sdk run bundle` (see [`crate::operator_sdk`]) then installs the bundle through a
//! CatalogSource, a Subscription and an InstallPlan, as on any cluster.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use kube::discovery::{self, ApiResource, Scope};
use ociimage::{Image, ImageConfig, Reference, User};
use serde_json::json;

use crate::component::{self, Component};
use crate::gomodule::{self, GoModule};
use crate::opm::Opm;

/// olm-operator, built from OLM's module at the version `go.mod` pins. The module also pins
/// operator-registry, whose `opm` OLM's bundle-unpacking Jobs run; every program below is built
/// from it, with the version stamps and build tags of their release builds, so they share its
/// downloads and Go's build cache.
pub const MODULE: GoModule = GoModule {
    what: "OLM's olm-operator",
    cache_dir: "olm",
    repo_dir: "xtask/olm",
    binary: "olm",
    main_package: "github.com/operator-framework/operator-lifecycle-manager/cmd/olm",
    // What the release builds stamp, so `olm --version`, `opm version`, `operator-sdk version`
    // and the logs name the releases, and the images operator-sdk asks for carry its tag (an
    // `-X` for a package a program does not link is ignored).
    ldflags: "-X github.com/operator-framework/operator-lifecycle-manager/pkg/version.OLMVersion=v0.46.0 \
              -X github.com/operator-framework/operator-registry/cmd/opm/version.opmVersion=v1.73.0 \
              -X github.com/operator-framework/operator-sdk/internal/version.Version=v1.42.2 \
              -X github.com/operator-framework/operator-sdk/internal/version.GitVersion=v1.42.2 \
              -X github.com/operator-framework/operator-sdk/internal/version.ImageVersion=v1.42.2 \
              -X github.com/operator-framework/operator-sdk/internal/version.KubernetesVersion=v1.33.1",
    // operator-registry's and operator-sdk's: SQLite's JSON functions, and image signatures
    // checked without gpgme (a C library).
    tags: "json1,containers_image_openpgp",
    cold_build: "about 3 minutes",
    sources: &[
        ("go.mod", include_str!("../olm/go.mod")),
        ("go.sum", include_str!("../olm/go.sum")),
    ],
};
/// The catalog operator: resolves Subscriptions against CatalogSources into InstallPlans, and
/// unpacks bundles with a Job.
const CATALOG: GoModule = GoModule {
    what: "OLM's catalog operator",
    binary: "catalog",
    main_package: "github.com/operator-framework/operator-lifecycle-manager/cmd/catalog",
    cold_build: "about 10 seconds once olm-operator is built",
    ..MODULE
};
/// What the catalog operator's catalog pods copy their content with.
const COPY_CONTENT: GoModule = GoModule {
    what: "OLM's copy-content",
    binary: "copy-content",
    main_package: "github.com/operator-framework/operator-lifecycle-manager/cmd/copy-content",
    cold_build: "a few seconds once olm-operator is built",
    ..MODULE
};
/// What an unpacking Job copies a bundle image's content out with: copied into the bundle's
/// container, which need hold nothing but the bundle.
const CPB: GoModule = GoModule {
    what: "OLM's cpb",
    binary: "cpb",
    main_package: "github.com/operator-framework/operator-lifecycle-manager/util/cpb",
    cold_build: "a few seconds once olm-operator is built",
    ..MODULE
};
/// The programs of OLM's image (olm-operator's, the catalog operator's and the unpacking
/// Jobs' `util` image, as in OLM's published one), by their path in it.
const OLM_PROGRAMS: [(GoModule, &str); 4] = [
    (MODULE, "/bin/olm"),
    (CATALOG, "/bin/catalog"),
    (COPY_CONTENT, "/bin/copy-content"),
    (CPB, "/bin/cpb"),
];
/// OLM's Go module, whose `deploy/chart/crds` are the CRDs of that release.
const OLM_MODULE: &str = "github.com/operator-framework/operator-lifecycle-manager";
/// Where OLM runs, as in its own manifests.
const OLM_NAMESPACE: &str = "olm";
/// Where operators for every namespace go, with OLM's global OperatorGroup.
const GLOBAL_NAMESPACE: &str = "operators";
const GLOBAL_OPERATOR_GROUP: &str = "global-operators";
const OLM_DEPLOYMENT: &str = "olm-operator";
const CATALOG_DEPLOYMENT: &str = "catalog-operator";
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
    /// Build OLM, opm and the scorecard's tests from source, load and push their images, and
    /// install OLM on the local cluster (what `operator-sdk olm install` does on a cluster that
    /// can pull).
    Install,
    /// Remove OLM (what `operator-sdk olm uninstall` does); refused while an operator it
    /// installed is still there.
    Uninstall,
}

pub fn run(command: OlmCommand) -> anyhow::Result<()> {
    // The Go builds are synchronous and long: run them before the async runtime exists.
    let programs = match command {
        OlmCommand::Install => Some(Programs::build()?),
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
                let programs = programs.context("OLM's programs were not built")?;
                install(&client, &state, &programs).await
            }
            OlmCommand::Uninstall => uninstall(&client).await,
        }
    })
}

/// The built programs OLM's images hold.
struct Programs {
    /// OLM's, with their paths in its image.
    olm: Vec<(PathBuf, &'static str)>,
    opm: Opm,
    scorecard_test: PathBuf,
}

impl Programs {
    fn build() -> anyhow::Result<Self> {
        let progress = |line: &str| println!("{line}");
        let mut olm = Vec::new();
        for (module, path) in OLM_PROGRAMS {
            olm.push((module.build(progress)?, path));
        }
        Ok(Self {
            olm,
            opm: Opm::build(&progress)?,
            scorecard_test: crate::operator_sdk::SCORECARD_TEST.build(progress)?,
        })
    }
}

async fn install(
    client: &kube::Client,
    state: &localcluster::ClusterState,
    programs: &Programs,
) -> anyhow::Result<()> {
    let node = state.node.as_ref().context(
        "OLM runs as pods on the local cluster's real node, and the cluster runs without one; \
         restart it with `cargo xtask cluster down && cargo xtask cluster up`",
    )?;
    let restart = "restart it with `cargo xtask cluster down && cargo xtask cluster up`";
    let (Some(registry), Some(https)) = (node.registry, node.registry_https) else {
        bail!(
            "OLM's pods and operator-sdk pull opm from the local cluster's registry, over HTTP \
             and HTTPS, and the cluster runs without them; {restart}"
        );
    };
    let version = MODULE.required_version(OLM_MODULE)?;
    let images = programs
        .olm
        .first()
        .and_then(|(binary, _)| binary.parent())
        .context("OLM's programs were not built")?
        .to_owned();
    let write = |image: Image, archive: String| {
        image
            .write(&images.join(archive))
            .with_context(|| format!("writing the image {}", image.reference()))
    };

    let built = write(
        olm_image(programs, version)?,
        format!("olm-{version}.oci.tar"),
    )?;
    ociimage::import_into_containerd(&built.archive, &built.reference, &node.containerd_socket)?;
    println!("loaded {} into the real node", built.reference);
    let olm_image = built.reference.normalized();

    // The name OLM and operator-sdk ask for; the node asks the local registry for quay.io's
    // images first (`localcluster::node::MIRRORED`), and they pull it every time.
    let opm_version = Opm::version()?;
    let opm = write(programs.opm.image()?, format!("opm-{opm_version}.oci.tar"))?;
    let opm_repository = opm.reference.repository();
    for tag in [opm.reference.tag(), opm_version] {
        ociimage::push(&opm.archive, &registry.to_string(), opm_repository, tag)?;
    }
    println!(
        "pushed {} (also tagged {opm_version}) to the local registry at {registry}",
        opm.reference
    );
    // `operator-sdk run bundle`'s catalog pod decompresses the catalog with `sh`, `cat` and
    // `gzip` from `--decompression-image`, by default a UBI image from a registry out of reach.
    let registry_address = registry.to_string();
    let (_, busybox) =
        crate::image::write_and_push(&crate::busybox::shell_image()?, &registry_address)?;
    let decompression = busybox.name;
    println!("pushed {decompression}, for `operator-sdk run bundle --decompression-image`");
    // `operator-sdk scorecard`'s pods: the test image by the name the bundle's configuration
    // gives (through the quay.io mirror), and `--untar-image`, by default a UBI image pinned
    // by a digest no build here can have.
    let scorecard = crate::operator_sdk::scorecard_test_image(&programs.scorecard_test)?;
    crate::image::write_and_push(&scorecard, &registry_address)?;
    println!(
        "pushed {}, for `operator-sdk scorecard`",
        scorecard.reference()
    );
    let (_, tar) = crate::image::write_and_push(&crate::busybox::tar_image()?, &registry_address)?;
    let untar = tar.name;
    println!("pushed {untar}, for `operator-sdk scorecard --untar-image`");

    let crds = olm_crds()?;
    println!("applying OLM {version}'s {} CRDs", crds.len());
    testkit::apply_objects(client, crds, None).await?;
    testkit::apply_objects(client, olm_objects(&olm_image)?, None).await?;

    let bundle = codegen::bundle::image(&crate::bundle::project(&crate::workspace_root())?);
    let started = Instant::now();
    for name in [OLM_DEPLOYMENT, CATALOG_DEPLOYMENT] {
        let what = format!("OLM's {name}");
        component::wait_available(client, OLM_NAMESPACE, name, &what, OLM_READY_TIMEOUT).await?;
    }
    println!(
        "OLM {version} is running in namespace {OLM_NAMESPACE} (ready in {:.0?}); install the \
         pushed bundle with `cargo xtask operator-sdk -- run bundle \
         {https}/{bundle} --index-image {https}/{opm_repository}:{opm_version} \
         --decompression-image {decompression}`, and check it with `cargo xtask operator-sdk \
         -- scorecard bundle/ --untar-image {untar}`",
        started.elapsed(),
    );
    Ok(())
}

/// OLM's image: its programs, as in its published image, and `/bin/cp`, which the unpacking
/// Jobs' `util` container (this image) copies `cpb` with.
fn olm_image(programs: &Programs, version: &str) -> anyhow::Result<Image> {
    let config = ImageConfig::new(
        User::new("nonroot", OLM_USER),
        vec![OLM_BINARY.into()],
        gomodule::release_metadata(
            "olm",
            "OLM's olm-operator, catalog operator and utilities, built from its Go module",
            OLM_MODULE,
            version,
            "https://olm.operatorframework.io/",
        ),
    );
    let reference = Reference::parse(&format!("{OLM_REPOSITORY}:{version}"))?;
    let mut image = Image::new(reference, config);
    let busybox = Path::new(crate::busybox::BINARY);
    let files = programs
        .olm
        .iter()
        .map(|(binary, path)| (binary.as_path(), *path))
        .chain([(busybox, "/bin/cp")]);
    for (binary, path) in files {
        image
            .add_binary(binary, path)
            .with_context(|| format!("adding {} to the OLM image", binary.display()))?;
    }
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
    let catalog = Component {
        name: CATALOG_DEPLOYMENT,
        ..component
    };
    let catalog_container = json!({
        "image": image,
        "command": ["/bin/catalog"],
        "args": [
            "--namespace", OLM_NAMESPACE,
            "--opmImage", crate::opm::LATEST_IMAGE,
            // The unpacking Jobs' `util` container: OLM's own image, as OLM's manifests have it.
            "--util-image", image,
            "--set-workload-user-id=true",
        ],
        "ports": [{"name": "metrics", "containerPort": 8080}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
        "resources": {"requests": {"cpu": "10m", "memory": "80Mi"}},
        "volumeMounts": [{"name": "tmpfs", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
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
            component.deployment(container, volumes.clone()),
            catalog.deployment(catalog_container, volumes),
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
                "OLM still manages {}; remove them first (`cargo xtask operator-sdk -- cleanup PACKAGE`, or \
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
    fn the_pinned_releases_are_read_from_go_mod_and_stamped() {
        let version = MODULE.required_version(OLM_MODULE).unwrap();
        assert!(version.starts_with("v0."), "{version}");
        let opm = MODULE
            .required_version(crate::opm::REGISTRY_MODULE)
            .unwrap();
        for stamp in [
            format!("/pkg/version.OLMVersion={version} "),
            format!("/cmd/opm/version.opmVersion={opm}"),
        ] {
            assert!(MODULE.ldflags.contains(&stamp), "{}", MODULE.ldflags);
        }
        let tools: Vec<&str> = MODULE
            .go_mod()
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("github.com/") && !l.contains(' '))
            .collect();
        let programs = OLM_PROGRAMS
            .iter()
            .map(|(program, _)| program)
            .chain([&crate::opm::OPM, &crate::opm::GRPC_HEALTH_PROBE]);
        for program in programs {
            assert!(
                tools.contains(&program.main_package),
                "go.mod's tool block pins {}: {tools:?}",
                program.main_package
            );
            assert_eq!(
                program.cache_key(),
                MODULE.cache_key(),
                "one build directory"
            );
        }
    }
}
