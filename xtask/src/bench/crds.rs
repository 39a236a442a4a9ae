//! The generated CRDs as the bench installs them: each custom resource served at its storage
//! version only, without a conversion webhook.
//!
//! The API server keeps a watch cache per served version of a custom resource, and fills the
//! cache of every version but the stored one through the CRD's conversion webhook. The bench
//! runs the managers outside the cluster, where nothing answers the webhook's Service, so the
//! cache of `Memcached` v1alpha1 failed its list, listed every object from etcd again, and failed
//! again, hundreds of times a run: at 10,000 objects the API server's heap passed 20 GiB and
//! its CPU went to that instead of the work being measured. Neither manager under test uses any
//! version but the stored one, and the reference serves no conversion at all.

use anyhow::Context;
use kube::api::DynamicObject;
use serde_json::{Value, json};

/// Applies the CRDs of `deploy/crds/` again (they are installed whole first, with the RBAC),
/// each with only its storage version served and no conversion. Returns the CRDs changed.
pub async fn serve_storage_versions_only(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let dir = testkit::deploy_dir().join("crds");
    let mut changed = Vec::new();
    let mut objects = Vec::new();
    for file in testkit::yaml_files(&dir)? {
        for mut crd in testkit::read_yaml_file(&file)? {
            let is_crd = crd
                .types
                .as_ref()
                .is_some_and(|t| t.kind == "CustomResourceDefinition");
            if is_crd && storage_version_only(&mut crd)? {
                changed.push(crd.metadata.name.clone().unwrap_or_default());
                objects.push(crd);
            }
        }
    }
    testkit::apply_objects(client, objects, None)
        .await
        .context("applying the CRDs with their storage versions only")?;
    Ok(changed)
}

/// Marks every version of `crd` but the stored one as not served and drops its conversion;
/// `false` when it has one version only (nothing to change).
fn storage_version_only(crd: &mut DynamicObject) -> anyhow::Result<bool> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let spec = crd
        .data
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .with_context(|| format!("CRD {name} has no spec"))?;
    let versions = spec
        .get_mut("versions")
        .and_then(Value::as_array_mut)
        .with_context(|| format!("CRD {name} has no spec.versions"))?;
    if versions.len() < 2 {
        return Ok(false);
    }
    let mut stored = 0;
    for version in versions.iter_mut() {
        let storage = version.get("storage").and_then(Value::as_bool) == Some(true);
        stored += usize::from(storage);
        version["served"] = Value::Bool(storage);
    }
    anyhow::ensure!(
        stored == 1,
        "CRD {name} marks {stored} versions as its storage version; it must mark exactly one"
    );
    spec.insert("conversion".to_owned(), json!({"strategy": "None"}));
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::storage_version_only;
    use kube::api::DynamicObject;
    use serde_json::json;

    fn crd(versions: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": concat!("memcacheds.", product::group!(cache))},
            "spec": {
                "conversion": {"strategy": "Webhook"},
                "versions": versions,
            },
        }))
        .expect("a CRD")
    }

    #[test]
    fn only_the_stored_version_stays_served_and_conversion_goes() {
        let mut two = crd(json!([
            {"name": "v1beta1", "served": true, "storage": true},
            {"name": "v1alpha1", "served": true, "storage": false},
        ]));
        assert!(storage_version_only(&mut two).expect("one storage version"));
        let served: Vec<bool> = two.data["spec"]["versions"]
            .as_array()
            .expect("versions")
            .iter()
            .map(|v| v["served"].as_bool().expect("served"))
            .collect();
        assert_eq!(served, [true, false]);
        assert_eq!(two.data["spec"]["conversion"], json!({"strategy": "None"}));
    }

    #[test]
    fn a_single_version_is_left_alone_and_two_stored_ones_are_an_error() {
        let mut one = crd(json!([{"name": "v1", "served": true, "storage": true}]));
        assert!(!storage_version_only(&mut one).expect("nothing to change"));
        assert_eq!(
            one.data["spec"]["conversion"],
            json!({"strategy": "Webhook"})
        );
        let mut broken = crd(json!([
            {"name": "v1", "served": true, "storage": true},
            {"name": "v2", "served": true, "storage": true},
        ]));
        let error = storage_version_only(&mut broken).expect_err("two storage versions");
        assert!(error.to_string().contains("marks 2 versions"), "{error}");
    }
}
