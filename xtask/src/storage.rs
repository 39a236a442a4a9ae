//! The local cluster's storage: rancher's local-path provisioner on the real node, behind the
//! default StorageClass `local-path`, as kind's clusters have it. A PersistentVolumeClaim without
//! a class (a StatefulSet's, say) gets a real directory on the node once its pod is scheduled,
//! and the directory goes with the claim.
//!
//! The provisioner is built from its Go module at the release `xtask/storage/go.mod` pins
//! (through the module proxy, once, into the local cluster's cache). It creates and removes each
//! volume's directory with a helper pod that runs a shell script; its image is the
//! distribution's static busybox (see [`crate::busybox`]). Both images are loaded into the real
//! node.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use kube::api::DynamicObject;
use localcluster::ClusterState;
use localcluster::node::NodeState;
use ociimage::{Image, ImageConfig, Reference, User};
use serde_json::json;

use crate::component::{self, Component};
use crate::gomodule::{self, GoModule};

/// local-path-provisioner, built from its module at the version `go.mod` pins.
const MODULE: GoModule = GoModule {
    what: "the local-path provisioner",
    cache_dir: "local-path-provisioner",
    repo_dir: "xtask/storage",
    binary: "local-path-provisioner",
    main_package: PROVISIONER_MODULE,
    // What its release build stamps, so its log names the release.
    ldflags: "-X main.VERSION=v0.0.37",
    tags: "",
    cold_build: "about 2 minutes",
    sources: &[
        ("go.mod", include_str!("../storage/go.mod")),
        ("go.sum", include_str!("../storage/go.sum")),
    ],
};
const PROVISIONER_MODULE: &str = "github.com/rancher/local-path-provisioner";
/// The name StorageClasses use for this provisioner, its default.
const PROVISIONER_NAME: &str = "rancher.io/local-path";
/// The default StorageClass, named as in the provisioner's own manifests.
pub const STORAGE_CLASS: &str = "local-path";
/// Where the provisioner runs, as in its own manifests (and its default `--namespace`).
const NAMESPACE: &str = "local-path-storage";
const NAME: &str = "local-path-provisioner";
const SERVICE_ACCOUNT: &str = "local-path-provisioner-service-account";
/// The ConfigMap the provisioner reads its paths, scripts and helper pod from (its default name).
const CONFIG_MAP: &str = "local-path-config";
/// A registry domain no one serves: nothing tries to pull the image, and it cannot be mistaken
/// for the published one.
const PROVISIONER_REPOSITORY: &str = concat!(product::name!(), ".local/local-path-provisioner");
const PROVISIONER_BINARY: &str = "/usr/bin/local-path-provisioner";
/// The provisioner only talks to the API server: a numeric non-root user.
const PROVISIONER_USER: u32 = 65532;
const HEALTH_PORT: u16 = 8080;
/// How long the provisioner may take to become Available: a real container on a busy
/// two-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// The volumes' directory on the real node: under the node's own directory, so `cluster down`
/// removes them with it.
fn volumes_dir(node: &NodeState) -> PathBuf {
    node.dir.join("local-path")
}

/// Builds the provisioner (once), loads it and its helper image into the real node, installs it
/// and waits until it runs. Applying is idempotent: a cluster that has it already keeps it.
///
/// # Errors
/// When the cluster has no real node, the build or an image fails, or the provisioner does not
/// become Available in time.
pub async fn install(client: &kube::Client, state: &ClusterState) -> anyhow::Result<()> {
    let node = state.node.as_ref().context(
        "the local-path provisioner runs on the local cluster's real node, and the cluster runs \
         without one; restart it with `cargo xtask cluster down && cargo xtask cluster up`",
    )?;
    let binary = tokio::task::spawn_blocking(|| MODULE.build(|line| println!("{line}")))
        .await
        .context("building the local-path provisioner")??;
    let version = MODULE.required_version(PROVISIONER_MODULE)?;
    let provisioner = component::load(provisioner_image(&binary, version)?, &binary, node)?;
    let helper = component::load(crate::busybox::shell_image()?, &binary, node)?;

    std::fs::create_dir_all(volumes_dir(node))
        .with_context(|| format!("creating {}", volumes_dir(node).display()))?;
    testkit::apply_objects(client, objects(node, &provisioner, &helper)?, None).await?;

    let started = Instant::now();
    let what = "the local-path provisioner";
    component::wait_available(client, NAMESPACE, NAME, what, READY_TIMEOUT).await?;
    println!(
        "Storage: the local-path provisioner {version} serves the default StorageClass \
         {STORAGE_CLASS} (ready in {:.0?}; volumes under {})",
        started.elapsed(),
        volumes_dir(node).display()
    );
    Ok(())
}

fn provisioner_image(binary: &Path, version: &str) -> anyhow::Result<Image> {
    let config = ImageConfig {
        exposed_ports: vec![ociimage::Port::Tcp(HEALTH_PORT)],
        ..ImageConfig::new(
            User::new("nonroot", PROVISIONER_USER),
            vec![PROVISIONER_BINARY.into()],
            gomodule::release_metadata(
                NAME,
                "rancher's local-path provisioner, built from its Go module",
                PROVISIONER_MODULE,
                version,
                &format!("https://{PROVISIONER_MODULE}"),
            ),
        )
    };
    let reference = Reference::parse(&format!("{PROVISIONER_REPOSITORY}:{version}"))?;
    let mut image = Image::new(reference, config);
    image
        .add_binary(binary, PROVISIONER_BINARY)
        .with_context(|| format!("adding {} to the provisioner's image", binary.display()))?;
    Ok(image)
}

/// The provisioner's objects, as its own manifests have them, with the images loaded into the
/// node, the node's volume directory, and its StorageClass the cluster's default.
fn objects(
    node: &NodeState,
    provisioner: &str,
    helper: &str,
) -> anyhow::Result<Vec<DynamicObject>> {
    let config = json!({
        "nodePathMap": [{
            "node": "DEFAULT_PATH_FOR_NON_LISTED_NODES",
            "paths": [volumes_dir(node)],
        }],
    });
    // The helper pods land on the node of the volume; the provisioner sets `nodeName`, so the
    // real node's taint is all they need to tolerate.
    let helper_pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "helper-pod", "image": helper, "imagePullPolicy": "Never"}],
        },
    });
    let component = Component {
        name: NAME,
        namespace: NAMESPACE,
        service_account: SERVICE_ACCOUNT,
    };
    let rbac = "rbac.authorization.k8s.io/v1";
    let container = json!({
        "image": provisioner,
        "args": ["start", "--config", "/etc/config/config.json",
                 "--helper-image", helper, "--provisioner-name", PROVISIONER_NAME],
        "env": [
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "CONFIG_MOUNT_PATH", "value": "/etc/config/"},
            {"name": "HEALTH_PORT", "value": HEALTH_PORT.to_string()},
        ],
        "ports": [{"name": "health", "containerPort": HEALTH_PORT}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "health"}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "health"}, "initialDelaySeconds": 10},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/config/"}],
    });
    let volumes = json!([{"name": "config", "configMap": {"name": CONFIG_MAP}}]);
    component::objects(
        vec![
            component.namespace(),
            component.service_account(),
            json!({
                "apiVersion": rbac, "kind": "Role",
                "metadata": {"name": NAME, "namespace": NAMESPACE},
                "rules": [{"apiGroups": [""], "resources": ["pods"],
                           "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]}],
            }),
            component.role_binding(NAME, NAME),
            json!({
                "apiVersion": rbac, "kind": "ClusterRole",
                "metadata": {"name": NAME},
                "rules": [
                    {"apiGroups": [""], "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log"],
                     "verbs": ["get", "list", "watch"]},
                    {"apiGroups": [""], "resources": ["persistentvolumes"],
                     "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
                    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
                    {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get", "list", "watch"]},
                ],
            }),
            component.cluster_role_binding(NAME, NAME),
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
                "data": {
                    "config.json": config.to_string(),
                    "setup": "set -eu\nmkdir -m 0777 -p \"$VOL_DIR\"\n",
                    "teardown": "set -eu\nrm -rf \"$VOL_DIR\"\n",
                    "helperPod.yaml": helper_pod.to_string(),
                },
            }),
            component.deployment(container, volumes),
            json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {
                    "name": STORAGE_CLASS,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": PROVISIONER_NAME,
                // The volume is made on the node the pod is scheduled to, so the claim waits for it.
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Delete",
            }),
        ],
        "the local-path provisioner's objects",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_module_is_embedded() {
        MODULE.assert_every_file_is_embedded();
    }

    #[test]
    fn the_release_is_pinned_and_stamped_alike() {
        let version = MODULE.required_version(PROVISIONER_MODULE).unwrap();
        assert_eq!(MODULE.ldflags, format!("-X main.VERSION={version}"));
        assert!(
            MODULE
                .go_mod()
                .lines()
                .any(|l| l.trim() == format!("tool {PROVISIONER_MODULE}")),
        );
    }

    #[test]
    fn the_storage_class_is_the_default_and_waits_for_the_pod() {
        let node = NodeState {
            dir: "/state/node".into(),
            containerd_socket: "/state/node/containerd.sock".into(),
            network: Default::default(),
            registry: None,
            registry_https: None,
            trusted_certificates: None,
        };
        let objects = objects(&node, "provisioner:v1", "busybox:1").unwrap();
        let class = objects
            .iter()
            .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "StorageClass"))
            .unwrap();
        assert_eq!(
            class.metadata.annotations.as_ref().unwrap()["storageclass.kubernetes.io/is-default-class"],
            "true"
        );
        assert_eq!(class.data["volumeBindingMode"], "WaitForFirstConsumer");
        let config = objects
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(CONFIG_MAP))
            .unwrap();
        let paths: serde_json::Value =
            serde_json::from_str(config.data["data"]["config.json"].as_str().unwrap()).unwrap();
        assert_eq!(
            paths["nodePathMap"][0]["paths"][0],
            "/state/node/local-path"
        );
        let helper: serde_json::Value =
            serde_json::from_str(config.data["data"]["helperPod.yaml"].as_str().unwrap()).unwrap();
        assert_eq!(helper["spec"]["containers"][0]["image"], "busybox:1");
    }
}
