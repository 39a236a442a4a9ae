//! `kustomization.yaml` files, so `kubectl apply -k deploy/` installs CRDs, RBAC and the manager.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::{Error, GeneratedFile, MANAGER_IMAGE, yaml};

/// Directories whose files the top-level kustomization installs. Samples and the optional
/// ServiceMonitor are applied separately.
const INSTALLED: &[&str] = &["crds/", "rbac/", "manager/"];

pub(crate) fn render(files: &[GeneratedFile]) -> Result<Vec<GeneratedFile>, Error> {
    let resources_under = |prefixes: &[&str]| -> Vec<String> {
        files
            .iter()
            .filter_map(|f| f.path.to_str())
            .filter(|p| prefixes.iter().any(|prefix| p.starts_with(prefix)))
            .map(str::to_owned)
            .collect()
    };
    let main = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": resources_under(INSTALLED),
        "images": [{"name": MANAGER_IMAGE, "newTag": env!("CARGO_PKG_VERSION")}],
    });
    let prometheus = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": resources_under(&["prometheus/"])
            .into_iter()
            .map(|p| p.trim_start_matches("prometheus/").to_owned())
            .collect::<Vec<_>>(),
    });
    [
        ("kustomization.yaml", main),
        ("prometheus/kustomization.yaml", prometheus),
    ]
    .into_iter()
    .map(|(path, value)| {
        Ok(GeneratedFile {
            path: PathBuf::from(path),
            contents: yaml::render_documents(Path::new(path), &[value])?,
        })
    })
    .collect()
}
