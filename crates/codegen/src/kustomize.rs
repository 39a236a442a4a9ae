//! `kustomization.yaml` files, so `kubectl apply -k deploy/` installs CRDs, RBAC and the manager,
//! and `kubectl apply -k deploy/namespaced/` the same manager watching only its own namespace,
//! with a Role in place of the ClusterRole.
//!
//! Each installed directory is a kustomization of its own, so the namespaced overlay can take
//! them one by one (kustomize refuses an overlay that includes the directory it lives in).

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::{Error, GeneratedFile, MANAGER_IMAGE, MANAGER_NAME, NAMESPACE, yaml};

/// Directories that the top-level kustomization installs, each with its own kustomization.
/// Samples, the API server's leader fence (`leader-fence/`, opt-in: see [`crate::leader_fence`]),
/// and the monitoring objects (`prometheus/` needs the Prometheus Operator's CRDs,
/// `grafana/` a Grafana that loads dashboards from ConfigMaps), are applied separately.
pub(crate) const INSTALLED: &[&str] = &["crds", "rbac", "manager", "webhook"];

/// The namespaced overlay's directory; it holds the Role and its binding.
const NAMESPACED: &str = "namespaced";

pub(crate) fn render(files: &[GeneratedFile]) -> Result<Vec<GeneratedFile>, Error> {
    let files_in = |dir: &str| -> Vec<String> {
        files
            .iter()
            .filter_map(|f| f.path.to_str())
            .filter_map(|p| p.strip_prefix(dir)?.strip_prefix('/'))
            .map(str::to_owned)
            .collect()
    };
    let images = json!([{"name": MANAGER_IMAGE, "newTag": env!("CARGO_PKG_VERSION")}]);
    let mut rendered: Vec<(String, serde_json::Value)> = INSTALLED
        .iter()
        .chain(&["prometheus", "grafana", "leader-fence"])
        .map(|dir| {
            (
                format!("{dir}/kustomization.yaml"),
                kustomization(files_in(dir)),
            )
        })
        .collect();
    let mut main = kustomization(INSTALLED.iter().map(|d| (*d).to_owned()).collect());
    main["images"] = images.clone();
    rendered.push(("kustomization.yaml".to_owned(), main));
    let mut namespaced = namespaced(files_in(NAMESPACED))?;
    namespaced["images"] = images;
    rendered.push((format!("{NAMESPACED}/kustomization.yaml"), namespaced));
    rendered
        .into_iter()
        .map(|(path, value)| {
            Ok(GeneratedFile {
                contents: yaml::render_documents(Path::new(&path), &[value])?,
                path: PathBuf::from(path),
            })
        })
        .collect()
}

fn kustomization(resources: Vec<String>) -> serde_json::Value {
    json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": resources,
    })
}

/// The namespaced overlay: the installed directories minus the ClusterRole and its binding,
/// plus the Role and its binding (`own`), and the manager told to watch its own namespace
/// (Kubernetes expands `$(POD_NAMESPACE)` in container arguments from the container's
/// environment, which the generated Deployment sets), and the webhooks called only for objects
/// in that namespace.
fn namespaced(own: Vec<String>) -> Result<serde_json::Value, Error> {
    let delete = |kind: &str| {
        json!({"patch": format!(
            "$patch: delete\napiVersion: rbac.authorization.k8s.io/v1\nkind: {kind}\nmetadata:\n  name: {MANAGER_NAME}\n"
        )})
    };
    let watch_own_namespace = json!({
        "target": {"group": "apps", "version": "v1", "kind": "Deployment", "name": MANAGER_NAME},
        "patch": "- op: add\n  path: /spec/template/spec/containers/0/args/-\n  value: --namespace=$(POD_NAMESPACE)\n",
    });
    let bases = INSTALLED.iter().map(|d| format!("../{d}"));
    let mut overlay = kustomization(bases.chain(own).collect());
    let mut patches = vec![
        delete("ClusterRole"),
        delete("ClusterRoleBinding"),
        watch_own_namespace,
    ];
    patches.extend(crate::webhooks::namespace_selector_patches(NAMESPACE)?);
    overlay["patches"] = serde_json::Value::Array(patches);
    Ok(overlay)
}
