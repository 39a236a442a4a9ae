//! The ClusterRoles a platform team binds its users to, three per custom resource, as
//! Kubebuilder generates them: `<product>-<kind>-admin-role` (everything, `deletecollection`
//! included), `<kind>-editor-role` (create, change and delete) and `<kind>-viewer-role` (read);
//! each may read the status, none may write it (that is the controller's).
//!
//! The roles of namespaced resources are aggregated into the built-in `admin`, `edit` and
//! `view` ClusterRoles, so whoever may edit a namespace may edit its Memcacheds too, without a
//! binding of its own. Those of cluster-scoped resources are not: a Tenant creates namespaces
//! and RoleBindings, and aggregating it into `edit` would let anyone bound to `edit` across
//! the cluster hand out namespaces; bind them on purpose.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::{Error, GeneratedFile, manager::meta, yaml};

/// What each of the three roles may do, and the built-in role it is aggregated into.
const ROLES: [(&str, &[&str], &str); 3] = [
    (
        "admin",
        &[
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ],
        "admin",
    ),
    (
        "editor",
        &[
            "create", "delete", "get", "list", "patch", "update", "watch",
        ],
        "edit",
    ),
    ("viewer", &["get", "list", "watch"], "view"),
];

/// The three roles of each of `crds`, one file each under `rbac/`.
///
/// # Errors
/// [`Error::Render`] when a role cannot be written as YAML.
pub(crate) fn render(crds: &[CustomResourceDefinition]) -> Result<Vec<GeneratedFile>, Error> {
    let mut files = Vec::new();
    for crd in crds {
        let singular = crd
            .spec
            .names
            .singular
            .as_deref()
            .unwrap_or(&crd.spec.names.plural);
        for (name, role) in roles(crd) {
            let path = format!("rbac/{singular}_{name}_role.yaml");
            files.push(GeneratedFile {
                contents: yaml::render_documents(std::path::Path::new(&path), &[role])?,
                path: PathBuf::from(path),
            });
        }
    }
    Ok(files)
}

/// The admin, editor and viewer roles of `crd`, with those words.
pub(crate) fn roles(crd: &CustomResourceDefinition) -> Vec<(&'static str, ClusterRole)> {
    let names = &crd.spec.names;
    let singular = names.singular.as_deref().unwrap_or(&names.plural);
    let namespaced = crd.spec.scope == "Namespaced";
    let rule = |resource: String, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![crd.spec.group.clone()]),
        resources: Some(vec![resource]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    ROLES
        .iter()
        .map(|(role, verbs, aggregated_to)| {
            let mut metadata = meta(&format!("{}-{singular}-{role}-role", product::NAME), None);
            if namespaced {
                let label = format!("rbac.authorization.k8s.io/aggregate-to-{aggregated_to}");
                metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .insert(label, "true".to_owned());
            }
            let role_object = ClusterRole {
                metadata,
                rules: Some(vec![
                    rule(names.plural.clone(), verbs),
                    rule(format!("{}/status", names.plural), &["get"]),
                ]),
                ..ClusterRole::default()
            };
            (*role, role_object)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_crds() -> Vec<CustomResourceDefinition> {
        apis::crds().expect("the CRDs")
    }

    #[test]
    fn each_custom_resource_has_an_admin_an_editor_and_a_viewer() {
        for crd in all_crds() {
            let roles: Vec<ClusterRole> = roles(&crd).into_iter().map(|(_, r)| r).collect();
            let names: Vec<&str> = roles
                .iter()
                .filter_map(|r| r.metadata.name.as_deref())
                .collect();
            let singular = crd.spec.names.singular.clone().unwrap_or_default();
            assert_eq!(
                names,
                ["admin", "editor", "viewer"]
                    .map(|role| format!("{}-{singular}-{role}-role", product::NAME)),
            );
            let verbs = |role: &ClusterRole| role.rules.as_ref().expect("rules")[0].verbs.clone();
            assert!(verbs(&roles[0]).contains(&"deletecollection".to_owned()));
            assert!(!verbs(&roles[1]).contains(&"deletecollection".to_owned()));
            assert_eq!(verbs(&roles[2]), ["get", "list", "watch"]);
            for role in &roles {
                let status = &role.rules.as_ref().expect("rules")[1];
                assert_eq!(
                    status.verbs,
                    ["get"],
                    "the status is the controller's to write"
                );
                assert_eq!(status.api_groups, Some(vec![crd.spec.group.clone()]));
            }
        }
    }

    #[test]
    fn only_namespaced_resources_are_aggregated_into_the_built_in_roles() {
        let crds = all_crds();
        assert!(
            crds.iter().any(|c| c.spec.scope == "Cluster"),
            "a cluster-scoped one to check"
        );
        for crd in crds {
            for ((_, role), built_in) in roles(&crd).iter().zip(["admin", "edit", "view"]) {
                let label = format!("rbac.authorization.k8s.io/aggregate-to-{built_in}");
                let aggregated =
                    role.metadata.labels.as_ref().is_some_and(|labels| {
                        labels.get(&label).map(String::as_str) == Some("true")
                    });
                assert_eq!(
                    aggregated,
                    crd.spec.scope == "Namespaced",
                    "{:?}",
                    role.metadata.name
                );
            }
        }
    }
}
