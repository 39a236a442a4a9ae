//! `Tenant` (`platform.example.com/v1alpha1`, cluster-scoped): a namespace handed to a team,
//! with a quota, default container limits and the team's `edit` access.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

product::custom_resource! {
    platform,
    /// Desired state of a tenant.
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
    #[kube(
        version = "v1alpha1",
        kind = "Tenant",
        plural = "tenants",
        status = "TenantStatus",
        derive = "PartialEq",
        doc = "A team's namespace, made and kept by the platform: a ResourceQuota from `spec.quota`, a LimitRange giving containers default requests and limits, and a RoleBinding of `spec.group` to the `edit` ClusterRole. Deleting the Tenant deletes the namespace and all it holds.",
        printcolumn(
            name = "Namespace",
            type_ = "string",
            json_path = ".status.namespace",
            description = "The tenant's namespace"
        ),
        printcolumn(
            name = "Group",
            type_ = "string",
            json_path = ".spec.group",
            description = "The group given edit access"
        ),
        printcolumn(
            name = "Ready",
            type_ = "string",
            json_path = ".status.conditions[?(@.type==\"Ready\")].status",
            description = "Whether the namespace and everything in it are in place"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        )
    )]
    #[serde(rename_all = "camelCase")]
    pub struct TenantSpec {
        /// The namespace to make, a DNS label; defaults to the Tenant's name. A namespace that
        /// exists and is not this Tenant's is never taken over: the Tenant reports it and waits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(
            length(min = 1, max = 63),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        )]
        pub namespace: Option<String>,

        /// The group (as the API server's authenticator names it) given the `edit` ClusterRole in
        /// the namespace.
        #[schemars(length(min = 1))]
        pub group: String,

        /// The namespace's ResourceQuota: resource names (`requests.cpu`, `limits.memory`, `pods`,
        /// `persistentvolumeclaims`, ...) to the most the namespace may hold. Empty sets no limit.
        #[serde(default)]
        pub quota: BTreeMap<String, Quantity>,
    }
}

impl Tenant {
    /// The namespace this tenant asks for: `spec.namespace`, or its own name.
    pub fn namespace_name(&self) -> String {
        self.spec
            .namespace
            .clone()
            .or_else(|| self.metadata.name.clone())
            .unwrap_or_default()
    }
}

/// Observed state of a tenant, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    /// The namespace the tenant holds, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: whether the namespace, its quota, its limits and its binding are in place.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The conditions, for code that reads any status that reports them.
impl AsRef<[Condition]> for TenantStatus {
    fn as_ref(&self) -> &[Condition] {
        &self.conditions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::json;

    #[test]
    fn cluster_scoped_with_a_status_subresource() {
        let crd = serde_json::to_value(Tenant::crd()).expect("CRD serializes");
        assert_eq!(
            crd["metadata"]["name"],
            concat!("tenants.", product::group!(platform))
        );
        assert_eq!(crd["spec"]["scope"], "Cluster");
        assert_eq!(
            crd["spec"]["versions"][0]["subresources"]["status"],
            json!({})
        );
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], json!(["group"]));
        assert_eq!(
            spec["properties"]["namespace"]["pattern"],
            "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
        );
    }

    #[test]
    fn the_namespace_defaults_to_the_tenant_name() {
        let spec = TenantSpec {
            namespace: None,
            group: "team-a".into(),
            quota: BTreeMap::new(),
        };
        let tenant = Tenant::new("team-a", spec.clone());
        assert_eq!(tenant.namespace_name(), "team-a");
        let named = Tenant::new(
            "team-a",
            TenantSpec {
                namespace: Some("a-apps".into()),
                ..spec
            },
        );
        assert_eq!(named.namespace_name(), "a-apps");
    }
}
