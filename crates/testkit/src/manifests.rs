//! Applying YAML manifests with server-side apply, the way `kubectl apply --server-side` does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use serde::Deserialize;

use crate::{Error, Result};

/// The field manager of everything the tests apply.
pub const FIELD_MANAGER: &str = "e2e";

/// The repository's `deploy/` directory (what `cargo xtask manifests` writes).
pub fn deploy_dir() -> PathBuf {
    workspace_root().join("deploy")
}

/// The root of the workspace the running program belongs to.
///
/// Under `cargo run` and `cargo test` that is the workspace of the package cargo runs (its
/// `CARGO_MANIFEST_DIR` now); otherwise the one this crate was built in. The path baked in at
/// build time alone is not enough: cargo reuses a build from a shared target directory for a
/// clone of the same sources at another path, which would read the other clone's files.
pub fn workspace_root() -> PathBuf {
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR"));
    let package = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    package
        .as_deref()
        .and_then(enclosing_workspace)
        .or_else(|| enclosing_workspace(built_in))
        .unwrap_or_else(|| built_in.to_owned())
}

/// The nearest directory at or above `dir` whose `Cargo.toml` declares a `[workspace]`.
fn enclosing_workspace(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|candidate| {
            std::fs::read_to_string(candidate.join("Cargo.toml"))
                .is_ok_and(|text| text.lines().any(|line| line.trim() == "[workspace]"))
        })
        .map(Path::to_owned)
}

/// Parses every document of a multi-document YAML text into objects, skipping empty documents.
///
/// # Errors
/// [`Error::Manifest`] for invalid YAML or a document without `apiVersion`, `kind` or a name.
pub fn parse_yaml(text: &str, origin: &Path) -> Result<Vec<DynamicObject>> {
    let invalid = |message: String| Error::Manifest {
        path: origin.to_owned(),
        message,
    };
    let mut objects = Vec::new();
    for doc in yaml_serde::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(doc).map_err(|e| invalid(e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject =
            serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        if obj.types.is_none() {
            return Err(invalid("a document has no apiVersion/kind".into()));
        }
        if obj.metadata.name.is_none() {
            return Err(invalid("a document has no metadata.name".into()));
        }
        objects.push(obj);
    }
    Ok(objects)
}

/// Reads and parses a YAML file; see [`parse_yaml`].
///
/// # Errors
/// [`Error::Io`] or [`Error::Manifest`].
pub fn read_yaml_file(path: &Path) -> Result<Vec<DynamicObject>> {
    let text = std::fs::read_to_string(path).map_err(Error::io("reading", path))?;
    parse_yaml(&text, path)
}

/// Server-side applies every object of a YAML file (field manager [`FIELD_MANAGER`], forcing
/// conflicts); namespaced objects without a namespace go to `default`.
///
/// # Errors
/// See [`apply_objects`].
pub async fn apply_yaml_file(client: &kube::Client, path: &Path) -> Result<Vec<DynamicObject>> {
    apply_objects(client, read_yaml_file(path)?, None).await
}

/// Server-side applies every `*.yaml` / `*.yml` file of a directory, in name order (skipping
/// `kustomization.yaml`, which is not an object).
///
/// # Errors
/// See [`apply_objects`].
pub async fn apply_dir(client: &kube::Client, dir: &Path) -> Result<Vec<DynamicObject>> {
    let mut applied = Vec::new();
    for file in yaml_files(dir)? {
        applied.extend(apply_yaml_file(client, &file).await?);
    }
    Ok(applied)
}

/// The `*.yaml` / `*.yml` files of a directory except `kustomization.yaml`, sorted.
///
/// # Errors
/// [`Error::Io`] when the directory cannot be read.
pub fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(Error::io("reading", dir))? {
        let path = entry.map_err(Error::io("reading", dir))?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if yaml && !name.starts_with("kustomization.") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Server-side applies objects, in order. A kind that is not served yet (a custom resource
/// whose CRD was applied a moment ago) is retried for up to 30 seconds.
///
/// `namespace` overrides the namespace of namespaced objects; without it, objects keep their
/// own and default to `default`.
///
/// # Errors
/// [`Error::Kube`] when discovery or the apply fails, naming the object.
pub async fn apply_objects(
    client: &kube::Client,
    objects: Vec<DynamicObject>,
    namespace: Option<&str>,
) -> Result<Vec<DynamicObject>> {
    let mut applied = Vec::new();
    for mut obj in objects {
        let types = obj.types.clone().unwrap_or_default();
        let name = obj.metadata.name.clone().unwrap_or_default();
        let gvk = GroupVersionKind::try_from(&types).map_err(|e| Error::Manifest {
            path: PathBuf::from("<objects>"),
            message: format!("{}/{name}: {e}", types.kind),
        })?;
        let (resource, caps) = discover(client, &gvk).await?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Cluster => {
                obj.metadata.namespace = None;
                Api::all_with(client.clone(), &resource)
            }
            Scope::Namespaced => {
                let ns = namespace
                    .map(str::to_owned)
                    .or_else(|| obj.metadata.namespace.clone())
                    .unwrap_or_else(|| "default".to_owned());
                obj.metadata.namespace = Some(ns.clone());
                Api::namespaced_with(client.clone(), &ns, &resource)
            }
        };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let result = api
            .patch(&name, &params, &Patch::Apply(&obj))
            .await
            .map_err(Error::kube(format!("applying {} {name}", types.kind)))?;
        applied.push(result);
    }
    Ok(applied)
}

async fn discover(
    client: &kube::Client,
    gvk: &GroupVersionKind,
) -> Result<(
    kube::discovery::ApiResource,
    kube::discovery::ApiCapabilities,
)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match discovery::pinned_kind(client, gvk).await {
            Ok(found) => return Ok(found),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(source) => {
                return Err(Error::Kube {
                    action: format!(
                        "finding the API of {}/{} {}",
                        gvk.group, gvk.version, gvk.kind
                    ),
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multi_document_yaml() {
        let text = "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\n\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: b\n  namespace: c\nspec: {}\n";
        let objs = parse_yaml(text, Path::new("x.yaml")).expect("parse");
        assert_eq!(objs.len(), 2);
        assert_eq!(
            objs[1].types.as_ref().map(|t| t.kind.as_str()),
            Some("Deployment")
        );
        assert_eq!(objs[1].metadata.namespace.as_deref(), Some("c"));
        assert!(parse_yaml("kind: X\nmetadata: {name: a}\n", Path::new("y")).is_err());
        assert!(parse_yaml("apiVersion: v1\nkind: X\n", Path::new("y")).is_err());
    }

    #[test]
    fn finds_the_workspace() {
        assert!(workspace_root().join("Cargo.toml").is_file());
        assert!(deploy_dir().ends_with("deploy"));
        let root = workspace_root();
        assert_eq!(
            enclosing_workspace(&root.join("crates/testkit/src")).as_deref(),
            Some(root.as_path()),
            "a package's directory leads up to the workspace"
        );
        assert_eq!(enclosing_workspace(Path::new("/")), None);
    }
}
